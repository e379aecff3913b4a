#!/usr/bin/env bash
# queue-study.sh: the policy study of issue 24 (docs/REPRODUCTION.md §7) with mc-sim: the four baselines (FCFS
# queues, as in the paper) and the kvcache policy with issue 24's additions one by one (the SLO-aware queue order,
# pending prefixes, load-priced placement, SLO headroom, load shedding; the last run is mc-sim's default kvcache), on one trace at
# several loads; prints one markdown row per (load, run): mean, p90, p99 and max TTFT, rejected, SLO attainment,
# goodput and the prefill GPU-seconds, then the no-queue bound (kvcache at 1/20 of the trace's rate).
#
# Runs one mc-sim at a time, under nice (CPU heavy). Options (environment variable in brackets):
#   --trace FILE        the trace                              [MC_TRACE, examples/traces/conversation_trace.jsonl]
#   --loads LIST        comma-separated rate scales            [MC_LOADS, 1,2,2.5,3]
#   --keep DIR          keep every run's JSON (DIR/<run>-<load>.json)   [MC_KEEP]
#   --build-dir DIR     binaries in DIR/bin                    [MC_BUILD_DIR, build]
#   -h, --help          this text
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

trace="${MC_TRACE:-$root/examples/traces/conversation_trace.jsonl}"
loads="${MC_LOADS:-1,2,2.5,3}"
keep="${MC_KEEP:-}"
build_dir="${MC_BUILD_DIR:-$root/build}"
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "queue-study.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --trace) need "$@"; trace="$2"; shift 2 ;;
    --loads) need "$@"; loads="$2"; shift 2 ;;
    --keep) need "$@"; keep="$2"; shift 2 ;;
    --build-dir) need "$@"; build_dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "queue-study.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
sim="$build_dir/bin/mc-sim"
[[ -x "$sim" ]] || { echo "queue-study.sh: $sim not found: build it first (cmake --build build --target mc-sim)" >&2; exit 1; }

dir="${keep:-$(mktemp -d "${TMPDIR:-/tmp}/mc-queue-study.XXXXXX")}"
mkdir -p "$dir"
[[ -n "$keep" ]] || trap 'rm -rf "$dir"' EXIT

# name|mc-sim arguments (the baselines as in docs/REPRODUCTION.md §1: each with its own cache unless it is the
# global-pool one; every baseline keeps FCFS queues and prices the pool as it is, as the paper's kvcache does), then
# kvcache with each of issue 24's additions in turn (the SLO order, pending prefixes, load-priced placement, SLO
# headroom, load shedding; docs/DESIGN.md §10), the last with mc-sim's defaults.
runs=(
  "random (local, fcfs)|--policy random --cache-mode local --queue fcfs"
  "least_loaded (global, fcfs)|--policy least_loaded --queue fcfs"
  "cache_aware (local, fcfs)|--policy cache_aware --cache-mode local --queue fcfs"
  "kvcache (global, fcfs)|--policy kvcache --queue fcfs --pending-prefix off --placement-load-weight 0 --slo-headroom 0 --shed-limit 0"
  "kvcache + slo order|--policy kvcache --queue slo --pending-prefix off --placement-load-weight 0 --slo-headroom 0 --shed-limit 0"
  "kvcache + slo + pending prefix|--policy kvcache --queue slo --pending-prefix on --placement-load-weight 0 --slo-headroom 0 --shed-limit 0"
  "kvcache + slo + pending + load-priced|--policy kvcache --slo-headroom 0 --shed-limit 0"
  "kvcache + slo + pending + load-priced + headroom|--policy kvcache --shed-limit 0"
  "kvcache + slo + pending + load-priced + headroom + shedding (default)|--policy kvcache"
)
row() {  # file, load, name
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); s = d["summary"]; t = s["ttft_ms"]; slo = s["slo"][0]
print("| %s | %s | %.2f | %.2f | %.2f | %.2f | %d | %.2f | %.3f | %.0f |" % (
    sys.argv[2], sys.argv[3], t["mean"] / 1e3, t["p90"] / 1e3, t["p99"] / 1e3, t["max"] / 1e3,
    s["requests"]["rejected"], 100 * slo["attainment"], slo["goodput_rps"], d["totals"]["prefill_gpu_s"]))
EOF
}
echo "| load | run | mean TTFT s | p90 s | p99 s | max s | rejected | SLO attainment % | goodput req/s | prefill GPU-s |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
IFS=',' read -r -a load_list <<< "$loads"
for load in "${load_list[@]}"; do
  for r in "${runs[@]}"; do
    name="${r%%|*}"
    read -r -a args <<< "${r#*|}"
    out="$dir/$(echo "$name" | tr -c 'a-z0-9' '_')-$load.json"
    echo "queue-study.sh: $name at ${load}x" >&2
    nice -n 10 "$sim" --trace "$trace" --rate-scale "$load" "${args[@]}" --json > "$out"
    row "$out" "$load" "$name"
  done
done
out="$dir/no_queue_bound.json"
nice -n 10 "$sim" --trace "$trace" --rate-scale 0.05 --policy kvcache --queue fcfs --json > "$out"
row "$out" 0.05 "no-queue bound: kvcache at 1/20 of the rate"
