#!/usr/bin/env bash
# The cost of authentication (issue 18): the same mc-store master + node and the same `mc-store bench` runs, once
# without keys and once with --auth-dir (CURVE on ZeroMQ, the sealed fast path), each point back to back so both
# sides of a ratio see the same machine load. Metadata ops/s at 1/8/32 clients over the fast path and ZeroMQ, and
# data GB/s of batch_put/batch_get. Everything on 127.0.0.1, stopped on exit.
# Usage: tests/bench/auth_bench.sh [BUILD_DIR] (env: CLIENTS=1,8,32 DURATION=2 ROUNDS=1)
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/bin
CLIENTS=${CLIENTS:-1,8,32}
DURATION=${DURATION:-2}
PORT=$((20000 + RANDOM % 20000))
source "$(dirname "$0")/bench_lib.sh"

"$BIN/mc-auth" init "$TMP/keys" --node bench-auth >/dev/null
AUTH=(--auth-dir "$TMP/keys")
M_OFF=tcp://127.0.0.1:$PORT
M_ON=tcp://127.0.0.1:$((PORT + 1))
start_store "$BIN" "$M_OFF" bench-off
"$BIN/mc-store" master --listen "$M_ON" --events "" "${AUTH[@]}" --auth-name master >"$TMP/master-on" 2>/dev/null &
PIDS+=($!)
wait_ready "$TMP/master-on"
"$BIN/mc-store" serve --master "$M_ON" --node-id bench-auth --dram-bytes 512MiB "${AUTH[@]}" --auth-name bench-auth \
  >"$TMP/node-on" 2>/dev/null &
PIDS+=($!)
wait_ready "$TMP/node-on"

echo "== load: $(uptime)"
# point NAME ARGS...: one bench without and one with keys; prints "NAME off on ratio" per (op, clients).
point() {
  local name=$1
  shift
  local off on
  off=$("$BIN/mc-store" bench --master "$M_OFF" --json "$@")
  on=$("$BIN/mc-store" bench --master "$M_ON" --json "${AUTH[@]}" --auth-name admin "$@")
  if [[ "$name" == data ]]; then
    jq -r --arg n "$name" --argjson on "$on" '
      ["batch_put", "batch_get"][] as $op | ($op + "_bytes_per_second") as $k |
      [$n + " (" + .path + ")", $op, "-", (.[$k] / 1e9 | tostring | .[0:6]) + " GB/s",
       ($on[$k] / 1e9 | tostring | .[0:6]) + " GB/s", ($on[$k] / .[$k] | tostring | .[0:5])] | @tsv' <<< "$off"
    return
  fi
  jq -r --arg n "$name" --argjson on "$on" '
    .points as $off | range(0; $off | length) as $i | $off[$i] as $a | $on.points[$i] as $b |
    [$n, $a.op, $a.clients, ($a.ops_per_second | floor), ($b.ops_per_second | floor),
     ($b.ops_per_second / $a.ops_per_second | tostring | .[0:5])] | @tsv' <<< "$off"
}
{
  printf "path\top\tclients\tauth_off\tauth_on\ton/off\n"
  point "metadata fast" --mode metadata --transport fast --clients "$CLIENTS" --ops put,get --duration "$DURATION"
  point "metadata zmq" --mode metadata --transport zmq --clients "$CLIENTS" --ops put,get --duration "$DURATION"
  point "data" --mode data --duration "$DURATION"
} | column -t -s $'\t'
