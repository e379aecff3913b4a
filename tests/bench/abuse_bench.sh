#!/usr/bin/env bash
# Abuse figures (issue 17 item 5, docs/RELIABILITY.md "Abuse"): RSS, CPU and log lines of each daemon while
# one port is abused, for the binaries of BUILD_DIR, so that two builds can be compared side by side:
#   frames  6 connections to the master's fast port, each declaring a 64 MiB frame and sending it
#   fds     the master under RLIMIT_NOFILE 256, 400 connections to its fast port held open for WINDOW_S
#   xfer    1,024 idle connections to mc-xfer serve's port, then a new client (mc-xfer read) tried every
#           0.5 s until it is served or XFER_WAIT_S passes
#   cluster every daemon of examples/local-cluster.sh (store master, 2 nodes, Conductor, prefill, decode; sim
#           backend), one after the other: 2,000 malformed messages (random bytes, 16 B to 4 KiB) to its RPC port,
#           then 1,000 connections held open for WINDOW_S; its RSS (start, peak) and CPU, and whether the cluster
#           still serves a 20-request replay afterwards
# Usage: tests/bench/abuse_bench.sh [BUILD_DIR] (env: WINDOW_S=6 XFER_WAIT_S=20 XFER_ARGS="--xfer-idle-timeout-ms 2000")
# Everything runs on 127.0.0.1 and is stopped on exit. Needs python3 (the abusing clients) and prlimit.
set -euo pipefail
BIN=${1:-build}/bin
WINDOW_S=${WINDOW_S:-6}
XFER_WAIT_S=${XFER_WAIT_S:-20}
XFER_ARGS=${XFER_ARGS:-}
WORK=$(mktemp -d /tmp/mc-abuse-XXXXXX)
CLIENTS="$(cd "$(dirname "$0")" && pwd)/abuse_clients.py"
export CLIENTS
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

kb() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"; }
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); split($0, f, " "); printf "%.2f", (f[12] + f[13]) / t}' "/proc/$1/stat"; }
ready_field() { tr ' ' '\n' <"$1" | sed -n "s/^$2=//p" | head -1; }
wait_ready() {  # FILE: waits up to 20 s for the ready line
  for _ in $(seq 200); do grep -q '^ready ' "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "no ready line in $1" >&2
  return 1
}
start_master() {  # PREFIX...: starts the master (stdout $WORK/m.out, stderr $WORK/m.err); sets MPID, MEP, FAST
  "$@" "$BIN/mc-store" master --listen tcp://127.0.0.1:0 --events "" >"$WORK/m.out" 2>"$WORK/m.err" &
  MPID=$!
  PIDS+=("$MPID")
  wait_ready "$WORK/m.out"
  MEP=$(awk '/^ready/ {print $3}' "$WORK/m.out")
  FAST=$(ready_field "$WORK/m.out" fast_port)
}
stat_ok() {  # prints the exit code and seconds of one `mc-store stat`
  local t0=$(date +%s.%N) rc=0
  timeout 30 "$BIN/mc-store" stat --master "$MEP" >/dev/null 2>&1 || rc=$?
  echo "rc=$rc $(echo "$(date +%s.%N) - $t0" | bc | xargs printf '%.2f')s"
}

echo "== abuse figures for $BIN on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- frames ----
start_master
rss0=$(kb "$MPID" VmRSS)
python3 - "$FAST" <<'EOF'
import socket, struct, sys, time
port = int(sys.argv[1])
chunk = b"x" * (1 << 20)
for i in range(6):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(2)
    try:
        s.sendall(struct.pack(">II", 16, 64 << 20) + b"\x83" * 16)
        for _ in range(63):
            s.sendall(chunk)
        s.sendall(chunk[:-1])  # one byte short: the frame stays buffered
    except OSError:
        pass  # refused: the master closed the connection
    globals().setdefault("keep", []).append(s)
time.sleep(1)
EOF
echo "frames: master VmRSS ${rss0} kB at start, VmHWM $(kb "$MPID" VmHWM) kB peak, VmRSS $(kb "$MPID" VmRSS) kB after," \
  "CPU $(cpu_s "$MPID") s, $(wc -l <"$WORK/m.err") log lines, stat $(stat_ok)"
kill "$MPID"; wait "$MPID" 2>/dev/null || true

# ---- fds ----
start_master prlimit --nofile=256:256 --
cpu0=$(cpu_s "$MPID")
python3 "$CLIENTS" hold "$FAST" 400 "$WINDOW_S" &
HOLD=$!
sleep 1
st=$(stat_ok)
wait "$HOLD" || true
echo "fds: master CPU $(echo "$(cpu_s "$MPID") - $cpu0" | bc) s in ${WINDOW_S} s, VmHWM $(kb "$MPID" VmHWM) kB," \
  "$(wc -l <"$WORK/m.err") log lines ($(du -k "$WORK/m.err" | cut -f1) kB), stat during the abuse: $st"
kill "$MPID"; wait "$MPID" 2>/dev/null || true

# ---- xfer ----
# shellcheck disable=SC2086  # XFER_ARGS is a list of flags
"$BIN/mc-xfer" serve --size 1MiB --listen tcp://127.0.0.1:0 $XFER_ARGS >"$WORK/x.out" 2>"$WORK/x.err" &
XPID=$!
PIDS+=("$XPID")
wait_ready "$WORK/x.out"
SEG=$(ready_field "$WORK/x.out" segment)
python3 - "${SEG##*:}" "$XFER_WAIT_S" "$WORK/x.hold" <<'EOF' &
import socket, sys, time
port, hold = int(sys.argv[1]), float(sys.argv[2])
keep = [socket.create_connection(("127.0.0.1", port)) for _ in range(1024)]
open(sys.argv[3], "w").write("opened\n")
time.sleep(hold + 5)
EOF
HOLD=$!
PIDS+=("$HOLD")
for _ in $(seq 600); do [ -s "$WORK/x.hold" ] && break; sleep 0.1; done
full_threads=$(awk '$1 == "Threads:" {print $2}' "/proc/$XPID/status")  # one per accepted connection
t0=$(date +%s.%N)
served=never
for _ in $(seq $((XFER_WAIT_S * 2))); do
  if timeout 10 "$BIN/mc-xfer" read --target "$SEG" --transport tcp --length 64KiB --verify --timeout-ms 2000 \
    >/dev/null 2>&1; then
    served="after $(echo "$(date +%s.%N) - $t0" | bc | xargs printf '%.1f') s"
    break
  fi
  sleep 0.5
done
echo "xfer: 1024 idle connections ($full_threads threads once opened), new client served: $served; serve VmHWM" \
  "$(kb "$XPID" VmHWM) kB, threads $(awk '$1 == "Threads:" {print $2}' "/proc/$XPID/status") after, CPU $(cpu_s "$XPID") s," \
  "$(wc -l <"$WORK/x.err") log lines"

# ---- cluster ----
cluster_inner() {  # run by local-cluster.sh as its CMD
  local name pid ep port rss0 cpu0
  echo "cluster: daemon, VmRSS at start, VmHWM peak, VmRSS after, CPU during the abuse, threads after"
  while read -r name pid ep; do
    [[ "$ep" == tcp://127.0.0.1:* ]] || continue
    port=${ep##*:}
    rss0=$(kb "$pid" VmRSS)
    cpu0=$(cpu_s "$pid")
    python3 "$CLIENTS" garbage "$port" 2000
    python3 "$CLIENTS" hold "$port" 1000 "$WINDOW_S"
    echo "  $name: ${rss0} kB, peak $(kb "$pid" VmHWM) kB, now $(kb "$pid" VmRSS) kB," \
      "CPU $(echo "$(cpu_s "$pid") - $cpu0" | bc) s, threads $(awk '$1 == "Threads:" {print $2}' "/proc/$pid/status")"
  done < "$MC_CLUSTER_STATE/cluster.txt"
  local rc=0
  "$BIN/mc-trace-replay" "$ROOT/examples/traces/conversation_trace.jsonl" --max-requests 20 --speed 8 \
    --time-scale 8 --block-tokens 512 --no-progress --allow-failures --json >"$WORK/replay.json" \
    2>"$WORK/replay.err" || rc=$?
  echo "  replay after the abuse: exit $rc, $(jq -c .requests "$WORK/replay.json" 2>/dev/null)"
}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export -f cluster_inner kb cpu_s
export BIN WORK WINDOW_S ROOT
"$ROOT/examples/local-cluster.sh" --bin "$BIN" --store-nodes 2 --prefill 1 --decode 1 --backend sim \
  --time-scale 8 -- bash -c cluster_inner
