#include "mc/infer/decode_worker.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <unordered_set>

#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/infer/sampler.hpp"
#include "mc/infer/worker_drain.hpp"
#include "mc/net/grant.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/worker.hpp"

namespace mc::infer {

struct DecodeWorker::Reservation {
  uint64_t id = 0;
  std::string request_id;         // the Conductor's id (unique among live requests)
  std::string client_request_id;  // the id as the client named it: its token events carry this one
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t committed_blocks = 0;  // full-length blocks counted in committed_blocks_
  std::string client_endpoint;   // rpc::keyed_endpoint of the client's server (with --auth-dir: and its own key)
  std::vector<int32_t> blocks;   // prompt blocks, allocated
  std::unordered_set<int32_t> block_set;   // the same, for the grant check of each WRITE (kv_grant_scope)
  std::vector<std::vector<bool>> arrived;  // [layer][block index]
  int64_t layers_received = 0;
  int64_t deadline_ns = 0;
  Status poisoned;   // a malformed KV notification for this reservation: its commit fails with this
  LoraAdapter lora;  // the request's adapter
  RequestKeyScope scope;
  std::string kv_namespace_digest;  // the request's namespace (base with its scope): the KV must be of it
  proto::SamplingParams sampling;   // how the tokens after the first are chosen
};

struct DecodeWorker::Expired {
  std::vector<int32_t> blocks;
  int64_t committed_blocks = 0;
  int64_t release_ns = 0;
};

struct DecodeWorker::Sequence {
  uint64_t reservation_id = 0;
  std::string request_id;
  std::string client_request_id;
  std::string client_endpoint;  // keyed (Reservation::client_endpoint)
  std::vector<int32_t> blocks;
  int64_t committed_blocks = 0;
  int64_t position = 0;     // tokens with KV in the cache
  uint32_t last_token = 0;  // newest token, not yet in the KV cache
  int64_t emitted = 0;      // tokens sent to the client
  int64_t output_tokens = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;  // when the newest token was sent (TBT: the gaps between them)
  proto::RequestLedger ledger;
  LoraAdapter lora;
  bool cancelled = false;
  Status cancel_reason;
  proto::SamplingParams sampling;
  TokenCounts counts;                               // tokens generated so far, with penalties (sampling.needs_counts())
  std::vector<proto::TokenLogprob> first_logprobs;  // the first token's, from the commit (sampling.logprobs >= 0)
};

struct DecodeWorker::Outgoing {
  std::string endpoint;                                                          // keyed (Reservation::client_endpoint)
  std::variant<proto::TokenEvent, proto::RequestDone, proto::RequestError> msg;  // carries the client's id
  std::string request_id;  // the Conductor's id: the job report's (never the client's, which another may share)
};

namespace {

// The idle step thread's longest wait (DecodeWorker::wait_for_work): reservations expire at most this late.
constexpr int64_t kIdleStepMs = 20;

// Pipelined: a message is sent at once and its reply collected by a later send (or the destructor), so the
// decode step never waits on a client. Delivery is at least once and in order per client (the client drops a token
// event whose index it already has): a message whose reply does not come within the timeout (a client cut off by
// the network, stopped, or dead) stalls its client. A stalled client's messages, the failed ones and every later
// one, wait in its backlog (in send order) instead of being dropped; once a second (kRetryMs) the oldest is sent
// again as a probe, and when the probe is answered the backlog is sent in order. So a partition that heals loses no
// token and no terminal event (docs/RELIABILITY.md "Across hosts"). A client stalled for kGiveUpMs, or whose
// backlog reaches kMaxBacklogPerClient, is given up: its backlog is dropped (counted, logged once); the Conductor
// still holds the requests' ends. At most kMaxInFlightPerClient messages wait for one client's replies.
class RpcTokenSink final : public TokenSink {
 public:
  static constexpr int64_t kRetryMs = 1'000;
  static constexpr int64_t kGiveUpMs = 60'000;
  static constexpr size_t kMaxBacklogPerClient = 1 << 16;
  static constexpr int64_t kMaxInFlightPerClient = 4096;

  explicit RpcTokenSink(int timeout_ms)
      : client_(
            rpc::AsyncClientOptions{.client_name = "mc-decode", .max_in_flight_per_endpoint = kMaxInFlightPerClient}),
        timeout_ms_(timeout_ms) {}
  ~RpcTokenSink() override {
    // Deliver what is in flight or waiting (the last done events) before the socket closes, within one timeout.
    const int64_t end_ns = RealClock::instance().now_ns() + static_cast<int64_t>(timeout_ms_) * 1'000'000;
    while ((client_.in_flight() > 0 || backlogged()) && RealClock::instance().now_ns() < end_ns) {
      client_.poll(10);
      pump();
    }
  }
  RpcTokenSink(const RpcTokenSink&) = delete;
  RpcTokenSink& operator=(const RpcTokenSink&) = delete;

  Status token(const std::string& endpoint, const proto::TokenEvent& e) override { return send(endpoint, e); }
  Status done(const std::string& endpoint, const proto::RequestDone& d) override { return send(endpoint, d); }
  Status fail(const std::string& endpoint, const proto::RequestError& e) override { return send(endpoint, e); }
  void poll() override {
    client_.poll(0);
    pump();
  }

 private:
  using Msg = std::variant<proto::TokenEvent, proto::RequestDone, proto::RequestError>;
  struct Client {
    uint64_t next_seq = 0;
    std::map<uint64_t, Msg> backlog;  // seq -> message not yet answered, while stalled (oldest first)
    bool stalled = false;
    bool probing = false;
    bool answered = false;  // a probe was answered: unstall once nothing else is in flight
    int64_t stalled_since_ms = 0;
    int64_t next_probe_ms = 0;
  };

  static int64_t now_ms() { return RealClock::instance().now_ns() / 1'000'000; }
  bool backlogged() const {
    return std::any_of(clients_.begin(), clients_.end(), [](const auto& c) { return !c.second.backlog.empty(); });
  }

  Status send(const std::string& endpoint, Msg msg) {
    client_.poll(0);
    Client& c = clients_[endpoint];
    const uint64_t seq = c.next_seq++;
    if (c.stalled) {
      if (c.backlog.size() >= kMaxBacklogPerClient) {
        give_up(endpoint, c, "its backlog reached " + std::to_string(kMaxBacklogPerClient) + " messages");
        return Status(Code::kUnavailable, "client " + endpoint + " given up: its backlog is full");
      }
      c.backlog.emplace(seq, std::move(msg));
      pump();
      return Status::ok();
    }
    transmit(endpoint, seq, std::move(msg), /*probe=*/false);
    return Status::ok();
  }

  void transmit(const std::string& endpoint, uint64_t seq, Msg msg, bool probe) {
    auto on_reply = [this, endpoint, seq, probe, msg](const Status& st) {
      auto it = clients_.find(endpoint);
      if (it == clients_.end()) return;
      Client& c = it->second;
      if (probe) c.probing = false;
      if (st.is_ok()) {
        // Answered again: once the messages still in flight to it have ended (answered, or failed back into the
        // backlog), pump() sends the backlog in order.
        if (probe && c.stalled) c.answered = true;
        return;
      }
      // kResourceExhausted is this side's limit of calls in flight to the client (a client that stopped answering
      // fills it before its first call times out): the message waits like the ones that timed out, never dropped.
      if (st.code() != Code::kTimeout && st.code() != Code::kUnavailable && st.code() != Code::kResourceExhausted) {
        MC_LOG_WARN << "decode: client " << endpoint << " refused a message: " << st.to_string();
        return;
      }
      if (!c.stalled) {
        c.stalled = true;
        c.stalled_since_ms = now_ms();
        MC_LOG_WARN << "decode: client " << endpoint << " did not answer (" << st.to_string()
                    << "); its messages wait and are sent again once it answers";
      }
      c.next_probe_ms = now_ms() + kRetryMs;
      c.backlog.emplace(seq, msg);  // keeps its place in the order
    };
    std::visit(
        [&](auto& m) {
          using T = std::decay_t<decltype(m)>;
          client_.call<T>(endpoint, m, timeout_ms_,
                          [on_reply](Result<typename T::Reply> r) { on_reply(r.is_ok() ? Status::ok() : r.status()); });
        },
        msg);
  }

  // Sends a stalled client's backlog in order (it answered a probe); a later failure stalls it again.
  void flush(const std::string& endpoint, Client& c) {
    std::map<uint64_t, Msg> out;
    out.swap(c.backlog);
    for (auto& [seq, m] : out) transmit(endpoint, seq, std::move(m), /*probe=*/false);
  }

  // Probes stalled clients whose retry time came, gives up on those stalled too long, forgets healthy idle ones.
  void pump() {
    const int64_t now = now_ms();
    for (auto it = clients_.begin(); it != clients_.end();) {
      const std::string& endpoint = it->first;
      Client& c = it->second;
      if (!c.stalled) {
        if (c.backlog.empty() && client_.in_flight(endpoint) == 0 && clients_.size() > 1024) {
          it = clients_.erase(it);
          continue;
        }
        ++it;
        continue;
      }
      if (c.answered && client_.in_flight(endpoint) == 0) {
        c.stalled = c.answered = false;
        MC_LOG_INFO << "decode: client " << endpoint << " answers again; sending its " << c.backlog.size()
                    << " waiting message(s)";
        flush(endpoint, c);
      } else if (now - c.stalled_since_ms >= kGiveUpMs) {
        give_up(endpoint, c, "it did not answer for " + std::to_string(kGiveUpMs) + " ms");
      } else if (!c.answered && !c.probing && now >= c.next_probe_ms && !c.backlog.empty()) {
        c.probing = true;
        const auto first = c.backlog.begin();
        transmit(endpoint, first->first, first->second, /*probe=*/true);
        c.backlog.erase(first);  // back in on failure (on_reply), at its place
      }
      ++it;
    }
  }

  void give_up(const std::string& endpoint, Client& c, const std::string& why) {
    dropped_ += c.backlog.size();
    MC_LOG_WARN << "decode: client " << endpoint << " given up (" << why << "): " << c.backlog.size()
                << " message(s) dropped (" << dropped_ << " in all)";
    c.backlog.clear();
    c.stalled = c.probing = c.answered = false;
  }

  rpc::AsyncClient client_;
  int timeout_ms_;
  std::map<std::string, Client> clients_;  // endpoint -> its delivery state
  uint64_t dropped_ = 0;
};

}  // namespace

std::unique_ptr<TokenSink> make_rpc_token_sink(int timeout_ms) { return std::make_unique<RpcTokenSink>(timeout_ms); }

Result<std::unique_ptr<DecodeWorker>> DecodeWorker::create(DecodeWorkerOptions options,
                                                           std::unique_ptr<Backend> backend,
                                                           std::unique_ptr<TokenSink> sink, const Clock* clock) {
  if (options.block_tokens <= 0 || options.kv_blocks <= 0 || options.max_batch_size <= 0 ||
      options.reservation_ttl_ms <= 0) {
    return error(Code::kInvalidArgument,
                 "decode worker: --block-tokens, --kv-blocks, --max-batch and --reservation-ttl-ms must be > 0");
  }
  if (options.reservation_ttl_ms > options.max_reservation_ttl_ms) {
    return error(Code::kInvalidArgument,
                 "decode worker: --reservation-ttl-ms " + std::to_string(options.reservation_ttl_ms) +
                     " exceeds --max-reservation-ttl-ms " + std::to_string(options.max_reservation_ttl_ms));
  }
  if (!backend || !sink) return error(Code::kInvalidArgument, "decode worker: backend and token sink are required");
  MC_ASSIGN_OR_RETURN(auto kv,
                      KvBuffer::create(backend->kv_layout(options.block_tokens), options.kv_blocks, KvMemory::kShared));
  return std::unique_ptr<DecodeWorker>(
      new DecodeWorker(options, std::move(backend), std::move(sink), std::move(kv), clock));
}

DecodeWorker::DecodeWorker(DecodeWorkerOptions options, std::unique_ptr<Backend> backend,
                           std::unique_ptr<TokenSink> sink, std::unique_ptr<KvBuffer> kv, const Clock* clock)
    : options_(options), backend_(std::move(backend)), sink_(std::move(sink)), kv_(std::move(kv)), clock_(clock) {
  ns_ = kv_namespace(*backend_, options_.block_tokens, options_.weight_seed);
  metrics_.gauge("mc_decode_kv_blocks_total", "KV blocks of the buffer").set(static_cast<double>(kv_->num_blocks()));
}

DecodeWorker::~DecodeWorker() { engine_.reset(); }

Status DecodeWorker::publish_kv_segment(transfer::EngineOptions options) {
  if (engine_) return error(Code::kFailedPrecondition, "decode: KV segment already published as " + kv_segment_);
  if (options.listen.empty()) {
    return error(Code::kInvalidArgument, "decode: publishing the KV segment needs a listen endpoint (--kv-listen)");
  }
  kv_grant_key_ = options.grant_key;
  if (!kv_grant_key_.empty()) {
    // A grant names its reservation by id: start this process's ids at a random point, so a grant issued before a
    // restart on the same port never names a reservation of this life.
    std::random_device rd;
    next_reservation_ = ((static_cast<uint64_t>(rd()) << 16) ^ rd()) + 1;
    options.grant_scope = [this](const auth::Grant& g, transfer::Op op, uint64_t offset, uint64_t length) {
      return kv_grant_scope(g, op, offset, length);
    };
  }
  MC_ASSIGN_OR_RETURN(auto engine, transfer::TransferEngine::create(std::move(options)));
  auto region = engine->register_memory(kv_->data(), static_cast<uint64_t>(kv_->size_bytes()));
  if (!region.is_ok()) return region.status().with_context("decode: registering the KV buffer");
  kv_segment_base_ = region->segment_offset;
  kv_segment_ = engine->segment_name();
  engine->set_notification_handler([this](const transfer::Notification& n) { on_kv_notification(n); });
  engine_ = std::move(engine);
  metrics_.gauge("mc_decode_kv_segment_published", "1 when the KV buffer is served through the transfer engine").set(1);
  return Status::ok();
}

std::string DecodeWorker::kv_segment() const { return kv_segment_; }

Status DecodeWorker::kv_grant_scope(const auth::Grant& grant, transfer::Op op, uint64_t offset, uint64_t length) {
  if (op != transfer::Op::kWrite) return error(Code::kPermissionDenied, "decode KV is written, never read, by peers");
  const auto block_bytes = static_cast<uint64_t>(kv_->layout().block_bytes());
  if (offset < kv_segment_base_ || block_bytes == 0) return error(Code::kPermissionDenied, "not in the KV buffer");
  const uint64_t rel = offset - kv_segment_base_;
  const uint64_t block = rel / block_bytes;
  if (length > (block + 1) * block_bytes - rel) {
    return error(Code::kPermissionDenied, "the range crosses the end of block " + std::to_string(block));
  }
  std::lock_guard lock(mu_);
  auto it = reservations_.find(grant.id);
  if (it == reservations_.end()) {
    metrics_.counter("mc_decode_kv_grant_refused_total", "KV writes refused: reservation gone or block not its own")
        .inc();
    return error(Code::kPermissionDenied, "reservation " + std::to_string(grant.id) +
                                              " is no longer live (released, expired, aborted or committed)");
  }
  if (it->second->block_set.count(static_cast<int32_t>(block)) == 0) {
    metrics_.counter("mc_decode_kv_grant_refused_total", "KV writes refused: reservation gone or block not its own")
        .inc();
    return error(Code::kPermissionDenied,
                 "block " + std::to_string(block) + " is not reservation " + std::to_string(grant.id) + "'s");
  }
  return Status::ok();
}

void DecodeWorker::set_job_reporter(std::function<void(proto::ConductorJobReportRequest)> reporter) {
  reporter_ = std::move(reporter);
}

void DecodeWorker::on_kv_notification(const transfer::Notification& note) {
  metrics_.counter("mc_decode_kv_notifications_total", "layer-arrival notifications from the transfer engine").inc();
  auto reject = [&](const std::string& why) {
    metrics_.counter("mc_decode_kv_notifications_rejected_total", "notifications naming no valid reserved range").inc();
    // A peer chooses tag and from: at most 128 bytes of each reach the log.
    MC_LOG_WARN << "decode: KV notification '" << note.tag.substr(0, 128) << "' from "
                << (note.from.empty() ? "?" : note.from.substr(0, 128)) << " (offset " << note.segment_offset << ", "
                << note.length << " B) ignored: " << why;
  };
  const std::optional<proto::KvLayerTag> tag =
      note.op == transfer::Op::kWrite ? proto::KvLayerTag::decode(note.tag) : std::nullopt;
  if (!tag) {
    reject("not a KV write tag kv/<reservation>/<layer>/<first>-<end>");
    return;
  }
  const uint64_t id = tag->reservation_id;
  const int64_t layer = tag->layer, first = tag->first_block, end = tag->end_block;
  if (!kv_grant_key_.empty() && note.grant_id != id) {
    // The engine checked that the grant covers the written range; the tag must also name the grant's reservation,
    // or a holder of one reservation's grant could mark (and poison) another's layers.
    reject("the tag names reservation " + std::to_string(id) + " but the grant is reservation " +
           std::to_string(note.grant_id) + "'s");
    return;
  }
  std::lock_guard lock(mu_);
  auto it = reservations_.find(id);
  if (it == reservations_.end()) {
    reject(expired_.count(id) > 0 ? "reservation expired" : "no such reservation (released, aborted or committed)");
    return;
  }
  Reservation& r = *it->second;
  const KvLayout& layout = kv_->layout();
  const int64_t nblocks = static_cast<int64_t>(r.blocks.size());
  Status bad;
  if (layer < 0 || layer >= layout.num_layers || first < 0 || first >= end || end > nblocks) {
    bad = error(Code::kOutOfRange, "KV notification '" + note.tag + "': layer or blocks outside the reservation (" +
                                       std::to_string(layout.num_layers) + " layers, " + std::to_string(nblocks) +
                                       " prompt blocks)");
  } else {
    const int32_t last_block = r.blocks[static_cast<size_t>(end - 1)];
    const uint64_t want_offset = kv_segment_base_ + static_cast<uint64_t>(kv_->layer_block_offset(last_block, layer));
    if (note.segment_offset != want_offset || note.length != static_cast<uint64_t>(layout.layer_block_bytes())) {
      bad = error(Code::kDataLoss, "KV notification '" + note.tag + "': wrote " + std::to_string(note.length) +
                                       " B at segment offset " + std::to_string(note.segment_offset) + ", expected " +
                                       std::to_string(layout.layer_block_bytes()) + " B at " +
                                       std::to_string(want_offset) +
                                       " (prefill and decode disagree on the KV layout: model, --block-size, "
                                       "--kv-bytes-per-token)");
    }
  }
  if (!bad.is_ok()) {
    if (r.poisoned.is_ok()) {
      r.poisoned = error(Code::kDataLoss, "kv_commit '" + r.request_id + "': " + bad.message() + "; not generating");
    }
    reject(bad.message());
    return;
  }
  auto& arrived = r.arrived[static_cast<size_t>(layer)];
  const bool layer_was_new = std::none_of(arrived.begin(), arrived.end(), [](bool b) { return b; });
  for (int64_t b = first; b < end; ++b) arrived[static_cast<size_t>(b)] = true;
  if (layer_was_new) ++r.layers_received;
  const auto bytes = static_cast<uint64_t>((end - first) * layout.layer_block_bytes());
  metrics_.counter("mc_decode_kv_engine_bytes_total", "KV bytes received through the transfer engine").inc(bytes);
  metrics_.counter("mc_decode_kv_received_bytes_total", "KV bytes received from prefill").inc(bytes);
}

bool DecodeWorker::release_expired_locked(uint64_t id) {
  auto it = expired_.find(id);
  if (it == expired_.end()) return false;
  kv_->free(it->second.blocks);
  committed_blocks_ -= it->second.committed_blocks;
  expired_.erase(it);
  return true;
}

void DecodeWorker::refuse_reservations(const std::string& instance_id) {
  std::lock_guard lock(mu_);
  refusing_as_ = instance_id.empty() ? "mc-decode" : instance_id;
}

int64_t DecodeWorker::end_all(const Status& why) {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : reservations_) ids.push_back(id);
  // Blocks held as for an expired reservation: a prefill may still be writing into them.
  for (uint64_t id : ids) drop_reservation_locked(id, why, /*tell_client=*/true, /*hold_blocks=*/true);
  int64_t n = static_cast<int64_t>(ids.size());
  auto stop = [&](Sequence& s) {
    if (s.cancelled) return;
    s.cancelled = true;
    s.cancel_reason = why;
    ++n;
  };
  for (auto& s : running_) stop(*s);
  for (auto& s : joining_) stop(*s);
  return n;
}

Result<proto::DecodeReserveReply> DecodeWorker::reserve(const proto::DecodeReserveRequest& r) {
  const auto& m = backend_->model();
  if (r.input_length_tokens <= 0 || r.output_length_tokens <= 0) {
    metrics_.counter("mc_decode_reserve_invalid_total", "reservations refused for bad lengths").inc();
    return error(Code::kInvalidArgument, "decode_reserve '" + r.request_id + "': input_length_tokens (" +
                                             std::to_string(r.input_length_tokens) + ") and output_length_tokens (" +
                                             std::to_string(r.output_length_tokens) + ") must be > 0");
  }
  if (r.input_length_tokens > m.max_context_tokens ||
      r.output_length_tokens > m.max_context_tokens - r.input_length_tokens) {
    metrics_.counter("mc_decode_reserve_invalid_total", "reservations refused for bad lengths").inc();
    return error(Code::kInvalidArgument, "decode_reserve '" + r.request_id +
                                             "': input too long: " + std::to_string(r.input_length_tokens) + " + " +
                                             std::to_string(r.output_length_tokens) + " tokens > max context " +
                                             std::to_string(m.max_context_tokens) + " of model " + m.name);
  }
  if (r.client_endpoint.empty()) {
    return error(Code::kInvalidArgument, "decode_reserve '" + r.request_id + "': client_endpoint is empty");
  }
  {
    std::lock_guard lock(mu_);
    if (!refusing_as_.empty()) {
      metrics_.counter("mc_decode_reserve_refused_draining_total", "reservations refused while draining").inc();
      return error(Code::kUnavailable, "decode_reserve '" + r.request_id + "': " + refusing_as_ +
                                           " is draining (SIGTERM): it takes no new requests; reserve elsewhere");
    }
  }
  // A client-supplied duration is bounded (issue 17 item 5): an endless reservation would hold KV forever.
  if (r.ttl_ms < 0 || r.ttl_ms > options_.max_reservation_ttl_ms) {
    metrics_.counter("mc_decode_reserve_invalid_total", "reservations refused for bad lengths").inc();
    return error(Code::kInvalidArgument, "decode_reserve '" + r.request_id + "': ttl_ms " + std::to_string(r.ttl_ms) +
                                             " is outside [0, " + std::to_string(options_.max_reservation_ttl_ms) +
                                             "] ms (--max-reservation-ttl-ms; 0: the worker's --reservation-ttl-ms)");
  }
  const RequestKeyScope scope{r.lora_name, r.lora_version, r.salt};
  MC_RETURN_IF_ERROR(validate_key_scope(scope, "decode_reserve '" + r.request_id + "'"));
  if (const std::string bad = proto::sampling_error(r.sampling); !bad.empty()) {
    metrics_.counter("mc_decode_reserve_invalid_total", "reservations refused for bad lengths").inc();
    return error(Code::kInvalidArgument, "decode_reserve '" + r.request_id + "': sampling: " + bad);
  }
  const KvLayout& layout = kv_->layout();
  const int64_t need = layout.blocks_for_tokens(r.input_length_tokens + r.output_length_tokens);
  std::lock_guard lock(mu_);
  if (committed_blocks_ + need > kv_->num_blocks()) {
    metrics_.counter("mc_decode_reserve_rejected_total", "reservations refused for lack of KV").inc();
    return error(Code::kRejected, "decode_reserve '" + r.request_id + "': KV does not fit: needs " +
                                      std::to_string(need) + " blocks at full length (" +
                                      std::to_string(r.input_length_tokens) + " + " +
                                      std::to_string(r.output_length_tokens) + " tokens), " +
                                      std::to_string(kv_->num_blocks() - committed_blocks_) + " of " +
                                      std::to_string(kv_->num_blocks()) +
                                      " blocks uncommitted (running and reserved requests count at full length)");
  }
  MC_ASSIGN_OR_RETURN(auto blocks, kv_->allocate(layout.blocks_for_tokens(r.input_length_tokens)));
  auto res = std::make_unique<Reservation>();
  res->id = next_reservation_++;
  res->request_id = r.request_id;
  res->client_request_id = r.client_request_id.empty() ? r.request_id : r.client_request_id;
  res->input_tokens = r.input_length_tokens;
  res->output_tokens = r.output_length_tokens;
  res->committed_blocks = need;
  // One socket per (endpoint, key): a request naming another client's endpoint with its own key never changes how
  // that client is reached (docs/SECURITY.md, issue 51).
  res->client_endpoint = rpc::keyed_endpoint(r.client_endpoint, r.client_public_key);
  res->blocks = std::move(blocks);
  res->block_set.insert(res->blocks.begin(), res->blocks.end());
  res->lora = LoraAdapter{r.lora_name, r.lora_version};
  res->scope = scope;
  res->kv_namespace_digest = ns_.with_request(scope).digest_hex();
  res->sampling = r.sampling;
  res->arrived.assign(static_cast<size_t>(layout.num_layers), std::vector<bool>(res->blocks.size(), false));
  res->deadline_ns = clock_->now_ns() + (r.ttl_ms > 0 ? r.ttl_ms : options_.reservation_ttl_ms) * 1'000'000;
  committed_blocks_ += need;

  proto::DecodeReserveReply reply;
  reply.reservation_id = res->id;
  reply.block_tokens = layout.block_size;
  reply.layer_block_bytes = layout.layer_block_bytes();
  reply.block_bytes = layout.block_bytes();
  for (int32_t b : res->blocks) {
    reply.block_offsets_bytes.push_back(kv_segment_base_ + static_cast<uint64_t>(kv_->layer_block_offset(b, 0)));
  }
  reply.kv_segment = kv_segment_;
  reply.free_blocks = kv_->num_blocks() - committed_blocks_;
  if (!kv_grant_key_.empty()) {
    // The whole buffer's range, scoped at each WRITE to this reservation's blocks while it lives (kv_grant_scope).
    const int64_t ttl_ms = (res->deadline_ns - clock_->now_ns()) / 1'000'000;
    auth::Grant g{kv_segment_,
                  kv_segment_base_,
                  static_cast<uint64_t>(kv_->size_bytes()),
                  auth::kGrantWrite,
                  auth::unix_now_ms() + ttl_ms + auth::kGrantClockSlackMs,
                  "",
                  res->id};
    MC_ASSIGN_OR_RETURN(reply.kv_grant, auth::issue_grant(kv_grant_key_, g));
  }
  reservations_.emplace(res->id, std::move(res));
  metrics_.counter("mc_decode_reserve_total", "reservations granted").inc();
  return reply;
}

void DecodeWorker::drop_reservation_locked(uint64_t id, const Status& why, bool tell_client, bool hold_blocks) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return;
  Reservation& r = *it->second;
  if (hold_blocks && engine_) {
    // A prefill may still WRITE into these blocks: keep them (and their admission) until it says it is done.
    expired_[id] =
        Expired{std::move(r.blocks), r.committed_blocks, clock_->now_ns() + options_.expired_hold_ms * 1'000'000};
  } else {
    kv_->free(r.blocks);
    committed_blocks_ -= r.committed_blocks;
  }
  if (tell_client) {
    outgoing_.push_back({r.client_endpoint,
                         proto::RequestError{r.client_request_id, static_cast<uint16_t>(why.code()), why.message(), 0},
                         r.request_id});
    work_cv_.notify_one();
  }
  reservations_.erase(it);
}

Result<proto::DecodeReleaseReply> DecodeWorker::release(const proto::DecodeReleaseRequest& request) {
  std::lock_guard lock(mu_);
  proto::DecodeReleaseReply reply;
  reply.released = reservations_.count(request.reservation_id) > 0 || release_expired_locked(request.reservation_id);
  drop_reservation_locked(request.reservation_id, Status::ok(), /*tell_client=*/false);
  reply.free_blocks = kv_->num_blocks() - committed_blocks_;
  return reply;
}

Result<proto::DecodeReleaseReply> DecodeWorker::abort(const proto::DecodeAbortRequest& request) {
  const Status why(request.code != 0 ? static_cast<Code>(request.code) : Code::kAborted,
                   "prefill aborted: " + request.reason);
  std::lock_guard lock(mu_);
  proto::DecodeReleaseReply reply;
  cancelled_.erase(request.reservation_id);
  if (release_expired_locked(request.reservation_id)) {
    reply.released = true;  // expired or cancelled earlier (the client was told then); the prefill is done writing
  } else if (reservations_.count(request.reservation_id) > 0) {
    reply.released = true;
    drop_reservation_locked(request.reservation_id, why, /*tell_client=*/true);
  } else {
    auto cancel = [&](std::unique_ptr<Sequence>& s) {
      if (s->reservation_id == request.reservation_id && !s->cancelled) {
        s->cancelled = true;
        s->cancel_reason = why;
        reply.released = true;
      }
    };
    for (auto& s : joining_) cancel(s);
    for (auto& s : running_) cancel(s);
  }
  metrics_.counter("mc_decode_aborted_total", "requests aborted by prefill").inc();
  reply.free_blocks = kv_->num_blocks() - committed_blocks_;
  return reply;
}

Result<proto::DecodeCancelReply> DecodeWorker::cancel(const proto::DecodeCancelRequest& request) {
  if (request.request_id.empty()) return error(Code::kInvalidArgument, "decode_cancel: empty request_id");
  const Status why(Code::kCancelled, "request '" + request.request_id + "' was cancelled by its client");
  std::lock_guard lock(mu_);
  proto::DecodeCancelReply reply;
  std::vector<uint64_t> reserved;
  for (const auto& [id, r] : reservations_) {
    if (r->request_id == request.request_id) reserved.push_back(id);
  }
  const int64_t hold_until_ns = clock_->now_ns() + options_.expired_hold_ms * 1'000'000;
  for (uint64_t id : reserved) {
    // Its prefill may still WRITE into the blocks (one-sided writes cannot be refused): with a segment they are
    // held, as for an expired reservation, until the prefill's kv_commit (refused: kCancelled) or decode_abort.
    drop_reservation_locked(id, why, /*tell_client=*/true, /*hold_blocks=*/true);
    cancelled_[id] = hold_until_ns;
    reply.found = true;
  }
  // A committed sequence leaves the batch at the next step (the backend may be running it now), which frees its
  // blocks and sends the client request_error(kCancelled), as abort does.
  auto cancel_sequence = [&](std::unique_ptr<Sequence>& s) {
    if (s->request_id == request.request_id && !s->cancelled) {
      s->cancelled = true;
      s->cancel_reason = why;
      reply.found = true;
    }
  };
  for (auto& s : joining_) cancel_sequence(s);
  for (auto& s : running_) cancel_sequence(s);
  if (reply.found) metrics_.counter("mc_decode_cancelled_total", "requests cancelled by their client").inc();
  reply.free_blocks = kv_->num_blocks() - committed_blocks_;
  return reply;
}

Result<proto::KvWriteReply> DecodeWorker::kv_write(const proto::KvWriteRequest& w) {
  metrics_.counter("mc_decode_kv_write_calls_total", "kv_write RPCs (the fallback without a transfer-engine segment)")
      .inc();
  std::lock_guard lock(mu_);
  auto it = reservations_.find(w.reservation_id);
  if (it == reservations_.end()) {
    return error(Code::kNotFound, "kv_write: no reservation " + std::to_string(w.reservation_id) +
                                      " (released, aborted, expired or committed)");
  }
  Reservation& r = *it->second;
  const KvLayout& layout = kv_->layout();
  if (w.layer < 0 || w.layer >= layout.num_layers) {
    return error(Code::kOutOfRange, "kv_write: layer " + std::to_string(w.layer) + " outside [0, " +
                                        std::to_string(layout.num_layers) + ")");
  }
  const uint64_t expect = w.block_indexes.size() * static_cast<uint64_t>(layout.layer_block_bytes());
  if (w.data.size() != expect) {
    return error(Code::kInvalidArgument, "kv_write: " + std::to_string(w.data.size()) + " data bytes for " +
                                             std::to_string(w.block_indexes.size()) + " layer blocks of " +
                                             std::to_string(layout.layer_block_bytes()) + " B");
  }
  for (uint32_t idx : w.block_indexes) {
    if (idx >= r.blocks.size()) {
      return error(Code::kOutOfRange, "kv_write: block index " + std::to_string(idx) + " outside the reservation's " +
                                          std::to_string(r.blocks.size()) + " prompt blocks");
    }
  }
  auto& arrived = r.arrived[static_cast<size_t>(w.layer)];
  const bool layer_was_new = std::none_of(arrived.begin(), arrived.end(), [](bool b) { return b; });
  for (size_t i = 0; i < w.block_indexes.size(); ++i) {
    const uint32_t idx = w.block_indexes[i];
    std::memcpy(kv_->layer_block_span(r.blocks[idx], w.layer).data(), w.data.data() + i * layout.layer_block_bytes(),
                static_cast<size_t>(layout.layer_block_bytes()));
    arrived[idx] = true;
  }
  if (layer_was_new && !w.block_indexes.empty()) ++r.layers_received;
  metrics_.counter("mc_decode_kv_received_bytes_total", "KV bytes received from prefill").inc(w.data.size());
  return proto::KvWriteReply{r.layers_received};
}

Result<proto::KvCommitReply> DecodeWorker::commit(const proto::KvCommitRequest& c) {
  std::lock_guard lock(mu_);
  auto it = reservations_.find(c.reservation_id);
  if (it == reservations_.end() && cancelled_.erase(c.reservation_id) > 0) {
    release_expired_locked(c.reservation_id);  // the prefill is done writing
    metrics_.counter("mc_decode_commit_refused_total", "commits refused (incomplete KV, bad fields)").inc();
    return error(Code::kCancelled, "kv_commit: reservation " + std::to_string(c.reservation_id) + " of request '" +
                                       c.request_id + "' was cancelled by its client; not generating");
  }
  if (it == reservations_.end()) {
    const bool expired = release_expired_locked(c.reservation_id);
    return error(Code::kNotFound, "kv_commit: no reservation " + std::to_string(c.reservation_id) +
                                      (expired ? " (expired before the commit; the client was told)"
                                               : " (released, aborted or expired)"));
  }
  Reservation& r = *it->second;
  Status bad = r.poisoned;
  if (!bad.is_ok()) {
    // a malformed KV write for this reservation: never generate from it
  } else if (c.prompt_tokens != r.input_tokens) {
    bad = error(Code::kInvalidArgument, "kv_commit '" + r.request_id + "': prompt_tokens " +
                                            std::to_string(c.prompt_tokens) + " != reserved input " +
                                            std::to_string(r.input_tokens));
  } else if (!c.kv_namespace_digest.empty() && c.kv_namespace_digest != r.kv_namespace_digest) {
    bad = error(Code::kFailedPrecondition,
                "kv_commit '" + r.request_id + "': the KV was computed in key namespace " + c.kv_namespace_digest +
                    " but the request runs in " + r.kv_namespace_digest + " (" + r.scope.describe() + " on model " +
                    ns_.model_id + ", " + ns_.model_revision +
                    "); not generating: prefill and decode must run the "
                    "same model, --seed and --block-size, and the prefill the request's adapter and salt");
  } else if (!c.store_block_hashes.empty() &&
             (c.store_first_block < 0 || c.store_first_block > r.input_tokens / options_.block_tokens -
                                                                   static_cast<int64_t>(c.store_block_hashes.size()))) {
    bad = error(Code::kInvalidArgument,
                "kv_commit '" + r.request_id + "': store blocks [" + std::to_string(c.store_first_block) + ", +" +
                    std::to_string(c.store_block_hashes.size()) + ") are not complete blocks of the " +
                    std::to_string(r.input_tokens) + "-token prompt (" + std::to_string(options_.block_tokens) +
                    " tokens a block)");
  } else if (c.first_token >= static_cast<uint64_t>(backend_->model().vocab_size)) {
    bad = error(Code::kInvalidArgument, "kv_commit '" + r.request_id + "': first token " +
                                            std::to_string(c.first_token) + " outside the vocabulary");
  } else if (c.first_logprobs.size() > static_cast<size_t>(proto::kMaxTopLogprobs) + 1) {
    bad = error(Code::kInvalidArgument, "kv_commit '" + r.request_id + "': " + std::to_string(c.first_logprobs.size()) +
                                            " first-token logprobs, at most " +
                                            std::to_string(proto::kMaxTopLogprobs + 1));
  } else {
    for (size_t l = 0; l < r.arrived.size() && bad.is_ok(); ++l) {
      for (size_t b = 0; b < r.arrived[l].size(); ++b) {
        if (!r.arrived[l][b]) {
          bad = error(Code::kDataLoss, "kv_commit '" + r.request_id + "': KV incomplete: layer " + std::to_string(l) +
                                           " of block " + std::to_string(b) + " never arrived (" +
                                           std::to_string(r.layers_received) + " of " +
                                           std::to_string(r.arrived.size()) + " layers seen); not generating");
          break;
        }
      }
    }
  }
  if (!bad.is_ok()) {
    metrics_.counter("mc_decode_commit_refused_total", "commits refused (incomplete KV, bad fields)").inc();
    drop_reservation_locked(c.reservation_id, bad, /*tell_client=*/true);
    return bad;
  }
  const int64_t store_queued = store_blocks_locked(r, c);
  auto s = std::make_unique<Sequence>();
  s->reservation_id = r.id;
  s->request_id = r.request_id;
  s->client_request_id = r.client_request_id;
  s->client_endpoint = r.client_endpoint;
  s->blocks = std::move(r.blocks);
  s->committed_blocks = r.committed_blocks;
  s->position = r.input_tokens;
  s->last_token = c.first_token;
  s->output_tokens = r.output_tokens;
  s->ledger = c.ledger;
  if (!c.store_block_hashes.empty()) s->ledger.stored_blocks = store_queued;
  s->lora = r.lora;
  s->sampling = r.sampling;
  if (s->sampling.needs_counts()) s->counts[c.first_token] = 1;
  if (s->sampling.logprobs >= 0) s->first_logprobs = c.first_logprobs;
  reservations_.erase(it);
  joining_.push_back(std::move(s));
  work_cv_.notify_one();
  return proto::KvCommitReply{static_cast<int64_t>(running_.size() + joining_.size()), store_queued};
}

int64_t DecodeWorker::store_blocks_locked(const Reservation& r, const proto::KvCommitRequest& c) {
  if (c.store_block_hashes.empty()) return 0;
  const auto count = static_cast<int64_t>(c.store_block_hashes.size());
  if (!store_puts_) {
    metrics_.counter("mc_decode_store_unset_blocks_total", "prompt blocks to store, but this instance has no --store")
        .inc(static_cast<uint64_t>(count));
    if (!warned_no_store_) {
      warned_no_store_ = true;
      MC_LOG_WARN << "decode: a pipelined prefill asked to store " << count << " new blocks of '" << r.request_id
                  << "', but this instance runs without --store; they are not stored (said once)";
    }
    return 0;
  }
  // The keys in the reservation's namespace (never one the prefill names), the bytes from this buffer: those of
  // a single-node prefill of the same prompt (DESIGN.md §18 "Live groups").
  const KeyNamespace ns = ns_.with_request(r.scope);
  std::vector<std::string> keys;
  std::vector<std::span<const std::byte>> spans;
  keys.reserve(c.store_block_hashes.size());
  spans.reserve(c.store_block_hashes.size());
  for (int64_t i = 0; i < count; ++i) {
    keys.push_back(block_store_key(ns, c.store_block_hashes[static_cast<size_t>(i)]));
    spans.emplace_back(kv_->block_span(r.blocks[static_cast<size_t>(c.store_first_block + i)]));
  }
  // Each layer of a block is a part with its own checksum: a pipeline stage reads its layers only.
  const auto layer_bytes = static_cast<uint64_t>(kv_->layout().layer_block_bytes());
  if (Status q = store_puts_->enqueue(r.request_id, std::move(keys), spans, layer_bytes); !q.is_ok()) {
    MC_LOG_WARN << "decode: " << q.to_string();
    return 0;
  }
  return count;
}

void DecodeWorker::set_block_store(std::unique_ptr<KvBlockCache> cache, int64_t max_queued_bytes) {
  auto q = std::make_unique<BlockPutQueue>(std::move(cache), max_queued_bytes, &metrics_);
  std::lock_guard lock(mu_);
  store_puts_ = std::move(q);
}

void DecodeWorker::flush_store_puts() {
  BlockPutQueue* q = nullptr;
  {
    std::lock_guard lock(mu_);
    q = store_puts_.get();
  }
  if (q != nullptr) q->flush();
}

proto::WorkerLoadReply DecodeWorker::load() const {
  std::lock_guard lock(mu_);
  proto::WorkerLoadReply l;
  l.role = "decode";
  l.backend = backend_->kind();
  l.model = backend_->model().name;
  l.batch_size = static_cast<int64_t>(running_.size());
  l.queued_jobs = static_cast<int64_t>(joining_.size());
  l.reservations = static_cast<int64_t>(reservations_.size());
  for (const auto& s : running_) l.running_tokens += s->position;
  l.kv_blocks_total = kv_->num_blocks();
  l.kv_blocks_used = kv_->num_blocks() - kv_->free_blocks();
  l.kv_blocks_committed = committed_blocks_;
  l.kv_blocks_free = kv_->num_blocks() - committed_blocks_;
  l.recent_step_ms = recent_step_ms_;
  l.kv_segment = kv_segment_;
  return l;
}

bool DecodeWorker::idle() const {
  std::lock_guard lock(mu_);
  return running_.empty() && joining_.empty() && reservations_.empty() && outgoing_.empty();
}

void DecodeWorker::flush_outgoing() {
  sink_->poll();  // retries to stalled clients run even when nothing new is sent
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    out.swap(outgoing_);
  }
  for (auto& o : out) {
    Status s = std::visit(
        [&](auto& msg) -> Status {
          using T = std::decay_t<decltype(msg)>;
          if constexpr (std::is_same_v<T, proto::TokenEvent>) return sink_->token(o.endpoint, msg);
          if constexpr (std::is_same_v<T, proto::RequestDone>) return sink_->done(o.endpoint, msg);
          if constexpr (std::is_same_v<T, proto::RequestError>) return sink_->fail(o.endpoint, msg);
        },
        o.msg);
    if (!s.is_ok()) {
      metrics_.counter("mc_decode_client_send_errors_total", "messages the client did not acknowledge").inc();
      // A quarantined client was named once by the sink; its every dropped token is not logged again.
      if (s.code() != Code::kUnavailable) {
        MC_LOG_WARN << "decode: client " << o.endpoint << " did not take a message: " << s.to_string();
      }
    }
    if (reporter_) {
      proto::ConductorJobReportRequest rep;
      rep.event_unix_ns = unix_time_ns();
      if (const auto* t = std::get_if<proto::TokenEvent>(&o.msg)) {
        if (t->index != 0) continue;
        rep.request_id = o.request_id;
        rep.phase = proto::kPhaseFirstToken;
        rep.event_unix_ns = t->emitted_unix_ns;
      } else if (const auto* d = std::get_if<proto::RequestDone>(&o.msg)) {
        rep.request_id = o.request_id;
        rep.phase = proto::kPhaseDone;
        rep.output_tokens = d->ledger.output_tokens;
      } else if (const auto* e = std::get_if<proto::RequestError>(&o.msg)) {
        rep.request_id = o.request_id;
        rep.phase = proto::kPhaseFailed;
        rep.output_tokens = e->output_tokens;
        rep.message = e->message;
      }
      reporter_(std::move(rep));
    }
  }
}

Result<int64_t> DecodeWorker::step() {
  std::vector<Sequence*> batch;
  {
    std::lock_guard lock(mu_);
    const int64_t now = clock_->now_ns();
    std::vector<uint64_t> expired;
    for (const auto& [id, r] : reservations_) {
      if (now > r->deadline_ns) expired.push_back(id);
    }
    for (uint64_t id : expired) {
      metrics_.counter("mc_decode_reservations_expired_total", "reservations without commit before ttl").inc();
      drop_reservation_locked(id, error(Code::kTimeout, "reservation expired: no KV commit from prefill in time"),
                              /*tell_client=*/true, /*hold_blocks=*/true);
    }
    std::vector<uint64_t> overdue;
    for (const auto& [id, e] : expired_) {
      if (now > e.release_ns) overdue.push_back(id);
    }
    for (uint64_t id : overdue) release_expired_locked(id);
    std::erase_if(cancelled_, [now](const auto& c) { return now > c.second; });
    // Cancelled and new sequences.
    auto finish = [&](Sequence& s, const Status& why) {
      kv_->free(s.blocks);
      committed_blocks_ -= s.committed_blocks;
      outgoing_.push_back(
          {s.client_endpoint,
           proto::RequestError{s.client_request_id, static_cast<uint16_t>(why.code()), why.message(), s.emitted},
           s.request_id});
    };
    for (auto it = running_.begin(); it != running_.end();) {
      if ((*it)->cancelled) {
        finish(**it, (*it)->cancel_reason);
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    while (!joining_.empty() && static_cast<int64_t>(running_.size()) < options_.max_batch_size) {
      auto s = std::move(joining_.front());
      joining_.pop_front();
      if (s->cancelled) {
        finish(*s, s->cancel_reason);
        continue;
      }
      s->first_token_ns = clock_->now_ns();
      s->last_token_ns = s->first_token_ns;
      outgoing_.push_back(
          {s->client_endpoint,
           proto::TokenEvent{s->client_request_id, 0, s->last_token, unix_time_ns(), std::move(s->first_logprobs)},
           s->request_id});
      s->emitted = 1;
      running_.push_back(std::move(s));
    }
    // Growth blocks (always available: admission counted them).
    for (auto& s : running_) {
      if (s->emitted >= s->output_tokens) continue;
      while (kv_->layout().blocks_for_tokens(s->position + 1) > static_cast<int64_t>(s->blocks.size())) {
        auto more = kv_->allocate(1);
        if (!more.is_ok()) {
          return error(Code::kInternal,
                       "decode: growth block unavailable despite admission accounting: " + more.status().to_string());
        }
        s->blocks.push_back(more.value()[0]);
      }
      batch.push_back(s.get());
    }
  }
  flush_outgoing();

  int64_t stepped = 0;
  if (!batch.empty()) {
    std::vector<DecodeSequence> seqs;
    for (Sequence* s : batch) seqs.push_back({s->last_token, s->position, s->blocks, s->lora});
    std::vector<uint32_t> next;
    std::vector<float> logits;  // only when a sequence samples, penalizes or wants logprobs
    const bool want_logits =
        std::any_of(batch.begin(), batch.end(), [](const Sequence* s) { return s->sampling.needs_logits(); });
    const int64_t t0 = clock_->now_ns();
    Status st = backend_->decode_step(*kv_, seqs, next, want_logits ? &logits : nullptr);
    const double step_ms = static_cast<double>(clock_->now_ns() - t0) / 1e6;
    std::lock_guard lock(mu_);
    recent_step_ms_ = recent_step_ms_ == 0 ? step_ms : 0.8 * recent_step_ms_ + 0.2 * step_ms;
    if (st.is_ok()) {
      int64_t context = 0;
      for (const DecodeSequence& q : seqs) context += q.position + 1;  // the tokens this step attends over
      if (step_samples_.size() >= proto::kMaxDecodeStepSamples) step_samples_.pop_front();
      step_samples_.push_back(proto::DecodeStepSample{static_cast<int64_t>(seqs.size()), context, step_ms});
    }
    metrics_.counter("mc_decode_steps_total", "decode steps").inc();
    metrics_.histogram("mc_decode_step_seconds", metrics::latency_buckets_s(), "decode step time")
        .observe(step_ms / 1e3);
    metrics::Histogram& tbt = metrics_.histogram("mc_decode_tbt_seconds", metrics::latency_buckets_s(),
                                                 "time between consecutive output tokens of a request (TBT)");
    const int64_t t_tokens = clock_->now_ns();
    for (size_t i = 0; i < batch.size(); ++i) {
      Sequence* s = batch[i];
      if (s->cancelled) continue;
      if (!st.is_ok()) {
        s->cancelled = true;
        s->cancel_reason = st.with_context("decode step");
        continue;
      }
      s->position += 1;
      proto::TokenEvent event{s->client_request_id, s->emitted, next[i], unix_time_ns()};
      const size_t vocab = static_cast<size_t>(backend_->model().vocab_size);
      if (s->sampling.needs_logits() && logits.size() == batch.size() * vocab) {
        TokenChoice choice =
            sample_token(std::span<const float>(logits.data() + i * vocab, vocab), s->sampling, s->emitted, &s->counts);
        event.token = choice.token;
        event.logprobs = std::move(choice.logprobs);
      }
      if (s->sampling.needs_counts()) ++s->counts[event.token];
      s->last_token = event.token;
      outgoing_.push_back({s->client_endpoint, std::move(event), s->request_id});
      s->emitted += 1;
      tbt.observe(static_cast<double>(t_tokens - s->last_token_ns) * 1e-9);
      s->last_token_ns = t_tokens;
      metrics_.counter("mc_decode_tokens_total", "output tokens generated").inc();
    }
    stepped = static_cast<int64_t>(batch.size());
  }
  {
    std::lock_guard lock(mu_);
    for (auto it = running_.begin(); it != running_.end();) {
      Sequence& s = **it;
      if (!s.cancelled && s.emitted >= s.output_tokens) {
        s.ledger.output_tokens = s.emitted;
        s.ledger.decode_ms = (clock_->now_ns() - s.first_token_ns) / 1'000'000;
        outgoing_.push_back({s.client_endpoint, proto::RequestDone{s.client_request_id, s.ledger}, s.request_id});
        kv_->free(s.blocks);
        committed_blocks_ -= s.committed_blocks;
        metrics_.counter("mc_decode_requests_done_total", "requests completed").inc();
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    metrics_.gauge("mc_decode_batch_size", "running sequences").set(static_cast<double>(running_.size()));
    metrics_.gauge("mc_decode_kv_blocks_committed", "blocks promised at full length")
        .set(static_cast<double>(committed_blocks_));
    metrics_.gauge("mc_decode_kv_blocks_used", "blocks holding KV")
        .set(static_cast<double>(kv_->num_blocks() - kv_->free_blocks()));
  }
  flush_outgoing();
  return stepped;
}

void DecodeWorker::wait_for_work(int64_t timeout_ms) {
  std::unique_lock lock(mu_);
  work_cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
                    [&] { return !joining_.empty() || !running_.empty() || !outgoing_.empty(); });
}

std::vector<proto::DecodeStepSample> DecodeWorker::take_step_samples() {
  std::lock_guard lock(mu_);
  std::vector<proto::DecodeStepSample> out(step_samples_.begin(), step_samples_.end());
  step_samples_.clear();
  return out;
}

Status serve_decode(DecodeWorker& worker, const std::string& endpoint, const ConductorHeartbeatOptions& conductor_in,
                    const std::string& metrics_listen, int64_t drain_timeout_s) {
  rpc::ServerOptions so;
  so.service = "mc-decode";
  so.bind_endpoints = {endpoint};
  MC_ASSIGN_OR_RETURN(auto server, rpc::RpcServer::bind(so));
  server->serve_stat(&worker.metrics());
  std::vector<std::pair<std::string, std::string>> metrics_extra;
  MC_ASSIGN_OR_RETURN(std::unique_ptr<metrics::HttpExporter> exporter,
                      metrics::start_daemon_exporter(metrics_listen, so.service, &worker.metrics(), &metrics_extra));
  server->handle<proto::DecodeReserveRequest>([&](const auto& r, const auto&) { return worker.reserve(r); });
  server->handle<proto::DecodeReleaseRequest>([&](const auto& r, const auto&) { return worker.release(r); });
  server->handle<proto::DecodeAbortRequest>([&](const auto& r, const auto&) { return worker.abort(r); });
  server->handle<proto::DecodeCancelRequest>([&](const auto& r, const auto&) { return worker.cancel(r); });
  server->handle<proto::KvWriteRequest>([&](const auto& r, const auto&) { return worker.kv_write(r); });
  server->handle<proto::KvCommitRequest>([&](const auto& r, const auto&) { return worker.commit(r); });
  server->handle<proto::WorkerLoadRequest>(
      [&](const auto&, const auto&) -> Result<proto::WorkerLoadReply> { return worker.load(); });

  std::atomic<bool> stop{false};
  std::atomic<bool> stepper_failed{false};  // step_status is set: the batch failed
  Status step_status;
  std::thread stepper([&] {
    while (!stop.load()) {
      auto n = worker.step();
      if (!n.is_ok()) {
        step_status = n.status();
        stepper_failed.store(true);
        daemon::request_stop();
        return;
      }
      if (n.value() == 0) worker.wait_for_work(kIdleStepMs);
    }
  });
  const auto& layout = worker.kv().layout();
  const ConductorHeartbeatOptions conductor = resolve_conductor_options(conductor_in, "decode");
  proto::ConductorRegisterRequest reg;
  reg.instance_id = conductor.instance_id;
  reg.role = "decode";
  reg.host = conductor.host;
  reg.endpoint = server->endpoints().front();
  reg.kv_capacity_tokens = worker.kv().num_blocks() * layout.block_size;
  reg.block_size_tokens = layout.block_size;
  ConductorJobReporter reporter(conductor);
  if (!conductor.endpoint.empty()) {
    worker.set_job_reporter([&reporter](proto::ConductorJobReportRequest r) { reporter.report(std::move(r)); });
  }
  uint64_t last_steps = 0;
  ConductorHeartbeat heartbeat(conductor, reg, [&worker, &last_steps, bs = layout.block_size] {
    const proto::WorkerLoadReply l = worker.load();
    proto::ConductorHeartbeatRequest hb;
    hb.running_requests = l.batch_size;
    hb.kv_reserved_tokens = l.kv_blocks_committed * bs;
    hb.context_tokens = l.running_tokens;
    const uint64_t steps = worker.metrics().counter("mc_decode_steps_total").value();
    hb.decode_steps = static_cast<int64_t>(steps - last_steps);
    last_steps = steps;
    hb.decode_step_samples = worker.take_step_samples();
    return hb;
  });
  if (Status reg_status = heartbeat.wait_registered(conductor.start_wait_ms); !reg_status.is_ok()) {
    heartbeat.stop();
    stop.store(true);
    stepper.join();
    worker.set_job_reporter(nullptr);
    reporter.stop();
    return reg_status;
  }
  std::vector<std::pair<std::string, std::string>> extra = {
      {"backend", worker.backend().kind()},
      {"model", worker.backend().model().name},
      {"kv_blocks", std::to_string(worker.kv().num_blocks())},
      {"block_tokens", std::to_string(layout.block_size)},
      {"kv_bytes_per_token", std::to_string(layout.bytes_per_token())},
      {"kv_segment", worker.kv_segment().empty() ? "none" : worker.kv_segment()}};
  extra.insert(extra.end(), metrics_extra.begin(), metrics_extra.end());
  daemon::announce_ready("mc-decode", server->endpoints().front(), extra);
  // Drain (WorkerDrain, DESIGN.md §10 "Drain"): reservations are refused once the Conductor took the notice; KV writes
  // and commits for held reservations go on, and the loop ends once the worker is idle. At the end of the drain what
  // is left ends with request_error kUnavailable.
  Status served;
  WorkerDrain drain(drain_timeout_s);
  while (true) {
    if (stepper_failed.load()) break;  // the batch failed: nothing to drain into, nothing to serve
    const int64_t now = steady_ns();
    const WorkerDrain::Turn turn =
        drain.step(now, daemon::stop_requested(), daemon::stop_now_requested(), heartbeat.drain_acknowledged());
    if (turn.started) {
      heartbeat.request_drain();
      const proto::WorkerLoadReply l = worker.load();
      MC_LOG_INFO << "mc-decode: draining (SIGTERM): " << l.batch_size << " running, " << l.reservations
                  << " reserved get up to " << drain_timeout_s << " s; a second signal ends them at once";
    }
    if (turn.refuse) worker.refuse_reservations(conductor.instance_id);
    if (turn.end) {
      const Status why(Code::kUnavailable,
                       drain.ended_by_signal()
                           ? "decode instance " + conductor.instance_id + " stopped (a second signal)"
                           : "decode instance " + conductor.instance_id + " drained: its drain timeout (" +
                                 std::to_string(drain_timeout_s) + " s) ended the request");
      const int64_t n = worker.end_all(why);
      worker.metrics()
          .counter("mc_decode_drain_ended_total", "requests ended by the drain timeout (or a second signal)")
          .inc(static_cast<uint64_t>(n));
      MC_LOG_WARN << "mc-decode: " << why.message() << ": " << n << " request(s) told";
    }
    if (drain.draining()) {
      // Done: nothing held (the errors of end_all sent by the step thread), or 5 s after end_all at most.
      if (drain.refusing() && worker.idle()) break;
      if (drain.ended() && now - drain.ended_ns() > 5'000'000'000) {
        MC_LOG_WARN << "mc-decode: requests still held 5 s after the drain ended them; exiting";
        break;
      }
    }
    served = server->poll_once(drain.draining() ? 5 : 50);
    if (!served.is_ok()) break;
  }
  if (drain.draining()) {
    MC_LOG_INFO << "mc-decode: drained in " << (steady_ns() - drain.started_ns()) / 1'000'000 << " ms";
  }
  heartbeat.stop();
  stop.store(true);
  stepper.join();
  worker.set_job_reporter(nullptr);
  reporter.stop();
  MC_LOG_INFO << "mc-decode: stopping";
  MC_RETURN_IF_ERROR(step_status);
  return served;
}

}  // namespace mc::infer
