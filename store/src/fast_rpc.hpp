// The master's fast RPC path: the store.* messages of protocol.hpp over one plain TCP connection per
// client, without ZeroMQ.
//
// Why: a ZeroMQ round trip passes through an I/O thread on each side (client thread -> client I/O thread ->
// master I/O thread -> master thread and back: six thread wake-ups per call), which on a loaded machine
// costs several times the handler itself; a plain socket read by the serving thread costs two, as in
// Redis. Measured side by side by `mc-store bench --transport zmq|fast` (docs/BENCHMARKS.md, store).
//
// Frame (both directions): BE u32 header_bytes, BE u32 body_bytes, msgpack proto::Header {v, type, id},
// msgpack body. A request's reply carries its id and type "<type>.reply", or type "error" with a
// proto::ErrorReply body. Replies come in request order; a client may pipeline (send several requests
// before reading). Limits: header_bytes <= kMaxHeaderBytes, body_bytes <= proto::kMaxMessageBytes; a frame
// over a limit, or an undecodable header, gets an error reply and the connection is closed (the stream
// cannot be resynchronised). A header whose protocol version differs gets a kProtocolMismatch reply.
//
// FastServer is driven by its owner's poll loop (no thread of its own): add_poll_items() appends the
// listening socket and the connections to a zmq::pollitem_t array (plain fds, so one zmq::poll covers them
// and a ZeroMQ socket together), handle() processes what poll() reported. FastClient is blocking with
// deadlines (call), or split (send / try_recv) for a driver polling many connections from one thread.
// Thread-safety: neither is thread-safe; one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "mc/common/codec.hpp"
#include "mc/common/protocol.hpp"
#include "mc/common/status.hpp"

namespace mc::store::fast {

inline constexpr uint32_t kMaxHeaderBytes = 4096;
inline constexpr size_t kPrefixBytes = 8;
inline constexpr size_t kMaxPendingReplyBytes = 64u << 20;  // per connection, see FastServer

// Appends one frame (prefix, header, body) to `out`.
void append_frame(std::string& out, std::string_view type, uint64_t id, std::string_view body);

// A decoded frame.
struct Frame {
  proto::Header header;
  std::string body;
};

// Incremental frame parser over a byte stream.
class FrameReader {
 public:
  // Appends received bytes.
  void feed(const char* data, size_t n);
  // The next complete frame; nullopt when more bytes are needed; an error (kMalformedMessage naming
  // `peer`) for a frame over the limits or an undecodable header (the stream is then unusable).
  Result<std::optional<Frame>> next(const std::string& peer, uint64_t max_body_bytes);
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
};

class FastServer {
 public:
  // Answers one request: (type, body) -> reply body or error. Must not throw (exceptions are caught and
  // answered as kInternal).
  using Dispatch = std::function<Result<std::string>(std::string_view type, std::string_view body)>;

  // Listens on host:port of a "tcp://HOST:PORT" endpoint ("*" = every address; port 0 = any free port).
  // kInvalidArgument for a non-tcp endpoint, kUnavailable naming the endpoint and strerror when bind fails.
  static Result<std::unique_ptr<FastServer>> listen(const std::string& endpoint, std::string service, Dispatch dispatch);
  ~FastServer();
  FastServer(const FastServer&) = delete;
  FastServer& operator=(const FastServer&) = delete;

  uint16_t port() const { return port_; }
  size_t connections() const { return conns_.size(); }

  // Appends the listener and every connection (POLLIN; POLLOUT while replies wait to be sent).
  void add_poll_items(std::vector<zmq::pollitem_t>& items) const;
  // Processes the revents of the items add_poll_items() appended (same order, `items` points at the first).
  void handle(const zmq::pollitem_t* items, size_t count);

  struct Counters {
    uint64_t handled = 0, errors = 0, malformed = 0, accepted = 0, closed = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Conn {
    int fd = -1;
    std::string peer;
    FrameReader reader;
    std::string out;      // replies not yet written
    size_t out_pos = 0;
    bool closing = false;  // close once `out` is written (after a malformed frame)
  };
  FastServer(std::string service, Dispatch dispatch) : service_(std::move(service)), dispatch_(std::move(dispatch)) {}
  void accept_all();
  // Reads and answers; false when the connection must be closed now.
  bool on_readable(Conn& c);
  bool flush(Conn& c);
  void answer(Conn& c, const Frame& f);

  std::string service_;
  Dispatch dispatch_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
  Counters counters_;
};

class FastClient {
 public:
  // Connects to host:port (names resolved with getaddrinfo, TCP_NODELAY) and checks the protocol version
  // with a hello. kUnavailable naming the endpoint (with strerror), kTimeout, kProtocolMismatch.
  static Result<std::unique_ptr<FastClient>> connect(const std::string& host, uint16_t port, const std::string& client_name,
                                                     int timeout_ms);
  ~FastClient();
  FastClient(const FastClient&) = delete;
  FastClient& operator=(const FastClient&) = delete;

  template <typename Req>
  Result<typename Req::Reply> call(const Req& req, int timeout_ms) {
    MC_ASSIGN_OR_RETURN(std::string body, call_raw(Req::kType, codec::pack(req), timeout_ms));
    return codec::unpack<typename Req::Reply>(body, reply_what_);
  }
  // Sends one request and waits up to timeout_ms for its reply (replies to earlier, abandoned calls are
  // skipped). The server's error reply comes back as its Status. A connection that failed (peer closed,
  // write timed out, malformed reply) is closed: every later call answers kUnavailable (broken() is true).
  Result<std::string> call_raw(std::string_view type, std::string_view body, int timeout_ms);

  // Pipelining: queue a request and write what the socket takes now; returns its id.
  Result<uint64_t> send(std::string_view type, std::string_view body);
  // Writes queued bytes and reads what has arrived, without blocking; the next complete reply (body or the
  // server's error as Status in `status`), or nullopt when none is complete yet.
  struct Reply {
    uint64_t id = 0;
    Status status;
    std::string body;
  };
  Result<std::optional<Reply>> try_recv();
  bool wants_write() const { return out_pos_ < out_.size(); }
  int fd() const { return fd_; }
  bool broken() const { return fd_ < 0; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  FastClient(std::string endpoint) : endpoint_(std::move(endpoint)), reply_what_("reply from " + endpoint_) {}
  Status fail(Status s);
  Status write_some();
  Result<bool> read_some();  // true when bytes arrived

  std::string endpoint_;
  std::string reply_what_;
  int fd_ = -1;
  uint64_t next_id_ = 1;
  std::string out_;
  size_t out_pos_ = 0;
  FrameReader reader_;
};

// "tcp://HOST:PORT" -> HOST ("[::1]" -> "::1"); kInvalidArgument for other transports.
Result<std::string> tcp_host_of(const std::string& endpoint);

}  // namespace mc::store::fast
