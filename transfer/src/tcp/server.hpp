// The target side of the tcp protocol (wire.hpp): serves reads and writes of the engine's segment and
// the control ops (describe, notify, ping). One accept thread; one blocking thread per connection
// (connections are few and long-lived: a handful per peer path). Internal header.
// Bounds (DESIGN.md §2 "Bounds"): at most max_connections open (lowered to fit RLIMIT_NOFILE), further
// ones are closed at accept; a connection silent for idle_timeout_ms (between requests or inside one) is
// closed, unless it set up an rdma queue pair; accept() failures for lack of descriptors or memory pause that listener
// for a growing interval (10 ms doubling to 1 s); such log lines are at most one per 10 s.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mc/common/limits.hpp"
#include "mc/common/status.hpp"
#include "mc/net/grant.hpp"
#include "tcp/net.hpp"
#include "tcp/wire.hpp"

namespace mc::transfer::tcp {

class ServerHandler {
 public:
  virtual ~ServerHandler() = default;
  // Local memory of segment range [offset, offset+length); the range must lie inside one region.
  virtual Result<char*> resolve(uint64_t offset, uint64_t length) = 0;
  // The packed SegmentDescriptor.
  virtual std::string describe() = 0;
  // A packed TransferNotification arrived from `peer` ("ADDR:PORT"); kPermissionDenied when it carries no grant
  // covering its range (grants_required) — the server then counts and logs it as refused.
  virtual Status notify(const std::string& packed, const std::string& peer) = 0;
  // Grants (mc/net/grant.hpp): whether READ/WRITE must carry one in the request's aux; the grant a token
  // carries (MAC checked); whether it covers the op now. Called from connection threads.
  virtual bool grants_required() const { return false; }
  virtual Result<auth::Grant> verify_grant(std::string_view token) = 0;
  virtual Status check_access(const auth::Grant& grant, WireOp op, uint64_t offset, uint64_t length) = 0;
  // A packed RdmaConnectRequest arrived: the packed reply and a lease the server holds until this
  // connection closes (the queue pair lives that long).
  virtual Result<std::pair<std::string, std::shared_ptr<void>>> rdma_connect(const std::string& packed) = 0;
};

struct ServerOptions {
  std::vector<std::string> listen;  // "tcp://ADDR:PORT"
  int socket_buffer_bytes = 4 << 20;
  uint64_t max_op_bytes = 256ull << 20;  // larger single reads/writes are refused
  size_t max_connections = 1024;
  // Deadlines measured from their start, however the bytes trickle (issue 51): a connection waiting for a request
  // header this long is closed, and so is one whose request's aux and payload, or whose reply, take this long
  // from the header (each checked about once a second by the accept thread, which shuts the socket down).
  int64_t idle_timeout_ms = 120000;  // > 0
  // Open connections from one peer address; more are closed at accept. A quarter of the default slots: one address
  // cannot take them all, while the engines of one host (each pools up to 64 connections per target) fit.
  size_t max_connections_per_address = 256;
};

class TcpServer {
 public:
  static Result<std::unique_ptr<TcpServer>> start(const ServerOptions& options, ServerHandler* handler);
  ~TcpServer();
  // Bound endpoints, "tcp://ADDR:PORT" (port resolved), in listen order.
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // Served ops (for stats): every op, errors (refused or failed ops), and the reads and writes of segment
  // bytes that completed with their byte counts (counted before the reply leaves).
  uint64_t ops_served() const { return ops_.load(); }
  uint64_t errors_served() const { return errors_.load(); }
  uint64_t reads_served() const { return reads_.load(); }
  uint64_t writes_served() const { return writes_.load(); }
  uint64_t read_bytes_served() const { return read_bytes_.load(); }
  uint64_t written_bytes_served() const { return written_bytes_.load(); }
  uint64_t connections_accepted() const { return accepted_.load(); }
  // Of errors_served: ops refused for want of a valid grant (ServerHandler::grants_required).
  uint64_t refused_served() const { return refused_.load(); }
  // Connections closed at accept (max_connections, or max_connections_per_address of their address open), and
  // connections closed at a deadline (idle, or a request or reply not complete within idle_timeout_ms).
  uint64_t connections_refused() const { return conn_refused_.load(); }
  uint64_t connections_cut() const { return conn_cut_.load(); }

 private:
  struct Conn {
    Fd fd;
    std::string peer;     // "ADDR:PORT" of the initiator (logs)
    std::string address;  // its ADDR (max_connections_per_address)
    std::thread thread;
    std::atomic<bool> done{false};
    // steady_ms() by which the phase under way (a request awaited, its aux and payload, a reply) must end; 0: none
    // (a raw stream, a connection holding an rdma queue pair). Set by the connection's thread, checked by cut_late().
    std::atomic<int64_t> deadline_ms{0};
  };
  // Shuts down the connections past their deadline (the accept thread, about once a second).
  void cut_late(int64_t now);
  TcpServer(ServerOptions options, ServerHandler* handler) : options_(std::move(options)), handler_(handler) {}
  void accept_loop();
  void serve_connection(Conn* conn);
  void reap(bool all);
  // Counts and logs (20 a minute, then the count of those not logged) a refused op, naming the peer and the reason.
  void log_refusal(const std::string& peer, WireOp op, uint64_t offset, uint64_t length, const Status& why);

  ServerOptions options_;
  ServerHandler* handler_;
  std::vector<Fd> listeners_;
  std::vector<std::string> endpoints_;
  Fd stop_fd_;  // eventfd
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;
  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> reads_{0}, writes_{0}, read_bytes_{0}, written_bytes_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> conn_refused_{0}, conn_cut_{0};
  std::unordered_map<std::string, size_t> per_address_;  // open connections by peer address (under mu_)
  std::mutex refusal_log_mu_;
  mc::limits::BurstBudget refusal_log_{20, 60000};  // 20 lines a minute, then a count
  // Used by the accept thread only.
  mc::limits::LogBudget refuse_log_{10000};
  mc::limits::LogBudget accept_log_{10000};
  mc::limits::LogBudget cut_log_{10000};
};

}  // namespace mc::transfer::tcp
