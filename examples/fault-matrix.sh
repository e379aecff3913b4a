#!/usr/bin/env bash
# fault-matrix.sh: inject one fault per run into a live local cluster in the middle of a replay, and tabulate
# what became of the requests (docs/RELIABILITY.md, "Fault matrix").
#
# Each run starts examples/local-cluster.sh (1 store master, 2 storage nodes, the Conductor, 2 prefill and
# 2 decode instances), replays a window of the conversation trace, injects the fault AT seconds after the
# replay started, and waits for the replay to end. One row per fault:
#   offered = accepted + rejected + submit_failed (failed before the Conductor answered: not accepted),
#   accepted = completed + failed + lost (accepted, no terminal event before the replay's drain timeout), terminal_s (wall seconds from the fault until the last request that was in flight on the victim
#   had its terminal event; for the store, the master and the Conductor every request in flight counts),
#   ttft_mean_ms and its cost against the run without a fault, ttft_b/d/a_ms (the TTFT means of the completed requests
#   sent before the fault, during its --stop-s window and after it), the replay's exit status, and the Conductor's
#   counters at the end (mc-conductor stat; "-" when it was killed): redisp (requests re-dispatched after an
#   instance died), killed (failed by an instance's death), planned_miss_tk (planned prefix hits the prefill found
#   missing); for a worker victim, detect_ms (fault to the Conductor removing it) and settled_ms (fault to the last
#   request event naming it: each of its requests failed or re-dispatched), from the Conductor's log; --json adds
#   reservations_released, publisher_restarts and stale_replicas (index reconciliation).
# With --check-tokens (use it with --backend ref) a cache-off run is made first and every completed request's
# output tokens must equal its tokens there (column tokens_equal, with how many requests completed in both runs).
#
# Faults (--faults, comma-separated; default: all):
#   none                       no fault (the baseline)
#   prefill-kill prefill-stop  SIGKILL / SIGSTOP for --stop-s then SIGCONT, of prefill0
#   decode-kill  decode-stop   the same for decode0
#   node-kill    node-stop     the same for storage node node0
#   master-kill  master-stop   the same for the store master
#   master-restart             SIGKILL the store master, restart it at once on the same ports
#   conductor-kill conductor-stop  the same for the Conductor
#   ssd-full                   the storage nodes' SSD tier on a small tmpfs (needs root to mount it), filled up
#   ssd-removed                the SSD tier's directory removed while serving
# Network faults, only with --cluster (hosts are network namespaces; each lasts --stop-s, then heals):
# The victim is the first prefill instance on a host without the master and the Conductor (so that the fault cuts
# only what it names), its decode peer the first decode instance on yet another host:
#   isolate-master             the victim's host cut from the store master's host (nft drops both ways), not from
#                              its peers
#   cut-prefill-decode         the victim's host cut from its decode peer's host
#   cut-prefill-storage        the victim's host cut from a storage node's host that runs no master, Conductor or
#                              decode instance (the master still hears the node: only the prefill's store client can
#                              tell, and passes its replicas over for its unreachable cooldown, 10 s)
#   uplink-cut                 the uplink of a rack without the Conductor (the rack of its first decode instance)
#                              down: the racks are cut apart (needs two racks)
#   loss5                      5 % of the packets dropped each way at the victim's host (nft numgen)
#   link-slow                  the victim's host NIC shaped to a tenth of its rate
#   delay50                    50 ms added at the victim's host: skipped with the reason (this kernel has no netem)
#
# Options (environment variable in brackets):
#   --faults LIST     which faults, comma-separated                         [MC_FAULTS, all (with --cluster also
#                                                                            the network faults)]
#   --duration-s S    trace window, seconds of trace time                   [MC_DURATION_S, 60]
#   --speed X         time compression of the cluster and the replay        [MC_SPEED, 4]
#   --at-s S          wall seconds after the replay starts to inject        [MC_FAULT_AT_S, 4]
#   --stop-s S        how long a SIGSTOP lasts                              [MC_STOP_S, 10]
#   --backend B       sim or ref                                            [MC_BACKEND, sim]
#   --drain-timeout-s S  the replay's wait for the last terminal events     [MC_DRAIN_TIMEOUT_S, 60]
#   --max-output-tokens N  cap each request's output (the ref backend computes every token on the CPU)
#                                                                           [MC_MAX_OUTPUT_TOKENS, the trace's]
#   --max-input-tokens N   cut each prompt to its first N tokens            [MC_MAX_INPUT_TOKENS, the trace's]
#   --check-tokens    compare completed requests' tokens with a cache-off run
#   --cluster FILE    run every fault on the cluster this description names (examples/cluster.sh --mode netns:
#                     each host a network namespace; needs root) instead of local-cluster.sh on loopback; its
#                     instances prefill0, decode0 and node0 are the victims, on whatever hosts it puts them
#                                                                           [MC_FAULT_CLUSTER, none]
#   --out DIR         keep each run's records, fault time and logs here     [MC_OUT, a temporary directory]
#   --bin DIR         where the mc binaries are                             [MC_BIN, build/bin]
#   --json            one JSON object per row instead of the table
#   -h, --help        this text
# Exit status: 0 when every row has lost = 0 (and, with --check-tokens, equal tokens), 1 otherwise, 2 for bad
# usage. Loopback, or namespaces with --cluster; every process, namespace, mount and file it makes is removed on exit.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
all_faults="none,prefill-kill,prefill-stop,decode-kill,decode-stop,node-kill,node-stop,master-kill,master-stop"
all_faults+=",master-restart,conductor-kill,conductor-stop,ssd-full,ssd-removed"
net_faults="isolate-master,cut-prefill-decode,cut-prefill-storage,uplink-cut,loss5,link-slow,delay50"

# ---- inner mode: run by local-cluster.sh as its CMD (MC_CLUSTER_STATE and MC_CONDUCTOR are set) ----
if [[ "${1:-}" == --inner ]]; then
  fault="$2" out="$3" trace="$4" duration_s="$5" speed="$6" at_s="$7" stop_s="$8" drain_s="$9" bin="${10}"
  ssd_dir="${11}" max_output="${12}" max_input="${13}"
  output_flags=()
  [[ -n "$max_output" ]] && output_flags=(--max-output-tokens "$max_output")
  [[ -n "$max_input" ]] && output_flags+=(--max-input-tokens "$max_input")
  state="$MC_CLUSTER_STATE"
  pid_of() { awk -v n="$1" '$1 == n {print $2}' "$state/cluster.txt"; }
  # With --cluster: the host of a daemon, and a host's address, namespace, interface and NIC rate (hosts.txt; on
  # loopback there is none and each field is empty).
  host_of() { awk -v n="$1" '$1 == n {print $4}' "$state/cluster.txt"; }
  host_field() { [[ -f "$state/hosts.txt" ]] || return 0; awk -v h="$1" -v f="$2" '$1 == h {print $f}' "$state/hosts.txt"; }
  ns_of_daemon() { host_field "$(host_of "$1")" 4; }
  # cut NS ADDR [PERCENT]: inside namespace NS drop the packets to and from ADDR (all of them, or PERCENT % at
  # random; ADDR "any": every packet); heal NS undoes it.
  cut() {
    local match="ip daddr $2" back="ip saddr $2" rule="drop"
    [[ "$2" == any ]] && match="meta nfproto ipv4" && back="meta nfproto ipv4"
    [[ -n "${3:-}" ]] && rule="numgen random mod 100 < $3 drop"
    ip netns exec "$1" nft -f - <<NFT
table inet mcfault {
  chain out { type filter hook output priority 0; $match $rule; }
  chain in { type filter hook input priority 0; $back $rule; }
}
NFT
  }
  heal() { ip netns exec "$1" nft delete table inet mcfault; }
  # pick KIND HOST...: the first instance of KIND (prefill, decode) whose host is none of HOST... (else the first).
  pick() {
    local kind="$1"
    shift
    awk -v k="^${kind}[0-9]+$" -v avoid=" $* " '$1 ~ k && index(avoid, " " $4 " ") == 0 {print $1; exit}' \
      "$state/cluster.txt" | grep . || awk -v k="^${kind}[0-9]+$" '$1 ~ k {print $1; exit}' "$state/cluster.txt"
  }
  now_ms() { date +%s%3N; }
  restarted=""
  cleanup() { if [[ -n "$restarted" ]]; then kill -TERM "$restarted" 2>/dev/null || true; wait "$restarted" 2>/dev/null || true; fi; }
  trap cleanup EXIT
  now_ms > "$out/$fault.start_ms"
  "$bin/mc-trace-replay" "$trace" --duration-s "$duration_s" --speed "$speed" --time-scale "$speed" \
    --block-tokens 512 --drain-timeout-s "$drain_s" --no-progress --record-token-ids ${output_flags[@]+"${output_flags[@]}"} \
    --out "$out/$fault.jsonl" > "$out/$fault.summary" 2> "$out/$fault.replay.err" &
  replay=$!
  sleep "$at_s"  # not a synchronisation: the fault is meant to land at this moment of the replay
  victim=""
  case "$fault" in
    prefill-*) victim=prefill0 ;;
    decode-*) victim=decode0 ;;
    node-*) victim=node0 ;;
    master-*) victim=master ;;
    conductor-*) victim=conductor ;;
    # A prefill host apart from the master and the Conductor, so that the fault cuts only what it names.
    isolate-master | loss5 | link-slow) victim="$(pick prefill "$(host_of master)" "$(host_of conductor)")" ;;
    cut-prefill-decode)
      victim="$(pick prefill "$(host_of master)" "$(host_of conductor)")"
      peer="$(pick decode "$(host_of "$victim")" "$(host_of conductor)")"
      ;;
    cut-prefill-storage)
      victim="$(pick prefill "$(host_of master)" "$(host_of conductor)")"
      # shellcheck disable=SC2046  # the hosts to avoid, one word each
      peer="$(awk -v avoid=" $(host_of "$victim") $(host_of master) $(host_of conductor) $(awk '$1 ~ /^decode[0-9]+$/ {printf "%s ", $4}' "$state/cluster.txt")" \
        '$1 ~ /^node[0-9]+$/ && index(avoid, " " $4 " ") == 0 {print $1; exit}' "$state/cluster.txt")"
      ;;
    # A decode instance in a rack without the Conductor: its rack's uplink goes down.
    uplink-cut)
      # shellcheck disable=SC2046  # the hosts of the Conductor's rack, one word each
      victim="$(pick decode $(awk -v r="$(host_field "$(host_of conductor)" 3)" '$3 == r {print $1}' "$state/hosts.txt"))"
      ;;
  esac
  now_ms > "$out/$fault.fault_ms"
  echo "$victim" > "$out/$fault.victim"
  case "$fault" in
    none | cache-off) ;;
    *-kill) kill -KILL "$(pid_of "$victim")" ;;
    *-stop) kill -STOP "$(pid_of "$victim")"; sleep "$stop_s"; kill -CONT "$(pid_of "$victim")" ;;
    master-restart)
      pid="$(pid_of master)"
      mapfile -d '' argv < "/proc/$pid/cmdline"
      listen="$(awk '{print $3}' "$state/master.ready")"
      events="$(tr ' ' '\n' < "$state/master.ready" | sed -n 's/^events=//p')"
      kill -KILL "$pid"
      while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
      new=()
      for ((i = 0; i < ${#argv[@]}; i++)); do
        case "${argv[$i]}" in
          --listen) new+=(--listen "$listen"); i=$((i + 1)) ;;
          --events) new+=(--events "$events"); i=$((i + 1)) ;;
          *) new+=("${argv[$i]}") ;;
        esac
      done
      mns="$(ns_of_daemon master)"
      [[ -n "$mns" ]] && new=(ip netns exec "$mns" "${new[@]}")
      "${new[@]}" >> "$state/master-restarted.log" 2>&1 &
      restarted=$!
      ;;
    ssd-full)
      # Fill the tmpfs under the SSD tier files: their next writes get ENOSPC.
      dd if=/dev/zero of="$ssd_dir/filler" bs=1M 2>/dev/null || true
      ;;
    ssd-removed) rm -rf "$ssd_dir" ;;
    isolate-master) ns="$(ns_of_daemon "$victim")"; cut "$ns" "$(host_field "$(host_of master)" 2)"; sleep "$stop_s"; heal "$ns" ;;
    cut-prefill-decode | cut-prefill-storage)
      echo "$peer" > "$out/$fault.peer"
      ns="$(ns_of_daemon "$victim")"; cut "$ns" "$(host_field "$(host_of "$peer")" 2)"; sleep "$stop_s"; heal "$ns" ;;
    loss5) ns="$(ns_of_daemon "$victim")"; cut "$ns" any 5; sleep "$stop_s"; heal "$ns" ;;
    link-slow)
      h="$(host_of "$victim")"
      nic="$(host_field "$h" 7)"
      ((nic > 0)) || nic=10000
      # shellcheck source=lib/netns.sh
      . "$here/lib/netns.sh"
      NETNS_PREFIX="$(host_field "$h" 4)"
      NETNS_PREFIX="${NETNS_PREFIX%-host-*}"  # cluster.sh's names: PREFIX-host-HOST
      netns_shape "host-$h" "$(host_field "$h" 5)" "$((nic / 10))"  # the launcher's bucket rule
      sleep "$stop_s"
      netns_shape "host-$h" "$(host_field "$h" 5)" "$nic"
      ;;
    uplink-cut)
      rack="$(host_field "$(host_of "$victim")" 3)"
      read -r _ rns rif _ < <(awk -v r="$rack" '$1 == r' "$state/racks.txt")
      ip -n "$rns" link set "$rif" down
      sleep "$stop_s"
      ip -n "$rns" link set "$rif" up
      ;;
    *) echo "fault-matrix.sh: unknown fault '$fault'" >&2; exit 2 ;;
  esac
  set +e
  wait "$replay"
  rc=$?
  # The Conductor's fault and index counters at the end (none when it was the victim of a kill).
  "$bin/mc-conductor" stat --endpoint "$MC_CONDUCTOR" --json --timeout-ms 5000 > "$out/$fault.conductor.json" 2>/dev/null
  set -e
  cp "$state/conductor.log" "$out/$fault.conductor.log" 2>/dev/null || true
  echo "$rc" > "$out/$fault.rc"
  exit 0
fi

faults="${MC_FAULTS:-}"
duration_s="${MC_DURATION_S:-60}"
speed="${MC_SPEED:-4}"
at_s="${MC_FAULT_AT_S:-4}"
stop_s="${MC_STOP_S:-10}"
backend="${MC_BACKEND:-sim}"
drain_s="${MC_DRAIN_TIMEOUT_S:-60}"
max_output="${MC_MAX_OUTPUT_TOKENS:-}"
max_input="${MC_MAX_INPUT_TOKENS:-}"
out="${MC_OUT:-}"
cluster_file="${MC_FAULT_CLUSTER:-}"
bin="${MC_BIN:-$root/build/bin}"
check_tokens=0
json=0
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "fault-matrix.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --faults) need "$@"; faults="$2"; shift 2 ;;
    --duration-s) need "$@"; duration_s="$2"; shift 2 ;;
    --speed) need "$@"; speed="$2"; shift 2 ;;
    --at-s) need "$@"; at_s="$2"; shift 2 ;;
    --stop-s) need "$@"; stop_s="$2"; shift 2 ;;
    --backend) need "$@"; backend="$2"; shift 2 ;;
    --drain-timeout-s) need "$@"; drain_s="$2"; shift 2 ;;
    --max-output-tokens) need "$@"; max_output="$2"; shift 2 ;;
    --max-input-tokens) need "$@"; max_input="$2"; shift 2 ;;
    --check-tokens) check_tokens=1; shift ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --cluster) need "$@"; cluster_file="$2"; shift 2 ;;
    --bin) need "$@"; bin="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fault-matrix.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -z "$max_output" || "$max_output" =~ ^[1-9][0-9]*$ ]] || {
  echo "fault-matrix.sh: --max-output-tokens '$max_output' is not a positive count" >&2; exit 2; }
[[ -z "$max_input" || "$max_input" =~ ^[1-9][0-9]*$ ]] || {
  echo "fault-matrix.sh: --max-input-tokens '$max_input' is not a positive count" >&2; exit 2; }
for v in "$duration_s" "$speed" "$at_s" "$stop_s" "$drain_s"; do
  [[ "$v" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "fault-matrix.sh: '$v' is not a number of seconds" >&2; exit 2; }
done
if [[ -z "$faults" ]]; then faults="$all_faults${cluster_file:+,$net_faults}"; fi
IFS=',' read -r -a fault_list <<< "$faults"
for f in "${fault_list[@]}"; do
  if [[ ",$net_faults," == *",$f,"* ]]; then
    [[ -n "$cluster_file" ]] || { echo "fault-matrix.sh: fault '$f' needs --cluster FILE (hosts as namespaces)" >&2; exit 2; }
    continue
  fi
  [[ ",$all_faults," == *",$f,"* ]] ||
    { echo "fault-matrix.sh: unknown fault '$f' (known: $all_faults; with --cluster also $net_faults)" >&2; exit 2; }
done
if [[ -n "$cluster_file" ]]; then
  [[ -r "$cluster_file" ]] || { echo "fault-matrix.sh: cannot read the cluster description '$cluster_file'" >&2; exit 2; }
  # shellcheck source=lib/netns.sh
  . "$here/lib/netns.sh"
  netns_require || { echo "fault-matrix.sh: --cluster runs hosts as namespaces: $NETNS_SKIP_REASON" >&2; exit 1; }
fi
[[ "$backend" == sim || "$backend" == ref ]] || { echo "fault-matrix.sh: --backend must be sim or ref" >&2; exit 2; }
command -v jq > /dev/null || { echo "fault-matrix.sh: needs jq (tools/install-deps.sh installs it)" >&2; exit 1; }
[[ -x "$bin/mc-trace-replay" ]] || { echo "fault-matrix.sh: $bin/mc-trace-replay not found: build first or pass --bin" >&2; exit 1; }

tmp_out=""
mnt=""
cleanup() {
  if [[ -n "$mnt" ]]; then umount "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true; fi
  if [[ -n "$tmp_out" ]]; then rm -rf "$tmp_out"; fi
}
trap cleanup EXIT
if [[ -z "$out" ]]; then tmp_out="$(mktemp -d "${TMPDIR:-/tmp}/mc-fault-matrix.XXXXXX")"; out="$tmp_out"; fi
mkdir -p "$out"
trace="$root/examples/traces/conversation_trace.jsonl"

# run FAULT [extra local-cluster flags...]: one cluster, one replay, one fault.
run() {
  local fault="$1"; shift
  local ssd_dir=""
  local flags=(--bin "$bin" --backend "$backend" --time-scale "$speed" --block-size 512 --store-nodes 2
               --prefill 2 --decode 2 --keep-logs "$out/$fault.logs")
  [[ "$backend" == sim ]] && flags+=(--model llama3-70b --gpu a800x8)
  local launcher=("$here/local-cluster.sh")
  if [[ -n "$cluster_file" ]]; then
    launcher=("$here/cluster.sh" "$cluster_file" --mode netns)
    flags=(--bin "$bin" --set "backend=$backend" --set "time_scale=$speed" --set block_size=512
           --keep-logs "$out/$fault.logs")
    [[ "$backend" == sim ]] && flags+=(--set model=llama3-70b --set gpu=a800x8)
    [[ "$backend" == ref ]] && flags+=(--set model=tiny)
    [[ "$fault" == cache-off ]] && flags+=(--set prefix_cache=none)
    local why=""
    case "$fault" in
      ssd-full | ssd-removed) why="the SSD faults run on loopback only (no --cluster)" ;;
      delay50) why="this kernel has no netem: a 50 ms delay cannot be emulated (tbf shapes rate only)" ;;
      uplink-cut) [[ "$(jq '.racks | length' "$cluster_file")" -ge 2 ]] || why="the cluster has one rack: no uplink to cut" ;;
      cut-prefill-storage)
        jq -e '[.hosts[] | select((.daemons.prefill // 0) > 0 and (.daemons.master // 0) == 0 and
                 (.daemons.conductor // 0) == 0)][0].name as $v |
               [.hosts[] | select(.name != $v and (.daemons.store // 0) > 0 and (.daemons.master // 0) == 0 and
                 (.daemons.conductor // 0) == 0 and (.daemons.decode // 0) == 0)] | length > 0' "$cluster_file" \
          > /dev/null || why="no storage node on a host without the master, the Conductor or a decode instance" ;;
    esac
    if [[ -n "$why" ]]; then echo "skip" > "$out/$fault.rc"; echo "$why" > "$out/$fault.skip"; return; fi
  fi
  case "$fault" in
    ssd-full)
      if [[ $(id -u) -ne 0 ]]; then echo "skip" > "$out/$fault.rc"; echo "not root: cannot mount a small tmpfs" > "$out/$fault.skip"; return; fi
      mnt="$(mktemp -d "${TMPDIR:-/tmp}/mc-fault-ssd.XXXXXX")"
      mount -t tmpfs -o size=64m mc-fault-ssd "$mnt"
      ssd_dir="$mnt"
      flags+=(--dram-bytes 32MiB --ssd-bytes 24MiB --ssd-dir "$ssd_dir")
      ;;
    ssd-removed)
      ssd_dir="$out/$fault.ssd"
      flags+=(--dram-bytes 32MiB --ssd-bytes 256MiB --ssd-dir "$ssd_dir")
      ;;
  esac
  [[ -n "$cluster_file" ]] || flags+=("$@")  # local-cluster.sh's own flags (the cache-off run's)
  local rc=0
  "${launcher[@]}" "${flags[@]}" -- "$here/fault-matrix.sh" --inner "$fault" "$out" "$trace" "$duration_s" \
    "$speed" "$at_s" "$stop_s" "$drain_s" "$bin" "$ssd_dir" "$max_output" "$max_input" > /dev/null 2> "$out/$fault.cluster.err" || rc=$?
  if ((rc != 0)); then echo "fault-matrix.sh: $fault: ${launcher[0]##*/} exited $rc (see $out/$fault.cluster.err)" >&2; fi
  if [[ -n "$mnt" ]]; then umount "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true; mnt=""; fi
  rm -rf "$out/$fault.ssd"
}

if ((check_tokens)); then
  echo "fault-matrix.sh: the cache-off run (tokens to compare with)" >&2
  run cache-off --prefix-cache none
fi

fail=0
((json)) || printf '%-15s %7s %8s %8s %9s %6s %13s %4s %10s %12s %12s %20s %6s %6s %6s %14s %9s %10s %s\n' fault \
  offered accepted rejected completed failed submit_failed lost terminal_s ttft_mean_ms ttft_cost_ms ttft_b/d/a_ms rc \
  redisp killed planned_miss_tk detect_ms settled_ms tokens_equal
base_ttft=""
for fault in "${fault_list[@]}"; do
  echo "fault-matrix.sh: $fault" >&2
  run "$fault"
  if [[ -f "$out/$fault.skip" ]]; then
    ((json)) && jq -cn --arg f "$fault" --arg why "$(cat "$out/$fault.skip")" '{fault: $f, skipped: $why}' ||
      printf '%-15s skipped: %s\n' "$fault" "$(cat "$out/$fault.skip")"
    continue
  fi
  recs="$out/$fault.jsonl"
  if [[ ! -s "$recs" ]]; then
    echo "fault-matrix.sh: $fault: no records (see $out/$fault.cluster.err and $out/$fault.replay.err)" >&2
    fail=1
    continue
  fi
  start_ms="$(cat "$out/$fault.start_ms")"
  fault_ms="$(cat "$out/$fault.fault_ms")"
  victim="$(cat "$out/$fault.victim")"
  row="$(jq -s --arg fault "$fault" --arg victim "$victim" --argjson start "$start_ms" --argjson at "$fault_ms" \
    --argjson speed "$speed" --argjson window "$(awk -v s="$stop_s" 'BEGIN {print int(s * 1000)}')" '
    # A failed submit (the Conductor never answered) is not an accepted request; records of older runs lack
    # the field: there every record not rejected was accepted.
    def accepted: if .accepted == null then .outcome != "rejected" else .accepted end;
    def lost: accepted and .outcome == "failed" and
      ((.reason // "") | startswith("no completion within the drain timeout"));
    # In flight at the fault: sent before it, terminal after it; on the victim when the victim is a worker.
    def affected: accepted and (.submit_ms != null) and ($start + .submit_ms / $speed < $at) and
      ((.end_unix_ms // 0) >= $at) and
      (if ($victim | test("^(prefill|decode)")) then (.prefill_instance == $victim or .decode_instance == $victim)
       else true end);
    [.[] | select(.outcome == "completed") | .ttft_ms] as $ttft |
    # TTFT of the completed requests sent before the fault, during its window (--stop-s) and after it.
    def sent: $start + (.submit_ms // 0) / $speed;
    def mean_ttft(f): [.[] | select(.outcome == "completed" and (.submit_ms != null)) | select(f) | .ttft_ms]
      | if length > 0 then add / length else null end;
    {fault: $fault, offered: length, accepted: (map(select(accepted)) | length),
     rejected: (map(select(.outcome == "rejected")) | length),
     completed: (map(select(.outcome == "completed")) | length),
     failed: (map(select(.outcome == "failed" and accepted and (lost | not))) | length),
     submit_failed: (map(select(.outcome == "failed" and (accepted | not))) | length),
     lost: (map(select(lost)) | length),
     terminal_s: ((((map(select(affected) | .end_unix_ms) | max) // $at) - $at) / 1000),
     ttft_mean_ms: (if ($ttft | length) > 0 then ($ttft | add / length) else null end),
     ttft_before_ms: mean_ttft(sent < $at), ttft_during_ms: mean_ttft(sent >= $at and sent < $at + $window),
     ttft_after_ms: mean_ttft(sent >= $at + $window)}' "$recs")"
  ttft="$(jq -r '.ttft_mean_ms // "null"' <<< "$row")"
  [[ "$fault" == none ]] && base_ttft="$ttft"
  cost="null"
  if [[ -n "$base_ttft" && "$base_ttft" != null && "$ttft" != null ]]; then
    cost="$(jq -n --argjson a "$ttft" --argjson b "$base_ttft" '$a - $b')"
  fi
  equal="null"
  compared="null"
  if ((check_tokens)) && [[ -s "$out/cache-off.jsonl" ]]; then
    equal="$(jq -n -r --slurpfile off "$out/cache-off.jsonl" --slurpfile run "$recs" '
      ($off | map(select(.outcome == "completed")) | map({key: (.trace_line | tostring), value: .output_token_ids})
       | from_entries) as $ref |
      [$run[] | select(.outcome == "completed") | select($ref[.trace_line | tostring] != null)
       | (.output_token_ids == $ref[.trace_line | tostring])] | "\(all) \(length)"')"
    compared="${equal#* }"
    equal="${equal% *}"
  fi
  rc="$(cat "$out/$fault.rc" 2>/dev/null || echo "?")"
  # A worker victim: from the fault to the Conductor's removal of it (detect_ms) and to the last request event
  # naming it (settled_ms: each of its requests failed or re-dispatched), from the Conductor's log.
  timing="$(python3 - "$out/$fault.conductor.log" "$victim" "$fault_ms" <<'TIMING'
import datetime, json, re, sys
path, victim, fault_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
detect = settled = None
if re.match(r"^(prefill|decode)", victim):
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ", line)
        if not m:
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        ms = int(t.timestamp() * 1000) - fault_ms
        if ms < 0:
            continue
        if detect is None and f"instance '{victim}' " in line and "removed" in line:
            detect = ms
        if detect is not None and f"instance '{victim}'" in line and re.search(r"request '[^']*': ", line):
            settled = ms
print(json.dumps({"detect_ms": detect, "settled_ms": settled}))
TIMING
)" || timing='{}'
  conductor="$(jq -c '{redispatched: .faults.redispatched, failed_by_death: .faults.failed_by_instance_death,
                      reservations_released: .faults.reservations_released,
                      publisher_restarts: .index.publisher_restarts, stale_replicas: .index.resync_stale_replicas,
                      planned_missing_tokens: .index.planned_missing_tokens}' "$out/$fault.conductor.json" \
               2>/dev/null || echo '{}')"
  [[ -n "$conductor" ]] || conductor='{}'
  row="$(jq -c --argjson cost "$cost" --argjson eq "$equal" --argjson n "$compared" --arg rc "$rc" \
    --argjson c "$conductor" --argjson t "$timing" \
    '. + {ttft_cost_ms: $cost, tokens_equal: $eq, tokens_compared: $n, replay_rc: $rc} + $c + $t' <<< "$row")"
  [[ "$(jq -r .lost <<< "$row")" == 0 ]] || fail=1
  [[ "$equal" != false ]] || fail=1
  if ((json)); then
    echo "$row"
  else
    jq -r '[.fault, .offered, .accepted, .rejected, .completed, .failed, .submit_failed, .lost,
            (.terminal_s * 10 | round / 10),
            ((.ttft_mean_ms // 0) | round), ((.ttft_cost_ms // 0) | round),
            ([.ttft_before_ms, .ttft_during_ms, .ttft_after_ms] | map(if . == null then "-" else round end)
             | join("/")), .replay_rc, (.redispatched // "-"),
            (.failed_by_death // "-"), (.planned_missing_tokens // "-"), (.detect_ms // "-"), (.settled_ms // "-"),
            (if .tokens_equal == null then "-" else "\(.tokens_equal) (\(.tokens_compared))" end)]
           | @tsv' <<< "$row" |
      awk -F'\t' '{printf "%-15s %7s %8s %8s %9s %6s %13s %4s %10s %12s %12s %20s %6s %6s %6s %14s %9s %10s %s\n",
                   $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19}'
  fi
done
exit "$fail"
