#!/usr/bin/env bash
# The replicated store master (issue 21; docs/RELIABILITY.md "Master failover", docs/BENCHMARKS.md "The cost of
# durability"): on 127.0.0.1, everything stopped on exit.
#  1. The cost of durability: `mc-store bench` put and put_sync ops/s at 1, 8 and 32 clients against a master alone
#     and against the leader of two `mc-store master --etcd` (every change a fenced etcd transaction before its
#     reply), back to back per client count so both sides of a ratio see the same machine load; with the leader's
#     mean time of one etcd commit (mc_store_ha_commit_us_mean), which bounds what one commit stream can do.
#  2. Failover: build/bench/ha_failover_bench (KILLS kills of the leader under a writing client).
# Usage: tests/bench/ha_bench.sh [BUILD_DIR] (env: CLIENTS=1,8,32 DURATION=2 KILLS=20 LEASE_S=2 SKIP_FAILOVER=0)
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/bin
CLIENTS=${CLIENTS:-1,8,32}
DURATION=${DURATION:-2}
KILLS=${KILLS:-20}
LEASE_S=${LEASE_S:-2}
source "$(dirname "$0")/bench_lib.sh"
command -v etcd >/dev/null || { echo "ha_bench.sh: etcd is not installed (tools/install-deps.sh)" >&2; exit 1; }

# etcd: one member on free ports (another process taking a port between the pick and the bind: next try), its data
# in $TMP (the machine's disk: etcd fsyncs every commit).
ETCD=""
for _ in 1 2 3 4 5; do
  cport=$((20000 + RANDOM % 40000))
  pport=$((cport + 1))
  rm -rf "$TMP/etcd"
  etcd --name bench --data-dir "$TMP/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
    --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" --initial-cluster "bench=http://127.0.0.1:$pport" \
    --initial-cluster-state new --log-level error >"$TMP/etcd.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$cport/health" >/dev/null 2>&1; then ETCD=127.0.0.1:$cport; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -n "$ETCD" ]]; then PIDS+=("$pid"); break; fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
done
[[ -n "$ETCD" ]] || { echo "ha_bench.sh: etcd did not start: $(tail -3 "$TMP/etcd.log")" >&2; exit 1; }
echo "== load: $(uptime)"
echo "== etcd $(etcd --version | head -1 | awk '{print $3}') at $ETCD, data on $(df --output=source,fstype "$TMP" | tail -1)"

# 1. A master alone, then the replicated pair, each with one node.
PORT=$((20000 + RANDOM % 20000))
M=tcp://127.0.0.1:$PORT
start_store "$BIN" "$M" ha-bench-plain
CLUSTER=hab$$
"$BIN/mc-store" master --listen tcp://127.0.0.1:0 --events "" --etcd "$ETCD" --cluster-id "$CLUSTER" \
  --leader-lease-s "$LEASE_S" --metrics-listen 127.0.0.1:0 >"$TMP/leader" 2>/dev/null &
PIDS+=($!)
wait_ready "$TMP/leader"
METRICS=$(ready_field "$TMP/leader" metrics)
until "$BIN/mc-store" stat --etcd "$ETCD" --cluster-id "$CLUSTER" >/dev/null 2>&1; do sleep 0.1; done
"$BIN/mc-store" master --listen tcp://127.0.0.1:0 --events "" --etcd "$ETCD" --cluster-id "$CLUSTER" \
  --leader-lease-s "$LEASE_S" >"$TMP/standby" 2>/dev/null &
PIDS+=($!)
wait_ready "$TMP/standby"
"$BIN/mc-store" serve --etcd "$ETCD" --cluster-id "$CLUSTER" --node-id ha-bench-etcd --dram-bytes 512MiB \
  >"$TMP/node-etcd" 2>/dev/null &
PIDS+=($!)
wait_ready "$TMP/node-etcd"
commit_mean() { curl -sf "$METRICS/metrics" | awk '$1 == "mc_store_ha_commit_us_mean" {print $2}'; }
echo "== put ops/s (put = put_start + put_end write-behind; put_sync = each reply waited for): alone vs --etcd"
printf '%-9s %7s %12s %12s %7s %8s %16s\n' op clients alone_ops_s etcd_ops_s ratio errors leader_commit_us
for c in ${CLIENTS//,/ }; do
  alone=$("$BIN/mc-store" bench --master "$M" --ops put,put_sync --clients "$c" --duration "$DURATION" --json)
  rep=$("$BIN/mc-store" bench --etcd "$ETCD" --cluster-id "$CLUSTER" --ops put,put_sync --clients "$c" \
    --duration "$DURATION" --json)
  for op in put put_sync; do
    pick() { jq -r --arg op "$op" --arg f "$2" '.points[] | select(.op == $op) | .[$f]' <<<"$1"; }
    a=$(pick "$alone" ops_per_second)
    r=$(pick "$rep" ops_per_second)
    errors=$(($(pick "$alone" errors) + $(pick "$rep" errors)))
    printf '%-9s %7s %12.0f %12.0f %7.3f %8s %16s\n' "$op" "$c" "$a" "$r" \
      "$(awk -v a="$a" -v r="$r" 'BEGIN {print r / a}')" "$errors" "$(commit_mean)"
  done
done

# 2. Failover.
if [[ "${SKIP_FAILOVER:-0}" == 0 ]]; then
  echo "== failover: $KILLS kills of the leader (lease $LEASE_S s) under a writing client"
  MC_HA_KILLS=$KILLS MC_HA_LEASE_S=$LEASE_S MC_HA_JSON=1 "$BUILD/bench/ha_failover_bench" 2>/dev/null |
    grep -v '^\[\|^Running\|^Note'
fi
