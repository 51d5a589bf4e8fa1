"""Where a forward pass's time goes, kernel by kernel: decode steps of 1..M sequences, or a prefill pass.

    python dev/step_profile.py MODEL --rows 1,8,16            # batched decode steps at --positions cached positions
    python dev/step_profile.py MODEL --rows 8 --prefill 32    # one pass of 8 prompts of 32 tokens (fresh caches)
    python dev/step_profile.py MODEL --rows 1,16 --n-ctx 4096 --kv-dtype q8_0   # caches as `ggufrun serve` makes them

Every kernel the forward pass calls through ggufrun.model.kernels, every product (Projector: one line per weight
type and shape; a decode step's chosen experts, one line per stack) and the activation quantizer get a perf_counter
timer around each call (~0.3 us each, counted in the step). Printed per row count: each one's ms a pass (the median
over --steps of its time in each pass, and the mean), calls a pass and us a call, the sum of the medians, and the
median pass; with one row among --rows, a last table lines each kernel up against its one-row form (attend_one
beside attend_group, add_norm beside add_norm_rows) and prints what each added sequence costs a step, and the
throughput ratio the passes imply (N x one row's pass / N rows' pass: benchmarks/serve.py's ratio without the server,
the sampling and the prompts). The medians are what to compare on a shared machine: one pass slowed by other work (a
2-core VM's neighbours) moves every kernel's mean, not its median (SmolLM2's 8-row step, 2026-12-05: the means summed
to 8.50 ms, the medians to 7.84, the median pass 8.87). Rows go through Transformer.forward_batch on the slots of one
KVCache group, as a BatchEngine's (one row: Transformer.forward), so a batched step takes the kernels a server's takes.
cProfile would add ~1 us to every call and inflate the small kernels' share several times over; these timers add
~0.3 us.

The caches hold n_ctx positions (default: the least that fits, at least 512). A server's slots hold 4096 (`ggufrun
serve`'s and benchmarks/serve.py's default), and that changes what the K/V kernels cost, not what they compute: a
key row of a slot spans n_ctx positions, so a decode step's new key lands in lines 8 KB apart instead of 1 KB
(SmolLM2, 16 rows at 64 positions, 2026-12-07: qkv_rope_store_group 1.03 ms a step at 512, 1.45-1.54 at 4096).

--busy N,US,MS: what a little work beside the passes costs them. A second process (not a thread: no GIL in common)
spins N bursts of US microseconds every MS milliseconds, as a server's HTTP thread and a benchmark's clients do after
each step (N streams' tokens); per row count the passes are timed without timers, in turns of ten with and without
that process working, and their medians printed with the share of a core it took. On a machine with as many cores as
compute threads each burst takes a core from a thread inside a parallel region, whose barrier the other threads then
wait at. AMD EPYC Zen 4 VM, 2 threads, SmolLM2 at n_ctx 4096, `--rows 1,8,16 --busy 8,60,10.8` (4.4% of a core:
what 8 streams' tokens cost a server and its clients a step), two runs, 2026-12-08: one row 4.06 / 4.33 -> 4.44 / 4.79
ms (1.09-1.11x), 8 rows 8.21 / 8.81 -> 8.93 / 9.24 (1.05-1.09x), 16 rows 13.74 / 14.50 -> 14.47 / 15.97 (1.05-1.10x):
the 8-row pass grows by 0.4-0.7 ms, while the process spins ~0.36 ms of it, ~1.2-2x its CPU time.

--quick (tests/test_dev_scripts.py): a tiny synthetic model (tests/synthetic.py), 1 and 3 rows, a prefill pass, and
--busy 2,50,5.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import ggufrun
from ggufrun.model import kernels, linear
from ggufrun.model.kv_cache import KV_DTYPES
from ggufrun.runtime import on_compute_thread


class Timers:
    """perf_counter around every call of the kernels module's kernels and of the products, while `on`."""

    def __init__(self):
        self.on = False
        self.total: dict[str, list] = defaultdict(lambda: [0.0, 0])  # name -> [seconds, calls] over all passes
        self.passes: list[dict[str, float]] = []  # per timed pass: name -> its seconds in that pass
        self._undo: list = []

    def _add(self, name: str, t0: float) -> None:
        dt = time.perf_counter() - t0
        entry = self.total[name]
        entry[0] += dt
        entry[1] += 1
        this = self.passes[-1]
        this[name] = this.get(name, 0.0) + dt

    def install(self) -> None:
        for name in dir(kernels):
            f = getattr(kernels, name)
            if name.startswith("_") or not callable(f) or not hasattr(f, "py_func"):
                continue  # compiled kernels only (Numba dispatchers and launchers)
            self._undo.append((kernels, name, f))
            setattr(kernels, name, self._timed(name, f))
        quantize, call = linear.Projector.quantize, linear.Projector.__call__
        timers = self

        def timed_quantize(proj, x, lin):
            if not timers.on:
                return quantize(proj, x, lin)
            t0 = time.perf_counter()
            try:
                return quantize(proj, x, lin)
            finally:
                timers._add("quantize activations", t0)

        def timed_call(proj, x, *pairs):  # Projector.__call__ with a timer around each product
            if not timers.on:
                return call(proj, x, *pairs)
            qx = None
            tiles = proj.tiles and x.shape[0] > 1
            for lin, out in pairs:
                if qx is None or qx.format != lin.act:
                    qx = proj.quantize(x, lin)
                t0 = time.perf_counter()
                (lin.dot if tiles else lin.dot_one)(lin.w, *qx.arrays, out)
                timers._add(f"product {lin.qtype.name} {lin.n_out} x {lin.n_in}", t0)

        experts = linear.Projector.experts

        def timed_experts(proj, x, stack, out, sel, shared):  # a step's chosen experts in one kernel call
            if not timers.on:
                return experts(proj, x, stack, out, sel, shared)
            qx = proj.quantize(x, stack)
            t0 = time.perf_counter()
            stack.kernel(stack.w, *qx.arrays, out, sel, int(shared))
            timers._add(f"experts {stack.qtype.name} {sel.shape[0]} x {stack.n_out} x {stack.n_in}", t0)

        self._undo += [(linear.Projector, "quantize", quantize), (linear.Projector, "__call__", call),
                       (linear.Projector, "experts", experts)]  # fmt: skip
        linear.Projector.quantize, linear.Projector.__call__ = timed_quantize, timed_call
        linear.Projector.experts = timed_experts

    def _timed(self, name, f):
        def g(*args, **kwargs):
            if not self.on:
                return f(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self._add(name, t0)

        return g

    def uninstall(self) -> None:
        for owner, name, f in reversed(self._undo):
            setattr(owner, name, f)
        self._undo.clear()


def spin_bursts(bursts: int, us: float, ms: float, on, stop) -> None:
    """--busy's process: while `on` is set, `bursts` busy-waits of `us` microseconds every `ms` milliseconds."""
    period, burst = ms / 1e3, us / 1e6
    t_next = time.perf_counter()
    while not stop.is_set():
        if not on.wait(0.05):
            t_next = time.perf_counter()
            continue
        for _ in range(bursts):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < burst:
                pass
            time.sleep(0)  # a burst ends: another process may run, as the next token's wait would let it
        t_next += period
        wait = t_next - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        else:
            t_next = time.perf_counter()


def one_pass(tf, caches: list, positions: int, prefill: int, rng) -> float:
    """One timed pass (seconds): every cache back to `positions` cached positions (0 for prefill), then a decode step
    of one token per cache, or a prompt of `prefill` random tokens per cache; one cache alone takes Transformer.forward,
    as a single sequence does."""
    for c in caches:
        c.truncate(0 if prefill else positions)
    seqs = [(c, rng.integers(0, min(1000, tf.config.n_vocab), prefill) if prefill else [5]) for c in caches]
    t0 = time.perf_counter()
    if len(seqs) > 1 or prefill:
        tf.forward_batch(seqs)
    else:
        tf.forward(seqs[0][1], cache=caches[0])
    return time.perf_counter() - t0


def busy_passes(model, caches: list, positions: int, prefill: int, steps: int, on) -> tuple[float, float]:
    """Median pass time (ms) without timers, alone and while --busy's process works (`on` set), in turns of ten."""
    rng = np.random.default_rng(1)
    alone, busy = [], []
    for turn in range(max(2, 2 * (steps // 10))):
        (on.set if turn % 2 else on.clear)()
        if turn % 2:
            time.sleep(0.02)  # its first period under way
        for _ in range(10):
            (busy if turn % 2 else alone).append(one_pass(model.transformer, caches, positions, prefill, rng))
    on.clear()
    return statistics.median(alone) * 1e3, statistics.median(busy) * 1e3


def profile(model, rows: int, positions: int, prefill: int, steps: int, warmup: int, busy=None) -> tuple[dict, float]:
    """Print the table of one row count; return each kernel's median ms a pass and the median pass in ms."""
    tf = model.transformer
    caches = tf.new_caches(rows) if rows > 1 else [tf.new_cache()]
    rng = np.random.default_rng(0)
    if not prefill:
        for c in caches:
            tf.forward(rng.integers(0, min(1000, tf.config.n_vocab), positions), cache=c)
    timers = Timers()
    timers.install()
    times = []
    try:
        for i in range(warmup + steps):
            timers.on = i >= warmup
            if timers.on:
                timers.passes.append({})
            seconds = one_pass(tf, caches, positions, prefill, rng)
            if timers.on:
                times.append(seconds)
    finally:
        timers.on = False
        timers.uninstall()
    what = f"a pass of {rows} prompts of {prefill} tokens" if prefill else f"decode steps of {rows} rows at {positions}"
    print(f"\n{what} ({steps} passes):")
    median = {name: statistics.median(p.get(name, 0.0) for p in timers.passes) for name in timers.total}
    print(f"| {'kernel':36s} | ms a pass (median) | ms a pass (mean) | calls a pass | us a call |")
    print(f"|{'-' * 38}|--------------------|------------------|--------------|-----------|")
    for name in sorted(median, key=lambda n: -median[n]):
        seconds, calls = timers.total[name]
        print(
            f"| {name:36s} | {median[name] * 1e3:18.3f} | {seconds / steps * 1e3:16.3f} | {calls / steps:12.0f} "
            f"| {seconds / calls * 1e6:9.1f} |"
        )
    means = sum(seconds for seconds, _ in timers.total.values()) / steps
    print(
        f"kernels {sum(median.values()) * 1e3:.2f} ms (medians; means {means * 1e3:.2f}) "
        f"of a median pass of {statistics.median(times) * 1e3:.2f} ms"
    )
    if busy is not None:
        (bursts, us, ms), on = busy
        alone, beside = busy_passes(model, caches, positions, prefill, steps, on)
        print(
            f"without timers: a median pass {alone:.2f} ms alone, {beside:.2f} ms ({beside / alone:.2f}x) beside a "
            f"process busy {bursts} x {us:g} us every {ms:g} ms ({bursts * us / ms / 10:.1f}% of a core)"
        )
    return {name: t * 1e3 for name, t in median.items()}, statistics.median(times) * 1e3


def family(name: str) -> str:
    """A kernel's name without what tells its one-row and batched forms apart (attend_one / attend_group,
    add_norm / add_norm_rows, ...), so that the two line up in the per-added-row table."""
    if name.startswith("attend_"):
        return "attention"
    for suffix in ("_group", "_rows"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def added_rows(results: dict[int, tuple[dict, float]]) -> None:
    """What each added sequence costs a decode step, kernel by kernel: (ms at N rows - ms at 1 row) / (N - 1), and
    the throughput ratio the passes imply, N x (one row's pass) / (N rows' pass): what N clients get over one from
    this process's forward passes alone (no server, no sampling)."""
    t1 = results[1][1]
    batched = sorted(r for r in results if r > 1)
    fams = {}
    for r, (medians, _) in results.items():
        fams[r] = defaultdict(float)
        for name, ms in medians.items():
            fams[r][family(name)] += ms
    fam1 = fams[1]
    names = sorted(set(fam1) | {n for f in fams.values() for n in f}, key=lambda n: -fams[batched[-1]].get(n, 0.0))
    head = "".join(f" | {r} rows (ms) | per added row" for r in batched)
    print("\nwhat each added sequence costs a step, against one row (ms a pass, medians):")
    print(f"| {'kernel':36s} | 1 row{head} |")
    print(f"|{'-' * 38}|------" + "|------------|--------------" * len(batched) + "|")
    for n in names + ["all kernels", "pass"]:
        if n == "all kernels":
            a1, ar = sum(fam1.values()), {r: sum(fams[r].values()) for r in batched}
        elif n == "pass":
            a1, ar = t1, {r: results[r][1] for r in batched}
        else:
            a1, ar = fam1.get(n, 0.0), {r: fams[r].get(n, 0.0) for r in batched}
        cells = "".join(f" | {ar[r]:10.3f} | {(ar[r] - a1) / (r - 1):12.3f}" for r in batched)
        print(f"| {n:36s} | {a1:5.2f}{cells} |")
    for r in batched:
        ratio = r * t1 / results[r][1]
        print(f"{r} rows: {r} x {t1:.2f} / {results[r][1]:.2f} ms = {ratio:.2f}x one row's tokens a second")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF file (not with --quick)")
    ap.add_argument("--rows", default="1,8,16", help="sequences a step, comma-separated")
    ap.add_argument("--positions", type=int, default=64, help="positions cached before each decode step")
    ap.add_argument("--prefill", type=int, default=0, help="profile a prefill pass of prompts this long instead")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=None, help="positions a cache holds (default: the least that fits)")
    ap.add_argument("--kv-dtype", default="f16", choices=KV_DTYPES, help="the caches' storage")
    ap.add_argument("--busy", default=None, help="N,US,MS: also time passes beside a process spinning N bursts of US "
                    "microseconds every MS milliseconds")  # fmt: skip
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    if a.quick and a.busy is None:
        a.busy = "2,50,5"
    busy = None
    if a.busy is not None:
        try:
            bursts, us, ms = int(a.busy.split(",")[0]), *(float(v) for v in a.busy.split(",")[1:])
        except ValueError:
            ap.error(f"--busy takes N,US,MS (e.g. 8,60,10.8), got {a.busy!r}")
        if bursts < 1 or us <= 0 or ms <= 0 or bursts * us >= ms * 1e3:
            ap.error(f"--busy {a.busy}: N >= 1 bursts of US > 0 microseconds must fit in MS milliseconds")
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no copy of this one's threads
        on, stop = spawn.Event(), spawn.Event()
        worker = spawn.Process(target=spin_bursts, args=(bursts, us, ms, on, stop), daemon=True)
        worker.start()
        busy = ((bursts, us, ms), on)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model
        if a.quick:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from synthetic import write_model

            path, rows, a.steps, a.positions = write_model(Path(tmp) / "tiny.gguf", ctx=128, seed=1), [1, 3], 3, 8
        elif path is None:
            ap.error("a model file is needed (or --quick)")
        n_ctx = max(128 if a.quick else 512, a.positions + 8, a.prefill + 8) if a.n_ctx is None else a.n_ctx
        model = ggufrun.load(path, n_threads=a.threads, n_ctx=n_ctx, kv_dtype=a.kv_dtype)
        try:
            results = {
                m: on_compute_thread(profile, model, m, a.positions, a.prefill, a.steps, min(10, a.steps), busy)
                for m in rows
            }
        finally:
            if busy is not None:
                stop.set()
                worker.join(10)
        if not a.prefill and 1 in results and len(results) > 1:
            added_rows(results)
        if a.quick:  # and a prefill pass of two prompts
            on_compute_thread(profile, model, 2, 0, 16, 2, 1)


if __name__ == "__main__":
    main()
