#include "mc/conductor/conductor.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "mc/common/block_key.hpp"
#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/common/metrics.hpp"
#include "mc/common/report.hpp"
#include "mc/coord/leader.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"
#include "mc/proto/kv_events.hpp"
#include "mc/proto/store.hpp"
#include "mc/proto/worker.hpp"
#include "mc/sched/decision_json.hpp"
#include "mc/sched/faults.hpp"
#include "mc/sched/scheduler.hpp"
#include "store_resync.hpp"

namespace mc::sched {

Result<Request> request_from_submit(const std::string& request_id, int64_t input_tokens, int64_t output_tokens,
                                    const std::vector<uint32_t>& tokens, const std::vector<uint64_t>& block_hashes,
                                    int64_t block_size_tokens, double slo_ttft_ms, double slo_tbt_ms,
                                    const KeyNamespace& ns) {
  const std::string what = "submit '" + request_id + "': ";
  if (request_id.empty()) return error(Code::kInvalidArgument, "submit: empty request_id");
  if (block_size_tokens != 0 && block_size_tokens != static_cast<int64_t>(ns.block_size)) {
    return error(Code::kInvalidArgument, what + "block_size_tokens " + std::to_string(block_size_tokens) +
                                             " differs from the Conductor's " + std::to_string(ns.block_size) +
                                             " (start both with the same --block-size)");
  }
  Request r;
  r.request_id = request_id;
  r.input_tokens = tokens.empty() ? input_tokens : static_cast<int64_t>(tokens.size());
  if (!tokens.empty() && input_tokens != 0 && input_tokens != r.input_tokens) {
    return error(Code::kInvalidArgument, what + "input_tokens " + std::to_string(input_tokens) + " but " +
                                             std::to_string(tokens.size()) + " tokens were sent");
  }
  if (r.input_tokens < 1) return error(Code::kInvalidArgument, what + "empty prompt (input_tokens must be >= 1)");
  if (output_tokens < 1) {
    return error(Code::kInvalidArgument,
                 what + "output_tokens must be >= 1 (got " + std::to_string(output_tokens) + ")");
  }
  MC_RETURN_IF_ERROR(validate_slo_ms(slo_ttft_ms, "slo_ttft_ms", "submit '" + request_id + "'"));
  MC_RETURN_IF_ERROR(validate_slo_ms(slo_tbt_ms, "slo_tbt_ms", "submit '" + request_id + "'"));
  r.output_tokens = output_tokens;
  r.slo_ttft_ms = slo_ttft_ms;
  r.slo_tbt_ms = slo_tbt_ms;
  const int64_t complete = r.input_tokens / static_cast<int64_t>(ns.block_size);
  if (static_cast<int64_t>(block_hashes.size()) > complete) {
    return error(Code::kInvalidArgument, what + std::to_string(block_hashes.size()) + " block_hashes but " +
                                             std::to_string(r.input_tokens) + " tokens hold only " +
                                             std::to_string(complete) + " complete blocks");
  }
  if (tokens.empty()) {
    return error(Code::kInvalidArgument, what +
                                             "no tokens: the prefill instance needs the prompt (synthesize trace "
                                             "prompts from hash_ids on the client)");
  }
  // The Conductor keys the prompt itself. Hashes a client sends with its tokens must be those keys: a forged one
  // would claim another scope's prefix (placement on a cache the prefill then does not find, pending blocks booked
  // under another tenant's keys); the prefill and decode instances key the tokens themselves either way.
  r.block_hashes = seq_hashes(tokens, ns);
  for (size_t i = 0; i < block_hashes.size(); ++i) {
    if (block_hashes[i] != r.block_hashes[i]) {
      return error(Code::kInvalidArgument,
                   what + "block_hashes[" + std::to_string(i) + "] is not the key of block " + std::to_string(i) +
                       " of its tokens in the request's key scope (model, adapter, salt); send the tokens without "
                       "block_hashes and the Conductor keys them");
    }
  }
  return r;
}

namespace {

int64_t now_unix_ns() { return unix_time_ms() * 1'000'000; }

// A submitted request id's bound: ids are copied into the ledgers, the decision log and every job message.
constexpr size_t kMaxRequestIdBytes = 1024;
// Submits held while a (re)started Conductor waits for its workers (Conductor::hold_for_workers): at most this many,
// and at most this many bytes of prompts and hashes (a submit may carry up to kMaxMessageBytes).
constexpr size_t kMaxHeldSubmits = 4096;
constexpr size_t kMaxHeldBytes = size_t{256} << 20;

class Conductor {
 public:
  Conductor(const ConductorOptions& options, std::unique_ptr<Scheduler> scheduler)
      : options_(options), sched_(std::move(scheduler)) {
    // The configured adapter and salt are the requests' default scope, not part of the workers' base.
    default_scope_ = options_.key_namespace.request_scope();
    options_.key_namespace = options_.key_namespace.with_request({});
    base_known_ = !options_.key_namespace.is_plain();
    fault_config_.max_attempts = std::max(1, options_.max_dispatch_attempts);
  }

  Status start() {
    rpc::ServerOptions so;
    so.service = "mc-conductor";
    so.bind_endpoints = {options_.listen};
    MC_ASSIGN_OR_RETURN(server_, rpc::RpcServer::bind(so));
    server_->serve_stat(&metrics_);
    for (const auto& ep : options_.kv_events) {
      Result<std::unique_ptr<rpc::EventSubscriber>> sub = rpc::EventSubscriber::connect(ep);
      if (!sub.is_ok()) return sub.status().with_context("subscribing to KV events at " + ep);
      subs_.emplace_back(ep, std::move(sub).value());
    }
    store_master_ = options_.store_master;
    if (!options_.etcd.empty()) {
      MC_ASSIGN_OR_RETURN(locator_, LeaderLocator::create(LeaderAddress{"", options_.etcd, options_.cluster_id}));
      follow_store_leader(options_.store_timeout_ms);
    } else if (!options_.store_master.empty()) {
      resync_ = std::make_unique<StoreMasterResync>(options_.store_master, options_.store_timeout_ms, sched_.get());
      sched_->index().set_resync_source(resync_.get());
      Result<proto::StoreStatReply> st = resync_->refresh_hosts();
      if (!st.is_ok()) MC_LOG_WARN << "store master: " << st.status().message() << " (will retry)";
      // A (re)started Conductor loads what the pool already holds from a snapshot (issue 21 item 5), when the master's
      // event stream is the only one (a snapshot is of the whole master).
      if (options_.kv_events.size() == 1) {
        sched_->index().expect_stream(options_.kv_events.front());
        if (st.is_ok()) (void)sched_->index().resync_stale();
      }
    }
    if (!options_.decisions_path.empty()) {
      decisions_.open(options_.decisions_path, std::ios::app);
      if (!decisions_) {
        return error(Code::kIo, "cannot open decision log '" + options_.decisions_path + "': " + std::strerror(errno));
      }
    }
    register_handlers();
    return Status::ok();
  }

  const std::string& endpoint() const { return server_->endpoints().front(); }
  // The registry of `stat` and /metrics (gauges updated by the loop; safe to render from any thread).
  const metrics::Registry& metrics() const { return metrics_; }

  Status loop() {
    int64_t last_expire_ns = 0, last_hosts_ns = RealClock::instance().now_ns(), last_pass_ns = last_hosts_ns;
    while (!daemon::stop_requested()) {
      // One wait for everything this thread serves: requests and heartbeats on the server socket, replies to the
      // Conductor's own calls (their callbacks run inside poll_with), KV events. It wakes at the first message on
      // any of them, or after kLoopWaitMs for the timed work below (no spinning: an idle Conductor wakes 100 times
      // a second, and a reply is handled as soon as it arrives instead of at the next 2 ms tick).
      poll_items_.clear();
      poll_items_.push_back({server_->socket().handle(), 0, ZMQ_POLLIN, 0});
      for (auto& [ep, sub] : subs_) poll_items_.push_back({sub->socket().handle(), 0, ZMQ_POLLIN, 0});
      calls_.poll_with(poll_items_, kLoopWaitMs);
      if (poll_items_[0].revents & ZMQ_POLLIN) MC_RETURN_IF_ERROR(server_->poll_once(0));
      for (const std::string& endpoint : calls_.take_disconnected()) on_connection_lost(endpoint);
      bool events_ready = false;
      for (size_t i = 1; i < poll_items_.size(); ++i) events_ready |= (poll_items_[i].revents & ZMQ_POLLIN) != 0;
      if (events_ready) drain_events();
      const int64_t now = RealClock::instance().now_ns();
      // A pass of this loop takes a few ms. A longer gap means the Conductor itself did not run (descheduled on
      // a loaded host, or blocked in a store-master resync): the heartbeats waiting in its socket are not late,
      // so that silence is excused instead of removing every worker at once.
      if (const int64_t gap = now - last_pass_ns; gap > kLoopStallNs) {
        sched_->cluster().excuse_silence(gap, now);
        metrics::Counter& stalls = loop_stalls();
        stalls.inc();
        if (log::nth_worth_logging(stalls.value(), 100)) {
          MC_LOG_WARN << "mc-conductor: the main loop stalled for " << gap / 1'000'000
                      << " ms; the workers' silence during it is excused (" << stalls.value() << " stalls)";
        }
      }
      last_pass_ns = now;
      // Submits held for the workers: again after a registration, and once the start-up window ends.
      if (!held_.empty() && (held_release_due_ || now - started_ns_ >= startup_grace_ns())) {
        held_release_due_ = false;
        release_held();
      }
      if (now - last_expire_ns > 100'000'000) {
        last_expire_ns = now;
        for (const auto& id : sched_->expire()) {
          MC_LOG_WARN << "instance '" << id << "' missed its heartbeats for " << options_.scheduler.heartbeat_timeout_ms
                      << " ms: removed with its cached blocks";
          on_instance_lost(
              id, "missed its heartbeats for " + std::to_string(options_.scheduler.heartbeat_timeout_ms) + " ms");
        }
        sweep_decoding(now);
        resend_client_errors(now);
        update_metrics();
      }
      // Segment hosts and suspect nodes, once a second (a suspect node is parked within 1 s of the master
      // saying so, DESIGN.md §10 "Reconciliation after store faults").
      // Asynchronous: a master that is down or stopped never stalls this loop (a resync, which blocks for up
      // to --store-timeout-ms, only follows a stat that was answered).
      if (locator_ && locator_->generation() != leader_generation_) follow_store_leader(0);
      if (resync_ && !stat_pending_ && now - last_hosts_ns > 1'000'000'000) {
        last_hosts_ns = now;
        stat_pending_ = true;
        calls_.call<proto::StoreStatRequest>(
            store_master_, proto::StoreStatRequest{true}, options_.store_timeout_ms,
            [this](Result<proto::StoreStatReply> st) {
              stat_pending_ = false;
              if (!st.is_ok()) {
                MC_LOG_DEBUG << "store master: " << st.status().message();
                return;
              }
              resync_->apply_stat(*st);
              (void)sched_->index().resync_stale();  // failures are logged by the index and retried
            });
      }
    }
    MC_LOG_INFO << "mc-conductor: stopping (" << in_flight_.size() << " requests in flight)";
    // Held submits were never accepted: each caller hears why.
    for (const HeldSubmit& h : held_) {
      (void)server_->reply_error_to(
          h.ctx, Status(Code::kUnavailable, "mc-conductor stopped while request '" + h.req.request_id +
                                                "' waited for the workers to register: submit it again"));
    }
    held_.clear();
    held_bytes_ = 0;
    return Status::ok();
  }

 private:
  // Where a dispatching request is: which worker call of its current attempt is outstanding.
  enum class Stage : uint8_t { kReserving, kReplicating, kPrefilling, kReleasing };
  struct Flight {
    rpc::CallContext ctx;  // the client's submit, answered when the reservation holds
    bool answered = false;
    int attempt = 1;  // dispatch attempt (a worker's death re-dispatches); callbacks of older attempts are ignored
    Stage stage = Stage::kReserving;
    bool reservation_held = false;   // `reservation` exists on the decode instance and was not consumed
    bool decode_finished = false;    // mc-decode reported done/failed before the prefill's reply came
    double slo_ttft_ms = 0;          // the TTFT SLO applied at submit (re-dispatches get what is left of it)
    std::string fault_cause;         // the worker fault that re-dispatched it last ("" if none): its failure names it
    int64_t last_event_unix_ns = 0;  // the latest job-report event time (monotone)
    Request request;                 // as decided (re-dispatches decide it again)
    int64_t submit_ns = 0;
    int64_t submit_unix_ns = 0;
    int64_t dispatch_ns = 0;
    proto::ConductorSubmitRequest submit;
    Decision decision;
    std::string prefill_endpoint, decode_endpoint;
    std::string prefill_host;                 // replicate_prefix: where the store copies the prefix
    std::vector<std::string> replicate_keys;  // replicate_prefix: store keys of the reused blocks
    proto::DecodeReserveReply reservation;
    RequestKeyScope scope;          // the request's adapter and salt (or the default scope)
    std::string submitter_key;      // the submitter's public key (with keys; "" without): only it may cancel
    std::string client_request_id;  // the id the client submitted (submit.request_id is the Conductor's)
    std::string client_target;      // rpc::keyed_endpoint of the client's server: where request_error goes
    // conductor.cancel came while a worker's answer was outstanding (plan_cancel's wait_for_reply): the request
    // is settled in the books already; that answer only closes this record (no fault, no re-dispatch).
    bool cancelled = false;
    CancelStage cancel_stage = CancelStage::kUnknown;
  };
  // An accepted request whose KV was committed: its decode instance streams the tokens. Kept until mc-decode
  // reports it done or failed (or job_timeout_ms after its prefill), so that the death of that instance can be
  // told to the client.
  struct Decoding {
    std::string client_endpoint, prefill_id, decode_id;  // client_endpoint: Flight::client_target
    int64_t submit_ns = 0, submit_unix_ns = 0, since_ns = 0;
    int64_t last_event_unix_ns = 0;
    std::string decode_endpoint;  // where decode_cancel goes
    std::string submitter_key;    // Flight::submitter_key
    std::string client_request_id;
  };

  void register_handlers() {
    server_->handle<proto::ConductorSubmitRequest>(
        [this](const proto::ConductorSubmitRequest& req, const rpc::CallContext& ctx) {
          metrics_.counter("mc_conductor_submits_total", "requests submitted").inc();
          return on_submit(req, ctx);
        });
    server_->handle<proto::ConductorCancelRequest>(
        [this](const proto::ConductorCancelRequest& req, const rpc::CallContext& ctx) { return on_cancel(req, ctx); });
    server_->handle<proto::ConductorRegisterRequest>(
        [this](const proto::ConductorRegisterRequest& req,
               const rpc::CallContext& ctx) -> Result<proto::ConductorRegisterReply> {
          MC_RETURN_IF_ERROR(check_owner(ctx, req.instance_id, "register", /*bind=*/true));
          Result<proto::ConductorRegisterReply> r = on_register(req);
          if (r.is_ok() && !held_.empty()) held_release_due_ = true;  // after this reply is sent (loop())
          return r;
        });
    server_->handle<proto::ConductorHeartbeatRequest>(
        [this](const proto::ConductorHeartbeatRequest& req,
               const rpc::CallContext& ctx) -> Result<proto::ConductorHeartbeatReply> {
          MC_RETURN_IF_ERROR(check_owner(ctx, req.instance_id, "heartbeat", /*bind=*/false));
          return on_heartbeat(req);
        });
    server_->handle<proto::ConductorJobReportRequest>(
        [this](const proto::ConductorJobReportRequest& req,
               const rpc::CallContext& ctx) -> Result<proto::ConductorJobReportReply> {
          MC_RETURN_IF_ERROR(check_owner(ctx, req.instance_id, "job_report", /*bind=*/false));
          return on_job_report(req);
        });
    server_->handle<proto::ConductorDrainRequest>(
        [this](const proto::ConductorDrainRequest& req,
               const rpc::CallContext& ctx) -> Result<proto::ConductorDrainReply> {
          MC_RETURN_IF_ERROR(check_owner(ctx, req.instance_id, "drain", /*bind=*/false));
          return on_drain(req);
        });
    server_->handle<proto::ConductorStatusRequest>([this](
                                                       const proto::ConductorStatusRequest& req,
                                                       const rpc::CallContext&) -> Result<proto::ConductorStatusReply> {
      nlohmann::json j = scheduler_status(*sched_, req.with_instances);
      j["service"] = "mc-conductor";
      j["endpoint"] = endpoint();
      j["requests_dispatching"] = in_flight_.size();
      j["requests_held"] = held_.size();  // waiting for workers to register (--startup-hold-ms)
      j["requests_decoding"] = decoding_.size();
      nlohmann::json faults;
      for (const char* k : {"redispatched", "failed_by_instance_death", "reservations_released", "connection_lost"}) {
        faults[k] = fault_counter(k).value();
      }
      faults["loop_stalls"] = loop_stalls().value();
      faults["drain_notices"] = drain_notices().value();
      faults["instances_drained"] = instances_drained().value();
      int64_t draining_now = 0;
      for (Role role : {Role::kPrefill, Role::kDecode}) {
        for (const Instance* inst : sched_->cluster().instances(role)) draining_now += inst->draining ? 1 : 0;
      }
      faults["draining"] = draining_now;
      for (const char* k : {"heartbeat", "job_report", "prefill_ledger", "decode_step", "register"}) {
        faults["refused_" + std::string(k)] =
            metrics_
                .counter("mc_conductor_refused_" + std::string(k) + "_total", "refused " + std::string(k) + " values")
                .value();
      }
      j["faults"] = faults;
      nlohmann::json cancels;
      cancels["cancelled"] = cancelled_counter("").value();
      for (CancelStage st : {CancelStage::kDispatching, CancelStage::kPrefilling, CancelStage::kDecoding}) {
        cancels[std::string(cancel_stage_name(st))] = cancelled_counter(std::string(cancel_stage_name(st))).value();
      }
      cancels["unknown"] = cancel_unknown().value();
      j["cancels"] = cancels;
      j["index"]["planned_missing_tokens"] = planned_missing_tokens().value();
      j["index"]["planned_missing_requests"] = planned_missing_requests().value();
      return proto::ConductorStatusReply{j.dump()};
    });
  }

  static proto::ConductorSubmitReply reply_of(const Decision& d) {
    proto::ConductorSubmitReply r;
    r.request_id = d.request_id;
    r.accepted = d.accepted;
    r.prefill_id = d.prefill_id;
    r.decode_id = d.decode_id;
    r.predicted_ttft_ms = d.predicted_ttft_ms;
    r.predicted_tbt_ms = d.predicted_tbt_ms;
    r.hit_tokens = d.hit_tokens;
    r.pool_prefix_tokens = d.pool_prefix_tokens;
    r.replicate_prefix = d.replicate_prefix;
    r.reject_reason = d.accepted ? "" : std::string(reject_reason_name(d.reject_reason));
    r.reason = d.reason;
    return r;
  }

  void log_decision(const Request& r, const Decision& d, const proto::ConductorSubmitRequest& submit) {
    if (!decisions_.is_open()) return;
    nlohmann::json j = decision_record(r, d, sched_->last_estimates());
    j["ts_unix_ms"] = unix_time_ms();
    if (!submit.hash_ids.empty()) j["request"]["hash_ids"] = submit.hash_ids;
    decisions_ << j.dump() << '\n';
    decisions_.flush();
  }

  // The salt a tenant's request runs in: "tenant/<tenant>" by default, a namespace inside it ("tenant/<tenant>/...":
  // mc-gateway keeps each of its API keys' users in one, docs/SECURITY.md "Cache isolation"), or a shared namespace
  // `asked` that the tenant opted into (roster SHARED); kPermissionDenied for any other.
  static Result<std::string> tenant_salt(const auth::Identity& caller, const std::string& asked,
                                         const std::string& id) {
    const std::string own = "tenant/" + caller.tenant;
    if (asked.empty() || asked == own) return own;
    if (asked.size() > own.size() + 1 && asked.starts_with(own + "/")) return asked;
    for (const auto& ns : caller.shared) {
      if (asked == ns) return asked;
    }
    return Status(Code::kPermissionDenied, "submit '" + id + "' from " + caller.describe() + ": salt '" + asked +
                                               "' is another tenant's namespace or a shared one this tenant did not "
                                               "opt into (mc-auth init --shared)");
  }

  Result<proto::ConductorSubmitReply> on_submit(const proto::ConductorSubmitRequest& req, const rpc::CallContext& ctx) {
    if (req.request_id.size() > kMaxRequestIdBytes) {
      return error(Code::kInvalidArgument, "submit: request id of " + std::to_string(req.request_id.size()) +
                                               " bytes; at most " + std::to_string(kMaxRequestIdBytes) +
                                               " (use a shorter id)");
    }
    // Request ids are the submitter's (docs/SECURITY.md "Request ids"): only its own live request of the same id
    // is a duplicate. Another identity's equal id runs under an alias of its own, so a resubmit or a cancel never
    // reaches someone else's request.
    const std::string submitter = ctx.caller != nullptr ? ctx.caller->public_key : std::string();
    if (owned_live(submitter, req.request_id) != nullptr ||
        std::any_of(held_.begin(), held_.end(), [&](const HeldSubmit& h) {
          return h.req.request_id == req.request_id &&
                 (h.ctx.caller != nullptr ? h.ctx.caller->public_key : std::string()) == submitter;
        })) {
      return error(Code::kAlreadyExists, "request '" + req.request_id + "' of this client is still in flight");
    }
    RequestKeyScope scope{req.lora_name, req.lora_version, req.salt};
    MC_RETURN_IF_ERROR(validate_key_scope(scope, "submit '" + req.request_id + "'"));
    if (const std::string bad = proto::sampling_error(req.sampling); !bad.empty()) {
      return error(Code::kInvalidArgument, "submit '" + req.request_id + "': sampling: " + bad);
    }
    if (scope.empty()) scope = default_scope_;
    if (ctx.caller != nullptr && ctx.caller->role == auth::Role::kClient) {
      // Tenants (docs/SECURITY.md): a client's blocks are keyed in its tenant's salt, so its prefix matches only its
      // own tenant's KV, unless it names a shared namespace its tenant opted into.
      MC_ASSIGN_OR_RETURN(scope.salt, tenant_salt(*ctx.caller, req.salt, req.request_id));
    }
    // The request's namespace: the workers' base with its adapter and salt, so its prefix matches only
    // blocks computed by the same model with the same adapter, version and salt.
    const KeyNamespace ns = options_.key_namespace.with_request(scope);
    const std::string id = unused_id(req.request_id);
    MC_ASSIGN_OR_RETURN(Request r,
                        request_from_submit(id, req.input_tokens, req.output_tokens, req.tokens, req.block_hashes,
                                            req.block_size_tokens, req.slo_ttft_ms, req.slo_tbt_ms, ns));
    if (hold_for_workers(req, ctx)) return proto::ConductorSubmitReply{};  // ignored: deferred
    if (id != req.request_id) {
      MC_LOG_INFO << "request '" << req.request_id << "' of " << (ctx.caller ? ctx.caller->describe() : "a client")
                  << " runs as '" << id << "' (another client's request has that id)";
    }
    Decision d = sched_->decide(r);
    log_decision(r, d, req);
    if (!d.accepted) {
      metrics_.counter("mc_conductor_rejected_total", "requests rejected at submit").inc();
      proto::ConductorSubmitReply rep = reply_of(d);
      rep.request_id = req.request_id;
      return rep;
    }
    const Instance* p = sched_->cluster().find(d.prefill_id);
    const Instance* dec = sched_->cluster().find(d.decode_id);
    if (p == nullptr || dec == nullptr) return error(Code::kInternal, "chosen instance vanished");
    sched_->commit(r, d);
    ctx.defer();
    Flight f;
    f.ctx = ctx;
    f.submit_ns = RealClock::instance().now_ns();
    f.submit_unix_ns = now_unix_ns();
    f.submit = req;
    f.submit.request_id = id;
    f.client_request_id = req.request_id;
    f.decision = d;
    f.scope = scope;
    f.submitter_key = submitter;
    // With keys a client's server serves with its own key: reached on a socket of that key (rpc::keyed_endpoint).
    f.client_target = req.client_endpoint.empty() || ctx.caller == nullptr || ctx.caller->role != auth::Role::kClient
                          ? req.client_endpoint
                          : rpc::keyed_endpoint(req.client_endpoint, ctx.caller->public_key);
    f.slo_ttft_ms = d.slo_ttft_ms;
    f.request = r;
    f.prefill_endpoint = p->info.endpoint;
    f.decode_endpoint = dec->info.endpoint;
    if (d.replicate_prefix && !store_master_.empty()) {
      f.prefill_host = p->info.host;
      // Only blocks the pool holds now: a pending prefix (DESIGN.md §10) is still being computed.
      const size_t n =
          std::min(r.block_hashes.size(),
                   static_cast<size_t>(std::max<int64_t>(d.prefill.reused_blocks - d.prefill.pending_blocks, 0)));
      // The workers' store keys: "kv/<digest of the request's namespace>/<seq hash>"; the base's digest as a
      // worker told it when it named no namespace fields (adopt_key_namespace).
      const std::string digest = base_known_ || key_digest_.empty() ? ns.digest_hex() : key_digest_;
      for (size_t i = 0; i < n; ++i) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r.block_hashes[i]));
        f.replicate_keys.push_back("kv/" + digest + "/" + hex);
      }
    }
    in_flight_[id] = std::move(f);
    owned_[owner_key(submitter, req.request_id)] = id;
    reserve(id);
    return proto::ConductorSubmitReply{};  // ignored: deferred
  }

  // ---- Request ids per submitter (docs/SECURITY.md "Request ids", issue 51) ----
  // The Conductor's id of a live request is the client's when no other live request has it, else the client's with
  // "~" and 16 random hex digits: unique among live requests, and not guessable by another client. The workers see
  // only the Conductor's id; the client's events and replies carry its own.
  static std::string owner_key(const std::string& submitter, const std::string& client_id) {
    return submitter + '\n' + client_id;
  }
  bool id_in_use(const std::string& id) const { return in_flight_.count(id) != 0 || decoding_.count(id) != 0; }
  std::string unused_id(const std::string& client_id) {
    std::string id = client_id;
    while (id_in_use(id)) {
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id_rng_()));
      id = client_id + "~" + hex;
    }
    return id;
  }
  // The Conductor's id of `submitter`'s live request `client_id` ("" submitter: without keys), or nullptr. Entries
  // of ended requests are dropped here and by prune_owned().
  const std::string* owned_live(const std::string& submitter, const std::string& client_id) {
    auto it = owned_.find(owner_key(submitter, client_id));
    if (it == owned_.end()) return nullptr;
    const std::string& id = it->second;
    if (auto fl = in_flight_.find(id);
        fl != in_flight_.end() && fl->second.submitter_key == submitter && fl->second.client_request_id == client_id) {
      return &id;
    }
    if (auto dec = decoding_.find(id); dec != decoding_.end() && dec->second.submitter_key == submitter &&
                                       dec->second.client_request_id == client_id) {
      return &id;
    }
    owned_.erase(it);
    return nullptr;
  }
  void prune_owned() {
    if (owned_.size() <= 2 * (in_flight_.size() + decoding_.size()) + 1024) return;
    std::erase_if(owned_, [this](const auto& e) { return !id_in_use(e.second); });
  }

  // ---- Submits held at start-up (issue 48 item 6) ----
  // A (re)started Conductor knows no worker until each one heartbeats again and, told "unknown instance",
  // registers (within a heartbeat interval or two). A submit that finds no placeable prefill or decode instance in
  // that window (--startup-hold-ms) waits for one, bounded by it, kMaxHeldSubmits and kMaxHeldBytes, instead of being
  // rejected at once with no_prefill_instance: the replays and gateways that kept submitting through the outage would
  // otherwise lose their first requests to a Conductor that is only waking up. Past the window (or the bounds) it is
  // decided as before.
  struct HeldSubmit {
    proto::ConductorSubmitRequest req;
    rpc::CallContext ctx;
    size_t bytes = 0;  // held_bytes() of req
  };
  static size_t held_bytes(const proto::ConductorSubmitRequest& r) {
    return sizeof r + r.request_id.size() + r.tokens.size() * sizeof(uint32_t) +
           (r.hash_ids.size() + r.block_hashes.size()) * sizeof(uint64_t) + r.client_endpoint.size() +
           r.lora_name.size() + r.lora_version.size() + r.salt.size();
  }
  int64_t startup_grace_ns() const { return options_.startup_hold_ms * 1'000'000; }
  bool placeable_instance(Role role, int64_t now_ns) const {
    for (const Instance* inst : sched_->cluster().instances(role)) {
      if (placeable(*inst, now_ns, options_.scheduler.heartbeat_timeout_ms)) return true;
    }
    return false;
  }
  // Holds the submit (deferring its reply) when the Conductor is within its start-up window and a role has no
  // placeable instance yet; true when held.
  bool hold_for_workers(const proto::ConductorSubmitRequest& req, const rpc::CallContext& ctx) {
    const int64_t now = RealClock::instance().now_ns();
    const size_t bytes = held_bytes(req);
    if (now - started_ns_ >= startup_grace_ns() || held_.size() >= kMaxHeldSubmits ||
        held_bytes_ + bytes > kMaxHeldBytes) {
      return false;
    }
    if (placeable_instance(Role::kPrefill, now) && placeable_instance(Role::kDecode, now)) return false;
    ctx.defer();
    held_.push_back({req, ctx, bytes});
    held_bytes_ += bytes;
    return true;
  }
  // Submits the held requests again (after a registration, and when the window ends): each is dispatched,
  // rejected, or held once more while the window lasts.
  void release_held() {
    if (held_.empty()) return;
    std::deque<HeldSubmit> held;
    held.swap(held_);
    held_bytes_ = 0;
    MC_LOG_INFO << "mc-conductor: submitting " << held.size() << " request(s) held while the workers registered";
    for (HeldSubmit& h : held) {
      rpc::CallContext ctx = h.ctx;
      ctx.deferred = false;
      Result<proto::ConductorSubmitReply> r = on_submit(h.req, ctx);
      if (ctx.deferred) continue;  // dispatched (answered when the reservation holds) or held again
      const Status st = r.is_ok() ? server_->reply_to(ctx, r.value()) : server_->reply_error_to(ctx, r.status());
      if (!st.is_ok()) MC_LOG_WARN << "reply to submit '" << h.req.request_id << "': " << st.message();
    }
  }

  void answer(Flight& f, proto::ConductorSubmitReply reply) {
    if (f.answered) return;
    f.answered = true;
    reply.request_id = f.client_request_id;  // the client's id, not the Conductor's
    Status st = server_->reply_to(f.ctx, reply);
    if (!st.is_ok()) MC_LOG_WARN << "reply to submit '" << f.submit.request_id << "': " << st.message();
  }

  // The flight of `id` when `attempt` is still its current attempt, else null (a late callback of an attempt
  // that a worker's death replaced).
  Flight* current(const std::string& id, int attempt) {
    auto it = in_flight_.find(id);
    return it == in_flight_.end() || it->second.attempt != attempt ? nullptr : &it->second;
  }

  bool draining(const std::string& instance_id) const {
    const Instance* inst = sched_->cluster().find(instance_id);
    return inst != nullptr && inst->draining;
  }
  static bool transport_failure(const Status& st) {
    return st.code() == Code::kTimeout || st.code() == Code::kUnavailable;
  }

  void reserve(const std::string& id) {
    Flight& f = in_flight_.at(id);
    f.stage = Stage::kReserving;
    f.reservation_held = false;
    proto::DecodeReserveRequest rr;
    rr.request_id = id;
    rr.client_request_id = f.client_request_id;
    rr.input_length_tokens = static_cast<int64_t>(f.submit.tokens.size());
    rr.output_length_tokens = f.submit.output_tokens;
    rr.client_endpoint = f.submit.client_endpoint;
    if (f.ctx.caller != nullptr && f.ctx.caller->role == auth::Role::kClient) {
      rr.client_public_key = f.ctx.caller->public_key;
    }
    rr.lora_name = f.scope.lora_name;
    rr.lora_version = f.scope.lora_version;
    rr.salt = f.scope.salt;
    rr.sampling = f.submit.sampling;
    calls_.call<proto::DecodeReserveRequest>(
        f.decode_endpoint, rr, options_.reserve_timeout_ms,
        [this, id, attempt = f.attempt, ep = f.decode_endpoint](Result<proto::DecodeReserveReply> res) {
          on_reserved(id, attempt, ep, std::move(res));
        });
  }

  void on_reserved(const std::string& id, int attempt, const std::string& decode_endpoint,
                   Result<proto::DecodeReserveReply> res) {
    Flight* fp = current(id, attempt);
    if (fp == nullptr) {
      // The attempt was given up (its prefill instance died): a reservation made meanwhile is freed at once.
      if (res.is_ok()) release_reservation(decode_endpoint, res->reservation_id, id, nullptr);
      return;
    }
    Flight& f = *fp;
    if (!res.is_ok()) {
      if (draining(f.decision.decode_id)) {
        // The drain notice crossed this reservation: the request is placed again elsewhere, as after a death.
        MC_LOG_INFO << "request '" << id << "': draining decode instance " << f.decision.decode_id
                    << " refused the reservation; placing it again";
        return apply_faults(f.decision.decode_id, "drains (refused decode.reserve: " + res.status().message() + ")",
                            {tracked(id, f)});
      }
      if (transport_failure(res.status())) {
        return on_instance_lost(f.decision.decode_id, "did not answer decode.reserve (" + res.status().message() + ")");
      }
      // Refused before any prefill started: the client hears it as a rejection. A re-dispatch's submit was answered
      // (accepted) long ago: its client hears a request_error instead, its terminal event.
      metrics_.counter("mc_conductor_decode_refused_total", "decode_reserve refused or failed").inc();
      proto::ConductorSubmitReply r = reply_of(f.decision);
      r.accepted = false;
      r.reject_reason = "decode_refused";
      r.reason = "decode instance " + f.decision.decode_id + " refused the KV reservation: " + res.status().message();
      MC_LOG_WARN << "request '" << id << "': " << r.reason;
      if (f.answered)
        return fail_flight(id, f.fault_cause + " before the first token: re-dispatched, then " + r.reason);
      sched_->on_request_done(id);
      answer(f, r);
      in_flight_.erase(id);
      return;
    }
    f.reservation = std::move(res).value();
    f.reservation_held = true;
    if (f.replicate_keys.empty()) return dispatch(id);
    // Hot prefix on an overloaded holder (Decision::replicate_prefix): ask the store master to copy the reused
    // blocks near the chosen prefill instance before it reads them; its store client makes the copy on that
    // read (master_core.hpp replicate_near), so the next request finds a same-host copy. A failure only
    // loses the copy, never the request.
    f.stage = Stage::kReplicating;
    proto::StoreReplicateNearRequest rn;
    rn.keys = f.replicate_keys;
    rn.host = f.prefill_host;
    calls_.call<proto::StoreReplicateNearRequest>(
        store_master_, rn, options_.store_timeout_ms, [this, id, attempt](Result<proto::StoreReplicateNearReply> r) {
          if (r.is_ok()) {
            metrics_
                .counter("mc_conductor_replicated_blocks_total",
                         "prefix blocks the store master was asked to copy near the chosen prefill instance")
                .inc(r->marked);
          } else {
            MC_LOG_WARN << "request '" << id << "': store.replicate_near at " << store_master_
                        << " failed (the prefix is read remotely, not copied): " << r.status().message();
          }
          if (current(id, attempt) != nullptr) dispatch(id);
        });
  }

  void dispatch(const std::string& id) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    Flight& f = it->second;
    f.stage = Stage::kPrefilling;
    const proto::DecodeReserveReply& res = f.reservation;
    proto::PrefillJobRequest job;
    job.request_id = id;
    job.tokens = f.submit.tokens;
    job.output_length_tokens = f.submit.output_tokens;
    job.fetch_prefix_blocks = f.decision.prefill.reused_blocks;
    job.prefix_source =
        f.decision.prefill.reused_blocks == 0 ? "recompute"
        : f.decision.prefill.blocks_by_class[static_cast<int>(PathClass::kSameHost)] == f.decision.prefill.reused_blocks
            ? "same_host"
            : "pool";
    job.decode_endpoint = f.decode_endpoint;
    job.reservation_id = res.reservation_id;
    job.decode_block_offsets_bytes = res.block_offsets_bytes;
    job.decode_kv_segment = res.kv_segment;  // the prefill WRITEs each layer there (transfer engine)
    job.decode_kv_grant = res.kv_grant;      // ... with decode's grant for the reservation's blocks
    job.client_endpoint = f.submit.client_endpoint;
    job.lora_name = f.scope.lora_name;
    job.lora_version = f.scope.lora_version;
    job.salt = f.scope.salt;
    job.sampling = f.submit.sampling;
    job.queue_key_ns = std::max<int64_t>(0, f.decision.prefill.queue_key_ns);  // the queue discipline's order
    f.dispatch_ns = RealClock::instance().now_ns();
    if (!f.decision.stages.empty()) return dispatch_stages(f, std::move(job));
    answer(f, reply_of(f.decision));
    metrics_.counter("mc_conductor_dispatched_total", "requests dispatched to a prefill instance").inc();
    calls_.call<proto::PrefillJobRequest>(f.prefill_endpoint, job, options_.job_timeout_ms,
                                          [this, id, attempt = f.attempt](Result<proto::PrefillJobReply> r) {
                                            const Flight* g = current(id, attempt);
                                            if (g != nullptr && g->stage == Stage::kPrefilling)
                                              on_prefill_reply(id, std::move(r));
                                          });
  }

  // A pipelined prefill (Decision::stages, DESIGN.md §18 "Live groups"): one stage job per member, each naming its
  // layers and the next stage's endpoint; the last stage's reply is the request's prefill reply. A failed stage
  // settles the request at once as a failed prefill does (the stage aborted the decode reservation; decode_release
  // tells whether the client heard it, else the request is placed again); the later stages' replies then find it
  // settled and are dropped.
  void dispatch_stages(Flight& f, proto::PrefillJobRequest job) {
    const std::string id = job.request_id;
    const std::vector<StageEstimate>& stages = f.decision.stages;
    std::vector<std::string> endpoints;
    for (const StageEstimate& st : stages) {
      const Instance* inst = sched_->cluster().find(st.instance_id);
      if (inst == nullptr) {
        // Gone between the decision and the reservation: as for a lead that died then.
        return release_then_decide(id, st.instance_id, "left the cluster before its pipeline stage was sent");
      }
      endpoints.push_back(inst->info.endpoint);
    }
    answer(f, reply_of(f.decision));
    metrics_.counter("mc_conductor_dispatched_total", "requests dispatched to a prefill instance").inc();
    metrics_.counter("mc_conductor_pipelined_total", "requests dispatched as a pipelined prefill group").inc();
    job.chunk_tokens = sched_->config().pipeline.chunk_tokens;
    job.stage_count = static_cast<int64_t>(stages.size());
    // The last stage first: its job is queued (waiting for chunks) before the first chunk can reach it.
    for (size_t k = stages.size(); k-- > 0;) {
      proto::PrefillJobRequest sj = job;
      sj.stage_index = static_cast<int64_t>(k);
      sj.stage_first_layer = stages[k].first_layer;
      sj.stage_layers = stages[k].layers;
      sj.next_stage_endpoint = k + 1 < stages.size() ? endpoints[k + 1] : "";
      const bool last = k + 1 == stages.size();
      calls_.call<proto::PrefillJobRequest>(
          endpoints[k], sj, options_.job_timeout_ms,
          [this, id, attempt = f.attempt, last, stage_id = stages[k].instance_id](Result<proto::PrefillJobReply> r) {
            const Flight* g = current(id, attempt);
            if (g == nullptr || g->stage != Stage::kPrefilling) return;
            if (r.is_ok() && !last) {
              sched_->on_stage_done(stage_id, id);
              return;
            }
            if (last || stage_id == g->decision.prefill_id) return on_prefill_reply(id, std::move(r));
            // A failed stage other than the lead (whose failure on_prefill_reply handles as any prefill's).
            metrics_.counter("mc_conductor_prefill_failed_total", "prefill jobs that failed or timed out").inc();
            MC_LOG_WARN << "request '" << id << "': pipeline stage on " << stage_id
                        << " failed: " << r.status().message();
            const bool lost = transport_failure(r.status()) && !draining(stage_id);
            PrefillReport rep;
            rep.request_id = id;
            rep.instance_id = g->decision.prefill_id;
            rep.ok = false;
            sched_->on_prefill_done(rep);
            release_then_decide(id, stage_id, "failed its pipeline stage (" + r.status().message() + ")");
            if (lost) on_instance_lost(stage_id, "did not answer prefill.job (" + r.status().message() + ")");
          });
    }
  }

  void on_prefill_reply(const std::string& id, Result<proto::PrefillJobReply> res) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    Flight& f = it->second;
    PrefillReport rep;
    rep.request_id = id;
    rep.instance_id = f.decision.prefill_id;
    if (!res.is_ok() && f.cancelled) {
      // The cancel's own doing (kCancelled: dropped from the queue, or its commit refused by decode), or any other
      // end of a job nobody waits for: never an instance fault, never a re-dispatch.
      MC_LOG_INFO << "request '" << id << "' (cancelled): its prefill job on " << f.decision.prefill_id
                  << " ended: " << res.status().message();
      rep.ok = false;
      sched_->on_prefill_done(rep);
      in_flight_.erase(it);
      return;
    }
    if (!res.is_ok()) {
      metrics_.counter("mc_conductor_prefill_failed_total", "prefill jobs that failed or timed out").inc();
      MC_LOG_WARN << "request '" << id << "': prefill on " << f.decision.prefill_id
                  << " failed: " << res.status().message();
      // A draining instance answers kUnavailable for a job it refused or ended at its drain timeout: the instance is
      // not lost (its exit, watched, ends it), the request is settled as below.
      if (transport_failure(res.status()) && !draining(f.decision.prefill_id)) {
        return on_instance_lost(f.decision.prefill_id, "did not answer prefill.job (" + res.status().message() + ")");
      }
      // The prefill aborted the reservation when it could (decode then told the client); whether it could is
      // what decode_release says.
      rep.ok = false;
      sched_->on_prefill_done(rep);
      release_then_decide(id, f.decision.prefill_id, "failed the prefill job (" + res.status().message() + ")");
      return;
    }
    const proto::RequestLedger& l = res->ledger;
    rep.prefilled_tokens = l.computed_tokens;
    rep.reused_tokens = l.hit_tokens;
    // Planned hits the worker found missing (or failed to read) and recomputed: a stale index, field report 24.
    if (l.missed_prefix_tokens > 0 && l.missed_prefix_tokens <= kMaxReportedCount) {
      planned_missing_tokens().inc(static_cast<uint64_t>(l.missed_prefix_tokens));
      planned_missing_requests().inc();
    }
    count_ledger(l);
    const double scale = options_.time_scale;
    rep.prefill_ms = static_cast<double>(l.prefill_ms) * scale;
    if (l.prefill_ms < 0) rep.prefill_ms = -1;  // not measured: the refit ignores it
    // A pipeline's span (the last stage's, waits included) is no sample of one instance's pass, and its fetch was
    // the last stage's share: neither refits anything (scheduler.hpp on_stage_done).
    const bool pipelined = !f.decision.stages.empty();
    if (pipelined) rep.prefill_ms = -1;
    // Absurd phase times (issue 17 item 5) refit nothing and are not counted as a TTFT.
    bool sane = true;
    for (int64_t part : {l.queue_ms, l.fetch_ms, l.prefill_ms, l.kv_tail_ms}) {
      sane = sane && part >= -1 && static_cast<double>(part) <= kMaxReportedMs;
    }
    if (!sane) {
      refused("prefill_ledger", "prefill ledger of '" + id + "' from " + f.decision.prefill_id +
                                    ": a phase time outside [-1, 3600000] ms (ignored for the refit)");
      rep.prefill_ms = -1;
    }
    // Bandwidth samples (not in a time-scaled cluster): the SSD reads are timed on their own; a fetch from one
    // DRAM path class only, with no SSD part, is a clean sample of that class, and when its remote bytes all came
    // from one host, of the path from there (DESIGN.md §16 "Bandwidth decides, live"). The bytes are the model's
    // (tokens x the scheduler's kv_bytes_per_token), as the scheduler prices them: a sim worker storing fewer
    // bytes per token on links scaled down by the same factor measures the modelled bandwidth.
    const int64_t kv_bytes_per_token = sched_->config().kv.kv_bytes_per_token;
    auto model_bytes = [&](int64_t tokens) {
      return tokens > 0 && tokens <= kMaxReportedCount ? tokens * kv_bytes_per_token : 0;
    };
    if (sane && !pipelined && scale == 1.0 && l.fetch_ssd_bytes > 0 && l.fetch_ssd_us > 0 &&
        static_cast<double>(l.fetch_ssd_us) <= kMaxReportedMs * 1000) {
      rep.transfer_bytes[static_cast<int>(PathClass::kSsd)] = model_bytes(l.hit_tokens_ssd);
      rep.transfer_ns[static_cast<int>(PathClass::kSsd)] = l.fetch_ssd_us * 1'000;
    }
    const int64_t fetch_us = l.fetch_us > 0 ? l.fetch_us : l.fetch_ms * 1'000;
    if (sane && !pipelined && scale == 1.0 && l.fetch_bytes > 0 && fetch_us > 0 &&
        static_cast<double>(fetch_us) <= kMaxReportedMs * 1000 && l.fetch_ssd_bytes == 0) {
      const bool local = l.hit_tokens_local > 0, remote = l.hit_tokens_remote > 0;
      if (local != remote) {
        int c = local ? static_cast<int>(PathClass::kSameHost) : static_cast<int>(PathClass::kRemote);
        rep.transfer_bytes[c] = model_bytes(local ? l.hit_tokens_local : l.hit_tokens_remote);
        rep.transfer_ns[c] = fetch_us * 1'000;
        if (remote && l.fetch_remote_host.size() <= 255 /* a DNS name's limit */)
          rep.remote_source_host = l.fetch_remote_host;
      }
    }
    sched_->on_prefill_done(rep);
    if (f.cancelled) {
      // Its prefill ran to the end (refitting the model above); decode refused the commit or stopped it.
      in_flight_.erase(it);
      return;
    }
    if (sane) {
      // Actual TTFT on the Conductor's clock up to dispatch, then the worker's measured phases (its reply
      // only comes after the new blocks are stored, which is not on the first token's path).
      double ttft = static_cast<double>(f.dispatch_ns - f.submit_ns) * 1e-6;
      for (int64_t part : {l.queue_ms, l.fetch_ms, l.prefill_ms, l.kv_tail_ms}) {
        if (part > 0) ttft += static_cast<double>(part);
      }
      ttft *= scale;
      sched_->on_first_token(id, ttft);
      metrics_.histogram("mc_conductor_ttft_seconds", metrics::latency_buckets_s(), "measured TTFT")
          .observe(ttft * 1e-3);
    }
    to_decoding(id);  // the decode ledger entry stays until done or its predicted end
  }

  // The request's KV is at its decode instance (or its abort was told to the client there): it leaves the
  // dispatch and is tracked as decoding until mc-decode reports its end.
  void to_decoding(const std::string& id) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    const Flight& f = it->second;
    if (!f.decode_finished) {
      decoding_[id] = Decoding{f.client_target,      f.decision.prefill_id, f.decision.decode_id,
                               f.submit_ns,          f.submit_unix_ns,      RealClock::instance().now_ns(),
                               f.last_event_unix_ns, f.decode_endpoint,     f.submitter_key,
                               f.client_request_id};
    }
    in_flight_.erase(it);
  }

  // decode_release of a reservation that will get no (further) job; `then` (may be null) gets the reply.
  void release_reservation(const std::string& decode_endpoint, uint64_t reservation_id, const std::string& id,
                           std::function<void(Result<proto::DecodeReleaseReply>)> then) {
    calls_.call<proto::DecodeReleaseRequest>(
        decode_endpoint, proto::DecodeReleaseRequest{reservation_id}, options_.reserve_timeout_ms,
        [this, id, decode_endpoint, then = std::move(then)](Result<proto::DecodeReleaseReply> r) {
          if (r.is_ok() && r->released) fault_counter("reservations_released").inc();
          if (!r.is_ok()) {
            MC_LOG_WARN << "request '" << id << "': decode.release at " << decode_endpoint
                        << " failed: " << r.status().message();
          }
          if (then) then(std::move(r));
        });
  }

  // A request whose prefill failed or whose prefill instance died while its KV may have been committed: the
  // decode instance's answer to decode_release tells. Released: nothing reached the client, and faults.hpp
  // decides as for a request never dispatched; not released: the prefill aborted it (decode told the client)
  // or committed it (decode streams it); no answer: the decode instance is lost too.
  void release_then_decide(const std::string& id, const std::string& instance_id, const std::string& cause) {
    Flight& f = in_flight_.at(id);
    f.stage = Stage::kReleasing;
    release_reservation(f.decode_endpoint, f.reservation.reservation_id, id,
                        [this, id, attempt = f.attempt, instance_id, cause](Result<proto::DecodeReleaseReply> r) {
                          Flight* g = current(id, attempt);
                          if (g == nullptr) return;
                          if (g->cancelled) {
                            // Cancelled meanwhile: decode_cancel stopped whatever decode held; nothing to decide.
                            in_flight_.erase(id);
                            return;
                          }
                          if (!r.is_ok()) {
                            if (transport_failure(r.status())) {
                              on_instance_lost(g->decision.decode_id,
                                               "did not answer decode.release (" + r.status().message() + ")");
                            } else {
                              fail_flight(id, "instance '" + instance_id + "' " + cause +
                                                  ", and the reservation's state is unknown: " + r.status().message());
                            }
                            return;
                          }
                          if (!r->released) return to_decoding(id);
                          g->stage = Stage::kReserving;  // unconsumed: as if never dispatched
                          g->reservation_held = false;
                          apply_faults(instance_id, cause, {tracked(id, *g)});
                        });
  }

  // ---- conductor.cancel (DESIGN.md §10 "Cancel"; faults.hpp plan_cancel decides, this applies) ----
  metrics::Counter& cancelled_counter(const std::string& stage) {
    if (stage.empty()) return metrics_.counter("mc_conductor_cancelled_total", "requests cancelled by their client");
    return metrics_.counter("mc_conductor_cancelled_" + stage + "_total",
                            "requests cancelled by their client in stage " + stage);
  }
  metrics::Counter& cancel_unknown() {
    return metrics_.counter("mc_conductor_cancel_unknown_total",
                            "cancels of requests not in flight (finished, failed or never submitted)");
  }
  void count_cancel(CancelStage stage) {
    cancelled_counter("").inc();
    cancelled_counter(std::string(cancel_stage_name(stage))).inc();
  }

  // Only the identity that submitted a request cancels it (an admin key any); no check without keys.
  static Status check_canceller(const rpc::CallContext& ctx, const std::string& submitter_key, const std::string& id) {
    if (ctx.caller == nullptr || ctx.caller->role == auth::Role::kAdmin) return Status::ok();
    if (!submitter_key.empty() && ctx.caller->public_key == submitter_key) return Status::ok();
    return Status(Code::kPermissionDenied, "conductor.cancel '" + id + "' from " + ctx.caller->describe() +
                                               ": the request was submitted by another identity; only its "
                                               "submitter (or an admin key) may cancel it");
  }

  void send_decode_cancel(const std::string& decode_endpoint, const std::string& id) {
    calls_.call<proto::DecodeCancelRequest>(decode_endpoint, proto::DecodeCancelRequest{id},
                                            options_.reserve_timeout_ms,
                                            [id, decode_endpoint](Result<proto::DecodeCancelReply> r) {
                                              // A decode instance that does not answer is found by its watched
                                              // connection or its heartbeats.
                                              if (!r.is_ok()) {
                                                MC_LOG_WARN << "request '" << id << "': decode_cancel at "
                                                            << decode_endpoint << " failed: " << r.status().message();
                                              }
                                            });
  }

  // The request's books close now (on_request_done), whatever its stage: it is never dispatched or re-dispatched
  // again, and its cancel is its one terminal outcome. A prefill job in flight is told (prefill_cancel) and the
  // reply waits for its answer: "dispatching" when the prefill instance dropped it from its queue.
  Result<proto::ConductorCancelReply> on_cancel(const proto::ConductorCancelRequest& req, const rpc::CallContext& ctx) {
    // The caller names its own request by the id it submitted; an admin also any request by the Conductor's id.
    const std::string client_id = req.request_id;
    const std::string submitter = ctx.caller != nullptr ? ctx.caller->public_key : std::string();
    std::string id;
    if (const std::string* own = owned_live(submitter, client_id); own != nullptr) {
      id = *own;
    } else if (id_in_use(client_id)) {
      id = client_id;  // someone's: an admin's to cancel, anyone else is refused below
    } else {
      cancel_unknown().inc();
      return proto::ConductorCancelReply{client_id, std::string(cancel_stage_name(CancelStage::kUnknown))};
    }
    auto fl = in_flight_.find(id);
    auto dec = decoding_.find(id);
    if (Status who = check_canceller(ctx, fl != in_flight_.end() ? fl->second.submitter_key : dec->second.submitter_key,
                                     client_id);
        !who.is_ok()) {
      refused("cancel", who.message());
      return who;
    }
    if (fl != in_flight_.end() && fl->second.cancelled) {  // cancelled before: answered alike, counted once
      return proto::ConductorCancelReply{client_id, std::string(cancel_stage_name(fl->second.cancel_stage))};
    }
    if (dec != decoding_.end()) {
      TrackedRequest t;
      t.request_id = id;
      t.phase = RequestPhase::kDecoding;
      const CancelPlan plan = plan_cancel(&t, false, true);
      sched_->on_request_done(id);
      if (plan.cancel_decode) send_decode_cancel(dec->second.decode_endpoint, id);
      decoding_.erase(dec);
      count_cancel(plan.stage);
      MC_LOG_INFO << "request '" << id << "' cancelled by its client while decoding";
      return proto::ConductorCancelReply{client_id, std::string(cancel_stage_name(plan.stage))};
    }
    Flight& f = fl->second;
    const TrackedRequest t = tracked(id, f);
    const CancelPlan plan = plan_cancel(&t, f.stage == Stage::kPrefilling, f.answered);
    MC_LOG_INFO << "request '" << id << "' cancelled by its client while " << cancel_stage_name(plan.stage);
    sched_->on_request_done(id);
    if (plan.release_reservation) {
      release_reservation(f.decode_endpoint, f.reservation.reservation_id, id, nullptr);
    }
    if (plan.cancel_decode) send_decode_cancel(f.decode_endpoint, id);
    if (plan.reject_submit) {
      proto::ConductorSubmitReply r = reply_of(f.decision);
      r.accepted = false;
      r.reject_reason = "cancelled";
      r.reason = "request '" + client_id + "' was cancelled by its client before its prefill was dispatched";
      answer(f, r);
    }
    if (!plan.wait_for_reply) {
      // A reservation still being made is released when its answer finds no current attempt (on_reserved).
      in_flight_.erase(fl);
      count_cancel(plan.stage);
      return proto::ConductorCancelReply{client_id, std::string(cancel_stage_name(plan.stage))};
    }
    f.cancelled = true;
    f.cancel_stage = plan.stage;
    if (!plan.cancel_prefill) {
      count_cancel(plan.stage);
      return proto::ConductorCancelReply{client_id, std::string(cancel_stage_name(plan.stage))};
    }
    ctx.defer();
    // A pipelined prefill: every other stage drops its queued job too (the lead's answer decides the stage).
    for (const StageEstimate& st : f.decision.stages) {
      const Instance* inst = sched_->cluster().find(st.instance_id);
      if (st.instance_id == f.decision.prefill_id || inst == nullptr) continue;
      calls_.call<proto::PrefillCancelRequest>(inst->info.endpoint, proto::PrefillCancelRequest{id},
                                               options_.reserve_timeout_ms,
                                               [](const Result<proto::PrefillCancelReply>&) {});
    }
    calls_.call<proto::PrefillCancelRequest>(
        f.prefill_endpoint, proto::PrefillCancelRequest{id}, options_.reserve_timeout_ms,
        [this, id, client_id, ctx, prefill_id = f.decision.prefill_id](Result<proto::PrefillCancelReply> r) {
          CancelStage stage = CancelStage::kPrefilling;
          if (r.is_ok() && r->dropped) {
            stage = CancelStage::kDispatching;  // it never started: nothing ran for it
          } else if (!r.is_ok()) {
            MC_LOG_WARN << "request '" << id << "': prefill_cancel at " << prefill_id
                        << " failed (decode refuses its commit anyway): " << r.status().message();
          }
          if (auto it = in_flight_.find(id); it != in_flight_.end() && it->second.cancelled) {
            it->second.cancel_stage = stage;
          }
          count_cancel(stage);
          Status st =
              server_->reply_to(ctx, proto::ConductorCancelReply{client_id, std::string(cancel_stage_name(stage))});
          if (!st.is_ok()) MC_LOG_WARN << "reply to cancel '" << client_id << "': " << st.message();
        });
    return proto::ConductorCancelReply{};  // ignored: deferred
  }

  // The cache ledger of the cluster as counters (DESIGN.md §5): the sums of the prefill instances' job reports.
  // A report with a count outside [0, kMaxReportedCount] adds nothing.
  void count_ledger(const proto::RequestLedger& l) {
    const int64_t parts[] = {l.prompt_tokens,   l.hit_tokens_local, l.hit_tokens_remote, l.hit_tokens_ssd,
                             l.computed_tokens, l.fetch_bytes,      l.fetch_ssd_bytes,   l.kv_sent_bytes};
    for (int64_t v : parts) {
      if (v < 0 || v > kMaxReportedCount) return;
    }
    auto add = [&](const char* name, const char* help, int64_t v) {
      metrics_.counter(name, help).inc(static_cast<uint64_t>(v));
    };
    add("mc_conductor_prompt_tokens_total", "prompt tokens of the prefill jobs reported", l.prompt_tokens);
    add("mc_conductor_hit_tokens_local_total", "prompt tokens whose KV came from a replica on the prefill's host",
        l.hit_tokens_local);
    add("mc_conductor_hit_tokens_remote_total", "prompt tokens whose KV came from another node's DRAM",
        l.hit_tokens_remote);
    add("mc_conductor_hit_tokens_ssd_total", "prompt tokens whose KV came from a storage node's SSD", l.hit_tokens_ssd);
    add("mc_conductor_computed_tokens_total", "prompt tokens prefilled (not reused)", l.computed_tokens);
    add("mc_conductor_fetch_bytes_total", "KV bytes the prefill instances read from the store", l.fetch_bytes);
    add("mc_conductor_fetch_ssd_bytes_total", "of those, bytes read from SSD segments", l.fetch_ssd_bytes);
    add("mc_conductor_kv_sent_bytes_total", "KV bytes the prefill instances streamed to decode", l.kv_sent_bytes);
  }

  // ---- worker faults (faults.hpp decides, this applies) ----
  // Counters named in more than one place (the stat document, the metrics, where they count).
  metrics::Counter& planned_missing_tokens() {
    return metrics_.counter("mc_conductor_planned_missing_tokens_total",
                            "prefix tokens planned as hits that the prefill found missing and recomputed");
  }
  metrics::Counter& planned_missing_requests() {
    return metrics_.counter("mc_conductor_planned_missing_requests_total", "requests with planned hits found missing");
  }
  metrics::Counter& loop_stalls() {
    return metrics_.counter("mc_conductor_loop_stalls_total", "passes of the main loop more than 250 ms apart");
  }

  // Drains (DESIGN.md §10 "Drain"), counted apart from the deaths.
  metrics::Counter& drain_notices() {
    return metrics_.counter("mc_conductor_drain_notices_total",
                            "conductor.drain notices: instances that stopped taking new requests (SIGTERM)");
  }
  metrics::Counter& instances_drained() {
    return metrics_.counter("mc_conductor_instances_drained_total",
                            "draining instances whose process then exited (a drain's end, not a death)");
  }

  metrics::Counter& fault_counter(const std::string& what) {
    return metrics_.counter("mc_conductor_" + what + "_total", "worker faults: " + what);
  }
  // A refused report or reply value (issue 17 item 5): counted by kind and logged (rate-limited by count).
  void refused(const std::string& kind, const std::string& message, uint64_t n = 1) {
    metrics::Counter& c = metrics_.counter("mc_conductor_refused_" + kind + "_total", "refused " + kind + " values");
    c.inc(n);
    if (log::nth_worth_logging(c.value())) MC_LOG_WARN << message << " (" << c.value() << " refused)";
  }

  static TrackedRequest tracked(const std::string& id, const Flight& f) {
    TrackedRequest t;
    t.request_id = id;
    t.prefill_id = f.decision.prefill_id;
    t.decode_id = f.decision.decode_id;
    t.phase = f.stage == Stage::kReleasing ? RequestPhase::kReleasing : RequestPhase::kDispatching;
    t.submit_ns = f.submit_ns;
    t.slo_ttft_ms = f.slo_ttft_ms;
    t.attempts = f.attempt;
    t.reservation_held = f.reservation_held;
    return t;
  }

  // `instance_id` is gone (missed heartbeats, or a call to it failed on transport): it leaves the scheduler,
  // and every request it touches is re-dispatched or failed at once (faults.hpp).
  // The watched connection to `endpoint` closed: every instance registered there is lost at once.
  void on_connection_lost(const std::string& endpoint) {
    std::vector<std::string> ids;
    for (Role role : {Role::kPrefill, Role::kDecode}) {
      for (const Instance* inst : sched_->cluster().instances(role)) {
        if (inst->info.endpoint == endpoint) ids.push_back(inst->info.id);
      }
    }
    if (ids.empty()) calls_.unwatch(endpoint);  // nobody registered there any more
    for (const std::string& id : ids) {
      const Instance* inst = sched_->cluster().find(id);
      if (inst != nullptr && inst->draining) {
        // A drain's end: counted apart from the deaths. What it still held (its drain timed out) is settled as for
        // a death: re-dispatched or failed.
        instances_drained().inc();
        MC_LOG_INFO << "instance '" << id << "' drained and exited after "
                    << (RealClock::instance().now_ns() - inst->draining_since_ns) / 1'000'000 << " ms";
        on_instance_lost(id, "exited after draining (SIGTERM)");
        continue;
      }
      fault_counter("connection_lost").inc();
      on_instance_lost(id, "closed its connection at " + endpoint + " (the process exited or was killed)");
    }
  }

  void on_instance_lost(const std::string& instance_id, const std::string& cause) {
    if (const Instance* inst = sched_->cluster().find(instance_id); inst != nullptr) {
      MC_LOG_WARN << "instance '" << instance_id << "' " << cause << ": removed with its cached blocks";
      calls_.unwatch(inst->info.endpoint);  // watched again when it registers again
      (void)sched_->remove_instance(instance_id);
    }
    std::vector<TrackedRequest> touched;
    for (const auto& [id, f] : in_flight_) touched.push_back(tracked(id, f));
    for (const auto& [id, d] : decoding_) {
      TrackedRequest t;
      t.request_id = id;
      t.prefill_id = d.prefill_id;
      t.decode_id = d.decode_id;
      t.phase = RequestPhase::kDecoding;
      touched.push_back(std::move(t));
    }
    apply_faults(instance_id, cause, touched);
  }

  void apply_faults(const std::string& instance_id, const std::string& cause,
                    const std::vector<TrackedRequest>& requests) {
    const int64_t now = RealClock::instance().now_ns();
    for (const FaultDecision& d : decide_instance_death(requests, instance_id, cause, now, fault_config_)) {
      MC_LOG_WARN << "request '" << d.request_id << "': " << d.reason;
      auto dec = decoding_.find(d.request_id);
      if (dec != decoding_.end()) {
        send_client_error(dec->second.client_endpoint, dec->second.client_request_id, d.reason);
        sched_->on_request_done(d.request_id);
        decoding_.erase(dec);
        fault_counter("failed_by_instance_death").inc();
        continue;
      }
      auto it = in_flight_.find(d.request_id);
      if (it == in_flight_.end()) continue;
      Flight& f = it->second;
      if (f.cancelled) {
        // Settled by its cancel already (and decode told): the instance's death only closes the record.
        sched_->on_prefill_done(
            PrefillReport{.request_id = d.request_id, .instance_id = f.decision.prefill_id, .ok = false});
        in_flight_.erase(it);
        continue;
      }
      if (d.action == FaultAction::kRedispatch && d.release_reservation && f.stage == Stage::kPrefilling) {
        sched_->on_prefill_done(
            PrefillReport{.request_id = d.request_id, .instance_id = f.decision.prefill_id, .ok = false});
        release_then_decide(d.request_id, instance_id, cause);  // the prefill may have committed just before
        continue;
      }
      // The old attempt's ledger entries (prefill queue, decode reservation) go now; its late callbacks are
      // ignored from here on (the attempt number changes below or the flight ends).
      sched_->on_prefill_done(
          PrefillReport{.request_id = d.request_id, .instance_id = f.decision.prefill_id, .ok = false});
      sched_->on_request_done(d.request_id);
      if (d.release_reservation)
        release_reservation(f.decode_endpoint, f.reservation.reservation_id, d.request_id, nullptr);
      ++f.attempt;
      if (d.action == FaultAction::kRedispatch) {
        redispatch(d.request_id, d.remaining_ttft_ms, d.instance_cause);
      } else {
        fail_flight(d.request_id, d.reason);
      }
    }
  }

  // A new decision for a request whose attempt was lost (`why`: the instance and the cause), with the TTFT budget
  // that is left.
  void redispatch(const std::string& id, double remaining_ttft_ms, const std::string& why) {
    Flight& f = in_flight_.at(id);
    Request r = f.request;
    r.slo_ttft_ms = remaining_ttft_ms;
    r.redispatch = true;  // admitted already: not shed
    Decision d = sched_->decide(r);
    log_decision(r, d, f.submit);
    if (!d.accepted) {
      return fail_flight(id, why + " before the first token, not re-dispatched: no pair can take it now: " + d.reason);
    }
    const Instance* p = sched_->cluster().find(d.prefill_id);
    const Instance* dec = sched_->cluster().find(d.decode_id);
    if (p == nullptr || dec == nullptr) {
      return fail_flight(id, why + " before the first token, not re-dispatched: the chosen instance vanished");
    }
    sched_->commit(r, d);
    f.fault_cause = why;
    f.decision = d;
    f.prefill_endpoint = p->info.endpoint;
    f.decode_endpoint = dec->info.endpoint;
    f.replicate_keys.clear();  // a re-dispatch reads the prefix where it is
    fault_counter("redispatched").inc();
    reserve(id);
  }

  // Ends a dispatching request for good: a rejection when its submit was not answered yet, else request_error
  // to the client.
  void fail_flight(const std::string& id, const std::string& reason) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    Flight& f = it->second;
    fault_counter("failed_by_instance_death").inc();
    sched_->on_request_done(id);
    if (!f.answered) {
      proto::ConductorSubmitReply r = reply_of(f.decision);
      r.accepted = false;
      r.reject_reason = "instance_lost";
      r.reason = reason;
      answer(f, r);
    } else {
      send_client_error(f.client_target, f.client_request_id, reason);
    }
    in_flight_.erase(it);
  }

  // The terminal event of a request the Conductor fails is delivered at least once: a client that does not
  // acknowledge it (busy, or cut off for a moment) is sent it again every second for kClientErrorRetryMs (the
  // clients ignore an event of a request they have closed), as mc-decode delivers its token events.
  static constexpr int64_t kClientErrorRetryMs = 60'000;
  static constexpr size_t kMaxClientErrorRetries = 65'536;  // waiting at once; beyond, given up (counted)
  struct ClientErrorRetry {
    std::string client_endpoint, id, reason;
    int64_t next_ns = 0, give_up_ns = 0;
  };
  std::vector<ClientErrorRetry> client_error_retries_;

  void send_client_error(const std::string& client_endpoint, const std::string& id, const std::string& reason,
                         int64_t give_up_ns = 0) {
    if (client_endpoint.empty()) {
      MC_LOG_WARN << "request '" << id << "' failed but names no client endpoint to tell: " << reason;
      return;
    }
    if (give_up_ns == 0) give_up_ns = RealClock::instance().now_ns() + kClientErrorRetryMs * 1'000'000;
    proto::RequestError err;
    err.request_id = id;
    err.code = static_cast<uint16_t>(Code::kUnavailable);
    err.message = reason;
    calls_.call<proto::RequestError>(
        client_endpoint, err, options_.reserve_timeout_ms,
        [this, id, client_endpoint, reason, give_up_ns](Result<proto::ClientAck> r) {
          if (r.is_ok()) return;
          const int64_t now = RealClock::instance().now_ns();
          if (now >= give_up_ns || client_error_retries_.size() >= kMaxClientErrorRetries) {
            metrics_.counter("mc_conductor_client_errors_given_up_total", "request errors no client acknowledged")
                .inc();
            MC_LOG_WARN << "request '" << id << "': client.request_error to client " << client_endpoint
                        << " given up: " << r.status().message();
            return;
          }
          metrics_.counter("mc_conductor_client_error_retries_total", "request errors sent again").inc();
          MC_LOG_INFO << "request '" << id << "': client.request_error to client " << client_endpoint << " failed ("
                      << r.status().message() << "); sending it again in 1 s";
          client_error_retries_.push_back({client_endpoint, id, reason, now + 1'000'000'000, give_up_ns});
        });
  }

  void resend_client_errors(int64_t now_ns) {
    if (client_error_retries_.empty()) return;
    std::vector<ClientErrorRetry> due;
    std::erase_if(client_error_retries_, [&](ClientErrorRetry& e) {
      if (e.next_ns > now_ns) return false;
      due.push_back(std::move(e));
      return true;
    });
    for (ClientErrorRetry& e : due) send_client_error(e.client_endpoint, e.id, e.reason, e.give_up_ns);
  }

  // Decoding entries whose end mc-decode never reported (a dropped report) are forgotten after job_timeout_ms.
  void sweep_decoding(int64_t now_ns) {
    for (auto it = decoding_.begin(); it != decoding_.end();) {
      it = now_ns - it->second.since_ns > options_.job_timeout_ms * 1'000'000 ? decoding_.erase(it) : std::next(it);
    }
    prune_owned();
  }

  // The Conductor must compute a request's block keys exactly as the prefill workers store them: in their
  // base namespace with the request's adapter and salt. With no base configured (--model etc.; --lora and
  // --salt are only the requests' default scope) it adopts the first prefill worker's: its namespace fields
  // when it names them (checked against its digest), else only its chain seed (then requests of a non-empty
  // scope find no prefix). A worker of another base namespace is then refused, since its blocks could never hit.
  Status adopt_key_namespace(const proto::ConductorRegisterRequest& req) {
    if (req.role != "prefill" || req.key_namespace_digest.empty()) return Status::ok();
    if (key_digest_.empty()) {
      if (base_known_) {
        key_digest_ = options_.key_namespace.digest_hex();
      } else {
        KeyNamespace named;
        named.model_id = req.key_model_id;
        named.model_revision = req.key_model_revision;
        named.kv_dtype = req.key_kv_dtype;
        named.layout = req.key_layout;
        named.seed = req.key_seed;
        named.block_size = options_.key_namespace.block_size;
        if (named.digest_hex() == req.key_namespace_digest) {
          options_.key_namespace = named;
          base_known_ = true;
        } else {
          KeyNamespace adopted;
          adopted.seed = req.key_chain_seed;
          adopted.block_size = options_.key_namespace.block_size;
          options_.key_namespace = adopted;
        }
        key_digest_ = req.key_namespace_digest;
        MC_LOG_INFO << "block keys: adopted namespace " << key_digest_ << " of prefill '" << req.instance_id << "'"
                    << (base_known_ ? "" : " (its fields unknown: only requests of the default scope match prefixes)");
      }
    }
    if (req.key_namespace_digest != key_digest_) {
      return error(Code::kInvalidArgument, "register '" + req.instance_id + "': it stores KV blocks in namespace " +
                                               req.key_namespace_digest + " but this Conductor keys requests in " +
                                               key_digest_ +
                                               ": run one model, dtype, layout and seed per Conductor (an adapter "
                                               "or salt is the request's, not the worker's)");
    }
    return Status::ok();
  }

  // Trusted registration (docs/SECURITY.md): an instance id belongs to the key that first registered it, for the
  // Conductor's life; registrations, heartbeats and job reports under it from any other key are refused. Without a
  // key ring (no caller identity) nothing is bound. At most 4 x --max-instances ids are bound.
  Status check_owner(const rpc::CallContext& ctx, const std::string& instance_id, const char* what, bool bind) {
    Status st = owners_.check(ctx.caller, instance_id, bind);
    if (!st.is_ok()) refused(what, std::string(what) + ": " + st.message());
    return st;
  }

  Result<proto::ConductorRegisterReply> on_register(const proto::ConductorRegisterRequest& req) {
    MC_ASSIGN_OR_RETURN(Role role, parse_role(req.role));
    MC_RETURN_IF_ERROR(adopt_key_namespace(req));
    if (req.block_size_tokens != 0 &&
        req.block_size_tokens != static_cast<int64_t>(options_.key_namespace.block_size)) {
      return error(Code::kInvalidArgument,
                   "register '" + req.instance_id + "': block size " + std::to_string(req.block_size_tokens) +
                       " differs from the Conductor's " + std::to_string(options_.key_namespace.block_size));
    }
    if (req.endpoint.empty())
      return error(Code::kInvalidArgument, "register '" + req.instance_id + "': empty endpoint");
    if (req.kv_capacity_tokens < 0 || req.kv_capacity_tokens > kMaxReportedCount) {
      refused("register", "register '" + req.instance_id + "': kv_capacity_tokens out of range");
      return error(Code::kInvalidArgument, "register '" + req.instance_id + "': kv_capacity_tokens " +
                                               std::to_string(req.kv_capacity_tokens) +
                                               " is outside [0, 2^40] (refused)");
    }
    InstanceInfo info;
    info.id = req.instance_id;
    info.role = role;
    info.host = req.host;
    info.endpoint = req.endpoint;
    info.backend_id = req.backend_id;
    info.kv_capacity_tokens = req.kv_capacity_tokens;
    info.runs_pipeline_stages = req.runs_pipeline_stages;
    const Instance* old = sched_->cluster().find(req.instance_id);
    if (old == nullptr && static_cast<int64_t>(sched_->cluster().size()) >= options_.max_instances) {
      refused("register", "register '" + req.instance_id + "': " + std::to_string(options_.max_instances) +
                              " instances are registered (--max-instances)");
      return error(Code::kResourceExhausted, "register '" + req.instance_id + "': the Conductor holds " +
                                                 std::to_string(options_.max_instances) +
                                                 " instances, its limit (mc-conductor serve --max-instances)");
    }
    // One live worker per id: a registration from another endpoint while the registered one is alive (its watched
    // connection open, its heartbeats on time) is a second worker started with the same --instance-id, or an
    // impostor, and would take over the live worker's requests. Refused; a worker that restarted elsewhere is
    // registered once its predecessor's death is seen (its connection closes at once; a silent one expires).
    if (old != nullptr && old->info.endpoint != req.endpoint) {
      refused("register",
              "register '" + req.instance_id + "' from " + req.endpoint + ": the id is live at " + old->info.endpoint);
      return error(Code::kAlreadyExists,
                   "register '" + req.instance_id + "' at " + req.endpoint + ": that instance id is registered at " +
                       old->info.endpoint + " and alive (heard " +
                       std::to_string((RealClock::instance().now_ns() - old->last_seen_ns) / 1'000'000) +
                       " ms ago); give this worker another --instance-id, or stop the other one");
    }
    MC_RETURN_IF_ERROR(sched_->register_instance(info));
    // The connection to the worker is watched: its process's death closes it, and the instance is lost within
    // one pass of the loop instead of after heartbeat_timeout_ms of silence (DESIGN.md §10 "Worker faults").
    calls_.watch(req.endpoint);
    MC_LOG_INFO << "registered " << req.role << " instance '" << req.instance_id << "' on " << req.host << " at "
                << req.endpoint;
    return proto::ConductorRegisterReply{options_.heartbeat_interval_ms, options_.scheduler.heartbeat_timeout_ms,
                                         static_cast<int64_t>(options_.key_namespace.block_size)};
  }

  // conductor.drain (DESIGN.md §10 "Drain"): nothing new is placed on the instance from now on; it stays registered,
  // its requests run on, and its exit is counted as a drain (on_connection_lost).
  Result<proto::ConductorDrainReply> on_drain(const proto::ConductorDrainRequest& req) {
    proto::ConductorDrainReply reply;
    const Instance* inst = sched_->cluster().find(req.instance_id);
    if (inst == nullptr) {
      reply.registered = false;
      return reply;
    }
    const bool first = !inst->draining;
    MC_RETURN_IF_ERROR(sched_->drain_instance(req.instance_id));
    for (const auto& [id, f] : in_flight_) {
      if (f.decision.prefill_id == req.instance_id || f.decision.decode_id == req.instance_id) ++reply.requests_held;
    }
    for (const auto& [id, d] : decoding_) {
      if (d.prefill_id == req.instance_id || d.decode_id == req.instance_id) ++reply.requests_held;
    }
    if (first) {
      drain_notices().inc();
      MC_LOG_INFO << "instance '" << req.instance_id << "' drains: nothing new is placed on it; " << reply.requests_held
                  << " request(s) it holds run on";
    }
    return reply;
  }

  Result<proto::ConductorHeartbeatReply> on_heartbeat(const proto::ConductorHeartbeatRequest& req) {
    LoadReport l;
    l.queued_prefill_tokens = req.queued_prefill_tokens;
    l.queued_prefill_jobs = req.queued_prefill_jobs;
    l.running_requests = req.running_requests;
    l.kv_reserved_tokens = req.kv_reserved_tokens;
    l.context_tokens = req.context_tokens;
    const Instance* known = sched_->cluster().find(req.instance_id);
    if (Status bad = validate_load_report(l, req.instance_id, known != nullptr ? known->info.kv_capacity_tokens : 0);
        !bad.is_ok()) {
      refused("heartbeat", bad.message());
      return bad;
    }
    for (const proto::DecodeStepSample& step : req.decode_step_samples) {
      if (Status bad = validate_decode_step(step.batch_requests, step.context_tokens, step.step_ms, req.instance_id);
          !bad.is_ok()) {
        refused("heartbeat", bad.message());
        return bad;
      }
    }
    if (req.decode_step_samples.size() > proto::kMaxDecodeStepSamples) {
      refused("heartbeat", "heartbeat of '" + req.instance_id + "': too many decode step samples");
      return error(Code::kInvalidArgument, "heartbeat of '" + req.instance_id +
                                               "': " + std::to_string(req.decode_step_samples.size()) +
                                               " decode step samples, at most " +
                                               std::to_string(proto::kMaxDecodeStepSamples) + " (send the latest)");
    }
    Status st = sched_->heartbeat(req.instance_id, l);
    if (st.code() == Code::kNotFound) return proto::ConductorHeartbeatReply{false};
    MC_RETURN_IF_ERROR(st);
    // A prefix fetch still running bounds its path's bandwidth (not in a time-scaled cluster, as the samples).
    if (!req.fetch_request_id.empty() && req.fetch_request_id.size() <= 1024 && req.fetch_elapsed_us > 0 &&
        static_cast<double>(req.fetch_elapsed_us) <= kMaxReportedMs * 1000 && options_.time_scale == 1.0) {
      sched_->on_fetch_progress(req.instance_id, req.fetch_request_id, req.fetch_elapsed_us * 1000);
    }
    // Each step with its own batch and context (bad figures are ignored by the scheduler, implausible ones
    // refused and counted), in modelled ms.
    std::vector<DecodeStepReport> steps;
    steps.reserve(req.decode_step_samples.size());
    for (const proto::DecodeStepSample& step : req.decode_step_samples) {
      steps.push_back(DecodeStepReport{req.instance_id, step.batch_requests, step.context_tokens,
                                       step.step_ms * options_.time_scale});
    }
    const uint64_t refused_before = sched_->counters().refused_decode_steps;
    sched_->on_decode_steps(steps);
    if (const uint64_t n = sched_->counters().refused_decode_steps - refused_before; n > 0) {
      refused("decode_step",
              "heartbeat of '" + req.instance_id + "': " + std::to_string(n) +
                  " decode step sample(s) above the decode model's envelope (4x the cost model's step, or 50 ms more): "
                  "refused, not refitted",
              n);
    }
    // Ledger entries past their predicted end are dropped: the report now carries what still runs.
    Instance* inst = sched_->cluster().find(req.instance_id);
    if (inst != nullptr && inst->info.role == Role::kDecode) {
      const int64_t now = sched_->clock().now_ns();
      std::vector<std::string> ended;
      for (const auto& j : inst->decode_jobs) {
        if (j.predicted_end_ns < now) ended.push_back(j.request_id);
      }
      for (const auto& id : ended) sched_->cluster().finish_decode(req.instance_id, id);
      if (!ended.empty()) (void)sched_->heartbeat(req.instance_id, l);  // recompute the unledgered excess
    }
    return proto::ConductorHeartbeatReply{true};
  }

  Result<proto::ConductorJobReportReply> on_job_report(const proto::ConductorJobReportRequest& req) {
    const std::string what = "job_report '" + req.request_id + "' (" + req.phase + ") from '" + req.instance_id + "'";
    if (req.phase != proto::kPhaseFirstToken && req.phase != proto::kPhaseDone && req.phase != proto::kPhaseFailed) {
      refused("job_report", what + ": unknown phase");
      return error(Code::kInvalidArgument, "job_report '" + req.request_id + "': unknown phase '" + req.phase +
                                               "' (expected first_token, done or failed)");
    }
    if (req.output_tokens < 0 || req.output_tokens > kMaxReportedCount) {
      refused("job_report", what + ": output_tokens out of range");
      return error(Code::kInvalidArgument,
                   what + ": output_tokens " + std::to_string(req.output_tokens) + " is outside [0, 2^40] (refused)");
    }
    // The event time: not before the submit nor the request's previous event, not in the future (a skew allowed).
    auto fl = in_flight_.find(req.request_id);
    auto dec = decoding_.find(req.request_id);
    // Only an instance the request runs on reports on it.
    const bool assigned = fl != in_flight_.end() ? (fl->second.decision.prefill_id == req.instance_id ||
                                                    fl->second.decision.decode_id == req.instance_id)
                          : dec != decoding_.end()
                              ? (dec->second.prefill_id == req.instance_id || dec->second.decode_id == req.instance_id)
                              : true;
    if (!assigned) {
      refused("job_report", what + ": the request does not run on that instance");
      return error(Code::kPermissionDenied, what + ": the request runs on other instances (refused)");
    }
    const int64_t now_unix = now_unix_ns();
    int64_t* last_event = fl != in_flight_.end()   ? &fl->second.last_event_unix_ns
                          : dec != decoding_.end() ? &dec->second.last_event_unix_ns
                                                   : nullptr;
    const int64_t submit_unix = fl != in_flight_.end()   ? fl->second.submit_unix_ns
                                : dec != decoding_.end() ? dec->second.submit_unix_ns
                                                         : now_unix - options_.job_timeout_ms * 1'000'000;
    if (req.event_unix_ns != 0) {
      Status bad = validate_event_time(req.event_unix_ns, std::max(submit_unix, last_event ? *last_event : 0), now_unix,
                                       options_.max_clock_skew_ms, what);
      if (!bad.is_ok()) {
        refused("job_report", bad.message());
        return bad;
      }
      if (last_event != nullptr) *last_event = std::max(*last_event, req.event_unix_ns);
    }
    if (req.phase == proto::kPhaseFirstToken) {
      if (req.event_unix_ns > 0 && last_event != nullptr) {
        sched_->on_first_token(req.request_id, static_cast<double>(req.event_unix_ns - submit_unix) * 1e-6);
      }
      return proto::ConductorJobReportReply{last_event != nullptr};
    }
    const bool known = sched_->is_in_flight(req.request_id) || last_event != nullptr;
    sched_->on_request_done(req.request_id);
    if (fl != in_flight_.end()) fl->second.decode_finished = true;  // the prefill's reply is still to come
    if (dec != decoding_.end()) decoding_.erase(dec);
    const bool cancelled = fl != in_flight_.end() && fl->second.cancelled;
    if (req.phase == proto::kPhaseFailed && known && !cancelled) {
      MC_LOG_WARN << "request '" << req.request_id << "' failed on " << req.instance_id << ": " << req.message;
    } else if (req.phase == proto::kPhaseFailed) {  // settled before (cancelled by its client, or failed)
      MC_LOG_INFO << "request '" << req.request_id << "' ended on " << req.instance_id << ": " << req.message;
    }
    return proto::ConductorJobReportReply{known};
  }

  void drain_events() {
    for (auto& [ep, sub] : subs_) {
      for (int n = 0; n < 10'000; ++n) {
        Result<std::optional<proto::KvEvent>> ev = sub->next(0);
        if (!ev.is_ok()) {
          MC_LOG_WARN << "KV events from " << ep << ": " << ev.status().message();
          continue;
        }
        if (!ev->has_value()) break;
        Status st = sched_->apply_event(**ev, ep);
        if (!st.is_ok()) MC_LOG_WARN << "KV event from " << ep << ": " << st.message();
      }
    }
  }

  void update_metrics() {
    const SchedulerCounters& c = sched_->counters();
    metrics_.gauge("mc_conductor_decisions", "decisions made").set(static_cast<double>(c.decisions));
    metrics_.gauge("mc_conductor_accepted", "decisions that accepted").set(static_cast<double>(c.accepted));
    metrics_.gauge("mc_conductor_decisions_fetch", "accepted decisions that reuse a cached prefix")
        .set(static_cast<double>(c.fetch));
    metrics_.gauge("mc_conductor_decisions_fetch_remote", "of those, reading some blocks from another host")
        .set(static_cast<double>(c.fetch_remote));
    metrics_
        .gauge("mc_conductor_decisions_recompute_cached",
               "accepted decisions that recompute although the pool held a reusable prefix")
        .set(static_cast<double>(c.recompute_cached));
    metrics_
        .gauge("mc_conductor_decisions_fetch_pending",
               "accepted decisions that reuse a prefix a request queued on the same instance computes first")
        .set(static_cast<double>(c.fetch_pending));
    metrics_.gauge("mc_conductor_bandwidth_path_samples", "remote fetches measured on one host-to-host path")
        .set(static_cast<double>(c.path_samples));
    metrics_.gauge("mc_conductor_bandwidth_path_caps", "path estimates lowered by a fetch still running")
        .set(static_cast<double>(c.path_caps));
    metrics_.gauge("mc_conductor_index_blocks", "distinct blocks in the prefix index")
        .set(static_cast<double>(sched_->index().blocks()));
    metrics_.gauge("mc_conductor_instances", "registered instances").set(static_cast<double>(sched_->cluster().size()));
    metrics_.gauge("mc_conductor_ttft_abs_error_ms_mean", "mean |predicted - actual| TTFT")
        .set(sched_->ttft_error().mean_abs_error_ms());
  }

  static constexpr int64_t kLoopStallNs = 250'000'000;
  static constexpr int kLoopWaitMs = 10;     // the longest wait of one loop pass with nothing arriving
  std::vector<zmq::pollitem_t> poll_items_;  // the loop's wait set (server, KV event subscriptions)

  ConductorOptions options_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<rpc::RpcServer> server_;
  std::vector<std::pair<std::string, std::unique_ptr<rpc::EventSubscriber>>> subs_;
  std::unique_ptr<StoreMasterResync> resync_;
  // The store master asked now: options_.store_master, or the leader of options_.cluster_id in etcd (locator_).
  std::string store_master_;
  std::shared_ptr<LeaderLocator> locator_;
  uint64_t leader_generation_ = 0;
  std::string leader_stream_;  // the KV event stream of the store's leader ("store:<cluster-id>")

  // Follows the store master's leader (etcd): resync and stat calls go to it, and its KV events are the stream
  // "store:<cluster-id>" (one stream whatever the leader: a new leader is a new incarnation of its publisher, which
  // the index resyncs at once: DESIGN.md §17).
  void follow_store_leader(int64_t wait_ms) {
    leader_generation_ = locator_->generation();
    Result<LeaderInfo> l = locator_->leader(wait_ms);
    if (!l.is_ok()) {
      MC_LOG_WARN << "store master: " << l.status().message() << " (followed as soon as one leads)";
      return;
    }
    if (l->endpoint == store_master_) return;
    MC_LOG_INFO << "store master: following the leader " << l->endpoint << " (" << l->member << ") of cluster '"
                << options_.cluster_id << "'";
    store_master_ = l->endpoint;
    if (resync_) {
      resync_->set_endpoint(store_master_);
    } else {
      resync_ = std::make_unique<StoreMasterResync>(store_master_, options_.store_timeout_ms, sched_.get());
      sched_->index().set_resync_source(resync_.get());
    }
    leader_stream_ = "store:" + options_.cluster_id;
    subs_.erase(std::remove_if(subs_.begin(), subs_.end(), [&](const auto& s) { return s.first == leader_stream_; }),
                subs_.end());
    if (!l->events.empty()) {
      Result<std::unique_ptr<rpc::EventSubscriber>> sub = rpc::EventSubscriber::connect(l->events);
      if (sub.is_ok()) {
        subs_.emplace_back(leader_stream_, std::move(sub).value());
      } else {
        MC_LOG_WARN << "KV events of the store leader at " << l->events << ": " << sub.status().message();
      }
    }
    // Whatever happened between the leaders (events the old one published and the new one never will), and at start
    // what the pool already holds, is found by a resync against the leader: at once, not at its first event.
    sched_->index().expect_stream(leader_stream_);
    (void)sched_->index().resync_stale();
  }
  bool stat_pending_ = false;      // a periodic store.stat is outstanding
  std::string key_digest_;         // base namespace of the workers' block keys, once known
  bool base_known_ = false;        // options_.key_namespace holds the base's fields (configured or named)
  RequestKeyScope default_scope_;  // --lora, --lora-version, --salt: the scope of requests that name none
  rpc::AsyncClient calls_{[] {
    rpc::AsyncClientOptions o;
    o.client_name = "mc-conductor";
    return o;
  }()};
  std::unordered_map<std::string, Flight> in_flight_;
  std::deque<HeldSubmit> held_;    // hold_for_workers()
  size_t held_bytes_ = 0;          // the sum of their HeldSubmit::bytes
  bool held_release_due_ = false;  // a worker registered while submits were held
  int64_t started_ns_ = RealClock::instance().now_ns();
  auth::Claims owners_{"instance id", 4 * static_cast<size_t>(options_.max_instances)};  // check_owner()
  std::unordered_map<std::string, Decoding> decoding_;
  // (submitter key, client's id) -> the Conductor's id of a live request (owned_live(), prune_owned()).
  std::unordered_map<std::string, std::string> owned_;
  std::mt19937_64 id_rng_{std::random_device{}()};  // unused_id()'s aliases
  FaultPolicyConfig fault_config_;
  metrics::Registry metrics_;
  std::ofstream decisions_;
};

}  // namespace

Status apply_cost_model(ConductorOptions& options, const std::string& model_spec, const std::string& gpu_name) {
  MC_ASSIGN_OR_RETURN(model::ModelConfig model, model::load_model(model_spec));
  MC_ASSIGN_OR_RETURN(model::GpuSpec gpu, model::gpu_preset(gpu_name));
  options.prefill_prior = prefill_prior_from_cost_model(
      [&](int64_t n, int64_t c) { return model::prefill_time_s(model, gpu, n, c) * 1e3; });
  options.decode_prior = decode_prior_from_cost_model(
      [&](int64_t b, int64_t t) { return model::decode_step_time_s(model, gpu, b, t) * 1e3; });
  // Pipelined prefill groups (DESIGN.md §18): the model's depth and what crosses a stage boundary per token.
  options.scheduler.pipeline.model_layers = model.num_layers;
  options.scheduler.pipeline.hidden_bytes_per_token = model.hidden_size * model.dtype_bytes;
  if (options.scheduler.kv.kv_bytes_per_token <= 0)
    options.scheduler.kv.kv_bytes_per_token = model.kv_bytes_per_token();
  return Status::ok();
}

Status run_conductor(const ConductorOptions& options) {
  ConductorOptions o = options;
  o.scheduler.kv.block_size_tokens = static_cast<int64_t>(o.key_namespace.block_size);
  MC_ASSIGN_OR_RETURN(auto sched, Scheduler::create(o.scheduler, &RealClock::instance(), o.prefill_prior,
                                                    o.decode_prior, o.bandwidth_priors));
  Conductor c(o, std::move(sched));
  MC_RETURN_IF_ERROR(c.start());
  std::vector<std::pair<std::string, std::string>> extra = {{"policy", o.scheduler.policy}};
  MC_ASSIGN_OR_RETURN(std::unique_ptr<metrics::HttpExporter> exporter,
                      metrics::start_daemon_exporter(o.metrics_listen, "mc-conductor", &c.metrics(), &extra));
  daemon::announce_ready("mc-conductor", c.endpoint(), extra);
  return c.loop();
}

}  // namespace mc::sched
