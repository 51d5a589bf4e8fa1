"""Process plumbing: how many threads, which Numba threading layer, and compiling the kernels a model needs.

    physical_cores()            the default thread count (hyper-threads share a core's vector units)
    last_level_cache_bytes()    the CPU's largest cache (L3), whether a model's weights stream from DRAM at decode
    set_threads(n)              Numba's thread count for the calling thread (Numba keeps it per thread)
    threads_beside(busy)        a context with that count lowered to the cores left beside busy helper processes
    ThreadGovernor              per forward pass, runs each step on 1 thread while the full count stalls
    on_compute_thread(fn, ...)  run fn on the process's one compute thread, which starts every parallel region
    check_threading_layer()     warn when Numba fell back to its slow workqueue layer
    compile_kernels(tf)         compile or load from Numba's on-disk cache every kernel a Transformer uses, with a
                                progress line and helper processes on the first run ever
    start_compile_helpers(n)    on the first run ever, start those helpers before the model file is read
    signals_to_main_thread()    a context in which the threads started (OpenMP's pool, helper threads) never take
                                Ctrl-C: SIGINT then always reaches the main thread, which Python needs to raise
                                KeyboardInterrupt out of a blocking read (input() at a chat prompt)

The threading-layer order itself (OpenMP first) is set where Numba is first configured, in quants/jit.py.

One thread starts every parallel region. OpenMP (libgomp) gives each OS thread that starts a parallel region a
thread pool of its own, and once the process holds more OpenMP threads than there are CPUs, every pool's idle
workers stop spinning after ~100 iterations and sleep in the kernel, so each of a decode step's ~200 regions pays
for futex wake-ups (libgomp's env.c: gomp_throttled_spin_count_var, used while gomp_managed_threads exceeds the
CPUs). Measured, SmolLM2 decode step at 2 threads: 13.1 ms from the thread that loaded the model, 33.1 ms from a
second thread (the server's request threads, the batch engine's thread) and 17-21 ms on 1 thread. So the forward
passes (Transformer._eval, _eval_pass) and the kernel compilation run on one long-lived compute thread
(`on_compute_thread`): the caller hands over the pass and waits (~30 us a pass), with its own thread count.

Threads on a busy machine. Every Numba parallel region (quants.launch.parallel_items, the tiled products' prange)
ends at a barrier that waits for all of its threads. When another process holds a core, one of ours is descheduled for a
scheduler slice (milliseconds) while the others wait for it at a barrier that closes a 20-100 us matrix product;
a decode step has ~150 such regions, so 2-thread decode fell to 0.2-0.7 tok/s where 1 thread kept its speed
(llama.cpp's thread pool collapses the same way). Options weighed:
  - Numba's dynamic scheduling (`numba.set_parallel_chunksize`): deals chunks to threads on demand, which helps
    a thread that runs at half speed, but the region still ends at OpenMP's join barrier, which a descheduled
    thread reaches only when it runs again: no help against the stall. SmolLM2 prefill, 128 tokens, 2 threads,
    1 of 2 cores busy (load average 17): static 4.1 tok/s, chunks of 1 or 4 iterations 3.4 / 3.8, 1 thread 3.4.
    The items are now dealt that way by our own loop (quants.launch.parallel_items: equal runs, then work stealing),
    which evens out threads that run at different speeds at no cost to even ones; the stall at the barrier remains.
  - A pool of our own whose regions complete when all chunks are done, not when all threads arrived, would
    remove the wait itself, but needs persistent threads beside Numba's layer with atomics and idle waits written
    as LLVM intrinsics (Python threads cannot do it: a wake-up costs as much as a 20-100 us region). Not built:
    the governor reaches the target without touching the kernels.
  - An adaptive thread count (ThreadGovernor, chosen): the forward pass times its steps (a layer, the output
    projection: ~30 per token) and runs a step on 1 thread from the step after one that stalled, probing the
    full count again after 0.05 s, then less often while it keeps stalling (failed probes <= 2% of the time).
    A stall costs one step; on a quiet machine what remains is one 1-thread step per step kind every 2 s and
    0.35 us of bookkeeping per step. With 1 of 2 cores busy, 2-thread decode measured 0.79-1.08x the 1-thread
    decode (medians of 3-7 interleaved runs, three sessions) where it was ~0.1x, on SmolLM2 and Gemma3 (README.md,
    "Busy machine"). Limit: the fallback is 1 thread, the
    right count on 2 cores; with 1 of N > 2 cores busy, N-1 threads would do better (a ladder of counts: not yet).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path


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


def last_level_cache_bytes() -> int | None:
    """Size of the largest cache of CPU 0 (Linux sysfs: cpu0/cache/index*/size, the L3 where there is one), or None
    where the system does not say."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def set_threads(n: int) -> None:
    """Run Numba's parallel loops started from this thread on n threads (at most NUMBA_NUM_THREADS)."""
    import numba

    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


class _ThreadCount:
    """A context that runs the calling thread's parallel loops on `n` threads, then restores `restore` (default: the
    count the thread had on entering)."""

    def __init__(self, n: int, restore: int | None = None):
        self.n, self.restore = n, restore

    def __enter__(self):
        if self.restore is None:
            import numba

            self.restore = numba.get_num_threads()
        set_threads(self.n)

    def __exit__(self, *exc) -> None:
        set_threads(self.restore)


def threads_beside(busy: int):
    """A context in which the calling thread's parallel loops run on the cores left beside `busy` processes of ours
    that keep one core each busy (the first run ever: the helper compiling the multi-row kernels in the background),
    at least 1: on 2 cores, 1 thread rather than 2 whose second waits for a descheduled thread at every barrier
    (see the module docstring). A context that changes nothing when enough cores are left."""
    import numba

    n = numba.get_num_threads()
    fit = max(1, min(n, usable_cores() - busy))
    return contextlib.nullcontext() if fit == n else _ThreadCount(fit, n)


_INF = float("inf")


class ThreadGovernor:
    """Runs each step of a forward pass on the caller's thread count, or on 1 thread while that count stalls.

    >>> gov = ThreadGovernor()
    >>> with gov:                    # reads the caller's count (set_threads) and restores it at the end
    ...     for layer in layers:
    ...         gov.step(key, size)  # the step about to run: steps of one key cost about the same per unit of
    ...         run(layer)           # size (a layer of m rows: key = (layer kind, bucket of m), size = m)

    A key's 1-thread time per unit of size is measured on its first two steps and again every `refresh_s` (a
    faster sample replaces it, as a step cannot run faster than it costs; a slower one, maybe descheduled, moves it
    up by an eighth). A step at the full count that takes longer than `stall_ratio` times its key's 1-thread time,
    and longer than TYPICAL_RATIO times the key's typical full-count time (a running mean of its steps that did not
    stall), stalled (a thread was descheduled and the others waited for it at a region's barrier). The second test
    keeps a machine whose memory bandwidth, not its cores, sets the pace (a 1B+ model's decode step streams its
    weights from DRAM at nearly the same speed on 1 thread as on 2) from reading its noise as stalls: there a layer
    took 2.5 ms on 2 threads against 2.2 ms on 1, and ordinary 3.4 ms steps sent 833 of 1,885 steps of a generation
    to 1 thread (qwen2.5-1.5b's shape, decode 15.2 tok/s against 20.3 without the governor). After two stalled steps
    in a row (or one, within RECENT_LOAD_S of a probe that brought the full count back), steps run on 1 thread (a
    lone stall is this process's own other threads waking once per token: on a quiet machine, reacting to those
    cost SmolLM2 decode 7%), provided the full count no longer pays: over the last ~COST_WINDOW_S of full-count
    steps, their time, stalls included, is above COST_LIMIT times what the same steps take on 1 thread (their keys'
    mean 1-thread times). A time window, not a mean of per-step ratios: a VM's occasional 1-16 ms deschedule of a
    250 us step is a ratio of 4-60 that held a 16-step mean above the limit, while in time it is a few percent; a
    real load stalls every step and passes the limit within ~11 stalls (44 ms in tests/test_runtime_threads.py).
    After `backoff` seconds one step probes the full count again; unless it takes PROBE_RATIO times its 1-thread
    time (it also wakes the worker threads, asleep while steps ran on 1 thread: 1.0-2.0x a 1-thread step on a quiet
    machine; a descheduled thread holds it for a time slice, tens of 1-thread steps) the full count is back and the
    backoff halves (down to probe_min_s), else it doubles (up to probe_max_s), and the next probe waits at least 50x
    the time the failed one lost (PROBE_BUDGET: a busy machine's stalls can last tens of milliseconds). On a 2-core
    VM whose steps often take 1.5-3x their usual time with nothing else running, stall ratios of 1.5, no cost test
    and probes judged as stalls sent 20-99% of a generation's steps to 1 thread (decode at 0.70-0.95x the speed
    without the governor); a cost limit of 1 against the fastest 1-thread sample still sent 50-100% of a quiet
    machine's SmolLM2 decode steps to 1 thread (0.78x the speed without the governor, 2026-12-02). Counters: steps,
    steps_one (steps run on 1 thread), stalls, probes.

    clock / get_threads / set_threads are injectable for tests (default: time.perf_counter and Numba's per-thread
    count). The thread count only changes how a kernel's rows are dealt to threads, never a row's bits.
    """

    MAX_KEYS = 1024  # step kinds remembered (a server sees a new row count per prompt length); then forgotten
    PROBE_BUDGET = 0.02  # under a lasting load, failed probes cost at most this share of the time...
    PROBE_WAIT_MAX_S = 10.0  # ...unless that would mean waiting longer than this for the next one
    RECENT_LOAD_S = 2.0  # this soon after a probe brought the full count back, one stall is taken for the load
    TYPICAL_RATIO = 2.0  # a stalled step is also this much slower than the key's typical full-count step
    # the full count's cost is its steps' time over their 1-thread time in about this much time (0.1 s: quiet runs
    # alike, a load recognised after ~20 stalls, and with 1 of 2 cores busy Gemma3 decode 0.84-0.91x the 1-thread
    # speed against 0.99-1.13x at 0.05 s)
    COST_WINDOW_S = 0.05
    # the cost above which 1 thread pays: a 1-thread step sampled now and then between full-count steps is faster
    # than one in a run of them (SmolLM2's layer: 327 against ~410 us, the worker's core and caches idle), so
    # full-count steps costing 1.0-1.2x the sampled time still beat 1 thread (decode 95 against 70 tok/s, when a
    # limit of 1 sent 50-100% of a quiet machine's steps to 1 thread); a descheduled thread costs 5-50x
    COST_LIMIT = 1.25
    PROBE_RATIO = 3.0  # a probe fails above this times its key's 1-thread time (waking the workers costs ~1-2x)

    def __init__(
        self,
        stall_ratio: float = 2.0,
        probe_min_s: float = 0.05,
        probe_max_s: float = 1.0,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.perf_counter,
        get_threads: Callable[[], int] | None = None,
        set_threads: Callable[[int], None] | None = None,
    ):
        for name, value in (("stall_ratio", stall_ratio), ("probe_min_s", probe_min_s),
                            ("probe_max_s", probe_max_s), ("refresh_s", refresh_s)):  # fmt: skip
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if probe_max_s < probe_min_s:
            raise ValueError(f"probe_max_s ({probe_max_s}) must be at least probe_min_s ({probe_min_s})")
        if get_threads is None or set_threads is None:
            import numba

            get_threads = get_threads or numba.get_num_threads
            set_threads = set_threads or numba.set_num_threads
        self.stall_ratio, self.probe_min_s, self.probe_max_s, self.refresh_s = (
            float(stall_ratio), float(probe_min_s), float(probe_max_s), float(refresh_s))  # fmt: skip
        self.enabled = True
        self._clock, self._get, self._set = clock, get_threads, set_threads
        self._one: dict = {}  # key -> 1-thread seconds (its fastest recent step: the stall test's reference)
        self._one_mean: dict = {}  # key -> running mean of its 1-thread steps (the cost test's reference)
        self._limit: dict = {}  # key -> stall_ratio * 1-thread seconds: a full-count step above it stalled
        self._fresh_until: dict = {}  # key -> when its 1-thread time is due to be measured again
        self._typical: dict = {}  # key -> running mean of its full-count steps that did not stall (seconds)
        self._reduced = False  # running on 1 thread since a stall
        self._probing = False  # the running step probes the full count
        self._backoff = self.probe_min_s
        self._probe_at = 0.0
        self._last_stall = -2  # self.steps when the last step at the full count stalled
        # the full count's cost: its steps' time, stalls included, over what the same steps take on 1 thread (their
        # keys' 1-thread means), both summed with weights that decay by e every COST_WINDOW_S of steps
        self._full_s = self._one_s = 0.0
        self._restored_at = -_INF  # when a probe last brought the full count back
        self._active = False
        self._n_full = self._n_now = 1
        self._key = None
        self._t0 = 0.0
        self._size = 1.0
        self.steps = self.steps_one = self.stalls = self.probes = 0

    @property
    def reduced(self) -> bool:
        """True while steps run on 1 thread because the full count stalled."""
        return self._reduced

    def __enter__(self) -> ThreadGovernor:
        n = self._get() if self.enabled else 1
        self._active = n > 1
        self._n_full = self._n_now = n
        self._key = None
        return self

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        if self._key is not None:  # the last step ends here
            now = self._clock()
            prev, self._key = self._key, None
            self.steps += 1
            self._end(prev, now)
        if self._n_now != self._n_full:
            self._set(self._n_full)
            self._n_now = self._n_full
        self._active = False

    def step(self, key, size: float = 1.0) -> None:
        """The previous step (if any) ended; a step of kind `key` and `size` starts now, on the count chosen here."""
        if not self._active:
            return
        now = self._clock()
        prev, self._key = self._key, key
        if prev is not None:
            self.steps += 1
            self._end(prev, now)
        self._size = size
        n = self._choose(key, now) if self._reduced or now > self._fresh_until.get(key, -_INF) else self._n_full
        if n == self._n_now:
            self._t0 = now
        else:
            self._set(n)
            self._n_now = n
            self._t0 = self._clock()  # the switch itself is not the step's time

    def _end(self, key, now: float) -> None:
        """The step of `key` that started at self._t0 ended now."""
        dt = (now - self._t0) / self._size
        if self._n_now > 1:
            one = self._one_mean.get(key)
            if one:
                decay = math.exp(-(now - self._t0) / self.COST_WINDOW_S)
                self._full_s = self._full_s * decay + (now - self._t0)
                self._one_s = self._one_s * decay + one * self._size
        # the common case (full count, no stall, fresh 1-thread time) is this test and the typical time's update
        if self._n_now == 1 or self._probing or dt > self._limit.get(key, _INF):
            self._record(key, dt, now)
        else:
            self._note_typical(key, dt)

    def _note_typical(self, key, dt: float) -> None:
        """A full-count step of `key` that did not stall took dt per unit of size."""
        old = self._typical.get(key)
        self._typical[key] = dt if old is None else old + (dt - old) * 0.125

    def _choose(self, key, now: float) -> int:
        if key not in self._one:
            return 1  # first step of this kind: its 1-thread time
        if not self._reduced:
            return 1  # the 1-thread time is older than refresh_s
        if now < self._probe_at:
            return 1
        self._probing = True
        self.probes += 1
        return self._n_full

    def _record(self, key, dt: float, now: float) -> None:
        """A step that ran on 1 thread, probed the full count, or stalled; dt per unit of its size."""
        if self._n_now == 1:
            self.steps_one += 1
            old = self._one.get(key)
            if old is None and len(self._one) >= self.MAX_KEYS:
                self._one.clear()
                self._limit.clear()
                self._fresh_until.clear()
                self._typical.clear()
                self._one_mean.clear()
            one = self._one[key] = dt if old is None or dt < old else old + (dt - old) * 0.125
            self._limit[key] = self.stall_ratio * one
            if old is not None:  # (the first sample may hold a compilation: left out of the mean)
                mean = self._one_mean.get(key)
                mean = dt if mean is None else mean + (dt - mean) * 0.125
                # at most the stall limit: a mean started by descheduled samples comes down with the fastest one
                self._one_mean[key] = min(mean, self._limit[key])
            # a key's first sample may hold a JIT compilation or page faults: its next step is sampled again
            self._fresh_until[key] = now if old is None else now + self.refresh_s
            return
        if self._probing:
            stalled = dt > self.PROBE_RATIO * self._one[key]
        else:
            stalled = dt > self._limit.get(key, _INF) and dt > self.TYPICAL_RATIO * self._typical.get(key, 0.0)
        if stalled:
            self.stalls += 1
            lone = self._last_stall != self.steps - 1 and now - self._restored_at > self.RECENT_LOAD_S
            if not self._probing and not self._reduced and (lone or self._full_s <= self.COST_LIMIT * self._one_s):
                # a lone stall: this process's other threads (a server's event loop, a stream's reader) wake up
                # once per token and take a core for a moment; a load that lasts stalls the next step too. Soon
                # after a load (a probe just brought the full count back) one stall is enough. Either way the
                # full count stays while its steps, stalls included, still cost less than 1-thread steps would.
                self._last_stall = self.steps
                return
            wait = self._backoff
            if self._probing:  # the load goes on: probe less often, and long stalls rarer still
                self._backoff = min(2 * self._backoff, self.probe_max_s)
                lost = (dt - self._one[key]) * self._size  # what this probe cost next to a 1-thread step
                wait = max(self._backoff, min(lost / self.PROBE_BUDGET, self.PROBE_WAIT_MAX_S))
            self._reduced = True
            self._probe_at = now + wait
        else:
            self._note_typical(key, dt)
            if self._probing:
                self._reduced = False
                self._restored_at = now  # the cost is still about COST_LIMIT or above: until steps without stalls
                # bring it down, the next stall goes back to 1 thread
                self._backoff = max(self.probe_min_s, self._backoff / 2)
        self._probing = False


class _Job:
    __slots__ = ("fn", "args", "n_threads", "done", "result", "error")

    def __init__(self, fn, args, n_threads):
        self.fn, self.args, self.n_threads = fn, args, n_threads
        self.done = threading.Event()
        self.result = self.error = None


class _ComputeThread:
    """The daemon thread that runs every job handed to on_compute_thread, one at a time, in order."""

    def __init__(self):
        import queue

        self.jobs = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="ggufrun-compute", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import numba

        if hasattr(signal, "pthread_sigmask"):  # this thread and the OpenMP workers it starts never take Ctrl-C
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        while True:
            job = self.jobs.get()
            try:
                numba.set_num_threads(job.n_threads)
                job.result = job.fn(*job.args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
                job.error = e
            finally:
                job.done.set()
                job = None  # the arguments are the caller's: hold none of them while idle


_compute: _ComputeThread | None = None
_compute_lock = threading.Lock()
_compute_ident = -1


def _reset_after_fork() -> None:
    global _compute, _compute_lock, _compute_ident
    _compute, _compute_lock, _compute_ident = None, threading.Lock(), -1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def on_compute_thread(fn: Callable, *args):
    """fn(*args) on the process's compute thread (started on first use), with the caller's Numba thread count;
    its result, or its exception raised here. Called on the compute thread itself, it runs fn directly.

    Every forward pass goes through here so that one OS thread starts all of Numba's parallel regions (see the
    module docstring). The caller blocks until fn returns, even through Ctrl-C: the pass is using buffers and
    caches the caller owns, so the KeyboardInterrupt is raised once it has ended.
    """
    global _compute, _compute_ident
    if threading.get_ident() == _compute_ident:
        return fn(*args)
    import numba

    if _compute is None:
        with _compute_lock:
            if _compute is None:
                _compute = _ComputeThread()
                _compute_ident = _compute.thread.ident
    job = _Job(fn, args, numba.get_num_threads())
    _compute.jobs.put(job)
    try:
        job.done.wait()
    except BaseException:
        while not job.done.is_set():  # the pass still runs: let it end before anything else touches its state
            with contextlib.suppress(BaseException):
                job.done.wait()
        raise
    if job.error is not None:
        error, job.error = job.error, None
        raise error
    return job.result


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


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _n_helpers(n_threads: int) -> int:
    return max(0, min(n_threads, usable_cores()) - 1)


def start_compile_helpers(n_threads: int):
    """compile_kernels' helper processes, started now when Numba's cache has never held ggufrun's kernels (the
    first run ever): they import the kernels' modules and warm up Numba's compiler (~1 s) while this process reads
    the model file, and take the compile list as soon as it exists. Returns what compile_kernels(helpers=) takes,
    or None (a warm cache, one thread: nothing started). jit.stop_helpers stops them if the load fails first."""
    from .quants import jit

    n = _n_helpers(n_threads)
    if n == 0 or not jit.cache_is_cold():
        return None
    try:
        return jit.start_helpers(None, n)
    except OSError:  # no temporary directory: compile_kernels starts them itself, or does without
        return None


def compile_kernels(transformer, n_threads: int, verbose: bool = False, helpers=None) -> float:
    """Compile (or load from Numba's on-disk cache) every kernel `transformer` uses; return the seconds it took.

    A forward pass in recording mode (quants.jit.record_calls, microseconds) lists the kernels and argument types
    the prefill and decode passes use (and the greedy sampler's kernels.exp_total). They are then compiled in
    jit.balanced's order (long kernels at both ends), with a progress line per real compilation (CompileProgress)
    and, from the first one on, helper processes (one per extra thread) compiling the list from its end into the
    same on-disk cache; this process loads what they did. `helpers` (start_compile_helpers) are helpers started
    earlier, which get the list at once; they are stopped on return whatever happens.
    The multi-row kernels (prefill attention, kernels.attend_rows, and the tiled products of the repacked matrices,
    whose one-row kernels compile in a third of their time: ~11 s of CPU for Gemma3) and the batched greedy sampler
    (kernels.greedy_rows, ~0.8 s) are left out of that list when they compile for real: a helper compiles them in the
    background (jit.compile_in_background, transformer.pending) while the model answers, passes of several rows
    running one row at a time meanwhile and a batched step's greedy rows sampling one at a time (the same bits), and
    the process waits for that helper at exit (compiling from the other end of its list meanwhile) so the next run
    finds them cached. Gemma3's first run to the first token:
    10.0-11.0 -> 8.7-9.6 s (attention), then 9.74-12.61 -> 7.79-8.59 s (the products; alternating runs).
    Last, transformer.warmup() runs every kernel once (anything the recording missed compiles there). When this
    process has every kernel already (another model loaded before), the recording pass itself was the warm-up.
    The transformer's ThreadGovernor is off meanwhile: the recording pass skips the kernels it records, and its
    steps (0.15 ms for qwen2.5-1.5b's 13 ms output projection) would become the 1-thread times every later step is
    compared with, so that every full-count step of that kind looked stalled.
    """
    from numba.core import event

    from .model.kernels import exp_sum, exp_total, greedy_rows
    from .model.transformer import BATCH_SAMPLING, ROWS, TILED
    from .quants import jit

    n_helpers = _n_helpers(n_threads)
    progress = CompileProgress()

    class Late(event.Listener):  # a kernel the recording missed: still say why the wait
        def on_start(self, ev):
            if not progress.shown:
                progress.shown = True
                print("ggufrun: compiling kernels (first run only)...", file=sys.stderr, flush=True)

        def on_end(self, ev):
            pass

    def forward_and_sample() -> None:  # every kernel of the forward passes, and the greedy sampler's
        import numpy as np

        transformer.warmup()
        exp_total(np.zeros(40, np.float32), np.float32(0.0))
        rows = np.arange(2)  # batched steps' greedy rows, their normalisers wanted
        greedy_rows(np.zeros((2, 8), np.float32), rows, np.ones(2, np.uint8), np.zeros(2, np.int64), np.zeros(2))

    def compile_all() -> None:  # on the compute thread, whose OpenMP workers never take Ctrl-C
        started = None
        governor = transformer.governor
        enabled, governor.enabled = governor.enabled, False
        try:
            calls = jit.record_calls(forward_and_sample)
            if calls:  # else every kernel was compiled in this process already, and the recording pass ran them
                started = helpers
                # what the forward pass can go without for a while, when there is a helper to compile it: the
                # multi-row kernels, whose passes run one row at a time meanwhile (Transformer.pending)
                later = [c for c in calls if c.dispatcher in TILED | ROWS | BATCH_SAMPLING] if n_helpers else []
                first = [c for c in calls if c not in later]
                order = jit.balanced(first, lead=(exp_sum,))  # attention's softmax calls exp_sum
                compiled = jit.compile_calls(order, n_helpers, progress, started)  # stops them
                if later:  # the first run: a helper compiles them while this process goes on, from the end of
                    # the list: the products first (a long prompt's rows gain the most from them), attention, then
                    # the batched greedy sampler (a server's steps of several greedy rows)
                    later.sort(key=lambda c: (c.dispatcher not in BATCH_SAMPLING, c.dispatcher not in ROWS))
                    transformer.pending = jit.compile_in_background(later, n_helpers) if compiled else None
                    if transformer.pending is None:  # a cache load, or (a run stopped early before) compiled here
                        jit.compile_calls(later, 0, progress)
                with event.install_listener("numba:compile", Late()):
                    transformer.warmup()
        finally:
            governor.enabled = enabled
            if helpers and not started:
                jit.stop_helpers(helpers)

    t0 = time.perf_counter()
    try:
        on_compute_thread(compile_all)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t0
    if verbose:
        print(f"ggufrun: kernels ready in {elapsed:.2f} s", file=sys.stderr)
    check_threading_layer()
    return elapsed
