#include "mc/replay/replay.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "mc/common/clock.hpp"
#include "mc/common/log.hpp"

namespace mc::replay {

namespace {

// How long an idle event-carrying sender waits for events before looking at the send queue again:
// a bound on the extra send lag it causes (well under the default late threshold of 10 ms).
constexpr int kPollMs = 3;

// Per-request state shared by the scheduler, the senders and the event thread (guarded by Run::mu).
struct State {
  int64_t scheduled_ns = 0;  // relative to the run's start
  std::optional<int64_t> sent_ns;
  std::vector<int64_t> token_ns;
  std::vector<uint32_t> token_ids;  // only with ReplayOptions::record_token_ids
  std::optional<Admission> admission;
  std::optional<DoneReport> done;
  std::optional<std::string> error;
  bool closed = false;
};

class Run final : public EventSink {
 public:
  Run(const std::vector<trace::Request>& rows, const ReplayOptions& options, const Clock& clock)
      : rows_(rows), options_(options), clock_(clock), states_(rows.size()), records_(rows.size()) {
    std::string prefix = options.id_prefix;
    if (prefix.empty()) prefix = "r" + std::to_string(::getpid()) + "-";
    const int64_t t0 = rows.empty() ? 0 : rows.front().timestamp_ms;
    const double compress = options.speed * options.rate_scale;
    for (size_t i = 0; i < rows.size(); ++i) {
      RequestRecord& r = records_[i];
      r.request_id = prefix + std::to_string(rows[i].line_no);
      r.trace_line = rows[i].line_no;
      r.trace_timestamp_ms = rows[i].timestamp_ms;
      r.input_tokens = synthesized_length(rows[i], options.synth);
      r.output_tokens_requested = rows[i].output_length;
      index_.emplace(r.request_id, i);
      // compress > 0 (run_replay checks the options first); a schedule past ~292 years is held there, not cast.
      const double at_ns = static_cast<double>(rows[i].timestamp_ms - t0) * 1e6 / compress;
      states_[i].scheduled_ns = at_ns < 9.2e18 ? static_cast<int64_t>(at_ns) : INT64_MAX;
    }
  }

  // ---- EventSink (event thread or sender threads) ----
  void on_tokens(const std::string& request_id, std::span<const uint32_t> token_ids) override {
    const int64_t now = clock_.now_ns();
    std::lock_guard lock(mu_);
    State* s = find(request_id);
    if (!s || s->closed) return;
    s->token_ns.insert(s->token_ns.end(), token_ids.size(), now);
    if (options_.record_token_ids) s->token_ids.insert(s->token_ids.end(), token_ids.begin(), token_ids.end());
  }
  void on_done(const std::string& request_id, const DoneReport& report) override {
    std::lock_guard lock(mu_);
    State* s = find(request_id);
    if (!s || s->closed) return;
    s->done = report;
    maybe_close(*s);
  }
  void on_error(const std::string& request_id, const std::string& message) override {
    std::lock_guard lock(mu_);
    State* s = find(request_id);
    if (!s || s->closed) return;
    s->error = message;
    maybe_close(*s);
  }

  // ---- senders ----
  // Submits queued rows; a link that carries events is polled whenever there is nothing to send,
  // until the run is finished.
  void sender_loop(ConductorLink& link, const std::string& client_endpoint) {
    const bool polls = link.carries_events();
    bool link_broken = false;
    while (true) {
      std::optional<size_t> job;
      {
        std::unique_lock lock(mu_);
        if (polls) {
          if (queue_.empty() && finished_) return;
        } else {
          queue_cv_.wait(lock, [&] { return !queue_.empty() || queue_closed_; });
          if (queue_.empty()) return;
        }
        if (!queue_.empty()) {
          job = queue_.front();
          queue_.pop_front();
        }
      }
      if (!job) {
        Status st = link.poll_events(*this, kPollMs);
        if (!st.is_ok()) {
          if (!link_broken) MC_LOG_ERROR << "replay: event link failed: " << st.to_string();
          link_broken = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      const size_t i = *job;
      Submission sub;
      sub.request_id = records_[i].request_id;
      sub.row = &rows_[i];
      sub.tokens = synthesize_prompt(rows_[i], options_.synth);
      sub.output_length_tokens = rows_[i].output_length;
      sub.slo_ttft_ms = options_.slo_ttft_ms;
      sub.slo_tbt_ms = options_.slo_tbt_ms;
      sub.client_endpoint = client_endpoint;
      {
        std::lock_guard lock(mu_);
        states_[i].sent_ns = clock_.now_ns() - start_ns_;
      }
      Result<Admission> adm = link.submit(sub);
      std::lock_guard lock(mu_);
      State& s = states_[i];
      if (s.closed) continue;
      if (!adm.is_ok()) {
        s.error = "submit failed: " + adm.status().to_string();
        s.admission = Admission{};
      } else {
        s.admission = adm.value();
      }
      maybe_close(s);
    }
  }

  Result<ReplayResult> run(const LinkFactory& links, EventSource* events) {
    // The first link proves the Conductor is reachable before anything is sent.
    std::vector<std::unique_ptr<ConductorLink>> conns;
    const int n_senders = std::max(1, std::min<int>(options_.senders, static_cast<int>(rows_.size())));
    for (int k = 0; k < n_senders; ++k) {
      auto link = links();
      if (!link.is_ok()) return link.status();
      conns.push_back(std::move(link).value());
    }
    std::string endpoint;
    if (events) {
      MC_ASSIGN_OR_RETURN(endpoint, events->start(this));
    }
    // Senders are started (and idle on the queue) before the clock starts, so thread start-up is not
    // charged to the first sends as lag.
    std::vector<std::thread> senders;
    for (auto& c : conns) senders.emplace_back([this, &c, &endpoint] { sender_loop(*c, endpoint); });
    start_ns_ = clock_.now_ns();
    start_unix_ms_ =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();

    // Open loop: hand each row to the senders at its scheduled time.
    int64_t last_progress_ns = 0;
    for (size_t i = 0; i < rows_.size(); ++i) {
      sleep_until(states_[i].scheduled_ns);
      {
        std::lock_guard lock(mu_);
        queue_.push_back(i);
      }
      queue_cv_.notify_one();
      if (options_.progress) progress(i + 1, last_progress_ns, false);
    }
    {
      std::lock_guard lock(mu_);
      queue_closed_ = true;
    }
    queue_cv_.notify_all();

    // Drain: wait for every record to close, or the deadline.
    const auto drain = std::chrono::duration<double>(options_.drain_timeout_s);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(drain);
    {
      std::unique_lock lock(mu_);
      while (closed_count_ < rows_.size() && std::chrono::steady_clock::now() < deadline) {
        done_cv_.wait_for(lock, std::chrono::milliseconds(200));
        if (options_.progress) {
          lock.unlock();
          progress(rows_.size(), last_progress_ns, false);
          lock.lock();
        }
      }
    }
    // Nothing is sent after the deadline; senders still blocked in submit() return within the link's
    // call timeout.
    {
      std::lock_guard lock(mu_);
      queue_.clear();
      finished_ = true;
    }
    queue_cv_.notify_all();
    for (auto& t : senders) t.join();
    if (events) events->stop();
    if (options_.progress) progress(rows_.size(), last_progress_ns, true);

    ReplayResult out;
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < rows_.size(); ++i) {
      State& s = states_[i];
      if (!s.closed) {
        if (s.admission && s.admission->accepted) ++out.lost;
        s.error = "no completion within the drain timeout of " + std::to_string(options_.drain_timeout_s) + " s (" +
                  std::to_string(s.token_ns.size()) + " tokens received)";
        close(s, i);
      }
    }
    out.records = records_;
    out.unknown_events = unknown_events_;
    out.wall_s = static_cast<double>(last_close_ns_) / 1e9;
    return out;
  }

 private:
  State* find(const std::string& id) {
    auto it = index_.find(id);
    if (it == index_.end()) {
      ++unknown_events_;
      if (unknown_events_ <= 5) MC_LOG_WARN << "event for unknown request \"" << id << "\" ignored";
      return nullptr;
    }
    return &states_[it->second];
  }

  // Closes a request once its fate is known: rejected by the Conductor, failed, or done (both the
  // admission answer and the done event arrived: they may come in either order).
  void maybe_close(State& s) {
    const size_t i = static_cast<size_t>(&s - states_.data());
    if (s.admission && !s.admission->accepted && !s.error) return close(s, i);
    if (s.error) return close(s, i);
    if (s.done && s.admission) return close(s, i);
  }

  void close(State& s, size_t i) {
    if (s.closed) return;
    s.closed = true;
    ++closed_count_;
    done_cv_.notify_all();
    const int64_t closed_ns = clock_.now_ns() - start_ns_;
    last_close_ns_ = std::max(last_close_ns_, closed_ns);
    RequestRecord& r = records_[i];
    r.end_unix_ms = start_unix_ms_ + closed_ns / 1'000'000;
    const double scale = options_.time_scale;
    r.end_ms = static_cast<double>(closed_ns) / 1e6 * scale;
    if (s.sent_ns) {
      r.submit_ms = static_cast<double>(*s.sent_ns) / 1e6 * scale;
      r.send_lag_ms = static_cast<double>(*s.sent_ns - s.scheduled_ns) / 1e6;  // wall: a property of the sender
    }
    r.accepted = s.admission && s.admission->accepted;  // no answer at all: its submit failed
    if (s.admission) {
      const Admission& a = *s.admission;
      r.prefill_instance = a.prefill_instance;
      r.decode_instance = a.decode_instance;
      r.ledger.predicted_ttft_ms = a.predicted_ttft_ms;
      r.ledger.predicted_tbt_ms = a.predicted_tbt_ms;
      r.ledger.planned_hit_tokens = a.predicted_hit_tokens;
      r.ledger.pool_prefix_tokens = a.pool_prefix_tokens;
      if (a.decision) r.ledger.decision = a.decision;
    }
    if (s.admission && !s.admission->accepted && !s.error) {
      r.outcome = Outcome::kRejected;
      r.reason = s.admission->reason.empty() ? "rejected by the conductor (no reason given)" : s.admission->reason;
      r.ledger.decision = "reject";
      return;
    }
    std::vector<double> token_ms;
    token_ms.reserve(s.token_ns.size());
    if (s.sent_ns)
      for (int64_t t : s.token_ns) token_ms.push_back(static_cast<double>(t - start_ns_ - *s.sent_ns) / 1e6 * scale);
    r.output_token_ids = s.token_ids;
    std::optional<int64_t> reported = s.done ? s.done->output_tokens : std::nullopt;
    if (!token_ms.empty() || reported) apply_token_times(r, token_ms, reported);
    if (s.done) {
      Ledger l = s.done->ledger;
      for (std::optional<double>* t : {&l.transfer_ms, &l.queue_ms, &l.prefill_ms})
        if (*t) **t *= scale;
      l.predicted_ttft_ms = r.ledger.predicted_ttft_ms;
      l.predicted_tbt_ms = r.ledger.predicted_tbt_ms;
      l.planned_hit_tokens = r.ledger.planned_hit_tokens;
      l.pool_prefix_tokens = r.ledger.pool_prefix_tokens;
      if (!l.decision) l.decision = r.ledger.decision;
      r.ledger = l;
    }
    if (s.error) {
      r.outcome = Outcome::kFailed;
      r.reason = *s.error;
      return;  // its partial times stay in the record; the summary's distributions use completed ones only
    }
    r.outcome = Outcome::kCompleted;
  }

  void sleep_until(int64_t rel_ns) {
    while (true) {
      int64_t left = rel_ns - (clock_.now_ns() - start_ns_);
      if (left <= 0) return;
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(left, 50'000'000)));
    }
  }

  void progress(size_t sent, int64_t& last_ns, bool final_line) {
    const int64_t now = clock_.now_ns() - start_ns_;
    if (!final_line && now - last_ns < 500'000'000) return;
    last_ns = now;
    size_t closed;
    {
      std::lock_guard lock(mu_);
      closed = closed_count_;
    }
    const double el = static_cast<double>(now) / 1e9;
    const double rate = el > 0 ? static_cast<double>(sent) / el : 0.0;
    const double total_s = rows_.empty() ? 0.0 : static_cast<double>(states_.back().scheduled_ns) / 1e9;
    const double eta = std::max(0.0, total_s - el);
    std::fprintf(stderr, "\rmc-trace-replay: sent %zu/%zu (%.1f req/s), closed %zu, elapsed %.0f s, ETA %.0f s   %s",
                 sent, rows_.size(), rate, closed, el, eta, final_line ? "\n" : "");
    std::fflush(stderr);
  }

  const std::vector<trace::Request>& rows_;
  const ReplayOptions& options_;
  const Clock& clock_;
  std::mutex mu_;
  std::condition_variable queue_cv_, done_cv_;
  std::deque<size_t> queue_;
  bool queue_closed_ = false;
  bool finished_ = false;  // drained or past the deadline: event-polling senders stop
  std::vector<State> states_;
  std::vector<RequestRecord> records_;
  std::unordered_map<std::string, size_t> index_;
  size_t closed_count_ = 0;
  int64_t unknown_events_ = 0;
  int64_t start_ns_ = 0;
  int64_t start_unix_ms_ = 0;  // wall clock at start_ns_ (RequestRecord::end_unix_ms)
  int64_t last_close_ns_ = 0;
};

}  // namespace

Result<ReplayResult> run_replay(const std::vector<trace::Request>& rows, const ReplayOptions& options,
                                const LinkFactory& links, EventSource* events) {
  // Checked before the schedule is computed from them (a speed of 0 would divide by zero).
  if (!(options.speed > 0) || !(options.rate_scale > 0) || !(options.time_scale > 0) ||
      !std::isfinite(options.speed * options.rate_scale))
    return Status(Code::kInvalidArgument, "--speed, --rate-scale and --time-scale must be finite and > 0");
  if (options.senders < 1) return Status(Code::kInvalidArgument, "--senders must be >= 1");
  MC_RETURN_IF_ERROR(options.synth.validate());
  Run run(rows, options, RealClock::instance());
  return run.run(links, events);
}

}  // namespace mc::replay
