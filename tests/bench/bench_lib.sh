# Shared by the benchmark scripts (source it; bash): a scratch folder and the started processes, stopped
# and removed on exit; waiting for a daemon's "ready" line; a master + node pair of mc-store; redis-server.
# Everything listens on 127.0.0.1.
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

# wait_ready FILE: until FILE has a line starting with "ready" (20 s at most).
wait_ready() {
  for _ in $(seq 200); do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "no ready line in $1" >&2
  exit 1
}
# ready_field FILE KEY: the value of KEY=value on FILE's ready line.
ready_field() { awk -v k="$2=" '/^ready/{for(i=1;i<=NF;i++) if (index($i,k)==1) {print substr($i,length(k)+1)}}' "$1"; }

# start_store BIN_DIR MASTER_URL NODE_ID [MASTER_FLAG...]: an mc-store master on MASTER_URL (no event
# stream) and one node of 512 MiB DRAM registered with it, both ready; NODE_PID is the node's pid. Their
# output goes to $TMP/master-NODE_ID and $TMP/node-NODE_ID.
start_store() {
  local bin=$1 master=$2 node=$3
  shift 3
  "$bin/mc-store" master --listen "$master" --events "" "$@" >"$TMP/master-$node" 2>/dev/null &
  PIDS+=($!)
  wait_ready "$TMP/master-$node"
  "$bin/mc-store" serve --master "$master" --node-id "$node" --dram-bytes 512MiB >"$TMP/node-$node" 2>/dev/null &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  wait_ready "$TMP/node-$node"
}

# start_redis PORT: redis-server on 127.0.0.1:PORT without persistence, answering PING (5 s at most).
start_redis() {
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$TMP/redis" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 50); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server on port $1 did not answer PING" >&2
  exit 1
}
