// The fast RPC transport: the typed messages of protocol.hpp over one plain TCP connection per client,
// without ZeroMQ. The second transport behind the request/reply API of rpc.hpp: the same header, the
// same hello/version check and the same error replies (rpc.hpp, "shared by both transports"); a server
// usually answers with its RpcServer's handlers (RpcServer::dispatch). The store's master serves its
// clients' store.* calls on it.
//
// Why: a ZeroMQ round trip passes through an I/O thread on each side (client thread -> client I/O thread ->
// master I/O thread -> master thread and back: six thread wake-ups per call), which on a loaded machine
// costs several times the handler itself; a plain socket read by the serving thread costs two, as in
// Redis. Measured side by side by `mc-store bench --transport zmq|fast` (docs/BENCHMARKS.md, store).
//
// Frame (both directions): BE u32 header_bytes, BE u32 body_bytes, msgpack proto::Header {v, type, id},
// msgpack body. A request's reply carries its id and type "<type>.reply", or type "error" with a
// proto::ErrorReply body. Replies come in request order; a client may pipeline (send several requests
// before reading). Limits: header_bytes <= kMaxHeaderBytes, body_bytes <= proto::kMaxMessageBytes (the
// server: <= FastServerLimits::max_frame_bytes); a frame over a limit, or an undecodable header, gets an
// error reply and the connection is closed (the stream cannot be resynchronised). A header whose protocol
// version differs gets a kProtocolMismatch reply.
//
// Bounds of a server (FastServerLimits, DESIGN.md §2 "Bounds"): a frame is admitted when its 8-byte prefix
// arrives, before its bytes are buffered: one declaring more than max_frame_bytes, or one that would take
// the partial frames of all connections past max_buffer_bytes, is refused (error reply, connection
// closed). A connection with more than max_conn_buffer_bytes of unsent replies is not read until they
// drain. At max_connections (lowered to fit RLIMIT_NOFILE, limits.hpp) a new connection takes the slot of
// the one idle longest when that one has been idle for idle_timeout_ms, else it is closed at once; a
// connection stalled that long inside a frame is closed. Idle connections are otherwise kept (a store
// client keeps its one connection for life). accept() failures for lack of descriptors or memory pause
// accepting for a growing interval (10 ms doubling to 1 s). Each kind of log line a peer can trigger
// (refused frames, refused connections, accept failures) is written at most once per 10 s.
//
// FastServer is driven by its owner's loop (no thread of its own). Its sockets live in one epoll set whose
// fd (poll_fd()) is readable when any of them is ready, so the owner polls one fd (together with a ZeroMQ
// socket in one zmq::poll) and handle_ready() touches only the ready connections: O(ready) per wakeup,
// not O(connections). Each connection's replies to everything one read brought are written with one
// send. FastClient is blocking with deadlines (call), or split (send / try_recv) for a driver polling
// many connections from one thread.
// Authentication (docs/SECURITY.md "The fast path"): with the process key ring (auth.hpp) every connection starts
// with a handshake and then carries sealed records instead of plain frames, CURVE's strength with libsodium's
// primitives: the client sends "MCS1", its public key and a 32-byte random nonce; the server, whose roster must
// hold that key, answers "MCS1" and its own nonce; both derive one key per direction from the X25519 shared secret
// of the client's key pair and the cluster's (crypto_kx) mixed with both nonces (crypto_generichash, so that a
// recorded connection cannot be replayed), and every record is BE u32 length + ChaCha20-Poly1305 (IETF) of up to
// kMaxRecordBytes of the frame stream, with a per-direction counter nonce. A record that fails its tag closes the
// connection; the client knows the server by its answers decrypting. The caller's identity reaches Dispatch, and a
// role that may not call a type (auth::may_call) gets a kPermissionDenied reply.
// Ownership: every socket and the epoll set are Fd (closed by the destructors).
// Thread-safety: neither is thread-safe; one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "mc/common/endpoint.hpp"
#include "mc/common/fd.hpp"
#include "mc/common/limits.hpp"
#include "mc/common/status.hpp"
#include "mc/net/auth.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/envelope.hpp"

namespace mc::rpc::fast {

inline constexpr uint32_t kMaxHeaderBytes = 4096;
inline constexpr size_t kPrefixBytes = 8;
inline constexpr size_t kMaxRecordBytes = 1u << 20;  // plaintext of one sealed record
inline constexpr size_t kSealTagBytes = 16;          // ChaCha20-Poly1305 tag

// One direction pair of a sealed connection (see above): seals what this side sends and opens what it receives.
class Seal {
 public:
  static constexpr size_t kClientHelloBytes = 4 + 32 + 32;  // "MCS1", client public key, client nonce
  static constexpr size_t kServerHelloBytes = 4 + 32;       // "MCS1", server nonce
  // Derives the keys. `client_side`: this side holds `own_sk`/`own_pk` as the client and `peer_pk` is the
  // server's, else the reverse. All keys raw 32 bytes. kInvalidArgument when the peer key is unusable.
  Status derive(bool client_side, std::string_view own_pk, std::string_view own_sk, std::string_view peer_pk,
                std::string_view client_nonce, std::string_view server_nonce);
  // Appends `plain` as sealed records to `out`.
  void seal(std::string_view plain, std::string& out);
  // Opens the records in `data` (any split), appending their plaintext to `plain`; kDataLoss naming `peer` for a
  // record that fails its tag or is over kMaxRecordBytes (the connection is then unusable).
  Status open(const char* data, size_t n, std::string& plain, const std::string& peer);
  // Bytes of a record received but not complete yet.
  size_t pending_bytes() const { return in_.size(); }

 private:
  unsigned char tx_[32] = {}, rx_[32] = {};
  uint64_t tx_count_ = 0, rx_count_ = 0;
  std::string in_;  // bytes of a record not complete yet
};

// The bounds of a FastServer (see above); every field > 0.
struct FastServerLimits {
  uint64_t max_frame_bytes = 16ull << 20;        // declared body of one request frame
  uint64_t max_conn_buffer_bytes = 64ull << 20;  // unsent replies of one connection before it is not read
  uint64_t max_buffer_bytes = 256ull << 20;      // request bytes buffered in partial frames, all connections
  size_t max_connections = 1024;                 // open connections (lowered to fit RLIMIT_NOFILE)
  int64_t idle_timeout_ms = 30000;               // idle time after which a connection may lose its slot
  // Whole-exchange deadlines (issue 51), measured from their start however the bytes trickle: the handshake (with
  // a key ring) and the first request answered within handshake_timeout_ms of accept; a request (or sealed record)
  // begun complete within request_timeout_ms; replies waiting unsent with no progress for idle_timeout_ms cut the
  // connection (its peer does not read).
  int64_t handshake_timeout_ms = 5000;
  int64_t request_timeout_ms = 10000;
  size_t max_connections_per_address = 64;  // open connections from one peer address; more are closed at accept
};

// Appends one frame (prefix, header, body) to `out`; the header's type is `type` followed by `type_suffix`
// (".reply" for a reply), written in place without a temporary.
void append_frame(std::string& out, std::string_view type, uint64_t id, std::string_view body,
                  std::string_view type_suffix = {});

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
  // Bytes of the frame at the head of the buffer as its prefix declares them (prefix, header and body),
  // when the prefix has arrived and the frame is not complete yet; 0 otherwise.
  uint64_t partial_frame_bytes() const;
  // Whether a whole frame is at the head of the buffer (next() would return it, or its error).
  bool head_complete() const { return buffered() >= kPrefixBytes && partial_frame_bytes() == 0; }
  // Makes room for `bytes` buffered bytes at once (a frame admitted by its prefix), so that the buffer
  // never grows past what the frame needs.
  void reserve(uint64_t bytes) { buf_.reserve(pos_ + bytes); }
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
  // Answers one request: (type, body) -> reply body or error, e.g. RpcServer::dispatch. Exceptions are
  // caught and answered as kInternal. "hello" is answered by the server itself (rpc::answer_hello).
  // `caller` is the connection's roster identity (nullptr without a key ring).
  using Dispatch =
      std::function<Result<std::string>(std::string_view type, std::string_view body, const auth::Identity* caller)>;

  // Listens on a "tcp://HOST:PORT" endpoint ("*" = every address; port 0 = any free port).
  // kInvalidArgument for a non-tcp endpoint or a limit <= 0 (naming it), kUnavailable naming the endpoint
  // and strerror when bind fails.
  static Result<std::unique_ptr<FastServer>> listen(const std::string& endpoint, std::string service, Dispatch dispatch,
                                                    const FastServerLimits& limits = {});
  FastServer(const FastServer&) = delete;
  FastServer& operator=(const FastServer&) = delete;

  uint16_t port() const { return port_; }
  size_t connections() const { return conns_.size(); }
  // The limits in force (max_connections after the RLIMIT_NOFILE cap).
  const FastServerLimits& limits() const { return limits_; }
  // Request bytes now reserved by partial frames, all connections (<= limits().max_buffer_bytes).
  uint64_t buffered_bytes() const { return buffered_bytes_; }

  // The epoll fd: readable (POLLIN) while a connection or the listener is ready.
  int poll_fd() const { return epoll_fd_.get(); }
  // Adds the owner's fd (e.g. a ZeroMQ socket's ZMQ_FD) to the epoll set, readable-level: the owner can
  // then block in wait_and_handle() alone, one syscall per wakeup instead of a poll plus an epoll_wait.
  Status watch(int fd);
  // Accepts, reads, answers and writes what is ready now (never blocks; at most kMaxEvents sockets).
  // True when the watched fd was reported readable.
  bool handle_ready() { return wait_and_handle(0); }
  // Waits up to timeout_ms for a ready socket, then handles what is ready; true as handle_ready().
  bool wait_and_handle(int timeout_ms);
  static constexpr int kMaxEvents = 256;
  // Called once per wait_and_handle() in which requests were answered, after every ready connection's requests and
  // before any of their replies is written. false: the replies of this batch are not sent and their connections are
  // closed (their callers see the connection fail, as if the server had died). For a server that makes a batch of
  // changes durable before acknowledging any of them (group commit: the replicated store master, DESIGN.md §17).
  void set_before_reply(std::function<bool()> hook) { before_reply_ = std::move(hook); }

  // refused: frames over max_frame_bytes or max_buffer_bytes; rejected: connections closed at accept
  // (cap reached); evicted: idle connections closed for a new one or stalled inside a frame;
  // accept_failures: accept() errors other than a connection aborted meanwhile.
  struct Counters {
    uint64_t handled = 0, errors = 0, malformed = 0, accepted = 0, closed = 0;
    uint64_t refused = 0, rejected = 0, evicted = 0, accept_failures = 0;
    uint64_t unauthenticated = 0;   // connections closed for a bad handshake, an unknown key or a forged record
    uint64_t denied = 0;            // calls refused for the caller's role
    uint64_t cut = 0;               // closed at a deadline: handshake, request, or replies its peer does not read
    uint64_t address_rejected = 0;  // closed at accept: max_connections_per_address of its address open
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Conn {
    Fd fd;
    std::string peer;
    FrameReader reader;
    std::string out;  // replies not yet written
    size_t out_pos = 0;
    bool closing = false;        // close once `out` is written (after a malformed frame)
    uint32_t events = 0;         // epoll interest now registered
    uint64_t reserved = 0;       // bytes of its partial frame counted in buffered_bytes_
    int64_t last_active_ms = 0;  // last time bytes arrived (or accept)
    std::string address;         // the peer's address without its port (max_connections_per_address)
    int64_t accepted_ms = 0;
    bool greeted = false;          // a request was answered: handshake_timeout_ms no longer applies
    int64_t partial_since_ms = 0;  // when the request (or sealed record) now incomplete began; 0: none
    int64_t sending_since_ms = 0;  // when `out` last began or made progress
    // With a key ring: the handshake's bytes until it completes, then the seal; `sealed_to` ends the ciphertext
    // already in `out` (what follows is plaintext replies not sealed yet).
    std::string handshake;
    std::unique_ptr<Seal> seal;
    const auth::Identity* caller = nullptr;
    size_t sealed_to = 0;
  };
  // Handles the handshake bytes of `c` (with a key ring); false when the connection must close.
  bool on_handshake(Conn& c, const char* data, size_t n);
  void refuse_conn(Conn& c, const std::string& why);
  std::function<bool()> before_reply_;
  FastServer(std::string service, Dispatch dispatch, const FastServerLimits& limits)
      : service_(std::move(service)), dispatch_(std::move(dispatch)), limits_(limits) {}
  void accept_all(int64_t now);
  // Accept failed with errno `err`: back off (stop polling the listener) when it is for lack of
  // descriptors or memory; log within the budget.
  void accept_failed(int err, int64_t now);
  void set_listener_interest(bool on);
  // The connection idle longest, when idle for idle_timeout_ms; nullptr otherwise.
  Conn* idlest(int64_t now) const;
  // Closes connections stalled inside a frame for idle_timeout_ms and those past a deadline of FastServerLimits
  // (checked at most once a second).
  void sweep(int64_t now);
  // The deadline `c` is past at `now`, or "" (for sweep's log line).
  std::string past_deadline(const Conn& c, int64_t now) const;
  // Admits the partial frame at the head of c's buffer against the limits; false (error reply queued,
  // closing) when it is refused.
  bool admit(Conn& c);
  void release(Conn& c);
  // Logs why a connection is closed for its frames, within frame_log_'s budget.
  void log_closing(const Status& why);
  // Registers the interest the connection needs now (EPOLLIN unless closing or backlogged; EPOLLOUT while
  // replies wait); false when epoll_ctl fails.
  bool update_interest(Conn& c);
  void close_conn(Conn* c);
  // Reads and answers; false when the connection must be closed now.
  bool on_readable(Conn& c);
  // Answers the complete frames c's reader holds while fewer than max_conn_buffer_bytes of replies wait; false when
  // a bad frame made the connection closing (its error reply queued).
  bool answer_frames(Conn& c);
  bool backlogged(const Conn& c) const;
  bool flush(Conn& c);
  void answer(Conn& c, const Frame& f);

  std::string service_;
  Dispatch dispatch_;
  Fd listen_fd_;
  Fd epoll_fd_;
  int watched_fd_ = -1;
  char watched_tag_ = 0;  // its epoll data.ptr
  uint16_t port_ = 0;
  std::unordered_map<Conn*, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, size_t> per_address_;  // open connections by peer address
  Counters counters_;
  FastServerLimits limits_;
  uint64_t buffered_bytes_ = 0;
  bool listener_on_ = true;
  int64_t accept_resume_ms_ = 0;  // while the listener is paused
  int64_t accept_backoff_ms_ = 0;
  int64_t next_sweep_ms_ = 0;
  mc::limits::LogBudget accept_log_{10000};
  mc::limits::LogBudget reject_log_{10000};
  mc::limits::LogBudget frame_log_{10000};
  mc::limits::LogBudget cut_log_{10000};
};

class FastClient {
 public:
  // Connects to a tcp endpoint (names resolved with getaddrinfo, TCP_NODELAY) and checks the protocol
  // version with a hello. kInvalidArgument for an ipc endpoint; kUnavailable naming the endpoint (with
  // strerror), kTimeout, kProtocolMismatch.
  static Result<std::unique_ptr<FastClient>> connect(const Endpoint& endpoint, const std::string& client_name,
                                                     int timeout_ms);
  FastClient(const FastClient&) = delete;
  FastClient& operator=(const FastClient&) = delete;

  // A reply: its request's id, and the body or the server's error reply as Status in `status`.
  struct Reply {
    uint64_t id = 0;
    Status status;
    std::string body;
  };
  // Receives replies to requests other than the call's own (earlier send()s whose replies the caller
  // collects later, e.g. the client's write-behind put_end). Called on the calling thread, in order.
  using OtherReply = std::function<void(Reply&)>;

  template <typename Req>
  Result<typename Req::Reply> call(const Req& req, int timeout_ms, const OtherReply& other = {}) {
    MC_ASSIGN_OR_RETURN(std::string body, call_raw(Req::kType, codec::pack(req), timeout_ms, other));
    return codec::unpack<typename Req::Reply>(body, reply_what_);
  }
  // Sends one request and waits up to timeout_ms for its reply. Replies that arrive before it (to earlier
  // send()s) go to `other`, or are skipped when it is empty (abandoned calls). The server's error reply
  // comes back as its Status. A connection that failed (peer closed, write timed out, malformed reply) is
  // closed: every later call answers kUnavailable (broken() is true).
  Result<std::string> call_raw(std::string_view type, std::string_view body, int timeout_ms,
                               const OtherReply& other = {});

  // Pipelining: queue a request and, when write_now, write what the socket takes now; returns its id.
  // Requests queued with write_now = false leave in one send with the next write (fewer syscalls and
  // segments; the server reads them in one recv).
  Result<uint64_t> send(std::string_view type, std::string_view body, bool write_now = true);
  // Writes queued bytes that the socket takes now (never blocks).
  Status write_queued() {
    return !fd_ ? Status(Code::kUnavailable, "connection to " + endpoint_ + " is closed") : write_some();
  }
  // Writes queued bytes and reads what has arrived, without blocking; the next complete reply, or nullopt
  // when none is complete yet.
  Result<std::optional<Reply>> try_recv();
  // Like try_recv, but waits up to timeout_ms for a reply (nullopt when none came in time).
  Result<std::optional<Reply>> recv(int timeout_ms);
  bool wants_write() const { return out_pos_ < out_.size(); }
  int fd() const { return fd_.get(); }
  bool broken() const { return !fd_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  FastClient(std::string endpoint) : endpoint_(std::move(endpoint)), reply_what_("reply from " + endpoint_) {}
  Status fail(Status s);
  Status write_some();
  Result<bool> read_some();               // true when bytes arrived
  Status handshake(int64_t deadline_ms);  // with a key ring, before the hello
  std::unique_ptr<Seal> seal_;
  std::string plain_;  // a frame before sealing (reused)

  std::string endpoint_;
  std::string reply_what_;
  Fd fd_;
  uint64_t next_id_ = 1;
  std::string out_;
  size_t out_pos_ = 0;
  FrameReader reader_;
};

}  // namespace mc::rpc::fast
