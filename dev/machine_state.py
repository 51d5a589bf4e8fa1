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

The last two columns tell the two slow states apart: each thread's share of the product's weight rows, run 20 times
over in one parallel region (no start or join in the time), by one thread alone and by every thread at once. On that
VM on 2026-12-05 the 2-thread windows at 40-47 us (against 32-34) were not a late worker: a share took 26 us alone in
every window, together 29 us in the fast ones and 36-38 us in the slow ones, so both threads computed 25 % slower while
they ran together (a latency-bound scalar loop ran as fast on both threads in both states; the
product's own serial call did too), as two hyperthreads of one core would share its vector units. Nothing in the
scheduling of work gets that back, which is why sharing work out dynamically did not help in those minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
from numba import njit, prange

import ggufrun.quants as Q
from ggufrun.quants.launch import call_worker
from ggufrun.quants.repack import repack
from ggufrun.runtime import physical_cores

SHARE_REPS = 20


@njit(parallel=True, nogil=True)
def shares(w, d, s, qs, sums, out, per, count, reps):
    """Weight groups [t per, (t + 1) per) of the product `reps` times over, for t in range(count), one t a thread:
    the tiled launcher's worker (dot_q4_1_x8's) on the activations as they are (every route of Q4_1 takes them so),
    without the launcher's work items."""
    for t in prange(count):
        for _ in range(reps):
            call_worker("_rows_q4_1_x8", (w, d, s, qs, sums, out, t * per, t * per + per))


def share_us(args, per: int, threads: int, seconds: float) -> float:
    """Median us a share takes when `threads` threads each run one at once (SHARE_REPS times in one region)."""
    return window(lambda: shares(*args, per, threads, SHARE_REPS), (), threads, seconds) / SHARE_REPS


def window(product, args, threads: int, seconds: float) -> float:
    """Median us a call over `seconds` of calls on `threads` threads (batches of 10)."""
    numba.set_num_threads(threads)  # numba's count for calls from this thread
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
    product(*args)  # compiled or loaded (and its worker exported, which `shares` calls by name)
    per = w.shape[0] // n  # groups of 8 weight rows a thread's share
    share_us(args, per, 1, 0.0)  # compiled
    macs = 8 * 1536 * 576
    print(f"Q4_1 1,536 x 576, 8 rows, in cache: us a call on 1 thread / on {n} threads, their ratio, GMAC/s; "
          f"us a thread's share (1/{n} of the rows) alone / on all threads at once")  # fmt: skip
    start = time.perf_counter()
    while True:
        one = window(product, args, 1, a.window)
        many = window(product, args, n, a.window)
        alone = share_us(args, per, 1, a.window / 2)
        together = share_us(args, per, n, a.window / 2)
        print(f"{time.perf_counter() - start:6.1f} s  {one:6.1f} / {many:6.1f} us  {one / many:4.2f}x  "
              f"{macs / one / 1e3:5.0f} / {macs / many / 1e3:5.0f} GMAC/s  share {alone:5.1f} / {together:5.1f} us",
              flush=True)  # fmt: skip
        if time.perf_counter() - start >= a.seconds:
            break


if __name__ == "__main__":
    main()
