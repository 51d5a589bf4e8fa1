"""Tiny random-weight GGUF files for tests, written with gguf-py's GGUFWriter (one writer for every test file).

write_model(path, arch, ...) writes a llama/qwen2/qwen3/phi3/gemma2/gemma3 model (or, with n_expert, a mixture of
experts: llama (Mixtral-style), qwen2moe (with shared_ff: its shared expert), qwen3moe) in F32 (or with overridden
tensor types), with no tokenizer (token ids only) or a byte-level BPE tokenizer and a ChatML template, so that the
generation loop, the chat API and the server can be tested without downloading a real model.

write_gguf(path, metadata, tensors, ...) writes any GGUF file gguf-py can write (typed metadata via Typed, split
shards, big-endian, a tensor table without data); rewrite_gguf(src, dst, changes) copies a file with some metadata
keys replaced or dropped. Files gguf-py refuses to write (malformed headers) are built byte by byte in
test_reader_hostile.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ggufrun.reader import ARRAY, GGUFFile
from ggufrun.tokenizer.bpe import BYTE_TO_CHAR

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "a n"]


def _add_byte_tokenizer(w: gguf.GGUFWriter) -> int:
    """A gpt2-style vocabulary: 256 byte tokens, the merges' results, then ChatML control tokens. Returns its size."""
    tokens = list(BYTE_TO_CHAR)  # GPT-2's printable stand-ins for the 256 byte values
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for m in BYTE_MERGES:
        tokens.append(m.replace(" ", ""))
        types.append(gguf.TokenType.NORMAL)
    first_special = len(tokens)
    tokens += CHATML_SPECIALS
    types += [gguf.TokenType.CONTROL] * len(CHATML_SPECIALS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(BYTE_MERGES)
    w.add_bos_token_id(first_special)  # <|endoftext|>
    w.add_eos_token_id(first_special + 2)  # <|im_end|>
    w.add_add_bos_token(False)
    w.add_chat_template(
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    return len(tokens)


def write_model(
    path,
    arch="llama",
    *,
    dim=64,
    n_layer=2,
    n_head=4,
    n_kv=2,
    head_dim=16,
    ff=128,
    vocab=96,
    ctx=256,
    window=0,
    linear_scale=0.0,
    yarn=None,
    rope_freqs=False,
    softcap=0.0,
    attn_softcap=0.0,
    longrope=None,
    tied=False,
    seed=0,
    override=None,
    tokenizer="none",
    n_expert=0,
    n_expert_used=2,
    ff_exp=None,
    shared_ff=0,
    router_scale=1.0,
):
    """A random-weight model in F32. `override`: {tensor name: (array, raw GGML type or None)} replaces/adds
    tensors (None as the value drops one). `tokenizer`: "none" (ids only) or "bytes" (a byte-level BPE vocabulary
    of 256 byte tokens, a few merges and ChatML control tokens, with a ChatML chat template: the vocabulary size
    is then set by the tokenizer).

    Per architecture, the tensors its llama.cpp loader expects: phi3 has fused `attn_qkv` ([Q; K; V] rows) and
    `ffn_up` ([gate; up] rows, no ffn_gate); gemma2 has post-norms, no Q/K norms and no output.weight (llama.cpp
    ties it to token_embd). `softcap` / `attn_softcap`: final_logit_softcapping / attn_logit_softcapping keys.
    `longrope` (phi3): (original context length, attention factor): rope_factors_long / rope_factors_short tensors
    (divisors in [1, 4) and [1, 1.5)) and the keys rope.scaling.original_context_length, rope.scaling.attn_factor,
    as llama.cpp's converter writes them for LongRoPE models (conversion/phi.py).

    Mixture of experts: n_expert > 0 replaces each block's ffn_gate/up/down with a router `ffn_gate_inp`
    [n_expert, dim] (logits about router_scale x N(0, 1)) and 3-D experts `ffn_{gate,up,down}_exps` of width ff_exp
    (default ff; written as `expert_feed_forward_length` for qwen2moe/qwen3moe), n_expert_used per token;
    shared_ff > 0 adds qwen2moe's shared expert (`ffn_*_shexp`, gate `ffn_gate_inp_shexp`)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0 if arch != "gemma3" else 1e6)
    if tokenizer == "bytes":
        vocab = _add_byte_tokenizer(w)
    else:
        w.add_tokenizer_model(tokenizer)
    w.add_vocab_size(vocab)
    if window:
        w.add_sliding_window(window)
    if linear_scale:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(linear_scale)
    if yarn:  # (factor, original context length)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn[0])
        w.add_rope_scaling_orig_ctx_len(yarn[1])
    if softcap:
        w.add_final_logit_softcapping(softcap)
    if attn_softcap:
        w.add_attn_logit_softcapping(attn_softcap)
    if longrope:
        w.add_rope_scaling_orig_ctx_len(longrope[0])
        w.add_rope_scaling_attn_factors(longrope[1])
    ff_exp = ff_exp or ff
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        if arch != "llama":
            w.add_expert_feed_forward_length(ff_exp)
    if shared_ff:
        w.add_expert_shared_feed_forward_length(shared_ff)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    qd, kd = n_head * head_dim, n_kv * head_dim
    tensors = {"token_embd.weight": mat(vocab, dim), "output_norm.weight": norm(dim)}
    if not tied and arch != "gemma2":
        tensors["output.weight"] = mat(vocab, dim)
    if rope_freqs:
        tensors["rope_freqs.weight"] = (1.0 + 3.0 * rng.random(head_dim // 2)).astype(np.float32)
    if longrope:
        tensors["rope_factors_long.weight"] = (1.0 + 3.0 * rng.random(head_dim // 2)).astype(np.float32)
        tensors["rope_factors_short.weight"] = (1.0 + 0.5 * rng.random(head_dim // 2)).astype(np.float32)
    for il in range(n_layer):
        p = f"blk.{il}."
        tensors.update(
            {
                p + "attn_norm.weight": norm(dim),
                p + "attn_q.weight": mat(qd, dim),
                p + "attn_k.weight": mat(kd, dim),
                p + "attn_v.weight": mat(kd, dim),
                p + "attn_output.weight": mat(dim, qd),
                p + "ffn_norm.weight": norm(dim),
            }
        )
        if n_expert:
            tensors[p + "ffn_gate_inp.weight"] = router_scale * mat(n_expert, dim)
            tensors[p + "ffn_gate_exps.weight"] = np.stack([mat(ff_exp, dim) for _ in range(n_expert)])
            tensors[p + "ffn_up_exps.weight"] = np.stack([mat(ff_exp, dim) for _ in range(n_expert)])
            tensors[p + "ffn_down_exps.weight"] = np.stack([mat(dim, ff_exp) for _ in range(n_expert)])
        else:
            tensors[p + "ffn_gate.weight"] = mat(ff, dim)
            tensors[p + "ffn_up.weight"] = mat(ff, dim)
            tensors[p + "ffn_down.weight"] = mat(dim, ff)
        if shared_ff:
            tensors[p + "ffn_gate_inp_shexp.weight"] = mat(1, dim).reshape(dim)
            tensors[p + "ffn_gate_shexp.weight"] = mat(shared_ff, dim)
            tensors[p + "ffn_up_shexp.weight"] = mat(shared_ff, dim)
            tensors[p + "ffn_down_shexp.weight"] = mat(dim, shared_ff)
        if arch == "phi3":  # fused, as llama.cpp's converter writes Phi-3 (and its loader reads them)
            tensors[p + "attn_qkv.weight"] = np.concatenate([tensors.pop(p + f"attn_{x}.weight") for x in "qkv"])
            tensors[p + "ffn_up.weight"] = np.concatenate(
                [tensors.pop(p + "ffn_gate.weight"), tensors[p + "ffn_up.weight"]]
            )
        if arch in ("qwen2", "qwen2moe"):
            for name, n in (("attn_q.bias", qd), ("attn_k.bias", kd), ("attn_v.bias", kd)):
                tensors[p + name] = (0.3 * rng.standard_normal(n)).astype(np.float32)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            tensors[p + "attn_q_norm.weight"] = norm(head_dim)
            tensors[p + "attn_k_norm.weight"] = norm(head_dim)
        if arch in ("gemma2", "gemma3"):
            tensors[p + "post_attention_norm.weight"] = norm(dim)
            tensors[p + "post_ffw_norm.weight"] = norm(dim)
    raw_types = {}
    for name, value in (override or {}).items():
        if value is None:
            tensors.pop(name)
        else:
            tensors[name], raw_types[name] = value
    for name, arr in tensors.items():
        if raw_types.get(name) is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw_types[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- one GGUF writer for the reader, split, inspect and config tests ------------------------------------------


@dataclass(frozen=True)
class Typed:
    """A metadata value with its GGUF type spelled out (gguf-py would pick INT32 for an int, FLOAT32 for a float).

    sub_type: the element type of an ARRAY (None: gguf-py infers it from the first element).
    """

    value: Any
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


def write_gguf(
    path,
    metadata=None,
    tensors=None,
    *,
    arch="llama",
    split_max_tensors=0,
    endianess=gguf.GGUFEndian.LITTLE,
    data=True,
) -> list[Path]:
    """Write a GGUF file with gguf-py's GGUFWriter; return the files written ([path], or the shards in order).

    metadata: {key: value or Typed}; a list is an array, other values get gguf-py's default type.
    tensors: {name: array or (array, raw GGML type)}; with data=False, {name: (shape, dtype)} and only the tensor
    table is written (the caller places, or leaves out, the data).
    `general.architecture` is `arch`. split_max_tensors > 0 writes shards NAME-0000k-of-0000N.gguf. Without
    tensors the file ends right after the metadata (a test may append more by hand).
    """
    path = Path(path)
    w = gguf.GGUFWriter(path, arch=arch, split_max_tensors=split_max_tensors, endianess=endianess)
    for key, value in (metadata or {}).items():
        if isinstance(value, Typed):
            w.add_key_value(key, value.value, value.vtype, value.sub_type)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, gguf.GGUFValueType.get_type(value))
    for name, value in (tensors or {}).items():
        if not data:
            shape, dtype = value
            dtype = np.dtype(dtype)
            w.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
        elif isinstance(value, tuple):
            w.add_tensor(name, value[0], raw_dtype=value[1])
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if tensors and data:
        w.write_tensors_to_file()
    elif tensors:
        w.write_ti_data_to_file()
    w.close()
    if not split_max_tensors:
        return [path]
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))


_ARRAY_TYPES = {
    np.dtype(np.uint8): gguf.GGUFValueType.UINT8, np.dtype(np.int8): gguf.GGUFValueType.INT8,
    np.dtype(np.uint16): gguf.GGUFValueType.UINT16, np.dtype(np.int16): gguf.GGUFValueType.INT16,
    np.dtype(np.uint32): gguf.GGUFValueType.UINT32, np.dtype(np.int32): gguf.GGUFValueType.INT32,
    np.dtype(np.uint64): gguf.GGUFValueType.UINT64, np.dtype(np.int64): gguf.GGUFValueType.INT64,
    np.dtype(np.float32): gguf.GGUFValueType.FLOAT32, np.dtype(np.float64): gguf.GGUFValueType.FLOAT64,
    np.dtype(np.bool_): gguf.GGUFValueType.BOOL,
}  # fmt: skip


def rewrite_gguf(src, dst, changes) -> Path:
    """Copy GGUF file `src` to `dst` with metadata `changes` ({key: value or Typed, or None to drop the key}).

    Every other key keeps its value and GGUF type, every tensor its bytes and GGML type (nested arrays are not
    copied: gguf-py cannot write them).
    """
    metadata = {}
    with GGUFFile(src) as f:
        arch = f.metadata["general.architecture"]
        for key, value in f.metadata.items():
            if key == "general.architecture":
                continue
            vtype = gguf.GGUFValueType(f.value_types[key])
            if vtype != ARRAY:
                metadata[key] = Typed(value, vtype)
            elif isinstance(value, np.ndarray):
                metadata[key] = Typed(value.tolist(), vtype, _ARRAY_TYPES[value.dtype])
            elif value and all(isinstance(v, str) for v in value):
                metadata[key] = Typed(value, vtype, gguf.GGUFValueType.STRING)
        tensors = {name: (np.array(t.data), t.type) for name, t in f.tensors.items()}
    for key, value in changes.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    write_gguf(dst, metadata, tensors, arch=arch)
    return Path(dst)
