"""Mixture-of-experts decode: a synthetic MoE (8 experts, 2 used per token) against a dense model of the same size.

    python benchmarks/moe.py                          # Q8_0, ~330 MB each, written to /tmp
    python benchmarks/moe.py --type q4_0 --layers 8 --steps 32 --json bench-results/moe.json

Both files are random-weight llama models with the same attention and the same number of FFN weights: the MoE block
has n_expert experts of width ff (3-D `ffn_*_exps`, an F32 router `ffn_gate_inp`), the dense block one FFN of width
n_expert x ff. A decode step of the dense model reads every FFN weight; the MoE step reads the router and its
n_expert_used experts' matrices only (ggufrun.model.transformer `_moe`), so at memory-bound speed it should run about
(attention + all FFN) / (attention + used/n_expert of the FFN) times faster. Both are far larger than the CPU caches.

Reported: decode tokens/s of each (median over --repeat runs of --steps one-token steps after a prefill), their ratio
(target >= 2.5x), and the expert weight bytes a decode step reads as a share of all expert weight bytes (target
<= 35%), counted from the experts' matrices the kernels ran (Transformer.expert_bytes_read: every row of each chosen
expert, nothing of the others).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import gguf
import numba
import numpy as np

from _common import env_line, environment, log, write_json
from ggufrun.model import Transformer
from ggufrun.reader import GGUFFile

TARGET_RATIO = 2.5
TARGET_SHARE = 0.35
# random blocks: an IEEE-half scale (about 1 / (127 sqrt(K)), so that a row's dot with a unit-scale input stays
# O(1)) then random codes; Q8_0: 32 int8 codes (34 bytes), Q4_0: 32 nibbles (18 bytes)
TYPES = {"q8_0": (gguf.GGMLQuantizationType.Q8_0, 34, 127.0), "q4_0": (gguf.GGMLQuantizationType.Q4_0, 18, 8.0)}


def random_blocks(rng, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random quantized rows: uint8 [..., rows, K / 32 * type_size] for a matrix of logical shape (..., rows, K)."""
    _, type_size, qmax = TYPES[qtype]
    *lead, k = shape
    blocks = rng.integers(0, 256, size=(*lead, k // 32, type_size), dtype=np.uint8)
    scale = np.float16(1.0 / (qmax * np.sqrt(k)))
    blocks[..., :2] = np.frombuffer(scale.tobytes(), np.uint8)
    return blocks.reshape(*lead, k // 32 * type_size)


def write(path: Path, qtype: str, *, moe: bool, dim: int, layers: int, ff: int, n_expert: int, used: int) -> Path:
    """A random-weight llama model: MoE (n_expert experts of width ff) or dense (one FFN of width n_expert x ff)."""
    rng = np.random.default_rng(0)
    raw = TYPES[qtype][0]
    n_head, n_kv, head_dim, vocab = dim // 128, max(1, dim // 512), 128, 2048
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(2048)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff if moe else n_expert * ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("none")
    w.add_vocab_size(vocab)
    if moe:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(used)

    def add(name: str, shape: tuple[int, ...]) -> None:
        w.add_tensor(name, random_blocks(rng, qtype, shape), raw_dtype=raw)

    ones = np.ones(dim, np.float32)
    add("token_embd.weight", (vocab, dim))
    w.add_tensor("output_norm.weight", ones)
    add("output.weight", (vocab, dim))
    for il in range(layers):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", ones)
        add(p + "attn_q.weight", (n_head * head_dim, dim))
        add(p + "attn_k.weight", (n_kv * head_dim, dim))
        add(p + "attn_v.weight", (n_kv * head_dim, dim))
        add(p + "attn_output.weight", (dim, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", ones)
        if moe:
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n_expert, dim)) / np.sqrt(dim)).astype("f4"))
            add(p + "ffn_gate_exps.weight", (n_expert, ff, dim))
            add(p + "ffn_up_exps.weight", (n_expert, ff, dim))
            add(p + "ffn_down_exps.weight", (n_expert, dim, ff))
        else:
            add(p + "ffn_gate.weight", (n_expert * ff, dim))
            add(p + "ffn_up.weight", (n_expert * ff, dim))
            add(p + "ffn_down.weight", (dim, n_expert * ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def decode_run(tf: Transformer, steps: int) -> float:
    """Decode tokens/s of `steps` one-token steps after an 8-token prefill, from a fresh cache."""
    tf.cache.reset()
    logits = tf.forward(list(range(8)))
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = tf.forward([int(logits.argmax())])
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", choices=sorted(TYPES), default="q8_0")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--ff", type=int, default=2048, help="width of one expert (the dense FFN is n_expert x this)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--threads", type=int, default=0, help="Numba threads (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args()
    shape = dict(dim=args.dim, layers=args.layers, ff=args.ff, n_expert=args.experts, used=args.used)
    stem = f"ggufrun-bench-{args.type}-{args.dim}x{args.layers}-{args.experts}x{args.ff}"
    files = {}
    for kind in ("moe", "dense"):
        path = args.dir / f"{stem}-{kind}.gguf"
        if not path.exists():
            log(f"writing {path}")
            write(path, args.type, moe=kind == "moe", **shape)
        files[kind] = path

    numba.set_num_threads(args.threads or numba.config.NUMBA_NUM_THREADS)
    models = {kind: Transformer(GGUFFile(path), n_ctx=512) for kind, path in files.items()}
    for tf in models.values():
        tf.warmup()
    # the runs alternate between the two models, so that a change in the machine's load hits both alike
    rates = {kind: [] for kind in models}
    for _ in range(args.repeat):
        for kind, tf in models.items():
            rates[kind].append(decode_run(tf, args.steps))
    results = {}
    for kind, path in files.items():
        rate = statistics.median(rates[kind])
        results[kind] = {"file": str(path), "bytes": path.stat().st_size, "tok_s": rate, "runs": rates[kind]}
        runs = ", ".join(f"{r:.1f}" for r in rates[kind])
        log(f"{kind}: {path.stat().st_size / 1e6:.0f} MB, decode {rate:.1f} tok/s ({runs})")
    tf = models["moe"]
    expert_bytes = sum(len(lw.ffn_gate_exps) * lw.expert_bytes for lw in tf.weights.layers)
    before = tf.expert_bytes_read
    tf.forward([1])
    per_token = tf.expert_bytes_read - before
    results["moe"].update(expert_bytes=expert_bytes, expert_bytes_per_token=per_token)
    results["expert_share_per_token"] = per_token / expert_bytes
    ratio = results["moe"]["tok_s"] / results["dense"]["tok_s"]
    results["ratio"] = ratio
    share = results["expert_share_per_token"]
    env = environment(threads=numba.get_num_threads())
    print(env_line(env))
    print(f"{'':6s} {'size':>8s} {'decode tok/s':>13s}")
    for kind in ("moe", "dense"):
        r = results[kind]
        print(f"{kind:6s} {r['bytes'] / 1e6:6.0f} MB {r['tok_s']:13.1f}")
    ok = "ok" if ratio >= TARGET_RATIO else "below target"
    print(f"MoE / dense decode speed: {ratio:.2f}x (target >= {TARGET_RATIO}x: {ok})")
    ok = "ok" if share <= TARGET_SHARE else "above target"
    print(f"expert weight bytes read per decode step: {100 * share:.1f}% of all experts' (target <= 35%: {ok})")
    write_json(args.json, {"environment": env, "shape": shape, "type": args.type, **results})


if __name__ == "__main__":
    main()
