#!/usr/bin/python3
"""An independent reference tokenizer for the tokenizer.json files make_tokenizers.py writes (standard library
only), against which tokenizer_test.cpp checks mc_text's C++ tokenizer id for id.

It shares no code with the C++ one and works differently where it can: Python strings (code points) instead of
bytes, the pre-tokenizers' regexes (GPT-2's and Llama 3's, recognised by their text) hand-written as matchers
over unicodedata categories instead of a regex engine, and BPE as GPT-2's original loop (merge every occurrence
of the best-ranked pair, repeat) instead of a heap.

Usage: ref_tokenizer.py TOKENIZER_JSON CASES_JSONL
  Each input line: {"hex": "<the text's bytes in hex>", "add_special": bool, "parse_special": bool}
  Each output line: {"ids": [...], "decoded_hex": "<decode(ids, skip_special_tokens=false) in hex>"}
  A line {"decode_ids": [...], "skip_special": bool} only decodes (output as above, ids echoed).
Invalid UTF-8 in a case becomes U+FFFD per maximal ill-formed subsequence (bytes.decode(errors="replace")).
"""
import json
import sys
import unicodedata

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# PCRE2's \s under PCRE2_UCP: \p{Z}, \h and \v.
_EXTRA_SPACE = set("\t\n\x0b\x0c\r\x85\u180e")


def is_space(c):
    return c in _EXTRA_SPACE or unicodedata.category(c) in ("Zs", "Zl", "Zp")


def is_letter(c):
    return unicodedata.category(c).startswith("L")


def is_number(c):
    return unicodedata.category(c) in ("Nd", "Nl", "No")


def is_other(c):  # [^\s\p{L}\p{N}]
    return not is_space(c) and not is_letter(c) and not is_number(c)


def run(s, i, pred, limit=None):
    """The end of the run of characters satisfying pred from i (at most limit of them)."""
    j = i
    while j < len(s) and pred(s[j]) and (limit is None or j - i < limit):
        j += 1
    return j


def space_tail(s, i):
    """\\s+(?!\\S) then \\s+ at i (s[i] is a space): the end of the match."""
    k = run(s, i, is_space)
    if k == len(s) or k - 1 > i:
        return k if k == len(s) else k - 1
    return k


def match_gpt2(s, i):
    if s[i] == "'":
        if s[i + 1:i + 3] in ("re", "ve", "ll"):
            return i + 3
        if s[i + 1:i + 2] in ("s", "t", "m", "d"):
            return i + 2
    j = i + 1 if s[i] == " " else i
    for pred in (is_letter, is_number, is_other):
        if j < len(s) and pred(s[j]):
            return run(s, j, pred)
    return space_tail(s, i)


def match_llama3(s, i):
    c = s[i]
    if c == "'":
        two = s[i + 1:i + 3].lower()
        if two in ("re", "ve", "ll"):
            return i + 3
        if s[i + 1:i + 2].lower() in ("s", "t", "m", "d"):
            return i + 2
    if is_letter(c):
        return run(s, i, is_letter)
    if c not in "\r\n" and not is_number(c) and i + 1 < len(s) and is_letter(s[i + 1]):
        return run(s, i + 1, is_letter)
    if is_number(c):
        return run(s, i, is_number, 3)
    j = i + 1 if c == " " else i
    if j < len(s) and is_other(s[j]):
        k = run(s, j, is_other)
        return run(s, k, lambda ch: ch in "\r\n")
    # c is a space here.
    k = run(s, i, is_space)
    last_nl = max((p for p in range(i, k) if s[p] in "\r\n"), default=None)
    if last_nl is not None:
        return last_nl + 1
    return space_tail(s, i)


def split_with(s, matcher):
    out, i = [], 0
    while i < len(s):
        j = matcher(s, i)
        assert j > i, (s, i)
        out.append(s[i:j])
        i = j
    return out


def byte_alphabet():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR = byte_alphabet()
CHAR_TO_BYTE = {v: k for k, v in BYTE_TO_CHAR.items()}


class Tokenizer:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.j = json.load(f)
        m = self.j["model"]
        assert m["type"] == "BPE"
        self.vocab = m["vocab"]
        self.ranks = {}
        for r, mg in enumerate(m["merges"]):
            a, b = mg.split(" ") if isinstance(mg, str) else mg
            self.ranks[(a, b)] = r
        self.byte_fallback = m.get("byte_fallback") or False
        self.ignore_merges = m.get("ignore_merges") or False
        self.fuse_unk = m.get("fuse_unk") or False
        self.unk = m.get("unk_token")
        self.added = self.j.get("added_tokens") or []
        self.id_to_tok = {v: k for k, v in self.vocab.items()}
        self.special_ids = set()
        for a in self.added:
            self.id_to_tok[a["id"]] = a["content"]
            if a["special"]:
                self.special_ids.add(a["id"])

    # --- encoding
    def normalize(self, s, n):
        if n is None:
            return s
        t = n["type"]
        if t == "Sequence":
            for x in n["normalizers"]:
                s = self.normalize(s, x)
            return s
        if t == "NFC":
            return unicodedata.normalize("NFC", s)
        if t == "Prepend":
            return n["prepend"] + s if s else s
        if t == "Replace":
            return s.replace(n["pattern"]["String"], n["content"])
        raise ValueError("reference: normalizer %s" % t)

    def pre_tokenize(self, words, p):
        if p is None:
            return words
        t = p["type"]
        if t == "Sequence":
            for x in p["pretokenizers"]:
                words = self.pre_tokenize(words, x)
            return words
        if t == "Split":
            assert p["pattern"]["Regex"] == LLAMA3 and p["behavior"] == "Isolated" and not p["invert"]
            return [piece for w in words for piece in split_with(w, match_llama3)]
        if t == "ByteLevel":
            if p.get("add_prefix_space"):
                words = [w if w.startswith(" ") else " " + w for w in words]
            if p.get("use_regex", True):
                assert p.get("use_regex") is not None
                words = [piece for w in words for piece in split_with(w, match_gpt2)]
            return ["".join(BYTE_TO_CHAR[b] for b in w.encode("utf-8")) for w in words]
        raise ValueError("reference: pre-tokenizer %s" % t)

    def bpe(self, word):
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        syms = []
        last_unk = False
        for ch in word:
            if ch in self.vocab:
                syms.append(ch)
                last_unk = False
            elif self.byte_fallback:
                syms.extend("<0x%02X>" % b for b in ch.encode("utf-8"))
                last_unk = False
            elif self.unk is not None:
                if not (self.fuse_unk and last_unk):
                    syms.append(self.unk)
                last_unk = True
        while len(syms) > 1:
            best = min(((self.ranks.get((syms[k], syms[k + 1]), None), k) for k in range(len(syms) - 1)
                        if (syms[k], syms[k + 1]) in self.ranks), default=None)
            if best is None:
                break
            a, b = syms[best[1]], syms[best[1] + 1]
            merged, k = [], 0
            while k < len(syms):
                if k + 1 < len(syms) and syms[k] == a and syms[k + 1] == b:
                    merged.append(a + b)
                    k += 2
                else:
                    merged.append(syms[k])
                    k += 1
            syms = merged
        return [self.vocab[x] for x in syms]

    def encode_segment(self, seg):
        s = self.normalize(seg, self.j.get("normalizer"))
        if not s:
            return []
        out = []
        for w in self.pre_tokenize([s], self.j.get("pre_tokenizer")):
            out.extend(self.bpe(w))
        return out

    def encode(self, text, add_special, parse_special):
        cands = sorted(self.added, key=lambda a: -len(a["content"]))
        ids, seg, i = [], 0, 0
        while i < len(text):
            hit = None
            for a in cands:
                if a["special"] and not parse_special:
                    continue
                if text.startswith(a["content"], i):
                    hit = a
                    break
            if hit is None:
                i += 1
                continue
            end = i
            if hit.get("lstrip"):
                while end > seg and is_space(text[end - 1]):
                    end -= 1
            ids.extend(self.encode_segment(text[seg:end]))
            ids.append(hit["id"])
            i += len(hit["content"])
            if hit.get("rstrip"):
                while i < len(text) and is_space(text[i]):
                    i += 1
            seg = i
        ids.extend(self.encode_segment(text[seg:]))
        if add_special:
            ids = self.post_process(ids, self.j.get("post_processor"))
        return ids

    def post_process(self, ids, p):
        if p is None:
            return ids
        if p["type"] == "Sequence":
            for x in p["processors"]:
                ids = self.post_process(ids, x)
            return ids
        if p["type"] == "ByteLevel":
            return ids
        assert p["type"] == "TemplateProcessing"
        out = []
        for item in p["single"]:
            if "Sequence" in item:
                out.extend(ids)
            else:
                out.extend(p["special_tokens"][item["SpecialToken"]["id"]]["ids"])
        return out

    # --- decoding
    def decode_chain(self, toks, d):
        if d is None:
            return toks
        t = d["type"]
        if t == "Sequence":
            for x in d["decoders"]:
                toks = self.decode_chain(toks, x)
            return toks
        if t == "ByteLevel":
            data = bytearray()
            for tok in toks:
                if all(c in CHAR_TO_BYTE for c in tok):
                    data.extend(CHAR_TO_BYTE[c] for c in tok)
                else:
                    data.extend(tok.encode("utf-8"))
            return [bytes(data).decode("utf-8", errors="replace")]
        if t == "Replace":
            return [tok.replace(d["pattern"]["String"], d["content"]) for tok in toks]
        if t == "Fuse":
            return ["".join(toks)]
        if t == "Strip":
            out = []
            for tok in toks:
                for _ in range(d["start"]):
                    if tok.startswith(d["content"]):
                        tok = tok[len(d["content"]):]
                for _ in range(d["stop"]):
                    if tok.endswith(d["content"]):
                        tok = tok[:-len(d["content"])]
                out.append(tok)
            return out
        if t == "ByteFallback":
            out, pending = [], []

            def flush():
                # Valid characters kept, each other byte U+FFFD (mc_text's rule, as SentencePiece's).
                data, k, text = bytes(pending), 0, []
                while k < len(data):
                    for n in (1, 2, 3, 4):
                        try:
                            ch = data[k:k + n].decode("utf-8")
                        except UnicodeDecodeError:
                            continue
                        text.append(ch)
                        k += n
                        break
                    else:
                        text.append("\ufffd")
                        k += 1
                if pending:
                    out.append("".join(text))
                pending.clear()

            for tok in toks:
                if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                    pending.append(int(tok[3:5], 16))
                else:
                    flush()
                    out.append(tok)
            flush()
            return out
        raise ValueError("reference: decoder %s" % t)

    def decode(self, ids, skip_special):
        toks = [self.id_to_tok[i] for i in ids if i in self.id_to_tok and not (skip_special and i in self.special_ids)]
        return "".join(self.decode_chain(toks, self.j.get("decoder")))


def main():
    tok = Tokenizer(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            if "decode_ids" in case:
                decoded = tok.decode(case["decode_ids"], case.get("skip_special", False))
                print(json.dumps({"ids": case["decode_ids"], "decoded_hex": decoded.encode("utf-8").hex()}))
                continue
            text = bytes.fromhex(case["hex"]).decode("utf-8", errors="replace")
            ids = tok.encode(text, case["add_special"], case["parse_special"])
            decoded = tok.decode(ids, False)
            print(json.dumps({"ids": ids, "decoded_hex": decoded.encode("utf-8").hex()}))


if __name__ == "__main__":
    main()
