#include "mc/sim/instances.hpp"

#include "mc/common/queue_order.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace mc::sim {

double chunked_prefill_time_s(const CostModel& model, int64_t new_tokens, int64_t cached_tokens, int64_t chunk_tokens) {
  if (new_tokens <= 0) return 0.0;
  if (chunk_tokens <= 0 || new_tokens <= chunk_tokens) return model.prefill_time_s(new_tokens, cached_tokens);
  double total = 0;
  for (int64_t done = 0; done < new_tokens; done += chunk_tokens) {
    total += model.prefill_time_s(std::min(chunk_tokens, new_tokens - done), cached_tokens + done);
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// PrefillInstance

PrefillInstance::PrefillInstance(int nic, EventQueue& queue, Network& network, const CostModel& model,
                                 int64_t chunk_tokens)
    : nic_(nic), events_(queue), network_(network), model_(model), chunk_tokens_(chunk_tokens) {}

double PrefillInstance::compute_time_s(int64_t input_tokens, int64_t cached_tokens) const {
  return chunked_prefill_time_s(model_, input_tokens - cached_tokens, cached_tokens, chunk_tokens_);
}

double PrefillInstance::predicted_service_s(const PrefillJob& job) const {
  if (job.held) return job.held_predicted_s;
  double fetch_s = 0;
  for (const Fetch& f : job.fetches) {
    if (f.bytes <= 0 || f.src_nic < 0 || f.src_nic == nic_) continue;
    const double bw = std::min(network_.bandwidth_bytes_per_s(nic_), network_.bandwidth_bytes_per_s(f.src_nic));
    fetch_s = std::max(fetch_s, static_cast<double>(f.bytes) / bw);
  }
  return fetch_s + job.local_load_s + compute_time_s(job.input_tokens, job.cached_tokens);
}

void PrefillInstance::submit(PrefillJob job, Hooks hooks) {
  job.enqueue_ns = events_.now_ns();
  Entry e{std::move(job), std::move(hooks), 0};
  e.predicted_service_s = predicted_service_s(e.job);
  queued_tokens_ += e.job.input_tokens - e.job.cached_tokens;
  const auto at = queue_insert_position(queue_.begin(), queue_.end(), e.job.queue_key_ns, 0,
                                        [](const Entry& x) { return x.job.queue_key_ns; });
  queue_.insert(at, std::move(e));
  if (!running_)
    events_.schedule_after(0, [this] {
      if (!running_) start_next();
    });
}

double PrefillInstance::predicted_queue_s() const {
  double s = 0;
  if (running_) s += std::max<double>(0, static_cast<double>(current_predicted_end_ns_ - events_.now_ns())) * 1e-9;
  for (const auto& e : queue_) s += e.predicted_service_s;
  return s;
}

int64_t PrefillInstance::busy_compute_ns() const {
  return busy_ns_ + (compute_started_ns_ >= 0 ? events_.now_ns() - compute_started_ns_ : 0);
}

void PrefillInstance::start_next() {
  if (queue_.empty()) return;
  running_ = true;
  current_ = std::move(queue_.front());
  queue_.pop_front();
  if (current_.resumed) {  // a preempted job: its prefix is in place, its KV so far on the instance
    current_.job.preempted_ns += events_.now_ns() - current_.yielded_ns;
    current_predicted_end_ns_ = events_.now_ns() + seconds_to_ns(rest_compute_s(current_));
    compute_started_ns_ = events_.now_ns();
    run_chunk();
    return;
  }
  PrefillJob& job = current_.job;
  const int64_t before = job.input_tokens - job.cached_tokens;
  if (current_.hooks.on_start) current_.hooks.on_start(job);
  queued_tokens_ += (job.input_tokens - job.cached_tokens) - before;
  const int64_t now = events_.now_ns();
  job.start_ns = now;
  current_predicted_end_ns_ = now + seconds_to_ns(predicted_service_s(job));
  if (job.held) return;  // released by release_held()
  fetches_left_ = 1;     // held until every flow is started, so a flow finishing at once cannot win
  for (const Fetch& f : job.fetches) {
    ++fetches_left_;
    network_.start_flow(f.src_nic < 0 ? nic_ : f.src_nic, nic_, f.bytes, [this](int64_t) { fetch_done(); });
  }
  fetch_done();
}

void PrefillInstance::fetch_done() {
  if (--fetches_left_ > 0) return;
  events_.schedule_after(seconds_to_ns(current_.job.local_load_s), [this] { start_compute(); });
}

void PrefillInstance::start_compute() {
  const int64_t now = events_.now_ns();
  current_.job.compute_start_ns = now;
  compute_started_ns_ = now;
  const double compute_s = compute_time_s(current_.job.input_tokens, current_.job.cached_tokens);
  current_predicted_end_ns_ = now + seconds_to_ns(compute_s);
  if (current_.hooks.on_compute_start) current_.hooks.on_compute_start(current_.job);
  if (preempt_chunk_tokens_ > 0) {
    current_predicted_end_ns_ = now + seconds_to_ns(rest_compute_s(current_));
    run_chunk();
    return;
  }
  events_.schedule_after(seconds_to_ns(compute_s), [this] {
    const int64_t end = events_.now_ns();
    busy_ns_ += end - compute_started_ns_;
    compute_started_ns_ = -1;
    finish_current(end);
  });
}

double PrefillInstance::rest_compute_s(const Entry& e) const {
  const int64_t cached = e.job.cached_tokens + e.done_tokens;
  return chunked_prefill_time_s(model_, e.job.input_tokens - cached, cached, preempt_chunk_tokens_);
}

void PrefillInstance::run_chunk() {
  const int64_t total = current_.job.input_tokens - current_.job.cached_tokens;
  const int64_t chunk = std::min(preempt_chunk_tokens_, total - current_.done_tokens);
  const double chunk_s =
      chunk > 0 ? model_.prefill_time_s(chunk, current_.job.cached_tokens + current_.done_tokens) : 0.0;
  events_.schedule_after(seconds_to_ns(chunk_s), [this, chunk] {
    const int64_t now = events_.now_ns();
    current_.done_tokens += std::max<int64_t>(0, chunk);
    if (current_.done_tokens >= current_.job.input_tokens - current_.job.cached_tokens) {
      busy_ns_ += now - compute_started_ns_;
      compute_started_ns_ = -1;
      finish_current(now);
      return;
    }
    if (queue_.empty() || !(queue_.front().job.queue_key_ns < current_.job.queue_key_ns)) {
      run_chunk();
      return;
    }
    // A job of a smaller key waits: yield to it at this chunk boundary. The preempted job goes back before the
    // waiting jobs of its own key (it came before them) and resumes from its next chunk.
    busy_ns_ += now - compute_started_ns_;
    compute_started_ns_ = -1;
    ++preemptions_;
    Entry e = std::move(current_);
    e.resumed = true;
    e.yielded_ns = now;
    e.predicted_service_s = rest_compute_s(e);
    const auto at = std::lower_bound(queue_.begin(), queue_.end(), e.job.queue_key_ns,
                                     [](const Entry& x, int64_t k) { return x.job.queue_key_ns < k; });
    queue_.insert(at, std::move(e));
    running_ = false;
    start_next();
  });
}

void PrefillInstance::release_held(int64_t compute_start_ns, int64_t end_ns, double busy_s) {
  if (!holding()) return;
  current_.job.compute_start_ns = compute_start_ns;
  current_predicted_end_ns_ = end_ns;
  events_.schedule_at(std::max(end_ns, events_.now_ns()), [this, busy_s] {
    busy_ns_ += seconds_to_ns(busy_s);
    finish_current(events_.now_ns());
  });
}

void PrefillInstance::finish_current(int64_t end_ns) {
  current_.job.finish_ns = end_ns;
  queued_tokens_ -= current_.job.input_tokens - current_.job.cached_tokens;
  ++jobs_done_;
  Entry done = std::move(current_);
  running_ = false;
  // The finished job's KV is stored (on_done) before the next job plans its prefix (its on_start): a job queued
  // behind the one computing its prefix (a pending prefix, Scheduler step 1b) finds it, as on a real worker.
  if (done.hooks.on_done) done.hooks.on_done(done.job);
  if (!running_) start_next();
}

// ---------------------------------------------------------------------------------------------
// DecodeInstance

DecodeInstance::DecodeInstance(EventQueue& queue, const CostModel& model, int64_t kv_capacity_tokens, int64_t max_batch)
    : events_(queue), model_(model), kv_capacity_tokens_(kv_capacity_tokens), max_batch_(max_batch) {}

bool DecodeInstance::fits(int64_t tokens) const {
  return reserved_tokens_ + tokens <= kv_capacity_tokens_ || reserved_tokens_ == 0;
}

bool DecodeInstance::try_reserve(int64_t tokens) {
  if (!waiting_.empty() || !fits(tokens)) return false;  // FIFO: never overtake a waiting request
  reserved_tokens_ += tokens;
  return true;
}

void DecodeInstance::reserve_or_wait(int64_t tokens, Reserved on_reserved) {
  if (try_reserve(tokens)) {
    events_.schedule_after(0, std::move(on_reserved));
    return;
  }
  waiting_.emplace_back(tokens, std::move(on_reserved));
}

void DecodeInstance::release(int64_t tokens) {
  reserved_tokens_ -= tokens;
  admit_waiting();
}

void DecodeInstance::admit_waiting() {
  while (!waiting_.empty()) {
    const int64_t t = waiting_.front().first;
    if (!fits(t)) return;
    reserved_tokens_ += t;
    events_.schedule_after(0, std::move(waiting_.front().second));
    waiting_.pop_front();
  }
}

void DecodeInstance::join(DecodeJob job, Done on_done) {
  if (job.decode_tokens <= 0) {
    DecodeResult r;
    r.request = job.request;
    r.last_token_ns = job.first_token_ns;
    events_.schedule_after(0, [r, on_done = std::move(on_done)] { on_done(r); });
    return;
  }
  Running run;
  run.job = job;
  run.on_done = std::move(on_done);
  run.last_token_ns = job.first_token_ns;
  run.gaps_ms.reserve(static_cast<size_t>(std::min<int64_t>(job.decode_tokens, 4096)));
  joining_.push_back(std::move(run));
  if (!stepping_) events_.schedule_after(0, [this] { maybe_start_step(); });
}

double DecodeInstance::current_step_s() const {
  return running_.empty() ? 0.0 : model_.decode_step_time_s(static_cast<int64_t>(running_.size()), context_tokens_);
}

int64_t DecodeInstance::busy_ns() const { return busy_ns_ + (stepping_ ? events_.now_ns() - step_started_ns_ : 0); }

void DecodeInstance::maybe_start_step() {
  if (stepping_) return;
  const int64_t now = events_.now_ns();
  while (!joining_.empty() && (max_batch_ <= 0 || static_cast<int64_t>(running_.size()) < max_batch_)) {
    Running r = std::move(joining_.front());
    joining_.pop_front();
    r.join_ns = now;
    context_tokens_ += r.job.context_tokens;
    running_.push_back(std::move(r));
  }
  if (running_.empty()) return;
  stepping_ = true;
  step_started_ns_ = now;
  const double step_s = model_.decode_step_time_s(static_cast<int64_t>(running_.size()), context_tokens_);
  if (observer_) observer_(static_cast<int64_t>(running_.size()), context_tokens_, step_s);
  events_.schedule_after(seconds_to_ns(step_s), [this] { end_step(); });
}

void DecodeInstance::end_step() {
  const int64_t now = events_.now_ns();
  busy_ns_ += now - step_started_ns_;
  stepping_ = false;
  ++steps_;
  std::vector<Running> finished;
  size_t keep = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& r = running_[i];
    r.gaps_ms.push_back(static_cast<double>(now - r.last_token_ns) * 1e-6);
    r.last_token_ns = now;
    ++r.produced;
    ++context_tokens_;
    ++tokens_produced_;
    if (r.produced >= r.job.decode_tokens) {
      context_tokens_ -= r.job.context_tokens + r.produced;
      finished.push_back(std::move(r));
    } else {
      if (keep != i) running_[keep] = std::move(r);
      ++keep;
    }
  }
  running_.resize(keep);
  maybe_start_step();
  for (Running& r : finished) {
    DecodeResult res;
    res.request = r.job.request;
    res.tokens = r.produced;
    res.join_ns = r.join_ns;
    res.last_token_ns = r.last_token_ns;
    res.gaps_ms = std::move(r.gaps_ms);
    r.on_done(res);
  }
}

}  // namespace mc::sim
