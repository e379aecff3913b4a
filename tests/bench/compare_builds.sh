#!/usr/bin/env bash
# Side-by-side benchmark of two builds of mc (e.g. before and after a refactoring, or auth off and on), each
# point run for build A then build B back to back so both see the same machine load:
#   - metadata: `mc-store bench` put/get at 1/8/32 clients against each build's own master + node, beside
#     redis-benchmark SET/GET at the same client counts (the limit);
#   - data: `mc-xfer bench` shm and tcp at 64 KiB / 1 MiB / 4 MiB with --baseline (memcpy / raw TCP limit);
#   - the Conductor's decision benchmark (sched_decision_bench), if both builds have it.
# Everything runs on 127.0.0.1 and is stopped on exit.
# Usage: tests/bench/compare_builds.sh BUILD_A BUILD_B   (env: CLIENTS=1,8,32 DURATION=2 REQUESTS=20000
#        BLOCKS=64KiB,1MiB,4MiB XFER_DURATION=1)
set -euo pipefail
A=${1:?usage: compare_builds.sh BUILD_A BUILD_B}
B=${2:?usage: compare_builds.sh BUILD_A BUILD_B}
CLIENTS=${CLIENTS:-1,8,32}
DURATION=${DURATION:-2}
REQUESTS=${REQUESTS:-20000}
BLOCKS=${BLOCKS:-64KiB,1MiB,4MiB}
XFER_DURATION=${XFER_DURATION:-1}
source "$(dirname "$0")/bench_lib.sh"
port=$((20000 + RANDOM % 20000))

declare -A MASTER
for tag in A B; do
  build=${!tag}
  m=tcp://127.0.0.1:$port; port=$((port + 2))
  start_store "$build/bin" "$m" "cmp-$tag"
  MASTER[$tag]=$m
done
rport=$port; port=$((port + 1))
start_redis "$rport"

echo "== A=$A ($("$A/bin/mc-store" --version 2>/dev/null | head -1)) B=$B ($("$B/bin/mc-store" --version 2>/dev/null | head -1))"
echo "== load: $(uptime)"
echo "== metadata (ops/s): mc-store bench put,get per build, then redis-benchmark SET,GET (4 KiB values)"
for c in ${CLIENTS//,/ }; do
  for tag in A B; do
    build=${!tag}
    "$build/bin/mc-store" bench --master "${MASTER[$tag]}" --clients "$c" --duration "$DURATION" --ops put,get |
      grep -v '^mc-store\|^op ' | sed "s/^/$tag clients=$c /"
  done
  redis-benchmark -h 127.0.0.1 -p "$rport" -t set,get -c "$c" -n "$REQUESTS" -d 4096 --csv 2>/dev/null |
    grep -v '^"test"' | sed "s/^/redis clients=$c,/"
done

echo "== load: $(uptime)"
echo "== data (GB/s): mc-xfer bench --baseline per build and transport"
for tag in A B; do
  build=${!tag}
  "$build/bin/mc-xfer" serve --size 256MiB --listen tcp://127.0.0.1:0 >"$TMP/xfer-$tag" 2>/dev/null & PIDS+=($!)
  wait_ready "$TMP/xfer-$tag"
done
for transport in shm tcp; do
  for tag in A B; do
    build=${!tag}
    seg=$(ready_field "$TMP/xfer-$tag" segment)
    echo "-- $tag $transport"
    "$build/bin/mc-xfer" bench --target "$seg" --transport "$transport" --block "$BLOCKS" --duration "$XFER_DURATION" \
      --baseline 2>/dev/null | grep -v '^#'
  done
done

echo "== load: $(uptime)"
echo "== Conductor decisions"
for tag in A B; do
  build=${!tag}
  bench=$(find "$build" -name sched_decision_bench -type f -perm -u+x | head -1)
  if [[ -z "$bench" ]]; then echo "-- $tag: no sched_decision_bench in $build (build it: ninja -C $build sched_decision_bench)"; continue; fi
  echo "-- $tag $bench"
  "$bench" --benchmark_counters_tabular=true --benchmark_min_time=0.3 2>/dev/null | grep -E '^(BM|---|Benchmark)'
done
echo "== load: $(uptime)"
