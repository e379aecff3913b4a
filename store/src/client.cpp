#include "mc/store/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/net/fast_rpc.hpp"
#include "mc/proto/store.hpp"
#include "mc/store/checksum.hpp"
#include "mc/store/directory.hpp"
#include "mc/transfer/engine.hpp"

namespace mc::store {

namespace {

// Bytes per node data RPC of an SSD replica (at most proto::kStoreMaxChunkBytes).
constexpr uint64_t kChunkBytes = 1ULL << 20;
constexpr int kNodeChunksInFlight = 8;  // SSD replica chunks pipelined per node_transfer

Status item_status(uint16_t code, const std::string& message) {
  return code == 0 ? Status::ok() : Status(static_cast<Code>(code), message);
}

// One replica transfer of a call: `op` between local bytes and a replica.
struct Job {
  size_t item = 0;  // index of the object in the caller's batch
  const proto::StoreReplica* replica = nullptr;
  transfer::Op op = transfer::Op::kRead;  // kRead: replica -> local; kWrite: local -> replica
  std::byte* local = nullptr;
  uint64_t length = 0;
  Status status;
  uint64_t remote_offset = 0;  // bytes into the replica (a range read)
};

}  // namespace

class Client::Impl {
 public:
  ClientOptions options;
  std::shared_ptr<MasterLocator> locator;  // where the master is (a fixed endpoint, or the leader in etcd)
  std::unique_ptr<MasterLink> master;
  std::unique_ptr<rpc::fast::FastClient> fast_master;  // the master's fast path when it offers one (fast_rpc.hpp)
  static constexpr int64_t kFastRetryMs = 1000;        // a lost fast path is looked for again this often
  bool fast_lost = false;                              // the fast path failed: connect_fast is tried again
  std::string fast_endpoint;                           // the master whose fast path fast_master is
  int64_t next_fast_attempt_ms = 0;
  std::unique_ptr<rpc::AsyncClient> nodes;                // to the nodes' RPC endpoints (SSD replicas)
  std::shared_ptr<transfer::SegmentDirectory> directory;  // the master's, or etcd's records (replicated master)
  std::unique_ptr<transfer::TransferEngine> engine;       // after directory: destroyed first
  std::map<uintptr_t, uint64_t> registered;               // engine registrations: start -> length
  std::map<transfer::SegmentHandle, bool> shm_segment;    // opened segment -> moved over shm
  ClientCounters counters;
  // Engine segments (xfer_segment) that failed a read for a network reason, until when (steady ms).
  std::unordered_map<std::string, int64_t> unreachable_until;
  bool cooling_down(const std::string& xfer_segment, int64_t now_ms) {
    if (xfer_segment.empty() || unreachable_until.empty()) return false;
    auto it = unreachable_until.find(xfer_segment);
    if (it == unreachable_until.end()) return false;
    if (it->second > now_ms) return true;
    unreachable_until.erase(it);
    return false;
  }

  // Write-behind commits (WriteOptions::wait_commit = false): put_ends sent on fast_master whose replies
  // have not been read yet, in send order, and the failures collected since the last flush().
  struct PendingCommit {
    uint64_t id = 0;
    std::vector<std::string> keys;
  };
  std::deque<PendingCommit> pending_commits;
  std::vector<CommitFailure> commit_failures;  // at most kKeptCommitFailures; the rest only counted
  uint64_t commit_failures_unlisted = 0;
  static constexpr size_t kKeptCommitFailures = 4096;
  const rpc::fast::FastClient::OtherReply on_other_reply = [this](rpc::fast::FastClient::Reply& r) {
    collect_commit(r);
  };

  std::thread heartbeat_thread;
  std::mutex heartbeat_mu;
  std::condition_variable heartbeat_cv;
  bool heartbeat_stop = false;

  // The master did not answer (client.hpp "A master that does not answer"): calls fail at once until
  // master_down_until_ms, or until a heartbeat succeeds after master_down_since_ms.
  static constexpr int64_t kMasterDownFirstMs = 1000, kMasterDownMaxMs = 8000;
  int64_t master_down_since_ms = 0, master_down_until_ms = 0, master_down_window_ms = 0;
  Status master_down_why;
  std::atomic<int64_t> last_heartbeat_ok_ms{0};  // written by the heartbeat thread

  ~Impl() {
    // Outstanding commits were sent; read their replies so that no failure goes unlogged (bounded).
    if (!pending_commits.empty()) (void)drain_commits(steady_ms() + options.rpc_timeout_ms);
    {
      std::lock_guard<std::mutex> lk(heartbeat_mu);
      heartbeat_stop = true;
    }
    heartbeat_cv.notify_all();
    if (heartbeat_thread.joinable()) heartbeat_thread.join();
    engine.reset();
  }

  // Heartbeats on a connection of its own (the caller's sockets are not thread-safe). A failed beat is
  // logged once per outage; the next period tries again (reconnecting when the connection is gone).
  void heartbeat_loop() {
    std::unique_ptr<MasterLink> conn;
    bool warned = false;
    std::unique_lock<std::mutex> lk(heartbeat_mu);
    while (!heartbeat_stop) {
      lk.unlock();
      Status s = Status::ok();
      if (!conn) {
        rpc::ClientOptions co;
        co.client_name = options.client_id + " heartbeat";
        co.connect_timeout_ms = options.rpc_timeout_ms;
        co.default_timeout_ms = options.rpc_timeout_ms;
        auto c = MasterLink::connect(locator, co);
        if (c.is_ok()) {
          conn = std::move(c).value();
        } else {
          s = c.status();
        }
      }
      if (conn) {
        s = conn->call(proto::StoreClientHeartbeatRequest{options.client_id}, options.rpc_timeout_ms).status();
        if (!s.is_ok()) conn.reset();
        if (s.is_ok()) last_heartbeat_ok_ms.store(steady_ms());
      }
      if (!s.is_ok() && !warned)
        MC_LOG_WARN << "client " << options.client_id << ": heartbeat failed: " << s.to_string();
      warned = !s.is_ok();
      lk.lock();
      heartbeat_cv.wait_for(lk, std::chrono::milliseconds(options.heartbeat_ms), [&] { return heartbeat_stop; });
    }
  }

  // Every metadata call: the fast path when connected, else ZeroMQ. A fast connection that breaks (master
  // restarted, stream failed) answers this call with its error and is dropped: later calls use ZeroMQ,
  // which reconnects by itself. A request is never sent twice (put_start is not idempotent). Replies to
  // write-behind commits that arrive before this call's own are collected on the way.
  template <typename Req>
  Result<typename Req::Reply> call_master(const Req& req) {
    if (master_down_until_ms != 0) {
      const int64_t now = steady_ms();
      // A new leader (etcd) is asked at once.
      if (now < master_down_until_ms && last_heartbeat_ok_ms.load() <= master_down_since_ms &&
          locator->generation() == master->generation()) {
        ++counters.master_fast_failures;
        return Status(Code::kUnavailable, "store master " + master->endpoint() + " did not answer " +
                                              std::to_string(now - master_down_since_ms) + " ms ago (" +
                                              master_down_why.message() + "); not asked again for " +
                                              std::to_string(master_down_until_ms - now) + " ms");
      }
    }
    Result<typename Req::Reply> r = call_master_now(req);
    note_master_result(r.status());
    return r;
  }

  // Opens or closes the back-off window after a master call: a timeout opens it (the master answers its errors,
  // e.g. kUnavailable "DRAM is full", so only silence counts; a broken fast connection falls back to ZeroMQ,
  // whose next call times out when the master is gone).
  void note_master_result(const Status& s) {
    if (s.code() != Code::kTimeout) {
      if (master_down_until_ms != 0)
        MC_LOG_INFO << "client " << options.client_id << ": the store master answers again";
      master_down_until_ms = master_down_window_ms = 0;
      return;
    }
    master_down_window_ms =
        master_down_window_ms == 0 ? kMasterDownFirstMs : std::min(master_down_window_ms * 2, kMasterDownMaxMs);
    master_down_since_ms = steady_ms();
    master_down_until_ms = master_down_since_ms + master_down_window_ms;
    master_down_why = s;
  }

  template <typename Req>
  Result<typename Req::Reply> call_master_now(const Req& req) {
    // Another master leads now (etcd; the link may have followed it inside an earlier call): its fast path, and a
    // fresh start of the "master down" window.
    if (master->follow() || (fast_master && fast_endpoint != master->endpoint())) {
      if (fast_master) fast_failed(Status(Code::kUnavailable, "the store master leader changed"));
      master_down_until_ms = master_down_window_ms = 0;
      fast_lost = true;
      next_fast_attempt_ms = 0;
    }
    if (fast_lost && steady_ms() >= next_fast_attempt_ms) {
      // Back to the fast path after it failed (a restarted master offers a new one): at most once a second.
      next_fast_attempt_ms = steady_ms() + kFastRetryMs;
      connect_fast();
    }
    if (fast_master) {
      ++counters.master_calls_fast;
      Result<typename Req::Reply> r = fast_master->call(req, options.rpc_timeout_ms, on_other_reply);
      if (fast_master->broken()) fast_failed(r.status());
      // A leader that stopped answering: when another takes over within the timeout, ask it once (ZeroMQ).
      if (!r.is_ok() && locator->follows_etcd() &&
          (r.status().code() == Code::kUnavailable || r.status().code() == Code::kTimeout) &&
          locator->wait_change(master->generation(), options.rpc_timeout_ms) && master->follow()) {
        ++counters.master_calls_zmq;
        return master->call(req, options.rpc_timeout_ms);
      }
      return r;
    }
    ++counters.master_calls_zmq;
    return master->call(req, options.rpc_timeout_ms);
  }

  // The fast connection failed: drop it (later calls use ZeroMQ until connect_fast succeeds again, tried
  // at most every kFastRetryMs) and report the commits still waiting on it.
  void fast_failed(const Status& why) {
    MC_LOG_WARN << "client " << options.client_id << ": fast path to the master failed (" << why.to_string()
                << "); using " << master->endpoint() << " until the fast path answers again";
    fast_master.reset();
    fast_lost = true;
    next_fast_attempt_ms = steady_ms() + kFastRetryMs;
    std::deque<PendingCommit> lost = std::move(pending_commits);
    pending_commits.clear();
    for (const PendingCommit& pc : lost) {
      for (const std::string& key : pc.keys) {
        commit_failed(
            key, Status(Code::kUnavailable, "write-behind commit unconfirmed: the connection to the master failed (" +
                                                why.message() + "); the master may or may not have applied it"));
      }
    }
  }

  void commit_failed(const std::string& key, Status s) {
    ++counters.commit_failures;
    MC_LOG_WARN << "client " << options.client_id << ": write-behind commit of '" << key
                << "' failed: " << s.to_string();
    if (commit_failures.size() < kKeptCommitFailures) {
      commit_failures.push_back({key, std::move(s)});
    } else {
      ++commit_failures_unlisted;
    }
  }

  // A reply read from the fast connection that is not the current call's: a write-behind commit's (its
  // per-key codes), or an abandoned call's (ignored). A reply that cannot be decoded fails its commit.
  void collect_commit(rpc::fast::FastClient::Reply& r) {
    auto it = std::find_if(pending_commits.begin(), pending_commits.end(),
                           [&](const PendingCommit& p) { return p.id == r.id; });
    if (it == pending_commits.end()) return;
    PendingCommit pc = std::move(*it);
    pending_commits.erase(it);
    if (!r.status.is_ok()) {
      for (const std::string& key : pc.keys) commit_failed(key, r.status);
      return;
    }
    Result<proto::StoreItemsReply> reply =
        codec::unpack<proto::StoreItemsReply>(r.body, "put_end reply from " + master->endpoint());
    if (reply.is_ok() && reply->codes.size() != pc.keys.size()) {
      reply = Status(Code::kMalformedMessage, "put_end reply from " + master->endpoint() + " has " +
                                                  std::to_string(reply->codes.size()) + " codes for " +
                                                  std::to_string(pc.keys.size()) + " keys");
    }
    if (!reply.is_ok()) {
      for (const std::string& key : pc.keys) commit_failed(key, reply.status());
      return;
    }
    for (size_t j = 0; j < pc.keys.size(); ++j) {
      if (reply->codes[j] == 0) continue;
      commit_failed(pc.keys[j], item_status(reply->codes[j], j < reply->messages.size() ? reply->messages[j] : ""));
    }
  }

  // Sends a put_end without waiting for its reply; false when there is no fast path (commit synchronously).
  Result<bool> commit_behind(const proto::StorePutEndRequest& end) {
    if (!fast_master) return false;
    ++counters.master_calls_fast;
    Result<uint64_t> id = fast_master->send(proto::StorePutEndRequest::kType, codec::pack(end));
    if (!id.is_ok()) {
      if (fast_master->broken()) fast_failed(id.status());
      return id.status().with_context("put_end (write-behind)");
    }
    pending_commits.push_back({*id, end.keys});
    counters.commits_behind += end.keys.size();
    return true;
  }

  // Reads commit replies until none is pending or the deadline passes; false on timeout.
  bool drain_commits(int64_t deadline_ms) {
    while (!pending_commits.empty() && fast_master) {
      const int64_t left = deadline_ms - steady_ms();
      if (left <= 0) return false;
      Result<std::optional<rpc::fast::FastClient::Reply>> r = fast_master->recv(static_cast<int>(left));
      if (!r.is_ok()) {
        fast_failed(r.status());
        break;
      }
      if (!r->has_value()) return false;
      collect_commit(**r);
    }
    return pending_commits.empty();
  }

  // Asks the master for its fast path and connects to it; stays on ZeroMQ when there is none.
  void connect_fast() {
    Result<proto::StoreInfoReply> info =
        master->call(proto::StoreInfoRequest{options.client_id}, options.rpc_timeout_ms);
    if (!info.is_ok() || info->fast_port == 0) {
      MC_LOG_DEBUG << "client " << options.client_id << ": master offers no fast path"
                   << (info.is_ok() ? std::string() : ": " + info.status().to_string());
      return;
    }
    Result<Endpoint> fast_ep = parse_endpoint(master->endpoint());
    if (!fast_ep.is_ok() || !fast_ep->is_tcp()) return;
    fast_ep->port = static_cast<uint16_t>(info->fast_port);
    auto c = rpc::fast::FastClient::connect(*fast_ep, options.client_id, options.rpc_timeout_ms);
    if (!c.is_ok()) {
      MC_LOG_WARN << "client " << options.client_id << ": fast path of " << master->endpoint() << " unreachable ("
                  << c.status().to_string() << "); using ZeroMQ";
      return;
    }
    fast_master = std::move(c).value();
    fast_endpoint = master->endpoint();
    if (fast_lost) MC_LOG_INFO << "client " << options.client_id << ": back on the fast path of " << master->endpoint();
    fast_lost = false;
  }

  // Is [p, p+n) inside one engine registration?
  bool covered(const std::byte* p, uint64_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = registered.upper_bound(a);
    if (it == registered.begin()) return false;
    --it;
    return a - it->first < it->second && n <= it->second - (a - it->first);
  }

  Status register_range(std::byte* p, uint64_t n) {
    MC_RETURN_IF_ERROR(engine->register_memory(p, n).status());
    registered[reinterpret_cast<uintptr_t>(p)] = n;
    return Status::ok();
  }
  Status unregister_range(void* p) {
    MC_RETURN_IF_ERROR(engine->unregister_memory(p));
    registered.erase(reinterpret_cast<uintptr_t>(p));
    return Status::ok();
  }

  // Local memory for the engine during one call: registered buffers in place, others registered until
  // the scope ends, ranges straddling a registration staged through a temporary buffer.
  class LocalScope {
   public:
    explicit LocalScope(Impl& m) : m_(m) {}
    ~LocalScope() {
      for (void* p : temporary_) {
        Status s = m_.unregister_range(p);
        if (!s.is_ok()) MC_LOG_WARN << "unregistering a call's buffer: " << s.to_string();
      }
    }
    LocalScope(const LocalScope&) = delete;
    LocalScope& operator=(const LocalScope&) = delete;

    // The address the engine uses for [p, p+n); for a staged kWrite the bytes are copied in now.
    Result<std::byte*> prepare(std::byte* p, uint64_t n, transfer::Op op) {
      if (m_.covered(p, n)) return p;
      if (m_.register_range(p, n).is_ok()) {
        temporary_.push_back(p);
        return p;
      }
      auto stage = std::make_unique<std::byte[]>(n);
      MC_RETURN_IF_ERROR(m_.register_range(stage.get(), n));
      temporary_.push_back(stage.get());
      if (op == transfer::Op::kWrite) std::memcpy(stage.get(), p, n);
      std::byte* addr = stage.get();
      staged_[addr] = {p, std::move(stage)};
      return addr;
    }
    // After a completed kRead into `addr`: copies staged bytes to the caller's memory.
    void finish_read(std::byte* addr, uint64_t n) {
      auto it = staged_.find(addr);
      if (it != staged_.end()) std::memcpy(it->second.first, addr, n);
    }

   private:
    Impl& m_;
    std::vector<void*> temporary_;
    std::map<std::byte*, std::pair<std::byte*, std::unique_ptr<std::byte[]>>> staged_;
  };

  // An SSD replica through the node's RPCs (the engine cannot address a file): its chunks pipelined, at most
  // kNodeChunksInFlight at once. Returns only when no chunk call is left in flight into caller memory.
  Status node_transfer(Job& j) {
    const proto::StoreReplica& r = *j.replica;
    const bool write = j.op == transfer::Op::kWrite;
    const int64_t t0 = RealClock::instance().now_ns();
    Status failed = Status::ok();
    int in_flight = 0;
    auto on_done = [&](Status s) {
      --in_flight;
      if (!s.is_ok() && failed.is_ok()) {
        failed = s.with_context((write ? "writing " : "reading ") + r.segment + " on " + r.endpoint);
      }
    };
    for (uint64_t next = 0; next < j.length || in_flight > 0;) {
      while (next < j.length && in_flight < kNodeChunksInFlight && failed.is_ok()) {
        const uint64_t at = next, n = std::min<uint64_t>(kChunkBytes, j.length - next);
        next += n;
        ++in_flight;
        if (write) {
          proto::StoreNodeWriteRequest req;
          req.segment = r.segment;
          req.offset_bytes = r.offset_bytes + j.remote_offset + at;
          req.data.assign(reinterpret_cast<const char*>(j.local) + at, reinterpret_cast<const char*>(j.local) + at + n);
          req.grant = r.grant;
          nodes->call(r.endpoint, req, options.node_timeout_ms,
                      [&](Result<proto::StoreNodeWriteRequest::Reply> reply) { on_done(reply.status()); });
        } else {
          nodes->call(
              r.endpoint, proto::StoreNodeReadRequest{r.segment, r.offset_bytes + j.remote_offset + at, n, r.grant},
              options.node_timeout_ms, [&, at, n](Result<proto::StoreNodeReadReply> reply) {
                if (reply.is_ok() && reply->data.size() != n) {
                  reply =
                      Status(Code::kDataLoss, "node " + r.endpoint + " returned " + std::to_string(reply->data.size()) +
                                                  " bytes of " + r.segment + " for a read of " + std::to_string(n));
                }
                if (reply.is_ok()) std::memcpy(j.local + at, reply->data.data(), n);
                on_done(reply.status());
              });
        }
      }
      if (!failed.is_ok() && in_flight == 0) break;
      if (in_flight > 0) nodes->poll(options.node_timeout_ms);
    }
    MC_RETURN_IF_ERROR(failed);
    if (write) {
      counters.bytes_written_tcp += j.length;
    } else {
      counters.bytes_read_ssd += j.length;
      counters.read_ssd_ns += static_cast<uint64_t>(RealClock::instance().now_ns() - t0);
    }
    return Status::ok();
  }

  Result<transfer::SegmentHandle> open_segment(const proto::StoreReplica& r) {
    auto h = engine->open_segment(r.xfer_segment);
    if (!h.is_ok()) return h.status().with_context("replica of segment " + r.segment + " on node " + r.node_id);
    if (!shm_segment.count(*h)) shm_segment[*h] = engine->segment_transport(*h).value_or("") == "shm";
    return h;
  }

  // Runs every job: engine-served replicas as ONE engine batch, SSD replicas through node RPCs. Sets
  // each job's status; never leaves a transfer in flight into caller memory when it returns.
  void run_jobs(std::vector<Job>& jobs) {
    LocalScope scope(*this);
    std::vector<transfer::TransferRequest> reqs;
    std::vector<size_t> req_job;
    std::vector<transfer::SegmentHandle> req_seg;
    for (size_t i = 0; i < jobs.size(); ++i) {
      Job& j = jobs[i];
      if (j.replica->xfer_segment.empty()) continue;  // SSD: below
      auto h = open_segment(*j.replica);
      if (!h.is_ok()) {
        j.status = h.status();
        continue;
      }
      auto local = scope.prepare(j.local, j.length, j.op);
      if (!local.is_ok()) {
        j.status = local.status().with_context("local buffer of " + std::to_string(j.length) + " bytes");
        continue;
      }
      reqs.push_back(transfer::TransferRequest{j.op, local.value(), h.value(),
                                               j.replica->xfer_offset_bytes + j.remote_offset, j.length, "",
                                               j.replica->grant});
      req_job.push_back(i);
      req_seg.push_back(h.value());
    }
    if (!reqs.empty()) run_batch(reqs, req_job, req_seg, jobs, scope);
    for (Job& j : jobs) {
      if (j.replica->xfer_segment.empty()) j.status = node_transfer(j);
    }
  }

  void run_batch(const std::vector<transfer::TransferRequest>& reqs, const std::vector<size_t>& req_job,
                 const std::vector<transfer::SegmentHandle>& req_seg, std::vector<Job>& jobs, LocalScope& scope) {
    auto batch = engine->submit(reqs);
    if (!batch.is_ok()) {
      for (size_t k : req_job) jobs[k].status = batch.status();
      return;
    }
    // The engine makes every request final by its deadline (request_timeout_ms) plus the drain of
    // in-flight slices; wait that long, twice at most, before giving up on the batch.
    const auto& eo = engine->options();
    const int64_t bound_ms = eo.request_timeout_ms + 2 * eo.slice_timeout_ms + 1000;
    Result<transfer::BatchStatus> st = engine->wait(*batch, bound_ms);
    if (st.is_ok() && st->state == transfer::TransferState::kPending) st = engine->wait(*batch, bound_ms);
    if (!st.is_ok() || st->state == transfer::TransferState::kPending || st->requests.size() != reqs.size()) {
      Status why = st.is_ok() ? Status(Code::kTimeout,
                                       "transfer batch still pending after " + std::to_string(2 * bound_ms) + " ms")
                              : st.status();
      for (size_t k : req_job) jobs[k].status = why;
      MC_LOG_ERROR << "transfer batch " << *batch
                   << " not final; its buffers are leaked to stay safe: " << why.to_string();
      return;
    }
    for (size_t r = 0; r < reqs.size(); ++r) {
      Job& j = jobs[req_job[r]];
      const transfer::RequestStatus& rs = st->requests[r];
      if (rs.state == transfer::TransferState::kCompleted) {
        j.status = Status::ok();
        if (j.op == transfer::Op::kRead) scope.finish_read(static_cast<std::byte*>(reqs[r].local_addr), j.length);
        const bool shm = shm_segment[req_seg[r]];
        if (j.op == transfer::Op::kRead) {
          (shm ? counters.bytes_read_shm : counters.bytes_read_tcp) += j.length;
          if (!shm) {
            auto& by_host = counters.bytes_read_tcp_by_host;
            const bool room = by_host.size() < ClientCounters::kMaxTcpReadHosts || by_host.count(j.replica->host) != 0;
            by_host[room ? j.replica->host : std::string()] += j.length;
          }
        } else {
          (shm ? counters.bytes_written_shm : counters.bytes_written_tcp) += j.length;
        }
      } else {
        j.status = (rs.status.is_ok() ? Status(Code::kTransferFailed, transfer::state_name(rs.state)) : rs.status)
                       .with_context(std::string(transfer::op_name(j.op)) + " of replica " + j.replica->segment +
                                     " at " + j.replica->xfer_segment);
        // Forget the segment: the next use looks its descriptor up again (the node may be gone).
        if (engine->close_segment(req_seg[r]).is_ok()) shm_segment.erase(req_seg[r]);
      }
    }
    (void)engine->free_batch(*batch);
  }

  // Reads granted objects: item i into outs[i] (exactly its size), nearest replica first, falling back
  // to the next replica for those that failed; every round is one engine batch. Then checks each
  // object's lease: bytes that landed after it are reported kLeaseExpired, never as data.
  // `offsets` (empty: every read whole): item i is the range [offsets[i], offsets[i] + outs[i].size()) of its
  // object, whose part checksums (aligned to the range; batch_get checked) verify it.
  std::vector<Status> read_objects(const std::vector<std::string>& keys,
                                   const std::vector<const proto::StoreGetItem*>& items, int64_t granted_ms,
                                   const std::vector<std::span<std::byte>>& outs,
                                   const std::vector<uint64_t>& offsets = {}) {
    const auto ranged = [&](size_t i) {
      return !offsets.empty() && (offsets[i] != 0 || outs[i].size() != items[i]->size_bytes);
    };
    // The bytes read are those the object's checksum (whole) or its parts (a range) say were put.
    const auto intact = [&](size_t i) {
      if (!ranged(i)) return object_checksum(outs[i].first(items[i]->size_bytes)) == items[i]->checksum;
      const uint64_t pb = items[i]->part_bytes;
      for (uint64_t at = 0; at < outs[i].size(); at += pb) {
        const uint64_t n = std::min<uint64_t>(pb, outs[i].size() - at);
        if (object_checksum(outs[i].subspan(at, n)) != items[i]->part_checksums[(offsets[i] + at) / pb]) return false;
      }
      return true;
    };
    std::vector<Status> out(items.size(), Status(Code::kObjectNotFound, "no replica"));
    std::vector<size_t> next(items.size(), 0);
    std::vector<size_t> todo;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i] == nullptr) continue;
      if (items[i]->replicas.empty()) {
        out[i] = Status(Code::kObjectNotFound, "object '" + keys[i] + "' has no replica");
        continue;
      }
      todo.push_back(i);
    }
    while (!todo.empty()) {
      std::vector<Job> jobs;
      const int64_t start_ms = steady_ms();
      for (size_t i : todo) {
        // Replicas on a segment cooling down after a network failure are passed over.
        while (next[i] < items[i]->replicas.size() &&
               cooling_down(items[i]->replicas[next[i]].xfer_segment, start_ms)) {
          ++counters.unreachable_skips;
          ++next[i];
        }
        if (next[i] == items[i]->replicas.size()) {
          out[i] = Status(Code::kUnavailable, "every replica of '" + keys[i] +
                                                  "' is on a segment this client could not reach in the last " +
                                                  std::to_string(options.unreachable_cooldown_ms) + " ms");
          continue;
        }
        if (ranged(i)) {
          jobs.push_back(Job{
              i, &items[i]->replicas[next[i]], transfer::Op::kRead, outs[i].data(), outs[i].size(), {}, offsets[i]});
        } else {
          jobs.push_back(
              Job{i, &items[i]->replicas[next[i]], transfer::Op::kRead, outs[i].data(), items[i]->size_bytes, {}, 0});
        }
      }
      run_jobs(jobs);
      std::vector<size_t> again;
      for (Job& j : jobs) {
        const size_t i = j.item;
        if (j.status.is_ok() && !intact(i)) {
          // Bytes that differ from what was put: never returned; the master drops the replica.
          ++counters.corrupt_replicas;
          j.status = Status(Code::kObjectNotFound, "replica of '" + keys[i] + "' on " + j.replica->segment +
                                                       " failed its checksum (dropped): treated as a miss");
          MC_LOG_WARN << "client " << options.client_id << ": " << j.status.message();
          auto r = call_master(proto::StoreReportCorruptRequest{options.client_id, keys[i], j.replica->segment,
                                                                j.replica->offset_bytes});
          if (!r.is_ok())
            MC_LOG_DEBUG << "corrupt replica of '" << keys[i] << "' not reported: " << r.status().to_string();
        }
        if (j.status.is_ok()) {
          out[i] = Status::ok();
          continue;
        }
        MC_LOG_DEBUG << "replica " << j.replica->segment << " of '" << keys[i] << "' failed: " << j.status.to_string();
        ++counters.replica_fallbacks;
        const Code code = j.status.code();
        if (options.unreachable_cooldown_ms > 0 && !j.replica->xfer_segment.empty() &&
            (code == Code::kUnavailable || code == Code::kTimeout || code == Code::kTransferFailed)) {
          auto [it, fresh] = unreachable_until.try_emplace(j.replica->xfer_segment, 0);
          if (fresh || it->second <= steady_ms()) {
            ++counters.unreachable_segments;
            MC_LOG_WARN << "client " << options.client_id << ": segment " << j.replica->xfer_segment << " of "
                        << j.replica->node_id << " unreachable (" << j.status.message() << "); its replicas are passed "
                        << "over for " << options.unreachable_cooldown_ms << " ms";
          }
          it->second = steady_ms() + options.unreachable_cooldown_ms;
        }
        if (++next[i] < items[i]->replicas.size()) {
          again.push_back(i);
        } else if (j.status.code() == Code::kObjectNotFound) {
          out[i] = j.status;  // the last replica was corrupt: a miss (the caller recomputes)
        } else {
          out[i] = Status(Code::kUnavailable, "every replica of '" + keys[i] + "' failed; last: " + j.status.message());
        }
      }
      todo = std::move(again);
    }
    const int64_t now = steady_ms();
    std::vector<Job> hot;
    std::vector<size_t> hot_item;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i] == nullptr || !out[i].is_ok()) continue;
      if (now - granted_ms > items[i]->lease_ms) {
        ++counters.lease_expired;
        out[i] = Status(Code::kLeaseExpired, "read of '" + keys[i] + "' finished after its " +
                                                 std::to_string(items[i]->lease_ms) +
                                                 " ms lease; the bytes were discarded, read again");
        continue;
      }
      // A hot copy needs the whole object (batch_get reads a hot object's range whole).
      if (!items[i]->replicate_to.empty() && options.replicate_hot && !ranged(i)) {
        hot.push_back(
            Job{i, &items[i]->replicate_to.front(), transfer::Op::kWrite, outs[i].data(), items[i]->size_bytes, {}, 0});
      }
    }
    if (!hot.empty()) replicate(keys, items, hot);
    return out;
  }

  // Hot objects: copy each to the replica the master reserved, then tell the master how it went.
  void replicate(const std::vector<std::string>& keys, const std::vector<const proto::StoreGetItem*>& items,
                 std::vector<Job>& jobs) {
    run_jobs(jobs);
    for (const Job& j : jobs) {
      proto::StoreReplicaEndRequest req{options.client_id, keys[j.item], items[j.item]->replicate_put_id,
                                        j.status.is_ok()};
      auto r = call_master(req);
      if (!r.is_ok()) MC_LOG_DEBUG << "hot copy of '" << keys[j.item] << "' not recorded: " << r.status().to_string();
    }
  }

  Result<std::vector<Status>> batch_put(std::span<const PutItem> items, const WriteOptions& options, bool exists_is_ok);

  Result<proto::StoreGetReplicasReply> get_replicas(std::vector<std::string> keys, bool with_parts = false) {
    proto::StoreGetReplicasRequest req;
    req.with_parts = with_parts;
    req.client_id = options.client_id;
    req.client_host = options.host;
    req.client_domain = options.domain;
    req.keys = std::move(keys);
    MC_ASSIGN_OR_RETURN(auto reply, call_master(req));
    if (reply.items.size() != req.keys.size()) {
      return Status(Code::kMalformedMessage, "get_replicas reply from " + master->endpoint() + " has " +
                                                 std::to_string(reply.items.size()) + " items for " +
                                                 std::to_string(req.keys.size()) + " keys");
    }
    return reply;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  if (options.host.empty()) options.host = mc::report::host_name();
  if (options.client_id.empty()) {
    std::random_device rd;
    options.client_id = options.host + "-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  rpc::ClientOptions co;
  co.client_name = options.client_id;
  co.connect_timeout_ms = options.rpc_timeout_ms;
  co.default_timeout_ms = options.rpc_timeout_ms;
  MC_ASSIGN_OR_RETURN(impl->locator,
                      MasterLocator::create(MasterAddress{options.master, options.etcd, options.cluster_id}));
  MC_ASSIGN_OR_RETURN(impl->master, MasterLink::connect(impl->locator, co));
  rpc::AsyncClientOptions no;
  no.client_name = options.client_id;
  impl->nodes = std::make_unique<rpc::AsyncClient>(no);
  if (options.fast_rpc) impl->connect_fast();
  // The data path: an initiator-only transfer engine whose segment directory is the master.
  MC_ASSIGN_OR_RETURN(
      impl->directory,
      connect_segment_directory(impl->locator, MasterAddress{options.master, options.etcd, options.cluster_id},
                                options.client_id + " directory", options.rpc_timeout_ms));
  transfer::EngineOptions eo;
  eo.transports = options.transports;
  eo.directory = impl->directory;
  eo.request_timeout_ms = std::max(1, options.transfer_timeout_ms);
  eo.slice_timeout_ms = std::max(1, options.node_timeout_ms);
  eo.connect_timeout_ms = std::max(1, std::min(options.node_timeout_ms, 1000));
  MC_ASSIGN_OR_RETURN(impl->engine, transfer::TransferEngine::create(eo));
  if (options.heartbeat_ms > 0) {
    Impl* raw = impl.get();
    impl->heartbeat_thread = std::thread([raw] { raw->heartbeat_loop(); });
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::client_id() const { return impl_->options.client_id; }

Status Client::register_buffer(std::span<std::byte> buffer) {
  if (buffer.empty()) return Status(Code::kInvalidArgument, "register_buffer: empty buffer");
  return impl_->register_range(buffer.data(), buffer.size());
}

Status Client::unregister_buffer(void* data) { return impl_->unregister_range(data); }
const ClientCounters& Client::counters() const { return impl_->counters; }

Status Client::put(const std::string& key, std::span<const std::byte> data, const WriteOptions& options) {
  PutItem item{key, data};
  MC_ASSIGN_OR_RETURN(std::vector<Status> st, impl_->batch_put(std::span<const PutItem>(&item, 1), options, false));
  return st.front();
}

Result<std::vector<Status>> Client::batch_put(std::span<const PutItem> items, const WriteOptions& options) {
  return impl_->batch_put(items, options, true);
}

Result<std::vector<Status>> Client::Impl::batch_put(std::span<const PutItem> items, const WriteOptions& options,
                                                    bool exists_is_ok) {
  Impl& m = *this;
  proto::StorePutStartRequest start;
  start.client_id = m.options.client_id;
  start.client_host = m.options.host;
  start.replicas = m.options.replicas;
  start.preferred_segment = m.options.preferred_segment;
  start.overwrite = options.overwrite;
  start.pin = options.pin;
  start.pin_ttl_ms = options.pin_ttl_ms;
  for (const PutItem& it : items) {
    start.keys.push_back(it.key);
    start.sizes_bytes.push_back(it.data.size());
  }
  const int64_t t_start_us = steady_us();
  MC_ASSIGN_OR_RETURN(auto grants, m.call_master(start));
  if (grants.items.size() != items.size()) {
    return Status(Code::kMalformedMessage,
                  "put_start reply from " + m.master->endpoint() + " has the wrong item count");
  }
  // Items refused with kUnavailable wait for space being freed (demotion to SSD): retry them alone.
  const uint16_t kRetry = static_cast<uint16_t>(Code::kUnavailable);
  for (int64_t deadline = steady_ms() + m.options.put_retry_ms, pause_ms = 5;;
       pause_ms = std::min<int64_t>(pause_ms * 2, 100)) {
    proto::StorePutStartRequest again = start;
    again.keys.clear();
    again.sizes_bytes.clear();
    std::vector<size_t> idx;
    for (size_t i = 0; i < items.size(); ++i) {
      if (grants.items[i].code != kRetry) continue;
      again.keys.push_back(start.keys[i]);
      again.sizes_bytes.push_back(start.sizes_bytes[i]);
      idx.push_back(i);
    }
    if (idx.empty() || steady_ms() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    MC_ASSIGN_OR_RETURN(auto more, m.call_master(again));
    for (size_t j = 0; j < idx.size() && j < more.items.size(); ++j) grants.items[idx[j]] = std::move(more.items[j]);
  }
  std::vector<Status> out(items.size());
  proto::StorePutEndRequest end;
  proto::StorePutRevokeRequest revoke;
  end.client_id = revoke.client_id = m.options.client_id;
  std::vector<size_t> end_index;
  // Every replica of every granted item: one engine batch.
  std::vector<Job> jobs;
  std::vector<bool> granted(items.size(), false);
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& g = grants.items[i];
    if (g.code == static_cast<uint16_t>(Code::kAlreadyExists) && exists_is_ok) {
      out[i] = Status::ok();
      continue;
    }
    if (g.code != 0) {
      out[i] = item_status(g.code, g.message);
      continue;
    }
    granted[i] = true;
    out[i] = Status::ok();
    auto* data = const_cast<std::byte*>(items[i].data.data());
    for (const auto& r : g.replicas) {
      if (r.size_bytes != items[i].data.size()) {
        out[i] = Status(Code::kInternal, "replica on " + r.segment + " is " + std::to_string(r.size_bytes) +
                                             " bytes, data " + std::to_string(items[i].data.size()));
        continue;
      }
      jobs.push_back(Job{i, &r, transfer::Op::kWrite, data, items[i].data.size(), {}, 0});
    }
  }
  const int64_t t_granted_us = steady_us();
  m.run_jobs(jobs);
  const int64_t t_written_us = steady_us();
  for (const Job& j : jobs) {
    if (!j.status.is_ok() && out[j.item].is_ok()) out[j.item] = j.status;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!granted[i]) continue;
    const auto& g = grants.items[i];
    if (out[i].is_ok()) {
      end.keys.push_back(items[i].key);
      end.put_ids.push_back(g.put_id);
      end.checksums.push_back(object_checksum(items[i].data));
      std::vector<uint64_t> parts = part_checksums(items[i].data, options.part_bytes);
      if (!parts_fit(items[i].data.size(), options.part_bytes, parts.size())) parts.clear();
      end.part_bytes.push_back(parts.empty() ? 0 : options.part_bytes);
      end.part_checksums.push_back(std::move(parts));
      end_index.push_back(i);
    } else {
      revoke.keys.push_back(items[i].key);
      revoke.put_ids.push_back(g.put_id);
    }
  }
  if (!revoke.keys.empty()) (void)m.call_master(revoke);
  bool behind = false;
  if (!end.keys.empty() && !options.wait_commit) {
    Result<bool> sent = m.commit_behind(end);
    if (!sent.is_ok()) {
      for (size_t i : end_index) out[i] = sent.status();
    }
    behind = !sent.is_ok() || *sent;
  }
  if (!end.keys.empty() && !behind) {
    MC_ASSIGN_OR_RETURN(auto ends, m.call_master(end));
    for (size_t j = 0; j < end_index.size() && j < ends.codes.size(); ++j) {
      out[end_index[j]] = item_status(ends.codes[j], j < ends.messages.size() ? ends.messages[j] : "");
    }
  }
  MC_LOG_DEBUG << "batch_put of " << items.size() << " objects: put_start " << (t_granted_us - t_start_us) << " us, "
               << jobs.size() << " replica writes " << (t_written_us - t_granted_us) << " us, put_end "
               << (steady_us() - t_written_us) << " us";
  return out;
}

Result<uint64_t> Client::get(const std::string& key, std::span<std::byte> buffer) {
  int64_t granted = steady_ms();
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas({key}));
  const auto& item = reply.items.front();
  MC_RETURN_IF_ERROR(item_status(item.code, item.message));
  if (item.size_bytes > buffer.size()) {
    return Status(Code::kInvalidArgument, "object '" + key + "' is " + std::to_string(item.size_bytes) +
                                              " bytes; the buffer holds " + std::to_string(buffer.size()));
  }
  std::vector<Status> st = impl_->read_objects({key}, {&item}, granted, {buffer.first(item.size_bytes)});
  MC_RETURN_IF_ERROR(st.front());
  return item.size_bytes;
}

Result<std::vector<std::byte>> Client::get(const std::string& key) {
  int64_t granted = steady_ms();
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas({key}));
  const auto& item = reply.items.front();
  MC_RETURN_IF_ERROR(item_status(item.code, item.message));
  std::vector<std::byte> data(item.size_bytes);
  std::vector<Status> st = impl_->read_objects({key}, {&item}, granted, {std::span<std::byte>(data)});
  MC_RETURN_IF_ERROR(st.front());
  return data;
}

Result<uint64_t> Client::size_of(const std::string& key) {
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas({key}));
  const auto& item = reply.items.front();
  MC_RETURN_IF_ERROR(item_status(item.code, item.message));
  return item.size_bytes;
}

Result<std::vector<Status>> Client::batch_get(std::span<const GetItem> items) {
  std::vector<std::string> keys;
  std::vector<Status> out(items.size());
  bool any_range = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const GetItem& it = items[i];
    keys.push_back(it.key);
    const uint64_t object = it.object_bytes != 0 ? it.object_bytes : it.buffer.size();
    if (it.offset_bytes > object || it.buffer.size() > object - it.offset_bytes) {
      out[i] = Status(Code::kInvalidArgument, "range [" + std::to_string(it.offset_bytes) + ", +" +
                                                  std::to_string(it.buffer.size()) + ") of object '" + it.key +
                                                  "' lies past its " + std::to_string(object) + " bytes");
    }
    any_range = any_range || it.offset_bytes != 0 || object != it.buffer.size();
  }
  int64_t granted = steady_ms();
  MC_ASSIGN_OR_RETURN(auto reply, impl_->get_replicas(std::move(keys), any_range));
  // Objects to read (one engine batch per round, all of them in the first); misses are never read. A range the
  // object's parts cannot check is read whole into `staged` and copied out after.
  std::vector<std::string> read_keys;
  std::vector<const proto::StoreGetItem*> read_items;
  std::vector<std::span<std::byte>> read_bufs;
  std::vector<uint64_t> read_offsets;
  std::vector<size_t> read_index;
  std::vector<std::vector<std::byte>> staged(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!out[i].is_ok()) continue;
    const auto& item = reply.items[i];
    if (item.code != 0) {
      out[i] = item_status(item.code, item.message);
      continue;
    }
    const GetItem& want = items[i];
    const uint64_t object = want.object_bytes != 0 ? want.object_bytes : want.buffer.size();
    if (item.size_bytes != object) {
      out[i] = Status(Code::kObjectNotFound, "object '" + want.key + "' is " + std::to_string(item.size_bytes) +
                                                 " bytes, expected " + std::to_string(object) + ": treated as a miss");
      continue;
    }
    const bool whole = want.offset_bytes == 0 && want.buffer.size() == object;
    const uint64_t pb = item.part_bytes, end = want.offset_bytes + want.buffer.size();
    // A hot object's copy (replicate_to) needs the whole object: such a range is read whole too, and copied.
    const bool checkable = !whole && !want.buffer.empty() && item.replicate_to.empty() &&
                           parts_fit(object, pb, item.part_checksums.size()) && want.offset_bytes % pb == 0 &&
                           (end % pb == 0 || end == object);
    read_keys.push_back(want.key);
    read_items.push_back(&item);
    read_index.push_back(i);
    if (whole || checkable) {
      read_bufs.push_back(want.buffer);
      read_offsets.push_back(want.offset_bytes);
    } else {
      staged[i].resize(object);
      read_bufs.push_back(std::span<std::byte>(staged[i]));
      read_offsets.push_back(0);
    }
  }
  std::vector<Status> got = impl_->read_objects(read_keys, read_items, granted, read_bufs, read_offsets);
  for (size_t k = 0; k < read_index.size(); ++k) {
    const size_t i = read_index[k];
    if (got[k].is_ok() && !staged[i].empty()) {
      std::memcpy(items[i].buffer.data(), staged[i].data() + items[i].offset_bytes, items[i].buffer.size());
    }
    out[i] = std::move(got[k]);
  }
  return out;
}

Status Client::flush(std::vector<CommitFailure>* failures) {
  Impl& m = *impl_;
  const bool drained = m.drain_commits(steady_ms() + m.options.rpc_timeout_ms);
  if (!drained) {
    return Status(Code::kTimeout, std::to_string(m.pending_commits.size()) + " write-behind commit(s) to " +
                                      m.master->endpoint() + " unanswered after " +
                                      std::to_string(m.options.rpc_timeout_ms) +
                                      " ms (is the master overloaded?); flush again");
  }
  std::vector<CommitFailure> failed = std::move(m.commit_failures);
  m.commit_failures.clear();
  const uint64_t total = failed.size() + m.commit_failures_unlisted;
  m.commit_failures_unlisted = 0;
  Status s = Status::ok();
  if (!failed.empty()) {
    s = Status(failed.front().status.code(), std::to_string(total) + " write-behind commit(s) failed; first: '" +
                                                 failed.front().key + "': " + failed.front().status.message());
  }
  if (failures)
    failures->insert(failures->end(), std::make_move_iterator(failed.begin()), std::make_move_iterator(failed.end()));
  return s;
}

size_t Client::commits_pending() const {
  size_t n = 0;
  for (const auto& pc : impl_->pending_commits) n += pc.keys.size();
  return n;
}

Result<std::vector<bool>> Client::exists(const std::vector<std::string>& keys) {
  proto::StoreExistsRequest req{keys};
  MC_ASSIGN_OR_RETURN(auto reply, impl_->call_master(req));
  return reply.present;
}

Result<uint64_t> Client::match_prefix(const std::vector<std::string>& keys) {
  proto::StoreMatchPrefixRequest req{keys};
  MC_ASSIGN_OR_RETURN(auto reply, impl_->call_master(req));
  return reply.matched_blocks;
}

Status Client::remove(const std::string& key) {
  proto::StoreRemoveRequest req{{key}};
  MC_ASSIGN_OR_RETURN(auto reply, impl_->call_master(req));
  if (reply.codes.empty()) return Status(Code::kMalformedMessage, "remove reply without a result");
  return item_status(reply.codes[0], reply.messages.empty() ? "" : reply.messages[0]);
}

namespace {

// The per-key results of a batch reply without payload, or kMalformedMessage when it does not match `keys`.
Result<std::vector<Status>> item_statuses(const proto::StoreItemsReply& reply, size_t keys, const std::string& what) {
  if (reply.codes.size() != keys) {
    return Status(Code::kMalformedMessage, what + " reply has " + std::to_string(reply.codes.size()) + " results for " +
                                               std::to_string(keys) + " keys");
  }
  std::vector<Status> out;
  for (size_t i = 0; i < keys; ++i)
    out.push_back(item_status(reply.codes[i], i < reply.messages.size() ? reply.messages[i] : ""));
  return out;
}

}  // namespace

Result<std::vector<Status>> Client::pin(const std::vector<std::string>& keys, int64_t ttl_ms) {
  MC_ASSIGN_OR_RETURN(auto reply, impl_->call_master(proto::StorePinRequest{keys, ttl_ms}));
  return item_statuses(reply, keys.size(), "pin");
}

Result<std::vector<Status>> Client::unpin(const std::vector<std::string>& keys) {
  MC_ASSIGN_OR_RETURN(auto reply, impl_->call_master(proto::StoreUnpinRequest{keys}));
  return item_statuses(reply, keys.size(), "unpin");
}

Result<proto::StoreLsReply> Client::ls(const std::string& prefix, uint32_t limit) {
  proto::StoreLsReply all;
  proto::StoreLsRequest req{prefix, 0, ""};
  while (all.objects.size() < limit) {
    req.limit = static_cast<uint32_t>(std::min<size_t>(limit - all.objects.size(), proto::kStoreLsPageObjects));
    MC_ASSIGN_OR_RETURN(proto::StoreLsReply page, impl_->call_master(req));
    all.truncated = page.truncated;
    if (page.objects.empty()) break;
    req.start_after = page.objects.back().key;
    for (auto& o : page.objects) all.objects.push_back(std::move(o));
    if (!page.truncated) break;
  }
  return all;
}

Status Client::quota_set(const std::string& tenant, const std::string& limits) {
  return impl_->call_master(proto::StoreQuotaSetRequest{tenant, limits}).status();
}

Result<proto::StoreStatReply> Client::stat() {
  proto::StoreStatRequest req;
  return impl_->call_master(req);
}

}  // namespace mc::store
