// mc-trace-replay: replays a Mooncake JSONL trace against an mc cluster (open loop, through
// mc-conductor) and reports TTFT, TBT, TPOT, E2E, SLO attainment, goodput and the KV-cache ledger;
// `analyze` describes a trace without a cluster; `report` re-summarises a run's JSONL records; `convert` writes any
// accepted trace format as Mooncake JSONL; `gen` writes a synthetic session-structured trace.
#include <unistd.h>

#include <iostream>

#include "mc/cli/cli.hpp"
#include "mc/common/units.hpp"
#include "mc/net/flags.hpp"
#include "mc/replay/command.hpp"
#include "mc/trace/trace_flags.hpp"

namespace {

using mc::replay::TraceInput;

// The trace and window flags, declared once for every command that reads a trace.
void add_trace_flags(CLI::App& app, TraceInput& in) {
  app.add_option("trace", in.path, "Trace file (Mooncake JSONL, Azure or BurstGPT CSV), or - for stdin")
      ->capture_default_str();
  app.add_flag("--lenient", in.lenient,
               "Skip malformed rows with a warning and a final count (default: strict, the first bad row fails "
               "with its line number)");
  app.add_flag_callback(
      "--strict", [&in] { in.lenient = false; }, "Stop at the first malformed row, naming its line (the default)");
  app.add_option("--trace-block-size", in.trace_block_size, "Tokens per hash_id in the trace")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  mc::cli::add_trace_format_flags(app, in.formats);
  mc::cli::add_trace_window_flags(app, in.window.start_s, in.window.duration_s, in.window.max_requests);
}

// --slo-ttft-ms / --slo-tbt-ms / --late-threshold-ms and --json, for the commands that summarise records.
void add_summary_flags(CLI::App& app, mc::replay::SummaryOptions& opt, bool& json) {
  mc::cli::add_slo_list_flags(app, "--slo-ttft-ms", opt.slo_ttft_ms, "--slo-tbt-ms", opt.slo_tbt_ms,
                              " of SLO attainment; replay sends the first with each request");
  app.add_option("--late-threshold-ms", opt.late_send_threshold_ms,
                 "A send more than this behind its scheduled time counts as late (ms)")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  mc::cli::add_json_flag(app, json, "Print one JSON document instead of the table");
}

// --html / --svg: the pictures of a command (mc/report/page.hpp).
void add_picture_flags(CLI::App& app, mc::replay::PictureOutput& pictures, const std::string& what) {
  app.add_option("--html", pictures.html_path,
                 "Also write one self-contained HTML page (opens offline) with " + what +
                     ", drawn by gnuplot (apt-get install gnuplot-nox; MC_GNUPLOT names another binary)");
  app.add_option("--svg", pictures.svg_dir, "Also write each chart as DIR/<chart>.svg (the directory is created)");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program = "mc-trace-replay";
  CLI::App app{
      "mc-trace-replay: replay a Mooncake JSONL trace against an mc cluster through mc-conductor (open loop) and "
      "report TTFT, TBT, TPOT, E2E, SLO attainment, goodput and the KV-cache ledger.\n"
      "  mc-trace-replay TRACE --conductor tcp://127.0.0.1:PORT [--speed X] [--out records.jsonl]\n"
      "  mc-trace-replay analyze TRACE        (no cluster: lengths, arrival rate, prefix-cache hit ratios)\n"
      "  mc-trace-replay report RECORDS.jsonl... (the summary of finished runs; several: one row each)\n"
      "  mc-trace-replay convert TRACE [--out FILE] (any accepted format as Mooncake JSONL)\n"
      "  mc-trace-replay gen [--sessions N] [--seed S] [--out FILE] (a synthetic session trace)"};
  mc::cli::add_common_flags(app, program);

  // ---- replay (the default command) ----
  mc::replay::ReplayCommand rc;
  add_trace_flags(app, rc.input);
  app.add_option("--conductor", rc.conductor.endpoint, "mc-conductor endpoint (tcp://host:port)")
      ->envname("MC_CONDUCTOR");
  app.add_option("--target", rc.target,
                 "Replay through mc-gateway's OpenAI HTTP API at this URL (http://HOST:PORT) instead of the "
                 "Conductor: streamed completions with the synthesized token ids as prompts; TTFT/TBT measured here")
      ->envname("MC_TARGET");
  app.add_option("--target-model", rc.target_model,
                 "With --target: the model each request names (default: the first of GET /v1/models)")
      ->envname("MC_TARGET_MODEL");
  app.add_option("--api-key", rc.target_api_key,
                 "With --target: the gateway's API key, sent as 'Authorization: Bearer KEY' (mc-gateway --api-keys)")
      ->envname("MC_API_KEY");
  app.add_option("--client-bind", rc.client_bind,
                 "Endpoint this replay binds for token events from mc-decode (an address the decode instances can "
                 "reach; port 0 picks a free one)")
      ->capture_default_str()
      ->envname("MC_CLIENT_BIND");
  app.add_option("--connect-timeout-ms", rc.conductor.connect_timeout_ms,
                 "Give up when the conductor does not answer the handshake within this time (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--submit-timeout-ms", rc.conductor.submit_timeout_ms,
                 "A submission not answered within this time fails (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  app.add_option("--speed", rc.replay.speed, "Trace time / wall time: 10 replays 10 s of trace per second")
      ->capture_default_str()
      ->envname("MC_REPLAY_SPEED");
  mc::cli::add_rate_scale_option(app, rc.replay.rate_scale);  // on top of --speed
  mc::cli::add_time_scale_option(app, rc.replay.time_scale,
                                 "Multiply measured durations by this (the sim backend's --time-scale), so the "
                                 "report is in modelled time");
  app.add_option("--senders", rc.replay.senders, "Sender threads: submissions that may be in flight at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--drain-timeout-s", rc.replay.drain_timeout_s,
                 "After the last send, wait this long (wall seconds) for outstanding requests; the rest fail")
      ->capture_default_str()
      ->check(mc::cli::kNonNegativeFinite);
  mc::cli::add_block_size_option(app, rc.replay.synth.block_tokens, "--block-tokens",
                                 "Tokens synthesized per trace block (< --trace-block-size scales prompts down; "
                                 "the cluster's block size must equal it)");
  app.add_option("--vocab-size", rc.replay.synth.vocab_size,
                 "Synthesized token ids are in [0, vocab size) (local-cluster.sh sets it to its model's)")
      ->envname("MC_VOCAB_SIZE")
      ->capture_default_str();
  app.add_option("--synth-seed", rc.replay.synth.seed, "Seed of the token synthesis (equal ids -> equal tokens)")
      ->capture_default_str();
  app.add_option("--max-output-tokens", rc.max_output_tokens, "Cap each row's output_length (0: as in the trace)")
      ->capture_default_str();
  app.add_option("--max-input-tokens", rc.max_input_tokens,
                 "Cut each prompt to its first N tokens, keeping its leading hash_ids (0: as in the trace)")
      ->capture_default_str();
  app.add_option("--id-prefix", rc.replay.id_prefix, "Request ids are <prefix><trace line> (default: r<pid>-)");
  app.add_option("--out", rc.out_path, "Write one JSON object per request (JSONL) to this file");
  app.add_flag("--allow-failures", rc.allow_failures,
               "Exit 0 even when accepted requests failed or were lost (default: exit 1 after the summary)");
  app.add_flag("--record-token-ids", rc.replay.record_token_ids,
               "Keep each request's output token ids in its record (output_token_ids)");
  bool progress = false, no_progress = false;
  app.add_flag("--progress", progress, "Show rate and ETA on stderr even when it is not a terminal");
  app.add_flag("--no-progress", no_progress, "Never show progress");
  add_summary_flags(app, rc.summary, rc.json);

  // ---- analyze ----
  mc::replay::AnalyzeCommand ac;
  std::string capacities = "1M,3M,10M,50M";
  auto* analyze = app.add_subcommand("analyze",
                                     "Describe a trace without a cluster: counts, arrival rate, length "
                                     "percentiles, blocks, prefix-cache hit ratio (infinite and LRU)");
  add_trace_flags(*analyze, ac.input);
  analyze->add_option("--capacity-tokens", capacities, "LRU capacities to sweep, in tokens (K/M/G suffixes)")
      ->capture_default_str();
  mc::cli::add_json_flag(*analyze, ac.json, "Print one JSON document instead of the table");
  add_picture_flags(*analyze, ac.pictures,
                    "the capacity curve (hit ratio against cache tokens), the length distributions and the arrivals");

  // ---- report ----
  mc::replay::ReportCommand pc;
  auto* report = app.add_subcommand(
      "report", "Summarise the JSONL records of a finished replay (--out); several files: one comparison row each");
  report->add_option("records", pc.records_paths, "JSONL records written by --out (one or more files)")->required();
  add_summary_flags(*report, pc.summary, pc.json);
  add_picture_flags(*report, pc.pictures,
                    "the TTFT and TBT CDFs (a curve per run), TTFT over time with rejections, per-instance queue and "
                    "load, the hit ratio over time (local/remote/SSD), GPU-seconds spent and saved, SLO attainment");
  report
      ->add_option("--gpus-per-instance", pc.gpus_per_instance,
                   "GPUs of one prefill instance, for the page's GPU-seconds (ledger prefill_ms x this)")
      ->capture_default_str()
      ->envname("MC_GPUS_PER_INSTANCE")
      ->check(CLI::Range(1e-3, 1024.0));

  // ---- convert ----
  mc::replay::ConvertCommand cc;
  auto* convert = app.add_subcommand(
      "convert", "Write a trace of any accepted format (Mooncake JSONL, Azure or BurstGPT CSV) as Mooncake JSONL");
  add_trace_flags(*convert, cc.input);
  convert->add_option("--out", cc.out_path, "Where to write the JSONL (- for stdout)")->capture_default_str();

  // ---- gen ----
  mc::replay::GenCommand gc;
  mc::replay::GenOptions& g = gc.options;
  auto* gen = app.add_subcommand("gen",
                                 "Write a synthetic session-structured trace (sessions, turns, shared system "
                                 "prompts, Poisson or bursty arrivals) as Mooncake JSONL, deterministic by seed");
  gen->add_option("--sessions", g.sessions, "Sessions to generate, 1 to 10,000,000")->capture_default_str();
  gen->add_option("--session-rate", g.session_rate, "Sessions started per second (mean), > 0 and <= 1,000,000")
      ->capture_default_str();
  gen->add_option("--arrival", g.arrival, "Session starts: poisson (exponential gaps) or bursty (gamma gaps)")
      ->capture_default_str()
      ->check(CLI::IsMember({"poisson", "bursty"}));
  gen->add_option("--burst-cv", g.burst_cv,
                  "bursty: coefficient of variation of the gaps between session starts, 1 to 100")
      ->capture_default_str();
  gen->add_option("--turns-mean", g.turns_mean, "Mean turns per session (geometric), 1 to 1,000")
      ->capture_default_str();
  gen->add_option("--think-s", g.think_s, "Mean gap between a session's turns, seconds (exponential), 0 to 1,000,000")
      ->capture_default_str();
  gen->add_option("--system-prompts", g.system_prompts, "Shared system prompts, 0 (none) to 100,000")
      ->capture_default_str();
  gen->add_option("--system-tokens", g.system_tokens,
                  "Mean system prompt length, tokens (each 0.5x to 1.5x), 0 to 16,777,216")
      ->capture_default_str();
  gen->add_option("--zipf", g.zipf, "Popularity skew of the system prompts, 0 (uniform) to 10")->capture_default_str();
  gen->add_option("--user-tokens", g.user_tokens, "Mean user message per turn, tokens (lognormal), 1 to 1e7")
      ->capture_default_str();
  gen->add_option("--output-tokens", g.output_tokens, "Mean answer, tokens (lognormal), 1 to 1e7")
      ->capture_default_str();
  gen->add_option("--length-sigma", g.length_sigma, "Lognormal sigma of user messages and answers, 0 to 5")
      ->capture_default_str();
  gen->add_option(
         "--max-input-tokens", g.max_input_tokens,
         "A session's first prompt is cut to this many tokens; a session ends before a later prompt longer than this; "
         "at most 65,536 blocks of --block-size")
      ->capture_default_str();
  gen->add_option("--block-size", g.block_size, "Tokens per hash_id, 1 to 16,777,216")->capture_default_str();
  gen->add_option("--seed", g.seed, "Seed, 0 to 2^64 - 1: the same seed writes the same trace")->capture_default_str();
  gen->add_option("--out", gc.out_path, "Where to write the JSONL (- for stdout)")->capture_default_str();

  mc::cli::add_auth_flags(app, "default");
  if (int rc_parse = mc::cli::parse(app, argc, argv); rc_parse >= 0) return rc_parse;

  if (analyze->parsed()) {
    auto caps = mc::units::parse_count_list(capacities);
    if (!caps.is_ok()) return mc::cli::report(program, caps.status().with_context("--capacity-tokens"));
    ac.capacity_tokens = caps.value();
    return mc::cli::report(program, mc::replay::run_analyze_command(ac, std::cout));
  }
  if (report->parsed()) {
    return mc::cli::report(program, mc::replay::run_report_command(pc, std::cout));
  }
  if (convert->parsed()) return mc::cli::report(program, mc::replay::run_convert_command(cc, std::cout));
  if (gen->parsed()) return mc::cli::report(program, mc::replay::run_gen_command(gc, std::cout));
  if (rc.conductor.endpoint.empty() && rc.target.empty())
    return mc::cli::report(
        program,
        mc::Status(
            mc::Code::kInvalidArgument,
            "no conductor: pass --conductor tcp://host:port (or set MC_CONDUCTOR), or --target http://HOST:PORT, "
            "or use `mc-trace-replay analyze TRACE` to study a trace alone"));
  rc.replay.progress = !no_progress && (progress || ::isatty(STDERR_FILENO));
  return mc::cli::report(program, mc::replay::run_replay_command(rc, std::cout));
}
