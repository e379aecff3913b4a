#!/usr/bin/env bash
# The cost of authentication (issue 18): the same mc-store master + node and the same `mc-store bench` runs, once
# without keys and once with --auth-dir (CURVE on ZeroMQ, the sealed fast path), each point back to back so both
# sides of a ratio see the same machine load. Metadata ops/s at 1/8/32 clients over the fast path and ZeroMQ, and
# data GB/s of batch_put/batch_get; and the transfer engine alone: `mc-xfer bench` read and write over tcp (where a
# server with keys checks a grant on every wire op) and shm, at 64 KiB and 4 MiB, against `mc-xfer serve` without and
# with keys. Everything on 127.0.0.1, stopped on exit.
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

"$BIN/mc-xfer" serve --listen "tcp://127.0.0.1:$((PORT + 2))" --size 256MiB >"$TMP/xfer-off" 2>/dev/null &
PIDS+=($!)
"$BIN/mc-xfer" serve --listen "tcp://127.0.0.1:$((PORT + 3))" --size 256MiB "${AUTH[@]}" --auth-name bench-auth \
  >"$TMP/xfer-on" 2>/dev/null &
PIDS+=($!)
wait_ready "$TMP/xfer-off"
wait_ready "$TMP/xfer-on"

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
# xpoint TRANSPORT OP: mc-xfer bench against the served segment without keys, then with (the admin's keys: it issues
# its own grant, carried on every request); prints one row per block size, the clients column holding the block.
xpoint() {
  local off on
  off=$("$BIN/mc-xfer" bench --target "127.0.0.1:$((PORT + 2))" --transport "$1" --op "$2" --block 64KiB,4MiB \
    --duration "$DURATION" --json)
  on=$("$BIN/mc-xfer" bench --target "127.0.0.1:$((PORT + 3))" --transport "$1" --op "$2" --block 64KiB,4MiB \
    --duration "$DURATION" --json "${AUTH[@]}" --auth-name admin)
  jq -r --arg n "xfer $1" --arg op "$2" --argjson on "$on" '
    .results as $off | range(0; $off | length) as $i | $off[$i] as $a | $on.results[$i] as $b |
    [$n, $op, (($a.block_bytes / 1024 | floor | tostring) + "KiB"), ($a.bytes_per_second / 1e9 | tostring | .[0:6]) + " GB/s",
     ($b.bytes_per_second / 1e9 | tostring | .[0:6]) + " GB/s", ($b.bytes_per_second / $a.bytes_per_second | tostring | .[0:5])]
    | @tsv' <<< "$off"
}
{
  printf "path\top\tclients\tauth_off\tauth_on\ton/off\n"
  point "metadata fast" --mode metadata --transport fast --clients "$CLIENTS" --ops put,get --duration "$DURATION"
  point "metadata zmq" --mode metadata --transport zmq --clients "$CLIENTS" --ops put,get --duration "$DURATION"
  point "data" --mode data --duration "$DURATION"
  for transport in tcp shm; do
    for op in read write; do
      xpoint "$transport" "$op"
    done
  done
} | column -t -s $'\t'
