"""Model hyper-parameters read from GGUF metadata, and what differs between the supported architectures.

Metadata keys are used as GGUF names them (`{arch}.block_count`, `{arch}.attention.head_count_kv`, ...);
defaults and derived values follow llama.cpp (src/llama-model.cpp `load_hparams`, src/llama-context.cpp for
rope scaling, src/models/<arch>.cpp for the per-architecture facts: phi3.cpp, gemma2.cpp, gemma3.cpp, ...).

Every key is checked before anything is built from it: its type (an integer key must hold an integer type, never a
bool, a float or a string; a float key a finite number), its range (counts at least 1 and at most what llama.cpp's
uint32_t fields hold, at most LLAMA_MAX_LAYERS = 512 blocks as in src/llama-hparams.h), and, for
`block_count` and `embedding_length`, the tensors in the file, so that a forged count fails here in
microseconds instead of sizing an allocation. Keys that llama.cpp reads per layer (`get_key_or_arr`:
feed_forward_length, attention.head_count, attention.head_count_kv) may be arrays of one entry per block; ggufrun
needs the entries equal. Any violation is a GGUFError naming the key and its value; weights.py then checks every
tensor's shape against the config.

Mixture of experts (`_experts`): `expert_count` (at most LLAMA_MAX_EXPERTS = 1024), `expert_used_count` (1 ..
expert_count), `expert_feed_forward_length` and `expert_shared_feed_forward_length`, with llama.cpp's defaults
(src/models/{qwen2moe,qwen3moe,llama}.cpp). Gating and weight normalisation are per-architecture constants in llama.cpp
for these architectures (build_moe_ffn's gating_op and norm_w arguments), so they live in ArchSpec, not in metadata.
"""

from __future__ import annotations

import math
import re
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
    # the rest holds for a few architectures only
    swa_window_default: int = 0  # attention.sliding_window when the key is absent (gemma2: 4096)
    swa_rope_global: bool = False  # local layers default to the global rope base and scale (gemma2), else 10000, 1
    attn_softcap: bool = False  # scores = c * tanh(scores / c) before the mask and softmax, c = attn_logit_softcapping
    final_softcap_default: float = 0.0  # final_logit_softcapping when the key is absent (gemma2: 30); 0 = none
    tied_output: bool = False  # the output matrix is always token_embd (an output.weight would go unused: gemma2)
    fused_gate_up: bool = False  # ffn_up holds [gate; up] rows ([2 n_ff, n_embd]) and there is no ffn_gate (phi3)
    longrope: bool = False  # rope_factors_long / rope_factors_short divide the rope frequencies (phi3, LongRoPE)
    attn_scale_embd_blocks: int = 0  # block count of the variant (the 27B) whose queries are scaled by
    # 1/sqrt(n_embd / n_head) instead of 1/sqrt(key_length); 0: none
    # mixture of experts (src/llama-graph.cpp build_moe_ffn, called with these per-architecture constants):
    # "none": dense FFN; "optional": experts in every block when {arch}.expert_count > 0 (llama: Mixtral);
    # "always": every block routes (qwen2moe, qwen3moe; the experts' width is {arch}.expert_feed_forward_length)
    experts: str = "none"
    expert_gating: str = "softmax"  # router logits -> probabilities: "softmax" or "sigmoid" (gating_op)
    expert_weights_norm: bool = False  # the chosen experts' probabilities divided by their sum (norm_w)
    shared_expert: bool = False  # plus an always-on expert (ffn_*_shexp) times sigmoid(ffn_gate_inp_shexp . x)


ARCHS = {
    # src/models/llama.cpp: LLAMA_ROPE_TYPE_NORM (llama.cpp's converter permutes Q/K rows for adjacent pairs);
    # with expert_count > 0 its MoE branch: softmax gating, norm_w true, experts as wide as feed_forward_length
    "llama": ArchSpec(
        rope_neox=False,
        qk_norm=False,
        post_norms=False,
        gelu=False,
        embed_scale=False,
        swa_pattern=None,
        experts="optional",
        expert_weights_norm=True,
    ),
    # src/models/qwen2.cpp: Q/K/V biases (optional tensors), NEOX rope
    "qwen2": ArchSpec(rope_neox=True, qk_norm=False, post_norms=False, gelu=False, embed_scale=False, swa_pattern=None),
    # src/models/qwen3.cpp: Q/K norm before rope
    "qwen3": ArchSpec(rope_neox=True, qk_norm=True, post_norms=False, gelu=False, embed_scale=False, swa_pattern=None),
    # src/models/gemma3.cpp; load_swa_pattern(ml, 6): layers with il % 6 < 5 use the sliding window
    "gemma3": ArchSpec(
        rope_neox=True, qk_norm=True, post_norms=True, gelu=True, embed_scale=True, swa_pattern=6,
        attn_scale_embd_blocks=62,
    ),
    # src/models/phi3.cpp: llama-style block with NEOX rope; Q/K/V in one attn_qkv (split by rows: each output row
    # is its own dot product, so the split matrix gives llama.cpp's fused product), gate and up in one ffn_up
    # (ggml_swiglu: the first half is the gate); LongRoPE factors (llama_model::get_rope_factors). llama.cpp
    # ignores a phi3 file's attention.sliding_window ("Phi SWA is currently disabled"), and so does ggufrun.
    "phi3": ArchSpec(
        rope_neox=True, qk_norm=False, post_norms=False, gelu=False, embed_scale=False, swa_pattern=None,
        fused_gate_up=True, longrope=True,
    ),
    # src/models/gemma2.cpp: gemma3's block without Q/K norms; load_swa_pattern(ml, 2) (even layers local), window
    # 4096 unless set, attention-logit soft-capping (default 50) and final-logit soft-capping (default 30,
    # src/llama-hparams.h), output tied to token_embd, the 27B (46 blocks) scales queries by n_embd / n_head
    "gemma2": ArchSpec(
        rope_neox=True, qk_norm=False, post_norms=True, gelu=True, embed_scale=True, swa_pattern=2,
        swa_window_default=4096, swa_rope_global=True, attn_softcap=True, final_softcap_default=30.0,
        tied_output=True, attn_scale_embd_blocks=46,
    ),
    # src/models/qwen2moe.cpp: qwen2's block with softmax-routed experts (norm_w false) and a gated shared expert
    "qwen2moe": ArchSpec(
        rope_neox=True,
        qk_norm=False,
        post_norms=False,
        gelu=False,
        embed_scale=False,
        swa_pattern=None,
        experts="always",
        shared_expert=True,
    ),
    # src/models/qwen3moe.cpp: qwen3's block with softmax-routed experts, weights normalised (norm_w true)
    "qwen3moe": ArchSpec(
        rope_neox=True,
        qk_norm=True,
        post_norms=False,
        gelu=False,
        embed_scale=False,
        swa_pattern=None,
        experts="always",
        expert_weights_norm=True,
    ),
}  # fmt: skip
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
    attn_logit_softcap: float  # {arch}.attn_logit_softcapping (architectures with spec.attn_softcap); 0 = none
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
    rope_freq_base_swa: float  # {arch}.rope.freq_base_swa (default 10000, src/llama-hparams.h; gemma2: the global)
    rope_freq_scale_swa: float  # 1 (gemma2: the global rope_freq_scale)
    rope_freq_base_swa: float  # {arch}.rope.freq_base_swa (default 10000, src/llama-hparams.h)
    # mixture of experts (all 0 for a dense model): each token runs n_expert_used of n_expert SwiGLU experts
    n_expert: int  # {arch}.expert_count
    n_expert_used: int  # {arch}.expert_used_count: experts per token (top-k of the router's probabilities)
    n_ff_exp: int  # width of one expert: {arch}.expert_feed_forward_length (default n_ff / n_expert_used); llama: n_ff
    n_ff_shexp: int  # width of the shared expert: {arch}.expert_shared_feed_forward_length (default n_ff); 0: none

    @property
    def n_ctx_default(self) -> int:
        return min(4096, self.n_ctx_train)

    @classmethod
    def from_gguf(cls, gguf) -> ModelConfig:
        """Read the config of GGUFFile `gguf`; GGUFError names a missing or malformed key and its value."""
        arch = gguf.metadata.get("general.architecture")
        if not isinstance(arch, str) or arch not in ARCHS:
            raise GGUFError(
                f"{gguf.path}: architecture {_show(arch)} is not supported; supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        spec = ARCHS[arch]
        md = _Metadata(gguf, arch)

        # counts first, each against the tensors present, before anything is sized by them
        n_layer = md.integer("block_count", hi=MAX_LAYERS)
        n_blocks = _blocks_in(gguf.tensors)
        if n_layer != n_blocks:
            found = f"tensors for {n_blocks} blocks (blk.0 .. blk.{n_blocks - 1})" if n_blocks else "no blk.N tensors"
            raise md.error("block_count", n_layer, f"but the file has {found}")
        out = gguf.tensors.get("output.weight") or gguf.tensors.get("token_embd.weight")
        embd = gguf.tensors.get("token_embd.weight")
        if out is None or embd is None:
            raise GGUFError(f"{gguf.path}: tensor 'token_embd.weight' is missing")
        n_embd = md.integer("embedding_length")
        if embd.shape[-1] != n_embd:
            raise md.error("embedding_length", n_embd, f"but token_embd.weight has shape {tuple(embd.shape)}")

        n_head = md.integer("attention.head_count", per_layer=n_layer)
        n_head_kv = md.integer("attention.head_count_kv", n_head, hi=n_head, per_layer=n_layer)
        if n_head % n_head_kv:
            raise md.error(
                "attention.head_count_kv", n_head_kv, f"must divide attention.head_count ({n_head}): queries share K/V"
            )
        # llama.cpp: n_embd_head_k = n_embd / n_head unless key_length says otherwise
        head_dim_k = md.integer("attention.key_length", n_embd // n_head)
        head_dim_v = md.integer("attention.value_length", n_embd // n_head)
        n_rot = md.integer("rope.dimension_count", head_dim_k, lo=2, hi=head_dim_k)
        if n_rot % 2:
            raise md.error("rope.dimension_count", n_rot, "must be even: rope rotates pairs of dimensions")
        n_ctx_train = md.integer("context_length", 2048)

        # rope scaling (src/llama-model.cpp load_hparams, src/llama-context.cpp)
        scaling = md.choice("rope.scaling.type", "linear", choices=("none", "linear", "yarn"))
        factor_key = "rope.scaling.factor" if md.has("rope.scaling.factor") else "rope.scale_linear"
        factor = md.number(factor_key, 0.0, lo=0.0)  # 0: not set
        freq_scale = 1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor
        # YaRN: llama.cpp reads no yarn_* keys for these architectures; ext_factor is 1 exactly when the type is yarn
        ext_factor = 1.0 if scaling == "yarn" else 0.0
        attn_factor = md.number("rope.scaling.attn_factor", 1.0, lo=0.0, lo_open=True, hi=MAX_ATTN_FACTOR)
        if scaling != "none" and 0.0 < factor < 1.0:
            # below 1 positions would be stretched apart, which no model is trained for; tiny factors overflow the
            # float32 angles to inf (NaN logits), and YaRN would divide by 1 + 0.1 ln(factor) <= 0
            raise md.error(factor_key, factor, f"must be 0 (unset) or >= 1 with {scaling} rope scaling")
        if ext_factor != 0.0:
            # src/llama-context.cpp: get_mscale(factor) / (1 + 0.1 ln factor), because ggml's rope multiplies cos/sin
            # by 1 + 0.1 ln(1 / freq_scale) itself whenever ext_factor != 0 (see rope.py)
            ln_factor = math.log(1.0 / freq_scale)
            attn_factor *= (1.0 + 0.1 * ln_factor if ln_factor > 0 else 1.0) / (1.0 + 0.1 * ln_factor)

        window = md.integer("attention.sliding_window", spec.swa_window_default, lo=0)
        swa_layers = (False,) * n_layer
        if spec.swa_pattern is not None and window > 0:
            swa_layers = md.swa_layers(n_layer, spec.swa_pattern)
        else:
            window = 0

        n_ff = md.integer("feed_forward_length", per_layer=n_layer, **({"lo": 0} if spec.experts == "always" else {}))
        moe = _experts(md, spec, n_layer, n_ff)

        if n_layer == spec.attn_scale_embd_blocks:
            # src/models/gemma{2,3}.cpp: the 27B model scales queries by n_embd / n_head, not key_length
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        else:
            attn_scale = 1.0 / math.sqrt(head_dim_k)
        # src/llama-graph.cpp build_attn_mha: kq = c * tanh(kq * (1/c)) when hparams.attn_soft_cap
        attn_softcap = md.softcap("attn_logit_softcapping", 50.0, zero_ok=False) if spec.attn_softcap else 0.0
        rope_freq_base = md.number("rope.freq_base", 10000.0, lo=1.0, lo_open=True)
        # gemma2.cpp: rope_freq_base_train_swa = rope_freq_base_train before reading rope.freq_base_swa
        base_swa_default = rope_freq_base if spec.swa_rope_global else 10000.0

        return cls(
            arch=arch,
            spec=spec,
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_rot=n_rot,
            n_vocab=out.shape[0],
            n_ctx_train=n_ctx_train,
            # eps is added to a mean of squares: 0 divides by zero on a zero row, >= 1 swamps the activations
            rms_eps=md.number("attention.layer_norm_rms_epsilon", lo=0.0, lo_open=True, hi=1.0, hi_open=True),
            attn_scale=attn_scale,
            final_logit_softcap=md.softcap("final_logit_softcapping", spec.final_softcap_default),  # 0: none
            attn_logit_softcap=attn_softcap,
            # base <= 1 would make the frequencies grow with the dimension (or all equal)
            rope_freq_base=rope_freq_base,
            rope_freq_scale=freq_scale,
            rope_scaling_type=scaling,
            rope_has_freq_factors="rope_freqs.weight" in gguf.tensors,
            yarn_orig_ctx=md.integer("rope.scaling.original_context_length", n_ctx_train),
            yarn_ext_factor=ext_factor,
            yarn_attn_factor=attn_factor,
            yarn_beta_fast=32.0,  # src/llama-hparams.h defaults
            yarn_beta_slow=1.0,
            sliding_window=window,
            swa_layers=swa_layers,
            rope_freq_base_swa=md.number("rope.freq_base_swa", base_swa_default, lo=1.0, lo_open=True),
            rope_freq_scale_swa=freq_scale if spec.swa_rope_global else 1.0,
            **moe,
        )


MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h): llama.cpp sizes its per-layer arrays by it
MAX_COUNT = 2**32 - 1  # llama.cpp holds every count, length and window as uint32_t
MAX_FLOAT = float(np.finfo(np.float32).max)  # llama.cpp reads these keys as float (float32)
MIN_SOFTCAP = 2.0**-126  # the smallest normal float32: its reciprocal still fits in a float32
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS (src/llama-hparams.h)
MAX_ATTN_FACTOR = 10.0  # multiplies Q and K alike, so the attention scores by its square; real files hold ~1
_REQUIRED = object()
_BLOCK = re.compile(r"blk\.(\d+)\.")


def _experts(md: _Metadata, spec: ArchSpec, n_layer: int, n_ff: int) -> dict:
    """The mixture-of-experts fields of ModelConfig, as src/llama-model.cpp load_hparams and the architecture's
    load_arch_hparams / load_arch_tensors read them: expert_count (at most LLAMA_MAX_EXPERTS), expert_used_count
    (1 .. expert_count; per block or one value), the expert and shared-expert widths."""
    none = dict(n_expert=0, n_expert_used=0, n_ff_exp=0, n_ff_shexp=0)
    if spec.experts == "none":
        return none
    required = spec.experts == "always"
    n_expert = md.integer("expert_count", _REQUIRED if required else 0, lo=1 if required else 0, hi=MAX_EXPERTS)
    if n_expert == 0:
        return none
    n_used = md.integer("expert_used_count", hi=n_expert, per_layer=n_layer)
    if required:  # qwen2moe / qwen3moe: n_ff_exp = expert_feed_forward_length, else n_ff / n_expert_used
        n_ff_exp = md.integer("expert_feed_forward_length", n_ff // n_used, per_layer=n_layer)
    else:  # llama: the experts are feed_forward_length wide
        n_ff_exp = n_ff
    n_ff_shexp = md.integer("expert_shared_feed_forward_length", n_ff) if spec.shared_expert else 0
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp)


def _blocks_in(tensors) -> int:
    """1 + the highest N of the `blk.N.*` tensors (0 if none): the block count the tensors imply."""
    highest = -1
    for name in tensors:
        m = _BLOCK.match(name)
        if m:
            highest = max(highest, int(m.group(1)))
    return highest + 1


def _show(value) -> str:
    """A metadata value for an error message, short even for a long array."""
    if isinstance(value, (np.ndarray, list)):
        items = value.reshape(-1)[:8].tolist() if isinstance(value, np.ndarray) else value[:8]
        kind = f"{value.dtype} array" if isinstance(value, np.ndarray) else "array"
        more = ", ..." if len(value) > 8 else ""
        return f"[{', '.join(_show(v) for v in items)}{more}] ({len(value)}-entry {kind})"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value) -> bool:
    return _is_int(value) or isinstance(value, (float, np.floating))


class _Metadata:
    """Typed, range-checked reads of one file's `{arch}.*` keys; every failure is a GGUFError naming key and value."""

    def __init__(self, gguf, arch: str):
        self.gguf, self.arch, self.md = gguf, arch, gguf.metadata

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.md

    def error(self, key: str, value, why: str) -> GGUFError:
        return GGUFError(f"{self.gguf.path}: metadata key {self.arch}.{key} = {_show(value)} {why}")

    def _get(self, key: str, default):
        full = f"{self.arch}.{key}"
        if full in self.md:
            return self.md[full], True
        if default is _REQUIRED:
            raise GGUFError(f"{self.gguf.path}: metadata key {full!r} is missing")
        return default, False

    def integer(self, key: str, default=_REQUIRED, *, lo: int = 1, hi: int = MAX_COUNT, per_layer: int | None = None):
        """An integer in [lo, hi]; with per_layer=n an array of n equal entries is read as its one value."""
        value, present = self._get(key, default)
        if present and isinstance(value, np.ndarray) and per_layer is not None:
            if value.dtype.kind not in "iu":
                raise self.error(key, value, f"must be integers (one per block), got a {value.dtype} array")
            if value.size != per_layer:
                raise self.error(key, value, f"has {value.size} entries, expected one per block ({per_layer})")
            if np.any(value != value[0]):
                raise self.error(key, value, "varies per block; ggufrun needs the same value in every block")
            value = value[0].item()
        if not _is_int(value):
            what = "an array" if isinstance(value, (np.ndarray, list)) else type(value).__name__
            raise self.error(key, value, f"must be an integer, got {what}")
        value = int(value)
        if not lo <= value <= hi:
            derived = "" if present else " (the key is absent; this is the default derived from other keys)"
            raise self.error(key, value, f"is out of range: expected {lo} .. {hi}{derived}")
        return value

    def number(
        self,
        key: str,
        default=_REQUIRED,
        *,
        lo: float,
        hi: float = MAX_FLOAT,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float:
        """A finite number in the range lo .. hi (open or closed at each end), as float32 and as given."""
        value, _ = self._get(key, default)
        if not _is_number(value):
            what = "an array" if isinstance(value, (np.ndarray, list)) else type(value).__name__
            raise self.error(key, value, f"must be a number, got {what}")
        value = float(value)
        as_f32 = float(np.float32(value)) if abs(value) <= MAX_FLOAT else math.inf
        ok = all(
            math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
            for v in (value, as_f32)
        )
        if not ok:
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise self.error(key, value, f"is out of range: expected a finite number in {interval}")
        return value

    def softcap(self, key: str, default: float, zero_ok: bool = True) -> float:
        """A soft-capping constant c (x -> c * tanh(x * (1/c))): 0 (none, where zero_ok) or at least MIN_SOFTCAP,
        so that 1/c is a finite float32 (a smaller one would turn a zero score into 0 * inf = NaN)."""
        value = self.number(key, default, lo=0.0, lo_open=not zero_ok)
        if 0.0 < value < MIN_SOFTCAP:
            raise self.error(key, value, f"is out of range: expected {'0 (none) or ' if zero_ok else ''}>= 2^-126")
        return value

    def choice(self, key: str, default, *, choices: tuple[str, ...]) -> str:
        value, _ = self._get(key, default)
        if not isinstance(value, str) or value not in choices:
            raise self.error(key, value, f"is not supported (supported: {', '.join(choices)})")
        return value

    def swa_layers(self, n_layer: int, default_pattern: int) -> tuple[bool, ...]:
        """Per layer: uses the sliding window. `attention.sliding_window_pattern` is one flag per layer or n, where
        the last layer of every group of n is global (llama_hparams::set_swa_pattern; 0: every layer local)."""
        key = "attention.sliding_window_pattern"
        value, present = self._get(key, default_pattern)
        if present and isinstance(value, np.ndarray):
            if value.dtype.kind not in "biu" or value.size != n_layer:
                raise self.error(key, value, f"must hold one flag (bool or 0/1) per block ({n_layer})")
            if value.dtype.kind != "b" and np.any((value != 0) & (value != 1)):
                raise self.error(key, value, "must hold flags: 0 (global) or 1 (sliding window)")
            return tuple(bool(p) for p in value)
        n = self.integer(key, default_pattern, lo=0)
        return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))
