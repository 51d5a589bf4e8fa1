"""A plain NumPy float forward pass, independent of ggufrun.model: the oracle the tests and `ggufrun perplexity
--reference` compare the Numba runtime against.

Written for clarity, not speed: weights dequantized with gguf-py (`gguf.quants.dequantize`, not ggufrun.quants),
the whole sequence processed at once with full causal attention, no KV cache and no activation quantization (the
runtime rounds activations to 8 bits for its integer dot products and keeps K/V in float16; this pass does
neither). Facts come from llama.cpp (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, phi3.cpp, gemma2.cpp, gemma3.cpp,
src/llama-graph.cpp for the FFN and attention soft-capping, src/llama-hparams.cpp for the sliding-window pattern,
src/llama-model.cpp for the LongRoPE factor choice, src/llama-context.cpp for the rope attention factor and the
context padding, ggml/src/ggml-cpu/ops.cpp for rope) and are restated here independently of ggufrun/model so that
the two can be compared. YaRN rope scaling is not implemented here.

>>> from ggufrun.reader import GGUFFile
>>> ref = ReferenceModel(GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf"), dtype=np.float32)
>>> logits = ref.logits([1, 2, 3])  # [3, n_vocab] in ref.dtype; weights are dequantized once and kept
>>> logits = reference_logits(GGUFFile("small-llama-q8_0.gguf"), [1, 2, 3])  # float64, nothing kept
>>> phi3 = ReferenceModel(GGUFFile("small-phi3-longrope-q8_0.gguf"), n_ctx=256)  # LongRoPE factors for n_ctx 256
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# Per architecture: rope layout ("norm" rotates adjacent pairs (x[2i], x[2i+1]); "neox" rotates (x[i], x[i+d/2]);
# src/llama-model.cpp llama_model_rope_type), and whether the block is gemma-shaped (embedding scale sqrt(dim),
# post-attention and post-FFN norms, GELU; src/models/gemma2.cpp, gemma3.cpp). phi3 is the llama block with NEOX
# rope, fused tensors (found by name: `attn_qkv` = [Q; K; V] rows, `ffn_up` = [gate; up] rows without `ffn_gate`)
# and LongRoPE factors; llama.cpp ignores its sliding window (src/models/phi3.cpp sets LLAMA_SWA_TYPE_NONE).
ARCHS = {
    "llama": {"rope": "norm", "gemma": False},
    "qwen2": {"rope": "neox", "gemma": False},
    "qwen3": {"rope": "neox", "gemma": False},
    "phi3": {"rope": "neox", "gemma": False},
    "gemma2": {"rope": "neox", "gemma": True},
    "gemma3": {"rope": "neox", "gemma": True},
    "qwen2moe": {"rope": "neox", "gemma": False},
    "qwen3moe": {"rope": "neox", "gemma": False},
}
# The sliding-window facts of the gemma blocks (src/models/gemma2.cpp, gemma3.cpp load_arch_hparams):
# - window: the window when `attention.sliding_window` is absent (gemma2: 4096; gemma3: none, then every layer is
#   global);
# - pattern: the period n of `attention.sliding_window_pattern`'s default (n - 1 local layers, then one global);
# - rope_swa: the rope base of the local layers: gemma2 takes the global base and linear scale (unless
#   `rope.freq_base_swa` is set), gemma3 its own base (`rope.freq_base_swa`, default 10000) without scaling.
SLIDING = {
    "gemma2": {"window": 4096, "pattern": 2, "rope_swa": "global"},
    "gemma3": {"window": 0, "pattern": 6, "rope_swa": "own"},
}
# Soft-capping x -> cap * tanh(x / cap) (gemma2.cpp sets hparams.attn_soft_cap; llama-graph.cpp build_attn_mha
# caps the scaled attention scores before the mask and softmax; the model graph caps the final logits). The
# defaults when the key is absent are src/llama-hparams.h's (attention 50, final 30), which gemma2 always applies;
# gemma3 caps the final logits only when its key is present and non-zero, and no other architecture caps.
ATTN_SOFTCAP_DEFAULT = {"gemma2": 50.0}
FINAL_SOFTCAP_DEFAULT = {"gemma2": 30.0, "gemma3": 0.0}
# Query scale 1/sqrt(n_embd / n_head) instead of 1/sqrt(key_length) for the 27B models of these blocks (gemma2.cpp,
# gemma3.cpp: type LLM_TYPE_27B, identified by its block count)
QUERY_SCALE_BY_DIM = {"gemma2": 46, "gemma3": 62}
CTX_PAD = 256  # src/llama-context.cpp rounds n_ctx (and the per-sequence context) up to a multiple of 256
# Mixture-of-experts blocks (a `ffn_gate_inp` router; src/llama-graph.cpp build_moe_ffn as src/models/llama.cpp,
# qwen2moe.cpp, qwen3moe.cpp call it): softmax over the router logits, the top n_expert_used experts, their
# probabilities divided by their sum except in qwen2moe, whose shared expert adds sigmoid(gate_inp_shexp . h) x
# its own SwiGLU output.
EXPERT_WEIGHTS_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True}


def weight(f, name: str, rows=None, dtype=np.float64) -> np.ndarray:
    """Tensor `name` of GGUFFile `f` as `dtype` (only `rows` of it when given)."""
    t = f.tensors[name]
    data = t.data if rows is None else t.data[rows]
    if t.type in (T.F32, T.F16):
        return data.astype(dtype)
    return dequantize(data.view(np.uint8), t.type).astype(dtype, copy=False)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, layout: str, scale=1.0, factors=None, mscale=1.0):
    """x: [T, n_heads, head_dim]; rotates the first n_rot dims of every head (ggml_rope_ext without YaRN): angle
    pos * scale * base^(-2i/n_rot) / factors[i], cos and sin multiplied by mscale (ggml's attn_factor)."""
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)  # [n_rot/2]
    if factors is not None:
        inv_freq = inv_freq / factors
    theta = pos[:, None].astype(np.float64) * inv_freq[None, :] * scale  # [T, n_rot/2]
    cos = (np.cos(theta) * mscale)[:, None, :].astype(x.dtype)
    sin = (np.sin(theta) * mscale)[:, None, :].astype(x.dtype)
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
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))  # keeps x's dtype


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): x squashed into (-cap, cap) (ggml_scale, ggml_tanh, ggml_scale)."""
    return cap * np.tanh(x / cap)


class ReferenceModel:
    """The float forward pass of one GGUF file. dtype: np.float64 (the test oracle) or np.float32 (a base for
    `ggufrun perplexity --reference`: half the memory, BLAS speed; its rounding is far below the runtime's 8-bit
    activations). keep=True dequantizes each weight once and keeps it (the whole model in `dtype`); keep=False
    dequantizes on every call (nothing held between calls). n_ctx: the context size the model would run with,
    which picks phi3's LongRoPE factors as llama_model::get_rope_factors does (the long ones when n_ctx, padded to
    a multiple of 256, exceeds `rope.scaling.original_context_length`); default: the trained context length (what
    llama.cpp runs with for n_ctx 0). It does not limit the length of `logits`' input."""

    def __init__(self, f, dtype=np.float64, keep: bool = True, n_ctx: int | None = None):
        self.f, self.dtype, self.keep = f, np.dtype(dtype), keep
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        md = f.metadata
        arch = md["general.architecture"]
        if arch not in ARCHS:
            raise ValueError(f"the reference forward pass knows {', '.join(ARCHS)}, not architecture {arch!r}")
        self.arch, self.spec = arch, ARCHS[arch]
        key = self._key
        self.n_layer = key("block_count")
        self.dim = key("embedding_length")
        self.n_head = key("attention.head_count")
        self.n_kv = key("attention.head_count_kv", self.n_head)
        if isinstance(self.n_head, np.ndarray):  # one entry per block, all equal (see ggufrun/model/config.py)
            self.n_head = int(self.n_head[0])
        if isinstance(self.n_kv, np.ndarray):
            self.n_kv = int(self.n_kv[0])
        self.hd_k = key("attention.key_length", self.dim // self.n_head)
        self.hd_v = key("attention.value_length", self.dim // self.n_head)
        self.n_rot = key("rope.dimension_count", self.hd_k)
        self.eps = key("attention.layer_norm_rms_epsilon")
        self.base = key("rope.freq_base", 10000.0)
        factor = key("rope.scaling.factor", 0.0) or 1.0
        self.scale = 1.0 / factor if key("rope.scaling.type", "linear") == "linear" else 1.0
        # src/llama-context.cpp: without YaRN, ggml's attn_factor is hparams.rope_attn_factor (LongRoPE's
        # sqrt(1 + ln(n_ctx_train / n_ctx_orig) / ln(n_ctx_orig)), written by the converter), on every layer
        self.mscale = key("rope.scaling.attn_factor", 1.0)
        if n_ctx is None:
            n_ctx = key("context_length")
            if n_ctx is None:
                raise ValueError(f"n_ctx not given and {arch}.context_length missing from the metadata")
        if not isinstance(n_ctx, (int, np.integer)) or isinstance(n_ctx, bool) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        self.n_ctx = int(n_ctx)
        self.rope_factors_name = self._rope_factors_name()
        sliding = SLIDING.get(arch)
        self.window = key("attention.sliding_window", sliding["window"]) if sliding else 0
        if sliding and sliding["rope_swa"] == "global":
            self.base_swa, self.scale_swa = key("rope.freq_base_swa", self.base), self.scale
        else:
            self.base_swa, self.scale_swa = key("rope.freq_base_swa", 10000.0), 1.0  # src/llama-hparams.h default
        # n - 1 sliding-window layers then 1 global per group of n (llama_hparams::set_swa_pattern; n = 0: all
        # local), or one flag per layer (llama_model_base::load_swa_pattern reads an array as it is)
        pattern = key("attention.sliding_window_pattern", sliding["pattern"] if sliding else 0)
        if isinstance(pattern, np.ndarray):
            self.local = [bool(p) and self.window > 0 for p in pattern]
        else:
            self.local = [
                self.window > 0 and (pattern == 0 or il % pattern < pattern - 1) for il in range(self.n_layer)
            ]
        q_dim = self.dim / self.n_head if QUERY_SCALE_BY_DIM.get(arch) == self.n_layer else self.hd_k
        self.attn_scale = 1.0 / math.sqrt(q_dim)
        self.attn_softcap = (
            key("attn_logit_softcapping", ATTN_SOFTCAP_DEFAULT[arch]) if arch in ATTN_SOFTCAP_DEFAULT else 0.0
        )
        self.softcap = key("final_logit_softcapping", FINAL_SOFTCAP_DEFAULT.get(arch, 0.0))
        self.out_name = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
        self.n_vocab = f.tensors[self.out_name].shape[0]
        self._kept: dict[str, np.ndarray] = {}

    def _rope_factors_name(self) -> str | None:
        """The tensor of per-frequency rope divisors (llama_model::get_rope_factors): a llama3-style `rope_freqs`
        if present, else phi3's LongRoPE `rope_factors_long` when the padded context exceeds the original one
        (`rope.scaling.original_context_length`, default the trained context) and `rope_factors_short` otherwise;
        None without such tensors."""
        if "rope_freqs.weight" in self.f.tensors:
            return "rope_freqs.weight"
        n_ctx_orig = self._key("rope.scaling.original_context_length", self._key("context_length"))
        padded = -(-self.n_ctx // CTX_PAD) * CTX_PAD
        name = "rope_factors_long.weight" if padded > n_ctx_orig else "rope_factors_short.weight"
        return name if name in self.f.tensors else None

    def _key(self, k, default=None):
        return self.f.metadata.get(f"{self.arch}.{k}", default)

    def _w(self, name: str) -> np.ndarray:
        if not self.keep:
            return weight(self.f, name, dtype=self.dtype)
        if name not in self._kept:
            self._kept[name] = weight(self.f, name, dtype=self.dtype)
        return self._kept[name]

    def _experts(self, h: np.ndarray, w, has) -> np.ndarray:
        """The mixture-of-experts FFN of one block: h [T, dim] -> [T, dim]."""
        k = int(np.max(self._key("expert_used_count")))
        logits = h @ w("ffn_gate_inp.weight").T  # [T, n_expert]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        top = np.argsort(-p, axis=1, kind="stable")[:, :k]  # ties: the lower index first
        weights = np.take_along_axis(p, top, axis=1)  # [T, k]
        if EXPERT_WEIGHTS_NORM[self.arch]:
            weights = weights / weights.sum(axis=1, keepdims=True)
        gate, up, down = w("ffn_gate_exps.weight"), w("ffn_up_exps.weight"), w("ffn_down_exps.weight")
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for r in range(k):
                e = top[t, r]
                out[t] += weights[t, r] * ((silu(gate[e] @ h[t]) * (up[e] @ h[t])) @ down[e].T)
        if has("ffn_gate_inp_shexp.weight"):
            shared = (silu(h @ w("ffn_gate_shexp.weight").T) * (h @ w("ffn_up_shexp.weight").T)) @ w(
                "ffn_down_shexp.weight"
            ).T
            out = out + shared / (1.0 + np.exp(-(h @ w("ffn_gate_inp_shexp.weight"))))[:, None]
        return out

    def logits(self, tokens) -> np.ndarray:
        """Logits [len(tokens), n_vocab] (in self.dtype) after each token of `tokens`, positions 0.. (a fresh
        context)."""
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"tokens must be a non-empty 1-D sequence of ids in [0, {self.n_vocab})")
        n, dt, eps = len(ids), self.dtype, self.eps
        n_head, n_kv, hd_k, hd_v = self.n_head, self.n_kv, self.hd_k, self.hd_v
        pos = np.arange(n)
        factors = self._w(self.rope_factors_name) if self.rope_factors_name else None
        x = weight(self.f, "token_embd.weight", ids, dtype=dt)  # [T, dim]
        if self.spec["gemma"]:
            x = x * dt.type(np.sqrt(self.dim))
        causal = pos[None, :] <= pos[:, None]  # [Tq, Tk]

        for il in range(self.n_layer):

            def w(name, il=il):
                return self._w(f"blk.{il}.{name}")

            def has(name, il=il):
                return f"blk.{il}.{name}" in self.f.tensors

            local = self.local[il]
            h = rmsnorm(x, w("attn_norm.weight"), eps)
            if has("attn_qkv.weight"):  # phi3: [Q; K; V] rows in one matrix (llm_graph_context::build_qkv)
                qkv = h @ w("attn_qkv.weight").T
                q, k, v = np.split(qkv, [n_head * hd_k, (n_head + n_kv) * hd_k], axis=1)
            else:
                q, k, v = h @ w("attn_q.weight").T, h @ w("attn_k.weight").T, h @ w("attn_v.weight").T
            if has("attn_q.bias"):
                q, k, v = q + w("attn_q.bias"), k + w("attn_k.bias"), v + w("attn_v.bias")
            q, k, v = q.reshape(n, n_head, hd_k), k.reshape(n, n_kv, hd_k), v.reshape(n, n_kv, hd_v)
            if has("attn_q_norm.weight"):
                q = rmsnorm(q, w("attn_q_norm.weight"), eps)
                k = rmsnorm(k, w("attn_k_norm.weight"), eps)
            b, s = (self.base_swa, self.scale_swa) if local else (self.base, self.scale)
            q = rope(q, pos, self.n_rot, b, self.spec["rope"], s, factors, self.mscale)
            k = rope(k, pos, self.n_rot, b, self.spec["rope"], s, factors, self.mscale)
            # a query at position p sees keys at p - window < pos <= p (LLAMA_SWA_TYPE_STANDARD)
            mask = causal & (pos[:, None] - pos[None, :] < self.window) if local else causal
            group = n_head // n_kv
            att = np.empty((n, n_head, hd_v), dt)
            for hh in range(n_head):
                kv = hh // group
                scores = (q[:, hh] @ k[:, kv].T) * dt.type(self.attn_scale)  # [Tq, Tk]
                if self.attn_softcap:
                    scores = softcap(scores, dt.type(self.attn_softcap))
                scores = np.where(mask, scores, -np.inf)
                p = np.exp(scores - scores.max(axis=1, keepdims=True))
                att[:, hh] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
            o = att.reshape(n, n_head * hd_v) @ w("attn_output.weight").T
            if self.spec["gemma"]:
                o = rmsnorm(o, w("post_attention_norm.weight"), eps)
            x = x + o
            h = rmsnorm(x, w("ffn_norm.weight"), eps)
            if has("ffn_gate_inp.weight"):
                x = x + self._experts(h, w, has)
                continue
            if has("ffn_gate.weight"):
                gate, up = h @ w("ffn_gate.weight").T, h @ w("ffn_up.weight").T
            else:  # phi3: ffn_up holds [gate; up] rows (build_ffn LLM_FFN_SWIGLU: ggml_swiglu gates by the first half)
                gate, up = np.split(h @ w("ffn_up.weight").T, 2, axis=1)
            act = gelu_tanh(gate) if self.spec["gemma"] else silu(gate)
            o = (act * up) @ w("ffn_down.weight").T
            if self.spec["gemma"]:
                o = rmsnorm(o, w("post_ffw_norm.weight"), eps)
            x = x + o

        x = rmsnorm(x, self._w("output_norm.weight"), eps)
        if self.keep:
            logits = x @ self._w(self.out_name).T
        else:
            logits = np.empty((n, self.n_vocab), dt)
            step = 8192  # dequantize a large vocabulary in slices
            for r in range(0, self.n_vocab, step):
                logits[:, r : r + step] = x @ weight(self.f, self.out_name, slice(r, r + step), dtype=dt).T
        if self.softcap:
            logits = softcap(logits, dt.type(self.softcap))
        return logits.astype(dt, copy=False)


def reference_logits(f, tokens) -> np.ndarray:
    """Logits [len(tokens), n_vocab] (float64) after each token of `tokens`, positions 0.. (a fresh context)."""
    return ReferenceModel(f, np.float64, keep=False).logits(tokens)
