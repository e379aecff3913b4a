// mc::store::Client — the KV store's client library (what mc-prefill, mc-conductor and the admin CLI use).
//
// Keys are block store keys (block_key.hpp: "kv/<namespace digest>/<16 hex seq hash>"), so a different
// model, revision, KV dtype, block size, layout, LoRA or salt never hits; any other non-empty string up
// to 512 bytes is accepted too (admin objects). Values are immutable byte strings (KV blocks).
//
// Data path (Mooncake §5): the master hands out replica locations; the client moves the bytes itself with
// its own mc::transfer::TransferEngine (initiator only), whose segment directory is the master
// (directory.hpp). A replica names the storage node's engine segment and the offset in it; the engine
// opens the segment (shm — one memcpy from the node's memfd — when both run on one host, else rdma or
// tcp) and moves the bytes. Each batch call posts one engine batch for all its objects (and replicas).
// Local memory: a buffer registered with register_buffer() is used in place (zero-copy); any other
// buffer is registered for the duration of the call (or staged through a temporary buffer when it
// straddles the edge of a registered one). SSD replicas are files, which the engine cannot address: they
// are read and written through the storage node's store.node.* RPCs (chunks of at most 1 MiB).
//
// Reads: replicas are tried nearest first (same host, same failure domain, DRAM before SSD); a replica
// that fails is skipped for the next one. Each read runs under a lease granted by the master: if the
// copy finishes after the lease ended the bytes are discarded and kLeaseExpired is returned, so a
// caller gets either the exact bytes or an error, never mixed bytes. An absent object is a miss
// (kObjectNotFound), never data. Integrity: put sends the XXH3-64 of each object's bytes (checksum.hpp)
// with its put_end; a read checks the bytes of every replica (DRAM or SSD) against the checksum the master
// hands out, and a replica that fails it is reported (store.report_corrupt: the master drops it) and
// skipped for the next; when none is left the read is a miss (kObjectNotFound). batch_get additionally requires the
// object's size to equal the buffer's (a block of another length is a miss: DESIGN.md §13.3, step 4).
//
// Writes: put_start reserves replicas (distinct nodes, spread over failure domains), the bytes are
// written, then put_end makes the object visible; if any write fails the put is revoked. Putting a key
// that exists is kAlreadyExists (batch_put counts it as stored: blocks are content-addressed), unless
// overwrite is set. A key another writer is writing is kObjectBusy (retryable). When DRAM is full but
// space is being freed by demotions to SSD, put waits up to put_retry_ms; kNoSpace means nothing can
// be evicted (everything leased, pinned or being written) or no node is mounted.
//
// Write-behind commit (WriteOptions::wait_commit = false): put/batch_put return once the bytes are
// written and the put_end is queued on the client's ordered fast-path connection to the master, without
// waiting for its reply (one round trip per put instead of two). The object becomes visible when the
// master processes that put_end (the conductor learns it from the KV `stored` event). Calls on the same
// connection are processed in order, so a get, exists or match_prefix by this client after the put sees
// the object (if the commit succeeded). The put_end's reply is collected by the next master call of this
// client or by flush(); a refused commit (e.g. the master reclaimed a stale put, or the key was removed)
// is never lost: it is counted (ClientCounters::commit_failures), logged with its key, and returned by
// flush(); the object is then simply absent (a later get is a miss, never data). A connection that breaks
// with commits outstanding reports them as failed (kUnavailable: unconfirmed), although the master may
// have applied some. No request is ever sent twice. The destructor waits up to rpc_timeout_ms for the
// replies of outstanding commits, so that a failure is still logged. Without a fast path (master started with
// --fast-listen off, or after that connection failed) the commit is waited for, as with wait_commit. A
// fast path that failed (e.g. the master restarted, with a new fast port) is looked for again (store.info)
// at most once a second, on the next call; calls go over ZeroMQ meanwhile.
//
// Liveness: a background thread heartbeats the master every heartbeat_ms on its own connection, so an
// idle but live writer keeps its unfinished puts, and a dead one's are reclaimed after the master's
// client TTL (DESIGN.md §13.7).
//
// A master that does not answer (issue 17: a miss may cost time, never a request): after a master call times
// out (no reply within rpc_timeout_ms), further calls fail at once with kUnavailable, without waiting
// rpc_timeout_ms each, for a back-off window of 1 s doubling with each further failed probe up to 8 s; the first
// call after the window probes the master again, and a heartbeat that succeeds ends the window at once. So a
// prefill instance whose master is down recomputes at full speed instead of waiting two timeouts per job.
// ClientCounters::master_fast_failures counts the calls refused that way.
//
// Errors: kUnavailable/kTimeout (master or node unreachable, endpoint named), kObjectNotFound (miss),
// kObjectBusy, kLeaseExpired, kNoSpace, kInvalidArgument (bad key, size 0, buffer too small).
// Thread-safety: a Client is not thread-safe (it owns ZeroMQ sockets); use one per thread. Its heartbeat
// thread and the engine's threads are internal and stop in the destructor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/store.hpp"

namespace mc::store {

struct ClientOptions {
  std::string master = "tcp://127.0.0.1:7450";  // mc-store master endpoint
  // A replicated master (master_link.hpp): with etcd set, the client follows the leader of cluster_id (master is
  // ignored); a call that fails while the leader changes is sent once more to the new leader.
  std::string etcd;
  std::string cluster_id;
  std::string client_id;            // unique per process; empty: "<hostname>-<pid>-<random>"
  std::string host;                 // this host's name for nearest-first; empty: gethostname()
  std::string domain;               // this host's failure domain label (may be empty)
  int rpc_timeout_ms = 2000;        // per master call
  int node_timeout_ms = 2000;       // a storage node making no progress this long has failed (engine slice
                                    // timeout and connect bound; per SSD data call)
  int transfer_timeout_ms = 30000;  // deadline of one replica transfer from submit, queueing behind the rest
                                    // of its batch included (engine request timeout)
  int heartbeat_ms = 1000;          // background heartbeat to the master (0: off; the master's client TTL is 10 s)
  uint32_t replicas = 1;            // copies written by put/batch_put
  std::string preferred_segment;    // tried first by put (e.g. the segment of this host's storage node)
  std::vector<std::string> transports = {"shm", "rdma", "tcp"};  // engine transports allowed; the best that
                                                                 // reaches a replica's segment is used
  bool replicate_hot = true;  // perform hot-object copies the master asks for after a read
  int put_retry_ms = 3000;    // how long put waits for space that is being freed (DRAM -> SSD demotion)
  bool fast_rpc = true;       // metadata calls over the master's plain-TCP fast path when it offers one
                              // (store.info); else, or after that connection fails, over ZeroMQ
  // A replica whose engine segment failed a read for a network reason (unreachable, timed out, transfer
  // failed) is not tried again by this client for this long: its other replicas are read instead, and with
  // none left the read is a miss at once (the caller recomputes) instead of another transfer timeout. The master
  // cannot know of a path cut between this host and a node it still hears (DESIGN.md §16); 0: off.
  int unreachable_cooldown_ms = 10000;
};

// One object of a batch_put.
struct PutItem {
  std::string key;
  std::span<const std::byte> data;
};
// One object of a batch_get: the destination buffer (caller-owned; exactly the object's size), or a range of
// the object: `buffer` receives the bytes [offset_bytes, offset_bytes + buffer.size()) of an object that must be
// object_bytes long (0: buffer.size(), the whole object). A range is read alone and checked against the object's
// part checksums when its writer sent them (WriteOptions::part_bytes) and the range starts and ends on part
// boundaries (or at the object's end); otherwise the whole object is read into a temporary buffer, checked, and
// the range copied out (same result, more bytes moved); so is a range of a hot object the master asks this client
// to copy (replicate_to), which needs its whole bytes. A range past object_bytes is kInvalidArgument for that item.
struct GetItem {
  std::string key;
  std::span<std::byte> buffer;
  uint64_t offset_bytes = 0;
  uint64_t object_bytes = 0;
};

struct WriteOptions {
  bool overwrite = false;   // replace an existing object (refused while a reader holds a lease)
  bool pin = false;         // never evicted nor demoted to SSD (until unpin, or pin_ttl_ms)
  bool wait_commit = true;  // false: write-behind commit (see above); its outcome comes from flush()
  int64_t pin_ttl_ms = 0;   // with pin: 0 = until unpin, > 0 = soft pin ending this long after the put started
  // > 0: also send the checksum of each part of this many bytes (checksum.hpp), so that readers of part-aligned
  // ranges (GetItem::offset_bytes) move and check only those bytes; objects of more than kMaxObjectParts parts
  // are put without them.
  uint64_t part_bytes = 0;
};

// A write-behind commit (put_end) the master refused or that could not be confirmed.
struct CommitFailure {
  std::string key;
  Status status;
};

// Counters of the data path since connect (for benchmarks and the ledger). "shm" counts bytes the engine
// moved over shm; "tcp" counts every other engine path (tcp, rdma); SSD replicas, read through node RPCs,
// count in bytes_read_ssd (with the wall time of those reads), never in shm or tcp.
struct ClientCounters {
  uint64_t bytes_read_shm = 0, bytes_read_tcp = 0, bytes_written_shm = 0, bytes_written_tcp = 0;
  uint64_t replica_fallbacks = 0;  // reads that failed on a replica and went to the next
  uint64_t lease_expired = 0;
  uint64_t master_calls_fast = 0, master_calls_zmq = 0;  // metadata calls by path (fast_rpc / ZeroMQ)
  uint64_t commits_behind = 0;        // objects committed write-behind (put_end sent without waiting)
  uint64_t commit_failures = 0;       // of those, refused by the master or unconfirmed (connection lost)
  uint64_t bytes_read_ssd = 0;        // read from SSD replicas (node RPCs)
  uint64_t read_ssd_ns = 0;           // wall time of those SSD reads (RPC round trips and copies included)
  uint64_t corrupt_replicas = 0;      // replicas whose bytes failed the object's checksum (reported, skipped)
  uint64_t master_fast_failures = 0;  // master calls failed at once: the master did not answer a moment ago
  uint64_t unreachable_segments = 0;  // segments put in the unreachable cooldown (ClientOptions)
  uint64_t unreachable_skips = 0;     // replica reads skipped because their segment was cooling down
  // bytes_read_tcp by the replica's host (StoreReplica::host), for per-path bandwidth samples (DESIGN.md §16);
  // at most kMaxTcpReadHosts hosts, the rest under "".
  static constexpr size_t kMaxTcpReadHosts = 256;
  std::map<std::string, uint64_t> bytes_read_tcp_by_host;
};

class Client {
 public:
  // Connects to the master (hello handshake). kUnavailable/kTimeout naming the endpoint.
  static Result<std::unique_ptr<Client>> connect(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Status put(const std::string& key, std::span<const std::byte> data, const WriteOptions& options = {});
  // Reads the object into `buffer` (which must be at least its size); returns its size in bytes.
  Result<uint64_t> get(const std::string& key, std::span<std::byte> buffer);
  // Reads the whole object into a new buffer of its size: one get_replicas (one hit, one lease), for callers
  // that do not know the size (the admin CLI). Same errors as above.
  Result<std::vector<std::byte>> get(const std::string& key);
  // Size of an object without reading it (kObjectNotFound when absent). Grants no lasting lease.
  Result<uint64_t> size_of(const std::string& key);

  // One Status per item, in order: ok, or why that item was not stored (kAlreadyExists counts as ok).
  Result<std::vector<Status>> batch_put(std::span<const PutItem> items, const WriteOptions& options = {});
  // One Status per item: ok (buffer filled exactly), kObjectNotFound (miss, including a size mismatch),
  // or the read error. The whole call fails only when the master is unreachable or the batch is too big.
  Result<std::vector<Status>> batch_get(std::span<const GetItem> items);

  // Waits up to rpc_timeout_ms for the replies of every outstanding write-behind commit. Ok when every
  // commit since the last flush() succeeded; else the first failure's code with a message naming its key
  // and the number of failures, and `failures` (when given) receives them (up to 4096 since the last
  // flush; the rest are counted and logged only); the list is then cleared. kTimeout when replies are still outstanding
  // (they stay pending for a later call or flush).
  Status flush(std::vector<CommitFailure>* failures = nullptr);
  size_t commits_pending() const;  // write-behind commits whose reply has not been read yet

  Result<std::vector<bool>> exists(const std::vector<std::string>& keys);
  // Number of leading keys present (blocks of a prefix chain); stops at the first missing one.
  Result<uint64_t> match_prefix(const std::vector<std::string>& keys);
  Status remove(const std::string& key);
  // Pins objects (never evicted nor demoted): ttl_ms 0 until unpin, > 0 a soft pin ending ttl_ms from now.
  // One Status per key, in order: ok, kObjectNotFound naming an absent key, kObjectBusy while it is being
  // written. The whole call fails only when the master is unreachable or the batch is too big.
  Result<std::vector<Status>> pin(const std::vector<std::string>& keys, int64_t ttl_ms = 0);
  // Ends the pins of objects; one Status per key (kObjectNotFound naming an absent key).
  Result<std::vector<Status>> unpin(const std::vector<std::string>& keys);
  // The first `limit` objects whose keys start with prefix, in key order, fetched page by page (the master answers
  // at most proto::kStoreLsPageObjects per call); truncated when more match.
  Result<proto::StoreLsReply> ls(const std::string& prefix, uint32_t limit = 1000);
  Result<proto::StoreStatReply> stat();
  // Sets a tenant's quota (admin only: store.quota_set; docs/SECURITY.md "Quotas (issue 51)"). `limits` as
  // parse_quota_limits takes it; the dimensions not named keep their value. kInvalidArgument for a bad item,
  // kPermissionDenied for a caller that is not admin.
  Status quota_set(const std::string& tenant, const std::string& limits);

  // Registers caller memory with the client's transfer engine so reads and writes use it in place
  // (zero-copy). kAlreadyExists when it overlaps a registered buffer, kInvalidArgument for an empty span.
  Status register_buffer(std::span<std::byte> buffer);
  Status unregister_buffer(void* data);  // kNotFound when no registered buffer starts at data

  const std::string& client_id() const;
  const ClientCounters& counters() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc::store
