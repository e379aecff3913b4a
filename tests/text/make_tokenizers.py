#!/usr/bin/python3
"""Trains small BPE tokenizers on a fixed corpus and writes them as Hugging Face tokenizer.json files, for
tokenizer_test.cpp, tokenizer_bench.cpp and examples/toy-chat-model.sh (standard library only; deterministic: the
same files every run).

The corpus is corpus.txt beside this script, and nothing else: a frozen slice of docs/DESIGN.md plus multilingual
lines (emoji, CJK, combining marks) repeated 20 times. It is frozen so that editing the docs does not change the
trained vocabularies, and with them the ids and the gateway's outputs quoted in README.md (a toy model's streamed
answer, prompt token counts), which must stay reproducible. Do not edit corpus.txt unless you mean to regenerate
every output derived from these tokenizers.

Usage: make_tokenizers.py OUT_DIR [MERGES]
Writes:
  OUT_DIR/bytelevel/tokenizer.json  Llama 3 / Qwen2 style: NFC, Split(Llama 3's regex) + ByteLevel, ByteLevel
                                    decoder, <|begin_of_text|> etc., TemplateProcessing adding BOS, merges as
                                    [a, b] arrays, ignore_merges.
  OUT_DIR/gpt2/tokenizer.json       GPT-2 style: ByteLevel(use_regex) pre-tokenizer, the same vocabulary, merges
                                    as "a b" strings, one non-special added token with lstrip/rstrip.
  OUT_DIR/sp/tokenizer.json         Llama 2 / Mistral style: Prepend("▁") + Replace(" ", "▁"), byte_fallback with
                                    <0x00>..<0xFF>, decoders Replace/ByteFallback/Fuse/Strip, <unk> <s> </s>.
"""
import heapq
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_tokenizer  # noqa: E402  (its pre-tokenizer splitting; training only needs plausible words)

SPECIALS_BYTELEVEL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>"]


def corpus():
    """The frozen training corpus (see the docstring above)."""
    with open(os.path.join(HERE, "corpus.txt"), encoding="utf-8") as f:
        return f.read()


def train(words, initial, n_merges):
    """BPE training: words is {tuple of symbols: count}; returns the merges in order. Ties: the smallest pair."""
    words = [(list(w), c) for w, c in sorted(words.items())]
    pair_count, where = {}, {}
    for idx, (syms, c) in enumerate(words):
        for k in range(len(syms) - 1):
            p = (syms[k], syms[k + 1])
            pair_count[p] = pair_count.get(p, 0) + c
            where.setdefault(p, set()).add(idx)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges, known = [], set(initial)
    while len(merges) < n_merges and heap:
        negc, p = heapq.heappop(heap)
        if pair_count.get(p, 0) != -negc or negc == 0:
            continue
        merges.append(p)
        new = p[0] + p[1]
        known.add(new)
        changed = {}
        for idx in sorted(where.pop(p, ())):
            syms, c = words[idx]
            for k in range(len(syms) - 1):
                q = (syms[k], syms[k + 1])
                pair_count[q] -= c
                changed[q] = True
            out, k = [], 0
            while k < len(syms):
                if k + 1 < len(syms) and syms[k] == p[0] and syms[k + 1] == p[1]:
                    out.append(new)
                    k += 2
                else:
                    out.append(syms[k])
                    k += 1
            words[idx] = (out, c)
            for k in range(len(out) - 1):
                q = (out[k], out[k + 1])
                pair_count[q] = pair_count.get(q, 0) + c
                where.setdefault(q, set()).add(idx)
                changed[q] = True
        pair_count.pop(p, None)
        for q in changed:
            if pair_count.get(q, 0) > 0 and q != p:
                heapq.heappush(heap, (-pair_count[q], q))
    return merges


def added(i, content, special=True, lstrip=False, rstrip=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": False, "special": special}


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def model(vocab, merges, **kw):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    m.update(kw)
    m["vocab"] = vocab
    m["merges"] = merges
    return m


def write(out_dir, name, tok):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)


def bytelevel(text, n_merges, out_dir):
    import unicodedata
    text = unicodedata.normalize("NFC", text)
    counts = {}
    for piece in ref_tokenizer.split_with(text, ref_tokenizer.match_llama3):
        w = tuple(ref_tokenizer.BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))
        counts[w] = counts.get(w, 0) + 1
    initial = [ref_tokenizer.BYTE_TO_CHAR[b] for b in range(256)]
    merges = train(counts, initial, n_merges)
    vocab = {t: i for i, t in enumerate(initial)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    added_tokens = [added(n + k, s) for k, s in enumerate(SPECIALS_BYTELEVEL)]
    base = {"version": "1.0", "truncation": None, "padding": None}
    llama3 = dict(base)
    llama3.update({
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": ref_tokenizer.LLAMA3}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            template("<|begin_of_text|>", n)]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": model(vocab, [[a, b] for a, b in merges], ignore_merges=True),
    })
    write(out_dir, "bytelevel", llama3)
    gpt2 = dict(base)
    gpt2.update({
        "added_tokens": [added(n, "<|endoftext|>"), added(n + 1, "<tool>", special=False, lstrip=True, rstrip=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": model(vocab, ["%s %s" % (a, b) for a, b in merges]),
    })
    write(out_dir, "gpt2", gpt2)


def sentencepiece(text, n_merges, out_dir):
    sp = "\u2581"
    counts, chars = {}, {}
    for line in text.split("\n"):
        norm = sp + line.replace(" ", sp)
        start = 0
        for k in range(1, len(norm) + 1):
            if k == len(norm) or norm[k] == sp:
                w = tuple(norm[start:k])
                if w:
                    counts[w] = counts.get(w, 0) + 1
                start = k
        for ch in norm:
            chars[ch] = chars.get(ch, 0) + 1
    # Characters seen at least 3 times are symbols; the rest go through byte fallback.
    alphabet = sorted((c for c, k in chars.items() if k >= 3 and c.isprintable() or c == sp),
                      key=lambda c: (-chars[c], c))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in alphabet:
        vocab.setdefault(c, len(vocab))
    known = set(alphabet)
    counts = {tuple(s if s in known else "\0" for s in w): c for w, c in counts.items()}
    counts = {w: c for w, c in counts.items() if "\0" not in w}
    merges = train(counts, alphabet, n_merges)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
           "normalizer": {"type": "Sequence", "normalizers": [
               {"type": "Prepend", "prepend": sp},
               {"type": "Replace", "pattern": {"String": " "}, "content": sp}]},
           "pre_tokenizer": None,
           "post_processor": template("<s>", 1),
           "decoder": {"type": "Sequence", "decoders": [
               {"type": "Replace", "pattern": {"String": sp}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"},
               {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
           "model": model(vocab, ["%s %s" % (a, b) for a, b in merges], unk_token="<unk>", fuse_unk=True,
                          byte_fallback=True)}
    write(out_dir, "sp", tok)


def main():
    out_dir = sys.argv[1]
    n_merges = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    text = corpus()
    bytelevel(text, n_merges, out_dir)
    sentencepiece(text, n_merges * 2 // 3, out_dir)


if __name__ == "__main__":
    main()
