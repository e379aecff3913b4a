#!/usr/bin/env bash
# local-cluster.sh: compose an mc cluster on loopback from the binaries.
#
# Starts these and waits for each one's "ready <service> <endpoint> ..." line on stdout; each group starts once the one
# before it is ready, its daemons together:
#   1 store master (mc-store master, with its KV-event publisher)
#   S storage nodes (mc-store serve, DRAM from /dev/shm) and 1 conductor (mc-conductor serve, subscribed to the
#   master's KV events)
#   D decode instances (mc-decode), P prefill instances (mc-prefill, prefix cache = the store) and the gateway
# then prints how to reach it. Every port is picked by the kernel (port 0) and read back from the
# ready lines, so several clusters can run side by side.
#
# Two ways to use it:
#   examples/local-cluster.sh [options]                 run until Ctrl-C (prints the endpoints)
#   examples/local-cluster.sh [options] -- CMD [ARGS]   run CMD with MC_CONDUCTOR (and the other
#                                                        endpoints) in its environment, then stop;
#                                                        exits with CMD's status
# CMD also gets MC_CLUSTER_STATE, a directory holding cluster.txt (one line per process: name, pid,
# endpoint) and each process's log, e.g. to kill a storage node in a fault test.
# On exit, Ctrl-C or SIGTERM it stops every process it started (SIGTERM; after 1 s a second SIGTERM, which ends a
# drain; SIGKILL after 5 s more),
# waits for them, and removes its state directory and the /dev/shm files of its storage nodes: no
# orphan processes, no leftovers.
#
# Instances are named prefill0.., decode0.. (their --instance-id), as in cluster.txt.
#
# Options (environment variable in brackets; flag beats environment beats default):
#   --store-nodes S       storage nodes                                  [MC_STORE_NODES, 2]
#   --masters M           store masters; with M >= 2 they are replicated on etcd (docs/DESIGN.md §17): the script
#                         starts a one-member etcd on free loopback ports (state directory), M masters of cluster
#                         "lc<pid>" (master, master1, ...: the first leads, the others stand by), and every node,
#                         prefill instance and the Conductor follow the leader through etcd; CMD gets MC_ETCD and
#                         MC_CLUSTER_ID. Needs etcd (tools/install-deps.sh installs etcd-server)  [MC_STORE_MASTERS, 1]
#   --hosts N             host labels host0..hostN-1: storage node i and prefill/decode instance i get
#                         label host(i mod N) (their --host), so the store master places a prefill's new
#                         blocks and hot-prefix copies on its "own host" and the conductor prices a
#                         prefix there as a same-host fetch. On one real machine the label drives
#                         placement and scheduling only: transfers between labels still use whatever
#                         transport works here (shm, tcp).                    [MC_HOSTS, 1]
#   --prefill P           prefill instances                              [MC_PREFILL, 2]
#   --decode D            decode instances                               [MC_DECODE, 2]
#   --backend B           sim (GPU cost model) or ref (the CPU engine: seeded weights, or a checkpoint's)
#                                                                        [MC_BACKEND, sim]
#   --model M             model preset (tiny, small, llama3-8b, llama3-70b), a JSON shape, or a Hugging Face model
#                         directory (config.json; with --backend ref also model.safetensors: the workers compute its
#                         weights, DESIGN.md §7; the Conductor prices its shape, the gateway serves it under the
#                         directory's name, and CMD gets MC_VOCAB_SIZE from its config.json)
#                                                 [MC_MODEL, llama3-70b for sim, tiny for ref]
#   --gpu G               sim: GPU preset (a800x8, h800x8)               [MC_GPU, a800x8]
#   --time-scale T        sim: run T times faster than modelled          [MC_TIME_SCALE, 1]
#   --kv-bytes-per-token N  sim: KV bytes per token actually stored and moved (the KV scale; 0 = the model's)
#                                                                        [MC_KV_BYTES_PER_TOKEN, 1024]
#   --kv-dtype T          ref: the workers' KV element type: auto (a checkpoint's weight type; fp32 for seeded
#                         weights), fp32, bf16 or fp16; part of the KV blocks' key namespace
#                                                                        [MC_KV_DTYPE, the workers' default: auto]
#   --threads N           ref: compute threads of each prefill and decode instance (they share this machine's
#                         cores)                                         [MC_THREADS, the workers' default: 1]
#   --block-size N        tokens per KV block everywhere                 [MC_BLOCK_SIZE, 512]
#   --policy NAME         conductor policy: random, least_loaded, cache_aware, kvcache [MC_POLICY, kvcache]
#   --conductor-args "A"  extra flags for mc-conductor serve, split on spaces, e.g. "--overload-queue-ms 100"
#                                                                        [MC_CONDUCTOR_ARGS, none]
#   --prefix-cache C      store (the pool) or none (cache disabled: every prefill recomputes)
#                                                                        [MC_PREFIX_CACHE, store]
#   --dram-bytes SIZE     DRAM per storage node                          [MC_STORE_DRAM, 256MiB]
#   --hot-reads N         store master: reads of one object within 10 s that add a replica near its
#                         reader (hot-object replication; 0 = off)         [MC_HOT_READS, 0]
#   --ssd-bytes SIZE      an SSD tier per storage node, in a directory of the state directory: DRAM
#                         victims are demoted there instead of dropped (none: DRAM only) [MC_STORE_SSD, none]
#   --ssd-dir DIR         where the SSD tier files go (e.g. a small filesystem mounted by a fault test)
#                                                      [MC_STORE_SSD_DIR, a directory of the state directory]
#   --kv-buffer-size SIZE KV buffer per prefill/decode instance          [MC_KV_BUFFER_SIZE, 256MiB]
#   --bin DIR             where the mc binaries are                      [MC_BIN, build/bin next to this script]
#   --ready-timeout-s N   how long to wait for each ready line           [MC_READY_TIMEOUT_S, 60]
#   --log-level L         daemons' log level                              [MC_LOG_LEVEL, warn]
#   --auth                authenticate everything (docs/SECURITY.md): make the cluster's keys with mc-auth init in
#                         the state directory (one per instance and storage node, a client "default" and
#                         tenants alice and bob sharing namespace "public"), start every daemon with its own, and
#                         give CMD MC_AUTH_DIR=STATE/client-auth (the tenants' keys only: no admin, daemon or
#                         cluster secret) and MC_AUTH_NAME=default; with --masters, etcd serves TLS with
#                         the keys' etcd certificates and admits only their client certificate  [MC_AUTH=1, off]
#   --gateway             also start mc-gateway (the OpenAI-compatible HTTP front door, serving --model) on a free
#                         loopback port, and give CMD its URL as MC_GATEWAY (http://127.0.0.1:PORT)   [MC_GATEWAY_ON=1, off]
#   --gateway-args "A"    extra flags for mc-gateway, split on spaces    [MC_GATEWAY_ARGS, none]
#   --metrics             every daemon serves GET /metrics (Prometheus text) on a free loopback port
#                         (--metrics-listen 127.0.0.1:0); the state directory gets metrics.txt (one line per
#                         daemon: name, HOST:PORT) and metrics-targets.txt (HOST:PORT lines, for a scrape
#                         config), and CMD gets MC_METRICS_TARGETS (the path of the latter)  [MC_METRICS=1, off]
#   --keep-logs DIR       copy the daemons' logs to DIR when stopping
#   --cluster FILE        start the cluster a description names instead (examples/cluster.sh FILE: each host a network
#                         namespace where this process can make them, else loopback; docs/DESIGN.md §16); of the
#                         options above only --bin, --ready-timeout-s, --log-level, --keep-logs and -- CMD apply
#   -h, --help            this text
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/keys.sh
. "$here/lib/keys.sh"
root="$(dirname "$here")"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

store_nodes="${MC_STORE_NODES:-2}"
n_masters="${MC_STORE_MASTERS:-1}"
n_hosts="${MC_HOSTS:-1}"
conductor_args="${MC_CONDUCTOR_ARGS:-}"
gateway="${MC_GATEWAY_ON:-0}"
gateway_args="${MC_GATEWAY_ARGS:-}"
n_prefill="${MC_PREFILL:-2}"
n_decode="${MC_DECODE:-2}"
backend="${MC_BACKEND:-sim}"
model="${MC_MODEL:-}"
gpu="${MC_GPU:-a800x8}"
time_scale="${MC_TIME_SCALE:-1}"
kv_bytes_per_token="${MC_KV_BYTES_PER_TOKEN:-1024}"
kv_dtype="${MC_KV_DTYPE:-}"
threads="${MC_THREADS:-}"
block_size="${MC_BLOCK_SIZE:-512}"
policy="${MC_POLICY:-kvcache}"
prefix_cache="${MC_PREFIX_CACHE:-store}"
dram_bytes="${MC_STORE_DRAM:-256MiB}"
hot_reads="${MC_HOT_READS:-0}"
ssd_bytes="${MC_STORE_SSD:-none}"
ssd_dir="${MC_STORE_SSD_DIR:-}"
kv_buffer_size="${MC_KV_BUFFER_SIZE:-256MiB}"
bin="${MC_BIN:-$root/build/bin}"
ready_timeout_s="${MC_READY_TIMEOUT_S:-60}"
log_level="${MC_LOG_LEVEL:-warn}"
keep_logs=""
cluster_file=""
auth="${MC_AUTH:-0}"
metrics="${MC_METRICS:-0}"
cmd=()

need() { [[ $# -ge 2 && -n "$2" ]] || { echo "local-cluster.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --store-nodes) need "$@"; store_nodes="$2"; shift 2 ;;
    --masters) need "$@"; n_masters="$2"; shift 2 ;;
    --hosts) need "$@"; n_hosts="$2"; shift 2 ;;
    --conductor-args) need "$@"; conductor_args="$2"; shift 2 ;;
    --prefill) need "$@"; n_prefill="$2"; shift 2 ;;
    --decode) need "$@"; n_decode="$2"; shift 2 ;;
    --backend) need "$@"; backend="$2"; shift 2 ;;
    --model) need "$@"; model="$2"; shift 2 ;;
    --gpu) need "$@"; gpu="$2"; shift 2 ;;
    --time-scale) need "$@"; time_scale="$2"; shift 2 ;;
    --kv-bytes-per-token) need "$@"; kv_bytes_per_token="$2"; shift 2 ;;
    --kv-dtype) need "$@"; kv_dtype="$2"; shift 2 ;;
    --threads) need "$@"; threads="$2"; shift 2 ;;
    --block-size) need "$@"; block_size="$2"; shift 2 ;;
    --policy) need "$@"; policy="$2"; shift 2 ;;
    --prefix-cache) need "$@"; prefix_cache="$2"; shift 2 ;;
    --dram-bytes) need "$@"; dram_bytes="$2"; shift 2 ;;
    --hot-reads) need "$@"; hot_reads="$2"; shift 2 ;;
    --ssd-bytes) need "$@"; ssd_bytes="$2"; shift 2 ;;
    --ssd-dir) need "$@"; ssd_dir="$2"; shift 2 ;;
    --kv-buffer-size) need "$@"; kv_buffer_size="$2"; shift 2 ;;
    --bin) need "$@"; bin="$2"; shift 2 ;;
    --ready-timeout-s) need "$@"; ready_timeout_s="$2"; shift 2 ;;
    --log-level) need "$@"; log_level="$2"; shift 2 ;;
    --keep-logs) need "$@"; keep_logs="$2"; shift 2 ;;
    --cluster) need "$@"; cluster_file="$2"; shift 2 ;;
    --auth) auth=1; shift ;;
    --gateway) gateway=1; shift ;;
    --gateway-args) need "$@"; gateway_args="$2"; gateway=1; shift 2 ;;
    --metrics) metrics=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; cmd=("$@"); break ;;
    *) echo "local-cluster.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n "$cluster_file" ]]; then
  exec "$here/cluster.sh" "$cluster_file" --bin "$bin" --ready-timeout-s "$ready_timeout_s" --log-level "$log_level" \
    ${keep_logs:+--keep-logs "$keep_logs"} ${cmd[@]+-- "${cmd[@]}"}
fi
[[ "$prefix_cache" == store || "$prefix_cache" == none ]] ||
  { echo "local-cluster.sh: --prefix-cache must be store or none, got '$prefix_cache'" >&2; exit 2; }
[[ -n "$model" ]] || { [[ "$backend" == ref ]] && model=tiny || model=llama3-70b; }
# A Hugging Face model directory: its config.json must be there (the workers, the Conductor and the gateway read it),
# and its vocabulary bounds the token ids a replay synthesizes (MC_VOCAB_SIZE below). A preset's name wins over a
# directory of that name here, as in the tools ("./tiny" names the directory).
model_vocab=""
if [[ -d "$model" && ( "$model" == */* || ! "$model" =~ ^(tiny|small|llama3-8b|llama3-70b)$ ) ]]; then
  [[ -f "$model/config.json" ]] ||
    { echo "local-cluster.sh: --model $model is a directory without config.json (not a Hugging Face model directory)" >&2; exit 2; }
  if command -v jq > /dev/null; then
    model_vocab="$(jq -r '.vocab_size // empty' "$model/config.json" 2>/dev/null || true)"
    [[ "$model_vocab" =~ ^[0-9]+$ ]] || model_vocab=""
  fi
  [[ -n "$model_vocab" || -n "${MC_VOCAB_SIZE:-}" ]] ||
    echo "local-cluster.sh: could not read vocab_size from $model/config.json (needs jq: tools/install-deps.sh);" \
         "MC_VOCAB_SIZE is not set for CMD" >&2
fi
for n in "$store_nodes" "$n_prefill" "$n_decode" "$n_hosts" "$n_masters"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "local-cluster.sh: counts must be integers, got '$n'" >&2; exit 2; }
done
(( n_hosts >= 1 )) || { echo "local-cluster.sh: --hosts must be at least 1" >&2; exit 2; }
(( n_masters >= 1 )) || { echo "local-cluster.sh: --masters must be at least 1" >&2; exit 2; }
if (( n_masters > 1 )) && ! command -v etcd > /dev/null; then
  echo "local-cluster.sh: --masters $n_masters replicates the store master on etcd, which is not installed" \
       "(tools/install-deps.sh installs etcd-server)" >&2
  exit 1
fi
read -r -a extra_conductor_flags <<< "$conductor_args"
(( n_prefill >= 1 && n_decode >= 1 )) || { echo "local-cluster.sh: need at least 1 prefill and 1 decode instance" >&2; exit 2; }
for b in mc-store mc-conductor mc-prefill mc-decode; do
  [[ -x "$bin/$b" ]] || { echo "local-cluster.sh: $bin/$b not found: build first (cmake --build build) or pass --bin" >&2; exit 1; }
done
for b in mc-prefill mc-decode; do
  # Read the whole help first: grep -q would exit at the first match and the tool's next write fail (pipefail).
  if ! grep -q -- '--conductor' <<< "$("$bin/$b" --help 2>/dev/null)"; then
    echo "local-cluster.sh: $b has no --conductor flag, so it cannot register with mc-conductor;" \
         "this build cannot compose a cluster (the workers' registration has not landed)" >&2
    exit 1
  fi
done

state="$(mktemp -d "${TMPDIR:-/tmp}/mc-local-cluster.XXXXXX")"
tag="lc$$"
etcd_pid=""
pids=()
names=()
declare -A pid_of=()  # daemon name -> its pid (wait_ready)

# stop_group IDX...: SIGTERM to those processes (newest first), a second SIGTERM after 1 s to those still running
# (it ends a drain), SIGKILL after 5 s more; waits for each.
stop_group() {
  local i pid deadline
  for ((i = $# ; i >= 1; i--)); do kill -TERM "${pids[${!i}]}" 2>/dev/null || true; done
  # The whole cluster stops: no drain is wanted (a storage node would try to move its objects to nodes that are
  # stopping too, a worker would finish its jobs). A second SIGTERM to those still running ends their drains.
  deadline=$((SECONDS + 1))
  for i in "$@"; do while kill -0 "${pids[$i]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done; done
  for i in "$@"; do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  deadline=$((SECONDS + 5))
  for i in "$@"; do
    pid="${pids[$i]}"
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "local-cluster.sh: ${names[$i]:-pid} (pid $pid) did not stop on SIGTERM within 5 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
}

stop_all() {
  local rc=$?
  trap - EXIT INT TERM
  # Everything but the store masters first, then the masters (storage nodes unmount while their master answers).
  local i others=() masters=()
  for i in "${!pids[@]}"; do
    if [[ "${names[$i]}" =~ ^master[0-9]*$ ]]; then masters+=("$i"); else others+=("$i"); fi
  done
  [[ ${#others[@]} -eq 0 ]] || stop_group "${others[@]}"
  [[ ${#masters[@]} -eq 0 ]] || stop_group "${masters[@]}"
  # etcd last: the masters and their clients stop while it still answers (a master that cannot reach it steps down,
  # and its nodes would wait for a new leader on the way out).
  if [[ -n "$etcd_pid" ]]; then
    kill -TERM "$etcd_pid" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while kill -0 "$etcd_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
    kill -KILL "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
  fi
  if [[ -n "$keep_logs" ]]; then mkdir -p "$keep_logs" && cp "$state"/*.log "$keep_logs"/ 2>/dev/null || true; fi
  rm -rf "$state"
  rm -f /dev/shm/mc-store-"$tag"-* 2>/dev/null || true
  if [[ -n "$ssd_dir" ]]; then rm -f "$ssd_dir"/mc-store-"$tag"-* 2>/dev/null || true; fi
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CMD...: runs CMD in the background, stdout and stderr to $state/NAME.log.
start() {
  local name="$1"; shift
  "$@" > "$state/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
  pid_of[$name]=$!
}

# host_label I: the host label of storage node / instance I.
host_label() { echo "host$(($1 % n_hosts))"; }

# wait_ready NAME: waits for NAME's ready line; prints its endpoint; the whole line is in $state/NAME.ready.
wait_ready() {
  local name="$1" log="$state/$1.log" pid="${pid_of[$1]}"
  local deadline=$((SECONDS + ready_timeout_s))
  while ((SECONDS < deadline)); do
    local line
    line="$(grep -m1 '^ready ' "$log" 2>/dev/null || true)"
    if [[ -n "$line" ]]; then
      echo "$line" > "$state/$name.ready"
      echo "$name $pid $(awk '{print $3}' <<< "$line")" >> "$state/cluster.txt"
      awk '{print $3}' <<< "$line"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "local-cluster.sh: $name exited before it was ready; its log:" >&2
      sed 's/^/  /' "$log" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "local-cluster.sh: $name printed no ready line within $ready_timeout_s s; its log:" >&2
  sed 's/^/  /' "$log" >&2
  return 1
}
ready_field() { tr ' ' '\n' < "$state/$1.ready" | sed -n "s/^$2=//p"; }

# With --metrics: the flag every daemon gets, and record_metrics NAME, which notes NAME's metrics address (the
# ready line's metrics=http://HOST:PORT) in metrics.txt and metrics-targets.txt.
metrics_flags=()
[[ "$metrics" == 1 ]] && metrics_flags=(--metrics-listen 127.0.0.1:0)
record_metrics() {
  [[ "$metrics" == 1 ]] || return 0
  local address
  address="$(ready_field "$1" metrics)"
  address="${address#http://}"
  [[ -n "$address" ]] || { echo "local-cluster.sh: $1 printed no metrics= in its ready line" >&2; return 1; }
  echo "$1 $address" >> "$state/metrics.txt"
  echo "$address" >> "$state/metrics-targets.txt"
}

export MC_LOG_LEVEL="$log_level"

# auth_flags NAME: the flags that make a daemon the identity NAME of the cluster's keys (none without --auth).
auth_flags=()
auth_dir=""
if [[ "$auth" == 1 ]]; then
  auth_dir="$state/auth"
  init_args=(--tenant default --tenant alice --tenant bob --tenant gateway --shared public)
  for ((i = 0; i < n_prefill; i++)); do init_args+=(--worker "prefill$i"); done
  for ((i = 0; i < n_decode; i++)); do init_args+=(--worker "decode$i"); done
  for ((i = 0; i < store_nodes; i++)); do init_args+=(--node "node$i"); done
  "$bin/mc-auth" init "$auth_dir" "${init_args[@]}" > "$state/auth.txt"
fi
as() {
  auth_flags=()
  [[ -n "$auth_dir" ]] && auth_flags=(--auth-dir "$auth_dir" --auth-name "$1")
  return 0
}

# With --masters M >= 2: a one-member etcd on free loopback ports (a port another process takes between the pick
# and etcd's bind makes it exit: the next attempt picks others), and every store client follows the leader.
etcd_endpoint=""
cluster_id=""
master_flags=()  # how a store client names the master: --master EP, or --etcd EP --cluster-id ID
if (( n_masters > 1 )); then
  cluster_id="$tag"
  # With --auth, etcd serves TLS with the certificates of the cluster's keys and admits only clients whose certificate
  # their CA signed (every daemon and tool given --auth-dir presents $auth_dir/etcd/client.pem): docs/SECURITY.md.
  scheme=http
  peer_scheme=http
  etcd_tls=()
  curl_tls=()
  if [[ -n "$auth_dir" ]]; then
    scheme=https
    etcd_tls=(--cert-file "$auth_dir/etcd/server.pem" --key-file "$auth_dir/etcd/server.key"
              --trusted-ca-file "$auth_dir/etcd/ca.pem" --client-cert-auth)
    curl_tls=(--cacert "$auth_dir/etcd/ca.pem" --cert "$auth_dir/etcd/client.pem" --key "$auth_dir/etcd/client.key")
    # The peer port too (it answers /members, and a second member would join through it): TLS, and only a peer whose
    # certificate the cluster's CA signed (the server certificate carries clientAuth for this).
    peer_scheme=https
    etcd_tls+=(--peer-cert-file "$auth_dir/etcd/server.pem" --peer-key-file "$auth_dir/etcd/server.key"
               --peer-trusted-ca-file "$auth_dir/etcd/ca.pem" --peer-client-cert-auth)
  fi
  for _ in 1 2 3 4 5; do
    cport=$((20000 + RANDOM % 40000))
    pport=$((cport + 1))
    rm -rf "$state/etcd"
    # Not in pids: stop_all stops it after everything else.
    etcd --name "$tag" --data-dir "$state/etcd" --listen-client-urls "$scheme://127.0.0.1:$cport" \
      --advertise-client-urls "$scheme://127.0.0.1:$cport" ${etcd_tls[@]+"${etcd_tls[@]}"} \
      --listen-peer-urls "$peer_scheme://127.0.0.1:$pport" --initial-advertise-peer-urls "$peer_scheme://127.0.0.1:$pport" \
      --initial-cluster "$tag=$peer_scheme://127.0.0.1:$pport" \
      --initial-cluster-token "$tag" --initial-cluster-state new --log-level error > "$state/etcd.log" 2>&1 &
    etcd_pid=$!
    deadline=$((SECONDS + ready_timeout_s))
    while kill -0 "$etcd_pid" 2>/dev/null && ((SECONDS < deadline)); do
      if curl -sf ${curl_tls[@]+"${curl_tls[@]}"} "$scheme://127.0.0.1:$cport/health" > /dev/null 2>&1; then
        etcd_endpoint="127.0.0.1:$cport"
        break
      fi
      sleep 0.05
    done
    [[ -z "$etcd_endpoint" ]] || break
    kill -KILL "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
    etcd_pid=""
  done
  [[ -n "$etcd_endpoint" ]] || { echo "local-cluster.sh: etcd did not start; its log:" >&2; sed 's/^/  /' "$state/etcd.log" >&2; exit 1; }
  echo "etcd $etcd_pid $etcd_endpoint" >> "$state/cluster.txt"
  master_flags=(--etcd "$etcd_endpoint" --cluster-id "$cluster_id")
  export MC_ETCD="$etcd_endpoint" MC_CLUSTER_ID="$cluster_id"
fi

for ((m = 0; m < n_masters; m++)); do
  name=master
  ((m == 0)) || name="master$m"
  as master
  start "$name" "$bin/mc-store" master --listen tcp://127.0.0.1:0 --events tcp://127.0.0.1:0 --hot-reads "$hot_reads" \
    ${master_flags[@]+"${master_flags[@]}"} ${auth_flags[@]+"${auth_flags[@]}"} ${metrics_flags[@]+"${metrics_flags[@]}"}
  endpoint="$(wait_ready "$name")"
  record_metrics "$name"
  if ((m == 0)); then
    master="$endpoint"
    events="$(ready_field master events)"
  fi
  if ((m == 0 && n_masters > 1)); then
    # The first master leads before the others start (they stand by): wait until it answers as the leader.
    deadline=$((SECONDS + ready_timeout_s))
    as admin
    until "$bin/mc-store" stat --master "$master" ${auth_flags[@]+"${auth_flags[@]}"} > /dev/null 2>&1; do
      ((SECONDS < deadline)) || { echo "local-cluster.sh: the first master did not take the lead; its log:" >&2; sed 's/^/  /' "$state/master.log" >&2; exit 1; }
      sleep 0.05
    done
  fi
done
[[ ${#master_flags[@]} -gt 0 ]] || master_flags=(--master "$master")

ssd_flags=()
if [[ "$ssd_bytes" != none ]]; then
  [[ -n "$ssd_dir" ]] || ssd_dir="$state/ssd"
  mkdir -p "$ssd_dir"
  ssd_flags=(--ssd-dir "$ssd_dir" --ssd-bytes "$ssd_bytes")
fi
for ((i = 0; i < store_nodes; i++)); do
  as "node$i"
  start "node$i" "$bin/mc-store" serve "${master_flags[@]}" --node-id "$tag-node$i" --host "$(host_label "$i")" \
    --dram-bytes "$dram_bytes" ${ssd_flags[@]+"${ssd_flags[@]}"} ${auth_flags[@]+"${auth_flags[@]}"} \
    ${metrics_flags[@]+"${metrics_flags[@]}"}
done

# The ref backend computes on the CPU, which the GPU cost model does not describe: no decode envelope there.
envelope_flags=()
[[ "$backend" == ref ]] && envelope_flags=(--decode-envelope 0)
as conductor
conductor_store_flags=(--kv-events "$events" --store-master "$master")
[[ -z "$etcd_endpoint" ]] || conductor_store_flags=(--etcd "$etcd_endpoint" --cluster-id "$cluster_id")
start conductor "$bin/mc-conductor" serve --listen tcp://127.0.0.1:0 "${conductor_store_flags[@]}" \
  ${auth_flags[@]+"${auth_flags[@]}"} ${metrics_flags[@]+"${metrics_flags[@]}"} \
  --policy "$policy" --block-size "$block_size" --cost-model "$model" --gpu "$gpu" --time-scale "$time_scale" \
  ${envelope_flags[@]+"${envelope_flags[@]}"} ${extra_conductor_flags[@]+"${extra_conductor_flags[@]}"}
# The storage nodes and the Conductor start together (each needs only the master) and are waited for here, in the
# order they were started (cluster.txt lists them so).
for ((i = 0; i < store_nodes; i++)); do
  wait_ready "node$i" > /dev/null
  record_metrics "node$i"
done
conductor="$(wait_ready conductor)"
record_metrics conductor

worker_flags=(--backend "$backend" --model "$model" --block-size "$block_size" --kv-buffer-size "$kv_buffer_size"
              --conductor "$conductor")
if [[ "$backend" == sim ]]; then
  worker_flags+=(--gpu "$gpu" --time-scale "$time_scale" --kv-bytes-per-token "$kv_bytes_per_token")
fi
# Given only when set: the workers' own defaults (and their MC_KV_DTYPE / MC_THREADS fallbacks) otherwise.
[[ -z "$kv_dtype" ]] || worker_flags+=(--kv-dtype "$kv_dtype")
[[ -z "$threads" ]] || worker_flags+=(--threads "$threads")
# The prefix cache: prefill instances read and put blocks there, and decode instances put the blocks of pipelined
# prefills (no stage holds every layer of one; docs/DESIGN.md §18 "Live groups").
store_flags=(--store "$master")
[[ -z "$etcd_endpoint" ]] || store_flags=(--store etcd --etcd "$etcd_endpoint" --cluster-id "$cluster_id")
[[ "$prefix_cache" == none ]] && store_flags=(--store none)
for ((i = 0; i < n_decode; i++)); do
  # A reservation waits for its prefill through the prefill queue; a loaded 2-core machine (or a
  # sanitizer build) can queue for longer than the 30 s default.
  as "decode$i"
  start "decode$i" "$bin/mc-decode" --listen tcp://127.0.0.1:0 --reservation-ttl-ms 180000 "${worker_flags[@]}" \
    "${store_flags[@]}" --instance-id "decode$i" --host "$(host_label "$i")" ${auth_flags[@]+"${auth_flags[@]}"} \
    ${metrics_flags[@]+"${metrics_flags[@]}"}
done
for ((i = 0; i < n_prefill; i++)); do
  as "prefill$i"
  start "prefill$i" "$bin/mc-prefill" --listen tcp://127.0.0.1:0 "${store_flags[@]}" "${worker_flags[@]}" \
    --instance-id "prefill$i" --host "$(host_label "$i")" ${auth_flags[@]+"${auth_flags[@]}"} \
    ${metrics_flags[@]+"${metrics_flags[@]}"}
done

gateway_url=""
if [[ "$gateway" == 1 ]]; then
  read -r -a extra_gateway_flags <<< "$gateway_args"
  as gateway  # a tenant of its own, whose key no client is handed (its users live in its namespace)
  start gateway "$bin/mc-gateway" --listen 127.0.0.1:0 --conductor "$conductor" --model "$model" \
    ${auth_flags[@]+"${auth_flags[@]}"} ${extra_gateway_flags[@]+"${extra_gateway_flags[@]}"}
fi
# The instances and the gateway start together (each needs only the Conductor and the master) and are waited for
# here, in the order they were started.
for ((i = 0; i < n_decode; i++)); do
  wait_ready "decode$i" > /dev/null
  record_metrics "decode$i"
done
for ((i = 0; i < n_prefill; i++)); do
  wait_ready "prefill$i" > /dev/null
  record_metrics "prefill$i"
done
if [[ "$gateway" == 1 ]]; then
  gateway_url="$(wait_ready gateway)"
  record_metrics gateway  # its /metrics is on its HTTP port
  export MC_GATEWAY="$gateway_url"
fi

export MC_CONDUCTOR="$conductor" MC_STORE_MASTER="$master" MC_STORE_EVENTS="$events" MC_BLOCK_SIZE="$block_size"
export MC_CLUSTER_STATE="$state"
# CMD is a tenant's client: it gets the tenants' keys only, not the admin's, the daemons' or the cluster's secrets.
if [[ -n "$auth_dir" ]]; then
  client_keys "$auth_dir" "$state/client-auth" default alice bob
  export MC_AUTH_DIR="$state/client-auth" MC_AUTH_NAME=default
fi
if [[ "$metrics" == 1 ]]; then export MC_METRICS_TARGETS="$state/metrics-targets.txt"; fi
# The replay's synthesized token ids must be in the model's vocabulary (the ref backend checks them).
case "$model" in
  tiny) export MC_VOCAB_SIZE="${MC_VOCAB_SIZE:-256}" ;;
  small) export MC_VOCAB_SIZE="${MC_VOCAB_SIZE:-1024}" ;;
  *) if [[ -n "$model_vocab" ]]; then export MC_VOCAB_SIZE="${MC_VOCAB_SIZE:-$model_vocab}"; fi ;;
esac
{
  echo "local-cluster.sh: up: $n_masters store master(s), $store_nodes storage nodes, 1 conductor ($policy)," \
       "$n_prefill prefill and $n_decode decode instances ($backend backend, model $model, block $block_size tokens)," \
       "$n_hosts host label(s)"
  echo "  conductor     $conductor      (export MC_CONDUCTOR=$conductor)"
  if [[ -n "$etcd_endpoint" ]]; then
    echo "  store masters $n_masters, leader at start $master (KV events $events); it moves at a takeover: use --etcd"
  else
    echo "  store master  $master      KV events $events"
  fi
  [[ -z "$etcd_endpoint" ]] || echo "  replicated    etcd $etcd_endpoint, cluster $cluster_id (export MC_ETCD=$etcd_endpoint MC_CLUSTER_ID=$cluster_id)"
  [[ -z "$gateway_url" ]] || echo "  gateway       $gateway_url   (export MC_GATEWAY=$gateway_url; curl $gateway_url/v1/models)"
  echo "  logs          $state/*.log"
  [[ -z "$auth_dir" ]] || echo "  keys          $auth_dir (operator: --auth-name admin);  tenants: export MC_AUTH_DIR=$state/client-auth MC_AUTH_NAME=default"
  [[ "$metrics" != 1 ]] || echo "  metrics       GET http://HOST:PORT/metrics of each daemon: $state/metrics.txt" \
    "(scrape targets: $state/metrics-targets.txt)"
  echo "  replay:       $bin/mc-trace-replay TRACE --conductor $conductor --block-tokens $block_size"
  if [[ -n "$etcd_endpoint" ]]; then
    # Replicated: the leader moves at a takeover, so the tools follow it through etcd, not a fixed --master.
    echo "  status:       $bin/mc-conductor stat --endpoint $conductor;  $bin/mc-store stat --etcd $etcd_endpoint --cluster-id $cluster_id"
    echo "  KV events:    $bin/mc-store watch --etcd $etcd_endpoint --cluster-id $cluster_id   (follows the leader)"
  else
    echo "  status:       $bin/mc-conductor stat --endpoint $conductor;  $bin/mc-store stat --master $master"
  fi
} >&2

if [[ ${#cmd[@]} -gt 0 ]]; then
  # In the background (stdin kept: a trace may be piped in) so that a SIGTERM to this script runs its trap at
  # once instead of after CMD: stop_all then stops CMD first (the last pid), then the cluster.
  "${cmd[@]}" <&0 &
  pids+=("$!")
  names+=("command")
  set +e
  wait "$!"
  rc=$?
  set -e
  exit "$rc"
fi
echo "local-cluster.sh: running; Ctrl-C stops everything" >&2
while true; do
  for idx in "${!pids[@]}"; do
    if ! kill -0 "${pids[$idx]}" 2>/dev/null; then
      echo "local-cluster.sh: ${names[$idx]} (pid ${pids[$idx]}) exited; stopping the cluster. Its log:" >&2
      sed 's/^/  /' "$state/${names[$idx]}.log" >&2
      exit 1
    fi
  done
  sleep 1
done
