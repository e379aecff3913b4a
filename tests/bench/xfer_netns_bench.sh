#!/usr/bin/env bash
# The transfer engine across hosts (issue 20 item 6): `mc-xfer serve` in network namespace A, `mc-xfer bench
# --transport tcp --baseline` in namespace B, over one unshaped veth pair. The bench's baseline is raw TCP
# between the same two namespaces in the same run (plain block-sized sends served by the target's engine:
# `mc-xfer bench --baseline`), so each ratio compares the engine with the link it runs on.
#
#   tests/bench/xfer_netns_bench.sh BUILD_DIR
#   env: RUNS=3 DURATION=2 BLOCKS=64KiB,1MiB,4MiB SIZE=1GiB OP=read EXTRA="--io-threads 2" (more bench flags)
#
# Needs root (ip netns); prints the reason and exits 0 otherwise. Prints, per run, `uptime` before and after,
# then one row per block: mc-xfer GB/s, raw TCP x1 and x4 GB/s, the ratio to the best raw TCP, request latency,
# and CPU seconds per GB of both processes (client and server; the bench reads the server's /proc/PID/stat, as
# both run on this machine) for the engine and for the best raw TCP. The JSON of
# each run is kept in $KEEP_DIR when set. Namespaces and processes are removed on exit, Ctrl-C or failure.
set -euo pipefail
BUILD=${1:?usage: xfer_netns_bench.sh BUILD_DIR}
XFER=$(cd "$BUILD" && pwd)/bin/mc-xfer
[ -x "$XFER" ] || { echo "no $XFER (ninja -C $BUILD mc-xfer)" >&2; exit 1; }
RUNS=${RUNS:-3}
DURATION=${DURATION:-2}
BLOCKS=${BLOCKS:-64KiB,1MiB,4MiB}
SIZE=${SIZE:-1GiB}
OP=${OP:-read}
EXTRA=${EXTRA:-}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../examples/lib/netns.sh
. "$HERE/../../examples/lib/netns.sh"
if ! netns_require; then
  echo "xfer_netns_bench: skipped: $NETNS_SKIP_REASON"
  exit 0
fi
TMP=$(mktemp -d)
netns_init "mcns$$"
on_exit() {
  local rc=$?
  netns_cleanup
  rm -rf "$TMP"
  exit "$rc"
}
trap on_exit EXIT

netns_add a
netns_add b
netns_link a 10.77.0.1/24 b 10.77.0.2/24
# The served segment listens on A's veth address only: the bench in B reaches it over the link.
netns_spawn a "$XFER" serve --size "$SIZE" --listen tcp://10.77.0.1:0 --allow-unauthenticated >"$TMP/serve" 2>"$TMP/serve.err"
netns_wait_line "$TMP/serve" ready 60 || { cat "$TMP/serve.err" >&2; exit 1; }
SEG=$(awk '/^ready/{for(i=1;i<=NF;i++) if (index($i,"segment=")==1) print substr($i,9)}' "$TMP/serve")
echo "# mc-xfer serve in $(netns_name a) (10.77.0.1), segment $SEG; bench in $(netns_name b) (10.77.0.2); veth unshaped"
echo "# commit $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?')  $(date -u '+%Y-%m-%d %H:%M UTC')  $(nproc) cores"

for run in $(seq "$RUNS"); do
  echo "## run $run: before: $(uptime)"
  # shellcheck disable=SC2086
  netns_exec b "$XFER" bench --target "$SEG" --transport tcp --op "$OP" --block "$BLOCKS" --duration "$DURATION" \
    --baseline --json $EXTRA >"$TMP/run$run.json"
  echo "## run $run: after:  $(uptime)"
  [ -n "${KEEP_DIR:-}" ] && cp "$TMP/run$run.json" "$KEEP_DIR/xfer_netns_run$run.json"
  python3 - "$TMP/run$run.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
if j.get("transport") != "tcp":
    sys.exit("bench used transport %r, not tcp" % j.get("transport"))
print("# raw tcp baseline: %s%s" % (j.get("baseline_tcp_raw_endpoint"),
      " (" + j["baseline_tcp_raw_note"] + ")" if j.get("baseline_tcp_raw_note") else ""))
if j.get("baseline_tcp_raw_mem_note"):
    print("# raw tcp through the row's memory not measured where 0: " + j["baseline_tcp_raw_mem_note"])
raw, mem = {}, {}
for b in j.get("baseline", []):
    if b["kind"] == "tcp_raw":
        raw[(b["block_bytes"], b["streams"])] = b["bytes_per_second"]
    elif b["kind"] == "tcp_raw_mem":
        mem[b["block_bytes"]] = b
print("%12s %12s %12s %12s %8s %12s %9s %10s %10s %10s %10s %10s" % ("block_bytes", "mc-xfer_GB/s", "raw_x1_GB/s",
      "raw_x4_GB/s", "ratio", "mem_x4_GB/s", "mem_ratio", "p50_us", "p99_us", "cpu_s/GB", "raw_cpu", "mem_cpu"))
for r in j["results"]:
    blk = r["block_bytes"]
    x1, x4 = raw.get((blk, 1), 0), raw.get((blk, 4), 0)
    best = max(x1, x4)
    m = mem.get(blk, {})
    mx4 = m.get("bytes_per_second", 0)
    print("%12d %12.2f %12.2f %12.2f %8.2f %12.2f %9.2f %10.1f %10.1f %10.3f %10.3f %10.3f" % (blk,
          r["bytes_per_second"] / 1e9, x1 / 1e9, x4 / 1e9, r["bytes_per_second"] / best if best else 0, mx4 / 1e9,
          r["bytes_per_second"] / mx4 if mx4 else 0, r["latency_p50_ns"] / 1e3, r["latency_p99_ns"] / 1e3,
          r.get("cpu_s_per_gb", 0), r.get("limit_cpu_s_per_gb", 0), m.get("cpu_s_per_gb", 0)))
    if m:
        print("# %d: raw tcp x4 'mem' cycles through %d bytes per stream here (%d in all: the row's batch x block)"
              " and %d there (%d in all: the swept segment, at most 128 MiB)" % (blk, m["span_bytes_per_stream"],
              4 * m["span_bytes_per_stream"], m["target_span_bytes_per_stream"], 4 * m["target_span_bytes_per_stream"]))
if "error" in j:
    sys.exit("bench failed: %s" % j["error"])
EOF
done
