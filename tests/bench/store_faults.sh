#!/usr/bin/env bash
# Store faults (issue 17, docs/RELIABILITY.md "Store faults"): one fault injected into a live mc-store master
# with two storage nodes (n1 with an SSD tier) during a load of puts and gets through the admin CLI (a loop:
# put a fresh 256 KiB object, get the one stored 5 successful puts earlier), then: puts ok / failed, gets ok /
# missed, and the objects kept (of the objects listed just before the fault, how many read back at the end).
# Usage: tests/bench/store_faults.sh [BUILD_DIR] FAULT
#   FAULT: stop-node (SIGSTOP n2 for STOP_S s, then SIGCONT) | kill-master (kill -9, restart on the same port)
#          | ssd-full (n1's SSD on a 24 MiB tmpfs, filled by another file: needs root) | ssd-removed (rm -rf of
#          n1's SSD directory) | drain-node (SIGTERM n2: it drains its objects to n1, then exits)
# Env: LOAD_S=30 (load duration) FAULT_AT=8 (s into the load) STOP_S=10 DRAM (per node; default 64MiB, so
# nothing is evicted, and 4MiB for the SSD faults, so DRAM victims are demoted). Everything on 127.0.0.1,
# stopped on exit.
set -euo pipefail
BUILD=${1:-build}
FAULT=${2:?usage: store_faults.sh BUILD_DIR stop-node|kill-master|ssd-full|ssd-removed|drain-node}
BIN=$BUILD/bin
LOAD_S=${LOAD_S:-30}
FAULT_AT=${FAULT_AT:-8}
STOP_S=${STOP_S:-10}
case "$FAULT" in ssd-*) DRAM=${DRAM:-4MiB} ;; *) DRAM=${DRAM:-64MiB} ;; esac
PORT=$((20000 + RANDOM % 20000))
source "$(dirname "$0")/bench_lib.sh"
M=tcp://127.0.0.1:$PORT
SSD=$TMP/ssd
mkdir -p "$SSD"
if [ "$FAULT" = ssd-full ]; then
  mount -t tmpfs -o size=24m tmpfs "$SSD"
  trap 'umount -l "$SSD" 2>/dev/null || true; cleanup' EXIT
fi

start_master() {
  "$BIN/mc-store" master --listen "$M" --events "" >"$TMP/master" 2>>"$TMP/master.err" &
  MASTER_PID=$!
  PIDS+=("$MASTER_PID")
  wait_ready "$TMP/master"
}
start_node() {  # ID FLAG...
  local id=$1
  shift
  "$BIN/mc-store" serve --master "$M" --node-id "$id" --dram-bytes "$DRAM" "$@" >"$TMP/node-$id" 2>"$TMP/node-$id.err" &
  PIDS+=($!)
  eval "PID_$id=$!"
  wait_ready "$TMP/node-$id"
}
start_master
start_node n1 --ssd-dir "$SSD" --ssd-bytes 16MiB
start_node n2
head -c 262144 /dev/urandom >"$TMP/blob"

load() {
  local end=$((SECONDS + LOAD_S)) i=0 po=0 pf=0 go=0 gm=0
  local -a stored=()
  while [ "$SECONDS" -lt "$end" ]; do
    i=$((i + 1))
    if "$BIN/mc-store" put --master "$M" "l/$i" "$TMP/blob" 2>>"$TMP/put.err"; then
      po=$((po + 1))
      stored+=("l/$i")
    else
      pf=$((pf + 1))
    fi
    if [ "${#stored[@]}" -gt 5 ]; then
      if "$BIN/mc-store" get --master "$M" "${stored[$((${#stored[@]} - 6))]}" >/dev/null 2>>"$TMP/get.err"; then
        go=$((go + 1))
      else
        gm=$((gm + 1))
      fi
    fi
  done
  echo "$po $pf $go $gm" >"$TMP/load"
}
load &
LOAD_PID=$!
sleep "$FAULT_AT"
"$BIN/mc-store" ls --master "$M" --json --limit 100000 | python3 -c 'import json,sys; [print(o["key"]) for o in json.load(sys.stdin)["objects"]]' >"$TMP/before"
case "$FAULT" in
  stop-node)
    kill -STOP "$PID_n2"
    sleep "$STOP_S"
    kill -CONT "$PID_n2"
    ;;
  kill-master)
    kill -9 "$MASTER_PID"
    wait "$MASTER_PID" 2>/dev/null || true
    : >"$TMP/master"
    start_master
    ;;
  ssd-full)
    free=$(python3 -c "import os; v=os.statvfs('$SSD'); print(v.f_bavail*v.f_frsize)")
    head -c $((free - 131072)) /dev/zero >"$SSD/filler"
    ;;
  ssd-removed)
    rm -rf "$SSD"
    ;;
  drain-node)
    kill -TERM "$PID_n2"
    wait "$PID_n2" || echo "n2 exited $? after SIGTERM" >&2
    ;;
  *)
    echo "unknown fault $FAULT" >&2
    exit 2
    ;;
esac
wait "$LOAD_PID"
read -r po pf go gm <"$TMP/load"
kept=0
while read -r key; do
  if "$BIN/mc-store" get --master "$M" "$key" >/dev/null 2>&1; then kept=$((kept + 1)); fi
done <"$TMP/before"
echo "fault=$FAULT dram_per_node=$DRAM load_s=$LOAD_S fault_at_s=$FAULT_AT puts_ok=$po puts_failed=$pf gets_ok=$go gets_missed=$gm objects_before=$(wc -l <"$TMP/before") objects_kept=$kept"
"$BIN/mc-store" stat --master "$M" | tail -n 3
