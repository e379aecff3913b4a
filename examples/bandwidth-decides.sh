#!/usr/bin/env bash
# bandwidth-decides.sh: fetch or recompute, decided live by measured bandwidth (docs/DESIGN.md §16 "Bandwidth
# decides, live"; issue 20 item 3).
#
# Starts the cluster a description names as network namespaces (examples/cluster.sh --mode netns; default
# examples/clusters/bandwidth.json: prefill on h0 and h1, the KV pool on h2, decode on h3, 6250 Mbit/s NICs), and
# replays a synthetic trace in which every request shares a long prefix (PREFIX blocks) and adds one block of its
# own, one request every 1/RATE s, for three phases of PHASE seconds each:
#   before  the links as described: the Conductor measures the pool host's path to each prefill host, and fetches;
#   slow    the victim host's NIC (default: the host of storage node node0) shaped down to SLOW Mbit/s both ways:
#           the first fetches over it are measured slow, and the Conductor recomputes instead (or reads a nearer
#           replica when there is one); every ~10 s a path's estimate decays back far enough to try one fetch,
#           which measures the link again;
#   after   the link restored: the next fetch that tries it measures it fast, and fetching comes back.
# The table counts, per phase (by each request's arrival): the requests whose prefix the pool held (cached), the
# Conductor's decisions for them (plan_fetch: reuse the prefix; plan_recompute: recompute although it was cached),
# planned fetches that read less than planned (fetch_short: a read that failed or timed out, then recomputed), the
# prefix tokens reused, and TTFT mean/p90 (ms); below it, the Conductor's decision counters and its path estimates
# from the victim at the end of each phase (mc-conductor stat). Needs root (namespaces), jq, tc.
#
# Options (environment variable in brackets):
#   --cluster FILE   the cluster description                         [MC_CLUSTER, examples/clusters/bandwidth.json]
#   --victim HOST    the host whose NIC is slowed                    [MC_VICTIM, the host of node0]
#   --phase-s S      seconds per phase                               [MC_PHASE_S, 30]
#   --slow-mbit M    the victim's NIC rate in the slow phase          [MC_SLOW_MBIT, 20]
#   --rate R         requests per second                             [MC_RATE, 1]
#   --prefix N       shared prefix blocks per request (512 tokens)   [MC_PREFIX_BLOCKS, 16]
#   --out DIR        keep the trace, records, stats and logs here    [MC_OUT, a temporary directory]
#   --bin DIR        where the mc binaries are                       [MC_BIN, build/bin]
#   --json           one JSON object per phase instead of the table
#   -h, --help       this text
# Exit status: 0 when the run completed every accepted request (lost = 0), 1 otherwise, 2 for bad usage.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

# ---- inner mode: run by cluster.sh as its CMD (MC_CLUSTER_STATE and MC_CONDUCTOR are set) ----
if [[ "${1:-}" == --inner ]]; then
  out="$2" bin="$3" victim="$4" phase_s="$5" slow_mbit="$6"
  state="$MC_CLUSTER_STATE"
  host_field() { awk -v h="$1" -v f="$2" '$1 == h {print $f}' "$state/hosts.txt"; }
  [[ -n "$victim" ]] || victim="$(awk '$1 == "node0" {print $4}' "$state/cluster.txt")"
  [[ -n "$(host_field "$victim" 1)" ]] || { echo "bandwidth-decides.sh: no host '$victim' in the cluster" >&2; exit 2; }
  ns="$(host_field "$victim" 4)" dev="$(host_field "$victim" 5)" port="$(host_field "$victim" 6)"
  rack="$(host_field "$victim" 3)" nic="$(host_field "$victim" 7)"
  ((nic > 0)) || nic=10000
  # shellcheck source=lib/netns.sh
  . "$here/lib/netns.sh"
  NETNS_PREFIX="${ns%-host-*}"  # cluster.sh's names: PREFIX-host-HOST, PREFIX-switch-RACK
  # shape RATE_MBIT: both directions of the victim's NIC (its veth, and the switch port facing it), with the
  # launcher's own bucket rule (netns_shape), so that the restored link is the one the launcher made.
  shape() {
    netns_shape "host-$victim" "$dev" "$1"
    netns_shape "switch-$rack" "$port" "$1"
  }
  stat() { "$bin/mc-conductor" stat --endpoint "$MC_CONDUCTOR" --json --timeout-ms 5000 > "$out/$1.conductor.json" || true; }
  echo "$victim" > "$out/victim"
  "$bin/mc-trace-replay" "$out/trace.jsonl" --speed 1 --time-scale 1 --block-tokens 512 --drain-timeout-s 120 \
    --no-progress --out "$out/records.jsonl" > "$out/summary.txt" 2> "$out/replay.err" &
  replay=$!
  date +%s%3N > "$out/start_ms"
  echo "bandwidth-decides.sh: phase before: the links as described (${phase_s} s)" >&2
  sleep "$phase_s"  # not a synchronisation: the phases are meant to change at these moments of the replay
  stat before
  shape "$slow_mbit"
  echo "bandwidth-decides.sh: phase slow: ${victim}'s NIC at ${slow_mbit} Mbit/s (${phase_s} s)" >&2
  sleep "$phase_s"
  stat slow
  shape "$nic"
  echo "bandwidth-decides.sh: phase after: ${victim}'s NIC back at ${nic} Mbit/s; waiting for the replay" >&2
  set +e
  wait "$replay"
  rc=$?
  set -e
  stat after
  echo "$rc" > "$out/replay.rc"
  exit 0
fi

cluster_file="${MC_CLUSTER:-$root/examples/clusters/bandwidth.json}"
victim="${MC_VICTIM:-}"
phase_s="${MC_PHASE_S:-30}"
slow_mbit="${MC_SLOW_MBIT:-20}"
rate="${MC_RATE:-1}"
prefix="${MC_PREFIX_BLOCKS:-16}"
out="${MC_OUT:-}"
bin="${MC_BIN:-$root/build/bin}"
json=0
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "bandwidth-decides.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cluster) need "$@"; cluster_file="$2"; shift 2 ;;
    --victim) need "$@"; victim="$2"; shift 2 ;;
    --phase-s) need "$@"; phase_s="$2"; shift 2 ;;
    --slow-mbit) need "$@"; slow_mbit="$2"; shift 2 ;;
    --rate) need "$@"; rate="$2"; shift 2 ;;
    --prefix) need "$@"; prefix="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --bin) need "$@"; bin="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bandwidth-decides.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$phase_s" "$slow_mbit" "$prefix"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "bandwidth-decides.sh: '$v' is not a positive whole number" >&2; exit 2; }
done
[[ "$rate" =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v r="$rate" 'BEGIN {exit !(r > 0 && r <= 100)}' ||
  { echo "bandwidth-decides.sh: --rate '$rate' must be a number of requests per second in (0, 100]" >&2; exit 2; }
[[ -r "$cluster_file" ]] || { echo "bandwidth-decides.sh: cannot read the cluster description '$cluster_file'" >&2; exit 2; }
command -v jq > /dev/null || { echo "bandwidth-decides.sh: needs jq (tools/install-deps.sh installs it)" >&2; exit 1; }
[[ -x "$bin/mc-trace-replay" ]] || { echo "bandwidth-decides.sh: $bin/mc-trace-replay not found: build first or pass --bin" >&2; exit 1; }
# shellcheck source=lib/netns.sh
. "$here/lib/netns.sh"
netns_require || { echo "bandwidth-decides.sh: the hosts are network namespaces: $NETNS_SKIP_REASON" >&2; exit 1; }

tmp_out=""
cleanup() { if [[ -n "$tmp_out" ]]; then rm -rf "$tmp_out"; fi; }
trap cleanup EXIT
if [[ -z "$out" ]]; then tmp_out="$(mktemp -d "${TMPDIR:-/tmp}/mc-bandwidth.XXXXXX")"; out="$tmp_out"; fi
mkdir -p "$out"

# The trace: request i at i/RATE s, hash ids 0..PREFIX-1 shared, then one of its own; 20 output tokens.
awk -v n="$(awk -v p="$phase_s" -v r="$rate" 'BEGIN {print int(3 * p * r)}')" -v r="$rate" -v p="$prefix" 'BEGIN {
  for (i = 0; i < n; i++) {
    ids = ""
    for (b = 0; b < p; b++) ids = ids b ", "
    printf "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": 20, \"hash_ids\": [%s%d]}\n",
           int(i * 1000 / r), (p + 1) * 512, ids, p + i
  }
}' > "$out/trace.jsonl"

echo "bandwidth-decides.sh: $(wc -l < "$out/trace.jsonl") requests over $((3 * phase_s)) s on $(basename "$cluster_file")" >&2
"$here/cluster.sh" "$cluster_file" --mode netns --bin "$bin" --keep-logs "$out/logs" -- \
  "${BASH_SOURCE[0]}" --inner "$out" "$bin" "$victim" "$phase_s" "$slow_mbit"

victim="$(cat "$out/victim")"
# Per phase, from the records (arrival = trace timestamp: the replay runs at speed 1).
jq -s -c --argjson p "$((phase_s * 1000))" --arg victim "$victim" '
  def phase: if .trace_timestamp_ms < $p then "before" elif .trace_timestamp_ms < 2 * $p then "slow" else "after" end;
  def pct(q): sort as $s | if ($s | length) == 0 then null else $s[((($s | length) - 1) * q | floor)] end;
  group_by(phase) | map({
    phase: (.[0] | phase),
    requests: length,
    completed: map(select(.outcome == "completed")) | length,
    rejected: map(select(.outcome == "rejected")) | length,
    lost: map(select(.outcome == "failed" and ((.reason // "") | startswith("no completion within the drain timeout"))))
          | length,
    cached: map(select((.ledger.pool_prefix_tokens // 0) > 0)) | length,
    plan_fetch: map(select((.ledger.planned_hit_tokens // 0) > 0)) | length,
    plan_recompute: map(select((.ledger.pool_prefix_tokens // 0) > 0 and (.ledger.planned_hit_tokens // 0) == 0))
                    | length,
    fetch_short: map(select((.ledger.planned_hit_tokens // 0) > ((.ledger.hit_tokens_local // 0) +
                     (.ledger.hit_tokens_remote // 0) + (.ledger.hit_tokens_ssd // 0)))) | length,
    reused_tokens: (map((.ledger.hit_tokens_local // 0) + (.ledger.hit_tokens_remote // 0) +
                        (.ledger.hit_tokens_ssd // 0)) | add),
    ttft_mean_ms: (map(.ttft_ms // empty) | if length > 0 then add / length else null end),
    ttft_p90_ms: (map(.ttft_ms // empty) | pct(0.9))
  }) | sort_by({"before": 0, "slow": 1, "after": 2}[.phase]) | .[]' "$out/records.jsonl" > "$out/phases.jsonl"

paths() {  # the Conductor's path estimates into the victim's prefill hosts at the end of phase $1
  jq -r --arg v "$victim" '.predictors.bandwidth_paths // [] | map(select(.from == $v)) |
    map("\(.from)->\(.to) \(.bytes_per_s / 1e9 * 100 | round / 100) GB/s (\(.samples) samples)") | join(", ")' \
    "$out/$1.conductor.json" 2>/dev/null || echo "-"
}
if ((json)); then
  while read -r row; do
    ph="$(jq -r .phase <<< "$row")"
    jq -c --argjson s "$(jq -c '.decisions' "$out/$ph.conductor.json" 2>/dev/null || echo null)" \
      --argjson b "$(jq -c '.predictors.bandwidth_paths' "$out/$ph.conductor.json" 2>/dev/null || echo null)" \
      --arg victim "$victim" --argjson slow "$slow_mbit" '. + {victim: $victim, slow_mbit: $slow, conductor_decisions: $s, bandwidth_paths: $b}' <<< "$row"
  done < "$out/phases.jsonl"
else
  fmt='%-7s %8s %9s %8s %4s %7s %10s %14s %11s %13s %13s %12s\n'
  # shellcheck disable=SC2059  # the format is this script's own
  printf "$fmt" phase requests completed rejected lost cached plan_fetch plan_recompute fetch_short reused_tokens \
    ttft_mean_ms ttft_p90_ms
  jq -r '[.phase, .requests, .completed, .rejected, .lost, .cached, .plan_fetch, .plan_recompute, .fetch_short,
          .reused_tokens, (.ttft_mean_ms // 0 | round), (.ttft_p90_ms // 0 | round)] | @tsv' "$out/phases.jsonl" |
    while IFS=$'\t' read -r -a f; do
      # shellcheck disable=SC2059
      printf "$fmt" "${f[@]}"
    done
  echo "victim: $victim's NIC at ${slow_mbit} Mbit/s in the slow phase"
  for ph in before slow after; do
    echo "end of '$ph': conductor $(jq -r '.decisions | "fetch \(.fetch), recompute \(.recompute) (with a cached prefix \(.recompute_cached)), path samples \(.path_samples), caps \(.path_caps)"' \
      "$out/$ph.conductor.json" 2>/dev/null || echo "-"); paths $(paths "$ph")"
  done
fi
lost="$(jq -s 'map(.lost) | add // 0' "$out/phases.jsonl")"
[[ "$lost" == 0 ]]
