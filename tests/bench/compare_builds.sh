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
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
wait_ready() { for _ in $(seq 200); do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "no ready line in $1" >&2; exit 1; }
field() { awk -v k="$2=" '/^ready/{for(i=1;i<=NF;i++) if (index($i,k)==1) {print substr($i,length(k)+1)}}' "$1"; }
port=$((20000 + RANDOM % 20000))

declare -A MASTER
for tag in A B; do
  build=${!tag}
  m=tcp://127.0.0.1:$port; port=$((port + 2))
  "$build/bin/mc-store" master --listen "$m" --events "" >"$TMP/master-$tag" 2>/dev/null & PIDS+=($!)
  wait_ready "$TMP/master-$tag"
  "$build/bin/mc-store" serve --master "$m" --node-id "cmp-$tag" --dram-bytes 512MiB >"$TMP/node-$tag" 2>/dev/null & PIDS+=($!)
  wait_ready "$TMP/node-$tag"
  MASTER[$tag]=$m
done
rport=$port; port=$((port + 1))
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$TMP/redis" 2>&1 & PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done

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
    seg=$(field "$TMP/xfer-$tag" segment)
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
