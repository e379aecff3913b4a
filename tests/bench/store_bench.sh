#!/usr/bin/env bash
# Store benchmark (issue 4): metadata ops/s of mc-store master side by side with redis-server/redis-benchmark
# (same machine, same client counts), and data GB/s of batch_put/batch_get side by side with mc-xfer bench
# on the same path (shm: same host; tcp: loopback). Everything runs on 127.0.0.1 and is stopped on exit.
# Usage: tests/bench/store_bench.sh [BUILD_DIR] (env: CLIENTS=1,8,32 DURATION=2 KV_BYTES_PER_TOKEN=2048 REQUESTS=100000
#        BATCH=16 DATA_ONLY=0 PIPELINE=1 TRANSPORTS=fast[,zmq])
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/bin
CLIENTS=${CLIENTS:-1,8,32}
DURATION=${DURATION:-2}
KVB=${KV_BYTES_PER_TOKEN:-2048}
REQUESTS=${REQUESTS:-100000}
PIPELINE=${PIPELINE:-1}
TRANSPORTS=${TRANSPORTS:-fast}  # add zmq to see the ZeroMQ path (--pipeline 1 only)
PORT=$((20000 + RANDOM % 20000))
source "$(dirname "$0")/bench_lib.sh"

M=tcp://127.0.0.1:$PORT
start_store "$BIN" "$M" bench-local --lease-ms 1000
LOCAL_NODE_PID=$NODE_PID

if [ "${DATA_ONLY:-0}" = 0 ]; then
# Like with like: redis-benchmark drives its -c connections from one event loop with -P requests in flight
# each; `mc-store bench --transport fast` does the same (one thread, N connections, --pipeline P). Each
# client count runs mc-store then redis back to back, so both sides of a ratio see the same machine load.
RPORT=$((PORT + 1))
start_redis "$RPORT"
echo "== load: $(uptime)"
echo "== metadata: mc-store master (ops/s; put = put_start + put_end, two requests) vs redis-server $(redis-server --version | awk '{print $3}') (requests/s, 4 KiB SET values), pipeline $PIPELINE"
for c in ${CLIENTS//,/ }; do
  for t in ${TRANSPORTS//,/ }; do
    "$BIN/mc-store" bench --master "$M" --clients "$c" --duration "$DURATION" --transport "$t" --pipeline "$PIPELINE" | grep -v '^mc-store\|^op ' | sed "s/^/mc-store $t /"
  done
  redis-benchmark -h 127.0.0.1 -p "$RPORT" -t set,get -c "$c" -n "$REQUESTS" -P "$PIPELINE" -d 4096 --csv 2>/dev/null | grep -v '^"test"' | sed "s/^/redis clients=$c,/"
done
fi

# Data: each mc-store point is followed at once by mc-xfer bench on the same path with the same block and
# batch, so both sides of a ratio see the same machine load.
BLOCK=$((512 * KVB))
BATCH=${BATCH:-16}
"$BIN/mc-xfer" serve --size $((BLOCK * 64)) >"$TMP/xfer" 2>/dev/null & PIDS+=($!)
wait_ready "$TMP/xfer"
SEG=$(ready_field "$TMP/xfer" segment)
# Both sides move 64 blocks' worth of distinct memory (the mc-xfer segment is 64 blocks), and both are
# warmed (mc-store bench: one untimed round in-process; mc-xfer: one untimed 1 s write run first).
store_data() {
  "$BIN/mc-store" bench --master "$M" --mode data --kv-bytes-per-token "$KVB" --duration "$DURATION" --batch "$BATCH" "$@"
}
xfer_pair() {
  "$BIN/mc-xfer" bench --target "$SEG" --transport "$1" --op write --block "$BLOCK" --duration 1 --batch "$BATCH" >/dev/null 2>&1
  for op in write read; do
    echo "-- mc-xfer bench $1 $op (block $BLOCK B, batch $BATCH)"
    "$BIN/mc-xfer" bench --target "$SEG" --transport "$1" --op "$op" --block "$BLOCK" --duration "$DURATION" --batch "$BATCH" 2>/dev/null | grep -v '^#' 
  done
}
echo "== load: $(uptime)"
echo "== data shm (same host): mc-store batch_put/batch_get, blocks of 512 tokens x $KVB B"
store_data
xfer_pair shm
"$BIN/mc-store" serve --master "$M" --node-id bench-far --host bench-far-host --no-shm --dram-bytes 512MiB >"$TMP/n2" 2>/dev/null & PIDS+=($!)
wait_ready "$TMP/n2"
# Only the far node (private memory) remains: the engine's tcp path.
kill "$LOCAL_NODE_PID"; wait "$LOCAL_NODE_PID" 2>/dev/null || true
echo "== data tcp (loopback): mc-store batch_put/batch_get"
store_data --client-host bench-client
xfer_pair tcp
echo "== load: $(uptime)"
