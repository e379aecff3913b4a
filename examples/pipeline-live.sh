#!/usr/bin/env bash
# pipeline-live.sh: a pipelined prefill group live (issue 22, docs/DESIGN.md §18 "Live groups") — the TTFT of one
# long prompt on one prefill instance and on a group of two: ref instances with one OpenBLAS thread each, or sim
# instances (the GPU cost model's time, hidden states scaled like the sim KV).
#
#   examples/pipeline-live.sh [--backend ref|sim] [--tokens N] [--chunk N] [--model M] [--bin DIR] [--auth] [--json]
#
# Defaults: ref, model small, 4,096 tokens in chunks of 512; sim, llama3-70b on a800x8, 16,384 tokens in chunks of
# 2,048. Runs the same five-request trace twice through examples/local-cluster.sh (2 prefill and 1 decode instances, no
# prefix cache, every prefill chunked by --chunk): four short prompts first, which teach the Conductor's predictor
# the instances' speed (ref: this CPU's; its prior is a GPU's), then the long prompt alone. Run 1 has no groups
# (--pipeline-group 1); run 2 lets the Conductor take a group of both prefill instances (--pipeline-group 2
# --pipeline-reserve-factor 1). Prints the long prompt's TTFT in each run, their ratio, the ideal ratio (1/2: two
# stages), the fill bound ((k + 1) / 2k for k chunks) and whether the two runs generated the same tokens. The group
# run must place the long prompt on two stages (its decision log says so), else the script fails.
# --auth runs both clusters with keys (local-cluster.sh --auth: CURVE, grants on every KV and stage segment).
# Needs jq (tools/install-deps.sh installs it). Exit: 0 ok, 1 a run failed, 2 bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."

backend=ref
tokens=
chunk=
model=
bin=${MC_BIN:-build/bin}
json=0
auth=()
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend=${2:?}; shift 2 ;;
    --tokens) tokens=${2:?}; shift 2 ;;
    --chunk) chunk=${2:?}; shift 2 ;;
    --model) model=${2:?}; shift 2 ;;
    --bin) bin=${2:?}; shift 2 ;;
    --json) json=1; shift ;;
    --auth) auth=(--auth); shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "pipeline-live.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$backend" in
  ref) tokens=${tokens:-4096} chunk=${chunk:-512} model=${model:-small} ;;
  sim) tokens=${tokens:-16384} chunk=${chunk:-2048} model=${model:-llama3-70b} ;;
  *) echo "pipeline-live.sh: --backend is ref or sim, got '$backend'" >&2; exit 2 ;;
esac
case "$tokens$chunk" in "" | *[!0-9]*) echo "pipeline-live.sh: --tokens and --chunk take positive integers" >&2; exit 2 ;; esac
if [ "$tokens" -lt $((2 * chunk)) ] || [ "$chunk" -lt 16 ]; then
  echo "pipeline-live.sh: --tokens must be at least two chunks and --chunk at least 16" >&2
  exit 2
fi
command -v jq > /dev/null || { echo "pipeline-live.sh: needs jq (tools/install-deps.sh installs it)" >&2; exit 1; }
for tool in mc-conductor mc-prefill mc-decode mc-store mc-trace-replay; do
  [ -x "$bin/$tool" ] || { echo "pipeline-live.sh: $bin/$tool is not built (cmake --build build)" >&2; exit 1; }
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
block=16
# The trace: warm-ups of 256..1024 tokens 2 s apart, then the long prompt; every block id distinct (no reuse).
next_id=0
row() { # row TIMESTAMP_MS INPUT_TOKENS
  local n=$(((${2} + block - 1) / block)) ids=""
  for ((i = 0; i < n; i++)); do ids+="${ids:+, }$((next_id + i))"; done
  next_id=$((next_id + n))
  echo "{\"timestamp\": $1, \"input_length\": $2, \"output_length\": 8, \"hash_ids\": [$ids]}"
}
{
  row 0 256
  row 2000 512
  row 4000 768
  row 6000 1024
  row 9000 "$tokens"
} > "$scratch/trace.jsonl"

run() { # run GROUP
  local group=$1
  echo "pipeline-live.sh: run with --pipeline-group $group ..." >&2
  # Both runs chunk the same way (mc-prefill --chunk-tokens through its environment): the single instance's prefill
  # is the same chunked computation, on one core instead of two.
  MC_CHUNK_TOKENS=$chunk examples/local-cluster.sh --bin "$bin" --backend "$backend" --model "$model" --block-size "$block" --prefill 2 \
    --decode 1 --store-nodes 1 --prefix-cache none --log-level error ${auth[@]+"${auth[@]}"} \
    --conductor-args "--pipeline-group $group --prefill-chunk $chunk --pipeline-reserve-factor 1 --decisions $scratch/decisions$group.jsonl --slo-ttft-ms 600000" \
    -- "$bin/mc-trace-replay" "$scratch/trace.jsonl" --trace-block-size "$block" --block-tokens "$block" \
    --out "$scratch/records$group.jsonl" --record-token-ids --no-progress --id-prefix "g$group-" \
    --slo-ttft-ms 600000 > "$scratch/report$group.txt" 2> "$scratch/replay$group.err" ||
    { cat "$scratch/replay$group.err" >&2; echo "pipeline-live.sh: the run with --pipeline-group $group failed" >&2; exit 1; }
}
run 1
run 2
long_id() { echo "g$1-5"; }  # the trace's 5th line
ttft() { jq -r --arg id "$(long_id "$1")" 'select(.request_id == $id) | .ttft_ms' "$scratch/records$1.jsonl"; }
tokens_of() { jq -c --arg id "$(long_id "$1")" 'select(.request_id == $id) | .output_token_ids' "$scratch/records$1.jsonl"; }
stages=$(jq -r --arg id "$(long_id 2)" 'select(.request.request_id == $id) | (.decision.stages // []) | length' \
  "$scratch/decisions2.jsonl")
t1=$(ttft 1)
t2=$(ttft 2)
if [ -z "$t1" ] || [ -z "$t2" ] || [ "$t1" = null ] || [ "$t2" = null ]; then
  echo "pipeline-live.sh: no TTFT for the long prompt in a run's records" >&2
  exit 1
fi
if [ "$stages" != 2 ]; then
  echo "pipeline-live.sh: the Conductor did not place the long prompt on a group of 2 (stages: ${stages:-none})" >&2
  exit 1
fi
same=false
[ "$(tokens_of 1)" = "$(tokens_of 2)" ] && same=true
ratio=$(awk -v a="$t2" -v b="$t1" 'BEGIN { printf "%.3f", a / b }')
fill=$(awk -v n="$tokens" -v c="$chunk" 'BEGIN { k = int((n + c - 1) / c); printf "%.4f", (k + 1) / (2 * k) }')
if [ "$json" = 1 ]; then
  jq -n --argjson tokens "$tokens" --argjson chunk "$chunk" --arg model "$model" --argjson t1 "$t1" \
    --argjson t2 "$t2" --argjson ratio "$ratio" --argjson same "$same" \
    --arg backend "$backend" --argjson fill "$fill" \
    '{backend: $backend, model: $model, prompt_tokens: $tokens, chunk_tokens: $chunk, ttft_ms_one_instance: $t1,
      ttft_ms_group_of_2: $t2, ratio: $ratio, ideal_ratio: 0.5, fill_bound: $fill, ratio_to_ideal: ($ratio / 0.5),
      same_tokens: $same}'
else
  printf 'model %s, one %s-token prompt, chunks of %s tokens, %s backend%s\n' "$model" "$tokens" "$chunk" \
    "$backend" "$([ "$backend" = ref ] && echo ", 1 thread per instance")"
  printf '  TTFT on one instance      %10.1f ms\n' "$t1"
  printf '  TTFT on a group of 2      %10.1f ms\n' "$t2"
  printf '  ratio                     %10.3f   (ideal for 2 stages: 0.500, %.2fx it; fill bound %s)\n' "$ratio" \
    "$(awk -v r="$ratio" 'BEGIN { print r / 0.5 }')" "$fill"
  printf '  same tokens               %10s\n' "$same"
fi
