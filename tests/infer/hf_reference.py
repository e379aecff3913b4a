#!/usr/bin/env python3
"""Independent reference forward pass of Hugging Face decoder checkpoints, for the inference tests.

Reads DIR/config.json and DIR/model.safetensors (or the shards named by model.safetensors.index.json's
"weight_map"), parsing safetensors with json + numpy only (F32, BF16, F16), and runs the greedy decoding
of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM with numpy. It is the
tests' independent reference: it shares no code with the C++ engine, and follows the semantics of the
HF transformers modeling code (modeling_llama / _mistral / _qwen2 / _qwen3, modeling_rope_utils), as
described here, not copied:
  - token embedding; per layer: RMSNorm (x / sqrt(mean(x^2) + rms_norm_eps) * w), attention, residual,
    RMSNorm, SwiGLU MLP down(silu(gate(x)) * up(x)), residual; final RMSNorm; lm_head (the embedding
    matrix when tie_word_embeddings). Linear weights are [out, in]; y = x @ W^T (+ b).
  - q/k/v biases: Qwen2 always; Llama and Qwen3 q/k/v/o biases when "attention_bias"; Llama MLP biases
    when "mlp_bias". Qwen3 q_norm / k_norm: RMSNorm over head_dim of each head of q and k, before RoPE.
  - RoPE in rotate_half form: pairs (x[i], x[i + d/2]), inv_freq[i] = theta^(-2i/d), positions 0..n-1;
    rope_scaling "llama3" (wavelength bands with smooth interpolation, as _compute_llama3_parameters)
    and "linear" (inv_freq / factor). Grouped-query attention: query head h reads KV head h // (H / KV).
  - causal softmax attention with scale 1/sqrt(head_dim); sliding window (token i sees j when
    i - j < sliding_window): Mistral on every layer when set; Qwen2/Qwen3 only when use_sliding_window,
    on layers >= max_window_layers (or where "layer_types" says "sliding_attention").
Arithmetic is float32 like the C++ engine (the sums of squares of RMSNorm in float64; RoPE angles in
float64, then cast), or all float64 with --float64. --kv-dtype rounds K (after RoPE) and V to bf16
(round to nearest even) or fp16 before attention uses them, as a KV cache stored in that type would.
Usage: hf_reference.py DIR --prompt-ids 1,2,3 [--steps N] [--top K] [--kv-dtype fp32|bf16|fp16]
                       [--all-logits] [--float64] [--json]
Prints {"tokens": [...], "top": [[id, logit], ...], "step_top": [[id, logit, gap], ...]} (+ "logits");
"top" and "logits" are of the last prompt token. Errors: message on stderr, exit 2 (77: no numpy).
"""
import argparse
import json
import math
import os
import sys

try:
    import numpy as np
except ImportError:  # exit 77: a test runner may count it as skipped (ctest SKIP_RETURN_CODE)
    print("hf_reference: needs numpy (Debian: apt-get install python3-numpy, then /usr/bin/python3)", file=sys.stderr)
    sys.exit(77)


class RefError(Exception):
    pass


def to_bf16(x):  # round float32 to the nearest bfloat16 (ties to even), returned as float32
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return (b & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


class Checkpoint:
    def __init__(self, d):
        self.dir, self.files, self.index = d, {}, {}
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f).get("weight_map")
            if not isinstance(wm, dict):
                raise RefError(f"{idx}: no weight_map")
            names = sorted(set(wm.values()))
        else:
            names = ["model.safetensors"]
        for fn in names:
            path = os.path.join(d, fn)
            if not os.path.exists(path):
                raise RefError(f"missing weights file {path}")
            data = np.memmap(path, dtype=np.uint8, mode="r")
            n = int(data[:8].view("<u8")[0]) if data.size >= 8 else -1
            if n < 0 or 8 + n > data.size:
                raise RefError(f"{path}: bad safetensors header")
            header = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
            for name, t in header.items():
                if name != "__metadata__":
                    self.index[name] = (path, t)
            self.files[path] = (data, 8 + n)

    def get(self, name, shape, dt, optional=False):
        if name not in self.index:
            if optional:
                return None
            raise RefError(f"missing tensor {name}")
        path, t = self.index[name]
        data, base = self.files[path]
        b, e = t["data_offsets"]
        raw = data[base + b:base + e]
        kind = t["dtype"]
        if kind == "F32":
            a = raw.view("<f4").astype(np.float32)
        elif kind == "F16":
            a = raw.view("<f2").astype(np.float32)
        elif kind == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise RefError(f"{name}: unsupported dtype {kind}")
        if list(t["shape"]) != list(shape) or a.size != math.prod(shape):
            raise RefError(f"{name}: shape {t['shape']} ({a.size} values), expected {list(shape)}")
        return a.reshape(shape).astype(dt)


def rms_norm(x, w, eps, dt):
    ms = np.mean(np.square(x.astype(np.float64)), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(dt)) * w


def inv_freqs(cfg, d):
    theta = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rs["factor"])
    if kind != "llama3":
        raise RefError(f"unsupported rope_scaling type {kind}")
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > old / lo, inv / factor, inv)  # low frequencies: divided by factor
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return np.where(medium, smoothed, out)


class Model:
    def __init__(self, d, dt, kv_dtype):
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        arch = (c.get("architectures") or [""])[0]
        if arch not in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
            raise RefError(f"unsupported architecture {arch!r}")
        if c.get("hidden_act", "silu") != "silu":
            raise RefError(f"unsupported hidden_act {c.get('hidden_act')}")
        self.dt, self.kv_dtype, self.cfg = dt, kv_dtype, c
        D, H = c["hidden_size"], c["num_attention_heads"]
        KV = c.get("num_key_value_heads") or H
        hd = c.get("head_dim") or D // H
        F, V, L = c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
        self.D, self.H, self.KV, self.hd, self.V, self.L = D, H, KV, hd, V, L
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.inv = inv_freqs(c, hd)
        ck = Checkpoint(d)
        self.embed = ck.get("model.embed_tokens.weight", [V, D], dt)
        self.norm = ck.get("model.norm.weight", [D], dt)
        self.lm_head = self.embed if c.get("tie_word_embeddings") else ck.get("lm_head.weight", [V, D], dt)
        qkv_bias = arch == "Qwen2ForCausalLM" or bool(c.get("attention_bias"))
        o_bias = arch != "Qwen2ForCausalLM" and bool(c.get("attention_bias"))
        mlp_bias = arch == "LlamaForCausalLM" and bool(c.get("mlp_bias"))
        win = c.get("sliding_window")
        if arch != "MistralForCausalLM" and not c.get("use_sliding_window"):
            win = None
        types = c.get("layer_types")
        self.layers = []
        for i in range(L):
            p = f"model.layers.{i}."
            g = lambda n, s, want=True: ck.get(p + n, s, dt) if want else None  # noqa: E731
            w = {"in_norm": g("input_layernorm.weight", [D]), "post_norm": g("post_attention_layernorm.weight", [D]),
                 "q": g("self_attn.q_proj.weight", [H * hd, D]), "k": g("self_attn.k_proj.weight", [KV * hd, D]),
                 "v": g("self_attn.v_proj.weight", [KV * hd, D]), "o": g("self_attn.o_proj.weight", [D, H * hd]),
                 "qb": g("self_attn.q_proj.bias", [H * hd], qkv_bias),
                 "kb": g("self_attn.k_proj.bias", [KV * hd], qkv_bias),
                 "vb": g("self_attn.v_proj.bias", [KV * hd], qkv_bias), "ob": g("self_attn.o_proj.bias", [D], o_bias),
                 "qn": g("self_attn.q_norm.weight", [hd], arch == "Qwen3ForCausalLM"),
                 "kn": g("self_attn.k_norm.weight", [hd], arch == "Qwen3ForCausalLM"),
                 "gate": g("mlp.gate_proj.weight", [F, D]), "up": g("mlp.up_proj.weight", [F, D]),
                 "down": g("mlp.down_proj.weight", [D, F]), "gb": g("mlp.gate_proj.bias", [F], mlp_bias),
                 "ub": g("mlp.up_proj.bias", [F], mlp_bias), "db": g("mlp.down_proj.bias", [D], mlp_bias)}
            if types is not None:
                w["window"] = win if types[i] == "sliding_attention" else None
            elif arch == "MistralForCausalLM":
                w["window"] = win
            else:
                w["window"] = win if win is not None and i >= c.get("max_window_layers", 0) else None
            self.layers.append(w)
        self.cache = [(np.zeros((KV, 0, hd), dt), np.zeros((KV, 0, hd), dt)) for _ in range(L)]

    def round_kv(self, x):
        if self.kv_dtype == "bf16":
            return to_bf16(x.astype(np.float32)).astype(self.dt)
        if self.kv_dtype == "fp16":
            return x.astype(np.float16).astype(self.dt)
        return x

    def forward(self, ids):
        """Runs tokens ids at the positions after those cached; returns their logits [n, vocab]."""
        dt, H, KV, hd = self.dt, self.H, self.KV, self.hd
        n, pos0 = len(ids), self.cache[0][0].shape[1]
        pos = np.arange(pos0, pos0 + n, dtype=np.float64)
        ang = pos[:, None] * self.inv[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1).astype(dt)[:, None, :]  # [n, 1, hd]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1).astype(dt)[:, None, :]

        def rope(x):  # x [n, heads, hd]; rotate_half(x) = (-x2, x1)
            rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
            return x * cos + rot * sin

        def lin(x, w, b):
            y = x @ w.T
            return y + b if b is not None else y

        qpos = np.arange(pos0, pos0 + n)[:, None]
        x = self.embed[np.asarray(ids)]
        for li, w in enumerate(self.layers):
            h = rms_norm(x, w["in_norm"], self.eps, dt)
            q = lin(h, w["q"], w["qb"]).reshape(n, H, hd)
            k = lin(h, w["k"], w["kb"]).reshape(n, KV, hd)
            v = lin(h, w["v"], w["vb"]).reshape(n, KV, hd)
            if w["qn"] is not None:
                q, k = rms_norm(q, w["qn"], self.eps, dt), rms_norm(k, w["kn"], self.eps, dt)
            q, k = rope(q), self.round_kv(rope(k))
            v = self.round_kv(v)
            kc = np.concatenate([self.cache[li][0], k.transpose(1, 0, 2)], axis=1)  # [KV, T, hd]
            vc = np.concatenate([self.cache[li][1], v.transpose(1, 0, 2)], axis=1)
            self.cache[li] = (kc, vc)
            kpos = np.arange(kc.shape[1])[None, :]
            allowed = kpos <= qpos
            if w["window"] is not None:
                allowed &= (qpos - kpos) < w["window"]
            rep = H // KV
            qh = q.transpose(1, 0, 2).reshape(KV, rep * n, hd)  # heads h = g * rep + r share KV head g
            s = (qh @ kc.transpose(0, 2, 1)).reshape(KV, rep, n, -1) * dt(1.0 / math.sqrt(hd))
            s = np.where(allowed, s, dt(-np.inf))
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            p = s / s.sum(axis=-1, keepdims=True)
            a = (p.reshape(KV, rep * n, -1) @ vc).reshape(H, n, hd).transpose(1, 0, 2).reshape(n, H * hd)
            x = x + lin(a, w["o"], w["ob"])
            h = rms_norm(x, w["post_norm"], self.eps, dt)
            g, u = lin(h, w["gate"], w["gb"]), lin(h, w["up"], w["ub"])
            x = x + lin(g / (1 + np.exp(-g)) * u, w["down"], w["db"])
        return rms_norm(x, self.norm, self.eps, dt) @ self.lm_head.T


def run(args):
    dt = np.float64 if args.float64 else np.float32
    m = Model(args.dir, dt, args.kv_dtype)
    try:
        prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip() != ""]
    except ValueError:
        raise RefError(f"bad --prompt-ids {args.prompt_ids!r}")
    if not prompt or any(t < 0 or t >= m.V for t in prompt):
        raise RefError(f"--prompt-ids must be 1 or more ids in [0, {m.V})")
    if args.steps < 0 or args.top < 0:
        raise RefError("--steps and --top must be >= 0")
    last = m.forward(prompt)[-1]
    order = np.argsort(-last, kind="stable")
    out = {"tokens": [], "top": [[int(i), float(last[i])] for i in order[:args.top]], "step_top": []}
    if args.all_logits:
        out["logits"] = [float(v) for v in last]
    logits = last
    for step in range(args.steps):
        o = np.argsort(-logits, kind="stable")[:2]  # ties: the lowest id, as argmax
        gap = float(logits[o[0]] - logits[o[1]]) if len(o) > 1 else 0.0
        out["tokens"].append(int(o[0]))
        out["step_top"].append([int(o[0]), float(logits[o[0]]), gap])
        if step + 1 < args.steps:
            logits = m.forward([int(o[0])])[-1]
    return out


def main():
    ap = argparse.ArgumentParser(description="Reference forward pass of HF Llama/Mistral/Qwen2/Qwen3 checkpoints")
    ap.add_argument("dir")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--steps", type=int, default=8, help="greedy tokens to generate (0: the prompt only)")
    ap.add_argument("--top", type=int, default=5, help="top K logits of the last prompt token")
    ap.add_argument("--kv-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--all-logits", action="store_true", help="also print every logit of the last prompt token")
    ap.add_argument("--float64", action="store_true", help="compute in float64 (self-check)")
    ap.add_argument("--json", action="store_true", help="print JSON (the default output is short text)")
    args = ap.parse_args()
    try:
        out = run(args)
    except (RefError, OSError, KeyError, TypeError, ValueError, IndexError) as e:
        print(f"hf_reference: {type(e).__name__ if not isinstance(e, RefError) else 'error'}: {e}", file=sys.stderr)
        sys.exit(2)
    if args.json:
        print(json.dumps(out))
    else:
        print("tokens", " ".join(str(t) for t in out["tokens"]))
        print("top", " ".join(f"{i}:{v:.6g}" for i, v in out["top"]))


if __name__ == "__main__":
    main()
