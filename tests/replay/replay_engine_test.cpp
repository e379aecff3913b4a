// The open-loop replay engine against an in-process fake cluster (conductor + decode), through the
// ConductorLink / EventSource interfaces. The real protocol is covered by replay_rpc_test and the e2e
// tests.
#include "mc/replay/replay.hpp"
#include "mc/testkit/trace_rows.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace mc::replay {
namespace {

using testkit::trace_row;

using namespace std::chrono_literals;

// Behaviour of the fake cluster per request.
struct FakeBehaviour {
  std::chrono::milliseconds admit_delay{0};  // conductor's answer time
  std::chrono::milliseconds first_token{20};
  std::chrono::milliseconds gap{2};
  int64_t stop_after_tokens = -1;  // stop early (DESIGN.md §13.16); -1: output_length
  bool report_usage = true;
  bool send_done = true;
  std::function<bool(const Submission&)> reject;  // reject when true
  std::function<bool(const Submission&)> fail;    // decode error after the first token
};

class FakeCluster final : public EventSource {
 public:
  explicit FakeCluster(FakeBehaviour b) : b_(std::move(b)) {}
  ~FakeCluster() override { join(); }

  Result<std::string> start(EventSink* sink) override {
    sink_ = sink;
    return std::string("inproc://fake-client");
  }
  void stop() override {
    join();
    sink_ = nullptr;
  }

  // Events of requests submitted through `via` go to that link's queue (the Conductor pushes them
  // back on the submitting connection) instead of the sink.
  using Deliver = std::function<void(std::function<void(EventSink*)>)>;
  Result<Admission> submit(const Submission& sub, Deliver via = nullptr) {
    ++submitted_;
    std::this_thread::sleep_for(b_.admit_delay);
    {
      std::lock_guard lock(mu_);
      submissions_.push_back(sub.request_id);
      prompt_sizes_.push_back(sub.tokens.size());
    }
    Admission a;
    if (b_.reject && b_.reject(sub)) {
      a.reason = "predicted TTFT exceeds the SLO";
      return a;
    }
    a.accepted = true;
    a.prefill_instance = "prefill-0";
    a.decode_instance = "decode-0";
    a.predicted_ttft_ms = 15;
    a.decision = "recompute";
    a.predicted_hit_tokens = 0;
    a.pool_prefix_tokens = 512;
    const bool fail = b_.fail && b_.fail(sub);
    int64_t n =
        b_.stop_after_tokens >= 0 ? std::min(b_.stop_after_tokens, sub.output_length_tokens) : sub.output_length_tokens;
    std::lock_guard lock(mu_);
    threads_.emplace_back([this, via, id = sub.request_id, prompt = static_cast<int64_t>(sub.tokens.size()), n, fail] {
      auto deliver = [&](std::function<void(EventSink*)> f) {
        if (via) {
          via(std::move(f));
        } else {
          this->deliver(std::move(f));
        }
      };
      std::this_thread::sleep_for(b_.first_token);
      for (int64_t i = 0; i < n; ++i) {
        if (i > 0) std::this_thread::sleep_for(b_.gap);
        const uint32_t tok = static_cast<uint32_t>(100 + i);
        // By value: with a push link the call runs later, on the sender thread.
        deliver([id, tok](EventSink* s) { s->on_tokens(id, std::span<const uint32_t>(&tok, 1)); });
        if (fail) {
          deliver([id](EventSink* s) { s->on_error(id, "decode: KV incomplete (kDataLoss)"); });
          return;
        }
      }
      if (!b_.send_done) return;
      DoneReport d;
      if (b_.report_usage) d.output_tokens = n;
      d.ledger.prompt_tokens = prompt;
      d.ledger.hit_tokens_local = 0;
      d.ledger.hit_tokens_remote = 0;
      d.ledger.prefill_ms = 10;
      deliver([id, d](EventSink* s) { s->on_done(id, d); });
    });
    return a;
  }

  int submitted() const { return submitted_.load(); }
  std::vector<std::string> submissions() {
    std::lock_guard lock(mu_);
    return submissions_;
  }
  std::vector<size_t> prompt_sizes() {
    std::lock_guard lock(mu_);
    return prompt_sizes_;
  }

 private:
  template <typename F>
  void deliver(F f) {
    std::lock_guard lock(sink_mu_);  // events reach the sink from one thread at a time
    if (sink_) f(sink_);
  }
  void join() {
    std::vector<std::thread> ts;
    {
      std::lock_guard lock(mu_);
      ts.swap(threads_);
    }
    for (auto& t : ts) t.join();
  }

  FakeBehaviour b_;
  EventSink* sink_ = nullptr;
  std::mutex mu_, sink_mu_;
  std::vector<std::thread> threads_;
  std::vector<std::string> submissions_;
  std::vector<size_t> prompt_sizes_;
  std::atomic<int> submitted_{0};
};

class FakeLink final : public ConductorLink {
 public:
  explicit FakeLink(FakeCluster& c) : c_(c) {}
  Result<Admission> submit(const Submission& s) override { return c_.submit(s); }

 private:
  FakeCluster& c_;
};

// A link on which the events come back (ConductorLink::carries_events).
class FakePushLink final : public ConductorLink {
 public:
  explicit FakePushLink(FakeCluster& c) : c_(c) {}
  Result<Admission> submit(const Submission& s) override {
    return c_.submit(s, [this](std::function<void(EventSink*)> f) {
      std::lock_guard lock(mu_);
      pending_.push_back(std::move(f));
    });
  }
  bool carries_events() const override { return true; }
  Status poll_events(EventSink& sink, int timeout_ms) override {
    std::vector<std::function<void(EventSink*)>> batch;
    {
      std::lock_guard lock(mu_);
      batch.swap(pending_);
    }
    if (batch.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    for (auto& f : batch) f(&sink);
    ++polls_;
    return Status::ok();
  }

 private:
  FakeCluster& c_;
  std::mutex mu_;
  std::vector<std::function<void(EventSink*)>> pending_;
  int64_t polls_ = 0;
};

LinkFactory links_to(FakeCluster& c) {
  return [&c]() -> Result<std::unique_ptr<ConductorLink>> {
    return std::unique_ptr<ConductorLink>(std::make_unique<FakeLink>(c));
  };
}

ReplayOptions fast_options() {
  ReplayOptions o;
  o.speed = 100;  // 1 s of trace = 10 ms
  o.id_prefix = "t-";
  o.drain_timeout_s = 10;
  return o;
}

TEST(ReplayEngine, EveryRequestCompletesWithTimesAndLedger) {
  std::vector<trace::Request> rows;
  for (int i = 0; i < 20; ++i) rows.push_back(trace_row(i + 1, i * 100, 600, 5, {0, static_cast<uint64_t>(i + 1)}));
  FakeCluster cluster({});
  const auto unix_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const int64_t before_ms = unix_ms();
  auto res = run_replay(rows, fast_options(), links_to(cluster), &cluster);
  const int64_t after_ms = unix_ms();
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  ASSERT_EQ(res->records.size(), 20u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const RequestRecord& r = res->records[i];
    EXPECT_EQ(r.request_id, "t-" + std::to_string(i + 1));
    ASSERT_TRUE(r.end_unix_ms);  // the wall clock of its terminal event, inside the run
    EXPECT_GE(*r.end_unix_ms, before_ms);
    EXPECT_LE(*r.end_unix_ms, after_ms);
    EXPECT_EQ(r.outcome, Outcome::kCompleted) << r.reason;
    ASSERT_TRUE(r.ttft_ms && r.e2e_ms && r.tpot_ms && r.tbt && r.submit_ms);
    EXPECT_GE(*r.ttft_ms, 20.0);
    EXPECT_GE(*r.e2e_ms, *r.ttft_ms);
    EXPECT_EQ(*r.output_tokens, 5);
    EXPECT_EQ(r.output_tokens_source, "usage");
    EXPECT_EQ(r.tbt->gaps, 4);
    EXPECT_EQ(r.prefill_instance, "prefill-0");
    EXPECT_EQ(*r.ledger.prompt_tokens, 600);
    EXPECT_EQ(*r.ledger.predicted_ttft_ms, 15.0);
    EXPECT_EQ(*r.ledger.decision, "recompute");
    EXPECT_EQ(r.ledger.planned_hit_tokens, 0);
    EXPECT_EQ(r.ledger.pool_prefix_tokens, 512);  // the admission's figures survive the done ledger
    // Scheduled i * 100 ms of trace / speed 100 = i ms after the start.
    EXPECT_GE(*r.submit_ms, static_cast<double>(i) - 0.5);
  }
  EXPECT_EQ(cluster.submitted(), 20);
  for (size_t n : cluster.prompt_sizes()) EXPECT_EQ(n, 600u);
  Summary s = summarize(res->records, {});
  EXPECT_EQ(s.completed, 20);
  EXPECT_EQ(s.output_tokens, 100);
}

// Open loop: a slow Conductor answer does not delay later sends while senders are free; with one
// sender the backlog shows up as late sends, never hidden. The late threshold is generous (60 ms) since
// CI machines are loaded; the backlog of a single sender is 100 ms per request.
TEST(ReplayEngine, OpenLoopCountsLateSends) {
  std::vector<trace::Request> rows;
  for (int i = 0; i < 8; ++i) rows.push_back(trace_row(i + 1, 0, 512, 1, {0}));
  FakeBehaviour slow;
  slow.admit_delay = 100ms;
  // The 8 rows through a cluster that takes 100 ms to admit each request, with `senders` sender threads.
  auto replay_with = [&](int senders) -> Summary {
    FakeCluster cluster(slow);
    auto o = fast_options();
    o.senders = senders;
    auto res = run_replay(rows, o, links_to(cluster), &cluster);
    EXPECT_TRUE(res.is_ok()) << res.status().message();
    if (!res.is_ok()) return Summary{};
    SummaryOptions so;
    so.late_send_threshold_ms = 60;
    return summarize(res->records, so);
  };
  {
    Summary s = replay_with(8);
    EXPECT_EQ(s.completed, 8);
    EXPECT_EQ(s.late_sends, 0) << s.max_send_lag_ms.value_or(-1);
  }
  {
    Summary s = replay_with(1);
    EXPECT_EQ(s.completed, 8);
    EXPECT_GE(s.late_sends, 6);  // the 2nd..8th wait for 100, 200, ... ms
    EXPECT_GE(s.max_send_lag_ms.value_or(0), 600.0);
  }
}

TEST(ReplayEngine, RejectionsFailuresAndDrainTimeout) {
  std::vector<trace::Request> rows;
  for (int i = 0; i < 9; ++i) rows.push_back(trace_row(i + 1, i, 512, 3, {0}));
  FakeBehaviour b;
  b.reject = [](const Submission& s) { return s.request_id == "t-2"; };
  b.fail = [](const Submission& s) { return s.request_id == "t-3"; };
  FakeCluster cluster(b);
  auto res = run_replay(rows, fast_options(), links_to(cluster), &cluster);
  ASSERT_TRUE(res.is_ok());
  const auto& rec = res->records;
  EXPECT_EQ(rec[1].outcome, Outcome::kRejected);
  EXPECT_EQ(rec[1].reason, "predicted TTFT exceeds the SLO");
  EXPECT_EQ(*rec[1].ledger.decision, "reject");
  EXPECT_FALSE(rec[1].ttft_ms);
  EXPECT_EQ(rec[2].outcome, Outcome::kFailed);
  EXPECT_NE(rec[2].reason.find("KV incomplete"), std::string::npos);
  Summary s = summarize(rec, {});
  EXPECT_EQ(s.offered, 9);
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.completed, 7);

  // No "done" ever arrives: every request closes at the drain timeout as failed, with a reason.
  FakeBehaviour lost;
  lost.send_done = false;
  FakeCluster silent(lost);
  auto o = fast_options();
  o.drain_timeout_s = 0.3;
  auto r2 = run_replay(rows, o, links_to(silent), &silent);
  ASSERT_TRUE(r2.is_ok());
  for (const auto& r : r2->records) {
    EXPECT_EQ(r.outcome, Outcome::kFailed);
    EXPECT_NE(r.reason.find("drain timeout"), std::string::npos) << r.reason;
  }
}

// Field report #16 through the engine: 128 requested, 7 produced; usage reported or not.
TEST(ReplayEngine, EarlyStopTpotOnProducedTokens) {
  std::vector<trace::Request> rows = {trace_row(1, 0, 512, 128, {0})};
  for (bool usage : {true, false}) {
    FakeBehaviour b;
    b.stop_after_tokens = 7;
    b.report_usage = usage;
    b.gap = 10ms;
    FakeCluster cluster(b);
    auto res = run_replay(rows, fast_options(), links_to(cluster), &cluster);
    ASSERT_TRUE(res.is_ok());
    const RequestRecord& r = res->records[0];
    EXPECT_EQ(r.outcome, Outcome::kCompleted);
    EXPECT_EQ(r.output_tokens_requested, 128);
    EXPECT_EQ(*r.output_tokens, 7);
    EXPECT_EQ(r.output_tokens_source, usage ? "usage" : "counted");
    EXPECT_NEAR(*r.tpot_ms, (*r.e2e_ms - *r.ttft_ms) / 6, 1e-9);
    EXPECT_GE(*r.tpot_ms, 9.0);
  }
}

TEST(ReplayEngine, TimeScaleMultipliesMeasuredTimes) {
  std::vector<trace::Request> rows = {trace_row(1, 0, 512, 2, {0})};
  FakeBehaviour b;
  b.first_token = 50ms;
  FakeCluster cluster(b);
  auto o = fast_options();
  o.time_scale = 10;
  auto res = run_replay(rows, o, links_to(cluster), &cluster);
  ASSERT_TRUE(res.is_ok());
  EXPECT_GE(*res->records[0].ttft_ms, 500.0);
  EXPECT_DOUBLE_EQ(*res->records[0].ledger.prefill_ms, 100.0);
}

TEST(ReplayEngine, UnreachableConductorFailsBeforeSending) {
  std::vector<trace::Request> rows = {trace_row(1, 0, 512, 2, {0})};
  FakeCluster cluster({});
  LinkFactory down = []() -> Result<std::unique_ptr<ConductorLink>> {
    return Status(Code::kUnavailable, "conductor tcp://127.0.0.1:1 not reachable");
  };
  auto res = run_replay(rows, fast_options(), down, &cluster);
  ASSERT_FALSE(res.is_ok());
  EXPECT_EQ(res.status().code(), Code::kUnavailable);
  EXPECT_EQ(cluster.submitted(), 0);

  auto bad = fast_options();
  bad.speed = 0;
  EXPECT_EQ(run_replay(rows, bad, links_to(cluster), &cluster).status().code(), Code::kInvalidArgument);
}

TEST(ReplayEngine, EventsOnTheSubmittingLink) {
  std::vector<trace::Request> rows;
  for (int i = 0; i < 12; ++i) rows.push_back(trace_row(i + 1, i * 50, 700, 4, {0, static_cast<uint64_t>(100 + i)}));
  FakeBehaviour b;
  b.reject = [](const Submission& s) { return s.request_id == "t-5"; };
  FakeCluster cluster(b);
  LinkFactory push = [&cluster]() -> Result<std::unique_ptr<ConductorLink>> {
    return std::unique_ptr<ConductorLink>(std::make_unique<FakePushLink>(cluster));
  };
  auto o = fast_options();
  o.senders = 3;
  o.record_token_ids = true;
  auto res = run_replay(rows, o, push, nullptr);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  Summary s = summarize(res->records, {});
  EXPECT_EQ(s.offered, 12);
  EXPECT_EQ(s.completed, 11);
  EXPECT_EQ(s.rejected, 1);
  for (const auto& r : res->records) {
    if (r.outcome != Outcome::kCompleted) continue;
    EXPECT_EQ(*r.output_tokens, 4);
    EXPECT_EQ(r.tbt->gaps, 3);
    EXPECT_EQ(r.output_token_ids, (std::vector<uint32_t>{100, 101, 102, 103}));
  }
  cluster.stop();
}

TEST(ReplayEngine, EmptyWindow) {
  FakeCluster cluster({});
  auto res = run_replay({}, fast_options(), links_to(cluster), &cluster);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  EXPECT_TRUE(res->records.empty());
  EXPECT_EQ(summarize(res->records, {}).offered, 0);
}

}  // namespace
}  // namespace mc::replay
