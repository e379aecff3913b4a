#!/usr/bin/env bash
# serve-model.sh: serve a Hugging Face checkpoint over the OpenAI API on this machine: examples/local-cluster.sh
# with the ref backend computing the checkpoint's weights on the CPU (docs/DESIGN.md §7) and mc-gateway in front
# (docs/DESIGN.md §15).
#
#   examples/serve-model.sh DIR [local-cluster options]                run until Ctrl-C (prints how to reach it)
#   examples/serve-model.sh DIR [local-cluster options] -- CMD [ARGS]  run CMD with MC_GATEWAY (the gateway's URL),
#                                                                       MC_MODEL_NAME and the cluster's other
#                                                                       endpoints in its environment, then stop;
#                                                                       exits with CMD's status
#
# DIR is a Hugging Face model directory: config.json (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or
# MistralForCausalLM), generation_config.json if any, and the weights as model.safetensors or shards with
# model.safetensors.index.json (bf16, fp16 or fp32), e.g. Llama 3.2 1B or Qwen2.5 0.5B downloaded by you, or a
# checkpoint `mc-model init DIR ...` writes. `mc-model inspect DIR` checks it first.
#
# It runs local-cluster.sh --backend ref --model DIR --gateway --prefill 1 --decode 1 --store-nodes 1 --block-size 16,
# then the options given here, which win (see `examples/local-cluster.sh --help`); the useful ones here:
#   --threads N           compute threads of each prefill and decode instance (default 1; both share the cores)
#   --kv-dtype T          KV element type auto (the checkpoint's), fp32, bf16 or fp16
#   --prefill P, --decode D, --policy NAME, --prefix-cache none, --kv-buffer-size SIZE, --bin DIR (where the mc
#   binaries are: MC_BIN, default build/bin), --ready-timeout-s N (a large checkpoint on a slow disk), --metrics
# --model and --cluster are refused: DIR is the model, and this is a cluster of one machine.
#
# SLOs: the Conductor's defaults are a GPU server's (TTFT 30 s, time between tokens 100 ms). A CPU computing a real
# model misses them (a 0.5B model decodes a few tokens a second), and once the Conductor has measured that it refuses
# every request at once (HTTP 429 slo_unattainable). So the Conductor and the gateway get MC_SLO_TTFT_MS=600000 and
# MC_SLO_TBT_MS=60000 unless those are set (a request's own "mc": {"slo_ttft_ms", "slo_tbt_ms"} still wins).
#
# Text (docs/DESIGN.md §15): with a tokenizer.json in DIR the gateway tokenizes prompts and detokenizes answers with
# it, and renders chat requests with DIR's chat template (chat_template.jinja, or tokenizer_config.json's), exactly
# as the model was trained; examples/toy-chat-model.sh writes such a directory. Without tokenizer.json the gateway is
# byte-level (a prompt's UTF-8 bytes are its ids, right only for a --vocab 256 checkpoint of `mc-model init`), and a
# chat request gets mc's own template.
#
# Exit status: CMD's; 2 for a usage error (no DIR, DIR without config.json); else local-cluster.sh's.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "serve-model.sh: $*" >&2; exit 2; }

# The name the gateway serves the model under (its ready line's model=: the directory's name), inside the cluster.
served_name() { tr ' ' '\n' < "$MC_CLUSTER_STATE/gateway.ready" | sed -n 's/^model=//p'; }

# Inside the cluster (local-cluster.sh runs this script again as its CMD):
#   --inside-run CMD...  runs CMD with MC_MODEL_NAME;
#   --inside-hold DIR    without a command: says how to reach the gateway, then holds the cluster until Ctrl-C
#                        (local-cluster.sh stops everything) or until one of its daemons exits (its log is shown;
#                        local-cluster.sh then stops the rest).
case "${1:-}" in
  --inside-run)
    shift
    MC_MODEL_NAME="$(served_name)"
    export MC_MODEL_NAME
    exec "$@" ;;
  --inside-hold)
    name="$(served_name)"
    {
      echo "serve-model.sh: serving $2 as model \"$name\" at $MC_GATEWAY (the OpenAI API; Ctrl-C stops it), e.g.:"
      echo "  curl -s $MC_GATEWAY/v1/models"
      echo "  curl -s $MC_GATEWAY/v1/completions -H 'Content-Type: application/json' \\"
      echo "    -d '{\"model\": \"$name\", \"prompt\": [1, 2, 3], \"max_tokens\": 8}'"
      echo "  curl -sN $MC_GATEWAY/v1/chat/completions -H 'Content-Type: application/json' \\"
      echo "    -d '{\"model\": \"$name\", \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 8}'"
      echo "  (text goes in as bytes, ids 0-255: for a real model's vocabulary send \"prompt\" as its tokenizer's ids; --help)"
    } >&2
    while sleep 1; do
      while read -r daemon pid _; do
        if ! kill -0 "$pid" 2>/dev/null; then
          # A Ctrl-C reaches every daemon at once, and local-cluster.sh stops this loop (SIGTERM) within a moment:
          # say nothing then.
          sleep 2
          echo "serve-model.sh: $daemon (pid $pid) exited; stopping the cluster. Its log:" >&2
          sed 's/^/  /' "$MC_CLUSTER_STATE/$daemon.log" >&2
          exit 1
        fi
      done < "$MC_CLUSTER_STATE/cluster.txt"
    done ;;
  -h|--help) usage; exit 0 ;;
  "") die "no model directory given. Usage: examples/serve-model.sh DIR [local-cluster options] [-- CMD [ARGS]] (--help)" ;;
  -*) die "the first argument is the model directory, got option '$1' (see --help)" ;;
esac
dir="$1"
shift
[[ -d "$dir" ]] || die "$dir is not a directory (a Hugging Face model directory: config.json and the weights)"
[[ -f "$dir/config.json" ]] ||
  die "$dir has no config.json: not a Hugging Face model directory (mc-model init DIR writes one; see --help)"
# A path, never a preset's name (the tools take "tiny" for the preset even where a directory of that name is here).
[[ "$dir" == */* ]] || dir="./$dir"

opts=()
cmd=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --) shift; cmd=("$@"); break ;;
    --model|--cluster) die "$1 is not an option here: the model is DIR, the cluster this machine's" ;;
    -h|--help) usage; exit 0 ;;
    *) opts+=("$1"); shift ;;
  esac
done
self="$here/$(basename "${BASH_SOURCE[0]}")"
export MC_SLO_TTFT_MS="${MC_SLO_TTFT_MS:-600000}" MC_SLO_TBT_MS="${MC_SLO_TBT_MS:-60000}"
if [[ ${#cmd[@]} -eq 0 ]]; then
  cmd=("$self" --inside-hold "$dir")
else
  cmd=("$self" --inside-run "${cmd[@]}")
fi

exec "$here/local-cluster.sh" --backend ref --model "$dir" --gateway --prefill 1 --decode 1 --store-nodes 1 \
  --block-size 16 ${opts[@]+"${opts[@]}"} -- "${cmd[@]}"
