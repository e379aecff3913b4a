// The live, open-loop trace replay of mc-trace-replay (DESIGN.md §3–5).
//
// Rows of the trace window are sent at their scheduled times whether or not earlier requests have
// finished: row i is due at (timestamp_i - timestamp_first) / (speed * rate_scale) wall seconds after
// the start. A pool of sender threads does the submissions, so a slow admission reply does not hold
// back the next send; a send that leaves more than late_send_threshold_ms behind schedule is counted
// as late (Summary::late_sends, threshold in SummaryOptions), never hidden. Output tokens arrive as events,
// pushed by the Conductor on the submitting connection, or at a client endpoint this replay binds
// and names in each submission (EventSource); each request's record is
// closed by "done" (with the ledger), by an error, by a rejection, or by the drain timeout.
//
// Time scale: a cluster whose sim backend sleeps modelled time / T runs T times faster than the
// hardware it models. With time_scale = T every measured duration is multiplied by T, so records
// and summary are in modelled milliseconds (pass the same T as --speed to keep the arrival process
// in modelled time too). Default 1: wall-clock milliseconds.
//
// The transports sit behind two small interfaces, so the engine is tested with in-process fakes and
// run against mc-conductor / mc-decode through the real protocol (conductor_link.hpp).
//
// Clock: the real monotonic clock (an open-loop sender is about wall time; the simulator has its own).
// Thread-safety: run_replay() is blocking and uses its own threads; ConductorLink objects are used by
// one sender thread each.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mc/common/status.hpp"
#include "mc/replay/analyze.hpp"
#include "mc/replay/synth.hpp"
#include "mc/report/report.hpp"
#include "mc/trace/trace.hpp"

namespace mc::replay {

// One request as submitted to the Conductor.
struct Submission {
  std::string request_id;
  const trace::Request* row = nullptr;  // the trace row (input_length, output_length, hash_ids); owned by run_replay
  std::vector<uint32_t> tokens;         // the synthesized prompt (synth.hpp)
  int64_t output_length_tokens = 0;
  double slo_ttft_ms = 0;  // the request's SLO (modelled ms)
  double slo_tbt_ms = 0;
  std::string client_endpoint;  // where the decode instance sends token events
};

class EventSink;

// The Conductor's answer to a submission.
struct Admission {
  bool accepted = false;
  std::string reason;  // why rejected
  std::string prefill_instance, decode_instance;
  std::optional<double> predicted_ttft_ms;  // modelled ms
  std::optional<double> predicted_tbt_ms;   // accepted: the decode step time predicted for it (modelled ms)
  std::optional<std::string> decision;      // fetch | recompute
  std::optional<int64_t> predicted_hit_tokens;
  std::optional<int64_t> pool_prefix_tokens;  // the longest prefix the pool held at placement
};

// A connection to the Conductor used by one sender thread.
class ConductorLink {
 public:
  virtual ~ConductorLink() = default;
  // Blocks until the Conductor answers (accepted or rejected) or the call fails (timeout, unavailable).
  virtual Result<Admission> submit(const Submission& submission) = 0;
  // True when the request's events come back on this link (the Conductor pushes them to the
  // connection that submitted): the sender thread then calls poll_events() whenever it is idle.
  virtual bool carries_events() const { return false; }
  // Delivers the events that arrived (waiting up to timeout_ms for the first) to `sink`. An error
  // means the link itself broke (it is logged; the requests it carried close at the drain timeout).
  virtual Status poll_events(EventSink& /*sink*/, int /*timeout_ms*/) { return Status::ok(); }
};
// Opens one link; fails with kUnavailable/kTimeout naming the endpoint when the Conductor is not there.
using LinkFactory = std::function<Result<std::unique_ptr<ConductorLink>>()>;

// What the serving side reports when a request is done.
struct DoneReport {
  std::optional<int64_t> output_tokens;  // the server's count; absent when it sent none
  Ledger ledger;                         // times in wall ms as measured by the cluster (scaled by run_replay)
};

// Receives a request's events. Thread-safe: any thread may call it at any time during run_replay().
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Output tokens of request_id arrived now, in order (the first call carries the first token).
  virtual void on_tokens(const std::string& request_id, std::span<const uint32_t> token_ids) = 0;
  virtual void on_done(const std::string& request_id, const DoneReport& report) = 0;
  virtual void on_error(const std::string& request_id, const std::string& message) = 0;
};

// Receives events at an endpoint of its own (workers send tokens straight to the client) and
// forwards them to a sink.
class EventSource {
 public:
  virtual ~EventSource() = default;
  // Starts delivering to `sink` (which outlives stop()); returns the endpoint to name in submissions.
  virtual Result<std::string> start(EventSink* sink) = 0;
  // Stops delivering; after it returns no sink method is called any more.
  virtual void stop() = 0;
};

struct ReplayOptions {
  Window window;
  double speed = 1.0;       // trace time / wall time
  double rate_scale = 1.0;  // multiplies the arrival rate (divides the gaps) on top of speed
  double time_scale = 1.0;  // measured durations x time_scale = reported (see above)
  SynthOptions synth;
  int senders = 16;              // sender threads (concurrent submissions in flight)
  double drain_timeout_s = 120;  // after the last send: wait this long (wall) for outstanding requests
  std::string id_prefix;         // request ids are "<id_prefix><trace line>"; empty: "r<pid>-<line>-"
  double slo_ttft_ms = 30000;    // sent with each request (modelled ms)
  double slo_tbt_ms = 100;
  bool progress = false;          // rate and ETA on stderr (the tool sets it when stderr is a terminal)
  bool record_token_ids = false;  // keep each request's output token ids in its record
};

struct ReplayResult {
  std::vector<RequestRecord> records;  // one per offered request, in trace order
  int64_t unknown_events = 0;          // events naming no request of this run (ignored)
  int64_t lost = 0;                    // accepted requests with no terminal event by the drain timeout (failed)
  double wall_s = 0;                   // first send -> last record closed
};

// Reads the window of `rows`, replays it, and returns one record per offered request.
// Errors: the first link cannot be opened (the Conductor is unreachable: kUnavailable/kTimeout), the
// event source cannot start, or bad options (kInvalidArgument). Per-request failures are records.
// `events`: nullptr when the links carry the events (ConductorLink::carries_events()).
Result<ReplayResult> run_replay(const std::vector<trace::Request>& rows, const ReplayOptions& options,
                                const LinkFactory& links, EventSource* events);

}  // namespace mc::replay
