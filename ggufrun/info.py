"""`ggufrun inspect FILE`: what a GGUF file holds and how much RAM running it takes.

`summarize(gguf_file, n_ctx)` gathers everything into a plain, JSON-ready dict; the command prints it as text
or dumps it with --json. Nothing here reads tensor data: it all comes from the header.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .reader import ARRAY, STRING, VALUE_TYPE_NAMES, GGUFFile, StringArray

# tokenizer.ggml.model -> what kind of tokenizer it is (llama.cpp src/llama-vocab.cpp, llama_vocab::load)
TOKENIZER_KINDS = {
    "llama": "SentencePiece (SPM)",
    "gpt2": "byte-level BPE",
    "bert": "WordPiece (WPM)",
    "t5": "Unigram (UGM)",
    "rwkv": "RWKV",
    "plamo2": "PLaMo-2",
    "none": "none (token ids only)",
    "no_vocab": "none (token ids only)",
}
ARRAY_SHOWN = 8  # arrays longer than this are summarised: element type, length, first few elements
STRING_SHOWN = 200  # in text output, longer strings are cut (the JSON output keeps them whole)
KV_BYTES = 2  # the KV cache is F16 by default
# bytes per cached value of each kv_dtype (ggufrun.model.kv_cache.KV_BYTES; not imported: that module loads Numba);
# q8_0 stores blocks of 32 values (int8 codes and an f16 scale) and needs head dimensions that are multiples of 32
KV_DTYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "f32": 4.0}


def _plain(v):
    """A metadata value as plain JSON-able Python (NumPy scalars and arrays converted)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, StringArray)):
        return [_plain(x) for x in v]
    return v


def _summarize_value(v, vtype: int):
    if vtype != ARRAY:
        return _plain(v)
    n = len(v)
    if n <= ARRAY_SHOWN:
        return _plain(v)
    if isinstance(v, np.ndarray):
        etype = v.dtype.name
    elif v and isinstance(v[0], str):
        etype = VALUE_TYPE_NAMES[STRING]
    else:
        etype = VALUE_TYPE_NAMES[ARRAY]
    return {"array_of": etype, "length": n, "first": _plain(v[:5])}


def _arch_value(meta: dict, arch: str, key: str):
    return meta.get(f"{arch}.{key}")


def _positive_int(value) -> int | None:
    """`value` if it is a positive integer (not a bool), else None: a malformed key shows as "n/a", not a crash."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value > 0:
        return int(value)
    return None


def _per_layer(value, n_layer: int) -> list[int] | None:
    """A key llama.cpp reads with get_key_or_arr: one positive integer, or an array of one per layer (0 where a
    layer has none, as recurrent layers of hybrid models do); else None."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or value.size != n_layer or np.any(value < 0) or not np.any(value > 0):
            return None
        return [int(v) for v in value.tolist()]
    n = _positive_int(value)
    return None if n is None else [n]


def _kv_cache_bytes(meta: dict, arch: str, n_ctx: int, kv_dtype: str = "f16") -> int | None:
    """2 (K and V) x n_layer x n_ctx x n_head_kv x head_dim x 2 bytes (F16), with K and V head sizes apart; other
    kv_dtypes at their KV_DTYPE_BYTES (None for q8_0 when a head dimension is not a multiple of 32).

    head_dim is `{arch}.attention.key_length` / `value_length`, else embedding_length / head_count
    (llama.cpp src/llama-model.cpp reads the same keys with the same fallback). head_count and head_count_kv may
    be per-layer arrays. Every layer is counted at full n_ctx: an upper bound for sliding-window layers. None when
    a key is missing or malformed (not a positive integer, or an array of the wrong length).
    """
    n_layer = _positive_int(_arch_value(meta, arch, "block_count"))
    if n_layer is None:
        return None
    n_head = _per_layer(_arch_value(meta, arch, "attention.head_count"), n_layer)
    n_head_kv = _arch_value(meta, arch, "attention.head_count_kv")
    n_head_kv = n_head if n_head_kv is None else _per_layer(n_head_kv, n_layer)
    if n_head_kv is None:
        return None
    kv_heads = sum(n_head_kv) * (n_layer if len(n_head_kv) == 1 else 1)
    n_embd = _positive_int(_arch_value(meta, arch, "embedding_length"))
    head_dim = n_embd // max(n_head) if n_embd and n_head else None
    k_dim = _positive_int(_arch_value(meta, arch, "attention.key_length")) or head_dim
    v_dim = _positive_int(_arch_value(meta, arch, "attention.value_length")) or head_dim
    if not k_dim or not v_dim:
        return None
    if kv_dtype == "q8_0" and (k_dim % 32 or v_dim % 32):
        return None  # not available for this model
    return int(kv_heads * n_ctx * (k_dim + v_dim) * KV_DTYPE_BYTES[kv_dtype])


EXPERT_TENSORS = ("_exps.weight", "_exps.bias")  # the routed experts' 3-D tensors (src/llama-arch.cpp: ffn_*_exps)


def _experts(meta: dict, arch: str, tensors: list, n_params: int) -> dict | None:
    """Mixture of experts: `{arch}.expert_count`, `{arch}.expert_used_count` (one value, or the largest of a per-layer
    array) and the parameters one token runs through: every tensor outside the routed experts, plus used / count of
    the experts' (the shared expert, router and attention count whole). None for a dense model or malformed keys."""
    count = _positive_int(_arch_value(meta, arch, "expert_count"))
    used = _arch_value(meta, arch, "expert_used_count")
    if isinstance(used, np.ndarray) and used.dtype.kind in "iu" and used.size:
        used = used.max()
    used = _positive_int(used)
    if count is None or used is None or used > count:
        return None
    expert_params = sum(t.n_elements for t in tensors if t.name.endswith(EXPERT_TENSORS))
    return {"count": count, "used": used, "active_params": n_params - expert_params + expert_params * used // count}


def summarize(gguf_file: GGUFFile, n_ctx: int | None = None) -> dict:
    """Everything `ggufrun inspect` shows, as a JSON-ready dict.

    n_ctx: context length for the KV-cache estimate; default the model's `{arch}.context_length`.

    >>> with GGUFFile("model.gguf") as f:
    ...     s = summarize(f, n_ctx=2048)
    >>> s["architecture"], s["n_params"], s["memory"]["total_bytes"]
    """
    meta, types = gguf_file.metadata, gguf_file.value_types
    arch = meta.get("general.architecture") or "unknown"
    tensors = list(gguf_file.tensors.values())

    n_params = sum(t.n_elements for t in tensors)
    weight_bytes = sum(t.nbytes for t in tensors)
    bytes_per_type: Counter = Counter()
    tensors_per_type: Counter = Counter()
    for t in tensors:
        bytes_per_type[t.type.name] += t.nbytes
        tensors_per_type[t.type.name] += 1

    hparams = {k[len(arch) + 1 :]: _plain(v) for k, v in meta.items() if k.startswith(arch + ".")}

    tok_model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_size = (
        len(tokens) if isinstance(tokens, (list, StringArray)) else _positive_int(_arch_value(meta, arch, "vocab_size"))
    )
    if vocab_size is None and "token_embd.weight" in gguf_file.tensors:
        vocab_size = gguf_file.tensors["token_embd.weight"].shape[0]
    merges = meta.get("tokenizer.ggml.merges")
    tokenizer = {
        "model": tok_model,
        "kind": TOKENIZER_KINDS.get(tok_model, "unknown") if tok_model else None,
        "pre": meta.get("tokenizer.ggml.pre"),
        "vocab_size": vocab_size,
        "n_merges": len(merges) if isinstance(merges, (list, StringArray)) else None,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }

    context_length = _arch_value(meta, arch, "context_length")
    if n_ctx is None:
        n_ctx = _positive_int(context_length)
    kv_bytes = _kv_cache_bytes(meta, arch, n_ctx) if n_ctx else None
    memory = {
        "n_ctx": n_ctx,
        "weights_bytes": weight_bytes,
        "kv_cache_bytes": kv_bytes,
        "total_bytes": weight_bytes + (kv_bytes or 0),
    }
    # the KV cache at n_ctx for every kv_dtype (load(..., kv_dtype=...), --kv-dtype); None where not available
    kv_per_dtype = {d: _kv_cache_bytes(meta, arch, n_ctx, d) if n_ctx else None for d in KV_DTYPE_BYTES}

    return {
        "file": str(gguf_file.path),
        "files": [str(p) for p in gguf_file.paths],
        "file_bytes": sum(p.stat().st_size for p in gguf_file.paths),
        "gguf_version": gguf_file.version,
        "alignment": gguf_file.alignment,
        "architecture": arch,
        "name": meta.get("general.name"),
        "hyperparameters": hparams,
        "n_tensors": len(tensors),
        "n_params": n_params,
        "weight_bytes": weight_bytes,
        "bits_per_weight": weight_bytes * 8 / n_params if n_params else None,
        "experts": _experts(meta, arch, tensors, n_params),
        "bytes_per_type": dict(bytes_per_type.most_common()),
        "tensors_per_type": {k: tensors_per_type[k] for k, _ in bytes_per_type.most_common()},
        "tokenizer": tokenizer,
        "has_chat_template": bool(meta.get("tokenizer.chat_template")),
        "memory": memory,
        "kv_cache_bytes_per_dtype": kv_per_dtype,
        "metadata": {k: _summarize_value(v, types[k]) for k, v in meta.items()},
        "metadata_types": {k: VALUE_TYPE_NAMES[types[k]] for k in meta},
        "tensors": [
            {"name": t.name, "type": t.type.name, "shape": list(t.shape), "bytes": t.nbytes, "file": t.file.name}
            for t in tensors
        ],
    }


# -- text output ------------------------------------------------------------------------------------------


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:,.1f} MB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _show(v) -> str:
    if isinstance(v, dict) and "array_of" in v:
        first = ", ".join(repr(x) for x in v["first"])
        return f"[{v['array_of']} x {v['length']}] {first}, ..."
    if isinstance(v, float):
        return f"{v:.7g}"  # most metadata floats are FLOAT32: 1e-06, not 9.999999974752427e-07
    s = repr(v)
    return s if len(s) <= STRING_SHOWN else f"{s[:STRING_SHOWN]}... ({len(s)} chars)"


def format_text(s: dict) -> str:
    """The summary as the human-readable report `ggufrun inspect` prints."""
    out = []
    n_files = len(s["files"])
    files = f"{n_files} shards" if n_files > 1 else "1 file"
    out.append(f"file          {s['file']} ({_mb(s['file_bytes'])}, GGUF v{s['gguf_version']}, {files})")
    out.append(f"model         {s['name'] or '?'} (architecture {s['architecture']})")
    bpw = f"{s['bits_per_weight']:.2f}" if s["bits_per_weight"] else "n/a"
    out.append(
        f"parameters    {_count(s['n_params'])} in {s['n_tensors']} tensors, {_mb(s['weight_bytes'])}, "
        f"{bpw} bits per weight"
    )
    e = s["experts"]
    if e:
        out.append(
            f"experts       {e['count']}, {e['used']} used per token: {_count(e['active_params'])} active parameters "
            f"per token"
        )
    t = s["tokenizer"]
    merges = f", {t['n_merges']} merges" if t["n_merges"] is not None else ""
    pre = f", pre-tokenizer {t['pre']}" if t["pre"] else ""
    out.append(f"tokenizer     {t['model']} ({t['kind']}), {t['vocab_size']} tokens{merges}{pre}")
    out.append(f"chat template {'yes' if s['has_chat_template'] else 'no'}")
    m = s["memory"]
    if m["n_ctx"]:
        out.append(
            f"RAM           weights {_mb(m['weights_bytes'])} + KV cache (F16, n_ctx={m['n_ctx']}) "
            f"{_mb(m['kv_cache_bytes'])} = {_mb(m['total_bytes'])}"
        )
        per = [f"{d} {_mb(b)}" for d, b in s["kv_cache_bytes_per_dtype"].items() if b is not None]
        if per:
            out.append(f"KV cache      n_ctx={m['n_ctx']} per --kv-dtype: {', '.join(per)}")
    out.append("")
    out.append("hyper-parameters")
    for k, v in s["hyperparameters"].items():
        out.append(f"  {k:40s} {_show(v)}")
    out.append("")
    out.append("bytes per type")
    for k, n in s["bytes_per_type"].items():
        share = 100 * n / s["weight_bytes"] if s["weight_bytes"] else 0
        out.append(f"  {k:8s} {_mb(n):>12s} {share:5.1f}%  {s['tensors_per_type'][k]:4d} tensors")
    out.append("")
    out.append(f"metadata ({len(s['metadata'])} keys)")
    for k, v in s["metadata"].items():
        out.append(f"  {k:40s} {s['metadata_types'][k]:8s} {_show(v)}")
    out.append("")
    out.append(f"tensors ({s['n_tensors']})")
    width = max((len(x["name"]) for x in s["tensors"]), default=4)
    multi = n_files > 1
    for x in s["tensors"]:
        shape = "x".join(str(d) for d in x["shape"])
        where = f"  {x['file']}" if multi else ""
        out.append(f"  {x['name']:{width}s} {x['type']:8s} {shape:>14s} {x['bytes']:>12,d}{where}")
    return "\n".join(out)
