// An etcd v3 client over etcd's JSON gateway (grpc-gateway, POST /v3/...) with libcurl: key ranges, puts, deletes,
// transactions, leases, compaction and watches. The store master's replication (leader election through a lease,
// metadata as keys, standbys watching) is built on it.
//
// Wire: every call is one HTTP/1.1 POST of a JSON body to a member's client URL (etcd 3.4's gateway paths
// /v3/kv/range, /v3/kv/put, /v3/kv/deleterange, /v3/kv/txn, /v3/kv/compaction, /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke, /v3/watch). Keys and values are bytes (any byte, NUL included);
// they travel base64-encoded. Plain HTTP, or HTTPS with a client certificate when Options::tls names the files
// (etcd started with --client-cert-auth: only holders of a certificate signed by the cluster's CA get in).
//
// Units: revisions, versions and lease ids are etcd's int64s; TTLs in seconds; timeouts in milliseconds.
//
// Errors: every failure is a Status, never an exception or an abort.
//   - etcd's own error replies ({"error", "code"}) keep etcd's message and map its gRPC code: InvalidArgument ->
//     kInvalidArgument, NotFound -> kNotFound (a lease that is gone), OutOfRange -> kOutOfRange (a compacted or future
//     revision), FailedPrecondition -> kFailedPrecondition, ResourceExhausted -> kResourceExhausted (the backend
//     quota: compact and defragment), DeadlineExceeded -> kTimeout, PermissionDenied/Unauthenticated ->
//     kPermissionDenied, Unavailable and the rest -> kUnavailable (no leader, leader changed: retry later).
//   - When no member answers (connection refused, timeout, connection reset) the call is kUnavailable naming every
//     endpoint tried and the last curl error.
//   - A reply that is not etcd's JSON (another HTTP server on that port, a response over 64 MiB) is
//     kProtocolMismatch / kMessageTooLarge.
// Messages name the endpoint, the key (printable, shortened) and the lower layer's text, and say what to do.
//
// Endpoint failover: a call starts at the endpoint that answered last and, on a connection-level failure, tries the
// next one, each attempt bounded by Options::timeout_ms (so a call takes at most endpoints x timeout_ms). An etcd
// error reply is an answer: it is returned, not retried elsewhere. Reads (range) and lease keepalives (safe to repeat)
// are retried on the next endpoint after any connection-level failure. Writes (put, del, txn, compact, lease grant
// and revoke) are retried only when the request was never sent (connection refused, connect timeout): a write that
// timed out or lost its connection after being sent may or may not have been applied, and the Status says so
// (kUnavailable "... may or may not have been applied"): the caller re-reads (range) or makes the write conditional
// (txn on mod_revision) before repeating it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::etcd {

// Caps on what one reply (or one watch message) may hold: a larger one fails with kMessageTooLarge.
inline constexpr size_t kMaxResponseBytes = size_t{64} << 20;

struct KeyValue {
  std::string key, value;  // bytes
  int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision when the range was served (reply header)
  bool more = false;     // true when `limit` cut the answer short
  int64_t count = 0;     // keys in the range (all of them, not only the ones returned)
};

// One comparison of a transaction. `number` is compared for kVersion, kCreateRevision, kModRevision and kLease;
// `value` for kValue. A key that does not exist has version, create_revision, mod_revision and lease 0, so
// {key, kCreateRevision, kEqual, 0} is "the key does not exist" (create-if-absent).
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kCreateRevision;
  Result result = Result::kEqual;
  int64_t number = 0;  // for version/create/mod/lease
  std::string value;   // for kValue
};

// One operation of a transaction branch. `range_end` as in Client::range (empty: the single key).
struct Op {
  enum class Kind { kPut, kDelete, kRange };
  Kind kind = Kind::kPut;
  std::string key, value, range_end;
  int64_t lease = 0;
  static Op put(std::string key, std::string value, int64_t lease = 0);
  static Op del(std::string key, std::string range_end = "");
  static Op get(std::string key, std::string range_end = "");
};

struct TxnResult {
  bool succeeded = false;           // true: every compare held and the success branch ran; else the failure branch
  int64_t revision = 0;             // the store's revision after the transaction (reply header)
  std::vector<RangeResult> ranges;  // one per kRange op of the branch taken, in order
};

// ---- TLS (docs/SECURITY.md "etcd") ----
// PEM files: the CA that signed etcd's server certificate (checked, with the host name or address of each endpoint
// against its subjectAltNames), and the client certificate and key this process presents (etcd's
// --client-cert-auth). Empty ca_file: plain HTTP.
struct TlsFiles {
  std::string ca_file, cert_file, key_file;
  bool enabled() const { return !ca_file.empty(); }
};
// The files of a cluster's keys: DIR/ca.pem, DIR/client.pem, DIR/client.key (`mc-auth init` writes them into
// AUTH_DIR/etcd; the CLI kit installs them as the process default when --auth-dir has them).
TlsFiles tls_files_in(const std::string& dir);
// The TLS files parse_endpoints() puts into every Options it makes: set by the CLI kit (cli::parse, from
// --auth-dir DIR when DIR/etcd/ca.pem exists) before any etcd client exists. Thread-safe; by default none.
void set_default_tls(TlsFiles files);
TlsFiles default_tls();
// mc-auth init's etcd certificates: creates `dir` (mode 0700) and writes a new CA (ca.pem, ca.key), etcd's server
// certificate for `server_hosts` (IPv4/IPv6 addresses and DNS names, as subjectAltNames: server.pem, server.key) and
// the client certificate mc's processes present (client.pem, client.key), ECDSA P-256 signed with SHA-256, valid
// `valid_days`; keys mode 0600. etcd then runs with --cert-file server.pem --key-file server.key
// --trusted-ca-file ca.pem --client-cert-auth and https:// client URLs. kInvalidArgument for a bad host or
// validity, kIo naming the path and strerror, kInternal with OpenSSL's text.
Status write_tls_files(const std::string& dir, const std::vector<std::string>& server_hosts, int valid_days = 3650);

struct Options {
  std::vector<std::string> endpoints;  // "127.0.0.1:2379", "http://127.0.0.1:2379" or (with tls) "https://..."
  int64_t timeout_ms = 2000;           // per HTTP call (per endpoint tried); also the connect timeout
  TlsFiles tls{};                      // enabled: every endpoint is reached over HTTPS with these files
};

// "HOST:PORT[,HOST:PORT...]" (also with http:// or https:// prefixes, spaces around commas allowed) ->
// Options.endpoints, with default_tls() as Options.tls: normalised to "https://HOST:PORT" when TLS files are set,
// else "http://HOST:PORT". kInvalidArgument naming the bad entry, also for https:// without TLS files (give
// --auth-dir with the cluster's etcd certificates) and http:// with them (the cluster's etcd speaks TLS).
Result<Options> parse_endpoints(std::string_view list);

// etcd's range_end for "every key with this prefix": the prefix with its last byte below 0xff incremented and what
// follows dropped; "\0" (every key) for an empty prefix or one of only 0xff bytes.
std::string prefix_end(std::string_view prefix);

// Thread-safety: every method may be called from any thread at once; each call takes its own curl handle from a
// mutex-guarded pool (connections are reused across calls). Calls block the calling thread (bounded as above).
class Client {
 public:
  explicit Client(Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The keys in [key, range_end) ("": only `key`; prefix_end(p): every key starting with p), at `revision`
  // (0: the newest; an older one that was compacted is kOutOfRange), at most `limit` keys (0: all), in key order.
  // Linearizable (served through the leader).
  Result<RangeResult> range(const std::string& key, const std::string& range_end = "", int64_t revision = 0,
                            int64_t limit = 0);
  // Sets key to value, attached to `lease` (0: none; a lease that is gone is kNotFound). The new revision.
  Result<int64_t> put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Deletes [key, range_end) (as in range). The revision after the delete (unchanged when nothing was deleted).
  Result<int64_t> del(const std::string& key, const std::string& range_end = "");
  // Atomically: when every compare holds, the success ops, else the failure ops.
  Result<TxnResult> txn(const std::vector<Compare>& compare, const std::vector<Op>& success,
                        const std::vector<Op>& failure = {});
  // A new lease of ttl_s seconds (etcd may raise it to its minimum). The lease id.
  Result<int64_t> lease_grant(int64_t ttl_s);
  // Renews a lease once: its TTL in seconds from now; kNotFound when the lease is gone (expired or revoked).
  Result<int64_t> lease_keepalive(int64_t lease);
  // Ends a lease now and deletes its keys. kNotFound when it is already gone.
  Status lease_revoke(int64_t lease);
  // Drops the history before `revision` (watches and ranges at older revisions then fail). kOutOfRange when that
  // revision is already compacted or in the future.
  Status compact(int64_t revision);

  const Options& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision (the delete's revision) only
};

// A watch on [key, range_end) from start_revision (0: from now), on its own thread.
//
// POST /v3/watch is a streaming response of newline-separated JSON objects ({"result":{...}}); the first one is the
// "created" answer. on_events gets every batch in revision order; `revision` is the store's revision when etcd sent
// the batch (its header), every event carries its own mod_revision. When the connection drops (the member was
// killed, restarted, or did not answer "created" within Options::timeout_ms), the watch reconnects to the next
// endpoint from the last delivered revision + 1 (from the created answer's revision + 1 when nothing was delivered
// yet), backing off 50 ms, 100 ms, ... up to 1 s between attempts, for as long as it runs: no event is lost or
// repeated. Unreachable members are logged (rate-limited warnings), not reported through on_error.
// When etcd answers that the start revision was compacted, on_error gets kDataLoss ("... compacted at revision N")
// and the watch stops: the owner reloads with a range and starts a new watch from that range's revision + 1. Any
// other cancellation by etcd is reported the same way (kFailedPrecondition with etcd's reason) and stops the watch.
// Without endpoints no thread starts: on_error(kInvalidArgument) is called from the constructor.
//
// Thread-safety: on_events and on_error run on the watch thread, one call at a time. stop() and running() may be
// called from any thread; stop() from inside a callback only asks the thread to end (it cannot join itself). The
// destructor stops and joins, so it must not run inside a callback. stop() returns within about 100 ms (the stream
// runs on a curl multi handle polled every 100 ms, which stop() also wakes); it never waits for etcd.
class Watch {
 public:
  using EventsFn = std::function<void(const std::vector<WatchEvent>&, int64_t revision)>;
  using ErrorFn = std::function<void(const Status&)>;
  Watch(Options options, std::string key, std::string range_end, int64_t start_revision, EventsFn on_events,
        ErrorFn on_error);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  void stop();
  // False once stopped, or after on_error ended the watch.
  bool running() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace mc::etcd
