"""llama.cpp's logits with a q8_0 KV cache (`-ctk q8_0 -ctv q8_0`) for four tiny golden models: the reference for
ggufrun's kv_dtype="q8_0" (tests/test_kv_q8_0.py).

    python tests/data/golden/make_kv_q8_0.py     # writes small-llama-q8_0.kv-q8_0.logits.npz, ... for STEMS

make.py's approach (the same prompt of 20 ids as the model's own golden, one batched pass, then 12 greedy one-token
steps, CPU backend, 2 threads), with the context's type_k = type_v = GGML_TYPE_Q8_0. llama.cpp refuses a quantized
V cache without flash attention (src/llama-context.cpp: "quantized V cache was requested, but this requires Flash
Attention"), so flash attention is on here. This build also rotates Q/K/V by a Walsh-Hadamard matrix before
quantizing them (attn_rot_k / attn_rot_v in src/llama-kv-cache.cpp; LLAMA_ATTN_ROT_DISABLE=1 turns it off), which
ggufrun follows. For scale, the same runs with an F16 KV cache and flash attention on are
written as X.kv-f16-fa.logits.npz: how far flash attention alone moves llama.cpp's logits.
It needs llama.cpp's Python binding (llama-cpp-python; LLAMA_CPP_LIB_PATH for a native build), which no test needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
STEMS = (
    "small-llama-q8_0", "small-gemma2-q8_0", "small-qwen2moe-q8_0", "small-qwen3moe-q8_0",
    "small-llama-iq1_m", "small-llama-iq2_s",
)  # fmt: skip
N_GEN = 12


def logits_with_kv(path: Path, prompt: list[int], type_kv: int, n_gen: int = N_GEN) -> tuple[list, np.ndarray]:
    """make.py's llama_cpp_logits with the KV cache in `type_kv` (a GGML_TYPE_*) and flash attention on."""
    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = max(64, len(prompt) + n_gen + 8)
    cp.n_batch = cp.n_ubatch = max(len(prompt), 1)
    cp.n_threads = cp.n_threads_batch = 2
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
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos0 + i, 1, 1
            batch.seq_id[i][0] = 0
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
    return tokens, np.stack(rows[:-1])


def main(stems) -> None:
    import llama_cpp as L

    for stem in stems:
        golden = np.load(HERE / f"{stem}.logits.npz")
        n_prompt = int(golden["n_prompt"])
        prompt = golden["tokens"][:n_prompt].tolist()
        for suffix, type_kv in ((".kv-q8_0", L.GGML_TYPE_Q8_0), (".kv-f16-fa", L.GGML_TYPE_F16)):
            tokens, logits = logits_with_kv(HERE / f"{stem}.gguf", prompt, type_kv)
            out = HERE / f"{stem}{suffix}.logits.npz"
            np.savez_compressed(out, tokens=np.array(tokens, np.int32), logits=logits, n_prompt=np.int32(n_prompt))
            print(out.name, logits.shape)


if __name__ == "__main__":
    main(sys.argv[1:] or STEMS)
