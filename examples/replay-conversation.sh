#!/usr/bin/env bash
# replay-conversation.sh: the main job of mc, end to end on this machine.
#
# Builds mc if needed (cmake + ninja into build/), starts a local cluster on loopback with the sim
# backend (examples/local-cluster.sh: 1 store master, 2 storage nodes, 1 conductor, 2 prefill and
# 2 decode instances modelling LLaMA3-70B on 8xA800 servers), replays a window of the shipped
# conversation trace (examples/traces/conversation_trace.jsonl, Mooncake FAST'25) compressed in
# time, and prints the summary: TTFT, TBT, TPOT, E2E, SLO attainment, goodput and the KV-cache
# ledger. The cluster runs SPEED times faster than the hardware it models (the sim backend's
# --time-scale) and the replay sends SPEED times faster than the trace, so the reported times are in
# modelled milliseconds; prefixes shared in the trace show up as a non-zero cache hit ratio.
# Everything is stopped and cleaned up on exit or Ctrl-C.
#
# Options (environment variable in brackets):
#   --duration-s S     trace window in seconds of trace time          [MC_DURATION_S, 120]
#   --start-s S        where the window starts in the trace           [MC_START_S, 0]
#   --speed X          time compression of cluster and replay         [MC_SPEED, 4]
#   --policy NAME      random | least_loaded | cache_aware | kvcache  [MC_POLICY, kvcache]
#   --prefill P        prefill instances                              [MC_PREFILL, 2]
#   --decode D         decode instances                               [MC_DECODE, 2]
#   --out FILE         also keep the per-request JSONL records        [MC_OUT]
#   --json             print the summary as JSON
#   --build-dir DIR    where to build / find the binaries             [MC_BUILD_DIR, build]
#   -h, --help         this text
# Any other option after -- is passed to mc-trace-replay (for example -- --max-requests 100).
# It takes about 1 minute on a 2-core machine once built (the build itself takes longer).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

duration_s="${MC_DURATION_S:-120}"
start_s="${MC_START_S:-0}"
speed="${MC_SPEED:-4}"
policy="${MC_POLICY:-kvcache}"
n_prefill="${MC_PREFILL:-2}"
n_decode="${MC_DECODE:-2}"
out="${MC_OUT:-}"
build_dir="${MC_BUILD_DIR:-$root/build}"
json=()
extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "replay-conversation.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration-s) need "$@"; duration_s="$2"; shift 2 ;;
    --start-s) need "$@"; start_s="$2"; shift 2 ;;
    --speed) need "$@"; speed="$2"; shift 2 ;;
    --policy) need "$@"; policy="$2"; shift 2 ;;
    --prefill) need "$@"; n_prefill="$2"; shift 2 ;;
    --decode) need "$@"; n_decode="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --json) json=(--json); shift ;;
    --build-dir) need "$@"; build_dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "replay-conversation.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bin="$build_dir/bin"
tools=(mc-store mc-conductor mc-prefill mc-decode mc-trace-replay)
missing=0
for t in "${tools[@]}"; do [[ -x "$bin/$t" ]] || missing=1; done
if ((missing)); then
  echo "replay-conversation.sh: building ${tools[*]} in $build_dir (once; several minutes on 2 cores)" >&2
  [[ -f "$build_dir/build.ninja" ]] || cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
  cmake --build "$build_dir" --target "${tools[@]}" >&2
fi

trace="$root/examples/traces/conversation_trace.jsonl"
replay=("$bin/mc-trace-replay" "$trace" --start-s "$start_s" --duration-s "$duration_s" --speed "$speed"
        --time-scale "$speed" --block-tokens 512)
[[ -n "$out" ]] && replay+=(--out "$out")
replay+=("${json[@]}" "${extra[@]}")

echo "replay-conversation.sh: ${duration_s} s of $(basename "$trace") from ${start_s} s," \
     "${speed}x compressed; policy $policy" >&2
# The conductor's endpoint reaches the replay through MC_CONDUCTOR (set by local-cluster.sh).
exec "$here/local-cluster.sh" --bin "$bin" --backend sim --model llama3-70b --gpu a800x8 --time-scale "$speed" \
  --block-size 512 --store-nodes 2 --prefill "$n_prefill" --decode "$n_decode" --policy "$policy" -- "${replay[@]}"
