#!/usr/bin/env bash
# compare-policies.sh: the same trace window once per Conductor placement policy, one summary row each.
#
# For each policy (random, least_loaded, cache_aware, kvcache) it starts a fresh local cluster with the
# sim backend (examples/local-cluster.sh, as examples/replay-conversation.sh does), replays the same
# window of the shipped conversation trace, keeps the per-request records, stops the cluster, and at
# the end prints one row per policy (mc-trace-replay report over all the records): offered, accepted,
# completed, mean and p90 TTFT, p90 TBT, SLO attainment, goodput, cache hit ratio, avoided prefill tokens.
# The paper's ordering on this trace is kvcache (cache and load aware) < least_loaded < random in mean TTFT.
#
# Options (environment variable in brackets):
#   --duration-s S      trace window in seconds of trace time          [MC_DURATION_S, 60]
#   --start-s S         where the window starts                        [MC_START_S, 0]
#   --speed X           time compression of cluster and replay         [MC_SPEED, 4]
#   --policies LIST     comma-separated                                [MC_POLICIES, random,least_loaded,cache_aware,kvcache]
#   --keep DIR          keep the records (DIR/<policy>.jsonl)          [MC_KEEP]
#   --json              print the summaries as one JSON list
#   --build-dir DIR     binaries in DIR/bin (built if missing)         [MC_BUILD_DIR, build]
#   -h, --help          this text
# About 25 s per policy on a 2-core machine with the defaults.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

duration_s="${MC_DURATION_S:-60}"
start_s="${MC_START_S:-0}"
speed="${MC_SPEED:-4}"
policies="${MC_POLICIES:-random,least_loaded,cache_aware,kvcache}"
keep="${MC_KEEP:-}"
build_dir="${MC_BUILD_DIR:-$root/build}"
json=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "compare-policies.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration-s) need "$@"; duration_s="$2"; shift 2 ;;
    --start-s) need "$@"; start_s="$2"; shift 2 ;;
    --speed) need "$@"; speed="$2"; shift 2 ;;
    --policies) need "$@"; policies="$2"; shift 2 ;;
    --keep) need "$@"; keep="$2"; shift 2 ;;
    --json) json=(--json); shift ;;
    --build-dir) need "$@"; build_dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare-policies.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

dir="${keep:-$(mktemp -d "${TMPDIR:-/tmp}/mc-compare.XXXXXX")}"
mkdir -p "$dir"
[[ -n "$keep" ]] || trap 'rm -rf "$dir"' EXIT
files=()
IFS=',' read -r -a list <<< "$policies"
for p in "${list[@]}"; do
  echo "compare-policies.sh: policy $p" >&2
  # Every policy's records count, also when some of its requests failed (--allow-failures).
  "$here/replay-conversation.sh" --build-dir "$build_dir" --start-s "$start_s" --duration-s "$duration_s" \
    --speed "$speed" --policy "$p" --out "$dir/$p.jsonl" -- --allow-failures > "$dir/$p.summary.txt"
  files+=("$dir/$p.jsonl")
done
"$build_dir/bin/mc-trace-replay" report "${files[@]}" "${json[@]}"
