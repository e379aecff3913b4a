#!/usr/bin/env bash
# replay-conversation.sh: the main job of mc, end to end on this machine.
#
# Builds mc if needed (cmake + ninja into build/), starts the cluster of examples/clusters/main-job.json with
# examples/cluster.sh (2 prefill and 2 decode hosts, a storage node on each host, the sim backend modelling
# LLaMA3-70B on 8xA800 servers), replays a window of the shipped conversation trace
# (examples/traces/conversation_trace.jsonl, Mooncake FAST'25) compressed in time, then replays the same window
# once more on a fresh cluster with the prefix cache off, and prints the cache-on summary (TTFT, TBT, TPOT, E2E,
# SLO attainment, goodput, the KV-cache ledger) and what the cache bought: both runs side by side (prefill
# GPU-seconds, TTFT mean/p90, goodput, rejections by reason, hit ratio) beside `mc-trace-replay analyze`'s bound
# for the window. Reported times are modelled milliseconds: the cluster runs SPEED times faster than the hardware
# it models (the sim backend's --time-scale) and the replay sends SPEED times faster than the trace.
#
# The modelled hardware (docs/DESIGN.md §16 "The modelled node"; `mc-plan node` computes it): each host is an
# 8xA800 node. Its capacities in tokens are the node's:
#   decode (and prefill) KV = floor(0.9 x (HBM - weight bytes)) / model KV bytes per token
#                           = floor(0.9 x (640 GiB - 141.1 GB)) / 327,680 B = 1,499,873 tokens per instance
#   DRAM pool               = spare DRAM per node / 327,680 B (512 GiB, SPARE: 1,677,721 tokens per storage node)
# and the bytes of a token are scaled down by SCALE (256: 1,280 B actually stored and moved per token, 16 B per
# layer, the smallest the sim backend stores), so that 4 instances and 4 storage nodes fit in this machine's
# memory (about 16 GB if full; the storage nodes commit pages as blocks are written, --no-prefault --no-shm in
# main-job.json, so what stays resident is what the window stores plus the KV in use). Each NIC is the node's 8 x 200 Gbit/s
# scaled by the same factor and sped up by SPEED (1.6 Tbit/s x SPEED / SCALE), capped at NIC_CAP Mbit/s, what
# veth + tbf carries on this 2-core machine. The header on stderr states the scale, the capacities and the mode.
#
# Where this process can make network namespaces (root, `ip netns`), every host is a namespace with its own
# address and shaped links (cluster.sh --mode netns); elsewhere all runs on loopback with the host names as
# labels, and one stderr line says which and why. Everything is stopped and cleaned up on exit or Ctrl-C.
#
# Options (environment variable in brackets):
#   --duration-s S       trace window in seconds of trace time          [MC_DURATION_S, 120]
#   --start-s S          where the window starts in the trace           [MC_START_S, 0]
#   --speed X            time compression of cluster and replay         [MC_SPEED, 4]
#   --policy NAME        random | least_loaded | cache_aware | kvcache  [MC_POLICY, kvcache]
#   --queue Q            prefill queue order: fcfs | slo (default: the policy's, slo for kvcache)  [MC_QUEUE]
#   --pending-prefix P   on | off: pending prefixes (docs/DESIGN.md §10; default: the policy's, on for kvcache)
#                                                                       [MC_PENDING_PREFIX]
#   --placement-load-weight C  kvcache's load-priced placement, 0 to 1000 (0: the paper's rule; default 1)
#                                                                       [MC_PLACEMENT_LOAD_WEIGHT]
#   --slo-headroom H     kvcache's share of the TTFT SLO kept free, 0 to 0.9 (0: the paper's rule; default 0.2)
#                                                                       [MC_SLO_HEADROOM]
#   --shed-limit F       kvcache's load shedding, x the TTFT SLO, 0 to 1000 (0: off, the paper's rule; default 5)
#                                                                       [MC_SHED_LIMIT]
#   --prefill P          prefill hosts (each with a storage node)       [MC_PREFILL, 2]
#   --decode D           decode hosts (each with a storage node)        [MC_DECODE, 2]
#   --mode M             netns or loopback (default: netns where namespaces can be made, else loopback)
#                                                                       [MC_CLUSTER_MODE]
#   --no-cache-off       skip the cache-off run (no side-by-side table)
#   --spare-dram-bytes B DRAM each node lends to the pool, modelled     [MC_SPARE_DRAM, 512GiB]
#   --scale N            modelled / live KV bytes per token             [MC_KV_SCALE, 256]
#   --nic-cap-mbit N     the most a live NIC is shaped to               [MC_NIC_CAP_MBIT, 10000]
#   --cluster FILE       the cluster description                        [MC_CLUSTER_FILE, examples/clusters/main-job.json]
#   --out FILE           also keep the per-request JSONL records of the cache-on run (the cache-off run's go to
#                        FILE with .cache-off before its extension)     [MC_OUT]
#   --html FILE          the HTML report of the run(s): TTFT/TBT CDFs with a curve per run, TTFT over time, queues,
#                        hit ratio, GPU-seconds, SLO attainment (needs gnuplot-nox; its path is printed on stderr)
#                                                                       [MC_HTML, BUILD_DIR/main-job/report.html]
#   --json               print one JSON object: the modelled node, the mode, analyze's bound and both summaries
#   --build-dir DIR      where to build / find the binaries             [MC_BUILD_DIR, build]
#   (MC_KEEP_LOGS=DIR    copy each run's daemon logs to DIR/cache-on and DIR/cache-off when it stops)
#   -h, --help           this text
# Any other option after -- is passed to mc-trace-replay, in both runs (for example -- --max-requests 100).
# It takes about 1.5 minutes on a 2-core machine once built (two runs of about 40 s each plus the clusters' start
# and stop; --no-cache-off halves it); the first build takes longer.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
# shellcheck source=lib/netns.sh
. "$here/lib/netns.sh"

duration_s="${MC_DURATION_S:-120}"
start_s="${MC_START_S:-0}"
speed="${MC_SPEED:-4}"
policy="${MC_POLICY:-kvcache}"
queue="${MC_QUEUE:-}"
pending_prefix="${MC_PENDING_PREFIX:-}"
load_weight="${MC_PLACEMENT_LOAD_WEIGHT:-}"
slo_headroom="${MC_SLO_HEADROOM:-}"
shed_limit="${MC_SHED_LIMIT:-}"
n_prefill="${MC_PREFILL:-2}"
n_decode="${MC_DECODE:-2}"
mode="${MC_CLUSTER_MODE:-}"
cache_off=1
spare_dram="${MC_SPARE_DRAM:-512GiB}"
scale="${MC_KV_SCALE:-256}"
nic_cap="${MC_NIC_CAP_MBIT:-10000}"
cluster_file="${MC_CLUSTER_FILE:-$here/clusters/main-job.json}"
out="${MC_OUT:-}"
build_dir="${MC_BUILD_DIR:-$root/build}"
html="${MC_HTML:-}"
json=0
extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "replay-conversation.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration-s) need "$@"; duration_s="$2"; shift 2 ;;
    --start-s) need "$@"; start_s="$2"; shift 2 ;;
    --speed) need "$@"; speed="$2"; shift 2 ;;
    --policy) need "$@"; policy="$2"; shift 2 ;;
    --queue) need "$@"; queue="$2"; shift 2 ;;
    --pending-prefix) need "$@"; pending_prefix="$2"; shift 2 ;;
    --placement-load-weight) need "$@"; load_weight="$2"; shift 2 ;;
    --slo-headroom) need "$@"; slo_headroom="$2"; shift 2 ;;
    --shed-limit) need "$@"; shed_limit="$2"; shift 2 ;;
    --prefill) need "$@"; n_prefill="$2"; shift 2 ;;
    --decode) need "$@"; n_decode="$2"; shift 2 ;;
    --mode) need "$@"; mode="$2"; shift 2 ;;
    --no-cache-off) cache_off=0; shift ;;
    --spare-dram-bytes) need "$@"; spare_dram="$2"; shift 2 ;;
    --scale) need "$@"; scale="$2"; shift 2 ;;
    --nic-cap-mbit) need "$@"; nic_cap="$2"; shift 2 ;;
    --cluster) need "$@"; cluster_file="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --html) need "$@"; html="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --build-dir) need "$@"; build_dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "replay-conversation.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$n_prefill" =~ ^[1-9][0-9]*$ && "$n_decode" =~ ^[1-9][0-9]*$ ]] ||
  { echo "replay-conversation.sh: --prefill and --decode must be counts >= 1" >&2; exit 2; }
case "$queue" in
  ""|fcfs|slo) ;;
  *) echo "replay-conversation.sh: --queue must be fcfs or slo, got '$queue'" >&2; exit 2 ;;
esac
case "$pending_prefix" in
  ""|on|off) ;;
  *) echo "replay-conversation.sh: --pending-prefix must be on or off, got '$pending_prefix'" >&2; exit 2 ;;
esac
case "$mode" in
  ""|netns|loopback) ;;
  *) echo "replay-conversation.sh: --mode must be netns or loopback, got '$mode'" >&2; exit 2 ;;
esac
command -v jq >/dev/null || { echo "replay-conversation.sh: needs jq (tools/install-deps.sh installs it)" >&2; exit 1; }

bin="$build_dir/bin"
# The main job's tools, and the ones the README's next sections run (the gateway, the transfer engine's tool, the
# simulator, the model tool), so each example works right after this command.
tools=(mc-store mc-conductor mc-prefill mc-decode mc-trace-replay mc-auth mc-plan mc-gateway mc-xfer mc-sim mc-model)
missing=0
for t in "${tools[@]}"; do [[ -x "$bin/$t" ]] || missing=1; done
if ((missing)); then
  echo "replay-conversation.sh: building ${tools[*]} in $build_dir (once; several minutes on 2 cores)" >&2
  [[ -f "$build_dir/build.ninja" ]] || cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
  cmake --build "$build_dir" --target "${tools[@]}" >&2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/mc-main-job.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trace="$root/examples/traces/conversation_trace.jsonl"

# ---- the modelled node, in tokens, and its live sizes (mc-plan node: the formulas in one place) ----
model="$(jq -r '.defaults.model // "llama3-70b"' "$cluster_file")"
gpu="$(jq -r '.defaults.gpu // "a800x8"' "$cluster_file")"
block="$(jq -r '.defaults.block_size // 512' "$cluster_file")"
"$bin/mc-plan" node --model "$model" --gpu "$gpu" --spare-dram-bytes "$spare_dram" --scale "$scale" \
  --time-scale "$speed" --nic-cap-mbit "$nic_cap" --block-size "$block" --json > "$work/node.json"
node() { jq -r "$1" "$work/node.json"; }

# ---- the cluster: the description with P prefill and D decode hosts (its own counts unless changed) ----
desc="$cluster_file"
if [[ "$(jq '[.hosts[] | select((.daemons.prefill // 0) > 0)] | length' "$cluster_file")" != "$n_prefill" ||
      "$(jq '[.hosts[] | select((.daemons.decode // 0) > 0)] | length' "$cluster_file")" != "$n_decode" ]]; then
  # Hosts p0..: the first prefill host's shape (p0 keeps its master and conductor); d0..: the first decode host's.
  desc="$work/cluster.json"
  jq --argjson P "$n_prefill" --argjson D "$n_decode" '
    ([.hosts[] | select((.daemons.prefill // 0) > 0)][0]) as $p
    | ([.hosts[] | select((.daemons.decode // 0) > 0)][0]) as $d
    | .hosts = ([range(0; $P) | . as $i | $p | .name = "p\($i)"
                 | if $i > 0 then .daemons |= del(.master, .conductor, .gateway) else . end]
                + [range(0; $D) | . as $i | $d | .name = "d\($i)"])
    | .client = "p0"' "$cluster_file" > "$desc"
fi
n_store="$(jq '[.hosts[].daemons.store // 0] | add' "$desc")"

if [[ -z "$mode" ]]; then
  if netns_require; then
    mode=netns
    echo "replay-conversation.sh: mode netns: this process can make network namespaces, so every host is one" \
         "(its own address, NICs shaped with tc tbf)" >&2
  else
    mode=loopback
    echo "replay-conversation.sh: mode loopback: $NETNS_SKIP_REASON (host names are labels only)" >&2
  fi
else
  echo "replay-conversation.sh: mode $mode (asked for with --mode)" >&2
fi

# ---- analyze's bound for the window (no cluster needed) ----
pool_total=$(($(node .live.dram_tokens) * n_store))
"$bin/mc-trace-replay" analyze "$trace" --start-s "$start_s" --duration-s "$duration_s" \
  --capacity-tokens "$pool_total" --json > "$work/analyze.json"

{
  echo "replay-conversation.sh: ${duration_s} s of $(basename "$trace") from ${start_s} s, ${speed}x compressed;" \
       "policy $policy, queue ${queue:-the policy default}; $(jq -r .name "$desc"): $n_prefill prefill, $n_decode decode hosts, $n_store storage nodes"
  echo "  modelled node: $(node .model) on $(node .gpu), $(node .model_kv_bytes_per_token) B of KV per token;" \
       "decode KV = floor($(node .kv_hbm_fraction) x ($(node .hbm_bytes) B HBM - $(node .weight_bytes) B weights))" \
       "/ $(node .model_kv_bytes_per_token) B = $(node .decode_kv_tokens) tokens per instance; DRAM pool =" \
       "$(node .spare_dram_bytes) B spare / $(node .model_kv_bytes_per_token) B = $(node .pool_tokens) tokens per node"
  echo "  scale: $(node .scale) (live $(node .live.kv_bytes_per_token) B per token): --kv-buffer-size" \
       "$(node .live.kv_buffer_bytes) B = $(node .live.kv_buffer_tokens) tokens, --dram-bytes $(node .live.dram_bytes)" \
       "B = $(node .live.dram_tokens) tokens ($pool_total in the pool); NIC $(node .nic_mbit) Mbit/s x $speed /" \
       "$(node .scale) = $(node .live.nic_mbit_uncapped) Mbit/s, shaped to" \
       "$(node .live.nic_mbit) Mbit/s$([[ "$mode" == netns ]] || echo " (not shaped on loopback)")"
} >&2

# run LABEL CACHE: one replay of the window on a fresh cluster; its stdout in $work/LABEL.out, records in
# $work/LABEL.jsonl.
run() {
  local label=$1 cache=$2 fmt=()
  ((json)) && fmt=(--json)
  local replay=("$bin/mc-trace-replay" "$trace" --start-s "$start_s" --duration-s "$duration_s" --speed "$speed"
                --time-scale "$speed" --block-tokens "$block" --out "$work/$label.jsonl" ${fmt[@]+"${fmt[@]}"}
                ${extra[@]+"${extra[@]}"})
  echo "replay-conversation.sh: run '$label' (prefix cache $cache)" >&2
  local rc=0 keep=() queue_set=()
  [[ -n "$queue" ]] && queue_set=(--set queue="$queue")
  # cluster.sh checks the load weight's, the headroom's and the shed limit's ranges (defaults.placement_load_weight,
  # slo_headroom, shed_limit)
  # before any daemon starts.
  [[ -n "$pending_prefix" ]] && queue_set+=(--set pending_prefix="$pending_prefix")
  [[ -n "$load_weight" ]] && queue_set+=(--set placement_load_weight="$load_weight")
  [[ -n "$slo_headroom" ]] && queue_set+=(--set slo_headroom="$slo_headroom")
  [[ -n "$shed_limit" ]] && queue_set+=(--set shed_limit="$shed_limit")
  [[ -n "${MC_KEEP_LOGS:-}" ]] && keep=(--keep-logs "$MC_KEEP_LOGS/$label")
  # The conductor's endpoint and the client address reach the replay through MC_CONDUCTOR and MC_CLIENT_BIND (set
  # by cluster.sh, inside the client host's namespace in netns mode).
  "$here/cluster.sh" "$desc" --mode "$mode" --bin "$bin" ${keep[@]+"${keep[@]}"} --set time_scale="$speed" \
    --set policy="$policy" ${queue_set[@]+"${queue_set[@]}"} \
    --set kv_bytes_per_token="$(node .live.kv_bytes_per_token)" --set kv_buffer_size="$(node .live.kv_buffer_bytes)" \
    --set dram_bytes="$(node .live.dram_bytes)" --set nic_mbit="$(node .live.nic_mbit)" --set prefix_cache="$cache" \
    -- "${replay[@]}" > "$work/$label.out" || rc=$?
  return "$rc"
}

rc=0
run cache-on store || rc=$?
[[ -n "$out" ]] && cp "$work/cache-on.jsonl" "$out"
if ((cache_off)); then
  run cache-off none || rc=$?
  [[ -n "$out" ]] && cp "$work/cache-off.jsonl" "${out%.*}.cache-off.${out##*.}"
fi

# prefill GPU-seconds: the prefill instances' measured compute (each ledger's prefill_ms, modelled) x the GPUs of
# an instance, as mc-sim's prefill_gpu_s.
gpu_s() { jq -s --argjson g "$(node .gpu_count)" '[.[] | .ledger.prefill_ms // empty] | add // 0 | . * $g / 1000' "$1"; }
summaries=("$work/cache-on.jsonl")
((cache_off)) && summaries+=("$work/cache-off.jsonl")
# The summaries as mc-trace-replay computes them from the records (the SLO limits given after -- apply).
slo=()
for ((i = 0; i < ${#extra[@]}; i++)); do
  case "${extra[$i]}" in
    --slo-ttft-ms|--slo-tbt-ms) slo+=("${extra[$i]}" "${extra[$((i + 1))]:-}") ;;
    --slo-ttft-ms=*|--slo-tbt-ms=*) slo+=("${extra[$i]}") ;;
  esac
done
"$bin/mc-trace-replay" report "${summaries[@]}" ${slo[@]+"${slo[@]}"} --json > "$work/report.json"
# The HTML report of the runs (one curve per run), kept after the work directory goes; gnuplot draws its charts.
html="${html:-$build_dir/main-job/report.html}"
if command -v gnuplot >/dev/null 2>&1 || [[ -n "${MC_GNUPLOT:-}" ]]; then
  mkdir -p "$(dirname "$html")"
  if "$bin/mc-trace-replay" --log-level warn report "${summaries[@]}" ${slo[@]+"${slo[@]}"} --html "$html" \
       --gpus-per-instance "$(node .gpu_count)" > /dev/null; then
    echo "replay-conversation.sh: HTML report: $html" >&2
  else
    echo "replay-conversation.sh: no HTML report: mc-trace-replay report --html failed (see above)" >&2
  fi
else
  echo "replay-conversation.sh: no HTML report: gnuplot is missing (apt-get install gnuplot-nox)" >&2
fi
jq --argjson on "$(gpu_s "$work/cache-on.jsonl")" \
   --argjson off "$( ((cache_off)) && gpu_s "$work/cache-off.jsonl" || echo null)" \
   '{on: $on, off: $off}' -n > "$work/gpu_s.json"

if ((json)); then
  jq -n --slurpfile node "$work/node.json" --slurpfile analyze "$work/analyze.json" \
    --slurpfile report "$work/report.json" --slurpfile gpu "$work/gpu_s.json" \
    --slurpfile on "$work/cache-on.out" \
    --arg mode "$mode" --arg desc "$(jq -r .name "$desc")" --argjson pool "$pool_total" \
    --argjson cache_off "$cache_off" --slurpfile off <( ((cache_off)) && cat "$work/cache-off.out" || echo null) '
    ($report[0] | if type == "array" then . else [.] end) as $r
    | {mode: $mode, cluster: $desc, node: $node[0], pool_tokens: $pool,
       analyze: {hit_ratio_bound: $analyze[0].infinite_cache_earlier_arrivals.hit_ratio_tokens_full_blocks,
                 infinite_cache_earlier_arrivals: $analyze[0].infinite_cache_earlier_arrivals,
                 lru_at_pool: $analyze[0].lru[0]},
       cache_on: ($on[0] + {prefill_gpu_s: $gpu[0].on}),
       cache_off: (if $cache_off == 1 then ($off[0] + {prefill_gpu_s: $gpu[0].off}) else null end)}'
  exit "$rc"
fi

cat "$work/cache-on.out"
# The side-by-side table: one row per figure, a column per run.
jq -r --slurpfile analyze "$work/analyze.json" --slurpfile gpu "$work/gpu_s.json" --argjson pool "$pool_total" '
  (if type == "array" then . else [.] end) as $r
  | def f(d): if . == null then "-" else (. * pow(10; d) | round) as $n | pow(10; d) as $u
      | ($n / $u | floor | tostring) + (if d == 0 then "" else "." + ($n % $u + $u | tostring | .[1:]) end) end;
    def col(g): [$r[] | g];
    ([$r[].reason_kinds | keys[]] | unique) as $kinds
  | ($r[0].slo[0] // {}) as $s
  | [["", "cache on", "cache off"][0:($r | length) + 1]]
    + [["requests offered"] + col(.requests.offered | tostring)]
    + [["completed"] + col(.requests.completed | tostring)]
    + [["rejected"] + col(.requests.rejected | tostring)]
    + [["failed"] + col(.requests.failed | tostring)]
    + [$kinds[] as $k | ["  why: \($k | .[0:46])"] + col(.reason_kinds[$k].count // 0 | tostring)]
    + [["prefill GPU-s (ledger prefill_ms x GPUs)"] + ([$gpu[0].on, $gpu[0].off][0:($r | length)] | map(f(1)))]
    + [["TTFT mean (ms)"] + col(.ttft_ms.mean | f(0))]
    + [["TTFT p90 (ms)"] + col(.ttft_ms.p90 | f(0))]
    + [["goodput (req/s, SLO \($s.ttft_ms // "-") ms / \($s.tbt_ms // "-") ms)"] + col(.slo[0].goodput_rps | f(3))]
    + [["hit ratio (% of prompt tokens)"] + col(.cache.hit_ratio * 100 | f(1))]
    + [["avoided prefill (% of all prompt tokens of the window)"]
       + col(.cache.avoided_prefill_tokens / ($analyze[0].input_tokens.mean * $analyze[0].input_tokens.count) * 100
             | f(1))]
    + [["analyze bound (%, infinite cache, earlier arrivals)",
        ($analyze[0].infinite_cache_earlier_arrivals.hit_ratio_tokens_full_blocks * 100 | f(1))]]
    + [["analyze, LRU of the pool (\($pool) tokens, any order, %)",
        ($analyze[0].lru[0].hit_ratio_tokens_full_blocks * 100 | f(1))]]
  | .[] | @tsv' "$work/report.json" |
  awk -F'\t' 'BEGIN { print "\nwhat the cache bought (the same window; modelled ms)" }
              { printf "%-56s %12s %12s\n", $1, $2, $3 }'
exit "$rc"
