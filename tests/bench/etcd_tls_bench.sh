#!/usr/bin/env bash
# The cost of TLS to etcd (docs/SECURITY.md "etcd", docs/BENCHMARKS.md "TLS to etcd"): on 127.0.0.1, everything
# stopped on exit. Two one-member etcds side by side, one plain and one serving TLS with the certificates of
# `mc-auth init` (--client-cert-auth); a replicated master (a leader of --etcd) and one storage node on each, the TLS
# side with the cluster's keys. Then `mc-store bench --ops put` at 1, 8 and 32 clients against each, back to back per
# client count, with the leader's mean time of one etcd commit (mc_store_ha_commit_us_mean, reset by nothing: the mean
# over the run so far), which is the part TLS changes: the master's HTTPS calls to etcd. The put ops/s of the TLS side
# also pay for the keys' CURVE on the bench's own connections (docs/SECURITY.md "Cost" measures that alone).
# Usage: tests/bench/etcd_tls_bench.sh [BUILD_DIR] (env: CLIENTS=1,8,32 DURATION=2)
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/bin
CLIENTS=${CLIENTS:-1,8,32}
DURATION=${DURATION:-2}
source "$(dirname "$0")/bench_lib.sh"
command -v etcd >/dev/null || { echo "etcd_tls_bench.sh: etcd is not installed (tools/install-deps.sh)" >&2; exit 1; }

KEYS=$TMP/keys
"$BIN/mc-auth" init "$KEYS" --node bench-node >/dev/null

# start_etcd NAME SCHEME [ETCD_FLAG...]: one member on free ports, its data in $TMP; sets ENDPOINT.
start_etcd() {
  local name=$1 scheme=$2
  shift 2
  local curl_tls=()
  [[ "$scheme" == https ]] && curl_tls=(--cacert "$KEYS/etcd/ca.pem" --cert "$KEYS/etcd/client.pem"
                                        --key "$KEYS/etcd/client.key")
  ENDPOINT=""
  for _ in 1 2 3 4 5; do
    local cport=$((20000 + RANDOM % 40000))
    local pport=$((cport + 1))
    rm -rf "${TMP:?}/$name"
    etcd --name "$name" --data-dir "$TMP/$name" --listen-client-urls "$scheme://127.0.0.1:$cport" \
      --advertise-client-urls "$scheme://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
      --initial-advertise-peer-urls "http://127.0.0.1:$pport" --initial-cluster "$name=http://127.0.0.1:$pport" \
      --initial-cluster-state new --log-level error "$@" >"$TMP/$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do
      if curl -sf ${curl_tls[@]+"${curl_tls[@]}"} "$scheme://127.0.0.1:$cport/health" >/dev/null 2>&1; then
        ENDPOINT=127.0.0.1:$cport
        break
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if [[ -n "$ENDPOINT" ]]; then PIDS+=("$pid"); return 0; fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "etcd_tls_bench.sh: etcd $name did not start: $(tail -3 "$TMP/$name.log")" >&2
  exit 1
}

# start_side NAME ETCD [AUTH_FLAG...]: a leader of --etcd and one node; sets METRICS (the leader's /metrics URL).
start_side() {
  local name=$1 etcd=$2
  shift 2
  local master_auth=() node_auth=()
  if [[ $# -gt 0 ]]; then
    master_auth=("$@" --auth-name master)
    node_auth=("$@" --auth-name bench-node)
  fi
  "$BIN/mc-store" master --listen tcp://127.0.0.1:0 --events "" --etcd "$etcd" --cluster-id "$name" \
    --metrics-listen 127.0.0.1:0 ${master_auth[@]+"${master_auth[@]}"} >"$TMP/leader-$name" 2>/dev/null &
  PIDS+=($!)
  wait_ready "$TMP/leader-$name"
  METRICS=$(ready_field "$TMP/leader-$name" metrics)
  "$BIN/mc-store" serve --etcd "$etcd" --cluster-id "$name" --node-id bench-node --dram-bytes 512MiB \
    ${node_auth[@]+"${node_auth[@]}"} >"$TMP/node-$name" 2>/dev/null &
  PIDS+=($!)
  wait_ready "$TMP/node-$name"
}

start_etcd plain http
PLAIN_ETCD=$ENDPOINT
start_etcd tls https --cert-file "$KEYS/etcd/server.pem" --key-file "$KEYS/etcd/server.key" \
  --trusted-ca-file "$KEYS/etcd/ca.pem" --client-cert-auth
TLS_ETCD=$ENDPOINT
echo "== load: $(uptime)"
echo "== etcd $(etcd --version | head -1 | awk '{print $3}'): plain at $PLAIN_ETCD, TLS at $TLS_ETCD; data on $(df --output=source,fstype "$TMP" | tail -1)"
start_side plain "$PLAIN_ETCD"
PLAIN_METRICS=$METRICS
start_side tls "$TLS_ETCD" --auth-dir "$KEYS"
TLS_METRICS=$METRICS

commit_mean() { curl -sf "$1/metrics" | awk '$1 == "mc_store_ha_commit_us_mean" {print $2}'; }
echo "== put ops/s and the leader's mean etcd commit (µs): plain HTTP vs TLS with a client certificate"
printf '%7s %12s %12s %7s %17s %15s %8s\n' clients plain_ops_s tls_ops_s ratio plain_commit_us tls_commit_us errors
for c in ${CLIENTS//,/ }; do
  plain=$("$BIN/mc-store" bench --etcd "$PLAIN_ETCD" --cluster-id plain --ops put --clients "$c" \
    --duration "$DURATION" --json)
  tls=$("$BIN/mc-store" bench --etcd "$TLS_ETCD" --cluster-id tls --ops put --clients "$c" --duration "$DURATION" \
    --json --auth-dir "$KEYS" --auth-name admin)
  pick() { jq -r --arg f "$2" '.points[] | select(.op == "put") | .[$f]' <<<"$1"; }
  p=$(pick "$plain" ops_per_second)
  t=$(pick "$tls" ops_per_second)
  printf '%7s %12.0f %12.0f %7.3f %17s %15s %8s\n' "$c" "$p" "$t" "$(awk -v p="$p" -v t="$t" 'BEGIN {print t / p}')" \
    "$(commit_mean "$PLAIN_METRICS")" "$(commit_mean "$TLS_METRICS")" \
    "$(($(pick "$plain" errors) + $(pick "$tls" errors)))"
done
