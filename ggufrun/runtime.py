"""Process plumbing: how many threads, which Numba threading layer, and compiling the kernels a model needs.

    physical_cores()            the default thread count (hyper-threads share a core's vector units)
    set_threads(n)              Numba's thread count for the calling thread (Numba keeps it per thread)
    check_threading_layer()     warn when Numba fell back to its slow workqueue layer
    compile_kernels(tf)         compile or load from Numba's on-disk cache every kernel a Transformer uses, with a
                                progress line and helper processes on the first run ever
    signals_to_main_thread()    a context in which the threads started (OpenMP's pool, helper threads) never take
                                Ctrl-C: SIGINT then always reaches the main thread, which Python needs to raise
                                KeyboardInterrupt out of a blocking read (input() at a chat prompt)

The threading-layer order itself (OpenMP first) is set where Numba is first configured, in quants/jit.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
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


class CompileProgress:
    """Prints "ggufrun: compiling kernels i/n (first run only)" on stderr, once per kernel that really compiles
    (never for a cache load): rewritten in place on a terminal, one line each otherwise (logs, pipes)."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False

    def __call__(self, i: int, n: int) -> None:
        self.shown = True
        text = f"ggufrun: compiling kernels {i + 1}/{n} (first run only)"
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def compile_kernels(transformer, n_threads: int, verbose: bool = False) -> float:
    """Compile (or load from Numba's on-disk cache) every kernel `transformer` uses; return the seconds it took.

    A forward pass in recording mode (quants.jit.record_calls, microseconds) lists the kernels and argument types
    the prefill and decode passes use, in the order they use them. They are then compiled in that order, with a
    progress line per real compilation (CompileProgress) and, from the first one on, helper processes (one per
    extra thread) compiling the list from its end into the same on-disk cache; this process loads what they did.
    Last, transformer.warmup() runs every kernel once (anything the recording missed compiles there). When this
    process has every kernel already (another model loaded before), the recording pass itself was the warm-up.
    """
    from numba.core import event

    from .quants import jit

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n_helpers = max(0, min(n_threads, cores) - 1)
    progress = CompileProgress()

    class Late(event.Listener):  # a kernel the recording missed: still say why the wait
        def on_start(self, ev):
            if not progress.shown:
                progress.shown = True
                print("ggufrun: compiling kernels (first run only)...", file=sys.stderr, flush=True)

        def on_end(self, ev):
            pass

    t0 = time.perf_counter()
    try:
        # the first parallel region starts OpenMP's thread pool: its threads must not take Ctrl-C
        with signals_to_main_thread():
            calls = jit.record_calls(transformer.warmup)
            if calls:  # else every kernel was compiled in this process already, and the recording pass ran them
                jit.compile_calls(calls, n_helpers, progress)
                with event.install_listener("numba:compile", Late()):
                    transformer.warmup()
    finally:
        progress.close()
    elapsed = time.perf_counter() - t0
    if verbose:
        print(f"ggufrun: kernels ready in {elapsed:.2f} s", file=sys.stderr)
    check_threading_layer()
    return elapsed
