"""The model's tensors, looked up by their GGUF names and checked against the config.

Matrices stay zero-copy views into the file, wrapped with their dot kernel (linear.Linear), except those of a type
with an interleaved layout (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS on AVX-512: repack_matrices copies
them into it once and releases the file pages); only 1-D vectors (norm weights, biases) become small float32
arrays. Attribute names are the GGUF names without `blk.N.` and `.weight` (`.bias` -> `_bias`). An absent optional
vector is a zero-length array, which the kernels read as "not there".

Fused matrices are split by rows into zero-copy views, as llama.cpp's graph splits their product
(src/llama-graph.cpp build_qkv, ggml_swiglu): `attn_qkv` ([Q; K; V] rows, accepted wherever a file has it instead of
attn_q/k/v, as llama_model_base::create_tensor_qkv does, with `attn_qkv.bias` split alike) and phi3's `ffn_up`
([gate; up] rows). Every output row is its own dot product, so the views give the fused product's values.
A mixture-of-experts block's 3-D expert tensors `ffn_{gate,up,down}_exps` [n_expert, rows, cols] become one Linear
per expert, each a view of its slice of the tensor (src/llama-arch.cpp names; shapes as
src/models/{llama,qwen2moe,qwen3moe}.cpp create them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from gguf import GGMLQuantizationType

from .. import quants
from ..errors import GGUFError
from ..quants import repack
from ..runtime import last_level_cache_bytes
from .config import ModelConfig
from .linear import Experts, Linear

NONE = np.zeros(0, dtype=np.float32)  # an absent optional vector
# LayerWeights' fused matrices (a decode step's one kernel call) -> the matrices whose rows they hold
FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up": ("ffn_gate", "ffn_up")}


@dataclass(frozen=True)
class LayerWeights:
    """One transformer block (GGUF `blk.N.*`)."""

    attn_norm: np.ndarray  # [n_embd]
    attn_q: Linear  # [n_head * head_dim_k, n_embd]
    attn_k: Linear  # [n_head_kv * head_dim_k, n_embd]
    attn_v: Linear  # [n_head_kv * head_dim_v, n_embd]
    attn_output: Linear  # [n_embd, n_head * head_dim_v]
    ffn_norm: np.ndarray  # [n_embd]
    ffn_gate: Linear | None  # [n_ff, n_embd]; None in a mixture-of-experts block
    ffn_up: Linear | None  # [n_ff, n_embd]
    ffn_down: Linear | None  # [n_embd, n_ff]
    attn_q_bias: np.ndarray  # [n_head * head_dim_k] or [0]
    attn_k_bias: np.ndarray  # [n_head_kv * head_dim_k] or [0]
    attn_v_bias: np.ndarray  # [n_head_kv * head_dim_v] or [0]
    attn_q_norm: np.ndarray  # [head_dim_k] or [0]: per-head RMSNorm weight (qwen3, gemma3)
    attn_k_norm: np.ndarray  # [head_dim_k] or [0]
    post_attention_norm: np.ndarray  # [n_embd] or [0] (gemma3)
    post_ffw_norm: np.ndarray  # [n_embd] or [0] (gemma3)
    # mixture of experts (config.n_expert > 0), else None / empty
    ffn_gate_inp: Linear | None = None  # [n_expert, n_embd] router
    ffn_gate_exps: tuple[Linear, ...] = ()  # n_expert x [n_ff_exp, n_embd], views of one [n_expert, ...] tensor
    ffn_up_exps: tuple[Linear, ...] = ()  # n_expert x [n_ff_exp, n_embd]
    ffn_down_exps: tuple[Linear, ...] = ()  # n_expert x [n_embd, n_ff_exp]
    ffn_gate_inp_shexp: Linear | None = None  # [1, n_embd]: the shared expert's gate logit (qwen2moe)
    ffn_gate_shexp: Linear | None = None  # [n_ff_shexp, n_embd]
    ffn_up_shexp: Linear | None = None  # [n_ff_shexp, n_embd]
    ffn_down_shexp: Linear | None = None  # [n_embd, n_ff_shexp]
    # a decode step's fused products (repack_matrices): attn_q, attn_k and attn_v (ffn_gate and ffn_up) as one
    # matrix whose rows they are views of, one kernel call instead of three (two); None where they cannot be
    attn_qkv: Linear | None = None  # [q + k + v, n_embd]
    ffn_gate_up: Linear | None = None  # [2 n_ff, n_embd]
    # each expert's ffn_gate and ffn_up as one matrix, those two views of its rows: a decode step's gate and up of
    # an expert in one kernel call; () where they cannot be
    ffn_gate_up_exps: tuple[Linear, ...] = ()  # n_expert x [2 n_ff_exp, n_embd]
    # every expert's fused gate / up (ffn_down) in one array: a decode step's k chosen experts in one kernel call
    # each; None where the experts are not stacked in a layout with an experts kernel
    ffn_gate_up_stack: Experts | None = None  # n_expert x [2 n_ff_exp, n_embd]
    ffn_down_stack: Experts | None = None  # n_expert x [n_embd, n_ff_exp]

    @property
    def matrices(self) -> list[Linear]:
        """Every matrix this block multiplies by (absent ones left out, each expert of a 3-D tensor; not attn_qkv or
        ffn_gate_up, whose rows are others), in field order: roughly the order of the forward pass."""
        found = []
        for f in fields(self):
            if f.name in FUSED or f.name == "ffn_gate_up_exps":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Linear):
                found.append(value)
            elif isinstance(value, tuple):
                found.extend(value)
        return found

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's three matrices (what a token routed to it reads)."""
        return sum(e[0].w.nbytes for e in (self.ffn_gate_exps, self.ffn_up_exps, self.ffn_down_exps) if e)


@dataclass(frozen=True)
class Weights:
    token_embd: Linear  # [n_vocab, n_embd]
    output_norm: np.ndarray  # [n_embd]
    output: Linear  # [n_vocab, n_embd]; token_embd itself when the file has no output.weight (tied)
    rope_freqs: np.ndarray | None  # [n_rot / 2]: llama3-style per-frequency divisors, or None
    layers: tuple[LayerWeights, ...]
    rope_factors_long: np.ndarray | None = None  # [n_rot / 2] LongRoPE divisors for a long context (phi3), or None
    rope_factors_short: np.ndarray | None = None  # [n_rot / 2] the same for a context within the original one

    def rope_factors(self, n_ctx: int, n_ctx_orig: int) -> np.ndarray | None:
        """The per-frequency divisors of the rope angles for a context of n_ctx positions, as
        llama_model::get_rope_factors picks them: rope_freqs if present, else the LongRoPE long factors when the
        context exceeds the original one (n_ctx_orig, rope.scaling.original_context_length) and the short ones
        otherwise. llama.cpp compares its context padded to a multiple of 256 (llama_context: GGML_PAD(n_ctx, 256)),
        and so does this."""
        if self.rope_freqs is not None:
            return self.rope_freqs
        padded = -(-n_ctx // CTX_PAD) * CTX_PAD
        return self.rope_factors_long if padded > n_ctx_orig else self.rope_factors_short


CTX_PAD = 256  # llama.cpp rounds every context size up to a multiple of this


def load_weights(gguf, cfg: ModelConfig) -> Weights:
    """Look up, shape-check and type-check every tensor the model uses; GGUFError names the offending tensor (and,
    for a shape, the metadata keys the expected shape comes from).

    A tensor the model would not use also fails, so that nothing in a file is silently ignored.
    """
    tensors = gguf.tensors
    used: set[str] = set()
    c, spec, a = cfg, cfg.spec, f"{cfg.arch}."
    # each dimension with the metadata it comes from, so that a mismatch names the keys as well as the tensor
    embd = (c.n_embd, f"{a}embedding_length {c.n_embd}")
    ff = (c.n_ff, f"{a}feed_forward_length {c.n_ff}")
    key_length = (c.head_dim_k, f"{a}attention.key_length {c.head_dim_k}")
    heads = f"{a}attention.head_count {c.n_head}"
    kv_heads = f"{a}attention.head_count_kv {c.n_head_kv}"
    q_dim = (c.n_head * c.head_dim_k, f"{heads} x {key_length[1]}")
    k_dim = (c.n_head_kv * c.head_dim_k, f"{kv_heads} x {key_length[1]}")
    v_dim = (c.n_head_kv * c.head_dim_v, f"{kv_heads} x {a}attention.value_length {c.head_dim_v}")
    att_dim = (c.n_head * c.head_dim_v, f"{heads} x {a}attention.value_length {c.head_dim_v}")
    vocab = (c.n_vocab, "the rows of output.weight (or token_embd.weight)")
    rot_half = (c.n_rot // 2, f"{a}rope.dimension_count {c.n_rot} / 2")
    n_expert = (c.n_expert, f"{a}expert_count {c.n_expert}")
    ff_exp_key = "expert_feed_forward_length" if spec.experts == "always" else "feed_forward_length"
    ff_exp = (c.n_ff_exp, f"{a}{ff_exp_key} {c.n_ff_exp}")
    ff_shexp = (c.n_ff_shexp, f"{a}expert_shared_feed_forward_length {c.n_ff_shexp}")

    def get(name: str, dims: tuple[tuple[int, str], ...], required: bool = True):
        t = tensors.get(name)
        if t is None:
            if required:
                raise GGUFError(f"{gguf.path}: tensor {name!r} is missing (a {cfg.arch} model needs it)")
            return None
        shape = tuple(n for n, _ in dims)
        if tuple(t.shape) != shape:
            raise GGUFError(
                f"{gguf.path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape} from "
                f"{', '.join(source for _, source in dims)}"
            )
        used.add(name)
        return t

    def matrix(name: str, rows: tuple[int, str], cols: tuple[int, str], required: bool = True) -> Linear | None:
        t = get(name, (rows, cols), required)
        return Linear.of(t) if t is not None else None

    def experts(name: str, rows: tuple[int, str], cols: tuple[int, str]) -> tuple[Linear, ...]:
        t = get(name, (n_expert, rows, cols))
        return tuple(Linear.of(t, expert=e) for e in range(c.n_expert))

    def vector(name: str, n: tuple[int, str], required: bool = True) -> np.ndarray:
        t = get(name, (n,), required)
        if t is None:
            return NONE
        if t.type == GGMLQuantizationType.F32:
            return np.ascontiguousarray(t.data)
        quants.check_supported(name, t.type)
        return np.ascontiguousarray(quants.dequantize(t.data, t.type), dtype=np.float32).reshape(n[0])

    def split(lin: Linear, sizes: tuple[int, ...], parts: tuple[str, ...]) -> list[Linear]:
        """Consecutive row blocks of a fused matrix, each a zero-copy Linear (`NAME[part]`)."""
        out, r = [], 0
        for n, part in zip(sizes, parts):
            out.append(replace(lin, name=f"{lin.name}[{part}]", w=lin.w[r : r + n], n_out=n))
            r += n
        return out

    def divisors(name: str) -> np.ndarray:
        """A vector of rope frequency divisors (rope_freqs, rope_factors_long/short): finite and positive."""
        d = vector(name, rot_half, required=False)
        if d.size and not (np.all(np.isfinite(d)) and np.all(d > 0)):
            raise GGUFError(
                f"{gguf.path}: tensor {name!r} must hold finite positive divisors of the rope frequencies, got {d[:8]}"
            )
        return d

    qkv_dim = (q_dim[0] + k_dim[0] + v_dim[0], f"Q ({q_dim[1]}) + K ({k_dim[1]}) + V ({v_dim[1]})")
    gate_up_dim = (2 * c.n_ff, f"2 x {ff[1]} for gate and up")

    layers = []
    for il in range(c.n_layer):
        p = f"blk.{il}."
        qkv = matrix(p + "attn_qkv.weight", qkv_dim, embd, required=False)
        if qkv is not None:
            attn_q, attn_k, attn_v = split(qkv, (q_dim[0], k_dim[0], v_dim[0]), ("q", "k", "v"))
        else:
            attn_q = matrix(p + "attn_q.weight", q_dim, embd)
            attn_k = matrix(p + "attn_k.weight", k_dim, embd)
            attn_v = matrix(p + "attn_v.weight", v_dim, embd)
        qkv_bias = vector(p + "attn_qkv.bias", qkv_dim, required=False) if qkv is not None else NONE
        if qkv_bias.size:
            q_bias, k_bias, v_bias = np.split(qkv_bias, [q_dim[0], q_dim[0] + k_dim[0]])
        else:
            q_bias = vector(p + "attn_q.bias", q_dim, required=False)
            k_bias = vector(p + "attn_k.bias", k_dim, required=False)
            v_bias = vector(p + "attn_v.bias", v_dim, required=False)
        dense = not c.n_expert
        if not dense:  # the experts below replace the dense FFN
            ffn_gate = ffn_up = None
        elif spec.fused_gate_up:
            ffn_gate, ffn_up = split(matrix(p + "ffn_up.weight", gate_up_dim, embd), (c.n_ff, c.n_ff), ("gate", "up"))
        else:
            ffn_gate, ffn_up = matrix(p + "ffn_gate.weight", ff, embd), matrix(p + "ffn_up.weight", ff, embd)
        moe = {}
        if c.n_expert:
            moe = dict(
                ffn_gate_inp=matrix(p + "ffn_gate_inp.weight", n_expert, embd),
                ffn_gate_exps=experts(p + "ffn_gate_exps.weight", ff_exp, embd),
                ffn_up_exps=experts(p + "ffn_up_exps.weight", ff_exp, embd),
                ffn_down_exps=experts(p + "ffn_down_exps.weight", embd, ff_exp),
            )
        if c.n_ff_shexp:
            gate_inp_shexp = get(p + "ffn_gate_inp_shexp.weight", (embd,))
            moe.update(
                ffn_gate_inp_shexp=Linear.of(gate_inp_shexp, rows=(1, c.n_embd)),
                ffn_gate_shexp=matrix(p + "ffn_gate_shexp.weight", ff_shexp, embd),
                ffn_up_shexp=matrix(p + "ffn_up_shexp.weight", ff_shexp, embd),
                ffn_down_shexp=matrix(p + "ffn_down_shexp.weight", embd, ff_shexp),
            )
        layers.append(
            LayerWeights(
                attn_norm=vector(p + "attn_norm.weight", embd),
                attn_q=attn_q,
                attn_k=attn_k,
                attn_v=attn_v,
                attn_output=matrix(p + "attn_output.weight", embd, att_dim),
                ffn_norm=vector(p + "ffn_norm.weight", embd),
                ffn_gate=ffn_gate,
                ffn_up=ffn_up,
                ffn_down=matrix(p + "ffn_down.weight", embd, ff) if dense else None,
                attn_q_bias=np.ascontiguousarray(q_bias),
                attn_k_bias=np.ascontiguousarray(k_bias),
                attn_v_bias=np.ascontiguousarray(v_bias),
                attn_q_norm=vector(p + "attn_q_norm.weight", key_length, required=spec.qk_norm),
                attn_k_norm=vector(p + "attn_k_norm.weight", key_length, required=spec.qk_norm),
                post_attention_norm=vector(p + "post_attention_norm.weight", embd, required=spec.post_norms),
                post_ffw_norm=vector(p + "post_ffw_norm.weight", embd, required=spec.post_norms),
                **moe,
            )
        )
        lw = layers[-1]
        if (lw.attn_q_bias.size > 0) != (lw.attn_k_bias.size > 0) or (lw.attn_q_bias.size > 0) != (
            lw.attn_v_bias.size > 0
        ):
            raise GGUFError(f"{gguf.path}: block {il} has some but not all of the attn_q/k/v biases")
        if (lw.attn_q_norm.size > 0) != (lw.attn_k_norm.size > 0):
            raise GGUFError(f"{gguf.path}: block {il} has only one of attn_q_norm / attn_k_norm")

    token_embd = matrix("token_embd.weight", vocab, embd)
    output = None if spec.tied_output else matrix("output.weight", vocab, embd, required=False)
    rope_freqs = divisors("rope_freqs.weight")
    # phi3.cpp: one pair for every layer (TENSOR_DUPLICATED); a file may lack either one (no factors then)
    long, short = (
        (divisors("rope_factors_long.weight"), divisors("rope_factors_short.weight")) if spec.longrope else (NONE, NONE)
    )
    weights = Weights(
        token_embd=token_embd,
        output_norm=vector("output_norm.weight", embd),
        output=output or token_embd,
        rope_freqs=rope_freqs if rope_freqs.size else None,
        layers=tuple(layers),
        rope_factors_long=long if long.size else None,
        rope_factors_short=short if short.size else None,
    )
    unused = sorted(set(tensors) - used)
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise GGUFError(
            f"{gguf.path}: tensors {', '.join(unused[:5])}{more} are not used by ggufrun's {c.arch} model; "
            f"running without them would give wrong results"
        )
    return repack_matrices(weights, gguf)


def repack_matrices(weights: Weights, gguf) -> Weights:
    """`weights` with every matrix whose type has an interleaved layout (ggufrun.quants.repack: Q4_0, Q4_1, Q5_0, Q8_0,
    Q4_K, Q5_K, Q6_K) copied into it, the file pages each came from released (GGUFFile.release_pages), so the
    process holds one copy. token_embd only when it is also the output (tied) and its rows can be read back from
    that layout (Q4_0, Q4_1, Q8_0, Q6_K: the embedding lookup reads them); an embedding table used for lookups alone
    gains nothing from it. A block's attn_q / attn_k / attn_v (ffn_gate / ffn_up) of one such type are copied into
    one matrix, attn_qkv (ffn_gate_up), of which they are views: a decode step takes them in one kernel call
    (SmolLM2, 2 threads: 24.2 -> 14.8 us for Q / K / V, 47.7 -> 40.0 us for gate / up); so are each expert's gate
    and up (ffn_gate_up_exps).
    """

    def pack(lin, rows_too=False):
        if isinstance(lin, tuple):
            return tuple(pack(x) for x in lin)
        if not isinstance(lin, Linear):
            return lin
        return lin.repacked(rows_too, release=gguf.release_pages)

    def pack_experts(layer: LayerWeights) -> dict:
        """A block's experts, each one's gate and up fused (ffn_gate_up_exps), all experts' in one array and all
        their down matrices in another: NumPy gives arrays of 4 MB and more transparent huge pages (the 1-2 MB
        matrices of experts allocated apart got 4 KB ones). qwen3moe-30b-a3b-16e Q4_K_M, 2 threads: 0.53 -> 2.53 GB
        of the weights on huge pages; the chosen experts of every layer in turn, alone, streamed at 22.9-23.4 ->
        25.0-25.5 GB/s (gate / up) and 19.8-20.8 -> 20.2-22.7 (down); decode 11.13 -> 11.30 tok/s (medians of 5
        alternating process pairs). The two arrays are also the block's ffn_gate_up_stack / ffn_down_stack (Experts:
        a decode step's chosen experts in one kernel call each). {} where the gate and up cannot be fused (each expert
        then packed apart)."""
        gates, ups, downs = layer.ffn_gate_exps, layer.ffn_up_exps, layer.ffn_down_exps
        pairs = [[g, u] for g, u in zip(gates, ups)]
        shapes = [Linear.packed_rows(p) for p in pairs]
        if not pairs or None in shapes or len(set(shapes)) != 1:
            return {}
        (rows, cols), n = shapes[0], len(pairs)
        gate_up = np.empty((n * rows, cols), np.uint8)
        experts = [Linear.repacked_together(p, gguf.release_pages, out=gate_up[e * rows : (e + 1) * rows])
                   for e, p in enumerate(pairs)]  # fmt: skip
        packed = {"ffn_gate_up_exps": tuple(e[0] for e in experts), "ffn_gate_exps": tuple(e[1] for e in experts),
                  "ffn_up_exps": tuple(e[2] for e in experts),
                  "ffn_gate_up_stack": Experts.of(gate_up, experts[0][0])}  # fmt: skip
        down_shapes = {repack.packed_shape(d.w, d.qtype) for d in downs}
        if len(down_shapes) == 1 and None not in down_shapes and not any(d.packed for d in downs):
            ((rows, cols),) = down_shapes
            down = np.empty((n * rows, cols), np.uint8)
            packed["ffn_down_exps"] = tuple(d.repacked(release=gguf.release_pages, out=down[e * rows : (e + 1) * rows])
                                            for e, d in enumerate(downs))  # fmt: skip
            packed["ffn_down_stack"] = Experts.of(down, packed["ffn_down_exps"][0])
        return packed

    def pack_layer(layer: LayerWeights) -> LayerWeights:
        fused = {}
        for name, parts in FUSED.items():
            lins = Linear.repacked_together([getattr(layer, p) for p in parts], release=gguf.release_pages)
            if lins is not None:
                fused[name] = lins[0]
                fused.update(zip(parts, lins[1:]))
        fused.update(pack_experts(layer))
        return replace(layer, **{f.name: pack(getattr(layer, f.name)) for f in fields(layer) if f.name not in fused},
                       **fused)  # fmt: skip

    layers = tuple(pack_layer(layer) for layer in weights.layers)
    if weights.output is weights.token_embd:
        token_embd = output = pack(weights.token_embd, rows_too=True)
    else:
        token_embd, output = weights.token_embd, pack(weights.output)
    if decode_streams(gguf, weights):
        layers = tuple(replace(layer, **{f.name: _streaming(getattr(layer, f.name)) for f in fields(layer)})
                       for layer in layers)  # fmt: skip
        output = _streaming(output)
        token_embd = output if weights.output is weights.token_embd else token_embd
    return replace(weights, layers=layers, token_embd=token_embd, output=output)


def decode_streams(gguf, weights: Weights) -> bool:
    """Whether a decode step reads the model's matrices from DRAM: the bytes of its tensors (less an untied
    token_embd, whose rows are only looked up) exceed the CPU's last-level cache (or the system does not say how
    large that is). Then the one-row products take the kernels of repack.STREAM_ROW (Linear.streaming)."""
    total = sum(t.nbytes for t in gguf.tensors.values())
    if weights.output is not weights.token_embd and "token_embd.weight" in gguf.tensors:
        total -= gguf.tensors["token_embd.weight"].nbytes
    cache = last_level_cache_bytes()
    return cache is None or total > cache


def _streaming(x):
    """x with each Linear in it (a tuple of them: a block's experts) taking its streaming one-row kernel, an Experts
    stack its streaming experts kernel."""
    if isinstance(x, (Linear, Experts)):
        return x.streaming()
    if isinstance(x, tuple) and x and all(isinstance(e, Linear) for e in x):
        return tuple(e.streaming() for e in x)
    return x
