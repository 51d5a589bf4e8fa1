"""Model hyper-parameters read from GGUF metadata, and what differs between the supported architectures.

Metadata keys are used as GGUF names them (`{arch}.block_count`, `{arch}.attention.head_count_kv`, ...);
defaults and derived values follow llama.cpp (src/llama-model.cpp `load_hparams`, src/llama-context.cpp for
rope scaling, src/models/<arch>.cpp for the per-architecture facts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError


@dataclass(frozen=True)
class ArchSpec:
    """The few ways the supported architectures differ; everything else is one shared block.

    Optional tensors (Q/K/V and output biases) are used wherever a file has them, as llama.cpp does.
    """

    rope_neox: bool  # rotate (x[i], x[i + n_rot/2]) ("neox"); False: adjacent pairs (x[2i], x[2i+1]) ("normal")
    qk_norm: bool  # per-head RMSNorm on Q and K before rope (attn_q_norm / attn_k_norm)
    post_norms: bool  # RMSNorm on the attention and FFN outputs before each residual add (gemma3)
    gelu: bool  # gated FFN with GELU (tanh approximation) instead of SiLU (SwiGLU)
    embed_scale: bool  # token embeddings multiplied by sqrt(embedding_length) (gemma3)
    swa_pattern: int | None  # sliding window: n-1 local layers then 1 global (0: all local); None: no window


ARCHS = {
    # src/models/llama.cpp: LLAMA_ROPE_TYPE_NORM (llama.cpp's converter permutes Q/K rows for adjacent pairs)
    "llama": ArchSpec(
        rope_neox=False, qk_norm=False, post_norms=False, gelu=False, embed_scale=False, swa_pattern=None
    ),
    # src/models/qwen2.cpp: Q/K/V biases (optional tensors), NEOX rope
    "qwen2": ArchSpec(rope_neox=True, qk_norm=False, post_norms=False, gelu=False, embed_scale=False, swa_pattern=None),
    # src/models/qwen3.cpp: Q/K norm before rope
    "qwen3": ArchSpec(rope_neox=True, qk_norm=True, post_norms=False, gelu=False, embed_scale=False, swa_pattern=None),
    # src/models/gemma3.cpp; load_swa_pattern(ml, 6): layers with il % 6 < 5 use the sliding window
    "gemma3": ArchSpec(rope_neox=True, qk_norm=True, post_norms=True, gelu=True, embed_scale=True, swa_pattern=6),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHS)


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of one model, as llama.cpp derives them from the GGUF metadata.

    Build with `ModelConfig.from_gguf(gguf_file)`; every field is plain data.
    """

    arch: str
    spec: ArchSpec
    n_layer: int  # {arch}.block_count
    n_embd: int  # {arch}.embedding_length: width of the residual stream
    n_ff: int  # {arch}.feed_forward_length: width of the FFN hidden layer
    n_head: int  # {arch}.attention.head_count
    n_head_kv: int  # {arch}.attention.head_count_kv (defaults to n_head); n_head / n_head_kv queries share a K/V
    head_dim_k: int  # {arch}.attention.key_length (defaults to n_embd / n_head)
    head_dim_v: int  # {arch}.attention.value_length (defaults to n_embd / n_head)
    n_rot: int  # {arch}.rope.dimension_count: the first n_rot dims of each head are rotated
    n_vocab: int  # rows of the output matrix (output.weight, or the tied token_embd.weight)
    n_ctx_train: int  # {arch}.context_length
    rms_eps: float  # {arch}.attention.layer_norm_rms_epsilon
    attn_scale: float  # multiplies Q.K before the softmax
    final_logit_softcap: float  # {arch}.final_logit_softcapping; 0 = none
    # rope: theta_i = pos * freq_scale * freq_base^(-2i/n_rot) / rope_freqs[i] (YaRN mixes in the unscaled theta)
    rope_freq_base: float  # {arch}.rope.freq_base (default 10000)
    rope_freq_scale: float  # 1 / {arch}.rope.scaling.factor (1 when unset or the scaling type is "none")
    rope_scaling_type: str  # {arch}.rope.scaling.type: "none", "linear" or "yarn"
    rope_has_freq_factors: bool  # a `rope_freqs.weight` tensor (llama3-style scaling) divides each frequency
    yarn_orig_ctx: int  # {arch}.rope.scaling.original_context_length (default: context_length)
    yarn_ext_factor: float  # 1 for YaRN, else 0 (src/llama-context.cpp)
    yarn_attn_factor: float  # magnitude scaling applied to cos/sin, as src/llama-context.cpp computes it
    yarn_beta_fast: float
    yarn_beta_slow: float
    # sliding-window attention (gemma3 local layers): a query at position p sees keys at p - window < pos <= p
    sliding_window: int  # {arch}.attention.sliding_window; 0 = none
    swa_layers: tuple[bool, ...]  # per layer: uses the sliding window (and the local rope base)
    rope_freq_base_swa: float  # {arch}.rope.freq_base_swa (default 10000, src/llama-hparams.h)

    @property
    def n_ctx_default(self) -> int:
        return min(4096, self.n_ctx_train)

    @classmethod
    def from_gguf(cls, gguf) -> ModelConfig:
        """Read the config of GGUFFile `gguf`; GGUFError names a missing or malformed key."""
        md = gguf.metadata
        arch = md.get("general.architecture")
        if arch not in ARCHS:
            raise GGUFError(
                f"{gguf.path}: architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        spec = ARCHS[arch]

        def get(key, default=None, kind=int):
            full = f"{arch}.{key}"
            value = md.get(full, default)
            if value is None:
                raise GGUFError(f"{gguf.path}: metadata key {full!r} is missing")
            if isinstance(value, np.ndarray):  # per-layer arrays (llama.cpp get_key_or_arr): need one value
                if value.size == 0 or np.any(value != value.flat[0]):
                    raise GGUFError(f"{gguf.path}: metadata key {full!r} varies per layer ({value}); not supported")
                value = value.flat[0].item()
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise GGUFError(f"{gguf.path}: metadata key {full!r} = {value!r} is not a {kind.__name__}") from None

        n_layer = get("block_count")
        n_embd = get("embedding_length")
        n_head = get("attention.head_count")
        n_head_kv = get("attention.head_count_kv", n_head)
        if n_layer < 1 or n_embd < 1 or n_head < 1 or n_head_kv < 1 or n_head % n_head_kv:
            raise GGUFError(
                f"{gguf.path}: bad shape: block_count {n_layer}, embedding_length {n_embd}, head_count {n_head}, "
                f"head_count_kv {n_head_kv} (head_count must be a multiple of head_count_kv)"
            )
        head_dim_k = get("attention.key_length", n_embd // n_head)
        head_dim_v = get("attention.value_length", n_embd // n_head)
        n_rot = get("rope.dimension_count", head_dim_k)
        if n_rot % 2 or n_rot > head_dim_k:
            raise GGUFError(f"{gguf.path}: rope.dimension_count {n_rot} must be even and <= key_length {head_dim_k}")

        out = gguf.tensors.get("output.weight") or gguf.tensors.get("token_embd.weight")
        if out is None:
            raise GGUFError(f"{gguf.path}: tensor 'token_embd.weight' is missing")
        n_ctx_train = get("context_length", 2048)

        # rope scaling (src/llama-model.cpp load_hparams, src/llama-context.cpp)
        scaling = get("rope.scaling.type", "linear", kind=str)
        if scaling not in ("none", "linear", "yarn"):
            raise GGUFError(f"{gguf.path}: rope.scaling.type {scaling!r} not supported (none, linear, yarn)")
        factor = get("rope.scaling.factor", md.get(f"{arch}.rope.scale_linear", 0.0), kind=float)
        freq_scale = 1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor
        # YaRN: llama.cpp reads no yarn_* keys for these architectures; ext_factor is 1 exactly when the type is yarn
        ext_factor = 1.0 if scaling == "yarn" else 0.0
        attn_factor = get("rope.scaling.attn_factor", 1.0, kind=float)
        if ext_factor != 0.0:
            # src/llama-context.cpp: get_mscale(factor) / (1 + 0.1 ln factor), because ggml's rope multiplies cos/sin
            # by 1 + 0.1 ln(1 / freq_scale) itself whenever ext_factor != 0 (see rope.py)
            ln_factor = math.log(1.0 / freq_scale)
            attn_factor *= (1.0 + 0.1 * ln_factor if ln_factor > 0 else 1.0) / (1.0 + 0.1 * ln_factor)

        window = get("attention.sliding_window", 0)
        swa_layers = tuple(False for _ in range(n_layer))
        if spec.swa_pattern is not None and window > 0:
            pattern = md.get(f"{arch}.attention.sliding_window_pattern", spec.swa_pattern)
            if isinstance(pattern, np.ndarray):  # one flag per layer
                if len(pattern) != n_layer:
                    raise GGUFError(
                        f"{gguf.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} entries, "
                        f"expected one per layer ({n_layer})"
                    )
                swa_layers = tuple(bool(p) for p in pattern)
            else:  # llama_hparams::set_swa_pattern: the last layer of every group of `pattern` is global
                n = int(pattern)
                swa_layers = tuple(n == 0 or il % n < n - 1 for il in range(n_layer))
        else:
            window = 0

        if arch == "gemma3" and n_layer == 62:
            # src/models/gemma3.cpp: the 27B model scales queries by n_embd / n_head, not key_length
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        else:
            attn_scale = 1.0 / math.sqrt(head_dim_k)

        return cls(
            arch=arch,
            spec=spec,
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=get("feed_forward_length"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_rot=n_rot,
            n_vocab=out.shape[0],
            n_ctx_train=n_ctx_train,
            rms_eps=get("attention.layer_norm_rms_epsilon", kind=float),
            attn_scale=attn_scale,
            final_logit_softcap=get("final_logit_softcapping", 0.0, kind=float),
            rope_freq_base=get("rope.freq_base", 10000.0, kind=float),
            rope_freq_scale=freq_scale,
            rope_scaling_type=scaling,
            rope_has_freq_factors="rope_freqs.weight" in gguf.tensors,
            yarn_orig_ctx=get("rope.scaling.original_context_length", n_ctx_train),
            yarn_ext_factor=ext_factor,
            yarn_attn_factor=attn_factor,
            yarn_beta_fast=32.0,  # src/llama-hparams.h defaults
            yarn_beta_slow=1.0,
            sliding_window=window,
            swa_layers=swa_layers,
            rope_freq_base_swa=get("rope.freq_base_swa", 10000.0, kind=float),
        )
