#!/usr/bin/env bash
# Worker faults mid-replay (issue 17 item 1; docs/RELIABILITY.md "Worker faults"). Replays DURATION s of the
# shipped conversation trace at SPEED x through examples/local-cluster.sh (2 prefill + 2 decode instances, sim
# backend, loopback), kill -9 the instance VICTIM (prefill0, decode0, ...) KILL_AT_S wall seconds after the replay
# started, and prints: offered, accepted, rejected, completed, failed and lost requests (lost: no terminal event
# within the replay's drain timeout), the affected requests (placed on VICTIM and still open at the kill) and the
# wall time from the kill until the last of them had its terminal event, the Conductor's fault counters, and the
# replay's summary (TTFT). The kill time is taken from the replay's start (its first send follows within a few
# ms). Everything is stopped and removed on exit.
# Usage: tests/bench/worker_faults.sh [BUILD_DIR]   (env: VICTIM=prefill0 DURATION=60 SPEED=4 KILL_AT_S=10)
set -euo pipefail
BUILD=${1:-build}
root="$(cd "$(dirname "$0")/../.." && pwd)"
export VICTIM=${VICTIM:-prefill0} DURATION=${DURATION:-60} SPEED=${SPEED:-4} KILL_AT_S=${KILL_AT_S:-10}
export MC_BIN_DIR="$(cd "$BUILD/bin" && pwd)" TRACE="$root/examples/traces/conversation_trace.jsonl"
out="$(mktemp -d "${TMPDIR:-/tmp}/mc-faults.XXXXXX")"
trap 'rm -rf "$out"' EXIT
export out
# Run inside the cluster (local-cluster.sh sets MC_CONDUCTOR and MC_CLUSTER_STATE). The sleep places the fault
# in the replay; nothing waits on it for synchronisation.
inner='
  "$MC_BIN_DIR/mc-trace-replay" "$TRACE" --duration-s "$DURATION" --speed "$SPEED" --time-scale "$SPEED" \
    --block-tokens 512 --out "$out/records.jsonl" --json --no-progress --allow-failures --drain-timeout-s 90 \
    > "$out/summary.json" 2> "$out/replay.err" &
  rpid=$!
  start=$(date +%s%N)
  sleep "$KILL_AT_S"
  kill -9 "$(awk -v v="$VICTIM" "\$1 == v {print \$2}" "$MC_CLUSTER_STATE/cluster.txt")"
  echo $(( ($(date +%s%N) - start) / 1000000 )) > "$out/kill_ms"
  wait "$rpid"
  "$MC_BIN_DIR/mc-conductor" stat --endpoint "$MC_CONDUCTOR" > "$out/conductor.txt"
'
"$root/examples/local-cluster.sh" --bin "$MC_BIN_DIR" --backend sim --model llama3-70b --gpu a800x8 \
  --time-scale "$SPEED" --block-size 512 --store-nodes 2 --prefill 2 --decode 2 -- /bin/bash -c "$inner" >&2

field() { grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2- | tr -d '"'; }
kill_ms=$(cat "$out/kill_ms")
offered=0 accepted=0 rejected=0 completed=0 failed=0 lost=0 affected=0 last_ms=0 last_failed_ms=0
while IFS= read -r rec; do
  outcome=$(field outcome <<< "$rec")
  offered=$((offered + 1))
  case "$outcome" in
    rejected) rejected=$((rejected + 1)); continue ;;
    completed) completed=$((completed + 1)) ;;
    failed) failed=$((failed + 1)); grep -q 'drain timeout' <<< "$rec" && lost=$((lost + 1)) ;;
  esac
  accepted=$((accepted + 1))
  end=$(field end_ms <<< "$rec")
  end_wall_ms=$(awk -v e="$end" -v s="$SPEED" 'BEGIN {printf "%d", e / s}')
  if { [[ "$(field prefill_instance <<< "$rec")" == "$VICTIM" ]] || [[ "$(field decode_instance <<< "$rec")" == "$VICTIM" ]]; } &&
     ((end_wall_ms > kill_ms)); then
    affected=$((affected + 1))
    ((end_wall_ms - kill_ms > last_ms)) && last_ms=$((end_wall_ms - kill_ms))
    [[ "$outcome" == failed ]] && ((end_wall_ms - kill_ms > last_failed_ms)) && last_failed_ms=$((end_wall_ms - kill_ms))
  fi
done < "$out/records.jsonl"
echo "fault=kill-9 $VICTIM at ${kill_ms} ms  trace=${DURATION} s at ${SPEED}x  offered=$offered accepted=$accepted" \
     "rejected=$rejected completed=$completed failed=$failed lost=$lost affected=$affected" \
     "last_terminal_after_kill_ms=$last_ms last_failure_after_kill_ms=$last_failed_ms"
grep '^worker faults' "$out/conductor.txt" || true
# The request counts and the first TTFT row (modelled ms: n, mean, p50, p90, p99, max) of the summary.
"$MC_BIN_DIR/mc-trace-replay" report "$out/records.jsonl" |
  awk '/^requests/ {print; getline; print} /^(latency|TTFT)/ && n < 2 {print; n++}'
