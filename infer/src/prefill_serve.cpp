// serve_prefill: mc-prefill's daemon loop around a PrefillWorker (prefill_worker.hpp): the RPC handlers, the job
// queue in the Conductor's order, cancels, the Conductor link, and the drain on SIGTERM.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "mc/common/clock.hpp"
#include "mc/common/daemon.hpp"
#include "mc/common/log.hpp"
#include "mc/common/queue_order.hpp"
#include "mc/infer/prefill_worker.hpp"
#include "mc/infer/worker_drain.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/net/metrics_http.hpp"
#include "mc/net/rpc.hpp"
#include "mc/proto/conductor.hpp"

namespace mc::infer {

Status serve_prefill(PrefillWorker& worker, const PrefillServeOptions& options) {
  MC_ASSIGN_OR_RETURN(model::GpuSpec gpu, model::gpu_preset(options.gpu));
  rpc::ServerOptions so;
  so.service = "mc-prefill";
  so.bind_endpoints = {options.endpoint};
  MC_ASSIGN_OR_RETURN(auto server, rpc::RpcServer::bind(so));
  server->serve_stat(&worker.metrics());
  std::vector<std::pair<std::string, std::string>> metrics_extra;
  MC_ASSIGN_OR_RETURN(
      std::unique_ptr<metrics::HttpExporter> exporter,
      metrics::start_daemon_exporter(options.metrics_listen, so.service, &worker.metrics(), &metrics_extra));

  struct Queued {
    proto::PrefillJobRequest job;
    rpc::CallContext ctx;
    int64_t received_ns;
    int64_t key_ns = 0;  // its place in the queue (the job's queue_key_ns; none: the back)
  };
  struct Finished {
    rpc::CallContext ctx;
    Result<proto::PrefillJobReply> reply;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Queued> queue;
  std::deque<Queued> dropped;  // cancelled before they started: the job thread aborts their reservations first
  std::deque<Finished> finished;
  int64_t running_tokens = 0;
  bool job_running = false;  // the runner thread computes a job (its reply not yet in `finished`)
  bool stopping = false;

  const std::string self = resolve_conductor_options(options.conductor, "prefill").instance_id;
  bool refusing = false;  // draining: the Conductor took the notice, new jobs are refused (guarded by mu)
  server->handle<proto::PrefillJobRequest>([&](const proto::PrefillJobRequest& job,
                                               const rpc::CallContext& ctx) -> Result<proto::PrefillJobReply> {
    std::lock_guard lock(mu);
    if (refusing) {
      worker.metrics().counter("mc_prefill_refused_draining_total", "prefill jobs refused while draining").inc();
      return error(Code::kUnavailable, "prefill_job '" + job.request_id + "': mc-prefill " + self +
                                           " is draining (SIGTERM): it takes no new jobs; send it elsewhere");
    }
    if (job.queue_key_ns < 0 || job.queue_key_ns > kMaxQueueKeyNs) {
      return error(Code::kInvalidArgument, "prefill_job '" + job.request_id + "': queue_key_ns " +
                                               std::to_string(job.queue_key_ns) + " is outside [0, 2^62]");
    }
    ctx.defer();
    // The Conductor's order (queue_order.hpp): after every waiting job of a key <= its own; no key: the back.
    const int64_t key = job.queue_key_ns > 0 ? job.queue_key_ns : (queue.empty() ? 0 : queue.back().key_ns);
    const auto at = queue_insert_position(queue.begin(), queue.end(), key, 0, [](const Queued& x) { return x.key_ns; });
    queue.insert(at, Queued{job, ctx, steady_ns(), key});
    cv.notify_one();
    return proto::PrefillJobReply{};
  });
  // prefill_cancel (DESIGN.md §10 "Cancel"): a queued job leaves the queue at once; the job thread aborts its decode
  // reservation (kCancelled) before its next job and then answers its prefill_job with kCancelled. A job already
  // computing runs on (its decode instance refuses the commit).
  server->handle<proto::PrefillCancelRequest>([&](const proto::PrefillCancelRequest& req,
                                                  const rpc::CallContext&) -> Result<proto::PrefillCancelReply> {
    proto::PrefillCancelReply reply;
    std::lock_guard lock(mu);
    for (auto it = queue.begin(); it != queue.end();) {
      if (it->job.request_id == req.request_id) {
        dropped.push_back(std::move(*it));
        it = queue.erase(it);
        reply.dropped = true;
      } else {
        ++it;
      }
    }
    if (reply.dropped) {
      worker.metrics().counter("mc_prefill_cancelled_total", "queued jobs dropped: cancelled by their client").inc();
      cv.notify_one();
    }
    return reply;
  });
  // prefill_stage_hidden (DESIGN.md §18 "Live groups"): a previous stage's chunk, held for our stage job.
  server->handle<proto::PrefillStageHiddenRequest>(
      [&](const proto::PrefillStageHiddenRequest& req,
          const rpc::CallContext&) -> Result<proto::PrefillStageHiddenReply> {
        MC_RETURN_IF_ERROR(worker.deliver_stage_hidden(req));
        return proto::PrefillStageHiddenReply{};
      });
  // prefill_stage_slot: where a previous stage WRITEs a chunk through the transfer engine (its stage segment).
  server->handle<proto::PrefillStageSlotRequest>(
      [&](const proto::PrefillStageSlotRequest& req, const rpc::CallContext&) { return worker.stage_slot(req); });
  auto current_load = [&]() -> proto::WorkerLoadReply {
    proto::WorkerLoadReply l;
    l.role = "prefill";
    l.backend = worker.backend().kind();
    l.model = worker.backend().model().name;
    std::lock_guard lock(mu);
    l.queued_jobs = static_cast<int64_t>(queue.size());
    double predicted_s = 0;
    const double rate = worker.measured_tokens_per_s();
    for (const auto& q : queue) {
      const int64_t t = static_cast<int64_t>(q.job.tokens.size());
      l.queued_tokens += t;
      predicted_s += worker.backend().kind() == "sim" ? model::prefill_time_s(worker.backend().model(), gpu, t, 0)
                                                      : (rate > 0 ? static_cast<double>(t) / rate : 0.0);
    }
    l.running_tokens = running_tokens;
    l.predicted_queue_ms = static_cast<int64_t>(predicted_s * 1e3);
    l.kv_blocks_total = worker.kv().num_blocks();
    l.kv_blocks_free = worker.kv().free_blocks();
    l.kv_blocks_used = l.kv_blocks_total - l.kv_blocks_free;
    return l;
  };
  server->handle<proto::WorkerLoadRequest>(
      [&](const auto&, const auto&) -> Result<proto::WorkerLoadReply> { return current_load(); });

  std::thread runner([&] {
    for (;;) {
      Queued q;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty() || !dropped.empty(); });
        if (stopping) return;
        if (!dropped.empty()) {
          q = std::move(dropped.front());
          dropped.pop_front();
          lock.unlock();
          Status cancelled = worker.cancel_job(q.job);
          lock.lock();
          finished.push_back({std::move(q.ctx), std::move(cancelled)});
          continue;
        }
        q = std::move(queue.front());
        queue.pop_front();
        running_tokens = static_cast<int64_t>(q.job.tokens.size());
        job_running = true;
      }
      worker.metrics()
          .histogram("mc_prefill_queue_seconds", metrics::latency_buckets_s(), "prefill job received -> started")
          .observe(static_cast<double>(steady_ns() - q.received_ns) * 1e-9);
      auto reply = worker.run_job(q.job, (steady_ns() - q.received_ns) / 1'000'000);
      std::lock_guard lock(mu);
      running_tokens = 0;
      job_running = false;
      finished.push_back({std::move(q.ctx), std::move(reply)});
    }
  });

  const ConductorHeartbeatOptions conductor = resolve_conductor_options(options.conductor, "prefill");
  proto::ConductorRegisterRequest reg;
  reg.instance_id = conductor.instance_id;
  reg.role = "prefill";
  reg.host = conductor.host;
  reg.endpoint = server->endpoints().front();
  reg.kv_capacity_tokens = worker.kv().num_blocks() * worker.kv().layout().block_size;
  reg.block_size_tokens = worker.kv().layout().block_size;
  reg.key_namespace_digest = worker.key_namespace().digest_hex();
  reg.key_chain_seed = worker.key_namespace().chain_seed();
  reg.key_model_id = worker.key_namespace().model_id;
  reg.key_model_revision = worker.key_namespace().model_revision;
  reg.key_kv_dtype = worker.key_namespace().kv_dtype;
  reg.key_layout = worker.key_namespace().layout;
  reg.key_seed = worker.key_namespace().seed;
  reg.runs_pipeline_stages = worker.backend().runs_stages();
  ConductorHeartbeat heartbeat(conductor, reg, [&] {
    const proto::WorkerLoadReply l = current_load();
    proto::ConductorHeartbeatRequest hb;
    hb.queued_prefill_tokens = l.queued_tokens + l.running_tokens;
    hb.queued_prefill_jobs = l.queued_jobs + (l.running_tokens > 0 ? 1 : 0);
    auto [fetching, elapsed_ns] = worker.fetch_in_progress();
    hb.fetch_request_id = std::move(fetching);
    hb.fetch_elapsed_us = elapsed_ns / 1000;
    return hb;
  });
  Status served = heartbeat.wait_registered(conductor.start_wait_ms);
  if (served.is_ok()) {
    std::vector<std::pair<std::string, std::string>> extra = {
        {"backend", worker.backend().kind()},
        {"model", worker.backend().model().name},
        {"kv_blocks", std::to_string(worker.kv().num_blocks())},
        {"block_tokens", std::to_string(worker.kv().layout().block_size)},
        {"namespace", worker.key_namespace().digest_hex()}};
    if (!worker.stage_segment().empty()) extra.emplace_back("stage_segment", worker.stage_segment());
    extra.insert(extra.end(), metrics_extra.begin(), metrics_extra.end());
    daemon::announce_ready("mc-prefill", server->endpoints().front(), extra);
  }
  // Drain (WorkerDrain, DESIGN.md §10 "Drain"): new jobs are refused once the Conductor took the notice; the loop ends
  // when nothing is queued, running or unanswered. At the end of the drain the jobs left fail as failed jobs do.
  WorkerDrain drain(options.drain_timeout_s);
  while (served.is_ok()) {
    const WorkerDrain::Turn turn =
        drain.step(steady_ns(), daemon::stop_requested(), daemon::stop_now_requested(), heartbeat.drain_acknowledged());
    if (turn.started) {
      heartbeat.request_drain();
      std::lock_guard lock(mu);
      MC_LOG_INFO << "mc-prefill: draining (SIGTERM): " << queue.size() + (job_running ? 1 : 0)
                  << " job(s) held get up to " << options.drain_timeout_s << " s; a second signal ends them at once";
    }
    if (drain.draining()) {
      std::lock_guard lock(mu);
      if (turn.refuse) refusing = true;
      if (turn.end) {
        const std::string why = drain.ended_by_signal()
                                    ? "mc-prefill " + self + " stopped (a second signal)"
                                    : "mc-prefill " + self + " drained: its drain timeout (" +
                                          std::to_string(options.drain_timeout_s) + " s) ended the job";
        MC_LOG_WARN << "mc-prefill: " << why << ": failing " << queue.size() + (job_running ? 1 : 0) << " job(s)";
        worker.metrics()
            .counter("mc_prefill_drain_aborted_total", "jobs failed by the drain timeout (or a second signal)")
            .inc(queue.size() + (job_running ? 1 : 0));
        worker.abort_jobs(why);  // queued ones fail before their compute, a running one at its next layer
        cv.notify_one();
      }
      if (refusing && queue.empty() && dropped.empty() && !job_running && finished.empty()) break;
    }
    served = server->poll_once(5);
    if (!served.is_ok()) break;
    std::deque<Finished> done;
    {
      std::lock_guard lock(mu);
      done.swap(finished);
    }
    for (auto& f : done) {
      Status s =
          f.reply.is_ok() ? server->reply_to(f.ctx, f.reply.value()) : server->reply_error_to(f.ctx, f.reply.status());
      if (!s.is_ok()) MC_LOG_WARN << "mc-prefill: reply not sent: " << s.to_string();
    }
  }
  if (drain.draining()) {
    MC_LOG_INFO << "mc-prefill: drained in " << (steady_ns() - drain.started_ns()) / 1'000'000 << " ms";
  }
  heartbeat.stop();
  {
    std::lock_guard lock(mu);
    stopping = true;
    cv.notify_one();
  }
  runner.join();  // a job in progress finishes first (bounded by its RPC timeouts)
  MC_LOG_INFO << "mc-prefill: stopping";
  return served;
}

}  // namespace mc::infer
