"""llama.cpp's logits with a q8_0 KV cache (`-ctk q8_0 -ctv q8_0`) for six tiny golden models: the reference for
ggufrun's kv_dtype="q8_0" (tests/test_kv_q8_0.py).

    python tests/data/golden/make_kv_q8_0.py     # writes small-llama-q8_0.kv-q8_0.logits.npz, ... for STEMS

make.py's llama_cpp_logits (the same prompt of 20 ids as the model's own golden, one batched pass, then 12 greedy
one-token steps, CPU backend, 2 threads), with the context's type_k = type_v = GGML_TYPE_Q8_0. llama.cpp refuses a
quantized V cache without flash attention (src/llama-context.cpp: "quantized V cache was requested, but this
requires Flash Attention"), so flash attention is on here. This build also rotates Q/K/V by a Walsh-Hadamard matrix
before quantizing them (attn_rot_k / attn_rot_v in src/llama-kv-cache.cpp; LLAMA_ATTN_ROT_DISABLE=1 turns it off),
which ggufrun follows. For scale, the same runs with an F16 KV cache and flash attention on are written as
X.kv-f16-fa.logits.npz: how far flash attention alone moves llama.cpp's logits. It needs llama.cpp's Python binding
(llama-cpp-python; LLAMA_CPP_LIB_PATH for a native build), which no test needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make import llama_cpp_logits  # noqa: E402

STEMS = (
    "small-llama-q8_0", "small-gemma2-q8_0", "small-qwen2moe-q8_0", "small-qwen3moe-q8_0",
    "small-llama-iq1_m", "small-llama-iq2_s",
)  # fmt: skip


def main(stems) -> None:
    import llama_cpp as L

    for stem in stems:
        golden = np.load(HERE / f"{stem}.logits.npz")
        n_prompt = int(golden["n_prompt"])
        prompt = golden["tokens"][:n_prompt].tolist()
        for suffix, type_kv in ((".kv-q8_0", L.GGML_TYPE_Q8_0), (".kv-f16-fa", L.GGML_TYPE_F16)):
            tokens, logits = llama_cpp_logits(HERE / f"{stem}.gguf", prompt, type_kv=type_kv)
            out = HERE / f"{stem}{suffix}.logits.npz"
            np.savez_compressed(out, tokens=np.array(tokens, np.int32), logits=logits, n_prompt=np.int32(n_prompt))
            print(out.name, logits.shape)


if __name__ == "__main__":
    main(sys.argv[1:] or STEMS)
