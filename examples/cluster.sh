#!/usr/bin/env bash
# cluster.sh: start the mc cluster a cluster description names (one JSON file; docs/DESIGN.md §16, examples under
# examples/clusters/), each host its own machine.
#
#   examples/cluster.sh FILE [options]                  run until Ctrl-C (prints how to reach the cluster)
#   examples/cluster.sh FILE [options] -- CMD [ARGS]    run CMD on the client host with MC_CONDUCTOR, MC_STORE_MASTER,
#                                                        MC_CLIENT_BIND (and MC_GATEWAY, MC_AUTH_DIR) set, then stop;
#                                                        exits with CMD's status
# Modes (--mode):
#   netns     every host is a network namespace on this machine (needs root and `ip netns`): its own address, one
#             switch (a Linux bridge in a namespace of its own) per rack, racks joined through a router namespace;
#             every host NIC and rack uplink shaped with tc tbf to its bandwidth, both directions. This kernel has
#             no netem: a latency in the description is not emulated (said on stderr). Each daemon runs inside
#             its host with `ip netns exec`, binds its host's address and advertises it; CMD runs inside the
#             client host. Nothing is added to this machine's own namespace.
#   loopback  every daemon on 127.0.0.1 of this machine, with its host's name as its --host label (placement and
#             the ledger follow the labels; transfers between "hosts" still take shm): where namespaces cannot be
#             made.
#   ssh       real hosts: each host's "ssh" destination runs its daemons (the same --bin path there), bound to its
#             "address". With --dry-run (how it is tested here) every command is printed instead.
# The launcher starts the master, then the storage nodes and the conductor together, then the decode and prefill
# instances and the gateway together, and waits for each daemon's ready line (cluster.txt lists them in that order:
# master, storage nodes, conductor, decode, prefill, gateway), writes $MC_CLUSTER_STATE/cluster.txt (name pid endpoint host) and hosts.txt (host address rack, and in
# netns mode its namespace, its interface, the switch's port facing it and its nic_mbit: for tc, nft or ip in a
# fault test) and with several racks racks.txt (rack, router namespace and its port, switch namespace and its
# uplink port), and on exit, Ctrl-C, SIGTERM or a failure stops every process it started (SIGTERM; after 1 s a second
# SIGTERM, which ends a drain; SIGKILL after 5 s more) and
# removes every namespace, link and its state directory. The store nodes' DRAM and the instances' KV buffers are
# memfds: nothing is left in /dev/shm.
#
# Options:
#   --mode M              netns, loopback or ssh (default: netns when this process can make namespaces, else
#                         loopback, saying why)                                                 [MC_CLUSTER_MODE]
#   --dry-run             print the commands (network set-up, daemons) instead of running them; endpoints that only
#                         the ready lines would tell are shown as <NAME-endpoint>
#   --set KEY=VALUE       override one of the description's "defaults" (repeatable), e.g. --set time_scale=100
#   --no-auth             no keys: every daemon gets --allow-unauthenticated (default: keys made with mc-auth init,
#                         one per daemon, client identity "default", as local-cluster.sh --auth)
#   --bin DIR             where the mc binaries are                 [MC_BIN, build/bin next to this script]
#   --ready-timeout-s N   how long to wait for each ready line      [MC_READY_TIMEOUT_S, 60]
#   --log-level L         daemons' log level                        [MC_LOG_LEVEL, warn]
#   --keep-logs DIR       copy the daemons' logs to DIR when stopping
#   -h, --help            this text
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=lib/netns.sh
. "$here/lib/netns.sh"
# shellcheck source=lib/keys.sh
. "$here/lib/keys.sh"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "cluster.sh: $*" >&2; exit 2; }

file=""
mode="${MC_CLUSTER_MODE:-}"
dry_run=0
auth=1
bin="${MC_BIN:-$root/build/bin}"
ready_timeout_s="${MC_READY_TIMEOUT_S:-60}"
log_level="${MC_LOG_LEVEL:-warn}"
keep_logs=""
sets=()
cmd=()
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mode) need "$@"; mode="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --set) need "$@"; [[ "$2" == *=* ]] || die "--set takes KEY=VALUE, got '$2'"; sets+=("$2"); shift 2 ;;
    --no-auth) auth=0; shift ;;
    --bin) need "$@"; bin="$2"; shift 2 ;;
    --ready-timeout-s) need "$@"; ready_timeout_s="$2"; shift 2 ;;
    --log-level) need "$@"; log_level="$2"; shift 2 ;;
    --keep-logs) need "$@"; keep_logs="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; cmd=("$@"); break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [[ -z "$file" ]] || die "one description only (got '$file' and '$1')"; file="$1"; shift ;;
  esac
done
[[ -n "$file" ]] || die "which cluster? give a description file (examples/clusters/*.json; see --help)"
[[ -r "$file" ]] || die "cannot read the cluster description '$file'"
command -v jq >/dev/null || { echo "cluster.sh: needs jq (tools/install-deps.sh installs it)" >&2; exit 1; }
jq -e . "$file" >/dev/null 2>&1 || die "$file is not JSON: $(jq . "$file" 2>&1 >/dev/null | head -1)"
[[ "$ready_timeout_s" =~ ^[0-9]+$ ]] || die "--ready-timeout-s must be a whole number of seconds"

if [[ -z "$mode" ]]; then
  if netns_require; then mode=netns; else
    mode=loopback
    echo "cluster.sh: running the description on loopback: $NETNS_SKIP_REASON" >&2
  fi
fi
case "$mode" in
  netns) [[ "$dry_run" == 1 ]] || netns_require || { echo "cluster.sh: --mode netns: $NETNS_SKIP_REASON" >&2; exit 1; } ;;
  loopback|ssh) ;;
  *) die "--mode must be netns, loopback or ssh, got '$mode'" ;;
esac

# ---- the description ----
q() { jq -r "$1" "$file"; }
# The description is read with a few jq runs, not one per field (each run costs tens of milliseconds). Fields are
# joined by the unit separator (0x1f), which no setting contains, so that empty fields keep their place.
sep=$'\x1f'
# The description's "defaults" (null and false count as absent).
declare -A file_defaults=()
while IFS="$sep" read -r k v; do file_defaults[$k]="$v"; done < <(jq -r \
  'if (.defaults | type) == "object" then .defaults else {} end | to_entries[]
   | select(.value != null and .value != false) | [.key, (.value | tostring)] | join("\u001f")' "$file")
# setting KEY DEFAULT: --set beats the description's "defaults" beats DEFAULT.
setting() {
  local kv v=""
  for kv in ${sets[@]+"${sets[@]}"}; do
    [[ "${kv%%=*}" == "$1" ]] && v="${kv#*=}"
  done
  [[ -n "$v" ]] || v="${file_defaults[$1]:-}"
  echo "${v:-$2}"
}
backend="$(setting backend sim)"
model="$(setting model "$([[ "$backend" == ref ]] && echo tiny || echo llama3-70b)")"
gpu="$(setting gpu a800x8)"
time_scale="$(setting time_scale 1)"
kv_bytes_per_token="$(setting kv_bytes_per_token 1024)"
block_size="$(setting block_size 512)"
policy="$(setting policy kvcache)"
queue="$(setting queue "")"
case "$queue" in ""|fcfs|slo) ;; *) die "defaults.queue must be fcfs or slo (absent, null or empty: the policy's default), got '$queue'" ;; esac
pending_prefix="$(setting pending_prefix "")"
case "$pending_prefix" in ""|on|off) ;; *) die "defaults.pending_prefix must be on or off (absent, null or empty: the policy's default), got '$pending_prefix'" ;; esac
placement_load_weight="$(setting placement_load_weight "")"
[[ -z "$placement_load_weight" ]] || awk -v f="$placement_load_weight" 'BEGIN { exit !(f ~ /^[0-9]+(\.[0-9]+)?$/ && f >= 0 && f <= 1000) }' || die "defaults.placement_load_weight must be a number in [0, 1000] (0: the smallest TTFT, the paper's rule), got '$placement_load_weight'"
slo_headroom="$(setting slo_headroom "")"
[[ -z "$slo_headroom" ]] || awk -v f="$slo_headroom" 'BEGIN { exit !(f ~ /^[0-9]+(\.[0-9]+)?$/ && f >= 0 && f <= 0.9) }' || die "defaults.slo_headroom must be a number in [0, 0.9] (0: admit up to the SLO, the paper's rule), got '$slo_headroom'"
shed_limit="$(setting shed_limit "")"
[[ -z "$shed_limit" ]] || awk -v f="$shed_limit" 'BEGIN { exit !(f ~ /^[0-9]+(\.[0-9]+)?$/ && f >= 0 && f <= 1000) }' || die "defaults.shed_limit must be a number in [0, 1000] (0: no load shedding, the paper's rule), got '$shed_limit'"
pipeline_group="$(setting pipeline_group 1)"
[[ "$pipeline_group" =~ ^[1-9][0-9]?$ && "$pipeline_group" -le 64 ]] || die "defaults.pipeline_group must be 1..64 prefill instances (1: no groups), got '$pipeline_group'"
pipeline_chunk="$(setting pipeline_chunk_tokens 8192)"
[[ "$pipeline_chunk" =~ ^[1-9][0-9]*$ ]] || die "defaults.pipeline_chunk_tokens must be a positive number of tokens, got '$pipeline_chunk'"
pipeline_reserve="$(setting pipeline_reserve_factor 2)"
awk -v f="$pipeline_reserve" 'BEGIN { exit !(f ~ /^[0-9]+(\.[0-9]+)?$/ && f >= 1 && f <= 64) }' || die "defaults.pipeline_reserve_factor must be a number in [1, 64] (instances about free to form a group, x its size), got '$pipeline_reserve'"
dram_bytes="$(setting dram_bytes 256MiB)"
kv_buffer_size="$(setting kv_buffer_size 256MiB)"
prefix_cache="$(setting prefix_cache store)"
nic_default="$(setting nic_mbit 0)"
[[ "$nic_default" =~ ^[0-9]+$ ]] || die "defaults.nic_mbit must be a whole number of Mbit/s (0: unshaped), got '$nic_default'"
subnet="$(setting subnet 10.88)"
[[ "$subnet" =~ ^10\.[0-9]{1,3}$ ]] || die "defaults.subnet must be 10.N (hosts get 10.N.RACK.HOST), got '$subnet'"

mapfile -t rack_names < <(q '.racks[]?.name')
if [[ ${#rack_names[@]} -eq 0 ]]; then rack_names=(rack0); fi
roles=(master store conductor decode prefill gateway)
# One line per host: name, rack, nic_mbit, ssh, address, nic_latency_us, then each role's daemon count and args.
mapfile -t host_lines < <(jq -r --arg roles "${roles[*]}" \
  '($roles | split(" ")) as $rs | .hosts[]? | . as $h
   | [(.name // "" | tostring), (.rack // "" | tostring), (.nic_mbit // "" | tostring), (.ssh // "" | tostring),
      (.address // "" | tostring), (.nic_latency_us // 0 | tostring)]
     + [$rs[] | (($h.daemons // {})[.] // 0 | tostring), (($h.args // {})[.] // "" | tostring)]
   | join("\u001f")' "$file")
host_names=()
for line in ${host_lines[@]+"${host_lines[@]}"}; do host_names+=("${line%%"$sep"*}"); done
n_hosts=${#host_names[@]}
((n_hosts >= 1)) || die "$file names no hosts (.hosts[])"
((n_hosts <= 200 && ${#rack_names[@]} <= 200)) || die "at most 200 hosts and 200 racks"
declare -A rack_index=()
for r in "${!rack_names[@]}"; do
  [[ "${rack_names[$r]}" =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$ ]] || die "rack name '${rack_names[$r]}': letters, digits, _ and -"
  [[ -z "${rack_index[${rack_names[$r]}]:-}" ]] || die "rack '${rack_names[$r]}' named twice"
  rack_index[${rack_names[$r]}]=$r
done
declare -A count=() args=() seen=()
host_rack=() host_nic=() host_ssh=() host_addr=() host_ns=() host_if=() switch_if=() rack_hosts=()
for h in "${!host_names[@]}"; do
  name="${host_names[$h]}"
  [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$ ]] || die "host name '$name': letters, digits, _ and - (at most 32)"
  [[ -z "${seen[$name]:-}" ]] || die "host '$name' named twice"
  seen[$name]=1
  IFS="$sep" read -r -a fields <<< "${host_lines[$h]}"
  rack="${fields[1]:-}"
  [[ -n "$rack" ]] || rack="${rack_names[0]}"
  [[ -n "${rack_index[$rack]:-}" ]] || die "host '$name' is in rack '$rack', which .racks does not name"
  r=${rack_index[$rack]}
  host_rack[$h]=$r
  k=${rack_hosts[$r]:-0}
  rack_hosts[$r]=$((k + 1))
  host_nic[$h]="${fields[2]:-$nic_default}"
  [[ "${host_nic[$h]}" =~ ^[0-9]+$ ]] || die "host '$name': nic_mbit must be a whole number of Mbit/s (0: unshaped)"
  host_ssh[$h]="${fields[3]:-}"
  case "$mode" in
    netns) host_addr[$h]="$subnet.$((r + 1)).$((k + 10))"; host_ns[$h]="host-$name" ;;
    loopback) host_addr[$h]=127.0.0.1 ;;
    ssh)
      host_addr[$h]="${fields[4]:-}"
      [[ -n "${host_addr[$h]}" && -n "${host_ssh[$h]}" ]] || die "--mode ssh: host '$name' needs \"ssh\" and \"address\""
      ;;
  esac
  for j in "${!roles[@]}"; do
    role=${roles[$j]}
    c="${fields[$((6 + 2 * j))]:-}"
    [[ "$c" =~ ^[0-9]+$ ]] || die "host '$name': daemons.$role must be a count"
    count[$h,$role]=$c
    count[$role]=$((${count[$role]:-0} + c))
    args[$h,$role]="${fields[$((7 + 2 * j))]:-}"
  done
  lat="${fields[5]:-0}"
  if [[ "$lat" != 0 && "$mode" == netns ]]; then
    echo "cluster.sh: host '$name': nic_latency_us $lat not emulated (this kernel has no netem; tbf shapes rate only)" >&2
  fi
done
[[ "${count[master]}" == 1 ]] || die "the cluster needs exactly one store master (daemons.master), has ${count[master]}"
[[ "${count[conductor]}" == 1 ]] || die "the cluster needs exactly one conductor, has ${count[conductor]}"
((count[prefill] >= 1 && count[decode] >= 1)) || die "the cluster needs at least one prefill and one decode instance"
((count[store] >= 1)) || die "the cluster needs at least one storage node (daemons.store)"
((count[gateway] <= 1)) || die "at most one gateway"
client="$(q '.client // empty')"
client_host=-1
for h in "${!host_names[@]}"; do
  if [[ -n "$client" && "${host_names[$h]}" == "$client" ]]; then client_host=$h; fi
  if [[ -z "$client" && "${count[$h,conductor]}" == 1 ]]; then client_host=$h; fi
done
((client_host >= 0)) || die "client '$client' is not a host of the description"
for b in mc-store mc-conductor mc-prefill mc-decode mc-auth; do
  [[ "$dry_run" == 1 || -x "$bin/$b" ]] || { echo "cluster.sh: $bin/$b not found: build first or pass --bin" >&2; exit 1; }
done

# ---- running things ----
state="$(mktemp -d "${TMPDIR:-/tmp}/mc-cluster.XXXXXX")"
NETNS_PREFIX="mc$$"
pids=()
names=()
declare -A pid_of=()  # daemon name -> its pid (wait_ready)
remote=()  # ssh mode: "dest pid" of each daemon

show() { printf '%q ' "$@" | sed 's/ $//'; echo; }
# net CMD...: a network set-up step (printed in --dry-run).
net() { if [[ "$dry_run" == 1 ]]; then show "$@"; else "$@"; fi; }

stop_all() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  local i deadline
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null; done
  # The whole cluster stops: no drain is wanted (a storage node would try to move its objects to nodes that are
  # stopping too, a worker would finish its jobs). A second SIGTERM to those still running ends their drains.
  deadline=$((SECONDS + 1))
  for pid in ${pids[@]+"${pids[@]}"}; do while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done; done
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM "$pid" 2>/dev/null; done
  deadline=$((SECONDS + 5))
  for i in "${!pids[@]}"; do
    pid=${pids[$i]}
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster.sh: ${names[$i]:-daemon} (pid $pid) did not stop on SIGTERM within 5 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
  done
  for r in ${remote[@]+"${remote[@]}"}; do
    # shellcheck disable=SC2086
    set -- $r
    ssh -o BatchMode=yes "$1" "kill $2" 2>/dev/null
  done
  if [[ -n "$keep_logs" ]]; then mkdir -p "$keep_logs" && cp "$state"/*.log "$keep_logs"/ 2>/dev/null; fi
  [[ "$mode" == netns && "$dry_run" == 0 ]] && netns_cleanup
  rm -rf "$state"
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The network: namespaces, one switch per rack, a router between racks, every link shaped.
if [[ "$mode" == netns ]]; then
  routed=$((${#rack_names[@]} > 1))
  if [[ "$dry_run" == 1 ]]; then
    # Print the same steps netns.sh takes.
    for r in "${!rack_names[@]}"; do
      show ip netns add "$NETNS_PREFIX-switch-${rack_names[$r]}"
      show ip -n "$NETNS_PREFIX-switch-${rack_names[$r]}" link add br0 type bridge
    done
    if ((routed)); then
      show ip netns add "$NETNS_PREFIX-router"
      show ip netns exec "$NETNS_PREFIX-router" sysctl -qw net.ipv4.ip_forward=1
      for r in "${!rack_names[@]}"; do
        show ip link add "up-${rack_names[$r]}" netns "$NETNS_PREFIX-router" type veth peer name uplink \
          netns "$NETNS_PREFIX-switch-${rack_names[$r]}"
        show ip -n "$NETNS_PREFIX-router" addr add "$subnet.$((r + 1)).1/24" dev "up-${rack_names[$r]}"
        show tc -n "$NETNS_PREFIX-router" qdisc replace dev "up-${rack_names[$r]}" root tbf rate \
          "$(jq -r --argjson i "$r" '.racks[$i].uplink_mbit // 0' "$file")mbit" burst BYTES latency 100ms
      done
    fi
    for h in "${!host_names[@]}"; do
      ns="$NETNS_PREFIX-${host_ns[$h]}"
      show ip netns add "$ns"
      show ip link add eth0 netns "$ns" type veth peer name "port-${host_names[$h]}" \
        netns "$NETNS_PREFIX-switch-${rack_names[${host_rack[$h]}]}"
      show ip -n "$ns" addr add "${host_addr[$h]}/24" dev eth0
      if ((host_nic[h] > 0)); then
        show tc -n "$ns" qdisc replace dev eth0 root tbf rate "${host_nic[$h]}mbit" burst BYTES latency 100ms
      fi
      if ((routed)); then show ip -n "$ns" route add default via "$subnet.$((${host_rack[$h]} + 1)).1"; fi
    done
  else
    for r in "${!rack_names[@]}"; do netns_bridge "switch-${rack_names[$r]}"; done
    ((routed)) && netns_add router && net ip netns exec "$NETNS_PREFIX-router" sysctl -qw net.ipv4.ip_forward=1
    for h in "${!host_names[@]}"; do
      r=${host_rack[$h]}
      netns_add "${host_ns[$h]}"
      netns_attach "switch-${rack_names[$r]}" "${host_ns[$h]}" "${host_addr[$h]}/24"
      host_if[$h]="$NETNS_IF_A"
      switch_if[$h]="$NETNS_IF_B"
      netns_shape "${host_ns[$h]}" "$NETNS_IF_A" "${host_nic[$h]}"         # host -> switch
      netns_shape "switch-${rack_names[$r]}" "$NETNS_IF_B" "${host_nic[$h]}"  # switch -> host
      if ((routed)); then
        net ip -n "$NETNS_PREFIX-${host_ns[$h]}" route add default via "$subnet.$((r + 1)).1"
      fi
    done
    if ((routed)); then
      for r in "${!rack_names[@]}"; do
        netns_attach "switch-${rack_names[$r]}" router "$subnet.$((r + 1)).1/24"
        echo "${rack_names[$r]} $NETNS_PREFIX-router $NETNS_IF_A $NETNS_PREFIX-switch-${rack_names[$r]} $NETNS_IF_B" \
          >> "$state/racks.txt"
        up="$(jq -r --argjson i "$r" '.racks[$i].uplink_mbit // 0' "$file")"
        [[ "$up" =~ ^[0-9]+$ ]] || die "rack '${rack_names[$r]}': uplink_mbit must be a whole number of Mbit/s"
        netns_shape router "$NETNS_IF_A" "$up"                       # router -> rack
        netns_shape "switch-${rack_names[$r]}" "$NETNS_IF_B" "$up"   # rack -> router
      done
    fi
  fi
fi
for h in "${!host_names[@]}"; do
  echo "${host_names[$h]} ${host_addr[$h]} ${rack_names[${host_rack[$h]}]} ${host_ns[$h]:+$NETNS_PREFIX-${host_ns[$h]}}" \
    "${host_if[$h]:-} ${switch_if[$h]:-} ${host_nic[$h]}" >> "$state/hosts.txt"
done

# start H NAME CMD...: starts daemon NAME on host H in the background, output to $state/NAME.log.
start() {
  local h=$1 name=$2
  shift 2
  echo "$name ${host_names[$h]}" >> "$state/placement.txt"
  if [[ "$dry_run" == 1 ]]; then
    case "$mode" in
      netns) show ip netns exec "$NETNS_PREFIX-${host_ns[$h]}" "$@" ;;
      ssh) echo "ssh ${host_ssh[$h]} 'nohup $(show "$@") > mc-$name.log 2>&1 < /dev/null & echo \$!'" ;;
      *) show "$@" ;;
    esac
    return 0
  fi
  if [[ "$mode" == ssh ]]; then
    local rpid
    rpid="$(ssh -o BatchMode=yes "${host_ssh[$h]}" "nohup $(show "$@") > mc-$name.log 2>&1 < /dev/null & echo \$!")"
    remote+=("${host_ssh[$h]} $rpid")
    return 0
  fi
  # Started directly (not through a function, which would run in a subshell): $! is the daemon itself (ip netns
  # exec execs it), so stop_all's signals reach it.
  if [[ "$mode" == netns ]]; then
    ip netns exec "$NETNS_PREFIX-${host_ns[$h]}" "$@" > "$state/$name.log" 2>&1 &
  else
    "$@" > "$state/$name.log" 2>&1 &
  fi
  pids+=("$!")
  names+=("$name")
  pid_of[$name]=$!
}

# wait_ready H NAME: prints NAME's endpoint once its ready line is there (the line in $state/NAME.ready).
wait_ready() {
  local h=$1 name=$2 line="" deadline=$((SECONDS + ready_timeout_s))
  if [[ "$dry_run" == 1 ]]; then
    echo "ready $name <$name-endpoint> events=<$name-events>" > "$state/$name.ready"
    echo "<$name-endpoint>"
    return 0
  fi
  local pid="${pid_of[$name]:-}"
  while ((SECONDS < deadline)); do
    if [[ "$mode" == ssh ]]; then
      line="$(ssh -o BatchMode=yes "${host_ssh[$h]}" "grep -m1 '^ready ' mc-$name.log" 2>/dev/null || true)"
    else
      line="$(grep -m1 '^ready ' "$state/$name.log" 2>/dev/null || true)"
    fi
    if [[ -n "$line" ]]; then
      echo "$line" > "$state/$name.ready"
      echo "$name ${pid:-remote} $(awk '{print $3}' <<< "$line") ${host_names[$h]}" >> "$state/cluster.txt"
      awk '{print $3}' <<< "$line"
      return 0
    fi
    if [[ "$mode" != ssh ]] && ! kill -0 "$pid" 2>/dev/null; then
      echo "cluster.sh: $name (host ${host_names[$h]}) exited before it was ready; its log:" >&2
      sed 's/^/  /' "$state/$name.log" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "cluster.sh: $name (host ${host_names[$h]}) printed no ready line within $ready_timeout_s s" >&2
  [[ "$mode" == ssh ]] || sed 's/^/  /' "$state/$name.log" >&2
  return 1
}
ready_field() { tr ' ' '\n' < "$state/$1.ready" | sed -n "s/^$2=//p"; }

export MC_LOG_LEVEL="$log_level"
# Keys: one identity per daemon (docs/SECURITY.md), as local-cluster.sh --auth makes them.
auth_dir=""
if [[ "$auth" == 1 ]]; then
  auth_dir="$state/auth"
  init_args=(--tenant default --tenant alice --tenant bob --tenant gateway --shared public)
  for ((i = 0; i < count[prefill]; i++)); do init_args+=(--worker "prefill$i"); done
  for ((i = 0; i < count[decode]; i++)); do init_args+=(--worker "decode$i"); done
  for ((i = 0; i < count[store]; i++)); do init_args+=(--node "node$i"); done
  if [[ "$dry_run" == 1 ]]; then show "$bin/mc-auth" init "$auth_dir" "${init_args[@]}"; else
    "$bin/mc-auth" init "$auth_dir" "${init_args[@]}" > "$state/auth.txt"
  fi
  if [[ "$mode" == ssh ]]; then
    for h in "${!host_names[@]}"; do
      net ssh -o BatchMode=yes "${host_ssh[$h]}" mkdir -p -m 700 "$state"
      net scp -qr "$auth_dir" "${host_ssh[$h]}:$auth_dir"
    done
  fi
fi
# id NAME: the flags that make a daemon identity NAME.
id_flags() {
  if [[ -n "$auth_dir" ]]; then echo "--auth-dir $auth_dir --auth-name $1"; else echo "--allow-unauthenticated"; fi
}
extra() { local a="${args[$1,$2]}"; echo "$a"; }

# Daemons, in dependency order; instance names count across hosts in host order.
master="" events="" conductor=""
for h in "${!host_names[@]}"; do
  ((count[$h,master] == 1)) || continue
  a="${host_addr[$h]}"
  # shellcheck disable=SC2046
  start "$h" master "$bin/mc-store" master --listen "tcp://$a:0" --events "tcp://$a:0" $(id_flags master) $(extra "$h" master)
  master="$(wait_ready "$h" master)"
  events="$(ready_field master events)"
done
node=0
for h in "${!host_names[@]}"; do
  for ((i = 0; i < count[$h,store]; i++)); do
    a="${host_addr[$h]}"
    # shellcheck disable=SC2046
    start "$h" "node$node" "$bin/mc-store" serve --master "$master" --node-id "node$node" --host "${host_names[$h]}" \
      --domain "${rack_names[${host_rack[$h]}]}" --listen "tcp://$a:0" --xfer-listen "tcp://$a:0" \
      --dram-bytes "$dram_bytes" $(id_flags "node$node") $(extra "$h" store)
    node=$((node + 1))
  done
done
conductor_flags=()
[[ "$backend" == ref ]] && conductor_flags=(--decode-envelope 0)
# The prefill queue discipline (docs/DESIGN.md §10; absent: the policy's default, slo for kvcache).
[[ -n "$queue" ]] && conductor_flags+=(--queue "$queue")
# Pending prefixes, load-priced placement, SLO headroom and load shedding (docs/DESIGN.md §10; absent: the Conductor's
# defaults).
[[ -n "$pending_prefix" ]] && conductor_flags+=(--pending-prefix "$pending_prefix")
[[ -n "$placement_load_weight" ]] && conductor_flags+=(--placement-load-weight "$placement_load_weight")
[[ -n "$slo_headroom" ]] && conductor_flags+=(--slo-headroom "$slo_headroom")
[[ -n "$shed_limit" ]] && conductor_flags+=(--shed-limit "$shed_limit")
# Pipelined prefill groups (ref and sim instances run stages): the Conductor forms them per request (docs/DESIGN.md §18).
[[ "$pipeline_group" == 1 ]] || conductor_flags+=(--pipeline-group "$pipeline_group" --prefill-chunk "$pipeline_chunk" --pipeline-reserve-factor "$pipeline_reserve")
for h in "${!host_names[@]}"; do
  ((count[$h,conductor] == 1)) || continue
  # shellcheck disable=SC2046
  start "$h" conductor "$bin/mc-conductor" serve --listen "tcp://${host_addr[$h]}:0" --kv-events "$events" \
    --store-master "$master" --policy "$policy" --block-size "$block_size" --cost-model "$model" --gpu "$gpu" \
    --time-scale "$time_scale" ${conductor_flags[@]+"${conductor_flags[@]}"} $(id_flags conductor) $(extra "$h" conductor)
done
# The storage nodes and the Conductor start together (each needs only the master) and are waited for here, in the
# order they were started (cluster.txt lists them so).
node=0
for h in "${!host_names[@]}"; do
  for ((i = 0; i < count[$h,store]; i++)); do
    wait_ready "$h" "node$node" > /dev/null
    node=$((node + 1))
  done
done
for h in "${!host_names[@]}"; do
  ((count[$h,conductor] == 1)) || continue
  conductor="$(wait_ready "$h" conductor)"
done
worker_flags=(--backend "$backend" --model "$model" --block-size "$block_size" --kv-buffer-size "$kv_buffer_size"
              --conductor "$conductor")
[[ "$backend" == sim ]] && worker_flags+=(--gpu "$gpu" --time-scale "$time_scale" --kv-bytes-per-token "$kv_bytes_per_token")
# The prefix cache: prefill instances read and put blocks there, decode instances put the blocks of pipelined
# prefills (docs/DESIGN.md §18 "Live groups").
store_flag="$master"
[[ "$prefix_cache" == none ]] && store_flag=none
n=0
for h in "${!host_names[@]}"; do
  for ((i = 0; i < count[$h,decode]; i++)); do
    # shellcheck disable=SC2046
    start "$h" "decode$n" "$bin/mc-decode" --listen "tcp://${host_addr[$h]}:0" --reservation-ttl-ms 180000 \
      "${worker_flags[@]}" --store "$store_flag" --instance-id "decode$n" --host "${host_names[$h]}" $(id_flags "decode$n") $(extra "$h" decode)
    n=$((n + 1))
  done
done
n=0
for h in "${!host_names[@]}"; do
  for ((i = 0; i < count[$h,prefill]; i++)); do
    # shellcheck disable=SC2046
    start "$h" "prefill$n" "$bin/mc-prefill" --listen "tcp://${host_addr[$h]}:0" --store "$store_flag" \
      "${worker_flags[@]}" --instance-id "prefill$n" --host "${host_names[$h]}" $(id_flags "prefill$n") \
      $(extra "$h" prefill)
    n=$((n + 1))
  done
done
gateway_url=""
for h in "${!host_names[@]}"; do
  ((count[$h,gateway] == 1)) || continue
  # The OpenAI port carries no API keys (DESIGN.md §15): on a host address it is open to every host that reaches it.
  echo "cluster.sh: the gateway's HTTP port on ${host_addr[$h]} has no authentication (--allow-unauthenticated)" >&2
  # shellcheck disable=SC2046
  start "$h" gateway "$bin/mc-gateway" --listen "${host_addr[$h]}:0" --client-bind "tcp://${host_addr[$h]}:0" \
    --conductor "$conductor" --model "$model" $(id_flags gateway) --allow-unauthenticated $(extra "$h" gateway)
done
# The instances and the gateway start together (each needs only the Conductor and the master) and are waited for
# here, in the order they were started.
for role in decode prefill; do
  n=0
  for h in "${!host_names[@]}"; do
    for ((i = 0; i < count[$h,$role]; i++)); do
      wait_ready "$h" "$role$n" > /dev/null
      n=$((n + 1))
    done
  done
done
for h in "${!host_names[@]}"; do
  ((count[$h,gateway] == 1)) || continue
  gateway_url="$(wait_ready "$h" gateway)"
done

export MC_CONDUCTOR="$conductor" MC_STORE_MASTER="$master" MC_STORE_EVENTS="$events" MC_BLOCK_SIZE="$block_size"
export MC_CLUSTER_STATE="$state" MC_CLIENT_BIND="tcp://${host_addr[$client_host]}:0"
[[ -n "$gateway_url" ]] && export MC_GATEWAY="$gateway_url"
# CMD is a tenant's client: it gets the tenants' keys only, not the admin's, the daemons' or the cluster's secrets.
if [[ -n "$auth_dir" ]]; then
  [[ "$dry_run" == 1 ]] || client_keys "$auth_dir" "$state/client-auth" default alice bob
  export MC_AUTH_DIR="$state/client-auth" MC_AUTH_NAME=default
fi
case "$model" in
  tiny) export MC_VOCAB_SIZE="${MC_VOCAB_SIZE:-256}" ;;
  small) export MC_VOCAB_SIZE="${MC_VOCAB_SIZE:-1024}" ;;
  *)  # A Hugging Face model directory: its vocabulary bounds the token ids a replay synthesizes.
    if [[ -d "$model" && -f "$model/config.json" ]] && command -v jq > /dev/null; then
      vocab="$(jq -r '.vocab_size // empty' "$model/config.json" 2>/dev/null || true)"
      if [[ "$vocab" =~ ^[0-9]+$ ]]; then export MC_VOCAB_SIZE="${MC_VOCAB_SIZE:-$vocab}"; fi
    fi ;;
esac
[[ "$dry_run" == 1 ]] && exit 0

client_prefix=""
[[ "$mode" == netns ]] && client_prefix="ip netns exec $NETNS_PREFIX-${host_ns[$client_host]} "
{
  echo "cluster.sh: up ($mode): $(q '.name // "cluster"') from $file: $n_hosts hosts in ${#rack_names[@]} rack(s)," \
       "${count[store]} storage nodes, ${count[prefill]} prefill and ${count[decode]} decode instances ($backend, $model)"
  while read -r hn addr rack ns _; do
    [[ "$mode" == netns ]] || ns=""  # (hosts.txt has empty namespace and interface fields outside netns mode)
    echo "  host $hn  rack $rack  address $addr${ns:+  namespace $ns}  runs: $(awk -v h="$hn" '$2==h{printf "%s ", $1}' \
      "$state/placement.txt")"
  done < "$state/hosts.txt"
  echo "  conductor     $conductor   store master $master"
  [[ -z "$gateway_url" ]] || echo "  gateway       $gateway_url"
  echo "  replay:       ${client_prefix}$bin/mc-trace-replay TRACE --conductor $conductor --block-tokens $block_size" \
       "--client-bind $MC_CLIENT_BIND${auth_dir:+ --auth-dir $auth_dir --auth-name default}"
  echo "  logs          $state/*.log"
} >&2

if [[ ${#cmd[@]} -gt 0 ]]; then
  if [[ "$mode" == netns ]]; then
    ip netns exec "$NETNS_PREFIX-${host_ns[$client_host]}" "${cmd[@]}" <&0 &
  else
    "${cmd[@]}" <&0 &
  fi
  pids+=("$!")
  names+=("command")
  set +e
  wait "$!"
  rc=$?
  set -e
  exit "$rc"
fi
echo "cluster.sh: running; Ctrl-C stops everything" >&2
while true; do
  for idx in "${!pids[@]}"; do
    if ! kill -0 "${pids[$idx]}" 2>/dev/null; then
      echo "cluster.sh: ${names[$idx]} (pid ${pids[$idx]}) exited; stopping the cluster. Its log:" >&2
      sed 's/^/  /' "$state/${names[$idx]}.log" >&2
      exit 1
    fi
  done
  sleep 1
done
