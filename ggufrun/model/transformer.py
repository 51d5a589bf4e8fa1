"""The forward pass: one shared pre-norm transformer block for llama, qwen2, qwen3, phi3, gemma2 and gemma3,
run-state buffers allocated once, and K/V appended to a KVCache (kv_cache.py: the cache and the token ids it holds).

Per block (src/models/{llama,qwen2,qwen3,phi3,gemma2,gemma3}.cpp in llama.cpp):
    h = rmsnorm(x) ; q, k, v = h @ Wq/Wk/Wv (+ biases) ; per-head q/k norm ; rope ; append k, v to the cache
    x += [post_norm](attention(q, K, V) @ Wo)     (gemma2: scores soft-capped, c * tanh(scores / c), before softmax)
    h = rmsnorm(x) ; x += [post_norm](ffn_down(act(ffn_gate(h)) * ffn_up(h)))
then logits = rmsnorm(x) @ output.T. What differs per architecture is data (config.ArchSpec) and optional
tensors, not branches here.

Prefill runs `n_batch` tokens at a time through the batched kernels; a single token (decode) goes through the
matvec kernels and `kernels.attend_one` without allocating anything. Both give every token the same bits (batch
invariance): logits do not depend on how a prompt is split into chunks, nor on a reused prefix. Everything runs
on Numba's threads: no BLAS, whose own thread pool would fight Numba's for the same cores.

`forward_batch([(cache, ids), ...])` advances several sequences in one pass, as llama.cpp's `llama_decode` does
with a multi-sequence `llama_batch` (tools/server/server.cpp batches every slot's next token, plus prompt chunks,
into one decode): the rows of all sequences go through each matrix product together (the weights are read once
for all of them), while RoPE, the K/V store and attention run per sequence on its own cache and positions. A
matrix product's row is the same bits as a matvec of that row (ggufrun.quants.dot), and attention of one
sequence never sees another's rows, so a sequence's logits are the same bits batched or alone.

Mixture-of-experts blocks (config.ArchSpec.experts: qwen2moe, qwen3moe, llama files with experts) replace the FFN
with src/llama-graph.cpp's build_moe_ffn: router logits h @ ffn_gate_inp.T, softmax, the top n_expert_used experts
(kernels.route), each expert's SwiGLU run once on the rows routed to it (gathered, one matrix product, scattered to
(token, rank) rows; a decode step reads only its chosen experts, all their gate / up in one kernel call and all
their downs in another where the experts are stacked: linear.Experts, ggml's mul_mat_id), then per token the
weighted sum in rank order
(kernels.combine_experts), plus qwen2moe's shared expert times sigmoid(h . ffn_gate_inp_shexp). A token's routing
and sum never look at other rows, so batch invariance holds here too.
"""

from __future__ import annotations

import math
import threading
import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import ContextOverflowError
from ..quants import ACTIVATIONS
from ..quants.repack import ONE_ROW
from ..runtime import ThreadGovernor, on_compute_thread, threads_beside
from . import kernels
from .config import ModelConfig
from .kv_cache import KVCache
from .linear import Linear, Projector
from .rope import rope_table
from .weights import LayerWeights, Weights, load_weights

# forward_batch keeps the quantized-activation buffers of passes up to this many rows (the decode batches of a
# server: a few hundred KB in all) instead of allocating them in every pass
BATCH_PROJECTOR_ROWS = 64
# Every pass of several rows takes Q, K and V from the one attn_qkv product, as decode does, then copies them out (the
# attention kernels take C-contiguous rows), and gate and up from the one ffn_gate_up product, SwiGLU / GEGLU reading
# its two halves into gate (swiglu_halves_rows, geglu_halves_rows: no copies): one product call where there were three
# (two), one activation layout for the VNNI / AMX tiles instead of three (two), and work items of more weight rows
# sharing each read of the activations. Batched decode steps: SmolLM2 on the AMD EPYC Zen 4 VM, 2 threads, a layer's
# Q / K / V in cache, best of 7 x 300: 2 / 4 / 8 / 16 rows 35.9 / 24.6 / 43.3 / 59.1 -> 25.7 / 21.4 / 31.9 / 53.9 us
# with the copies; Intel Ice Lake VM, 2 threads, alternating processes, dev/step_profile.py, gate / up a step: 8 rows
# SmolLM2 3.19 / 3.08 -> 2.93 / 2.82 ms (Q4_1 3,072 x 576), Gemma3 2.91 / 2.88 -> 2.81 / 2.70; 16 rows SmolLM2 5.25 ->
# 4.70 (the step 22.80 -> 21.89), Gemma3 4.07 -> 3.85. Prompt passes, which took the separate products until
# 2026-12-07 (with the VNNI tiles' activation bytes written 64 at a time, dot._plus128), Intel Ice Lake VM, 2 threads,
# both trees in one process, forward_batch's time in turns, medians of 10-12 turns: SmolLM2 8 prompts of 32 tokens
# 230-257 -> 216-224 ms (0.88-0.92x), 16 of 32 485 -> 433 ms, one prompt of 128 147 -> 125 ms; Gemma3 (V of another
# type than Q / K in half its layers, which keep three products) 8 of 32 even (183-189 ms).
# the multi-row kernels Transformer.pending can hold: the tiled products with their parallel quantizers and SwiGLU /
# GEGLU (Projector.tiles says whether a pass may call them)...
TILED = frozenset(ONE_ROW) | {ACTIVATIONS[f].quantize_rows for f in ("Q8_1", "Q8_K")} | {
    kernels.swiglu_rows, kernels.geglu_rows, kernels.swiglu_halves_rows, kernels.geglu_halves_rows,
    kernels.add_norm_rows,
}  # fmt: skip
# ...and prefill attention, and the batched decode steps' (a server's slots: _decode_groups)
ROWS = frozenset(
    {
        kernels.attend_rows,
        kernels.qkv_rope_store_rows,
        kernels.qkv_rope_store_spans,
        kernels.qkv_rope_store_group,
        kernels.attend_group,
        kernels.qkv_rope_store_group_q8_0,
        kernels.attend_group_q8_0,
        kernels.fwht_rows_at,
    }
)
# ...and the batched greedy sampler's (sampling.sample_greedy_rows: until it is ready, each row samples alone)
BATCH_SAMPLING = frozenset({kernels.greedy_rows})
_AS_IS = nullcontext()  # a pass's thread count when no helper compiles beside it (Transformer._beside_compiler)


@dataclass
class RunState:
    """Every activation buffer of the forward pass, allocated once for n_batch rows and n_ctx positions."""

    x: np.ndarray  # [n_batch, n_embd] residual stream
    h: np.ndarray  # [n_batch, n_embd] normed input of the next projection
    q: np.ndarray  # [n_batch, n_head * head_dim_k]
    k: np.ndarray  # [n_batch, n_head_kv * head_dim_k]
    v: np.ndarray  # [n_batch, n_head_kv * head_dim_v]
    att: np.ndarray  # [n_batch, n_head * head_dim_v] attention output, before attn_output
    q_qs: np.ndarray  # int8 [n_batch, n_head * head_dim_k] Q as Q8_0 codes (q8_0 KV cache), else [0, 0]
    q_d: np.ndarray  # uint16 [n_batch, n_head * head_dim_k / 32] their f16 scales (q8_0 KV cache), else [0, 0]
    o: np.ndarray  # [n_batch, n_embd] attention or FFN output, before the residual add
    gate: np.ndarray  # [n_batch, n_ff] (then act(gate) * up, in place)
    up: np.ndarray  # [n_batch, n_ff] (a layer without ffn_gate_up: the first half of gate_up's memory, free then)
    qkv: np.ndarray  # [n_batch, q + k + v] a pass's Q, K, V from one product (LayerWeights.attn_qkv)
    gate_up: np.ndarray  # [n_batch, 2 n_ff] a pass's gate and up from one product (LayerWeights.ffn_gate_up)
    head_scores: np.ndarray  # [n_head, n_ctx + KV_PAD] attention scores, then probabilities (decode)
    block_scores: np.ndarray  # [n_slots, QUERY_BLOCK x TILED_BLOCKS, n_ctx + KV_PAD] the same for blocks of queries
    # (prefill; a long span's work item takes TILED_BLOCKS blocks, kernels._attend_rows_tiled; np.zeros: a short
    # prompt's passes touch the first QUERY_BLOCK rows only)
    # a prompt pass on a q8_0 cache: each slot's copy of one K/V head's keys laid out as tiles
    # (kernels._key_tiles_q8_0); np.zeros: the pages no pass touches take no memory
    key_tiles: np.ndarray  # int32 [n_slots, head_dim_k / 4 + 1, n_ctx + KV_PAD], else [0, 0, 0]
    key_scales: np.ndarray  # uint16 [n_slots, head_dim_k / 32, n_ctx + KV_PAD], else [0, 0, 0]
    logits: np.ndarray  # [1, n_vocab] of the last token; forward() returns logits[0]
    # mixture of experts (zero-size for a dense model); k = n_expert_used, f = max(n_ff_exp, n_ff_shexp)
    router: np.ndarray  # [n_batch, n_expert] router logits, then probabilities
    expert_sel: np.ndarray  # int32 [n_batch, k] each token's experts, most probable first
    expert_weights: np.ndarray  # [n_batch, k] their weights
    expert_offsets: np.ndarray  # int32 [n_expert + 1] expert e's choices: expert_order[offsets[e]:offsets[e + 1]]
    expert_order: np.ndarray  # int32 [n_batch * k] the choices t * k + r grouped by expert
    expert_active: np.ndarray  # int32 [n_expert] the experts chosen in this pass, ascending
    expert_in: np.ndarray  # [n_batch, n_embd] the rows routed to one expert, gathered
    expert_gate: np.ndarray  # [n_batch * f] one expert's gate (then act(gate) * up), as [rows, width]
    expert_up: np.ndarray  # [n_batch * f]
    expert_gate_up: np.ndarray  # [k, 2 n_ff_exp] a decode step's experts' gate and up (row 0: one expert's)
    expert_act: np.ndarray  # [k, n_ff_exp] a decode step's experts' act(gate) * up
    expert_out: np.ndarray  # [n_batch, n_embd] one expert's (or the shared expert's) output rows
    expert_outs: np.ndarray  # [n_batch * k, n_embd] row t * k + r: the output of token t's rank-r expert
    shexp_gate: np.ndarray  # [n_batch, 1] the shared expert's gate logit

    @classmethod
    def allocate(cls, c: ModelConfig, n_ctx: int, n_batch: int) -> RunState:
        f32 = np.float32
        k, f = c.n_expert_used, max(c.n_ff_exp, c.n_ff_shexp)
        gate_up = np.zeros((n_batch, 2 * c.n_ff), f32)
        slots, width, q8 = numba.config.NUMBA_NUM_THREADS, n_ctx + kernels.KV_PAD, c.head_dim_k % 32 == 0
        return cls(
            x=np.zeros((n_batch, c.n_embd), f32),
            h=np.zeros((n_batch, c.n_embd), f32),
            q=np.zeros((n_batch, c.n_head * c.head_dim_k), f32),
            k=np.zeros((n_batch, c.n_head_kv * c.head_dim_k), f32),
            v=np.zeros((n_batch, c.n_head_kv * c.head_dim_v), f32),
            att=np.zeros((n_batch, c.n_head * c.head_dim_v), f32),
            q_qs=np.zeros((n_batch, c.n_head * c.head_dim_k) if c.head_dim_k % 32 == 0 else (0, 0), np.int8),
            q_d=np.zeros((n_batch, c.n_head * c.head_dim_k // 32) if c.head_dim_k % 32 == 0 else (0, 0), np.uint16),
            o=np.zeros((n_batch, c.n_embd), f32),
            gate=np.zeros((n_batch, c.n_ff), f32),
            up=gate_up.reshape(-1)[: n_batch * c.n_ff].reshape(n_batch, c.n_ff),
            qkv=np.zeros((n_batch, c.n_head * c.head_dim_k + c.n_head_kv * (c.head_dim_k + c.head_dim_v)), f32),
            gate_up=gate_up,
            head_scores=np.zeros((c.n_head, n_ctx + kernels.KV_PAD), f32),
            # one slot per thread Numba may ever run (the thread count can change between calls)
            block_scores=np.zeros((slots, kernels.QUERY_BLOCK * kernels.TILED_BLOCKS, width), f32),
            key_tiles=np.zeros((slots, c.head_dim_k // 4 + 1, width) if q8 else (0, 0, 0), np.int32),
            key_scales=np.zeros((slots, c.head_dim_k // 32, width) if q8 else (0, 0, 0), np.uint16),
            logits=np.zeros((1, c.n_vocab), f32),
            router=np.zeros((n_batch, c.n_expert), f32),
            expert_sel=np.zeros((n_batch, k), np.int32),
            expert_weights=np.zeros((n_batch, k), f32),
            expert_offsets=np.zeros(c.n_expert + 1, np.int32),
            expert_order=np.zeros(n_batch * k, np.int32),
            expert_active=np.zeros(c.n_expert, np.int32),
            expert_in=np.zeros((n_batch if k else 0, c.n_embd), f32),
            expert_gate=np.zeros(n_batch * f, f32),
            expert_up=np.zeros(n_batch * f, f32),
            expert_gate_up=np.zeros((k, 2 * c.n_ff_exp), f32),
            expert_act=np.zeros((k, c.n_ff_exp), f32),
            expert_out=np.zeros((n_batch if f else 0, c.n_embd), f32),
            expert_outs=np.zeros((n_batch * k, c.n_embd), f32),
            shexp_gate=np.zeros((n_batch if c.n_ff_shexp else 0, 1), f32),
        )


class Transformer:
    """A GGUF decoder-only model: its weights, activation buffers and (by default) one KV cache.

    >>> from ggufrun.reader import GGUFFile
    >>> tf = Transformer(GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf"), n_ctx=2048)
    >>> logits = tf.forward([1, 2, 3])  # [n_vocab] after the last token; tf.cache now holds 3 positions
    >>> logits = tf.forward([int(logits.argmax())])  # one decode step
    >>> tf.cache.truncate(2)  # keep the first two positions (prefix reuse)
    >>> rows = tf.logits([1, 2, 3])  # [3, n_vocab], fresh context, teacher-forced
    >>> a, b = tf.new_cache(), tf.new_cache()
    >>> last = tf.forward_batch([(a, [1, 2, 3]), (b, [4, 5])])  # [2, n_vocab]: two sequences, one pass

    gguf_file: an open ggufrun.reader.GGUFFile (kept open by the caller: weights are views into its mmap).
    n_ctx: positions the KV cache holds (default min(4096, trained context); above it: a warning).
    n_batch: prefill chunk size. kv_dtype: "f16" (default, like llama.cpp), "q8_0" or "f32" (kv_cache.KV_DTYPES;
    np.float16 / np.float32 work too).

    Threads: the activation buffers are shared, so every forward pass runs under `lock` (reentrant). A caller that
    reads the returned logits buffer (overwritten by the next pass) holds `lock` across the pass and the read.
    A pass runs on the process's compute thread (runtime.on_compute_thread: one OS thread starts every parallel
    region) with the calling thread's Numba thread count (runtime.set_threads), step by step (a layer, the output
    projection) on 1 thread instead while `governor` (runtime.ThreadGovernor) measures that count stalling.
    """

    def __init__(self, gguf_file, n_ctx: int | None = None, n_batch: int = 256, kv_dtype="f16"):
        self.config = c = ModelConfig.from_gguf(gguf_file)
        if n_ctx is None:
            n_ctx = c.n_ctx_default
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        if not isinstance(n_batch, int) or isinstance(n_batch, bool) or n_batch < 1:
            raise ValueError(f"n_batch must be a positive integer, got {n_batch!r}")
        if n_ctx > c.n_ctx_train:
            warnings.warn(
                f"n_ctx {n_ctx} is above the context this model was trained for ({c.n_ctx_train}); "
                f"output past {c.n_ctx_train} tokens may degrade",
                stacklevel=2,
            )
        self.gguf = gguf_file
        self.weights: Weights = load_weights(gguf_file, c)
        self.n_ctx = n_ctx
        self.n_batch = min(n_batch, n_ctx)
        self.cache = KVCache(c, n_ctx, kv_dtype)  # the default cache of forward()
        self.state = RunState.allocate(c, n_ctx, self.n_batch)
        self.lock = threading.RLock()
        self.governor = ThreadGovernor()  # per step: the caller's thread count, or 1 while that count stalls
        # the first run ever: the multi-row kernels (kernels.attend_rows, the tiled products), which a helper
        # process still compiles (runtime.compile_kernels; a quants.jit.Background); until they are ready, a pass of
        # several rows runs attend_one per query row and each product's dot_one (the same bits)
        self.pending = None
        # a decode step's Q / K / V: views of RunState.qkv's first row ([1, n], C-contiguous); a pass of several
        # rows copies its rows of qkv to q, k, v (_attention_block)
        nq, nk = c.n_head * c.head_dim_k, c.n_head_kv * c.head_dim_k
        qkv1 = self.state.qkv[:1]
        self._qkv_split = (nq, nq + nk)
        self._qkv1 = (qkv1[:, :nq], qkv1[:, nq : nq + nk], qkv1[:, nq + nk :])
        eg = self.state.expert_gate_up[:1]
        self._expert_gate_up1 = (eg[:, : c.n_ff_exp], eg[:, c.n_ff_exp :])
        self._project = Projector(self.n_batch)
        self._batch_projectors: dict[int, Projector] = {}  # forward_batch passes of other row counts
        self._batch_logits = np.zeros((0, c.n_vocab), np.float32)  # [n_seqs, n_vocab] grown on demand

        # rope tables per layer (gemma's local layers use their own base); layers share equal tables; the
        # frequency divisors (rope_freqs, or phi3's LongRoPE factors) depend on the context size, as in llama.cpp
        freq_factors = self.weights.rope_factors(n_ctx, c.yarn_orig_ctx)
        tables: dict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = {}
        self._rope = []
        for il in range(c.n_layer):
            swa = c.swa_layers[il]
            key = (c.rope_freq_base_swa, c.rope_freq_scale_swa) if swa else (c.rope_freq_base, c.rope_freq_scale)
            if key not in tables:
                tables[key] = rope_table(
                    n_ctx,
                    c.n_rot,
                    base=key[0],
                    freq_scale=key[1],
                    freq_factors=freq_factors,
                    ext_factor=c.yarn_ext_factor,
                    attn_factor=c.yarn_attn_factor,
                    n_ctx_orig=c.yarn_orig_ctx,
                    beta_fast=c.yarn_beta_fast,
                    beta_slow=c.yarn_beta_slow,
                )
            self._rope.append(tables[key])
        self._window = [c.sliding_window if swa else 0 for swa in c.swa_layers]
        # q8_0 KV cache: the Walsh-Hadamard sizes Q/K and V are rotated by before quantization (0: none), as
        # llama.cpp's llama_kv_cache: K the largest power of two >= 64 dividing the head size, V 64
        self._rot_k = c.head_dim_k & -c.head_dim_k if c.head_dim_k % 64 == 0 else 0
        self._rot_v = 64 if c.head_dim_v % 64 == 0 else 0
        self._attn_softcap = np.float32(c.attn_logit_softcap)
        # governor step keys: m.bit_length() * 3 + kind (0: layer, 1: sliding-window layer, 2: output projection)
        self._step_kind = [1 if swa else 0 for swa in c.swa_layers]
        self._gelu_table = kernels.gelu_table() if c.spec.gelu else None
        self._embed_scale = np.float32(math.sqrt(c.n_embd)) if c.spec.embed_scale else None
        # bytes of expert matrices the forward passes have read (each chosen expert once per pass, whatever the
        # number of rows routed to it): a decode step reads n_expert_used of n_expert experts per block
        self.expert_bytes_read = 0

    def new_cache(self, kv_dtype=None) -> KVCache:
        """Another KV cache for this model (n_ctx positions), e.g. one per independent conversation."""
        return KVCache(self.config, self.n_ctx, self.cache.dtype if kv_dtype is None else kv_dtype)

    def new_caches(self, n: int, kv_dtype=None) -> list[KVCache]:
        """n KV caches as one group (KVCache.group), e.g. the slots of a batching server: each is a cache of its
        own, and forward_batch runs the attention of their decode steps in one kernel call per layer."""
        return KVCache.group(self.config, self.n_ctx, self.cache.dtype if kv_dtype is None else kv_dtype, n)

    def warmup(self) -> None:
        """Compile (or load from Numba's on-disk cache) every kernel the forward pass can use, so that none
        compiles in the middle of a generation. Runs on a scratch cache: the model's cache is left as it was."""
        scratch = self.new_cache()
        if self.n_ctx >= 2:
            self.forward([0, 0], cache=scratch)  # prefill kernels
            scratch.reset()
            # a batching server's prompts, then its decode steps: two slots of a group
            a, b = KVCache.group(self.config, 2, scratch.dtype, 2)
            self.forward_batch([(a, [0, 0]), (b, [0, 0])])
            a.truncate(1)
            b.truncate(1)
            self.forward_batch([(a, [0]), (b, [0])])
        self.forward([0], cache=scratch)  # decode kernels
        pending = self.pending
        if pending is None or pending.ready(TILED):  # (else a helper compiles it, and passes go without meanwhile)
            # the SwiGLU / GEGLU of a layer without ffn_gate_up (gate and up of different types), which the passes
            # above reach only on such a model
            g, u = np.zeros((2, 32), np.float32), np.zeros((2, 32), np.float32)
            if self._gelu_table is not None:
                kernels.geglu_rows(g, u, self._gelu_table)
            else:
                kernels.swiglu_rows(g, u)

    # ---- forward ----

    def logits(self, ids, cache: KVCache | None = None) -> np.ndarray:
        """Logits float32 [len(ids), n_vocab] after each of `ids`, in a fresh context (teacher forcing).

        The cache holds `ids` afterwards.
        """
        cache = self.cache if cache is None else cache
        with self.lock:
            cache.reset()
            return self.forward(ids, all_logits=True, cache=cache)

    def forward(self, ids, all_logits: bool = False, cache: KVCache | None = None) -> np.ndarray:
        """Append token ids to `cache` (default: self.cache) at position cache.n_past; return float32 logits
        [n_vocab] of the last one, or [len(ids), n_vocab] of every one with all_logits.

        Without all_logits the array returned is a buffer of this model, overwritten by the next call (this is
        what keeps decode free of allocations): copy it, or hold `lock` while reading it. ContextOverflowError if
        the tokens do not fit in n_ctx, before anything changes.
        """
        cache = self.cache if cache is None else cache
        ids = self._check_ids(ids, "ids")
        n = ids.shape[0]
        self._check_cache(cache, "cache")
        with self.lock:
            cache.reserve(n)
            out = np.empty((n, self.config.n_vocab), np.float32) if all_logits else None
            for start in range(0, n, self.n_batch):
                stop = min(n, start + self.n_batch)
                on_compute_thread(self._eval, ids[start:stop], cache, out[start:stop] if out is not None else None)
            return out if all_logits else self.state.logits[0]

    def forward_batch(self, seqs) -> np.ndarray:
        """Advance several sequences in one forward pass; return float32 logits [len(seqs), n_vocab], row i after
        the last token of sequence i.

        seqs: [(cache, ids), ...]: each sequence appends its token ids (one for a decode step, several for a prompt
        chunk) to its own KVCache at that cache's n_past; no cache may appear twice. Row i is the same bits as
        `forward(ids_i, cache=cache_i)` would return (batch invariance). The rows of all sequences share the
        matrix products, n_batch rows per pass (more rows take several passes).

        The array returned is a buffer of this model, overwritten by the next forward_batch: copy it, or hold
        `lock` while reading it. ContextOverflowError (naming the sequence) if any sequence's tokens do not fit
        in its cache, and ValueError for bad ids or caches, before anything changes.

        >>> a, b = tf.new_cache(), tf.new_cache()
        >>> rows = tf.forward_batch([(a, prompt_a), (b, prompt_b)])  # two prefills in one pass
        >>> rows = tf.forward_batch([(a, [int(rows[0].argmax())]), (b, [int(rows[1].argmax())])])  # two decodes
        """
        if isinstance(seqs, (str, bytes)) or not hasattr(seqs, "__len__") or len(seqs) == 0:
            raise ValueError(f"seqs must be a non-empty list of (cache, ids) pairs, got {type(seqs).__name__}")
        caches, id_lists, seen = [], [], set()
        for i, pair in enumerate(seqs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"seqs[{i}] must be a (cache, ids) pair, got {type(pair).__name__}")
            cache, ids = pair
            self._check_cache(cache, f"seqs[{i}] cache")
            if id(cache) in seen:
                raise ValueError(f"seqs[{i}]: the same KVCache appears twice; one sequence per cache")
            seen.add(id(cache))
            caches.append(cache)
            id_lists.append(self._check_ids(ids, f"seqs[{i}] ids"))
        with self.lock:
            for i, (cache, ids) in enumerate(zip(caches, id_lists)):
                try:
                    cache.reserve(ids.shape[0])
                except ContextOverflowError as e:
                    raise ContextOverflowError(f"seqs[{i}]: {e}") from None
            n_seqs = len(caches)
            if self._batch_logits.shape[0] < n_seqs:
                self._batch_logits = np.zeros((n_seqs, self.config.n_vocab), np.float32)
            logits = self._batch_logits[:n_seqs]
            # passes of up to n_batch rows, filled with the sequences in order; a sequence may straddle passes
            part: list[tuple[int, int, int]] = []  # (sequence, first id, end id) in the pass being filled
            rows = 0
            for i, ids in enumerate(id_lists):
                start, n = 0, ids.shape[0]
                while start < n:
                    take = min(n - start, self.n_batch - rows)
                    part.append((i, start, start + take))
                    rows += take
                    start += take
                    if rows == self.n_batch:
                        on_compute_thread(self._eval_pass, part, caches, id_lists, logits)
                        part, rows = [], 0
            if part:
                on_compute_thread(self._eval_pass, part, caches, id_lists, logits)
            return logits

    def _check_ids(self, ids, name: str) -> np.ndarray:
        ids = np.asarray(ids)
        n = ids.shape[0] if ids.ndim == 1 else 0
        if n == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"{name} must be a non-empty 1-D sequence of token ids, got shape {ids.shape} {ids.dtype}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.n_vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name}: token id {bad} is out of range [0, {self.config.n_vocab}) (n_vocab)")
        return ids

    def _check_cache(self, cache, name: str) -> None:
        c = self.config
        if not isinstance(cache, KVCache):
            raise ValueError(f"{name} must be a KVCache (Transformer.new_cache()), got {type(cache).__name__}")
        if cache.n_ctx > self.n_ctx or cache.layer_shape != (c.n_layer, c.n_head_kv, c.head_dim_k, c.head_dim_v):
            raise ValueError(f"{name}: {cache!r} was not made for this model (n_ctx {self.n_ctx}); use new_cache()")

    def _eval(self, ids: np.ndarray, cache: KVCache, out: np.ndarray | None) -> None:
        """Run len(ids) <= n_batch tokens at positions cache.n_past.. through the model; logits of the last token
        go to state.logits, or of every token to `out` [M, n_vocab]. The kernels write K/V rows unchecked, so the
        positions are checked here, right before them."""
        w, s = self.weights, self.state
        m = ids.shape[0]
        pos0 = cache.reserve(m)
        with self._beside_compiler(), self.governor:
            self._blocks(ids, ((cache, 0, m, pos0),), self._project)
            # h now holds output_norm(x)
            if out is not None:
                self.governor.step(m.bit_length() * 3 + 2, m)
                self._project(s.h[:m], (w.output, out))
                self._softcap(out)
            else:
                self.governor.step(5)  # 1 row: m.bit_length() * 3 + kind 2
                self._project(s.h[m - 1 : m], (w.output, s.logits))
                self._softcap(s.logits)
        cache.commit(ids)

    def _eval_pass(self, part, caches: list[KVCache], id_lists: list[np.ndarray], logits: np.ndarray) -> None:
        """One forward_batch pass: part = [(sequence, start, stop), ...], rows ids[start:stop] of each sequence, in
        sequence order, at most n_batch rows in all. Sequences whose last id is in this pass get their logits row."""
        w, s = self.weights, self.state
        pieces, spans, r = [], [], 0
        for i, start, stop in part:
            cache = caches[i]
            pieces.append(id_lists[i][start:stop])
            spans.append((cache, r, r + stop - start, cache.reserve(stop - start)))
            r += stop - start
        m = r
        ids = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        project = self._project_rows(m)
        with self._beside_compiler(), self.governor:
            self._blocks(ids, spans, project)
            # the sequences that end in this pass are consecutive: all but perhaps the last of the pass
            done = [(i, span[2] - 1) for (i, _, stop), span in zip(part, spans) if stop == id_lists[i].shape[0]]
            if done:
                first, k = done[0][0], len(done)
                if k == 1:
                    last_rows = s.h[done[0][1] : done[0][1] + 1]
                else:  # gathered into o, free until the next pass
                    last_rows = np.take(s.h, [row for _, row in done], axis=0, out=s.o[:k])
                out = logits[first : first + k]
                self.governor.step(k.bit_length() * 3 + 2, k)
                project_out = self._project_rows(k)
                project_out.tiles = project.tiles  # what _blocks found for this pass
                project_out(last_rows, (w.output, out))
                self._softcap(out)
        for piece, (cache, *_) in zip(pieces, spans):
            cache.commit(piece)

    def _project_rows(self, m: int) -> Projector:
        """The Projector for passes of m rows: its buffers are kept for the common sizes."""
        if m in (1, self.n_batch) or m > BATCH_PROJECTOR_ROWS:
            return self._project
        project = self._batch_projectors.get(m)
        if project is None:
            project = self._batch_projectors[m] = Projector(m)
        return project

    def _softcap(self, logits: np.ndarray) -> None:
        if self.config.final_logit_softcap:
            kernels.softcap(logits, np.float32(self.config.final_logit_softcap))

    def _blocks(self, ids: np.ndarray, spans, project: Projector) -> None:
        """Embed ids [M] (M <= n_batch) and run every block; h ends as output_norm(x).

        spans: ((cache, r0, r1, pos0), ...): rows r0..r1-1 are consecutive tokens of the sequence in `cache`, at
        positions pos0.. (checked by the caller); attention runs per span, on its own cache."""
        c, w, s = self.config, self.weights, self.state
        m = ids.shape[0]
        x, h = s.x[:m], s.h[:m]
        w.token_embd.rows(ids, out=x)
        if self._embed_scale is not None:  # one float32 product per value: NumPy's bits, no kernel to compile
            np.multiply(x, self._embed_scale, out=x)
        kernels.rmsnorm(x, w.layers[0].attn_norm, c.rms_eps, h)
        project.tiles, rows = self._multi_row_ready() if m > 1 else (True, True)
        groups, grouped = self._decode_groups(spans) if rows else ([], frozenset())  # (ROWS: the group kernels)
        prompts, stored = self._prompt_groups(spans) if rows else ([], frozenset())
        alone = [span for span in spans if span[1] not in grouped]  # the spans whose attention runs span by span
        step, kinds, bucket = self.governor.step, self._step_kind, m.bit_length() * 3  # rows 2^(b-1)..2^b - 1
        for il, lw in enumerate(w.layers):
            step(bucket + kinds[il], m)
            self._attention_block(il, lw, m, alone, project, groups, rows, prompts, stored)
            next_norm = w.layers[il + 1].attn_norm if il + 1 < c.n_layer else w.output_norm
            self._ffn_block(lw, m, next_norm, project)

    @staticmethod
    def _group_spans(spans, prompts: bool) -> list[tuple]:
        """The spans of this pass of one kind (prompt chunks of several rows, or one-token decode rows) whose caches
        are slots of one KVCache group, two or more per group: [(group_kv, [(r0, r1, pos0, slot), ...]), ...];
        group_kv of a q8_0 group is (keys, values, key scales, value scales), and only its decode rows group."""
        by_group: dict[int, tuple] = {}
        for cache, r0, r1, pos0 in spans:
            if (r1 - r0 > 1) == prompts and cache.group_kv is not None and not (prompts and cache.quantized):
                arrays = (*cache.group_kv, *cache.group_scales) if cache.quantized else cache.group_kv
                entry = by_group.setdefault(id(cache.group_kv[0]), (arrays, []))
                entry[1].append((r0, r1, pos0, cache.slot))
        return [(group_kv, members) for group_kv, members in by_group.values() if len(members) >= 2]

    def _decode_groups(self, spans) -> tuple[list, frozenset]:
        """The one-token spans of this pass whose caches are slots of one KVCache group (two or more per group):
        their new K/V and their attention run in one kernels.qkv_rope_store_group and one attend_group call per
        layer instead of one qkv_rope_store and one attend_one per span (q8_0 caches: qkv_rope_store_group_q8_0,
        attend_group_q8_0 and fwht_rows_at). ([(group_kv, rows, slots, positions, {window: first visible position},
        end positions), ...] with arrays int64 [n], the rows those groups take)."""
        groups = []
        for group_kv, members in self._group_spans(spans, prompts=False):
            rows, _, pos, slots = (np.array(col, np.int64) for col in zip(*members))
            starts = {w: (np.maximum(0, pos - w + 1) if w else np.zeros_like(pos)) for w in set(self._window)}
            groups.append((group_kv, rows, slots, pos, starts, pos + 1))
        return groups, frozenset(int(r) for g in groups for r in g[1])

    def _prompt_groups(self, spans) -> tuple[list, frozenset]:
        """The spans of several rows (prompt chunks) of this pass whose caches are slots of one KVCache group (two or
        more per group): their new K/V go to the caches in one kernels.qkv_rope_store_spans call per layer instead of
        one qkv_rope_store_rows per span, whose few rows ran on one thread. ([(group_kv, rows0, pos0s, lens, slots,
        first_item), ...] with arrays int64, first_item each span's first work item and then their count; the first
        rows of those spans)."""
        groups = []
        for group_kv, members in self._group_spans(spans, prompts=True):
            rows0, ends, pos0s, slots = (np.array(col, np.int64) for col in zip(*members))
            lens = ends - rows0
            groups.append((group_kv, rows0, pos0s, lens, slots, kernels.store_spans_items(pos0s, lens)))
        return groups, frozenset(int(r) for g in groups for r in g[1])

    def _beside_compiler(self):
        """A context for one pass: while a helper process compiles the multi-row kernels (the first run ever,
        self.pending), the pass runs on the cores it leaves (runtime.threads_beside: 1 thread on 2 cores), so that
        no thread of ours waits at a barrier for one the compiler displaced. Gemma3's first run on 2 cores: the
        warm-up pass after the first kernels 0.25-0.33 s (2 threads beside the compiling helper, ThreadGovernor off
        during it) and the first token 0.05-0.18 s after the load, where a quiet machine takes ~0.03 s for each."""
        pending = self.pending
        return _AS_IS if pending is None else threads_beside(pending.helpers_running())

    def _multi_row_ready(self) -> tuple[bool, bool]:
        """Whether a pass of several rows may call (the tiled products, kernels.attend_rows): yes, unless a helper
        still compiles them (the first run ever, self.pending); its rows then run one at a time (each product's
        dot_one, attend_one per query), which is never worth waiting for: Gemma3, first run, a 600-token prompt's
        first token 3.6-4.8 s after load that way, 11.9 s when it waited for the products' compilation (~6 ms a row
        against ~1.5 ms tiled, while the helper needs ~10 s; the helper compiles the products first)."""
        pending = self.pending
        if pending is None:
            return True, True
        tiles, rows = pending.ready(TILED), pending.ready(ROWS)  # each loads what was compiled
        if tiles and rows and pending.ready(BATCH_SAMPLING):  # every kernel it holds (compile_kernels defers these)
            self.pending = None
        return tiles, rows

    @property
    def compiling(self) -> bool:
        """Whether a helper process still compiles kernels in the background (the first run after an install or a
        change to the kernels' source, self.pending): until it is done, passes of several rows run one row at a
        time on the cores it leaves (a server's batched steps ~2x a one-row step instead of ~5x: what a benchmark
        must not measure). Cheap and safe from any thread: it looks at the helper's process only."""
        pending = self.pending
        return pending is not None and pending.helpers_running() > 0

    def batch_sampling_ready(self) -> bool:
        """Whether kernels.greedy_rows may be called (sampling.sample_greedy_rows): yes, unless a helper still
        compiles it (the first run ever, self.pending), when each greedy row of a batched step samples alone (the
        same bits)."""
        pending = self.pending
        return pending is None or pending.ready(BATCH_SAMPLING)

    def _attention_block(self, il: int, lw: LayerWeights, m: int, spans, project: Projector, groups=(),
                         rows: bool = True, prompts=(), stored=frozenset()) -> None:  # fmt: skip
        """x += [post_norm](attention(h) @ attn_output.T); then h = ffn_norm(x). `spans`: those whose attention runs
        span by span (the pass's spans but those in `groups`, _decode_groups' decode rows of a KVCache group);
        `prompts`, `stored`: _prompt_groups. rows=False: kernels.attend_rows is not compiled yet (self.pending), a
        span of several rows runs kernels.attend_one per row (the bits attend_rows gives each query)."""
        c, s = self.config, self.state
        h, att, o = s.h[:m], s.att[:m], s.o[:m]
        if lw.attn_qkv is not None:  # Q, K and V from one product
            fused = s.qkv[:m]
            project(h, (lw.attn_qkv, fused))
            if m == 1:  # decode: views of its one row
                q, k, v = self._qkv1
            else:  # several rows: copied out (the attention kernels take C-contiguous rows)
                q, k, v = s.q[:m], s.k[:m], s.v[:m]
                a, b = self._qkv_split
                np.copyto(q, fused[:, :a])
                np.copyto(k, fused[:, a:b])
                np.copyto(v, fused[:, b:])
        else:
            q, k, v = s.q[:m], s.k[:m], s.v[:m]
            project(h, (lw.attn_q, q), (lw.attn_k, k), (lw.attn_v, v))
        cos, sin = self._rope[il]
        window = self._window[il]
        softcap = self._attn_softcap
        for (k_group, v_group), rows0, pos0s, lens, slots, first_item in prompts:  # before their attention
            kernels.qkv_rope_store_spans(
                q, k, v, lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm, c.rms_eps,
                cos, sin, c.spec.rope_neox, np.float32(c.attn_scale), rows0, pos0s, lens, slots, first_item,
                k_group[il], v_group[il],
            )  # fmt: skip
        for cache, r0, r1, pos0 in spans:
            if cache.quantized:
                self._attend_q8_0(il, lw, q[r0:r1], k[r0:r1], v[r0:r1], cache, r0, r1, pos0, rows)
                continue
            k_cache, v_cache = cache.k[il], cache.v[il]
            if r0 not in stored:
                store = kernels.qkv_rope_store_rows if rows and r1 - r0 > 1 else kernels.qkv_rope_store
                store(
                    q[r0:r1], k[r0:r1], v[r0:r1],
                    lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm, c.rms_eps,
                    cos, sin, c.spec.rope_neox, np.float32(c.attn_scale), pos0, k_cache, v_cache,
                )  # fmt: skip
            end = pos0 + r1 - r0  # keys at positions [t0, end) can be visible to some query of this span
            t0 = max(0, pos0 - window + 1) if window else 0
            if r1 - r0 == 1:
                kernels.attend_one(q[r0], k_cache, v_cache, t0, end, softcap, s.head_scores, att[r0])
            elif not rows:
                for r, p in zip(range(r0, r1), range(pos0, end)):  # row r: its decode step's attention
                    t = max(0, p - window + 1) if window else 0
                    kernels.attend_one(q[r], k_cache, v_cache, t, p + 1, softcap, s.head_scores, att[r])
            else:
                kernels.attend_rows(
                    q[r0:r1], k_cache, v_cache, pos0, t0, end - t0, window, softcap, s.block_scores, att[r0:r1]
                )
        for arrays, rows, slots, positions, starts, ends in groups:
            if len(arrays) == 4:  # q8_0 slots
                self._attend_group_q8_0(il, lw, q, k, v, arrays, rows, slots, positions, starts[window], ends)
                continue
            k_group, v_group = arrays
            kernels.qkv_rope_store_group(
                q, k, v, lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm, c.rms_eps,
                cos, sin, c.spec.rope_neox, np.float32(c.attn_scale), rows, slots, positions, k_group[il], v_group[il],
            )  # fmt: skip
            scratch = s.block_scores
            kernels.attend_group(q, k_group[il], v_group[il], rows, slots, starts[window], ends, softcap, scratch, att)
        project(att, (lw.attn_output, o))
        add_norm = kernels.add_norm_rows if project.tiles and m > 1 else kernels.add_norm  # (TILED)
        add_norm(s.x[:m], o, lw.post_attention_norm, lw.ffn_norm, c.rms_eps, h)

    def _attend_group_q8_0(self, il: int, lw: LayerWeights, q, k, v, arrays, rows, slots, positions, starts,
                           ends) -> None:  # fmt: skip
        """_attend_q8_0 for the decode rows `rows` of q, k, v whose caches are slots of one q8_0 group (group_kv and
        group_scales: `arrays`), one call of each kernel per layer: the same operations per row, so the same bits."""
        c, s = self.config, self.state
        cos, sin = self._rope[il]
        kq, vq, kd, vd = (a[il] for a in arrays)
        kernels.qkv_rope_store_group_q8_0(
            q, k, v, lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm,
            c.rms_eps, cos, sin, c.spec.rope_neox, self._rot_k, self._rot_v, s.q_qs, s.q_d, rows, slots, positions,
            kq, kd, vq, vd,
        )  # fmt: skip
        kernels.attend_group_q8_0(s.q_qs, s.q_d, kq, kd, vq, vd, rows, slots, starts, ends, np.float32(c.attn_scale),
                                  self._attn_softcap, s.block_scores, s.att)  # fmt: skip
        if self._rot_v:
            kernels.fwht_rows_at(s.att, rows, self._rot_v)  # V was stored rotated: rotate the outputs back

    def _attend_q8_0(self, il: int, lw: LayerWeights, q, k, v, cache: KVCache, r0: int, r1: int, pos0: int,
                     rows: bool = True) -> None:  # fmt: skip
        """Rows r0..r1-1 of one sequence on a q8_0 cache (kernels' q8_0 section), their Q, K, V in q, k, v: Q, K, V
        rotated (Walsh-Hadamard, as llama.cpp does for a quantized cache), Q quantized, K/V stored as Q8_0 rows, att
        = attention over the quantized cache with the attention scale applied to the scores, rotated back. A prompt
        chunk's rows are stored and rotated back on the threads (qkv_rope_store_group_q8_0 on this cache as a group
        of one slot, fwht_rows_at) where `rows` says those kernels are compiled (ROWS), else one after another: the
        same bits."""
        c, s = self.config, self.state
        cos, sin = self._rope[il]
        window = self._window[il]
        qs, qd = s.q_qs[r0:r1], s.q_d[r0:r1]
        kq, kd, vq, vd = cache.k[il], cache.k_scale[il], cache.v[il], cache.v_scale[il]
        n = r1 - r0
        parallel = rows and n > 1
        if parallel:  # (a prompt chunk of SmolLM2's 8 x 32 rows: 53 of a 241 ms pass one row after another)
            at, zero = np.arange(n, dtype=np.int64), np.zeros(n, np.int64)
            kernels.qkv_rope_store_group_q8_0(
                q, k, v, lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm, c.rms_eps,
                cos, sin, c.spec.rope_neox, self._rot_k, self._rot_v, qs, qd, at, zero, at + pos0, kq[None], kd[None],
                vq[None], vd[None],
            )  # fmt: skip
        else:
            kernels.qkv_rope_store_q8_0(
                q, k, v,
                lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias, lw.attn_q_norm, lw.attn_k_norm, c.rms_eps,
                cos, sin, c.spec.rope_neox, pos0, self._rot_k, self._rot_v, qs, qd, kq, kd, vq, vd,
            )  # fmt: skip
        scale, softcap = np.float32(c.attn_scale), self._attn_softcap
        if r1 - r0 == 1:
            t0 = max(0, pos0 - window + 1) if window else 0
            kernels.attend_one_q8_0(qs[0], qd[0], kq, kd, vq, vd, t0, pos0 + 1, scale, softcap, s.head_scores,
                                    s.att[r0])  # fmt: skip
        else:
            kernels.attend_rows_q8_0(qs, qd, kq, kd, vq, vd, pos0, window, scale, softcap, s.block_scores, s.key_tiles,
                                     s.key_scales, s.att[r0:r1])  # fmt: skip
        if self._rot_v and parallel:  # V was stored rotated: rotate the outputs back
            kernels.fwht_rows_at(s.att, np.arange(r0, r1, dtype=np.int64), self._rot_v)
        elif self._rot_v:
            kernels.fwht_rows(s.att[r0:r1], self._rot_v)

    def _ffn_block(self, lw: LayerWeights, m: int, next_norm: np.ndarray, project: Projector) -> None:
        """x += [post_norm](ffn_down(act(ffn_gate(h)) * ffn_up(h))) (or the experts' mix); then h = next_norm(x)."""
        c, s = self.config, self.state
        h, o = s.h[:m], s.o[:m]
        rows = project.tiles and m > 1  # the parallel kernels, compiled with the tiles (TILED)
        if lw.ffn_gate_inp is not None:
            self._moe(lw, m, project)
        else:
            gate = s.gate[:m]
            if lw.ffn_gate_up is not None:  # one product
                gate_up = s.gate_up[:m]
                project(h, (lw.ffn_gate_up, gate_up))
                if self._gelu_table is not None:
                    (kernels.geglu_halves_rows if rows else kernels.geglu_halves)(gate_up, gate, self._gelu_table)
                else:
                    (kernels.swiglu_halves_rows if rows else kernels.swiglu_halves)(gate_up, gate)
            else:
                up = s.up[:m]
                project(h, (lw.ffn_gate, gate), (lw.ffn_up, up))
                if self._gelu_table is not None:
                    (kernels.geglu_rows if rows else kernels.geglu)(gate, up, self._gelu_table)
                else:
                    (kernels.swiglu_rows if rows else kernels.swiglu)(gate, up)
            project(gate, (lw.ffn_down, o))
        add_norm = kernels.add_norm_rows if rows else kernels.add_norm
        add_norm(s.x[:m], o, lw.post_ffw_norm, next_norm, c.rms_eps, h)

    def _moe(self, lw: LayerWeights, m: int, project: Projector) -> None:
        """o = the mixture of experts of h (src/llama-graph.cpp build_moe_ffn): route each row to its top-k
        experts, run each chosen expert once on all the rows routed to it (gathered into one matrix product;
        a decode step reads only its k experts' matrices, in one kernel call per matrix where they are stacked:
        the same bits as each expert's own product), scatter the outputs to (token, rank) rows and sum them
        per token in rank order, weighted; qwen2moe adds the shared expert times sigmoid(its gate logit)."""
        c, s = self.config, self.state
        k, spec = c.n_expert_used, c.spec
        h, o = s.h[:m], s.o[:m]
        router, sel, weights = s.router[:m], s.expert_sel[:m], s.expert_weights[:m]
        project(h, (lw.ffn_gate_inp, router))
        kernels.route(router, spec.expert_gating == "sigmoid", spec.expert_weights_norm, sel, weights)
        order, offsets, active = s.expert_order[: m * k], s.expert_offsets, s.expert_active
        n_active = kernels.group_by_expert(sel, offsets, order, active)
        outs = s.expert_outs[: m * k]
        stacked = m == 1 and lw.ffn_gate_up_stack is not None and lw.ffn_down_stack is not None
        if stacked:  # decode: the k experts' gate / up in one kernel call, their downs in another
            project.experts(h, lw.ffn_gate_up_stack, s.expert_gate_up, sel[0], shared=True)
            kernels.swiglu_halves(s.expert_gate_up, s.expert_act)
            project.experts(s.expert_act, lw.ffn_down_stack, outs, sel[0], shared=False)
        for i in range(0 if stacked else n_active):
            e = active[i]
            rows = order[offsets[e] : offsets[e + 1]]
            n = rows.shape[0]
            # decode: x is h (every row chose e) and y is the output's own (token 0, rank r) row
            x = h if n == m else s.expert_in[:n]
            y = outs[rows[0] : rows[0] + 1] if m == 1 else s.expert_out[:n]
            if x is not h:
                kernels.gather_rows(h, rows, k, x)
            gate_up = lw.ffn_gate_up_exps[e] if n == 1 and lw.ffn_gate_up_exps else None
            self._swiglu_ffn(lw.ffn_gate_exps[e], lw.ffn_up_exps[e], lw.ffn_down_exps[e], x, y, project, gate_up)
            if m > 1:
                kernels.scatter_rows(y, rows, outs)
        kernels.combine_experts(outs, weights, o)
        if lw.ffn_gate_inp_shexp is not None:
            y, gate_logit = s.expert_out[:m], s.shexp_gate[:m]
            project(h, (lw.ffn_gate_inp_shexp, gate_logit))
            self._swiglu_ffn(lw.ffn_gate_shexp, lw.ffn_up_shexp, lw.ffn_down_shexp, h, y, project)
            kernels.add_gated(o, y, gate_logit)
        self.expert_bytes_read += n_active * lw.expert_bytes

    def _swiglu_ffn(self, gate: Linear, up: Linear, down: Linear, x: np.ndarray, out: np.ndarray, project,
                    gate_up: Linear | None = None) -> None:  # fmt: skip
        """out = down(silu(gate(x)) * up(x)) for one expert: x [n, n_embd], out [n, n_embd]; one row with the
        expert's fused gate_up (LayerWeights.ffn_gate_up_exps) takes gate and up in one product."""
        s, n, f = self.state, x.shape[0], gate.n_out
        if gate_up is not None:
            g, u = self._expert_gate_up1
            project(x, (gate_up, s.expert_gate_up[:1]))
        else:
            g, u = s.expert_gate[: n * f].reshape(n, f), s.expert_up[: n * f].reshape(n, f)
            project(x, (gate, g), (up, u))
        (kernels.swiglu_rows if project.tiles and n > 1 else kernels.swiglu)(g, u)
        project(g, (down, out))
