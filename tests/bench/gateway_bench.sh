#!/usr/bin/env bash
# mc-gateway's cost (issue 19, docs/BENCHMARKS.md "Gateway"): 1-token completions through the gateway into a local
# cluster (sim backend at a large --time-scale, so the modelled GPU time is near zero and the request path itself is
# measured), and, as the limit, the same HTTP library answering a fixed response (tests/bench/http_fixed_server.cpp),
# both driven by the same load generator (hey, Debian's `hey`) with the same body, concurrency and duration, one after
# the other on the same machine. Also the gateway's own added latency from its /metrics histograms: body received ->
# conductor.submit sent, and token event received -> bytes written (p50 and p99 as bucket upper bounds).
# Then the same replay window of the shipped conversation trace through ZeroMQ (mc-trace-replay --conductor) and
# through the gateway (--target http://...), each on a fresh cluster so both start with an empty pool: TTFT and TBT
# side by side (mc-trace-replay report, one row each).
# Usage: tests/bench/gateway_bench.sh [BUILD_DIR]   (env: DURATION=10 CONCURRENCY=64 STREAM_TOKENS=32 STREAM_QPS=2
#        REPEAT=1 TIME_SCALE=1000 PREFILL=2 DECODE=2
#        REPLAY_REQUESTS=30 REPLAY_SPEED=20 REPLAY_TIME_SCALE=20 MODEL=tiny)
# MODEL is the model of the 1-token part (sim backend): tiny (4 layers) keeps the cluster's own per-request cost (one
# KV write per layer into decode, the commit) small, so what is measured is the request path through the gateway and
# the Conductor; llama3-70b's 80 layer writes per prefill make the prefill instances the bottleneck instead.
set -euo pipefail
BUILD=${1:-build}
DURATION=${DURATION:-10}
CONCURRENCY=${CONCURRENCY:-64}
TIME_SCALE=${TIME_SCALE:-1000}
MODEL=${MODEL:-tiny}
here="$(cd "$(dirname "$0")" && pwd)"
command -v hey >/dev/null || { echo "gateway_bench: needs hey (tools/install-deps.sh installs it)" >&2; exit 1; }
[[ -x "$BUILD/bench/http_fixed_server" ]] || { echo "gateway_bench: build $BUILD first (http_fixed_server)" >&2; exit 1; }
source "$here/bench_lib.sh"

echo "{\"model\":\"$MODEL\",\"prompt\":\"Hello, gateway\",\"max_tokens\":1,\"ignore_eos\":true}" >"$TMP/body.json"
# The streaming phase: CONCURRENCY streams of STREAM_TOKENS tokens each, one after another on every connection.
echo "{\"model\":\"$MODEL\",\"prompt\":\"Hello, gateway\",\"max_tokens\":${STREAM_TOKENS:-32},\"ignore_eos\":true,\"stream\":true}" \
  >"$TMP/stream.json"
# hey_run URL OUT: DURATION seconds of POSTs at CONCURRENCY connections.
hey_run() { hey -z "${DURATION}s" -c "$CONCURRENCY" -m POST -T application/json -D "$TMP/body.json" "$1" >"$2"; }
# hey_field OUT: requests/s, p50 ms, p99 ms, non-200 responses
hey_fields() {
  awk '/Requests\/sec:/{rps=$2} / 50% in/{p50=$3*1000} / 99% in/{p99=$3*1000}
       /^\s*\[[0-9]+\]/{code=$1; gsub(/[\[\]]/,"",code); if (code!="200") bad+=$2}
       END{printf "%.0f %.2f %.2f %d\n", rps, p50, p99, bad}' "$1"
}

"$BUILD/bench/http_fixed_server" 0 256 >"$TMP/fixed" &
PIDS+=($!)
wait_ready "$TMP/fixed"
fixed_url="$(awk '/^ready/{print $3}' "$TMP/fixed")"
echo "== load: $(uptime)"
hey_run "$fixed_url/v1/completions" "$TMP/hey-fixed"
kill "${PIDS[-1]}" 2>/dev/null || true

MC_LOG_LEVEL=error "$here/../../examples/local-cluster.sh" --bin "$BUILD/bin" --prefill "${PREFILL:-2}" \
  --decode "${DECODE:-2}" --time-scale "$TIME_SCALE" --model "$MODEL" --gateway-args "--slo-ttft-ms 3600000 --slo-tbt-ms 3600000" \
  -- bash -c "until curl -sf \"\$MC_GATEWAY/health\" >/dev/null; do sleep 0.1; done;
              hey -z ${DURATION}s -c $CONCURRENCY -m POST -T application/json -D $TMP/body.json \
                \"\$MC_GATEWAY/v1/completions\" > $TMP/hey-gateway;
              curl -s \"\$MC_GATEWAY/metrics\" > $TMP/gateway-metrics;
              hey -z ${DURATION}s -c $CONCURRENCY -m POST -T application/json -D $TMP/stream.json \
                \"\$MC_GATEWAY/v1/completions\" > $TMP/hey-stream;
              curl -s \"\$MC_GATEWAY/metrics\" > $TMP/gateway-metrics-stream;
              hey -z ${DURATION}s -c $CONCURRENCY -q ${STREAM_QPS:-2} -m POST -T application/json -D $TMP/stream.json \
                \"\$MC_GATEWAY/v1/completions\" > $TMP/hey-paced;
              curl -s \"\$MC_GATEWAY/metrics\" > $TMP/gateway-metrics-paced" 2>"$TMP/cluster.err" ||
  { cat "$TMP/cluster.err" >&2; exit 1; }

# quantile METRIC Q AFTER [BEFORE]: the upper bound (ms) of the first bucket whose cumulative count reaches Q of the
# total, of the histogram in AFTER (minus the one in BEFORE: the observations of one phase).
quantile() {
  awk -v m="$1_bucket" -v q="$2" '
    index($0, m"{le=")==1 { le=$0; sub(/.*le="/,"",le); sub(/".*/,"",le);
                            if (FILENAME == ARGV[1]) { n++; les[n]=le; cnt[n]=$NF } else { base[le]=$NF } }
    END { for (i=1;i<=n;i++) cnt[i]-=base[les[i]]; total=cnt[n]; if (total <= 0) { print "none"; exit }
          for (i=1;i<=n;i++) if (cnt[i] >= q*total) { if (les[i]=="+Inf") print "inf"; else printf "%.3f\n", les[i]*1000; exit } }' \
    "$3" ${4:+"$4"}
}

read -r f_rps f_p50 f_p99 f_bad < <(hey_fields "$TMP/hey-fixed")
read -r g_rps g_p50 g_p99 g_bad < <(hey_fields "$TMP/hey-gateway")
read -r s_rps s_p50 s_p99 s_bad < <(hey_fields "$TMP/hey-stream")
read -r q_rps q_p50 q_p99 q_bad < <(hey_fields "$TMP/hey-paced")
echo "== gateway vs the same HTTP library answering a fixed response (hey, ${DURATION} s, $CONCURRENCY connections)"
printf "%-34s %10s %10s %10s %8s\n" "server" "req/s" "p50 ms" "p99 ms" "non-200"
printf "%-34s %10s %10s %10s %8s\n" "cpp-httplib fixed response (limit)" "$f_rps" "$f_p50" "$f_p99" "$f_bad"
printf "%-34s %10s %10s %10s %8s\n" "mc-gateway -> cluster (1 token)" "$g_rps" "$g_p50" "$g_p99" "$g_bad"
awk -v g="$g_rps" -v f="$f_rps" 'BEGIN{ if (f > 0) printf "ratio gateway/limit: %.3f (goal >= 0.5)\n", g / f }'
echo "== the gateway's own added latency (bucket upper bounds, ms; goal p99 < 1 ms), 1-token phase"
for m in mc_gateway_submit_overhead_seconds mc_gateway_token_overhead_seconds mc_gateway_submit_seconds mc_gateway_ttft_seconds; do
  printf "%-40s p50 <= %s  p99 <= %s\n" "$m" "$(quantile "$m" 0.5 "$TMP/gateway-metrics")" \
    "$(quantile "$m" 0.99 "$TMP/gateway-metrics")"
done
echo "== $CONCURRENCY concurrent streams of ${STREAM_TOKENS:-32} tokens (hey, ${DURATION} s): $s_rps streams/s, p50 $s_p50 ms," \
  "p99 $s_p99 ms, non-200 $s_bad; the gateway's own added latency in that phase"
for m in mc_gateway_submit_overhead_seconds mc_gateway_token_overhead_seconds mc_gateway_tbt_seconds; do
  printf "%-40s p50 <= %s  p99 <= %s\n" "$m" "$(quantile "$m" 0.5 "$TMP/gateway-metrics-stream" "$TMP/gateway-metrics")" \
    "$(quantile "$m" 0.99 "$TMP/gateway-metrics-stream" "$TMP/gateway-metrics")"
done
echo "== the same $CONCURRENCY streams paced at ${STREAM_QPS:-2} streams/s each (hey -q): $q_rps streams/s, p50 $q_p50 ms," \
  "p99 $q_p99 ms, non-200 $q_bad; the gateway's own added latency in that phase"
for m in mc_gateway_submit_overhead_seconds mc_gateway_token_overhead_seconds mc_gateway_tbt_seconds; do
  printf "%-40s p50 <= %s  p99 <= %s\n" "$m" "$(quantile "$m" 0.5 "$TMP/gateway-metrics-paced" "$TMP/gateway-metrics-stream")" \
    "$(quantile "$m" 0.99 "$TMP/gateway-metrics-paced" "$TMP/gateway-metrics-stream")"
done

# The same window through ZeroMQ and through HTTP, each on a fresh cluster.
trace="$here/../../examples/traces/conversation_trace.jsonl"
replay_flags=(--max-requests "${REPLAY_REQUESTS:-30}" --speed "${REPLAY_SPEED:-20}" --time-scale "${REPLAY_TIME_SCALE:-20}"
              --no-progress --allow-failures)
# REPEAT alternating pairs (zmq, http, zmq, http, ...): the spread between runs of the same path is the yardstick the
# difference between the paths is judged against.
runs=()
for ((k = 1; k <= ${REPEAT:-1}; k++)); do
  for mode in zmq http; do
    target=""
    [[ $mode == http ]] && target='--target $MC_GATEWAY'
    MC_LOG_LEVEL=error "$here/../../examples/local-cluster.sh" --bin "$BUILD/bin" --time-scale "${REPLAY_TIME_SCALE:-20}" \
      --gateway -- bash -c "$BUILD/bin/mc-trace-replay $trace ${replay_flags[*]} $target --out $TMP/$mode$k.jsonl > /dev/null" \
      2>"$TMP/cluster-$mode.err" || { cat "$TMP/cluster-$mode.err" >&2; exit 1; }
    runs+=("$TMP/$mode$k.jsonl")
  done
done
echo "== the same replay window through ZeroMQ (zmqK) and through mc-gateway (httpK), alternating"
"$BUILD/bin/mc-trace-replay" report "${runs[@]}"
echo "== load: $(uptime)"
