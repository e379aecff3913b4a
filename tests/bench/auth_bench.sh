#!/usr/bin/env bash
# The cost of authentication (issue 18): the same mc-store master + node and the same `mc-store bench` runs, once
# without keys and once with --auth-dir (CURVE on ZeroMQ, the sealed fast path), each point back to back so both
# sides of a ratio see the same machine load. Metadata ops/s at 1/8/32 clients over the fast path and ZeroMQ, and
# data GB/s of batch_put/batch_get; and the transfer engine alone: `mc-xfer bench` read and write over tcp (where a
# server with keys checks a grant on every wire op) and shm, at 64 KiB and 4 MiB, against `mc-xfer serve` without and
# with keys. Everything on 127.0.0.1, stopped on exit.
# Each point runs ROUNDS times (alternating which side goes first) and the table gives the medians: on a small shared
# machine one run of one side varies by more than the effect measured.
# Usage: tests/bench/auth_bench.sh [BUILD_DIR] (env: CLIENTS=1,8,32 DURATION=2 ROUNDS=3)
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
ROUNDS=${ROUNDS:-3}
# bench_pair OUT_OFF OUT_ON ROUND CMD_OFF... -- CMD_ON...: runs both, the keyless one first in odd rounds and second
# in even ones (so a drift of the machine's speed during a round does not favour one side).
bench_pair() {
  local out_off=$1 out_on=$2 round=$3
  shift 3
  local off=() on=() seen=0
  for a in "$@"; do
    if [[ "$a" == "--" ]]; then seen=1; continue; fi
    if [[ $seen == 0 ]]; then off+=("$a"); else on+=("$a"); fi
  done
  if ((round % 2 == 1)); then
    "${off[@]}" >"$out_off"; "${on[@]}" >"$out_on"
  else
    "${on[@]}" >"$out_on"; "${off[@]}" >"$out_off"
  fi
}
# point ROUND NAME ARGS...: mc-store bench without and with keys; one row "NAME op clients off on unit" per point.
point() {
  local round=$1 name=$2
  shift 2
  bench_pair "$TMP/off.json" "$TMP/on.json" "$round" "$BIN/mc-store" bench --master "$M_OFF" --json "$@" -- \
    "$BIN/mc-store" bench --master "$M_ON" --json "${AUTH[@]}" --auth-name admin "$@"
  if [[ "$name" == data ]]; then
    jq -r --arg n "$name" --slurpfile on "$TMP/on.json" '
      ["batch_put", "batch_get"][] as $op | ($op + "_bytes_per_second") as $k |
      [$n + " (" + .path + ")", $op, "-", .[$k] / 1e9, $on[0][$k] / 1e9, "GB/s"] | @tsv' "$TMP/off.json"
    return
  fi
  jq -r --arg n "$name" --slurpfile on "$TMP/on.json" '
    .points as $off | range(0; $off | length) as $i | $off[$i] as $a | $on[0].points[$i] as $b |
    [$n, $a.op, $a.clients, $a.ops_per_second, $b.ops_per_second, "ops/s"] | @tsv' "$TMP/off.json"
}
# xpoint ROUND TRANSPORT OP: mc-xfer bench against the served segment without keys, then with (the admin's keys: it
# issues its own grant, carried on every request); one row per block size, the clients column holding the block.
xpoint() {
  local round=$1
  bench_pair "$TMP/off.json" "$TMP/on.json" "$round" \
    "$BIN/mc-xfer" bench --target "127.0.0.1:$((PORT + 2))" --transport "$2" --op "$3" --block 64KiB,4MiB \
    --duration "$DURATION" --json -- \
    "$BIN/mc-xfer" bench --target "127.0.0.1:$((PORT + 3))" --transport "$2" --op "$3" --block 64KiB,4MiB \
    --duration "$DURATION" --json "${AUTH[@]}" --auth-name admin
  jq -r --arg n "xfer $2" --arg op "$3" --slurpfile on "$TMP/on.json" '
    .results as $off | range(0; $off | length) as $i | $off[$i] as $a | $on[0].results[$i] as $b |
    [$n, $op, (($a.block_bytes / 1024 | floor | tostring) + "KiB"), $a.bytes_per_second / 1e9,
     $b.bytes_per_second / 1e9, "GB/s"] | @tsv' "$TMP/off.json"
}
for round in $(seq "$ROUNDS"); do
  echo "== round $round of $ROUNDS" >&2
  point "$round" "metadata fast" --mode metadata --transport fast --clients "$CLIENTS" --ops put,get --duration "$DURATION"
  point "$round" "metadata zmq" --mode metadata --transport zmq --clients "$CLIENTS" --ops put,get --duration "$DURATION"
  point "$round" "data" --mode data --duration "$DURATION"
  for transport in tcp shm; do
    for op in read write; do
      xpoint "$round" "$transport" "$op"
    done
  done
done >"$TMP/rows"
# Per point: the medians of off, on and on/off over the rounds, and the range of on/off.
awk -F'\t' -v rounds="$ROUNDS" '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(list,   n, a, i, m) { n = split(list, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 < m + 0) m = a[i]; return m }
  function hi(list,   n, a, i, m) { n = split(list, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 > m + 0) m = a[i]; return m }
  {
    k = $1 "\t" $2 "\t" $3
    if (!(k in unit)) order[++n] = k
    unit[k] = $6; off[k] = off[k] " " $4; on[k] = on[k] " " $5; r[k] = r[k] " " ($4 > 0 ? $5 / $4 : 0)
  }
  END {
    printf "path\top\tclients\tauth_off\tauth_on\ton/off (median of %d)\trange\n", rounds
    for (i = 1; i <= n; i++) {
      k = order[i]; f = unit[k] == "GB/s" ? "%.2f %s" : "%.0f %s"
      printf "%s\t" f "\t" f "\t%.3f\t%.2f-%.2f\n", k, median(off[k]), unit[k], median(on[k]), unit[k], median(r[k]), lo(r[k]), hi(r[k])
    }
  }' "$TMP/rows" | column -t -s $'\t'
