# shellcheck shell=bash disable=SC2034  # sourced; the NETNS_* variables are for the caller
# Network namespaces as hosts, for tests and benchmarks (source it; bash; needs root and `ip netns`).
#
#   . examples/lib/netns.sh
#   netns_require || { echo "skip: $NETNS_SKIP_REASON"; exit 0; }
#   netns_init                                  # prefix from the pid; cleanup on EXIT, INT and TERM
#   netns_add a; netns_add b                    # namespaces "$NETNS_PREFIX-a", "-b", each with lo up
#   netns_link a 10.77.0.1/24 b 10.77.0.2/24    # one veth pair joining them (no shaping)
#   netns_spawn a mc-xfer serve --listen tcp://10.77.0.1:0 ...   # in the background; pid in NETNS_LAST_PID
#   netns_exec b mc-xfer bench --target 10.77.0.1:PORT ...       # in the foreground
#
# More than two hosts: a switch (a Linux bridge inside a namespace of its own) and one veth per host:
#   netns_bridge rack1; netns_attach rack1 a 10.77.1.1/24; netns_attach rack1 b 10.77.1.2/24
# Every link end lives inside a namespace this script made, so deleting the namespaces removes every link;
# nothing is added to the caller's namespace. netns_cleanup (also the trap) stops the processes started with
# netns_spawn (SIGTERM, then SIGKILL after NETNS_GRACE_S seconds) and any other process still inside the
# namespaces, then deletes the namespaces. It is idempotent, works under `set -euo pipefail`, and the trap
# keeps the script's exit status. A caller that sets its own EXIT trap calls netns_cleanup from it.
#
# Names: NETNS_PREFIX defaults to "mcns<pid>" (unique per running script); interface names are short, as Linux
# allows 15 characters: veth<N>a / veth<N>b for the two ends of link N, veth<N>h / veth<N>s for a host's end and
# the switch's end of attachment N. (The transfer engine's shared buffers are memfds: a killed process leaves no
# /dev/shm file, and the store node's DRAM is a memfd too.)

NETNS_PREFIX=${NETNS_PREFIX:-}
NETNS_LIST=()       # full namespace names, in creation order
NETNS_PIDS=()       # pids started by netns_spawn
NETNS_LINKS=0       # veth pairs made so far (interface indexes)
NETNS_LAST_PID=
NETNS_GRACE_S=${NETNS_GRACE_S:-5}
NETNS_SKIP_REASON=

# netns_require: 0 when this process can make namespaces (root, `ip netns` works); else 1 with the reason
# in NETNS_SKIP_REASON.
netns_require() {
  if [ "$(id -u)" != 0 ]; then
    NETNS_SKIP_REASON="needs root to create network namespaces (ip netns add)"
    return 1
  fi
  if ! command -v ip >/dev/null 2>&1; then
    NETNS_SKIP_REASON="iproute2's ip is not installed"
    return 1
  fi
  local probe="mcnsprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    NETNS_SKIP_REASON="ip netns add fails here (no CAP_SYS_ADMIN, or /run/netns not writable)"
    return 1
  fi
  ip netns del "$probe" 2>/dev/null
  return 0
}

# netns_name SHORT: the full name of namespace SHORT.
netns_name() { echo "$NETNS_PREFIX-$1"; }

# netns_init [PREFIX]: the name prefix (default mcns<pid>) and the cleanup trap.
netns_init() {
  NETNS_PREFIX=${1:-${NETNS_PREFIX:-mcns$$}}
  trap 'netns__on_exit' EXIT
  trap 'netns_cleanup; trap - INT; kill -INT $$' INT
  trap 'netns_cleanup; trap - TERM; kill -TERM $$' TERM
}

netns__on_exit() {
  local rc=$?
  netns_cleanup
  exit "$rc"
}

# netns__run CMD...: runs CMD; on failure prints it with its output on stderr and returns 1.
netns__run() {
  local out
  if ! out=$("$@" 2>&1); then
    echo "netns_lib: failed: $* : $out" >&2
    return 1
  fi
}

# netns_add SHORT: namespace "$NETNS_PREFIX-SHORT" with lo up.
netns_add() {
  local ns
  ns=$(netns_name "$1")
  netns__run ip netns add "$ns" || return 1
  NETNS_LIST+=("$ns")
  netns__run ip -n "$ns" link set lo up
}

# netns_link A ADDR_A/LEN B ADDR_B/LEN: a veth pair between namespaces A and B, addressed and up. Prints
# nothing; the interface names are in NETNS_IF_A and NETNS_IF_B (e.g. for tc).
netns_link() {
  local a b
  a=$(netns_name "$1")
  b=$(netns_name "$3")
  NETNS_LINKS=$((NETNS_LINKS + 1))
  NETNS_IF_A="veth${NETNS_LINKS}a"
  NETNS_IF_B="veth${NETNS_LINKS}b"
  netns__run ip link add "$NETNS_IF_A" netns "$a" type veth peer name "$NETNS_IF_B" netns "$b" || return 1
  netns__run ip -n "$a" addr add "$2" dev "$NETNS_IF_A" || return 1
  netns__run ip -n "$b" addr add "$4" dev "$NETNS_IF_B" || return 1
  netns__run ip -n "$a" link set "$NETNS_IF_A" up || return 1
  netns__run ip -n "$b" link set "$NETNS_IF_B" up
}

# netns_bridge SHORT: a switch: namespace "$NETNS_PREFIX-SHORT" holding bridge "br0", up.
netns_bridge() {
  netns_add "$1" || return 1
  local ns
  ns=$(netns_name "$1")
  netns__run ip -n "$ns" link add br0 type bridge || return 1
  netns__run ip -n "$ns" link set br0 up
}

# netns_attach SWITCH HOST ADDR/LEN: a veth from namespace HOST (addressed ADDR/LEN) to the bridge of SWITCH.
# The host side's name is in NETNS_IF_A, the switch side's in NETNS_IF_B.
netns_attach() {
  local sw host
  sw=$(netns_name "$1")
  host=$(netns_name "$2")
  NETNS_LINKS=$((NETNS_LINKS + 1))
  NETNS_IF_A="veth${NETNS_LINKS}h"
  NETNS_IF_B="veth${NETNS_LINKS}s"
  netns__run ip link add "$NETNS_IF_A" netns "$host" type veth peer name "$NETNS_IF_B" netns "$sw" || return 1
  netns__run ip -n "$host" addr add "$3" dev "$NETNS_IF_A" || return 1
  netns__run ip -n "$sw" link set "$NETNS_IF_B" master br0 || return 1
  netns__run ip -n "$sw" link set "$NETNS_IF_B" up || return 1
  netns__run ip -n "$host" link set "$NETNS_IF_A" up
}

# netns_exec SHORT CMD...: CMD inside namespace SHORT, in the foreground.
netns_exec() {
  local ns
  ns=$(netns_name "$1")
  shift
  ip netns exec "$ns" "$@"
}

# netns_spawn SHORT CMD...: CMD inside namespace SHORT in the background (redirect as usual: the
# redirections apply to this function call); its pid in NETNS_LAST_PID, stopped by netns_cleanup.
netns_spawn() {
  local ns
  ns=$(netns_name "$1")
  shift
  ip netns exec "$ns" "$@" &
  NETNS_LAST_PID=$!
  NETNS_PIDS+=("$NETNS_LAST_PID")
}

# netns_wait_line FILE PREFIX [SECONDS]: until FILE has a line starting with PREFIX (default 20 s); 1 on timeout.
netns_wait_line() {
  local deadline=$((SECONDS + ${3:-20}))
  while [ "$SECONDS" -le "$deadline" ]; do
    grep -q "^$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "netns_lib: no line starting with '$2' in $1 within ${3:-20} s" >&2
  return 1
}

# netns__alive PID...: the pids that still run.
netns__alive() {
  local p
  for p in "$@"; do
    if kill -0 "$p" 2>/dev/null; then echo "$p"; fi
  done
  return 0
}

# netns_cleanup: stop the spawned processes and everything else inside the namespaces, delete the namespaces.
netns_cleanup() {
  local -  # the caller's `set -e` must not stop the cleanup half way: options are restored on return
  set +e
  local p ns left deadline
  local pids=("${NETNS_PIDS[@]}")
  for ns in "${NETNS_LIST[@]}"; do
    # shellcheck disable=SC2207
    pids+=($(ip netns pids "$ns" 2>/dev/null))
  done
  if [ "${#pids[@]}" -gt 0 ]; then
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    deadline=$((SECONDS + NETNS_GRACE_S))
    while :; do
      left=$(netns__alive "${pids[@]}")
      [ -z "$left" ] && break
      if [ "$SECONDS" -ge "$deadline" ]; then
        for p in $left; do kill -KILL "$p" 2>/dev/null; done
        break
      fi
      sleep 0.05
    done
    for p in "${NETNS_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  fi
  for ns in "${NETNS_LIST[@]}"; do ip netns del "$ns" 2>/dev/null; done
  NETNS_PIDS=()
  NETNS_LIST=()
}

# netns_shape SHORT IF MBIT: limits what leaves interface IF of namespace SHORT to MBIT Mbit/s with a token bucket
# (tc tbf; this kernel has tbf and htb but no netem, so no added delay). The bucket holds 2 ms at the rate and at
# least 256 KiB, enough for the 64 KiB GSO packets veth sends. MBIT 0: the interface is left unshaped.
netns_shape() {
  local ns burst
  ns=$(netns_name "$1")
  [ "$3" = 0 ] && return 0
  burst=$(($3 * 1000000 / 8 / 500))
  [ "$burst" -lt 262144 ] && burst=262144
  netns__run tc -n "$ns" qdisc replace dev "$2" root tbf rate "$3mbit" burst "$burst" latency 100ms
}
