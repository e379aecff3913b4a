#!/usr/bin/env bash
# toy-chat-model.sh: writes a small Hugging Face model directory with a real tokenizer and a real chat template, for
# trying mc's text path (tokenizer, chat template, the OpenAI API; docs/DESIGN.md §15) without downloading a model:
#   DIR/tokenizer.json         a byte-level BPE in Llama 3's layout (its split regex, NFC, ByteLevel, special tokens
#                              <|begin_of_text|> <|eot_id|> ..., a BOS post-processor), trained on a frozen
#                              slice of the docs (tests/text/corpus.txt) by tests/text/make_tokenizers.py (Python's
#                              standard library; deterministic)
#   DIR/tokenizer_config.json  Llama 3.2 Instruct's chat template (tests/text/templates/, its licence noted there),
#                              bos_token <|begin_of_text|>, eos_token <|eot_id|>
#   DIR/config.json, DIR/model.safetensors
#                              `mc-model init`: LlamaForCausalLM, 4 layers of 256, seeded random bf16 weights, its
#                              vocabulary the tokenizer's
# The weights are random, so the answers are fluent in nothing; the tokens, the template, streaming, sampling and
# the prefix cache are real. Serve it with examples/serve-model.sh DIR.
#
# Usage: examples/toy-chat-model.sh DIR [--bin DIR (the mc binaries: MC_BIN, default build/bin)] [--seed N]
# Exit status: 0 done; 1 a step failed (its message on stderr); 2 usage.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "toy-chat-model.sh: $*" >&2; exit 2; }

out="" bin="${MC_BIN:-$root/build/bin}" seed=3
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --bin) (($# >= 2)) || die "--bin needs a directory"; bin="$2"; shift 2 ;;
    --seed) (($# >= 2)) || die "--seed needs a number"; seed="$2"; shift 2 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ -z "$out" ]] || die "one DIR only"; out="$1"; shift ;;
  esac
done
[[ -n "$out" ]] || die "give the directory to write (see --help)"
[[ -x "$bin/mc-model" ]] || { echo "toy-chat-model.sh: $bin/mc-model not found: build it first (cmake --build build --target mc-model) or pass --bin" >&2; exit 1; }
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3

work="$(mktemp -d "${TMPDIR:-/tmp}/mc-toy-chat.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "toy-chat-model.sh: training the tokenizer (a few seconds)" >&2
"$python" "$root/tests/text/make_tokenizers.py" "$work" >&2
vocab="$("$python" -c '
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
print(max(list(t["model"]["vocab"].values()) + [a["id"] for a in t["added_tokens"]]) + 1)' "$work/bytelevel/tokenizer.json")"
"$bin/mc-model" init "$out" --arch LlamaForCausalLM --layers 4 --hidden 256 --vocab "$vocab" --dtype bf16 \
  --seed "$seed" >&2
cp "$work/bytelevel/tokenizer.json" "$out/tokenizer.json"
"$python" -c '
import json, sys
template = open(sys.argv[1], encoding="utf-8").read()
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": template},
          open(sys.argv[2], "w", encoding="utf-8"), indent=2, ensure_ascii=False)' \
  "$root/tests/text/templates/meta-llama-Llama-3.2-3B-Instruct.jinja" "$out/tokenizer_config.json"
# The end and start ids of config.json and generation_config.json: the tokenizer's, as in Llama 3.2 Instruct.
"$python" -c '
import json, sys
added = {a["content"]: a["id"] for a in json.load(open(sys.argv[1], encoding="utf-8"))["added_tokens"]}
for name in ("config.json", "generation_config.json"):
    path = sys.argv[2] + "/" + name
    c = json.load(open(path, encoding="utf-8"))
    c["bos_token_id"] = added["<|begin_of_text|>"]
    c["eos_token_id"] = [added["<|end_of_text|>"], added["<|eot_id|>"]]
    json.dump(c, open(path, "w", encoding="utf-8"), indent=2)' "$out/tokenizer.json" "$out"
echo "toy-chat-model.sh: wrote $out (vocabulary $vocab; serve it: examples/serve-model.sh $out)" >&2
