"""A plain NumPy float64 forward pass: the test oracle for ggufrun.model.

Written for clarity, not speed: weights dequantized with gguf-py (`gguf.quants.dequantize`), the whole sequence
processed at once with full causal attention, no KV cache. Facts come from llama.cpp (src/models/llama.cpp,
qwen2.cpp, qwen3.cpp, gemma3.cpp, src/llama-graph.cpp, ggml/src/ggml-cpu/ops.cpp for rope) and are restated
here independently of ggufrun/model so that the two can be compared.

>>> from ggufrun.reader import GGUFFile
>>> logits = reference_logits(GGUFFile("small-llama-q8_0.gguf"), [1, 2, 3])  # [3, n_vocab] float64
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# Per architecture: rope layout ("norm" rotates adjacent pairs (x[2i], x[2i+1]); "neox" rotates (x[i], x[i+d/2])),
# and whether the block is gemma3-shaped.
ARCHS = {
    "llama": {"rope": "norm", "gemma": False},
    "qwen2": {"rope": "neox", "gemma": False},
    "qwen3": {"rope": "neox", "gemma": False},
    "gemma3": {"rope": "neox", "gemma": True},
}


def weight(f, name: str, rows=None) -> np.ndarray:
    """Tensor `name` of GGUFFile `f` as float64 (only `rows` of it when given)."""
    t = f.tensors[name]
    data = t.data if rows is None else t.data[rows]
    if t.type in (T.F32, T.F16):
        return data.astype(np.float64)
    return dequantize(data.view(np.uint8), t.type).astype(np.float64)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, layout: str, scale=1.0, factors=None):
    """x: [T, n_heads, head_dim]; rotates the first n_rot dims of every head (ggml_rope_ext without YaRN)."""
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)  # [n_rot/2]
    if factors is not None:
        inv_freq = inv_freq / factors
    theta = pos[:, None].astype(np.float64) * inv_freq[None, :] * scale  # [T, n_rot/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if layout == "norm":
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    else:
        h = n_rot // 2
        a, b = x[..., :h], x[..., h:n_rot]
        out[..., :h] = a * cos - b * sin
        out[..., h:n_rot] = a * sin + b * cos
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def reference_logits(f, tokens) -> np.ndarray:
    """Logits [len(tokens), n_vocab] (float64) after each token of `tokens`, positions 0.. (a fresh context)."""
    md = f.metadata
    arch = md["general.architecture"]
    spec = ARCHS[arch]

    def key(k, default=None):
        return md.get(f"{arch}.{k}", default)

    n_layer = key("block_count")
    dim = key("embedding_length")
    n_head = key("attention.head_count")
    n_kv = key("attention.head_count_kv", n_head)
    hd_k = key("attention.key_length", dim // n_head)
    hd_v = key("attention.value_length", dim // n_head)
    n_rot = key("rope.dimension_count", hd_k)
    eps = key("attention.layer_norm_rms_epsilon")
    base = key("rope.freq_base", 10000.0)
    factor = key("rope.scaling.factor", 0.0) or 1.0
    scale = 1.0 / factor if key("rope.scaling.type", "linear") == "linear" else 1.0
    window = key("attention.sliding_window", 0)
    factors = weight(f, "rope_freqs.weight") if "rope_freqs.weight" in f.tensors else None

    ids = np.asarray(tokens, dtype=np.int64)
    n = len(ids)
    pos = np.arange(n)
    x = weight(f, "token_embd.weight", ids)  # [T, dim]
    if spec["gemma"]:
        x = x * np.sqrt(dim)
    causal = pos[None, :] <= pos[:, None]  # [Tq, Tk]

    for il in range(n_layer):

        def w(name, il=il):
            return weight(f, f"blk.{il}.{name}")

        def has(name, il=il):
            return f"blk.{il}.{name}" in f.tensors

        # gemma3: 5 sliding-window layers then 1 global (llama_hparams::set_swa_pattern with n_pattern 6)
        local = spec["gemma"] and window > 0 and il % 6 < 5
        h = rmsnorm(x, w("attn_norm.weight"), eps)
        q, k, v = h @ w("attn_q.weight").T, h @ w("attn_k.weight").T, h @ w("attn_v.weight").T
        if has("attn_q.bias"):
            q, k, v = q + w("attn_q.bias"), k + w("attn_k.bias"), v + w("attn_v.bias")
        q, k, v = q.reshape(n, n_head, hd_k), k.reshape(n, n_kv, hd_k), v.reshape(n, n_kv, hd_v)
        if has("attn_q_norm.weight"):
            q = rmsnorm(q, w("attn_q_norm.weight"), eps)
            k = rmsnorm(k, w("attn_k_norm.weight"), eps)
        b, s = (10000.0, 1.0) if local else (base, scale)
        q = rope(q, pos, n_rot, b, spec["rope"], s, factors)
        k = rope(k, pos, n_rot, b, spec["rope"], s, factors)
        mask = causal & (pos[:, None] - pos[None, :] < window) if local else causal
        group = n_head // n_kv
        att = np.empty((n, n_head, hd_v))
        for hh in range(n_head):
            kv = hh // group
            scores = q[:, hh] @ k[:, kv].T / np.sqrt(hd_k)  # [Tq, Tk]
            scores = np.where(mask, scores, -np.inf)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            att[:, hh] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
        o = att.reshape(n, n_head * hd_v) @ w("attn_output.weight").T
        if spec["gemma"]:
            o = rmsnorm(o, w("post_attention_norm.weight"), eps)
        x = x + o
        h = rmsnorm(x, w("ffn_norm.weight"), eps)
        gate, up = h @ w("ffn_gate.weight").T, h @ w("ffn_up.weight").T
        act = gelu_tanh(gate) if spec["gemma"] else silu(gate)
        o = (act * up) @ w("ffn_down.weight").T
        if spec["gemma"]:
            o = rmsnorm(o, w("post_ffw_norm.weight"), eps)
        x = x + o

    x = rmsnorm(x, weight(f, "output_norm.weight"), eps)
    out_name = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    n_vocab = f.tensors[out_name].shape[0]
    logits = np.empty((n, n_vocab))
    step = 8192  # dequantize a large vocabulary in slices
    for r in range(0, n_vocab, step):
        logits[:, r : r + step] = x @ weight(f, out_name, slice(r, r + step)).T
    cap = key("final_logit_softcapping", 0.0)
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits
