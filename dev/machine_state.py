"""Is the machine in its fast state right now? One in-cache batched product, timed window by window.

    PYTHONPATH=. python dev/machine_state.py --seconds 60       # a line every ~2 s
    PYTHONPATH=. python dev/machine_state.py --quick            # one short window (tests/test_dev_scripts.py)

The product is a batched decode step's kind (Q4_1 1,536 x 576, 8 activation rows, the weights in cache, the tiled
launcher the forward pass calls), timed as the median of a window's calls on 1 thread, then on all the threads
(runtime.physical_cores()), and their ratio. On a quiet dedicated machine every window reads the same. On the 2-core
AMD EPYC VM of 2026-12-04 they did not: 1 thread took 58 us in some windows and 80-93 us in others, minutes apart,
both vCPUs alike (two processes pinned one to each, running together, read 58.2 us each for 40 s, so neither is
slower by itself); 2 threads took 31.7 us (1.83x) or 40-60 us. A SmolLM2 batched step of 8 sequences, bound by these
products, moved with it (8.3-8.6 ms or 11.6-12.2 ms), one-row decode, bound by memory, hardly (4.6 against 4.8 ms).
So a benchmark's ratio of batched to one-row speed (benchmarks/serve.py) falls in the slow windows: run this before
and after one to know which state it measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

import ggufrun.quants as Q
from ggufrun.quants.repack import repack
from ggufrun.runtime import physical_cores


def window(product, args, threads: int, seconds: float) -> float:
    """Median us a call over `seconds` of calls on `threads` threads (batches of 10)."""
    numba.set_num_threads(threads)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        for _ in range(10):
            product(*args)
        times.append((time.perf_counter() - t0) / 10)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="how long to watch")
    p.add_argument("--window", type=float, default=1.0, help="seconds a window, at each thread count")
    p.add_argument("--quick", action="store_true", help="one short window (tests)")
    a = p.parse_args()
    if a.quick:
        a.seconds, a.window = 0.0, 0.05
    rng = np.random.default_rng(0)
    w, product = repack(quantize(rng.standard_normal((1536, 576)).astype(np.float32), T.Q4_1), T.Q4_1)
    x = rng.standard_normal((8, 576)).astype(np.float32)
    qx = Q.quantize_activations(x, T.Q4_1)
    out = np.empty((8, 1536), np.float32)
    args = (w, *qx.arrays, out)
    n = physical_cores()
    numba.set_num_threads(n)
    product(*args)  # compiled or loaded
    macs = 8 * 1536 * 576
    print(f"Q4_1 1,536 x 576, 8 rows, in cache: us a call on 1 thread / on {n} threads, their ratio, GMAC/s")
    start = time.perf_counter()
    while True:
        one = window(product, args, 1, a.window)
        many = window(product, args, n, a.window)
        print(f"{time.perf_counter() - start:6.1f} s  {one:6.1f} / {many:6.1f} us  {one / many:4.2f}x  "
              f"{macs / one / 1e3:5.0f} / {macs / many / 1e3:5.0f} GMAC/s", flush=True)  # fmt: skip
        if time.perf_counter() - start >= a.seconds:
            break


if __name__ == "__main__":
    main()
