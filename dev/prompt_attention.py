"""A prompt chunk's attention, kernel against kernel: f16 and q8_0 caches, one block of queries a work item against
the key tiles, every layer's cache in turn.

    python dev/prompt_attention.py --heads 9:3:64:30,4:1:256:18 --positions 0,1744,12000
    python dev/prompt_attention.py --quick

For each head layout (query heads : K/V heads : head dimensions : layers) and each count of cached positions, a chunk
of --queries queries attends (causal) to those positions and to its own: kernels.attend_rows on an f16 cache and
kernels.attend_rows_q8_0 on a q8_0 one, each with scratch rows for one block of 4 queries (every span one block a work
item) and for TILED_BLOCKS blocks (the model's RunState.block_scores: spans past LONG_SPAN take the key tiles, f16
always, q8_0 where heads have LONG_ROW_BYTES_Q8_0 of K and V codes a position). The calls go in turns, each over every
layer's cache (so they read the caches from memory, as a prompt pass does), the tiled scratch's outputs asserted equal
to the one-block outputs (the same bits); printed: the medians of --repeats in ms a chunk, and the tiled scratch's
speed-up. The caches are random (f16 N(0, 1); q8_0 codes uniform, scales 0.002-0.03): the speed does not depend on
the values. Ice Lake VM, 2 threads, 256 queries, the defaults, 2026-12-07 15:43: at 12,000 positions Gemma3's heads
(4:1:256:18) f16 5,900 -> 2,640 ms (2.23x) and q8_0 4,128 -> 2,750 (1.50x) with the tiles, SmolLM2's (9:3:64:30) f16
2,670 -> 1,990 (1.34x), its q8_0 one block a work item either way (2,563 / 2,765 ms: the noise of the same code, as
are the 0.72-1.10x at 0 and 1,744 positions, whose spans take one block either way). --quick
(tests/test_dev_scripts.py): two tiny layouts, a span past LONG_SPAN, two repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ggufrun.model import kernels  # noqa: E402
from ggufrun.runtime import on_compute_thread  # noqa: E402


def caches(rng, n_kv: int, hd: int, n_ctx: int, layers: int):
    """Per layer: the f16 cache (keys [n_kv, hd, n_ctx + KV_PAD], values [n_kv, n_ctx, hd], as half bits) and the q8_0
    one (codes [n_kv, n_ctx, hd] and scales [n_kv, n_ctx, hd / 32] for keys, then values)."""
    nb, pad = hd // 32, kernels.KV_PAD
    f16, q8 = [], []
    for _ in range(layers):
        k = np.zeros((n_kv, hd, n_ctx + pad), np.uint16)
        k[..., :n_ctx] = rng.standard_normal((n_kv, hd, n_ctx)).astype(np.float16).view(np.uint16)
        v = rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16).view(np.uint16)
        f16.append((k, v))
        codes = [rng.integers(-127, 128, (n_kv, n_ctx, hd), dtype=np.int8) for _ in range(2)]
        scales = [rng.uniform(0.002, 0.03, (n_kv, n_ctx, nb)).astype(np.float16).view(np.uint16) for _ in range(2)]
        q8.append((codes[0], scales[0], codes[1], scales[1]))
    return f16, q8


def measure(n_head: int, n_kv: int, hd: int, layers: int, pos0: int, m: int, repeats: int, rng) -> dict:
    """ms a chunk of m queries after pos0 positions, per (cache, scratch): the medians of `repeats` turns."""
    n_ctx, nb, slots = pos0 + m + 16, hd // 32, numba.config.NUMBA_NUM_THREADS
    f16, q8 = caches(rng, n_kv, hd, n_ctx, layers)
    q = (rng.standard_normal((m, n_head * hd)) / np.sqrt(hd)).astype(np.float32)
    qq = rng.integers(-127, 128, (m, n_head * hd), dtype=np.int8)
    qd = rng.uniform(0.01, 0.05, (m, n_head * nb)).astype(np.float16).view(np.uint16)
    width = n_ctx + kernels.KV_PAD
    key_tiles = np.zeros((slots, hd // 4 + 1, width), np.int32)
    key_scales = np.zeros((slots, nb, width), np.uint16)
    zero, scale = np.float32(0.0), np.float32(hd**-0.5)
    runs = {}
    for blocks in (1, kernels.TILED_BLOCKS):
        scores = np.zeros((slots, kernels.QUERY_BLOCK * blocks, width), np.float32)
        out_f16, out_q8 = np.zeros((m, n_head * hd), np.float32), np.zeros((m, n_head * hd), np.float32)

        def run_f16(scores=scores, out=out_f16):
            for k, v in f16:
                kernels.attend_rows(q, k, v, pos0, 0, pos0 + m, 0, zero, scores, out)
            return out

        def run_q8(scores=scores, out=out_q8):
            for c in q8:
                kernels.attend_rows_q8_0(qq, qd, *c, pos0, 0, scale, zero, scores, key_tiles, key_scales, out)
            return out

        runs[("f16", blocks)], runs[("q8_0", blocks)] = run_f16, run_q8
    for kv in ("f16", "q8_0"):  # compile, and the same bits either way
        np.testing.assert_array_equal(runs[(kv, 1)]().copy(), runs[(kv, kernels.TILED_BLOCKS)]())
    times = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            t = time.perf_counter()
            run()
            times[key].append((time.perf_counter() - t) * 1e3)
    return {key: statistics.median(ts) for key, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="9:3:64:30,4:1:256:18",
                    help="query heads:K/V heads:head dims:layers, comma-separated (SmolLM2, Gemma3-270M)")  # fmt: skip
    ap.add_argument("--positions", default="0,1744,12000", help="cached positions before the chunk, comma-separated")
    ap.add_argument("--queries", type=int, default=256, help="queries in the chunk (a prompt chunk: n_batch)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.heads, a.positions, a.queries, a.repeats = "2:1:32:1,2:1:256:1", f"0,{kernels.LONG_SPAN}", 8, 2
    layouts = [tuple(int(x) for x in h.split(":")) for h in a.heads.split(",")]
    positions = [int(p) for p in a.positions.split(",")]
    rng = np.random.default_rng(0)

    def run():
        numba.set_num_threads(a.threads)
        print(f"{a.queries} queries a chunk, {a.threads} threads; ms a chunk over every layer's cache (median of "
              f"{a.repeats}), one block a work item / the model's scratch ({kernels.TILED_BLOCKS} blocks)")  # fmt: skip
        print("| heads | layers | positions | f16 one block | f16 scratch | speed-up | q8_0 one block | q8_0 scratch "
              "| speed-up |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for n_head, n_kv, hd, layers in layouts:
            for pos0 in positions:
                t = measure(n_head, n_kv, hd, layers, pos0, a.queries, a.repeats, rng)
                f1, ft = t[("f16", 1)], t[("f16", kernels.TILED_BLOCKS)]
                q1, qt = t[("q8_0", 1)], t[("q8_0", kernels.TILED_BLOCKS)]
                print(f"| {n_head} on {n_kv} x {hd} | {layers} | {pos0:,} | {f1:.2f} | {ft:.2f} | {f1 / ft:.2f}x | "
                      f"{q1:.2f} | {qt:.2f} | {q1 / qt:.2f}x |", flush=True)  # fmt: skip

    on_compute_thread(run)


if __name__ == "__main__":
    main()
