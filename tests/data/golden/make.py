"""Regenerate llama.cpp goldens for tiny synthetic models: the script behind every `small-*.logits.npz` added here.

    python tests/data/golden/make.py                 # every model in MODELS (writes X.gguf and X.logits.npz here)
    python tests/data/golden/make.py small-phi3-q8_0 # the named ones
    python tests/data/golden/make.py --logits FILE.gguf  # only llama.cpp's logits for an existing file

It needs llama.cpp, which no test needs: the Python binding `llama_cpp` (llama-cpp-python, whose build loads
libllama.so; set LLAMA_CPP_LIB_PATH to a folder holding a native build of the same source), and, for files that
are quantized after writing, `llama-quantize` on PATH or in LLAMA_CPP_BIN. The README beside this script says which
llama.cpp build made the committed files.

A golden is what tests/data/golden/README.md describes: `tokens` (20 random prompt ids, then 12 ids llama.cpp chose
greedily), `logits` [N-1, vocab] (row i: llama.cpp's logits after tokens[0..i]; the prompt rows from one batched
pass, the rest from one-token decode steps), `n_prompt`. llama.cpp runs on the CPU backend with an F16 KV cache and
flash attention off, as for the committed goldens.

Each entry of MODELS is a function that writes the model file (gguf-py's GGUFWriter, via tests/synthetic.py, then
`llama-quantize --pure` when the type is one llama.cpp quantizes to) and returns nothing; the logits are computed
the same way for all of them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # tests/, for synthetic.py

N_PROMPT, N_GEN = 20, 12

# The shape of the committed small-* models (manifest-small.json); new architectures keep it where they can.
SMALL = dict(dim=256, n_layer=2, n_head=4, n_kv=2, head_dim=64, ff=512, vocab=256, ctx=2048)


# -- llama.cpp -------------------------------------------------------------------------------------------------


_QUIET = None


def _quiet_log():
    import llama_cpp as L

    return L.llama_log_callback(lambda level, text, data: None)


def llama_cpp_logits(
    path: Path, prompt: list[int], n_gen: int = N_GEN, n_threads: int = 2, type_kv: int | None = None
) -> tuple[list, np.ndarray]:
    """llama.cpp's logits for `prompt` (one batched pass) and `n_gen` greedy tokens (one-token steps).

    Returns (tokens, logits): tokens = prompt + the greedy ids; logits[i] = the logits after tokens[0..i].
    type_kv: a GGML_TYPE_* for the K and V cache (default F16, flash attention off); given, flash attention is on,
    which llama.cpp requires for a quantized V cache.
    """
    import llama_cpp as L

    global _QUIET
    _QUIET = _QUIET or _quiet_log()  # kept alive: llama.cpp calls it later
    L.llama_log_set(_QUIET, None)  # llama.cpp logs every tensor it loads on stderr
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = max(64, len(prompt) + n_gen + 8)
    cp.n_batch = cp.n_ubatch = max(len(prompt), 1)
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if type_kv is not None:
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.type_k = cp.type_v = type_kv
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context for {path}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(len(prompt), 0, 1)
    rows = []

    def decode(ids: list[int], pos0: int) -> None:
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode failed on {path}")
        for i in range(len(ids)):
            ptr = L.llama_get_logits_ith(ctx, i)
            rows.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy())

    try:
        tokens = list(prompt)
        decode(tokens, 0)
        for _ in range(n_gen):
            tokens.append(int(rows[-1].argmax()))
            decode([tokens[-1]], len(tokens) - 1)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    # the last token's logits are not part of a golden (nothing follows it)
    return tokens, np.stack(rows[:-1])


def write_golden(path: Path, seed: int = 0, vocab: int | None = None) -> Path:
    """Write `path`'s golden (X.logits.npz beside X.gguf) from llama.cpp; the prompt is 20 random ids."""
    import gguf

    if vocab is None:
        reader = gguf.GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        vocab = int(reader.fields[f"{arch}.vocab_size"].parts[-1][0])
    prompt = np.random.default_rng(seed).integers(0, vocab, N_PROMPT).tolist()
    tokens, logits = llama_cpp_logits(path, prompt)
    out = path.with_name(path.name.removesuffix(".gguf") + ".logits.npz")
    np.savez_compressed(out, tokens=np.array(tokens, np.int32), logits=logits, n_prompt=np.int32(N_PROMPT))
    return out


def llama_quantize(src: Path, dst: Path, qtype: str, imatrix: Path | None = None) -> None:
    """`llama-quantize --pure src dst qtype`: every 2-D weight (embedding and output included) in `qtype`."""
    exe = shutil.which("llama-quantize") or os.path.join(os.environ.get("LLAMA_CPP_BIN", ""), "llama-quantize")
    cmd = [exe, "--pure", *(["--imatrix", str(imatrix)] if imatrix else []), str(src), str(dst), qtype]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def quantized(stem: str, qtype: str, write) -> None:
    """Write an F32 model with `write(path)` into a temporary file and quantize it to HERE/stem.gguf."""
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        write(f32)
        llama_quantize(f32, HERE / f"{stem}.gguf", qtype)


# -- the models ------------------------------------------------------------------------------------------------

MODELS: dict = {}  # stem -> function(path) writing HERE/stem.gguf


def model(stem: str):
    def register(fn):
        MODELS[stem] = fn
        return fn

    return register


def longrope_attn_factor(n_ctx_train: int, n_ctx_orig: int) -> float:
    """The attention factor llama.cpp's converter writes for a LongRoPE model (conversion/phi.py, Phi3MiniModel)."""
    scale = n_ctx_train / n_ctx_orig
    return math.sqrt(1 + math.log(scale) / math.log(n_ctx_orig)) if scale > 1.0 else 1.0


@model("small-phi3-q8_0")
def small_phi3(path: Path) -> None:
    """phi3: fused attn_qkv and gate/up; LongRoPE factors whose original context is the trained one (2048), so
    llama.cpp (n_ctx 256) and ggufrun (n_ctx 2048) both pick the short factors; a sliding window both ignore."""
    from synthetic import write_model

    quantized(path.stem, "Q8_0", lambda p: write_model(p, "phi3", **SMALL, window=8, longrope=(2048, 1.0)))


@model("small-phi3-longrope-q8_0")
def small_phi3_longrope(path: Path) -> None:
    """phi3 with an original context of 128 < llama.cpp's n_ctx (256): the long factors and the attention factor
    (1.25) apply."""
    from synthetic import write_model

    longrope = (128, longrope_attn_factor(SMALL["ctx"], 128))
    quantized(path.stem, "Q8_0", lambda p: write_model(p, "phi3", **SMALL, longrope=longrope))


@model("small-gemma2-q8_0")
def small_gemma2(path: Path) -> None:
    """gemma2: layer 0 local (window 8, crossed by the 32 tokens), layer 1 global; attention-logit soft-capping at
    1.5 and final-logit soft-capping at 2.0 (small caps, so that tanh bends these random models' scores and logits);
    embedding scale, post-norms, GELU, output tied to token_embd."""
    from synthetic import write_model

    quantized(path.stem, "Q8_0", lambda p: write_model(p, "gemma2", **SMALL, window=8, attn_softcap=1.5, softcap=2.0))


# Mixture of experts (src/models/qwen2moe.cpp, qwen3moe.cpp, llama.cpp's MoE branch): 4 experts, 2 per token; the
# router's logits spread about 2 x N(0, 1) so that the top-2 choice rarely sits on a near-tie that llama.cpp's 8-bit
# activations could flip. llama-quantize keeps the router (ffn_gate_inp) and the 1-D shared-expert gate in F32.
MOE = dict(n_expert=4, n_expert_used=2, router_scale=2.0)


@model("small-qwen2moe-q8_0")
def small_qwen2moe_q8_0(path: Path) -> None:
    from synthetic import write_model

    quantized(
        path.stem,
        "Q8_0",
        lambda f: write_model(f, "qwen2moe", **SMALL | dict(ff=256), **MOE, ff_exp=128, shared_ff=256),
    )


@model("small-qwen3moe-q8_0")
def small_qwen3moe_q8_0(path: Path) -> None:
    from synthetic import write_model

    quantized(path.stem, "Q8_0", lambda f: write_model(f, "qwen3moe", **SMALL | dict(ff=256), **MOE, ff_exp=128))


@model("small-mixtral-q8_0")
def small_mixtral_q8_0(path: Path) -> None:
    """A llama file with experts (Mixtral-style: ffn_gate_inp, ffn_*_exps as wide as feed_forward_length)."""
    from synthetic import write_model

    quantized(path.stem, "Q8_0", lambda f: write_model(f, "llama", **SMALL | dict(ff=128), **MOE))


# -- grid weight types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) -------------------------------------------------


def write_uniform_imatrix(model_path: Path, out: Path) -> None:
    """An importance matrix of ones for every 2-D weight of `model_path`, in the legacy format that llama.cpp's
    common/imatrix-loader.cpp reads (int32 entry count; per entry: int32 name length, name, int32 ncall = 1,
    int32 n values = the row length, float32 values). llama-quantize refuses IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
    IQ1_S and IQ1_M without one (src/llama-quant.cpp tensor_requires_imatrix); all-equal importances make the
    quantizer fit every value alike, as it would without a matrix."""
    import gguf

    entries = [(t.name, int(t.data.shape[-1])) for t in gguf.GGUFReader(str(model_path)).tensors if t.data.ndim == 2]
    parts = [np.int32(len(entries)).tobytes()]
    for name, n in entries:
        parts += [np.int32(len(name)).tobytes(), name.encode(), np.array([1, n], np.int32).tobytes()]
        parts.append(np.ones(n, np.float32).tobytes())
    out.write_bytes(b"".join(parts))


def quantized_uniform_imatrix(stem: str, qtype: str, write) -> None:
    """quantized(), with a uniform importance matrix (write_uniform_imatrix): the grid types that need one, and
    IQ3_S with them (one recipe for the five)."""
    with tempfile.TemporaryDirectory() as tmp:
        f32, imatrix = Path(tmp) / "f32.gguf", Path(tmp) / "imatrix.dat"
        write(f32)
        write_uniform_imatrix(f32, imatrix)
        llama_quantize(f32, HERE / f"{stem}.gguf", qtype, imatrix)


def _small_llama(path: Path) -> None:
    from synthetic import write_model

    write_model(path, "llama", seed=1, **SMALL)


# tensor type -> the llama-quantize file type whose every tensor has it under --pure (llama_ftype_get_default_type in
# src/llama-quant.cpp: file type IQ2_S is IQ2_XS tensors, IQ2_M is IQ2_S tensors)
for _qtype, _ftype in (
    ("IQ2_XXS", "IQ2_XXS"),
    ("IQ2_XS", "IQ2_XS"),
    ("IQ2_S", "IQ2_M"),
    ("IQ3_XXS", "IQ3_XXS"),
    ("IQ3_S", "IQ3_S"),
):
    _stem = f"small-llama-{_qtype.lower()}"
    model(_stem)(lambda path, stem=_stem, ftype=_ftype: quantized_uniform_imatrix(stem, ftype, _small_llama))


# -- IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4: the same model, every 2-D weight in the type --------------------------------


@model("small-llama-iq1_s")
def small_llama_iq1_s(path: Path) -> None:
    quantized_uniform_imatrix(path.stem, "IQ1_S", _small_llama)


@model("small-llama-iq1_m")
def small_llama_iq1_m(path: Path) -> None:
    quantized_uniform_imatrix(path.stem, "IQ1_M", _small_llama)


@model("small-llama-tq1_0")
def small_llama_tq1_0(path: Path) -> None:
    quantized(path.stem, "TQ1_0", _small_llama)


@model("small-llama-tq2_0")
def small_llama_tq2_0(path: Path) -> None:
    quantized(path.stem, "TQ2_0", _small_llama)


@model("small-llama-mxfp4")
def small_llama_mxfp4(path: Path) -> None:
    # ftype MXFP4_MOE puts expert tensors in MXFP4 and the rest in Q8_0; --pure makes every 2-D weight MXFP4
    quantized(path.stem, "MXFP4_MOE", _small_llama)


def manifest_entry(stem: str) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(HERE / f"{stem}.gguf"))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    types = sorted({t.tensor_type.name for t in reader.tensors})
    return {"file": f"{stem}.gguf", "golden": f"{stem}.logits.npz", "arch": arch, "tensor_types": types,
            "size": (HERE / f"{stem}.gguf").stat().st_size}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stems", nargs="*", help="models to (re)generate (default: all in MODELS)")
    ap.add_argument("--logits", nargs="+", type=Path, help="only write the golden of these existing .gguf files")
    args = ap.parse_args()
    if args.logits:
        for p in args.logits:
            print(write_golden(p.resolve()))
        return
    unknown = [s for s in args.stems if s not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    manifest_path = HERE / "manifest-made.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for stem in args.stems or sorted(MODELS):
        MODELS[stem](HERE / f"{stem}.gguf")
        write_golden(HERE / f"{stem}.gguf")
        manifest[stem] = manifest_entry(stem)
        print(f"{stem}: {manifest[stem]['tensor_types']}, {manifest[stem]['size']} bytes")
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


if __name__ == "__main__":
    main()
