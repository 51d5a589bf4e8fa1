"""Process plumbing: how many threads, which Numba threading layer, and compiling the kernels a model needs.

    physical_cores()            the default thread count (hyper-threads share a core's vector units)
    set_threads(n)              Numba's thread count for the calling thread (Numba keeps it per thread)
    check_threading_layer()     warn when Numba fell back to its slow workqueue layer
    compile_kernels(tf)         compile or load from Numba's on-disk cache every kernel a Transformer uses, with a
                                notice and helper processes on the first run ever
    signals_to_main_thread()    a context in which the threads started (OpenMP's pool, helper threads) never take
                                Ctrl-C: SIGINT then always reaches the main thread, which Python needs to raise
                                KeyboardInterrupt out of a blocking read (input() at a chat prompt)

The threading-layer order itself (OpenMP first) is set where Numba is first configured, in quants/jit.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings


def physical_cores() -> int:
    """Number of physical cores (hyper-threads share a core's vector units, so they do not help matvec)."""
    try:
        cores = set()
        phys = core = None
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((phys, core))
                    phys = core = None
        if cores:
            return min(len(cores), len(os.sched_getaffinity(0)))
    except (OSError, AttributeError):
        pass
    return os.cpu_count() or 1


def set_threads(n: int) -> None:
    """Run Numba's parallel loops started from this thread on n threads (at most NUMBA_NUM_THREADS)."""
    import numba

    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def check_threading_layer(layer: str | None = None) -> None:
    """Warn when Numba runs its parallel loops on the workqueue layer (neither OpenMP nor TBB found)."""
    import numba

    if layer is None:
        try:
            layer = numba.threading_layer()
        except ValueError:  # no parallel region has run yet
            return
    if layer == "workqueue":
        warnings.warn(
            "Numba found neither an OpenMP runtime (libgomp) nor TBB and runs ggufrun's parallel kernels on its "
            "workqueue layer, which decodes ~3.5x slower here; install one (e.g. `pip install tbb`)",
            RuntimeWarning,
            stacklevel=3,
        )


@contextlib.contextmanager
def signals_to_main_thread():
    """Block SIGINT while threads are created inside this context, so that they inherit a mask without it.

    A signal sent to a process goes to any thread that does not block it. Python runs handlers in the main thread
    either way, but only the receiving thread's system call is interrupted: if an OpenMP worker takes the Ctrl-C,
    a main thread waiting in readline's select() (a chat prompt) never wakes up to raise KeyboardInterrupt.
    Threads inherit their creator's mask, so creating them inside this context keeps SIGINT for the main thread.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def qtypes_in_use_order(weights) -> list:
    """The weight types of the model's matrix products, in the order a forward pass first uses them."""
    order: dict = {}
    for lw in weights.layers:
        for lin in lw.matrices:
            order.setdefault(lin.qtype)
    order.setdefault(weights.output.qtype)
    return list(order)


def start_compile_helpers(qtypes: list, n: int) -> list:
    """Start n processes that compile the product kernels of `qtypes` (dealt round-robin) into Numba's cache,
    through quants.warmup, whose read-only weights give the argument types the forward pass uses."""
    code = "import sys; from ggufrun import quants; quants.warmup([int(t) for t in sys.argv[1:]], dequant=False)"
    procs = []
    for i in range(min(n, len(qtypes))):
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", code, *(str(int(t)) for t in qtypes[i::n])],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))  # fmt: skip
        except OSError:  # no interpreter to start (embedded Python...): this process compiles everything
            break
    return procs


def compile_kernels(transformer, n_threads: int, verbose: bool = False) -> float:
    """Compile (or load from Numba's on-disk cache) every kernel `transformer` uses; return the seconds it took.

    Numba announces real compilations (not cache loads) as "numba:compile" events. The first one prints a notice,
    so a user waiting on the first run ever knows why, and starts helper processes (one per extra thread) that
    compile the matrix-product kernels of the model's other weight types into the same on-disk cache while this
    process works through the forward pass in order; it then loads those from the cache instead of compiling them
    itself (the first run ever is ~1.8x shorter on 2 cores).
    """
    from numba.core import event

    types = qtypes_in_use_order(transformer.weights)
    n_helpers = max(0, min(n_threads, os.cpu_count() or 1) - 1)
    helpers: list = []

    class Notice(event.Listener):
        shown = False

        def on_start(self, ev):
            if not self.shown:
                self.shown = True
                print("ggufrun: compiling kernels (first run only)...", file=sys.stderr, flush=True)
                helpers.extend(start_compile_helpers(types[1:], n_helpers))

        def on_end(self, ev):
            pass

    t0 = time.perf_counter()
    try:
        # the first parallel region starts OpenMP's thread pool: its threads must not take Ctrl-C
        with signals_to_main_thread(), event.install_listener("numba:compile", Notice()):
            transformer.warmup()
    finally:
        for h in helpers:  # whatever they have not finished, this process has compiled by now
            h.kill()
            h.wait()
    elapsed = time.perf_counter() - t0
    if verbose:
        print(f"ggufrun: kernels ready in {elapsed:.2f} s", file=sys.stderr)
    check_threading_layer()
    return elapsed
