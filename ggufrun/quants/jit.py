"""Numba options for every kernel in ggufrun.quants, in one place.

DOT is for the dot-product kernels (ggufrun.quants.dot): their vector arithmetic is spelled out with explicit
FMAs, and strict IEEE semantics everywhere else keep LLVM from reordering it differently in the 1-row and 4-row
kernels, so a row's result does not depend on how many rows are computed together.
EXACT is for dequantization and activation quantization, which must round exactly like gguf-py / llama.cpp:
no contraction (`a*b + c` must round twice, as NumPy does) and no reciprocal tricks (`127/amax`).
FAST (reassociation and FMA contraction, without `nnan`/`ninf`) is for experiments in dev/ that let LLVM
vectorise reductions its own way.

Also here, the first-run-ever compilation of a model's kernels shared with helper processes (section below):
record_calls(run) -> [KernelCall] lists what a forward pass would compile, balanced(calls) orders it for two ends,
compile_calls(calls, n_helpers, on_compile) compiles it in order with helpers working from the other end,
helper(directory) is a helper's body.
Numba's dispatcher cache (numba/core/caching.py) is the only channel between the processes.
"""

import contextlib
import copy
import importlib
import inspect
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from numba.core import config

from .launch import Launcher

# Threading layer: OpenMP first. Measured on SmolLM2 decode (2 threads): omp 10.1 ms per token, tbb 10.8 ms,
# workqueue 36.5 ms (Numba's own default order is tbb, omp, workqueue). Only when the user has not chosen.
if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
    config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]

FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})

# _nrt=False: compiled without Numba's reference counting (NRT), for kernels that allocate nothing. With it, every
# array an inlined helper takes and every view a kernel makes is counted: calls of NRT_incref / NRT_decref inside the
# loops (atomic on an array passed from Python), around which the core saves and reloads the live vector registers;
# and the wrapper of a kernel called from Python wraps each array argument in a MemInfo of its own. The activation
# quantizer (EXACT) had two such calls a block of 32 values: AMD EPYC Zen 4, one thread, alternating processes,
# quantize_q8_1 of 1 x 576 1.12 -> 0.89 us, of 8 x 1,536 13.6 -> 12.0 us, an empty call with its 5 arrays 0.44 -> 0.31
# us; the same bits. The dot kernels' workers (DOT) keep it: their tiles allocate their accumulators for many rows
# (np.empty), and their vpdpbusd loops have no counting calls (checked in the assembly of _rows_q4_1_x8 and
# _one_q4_1_x8); every plain launcher goes without it whatever its options (launch.launcher).
DOT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)
DOT_PARALLEL = dict(DOT, parallel=True)
EXACT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False, _nrt=False)
EXACT_PARALLEL = dict(EXACT, parallel=True)
FAST = dict(cache=True, nogil=True, fastmath=set(FASTMATH), error_model="numpy", boundscheck=False)


# ---- Numba's inliner: a callee's IR built once, its scope copied once per call site ----------------------------
# Every `inline="always"` call site deep-copies the callee's Numba IR block by block (InlineWorker.inline_ir's
# copy_ir, numba/core/inline_closurecall.py), each block with a fresh memo, so the callee's whole variable scope
# (every variable of every function inlined into it) is copied once per block: blocks x variables. The dot kernels
# nest four levels of inlined helpers, and this copying was 60-75% of their compile time (SmolLM2's Q4_1 worker
# _rows_q4_1: 19.6 s -> 7.5 s CPU; numba issues 8989 and 9204). _SharedMemoCopy stands in for the copy module
# inside that one Numba module: consecutive deep copies of blocks of the same scope share one memo, which is what
# a single deepcopy of the whole block map would do. A block seen again, or a block of another scope, starts a new
# memo, so two copies of one IR stay independent. The machine code is unchanged (same bytes, checked on
# _rows_q4_1's assembly); only Numba's front end gets faster. Compilation runs under Numba's global compiler lock,
# so one thread at a time uses the shared memo.
# The same InlineWorker also re-ran a callee's untyped passes (bytecode to Numba IR, and recursively every helper the
# callee inlines) at every call site; _inline_function runs them once per callee and options and gives each site a
# copy (a fresh function identity, so the inlined variable names stay distinct): _rows_q4_1 6.9 -> 5.8 s CPU, again
# the same machine code.


class _SharedMemoCopy:
    """The copy module, except that copy.deepcopy(block) of consecutive blocks of one scope shares a memo."""

    def __init__(self, module):
        self._module = module
        self._scope = None
        self._memo: dict = {}

    def deepcopy(self, x, memo=None):
        from numba.core import ir

        if memo is not None or not isinstance(x, ir.Block):
            return self._module.deepcopy(x, memo)
        if x.scope is not self._scope or id(x) in self._memo:
            self._scope, self._memo = x.scope, {}
        return self._module.deepcopy(x, self._memo)

    def forget(self) -> None:
        self._scope, self._memo = None, {}

    def __getattr__(self, name):
        return getattr(self._module, name)


_COPY = _SharedMemoCopy(copy)


_CALLEE_IR: dict = {}  # (function, contexts, flags, locals) -> the callee's IR after Numba's untyped passes


def _inline_function(self, caller_ir, block, i, function, arg_typs=None):
    """InlineWorker.inline_function, with the callee's untyped passes run once per (function, contexts, flags,
    locals) instead of once per call site (and recursively for every helper the callee inlines)."""
    from numba.core import bytecode

    flags = dict(self.flags.values(), enable_ssa=False)  # what the untyped passes below run with
    # options (ParallelOptions, FastMathOptions...) are not hashable but their reprs list every field
    key = (function, id(self.typingctx), id(self.targetctx), repr(sorted(flags.items())), repr(self.locals))
    cached = _CALLEE_IR.get(key)
    if cached is None:
        cached = _CALLEE_IR[key] = self.run_untyped_passes(function)
    else:
        self.flags.enable_ssa = False  # as run_untyped_passes leaves the caller's flags
    # inline_ir deep-copies the blocks before changing anything; the definitions map is shared by FunctionIR.copy,
    # and the function identity names the inlined variables, so a call site gets its own of each
    callee_ir = cached.copy()
    callee_ir._definitions = {k: list(v) for k, v in cached._definitions.items()}
    callee_ir.func_id = bytecode.FunctionIdentity.from_function(function)
    try:
        return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars, arg_typs=arg_typs)
    finally:
        _COPY.forget()  # the memo holds every block it copied: let them go with the call site


def _speed_up_inliner() -> None:
    """Install _SharedMemoCopy and _inline_function where Numba's inliner has the layout they were written for
    (Numba 0.68: a module-level `copy`, inline_function(self, caller_ir, block, i, function, arg_typs=None));
    with anything else Numba is left as it is (slower first compilations, nothing else)."""
    from numba.core import inline_closurecall

    worker = getattr(inline_closurecall, "InlineWorker", None)
    expected = ["self", "caller_ir", "block", "i", "function", "arg_typs"]
    if (
        getattr(inline_closurecall, "copy", None) is copy
        and worker is not None
        and list(inspect.signature(worker.inline_function).parameters) == expected
        and hasattr(worker, "run_untyped_passes")
        and hasattr(worker, "inline_ir")
    ):
        inline_closurecall.copy = _COPY
        worker.inline_function = _inline_function


_speed_up_inliner()


# ---- compiling a model's kernels ahead of its first forward pass, shared between processes -------------------
# The first run ever compiles every kernel a model uses (tens of seconds of LLVM on a laptop core). To spread that
# over the cores: `record_calls` runs a forward pass in which a kernel without a compiled version for its argument
# types records (kernel, argument types) instead of compiling and running; `compile_calls` then compiles the list in
# order in this process while helper processes (`jit.helper(DIR)`) compile it from the other end.
# They meet in the middle through claim files (one per list entry, created with O_EXCL): whoever claims an entry
# compiles it into Numba's on-disk cache (numba.core.caching re-reads a kernel's index on every lookup), and this
# process loads what a helper claimed once the helper marks it done. Correctness never depends on a helper: an entry
# a helper failed or died on is compiled here.


class KernelCall(NamedTuple):
    """A jitted function and the Numba types of the arguments it was called with."""

    dispatcher: Any
    argtypes: tuple


def _qualified_name(dispatcher) -> str:
    f = dispatcher.py_func
    return f"{f.__module__}:{f.__qualname__}"


def _resolve(name: str):
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@contextlib.contextmanager
def _recording(calls: list[KernelCall]):
    """Within: in this thread, calling a jitted function with argument types it has no compiled version for
    appends a KernelCall to `calls` and returns None (nothing compiles, nothing runs). Other threads compile as
    usual."""
    from numba.core import types
    from numba.core.dispatcher import Dispatcher, OmittedArg

    original = Dispatcher._compile_for_args  # what the C dispatcher calls on a miss, then calls its result
    thread = threading.get_ident()
    seen: set = set()

    def record(self, *args, **kws):
        if threading.get_ident() != thread or kws:
            return original(self, *args, **kws)
        argtypes = tuple(types.Omitted(a.value) if isinstance(a, OmittedArg) else self.typeof_pyval(a) for a in args)
        if (id(self), argtypes) not in seen:
            seen.add((id(self), argtypes))
            calls.append(KernelCall(self, argtypes))
        return _no_op

    Dispatcher._compile_for_args = record
    try:
        yield calls
    finally:
        Dispatcher._compile_for_args = original


def _no_op(*args, **kws):
    return None


def record_calls(run: Callable[[], object]) -> list[KernelCall]:
    """The kernels `run()` would compile, with their argument types, in the order it calls them.

    Kernels already compiled in this process run (on whatever `run` passes them); the others only record. So an
    empty list means `run()` ran as usual. A run that fails after a kernel was skipped (it may have used its
    result) gives the kernels called up to there; a failure before that is run()'s own and propagates.
    """
    from ..runtime import on_compute_thread  # where forward passes run: the recording must be on that thread

    return on_compute_thread(_record_calls_here, run)


def _record_calls_here(run: Callable[[], object]) -> list[KernelCall]:
    calls: list[KernelCall] = []
    with _recording(calls):
        try:
            run()
        except Exception:
            if not calls:
                raise
    return calls


def _heavy(dispatcher) -> bool:
    return isinstance(dispatcher, Launcher) or bool(dispatcher.targetoptions.get("parallel"))


def balanced(calls: list[KernelCall], lead: tuple = ()) -> list[KernelCall]:
    """`calls` reordered for compile_calls' two ends: the parallel kernels (the dot products, attention: several
    seconds each, where the others take well under one) alternately at the front and at the back, the rest in the
    middle, so that this process and the helpers meet on a short entry and finish at about the same time (in
    forward-pass order a long kernel could sit in the middle: ~7 s of one process waiting on the other).

    lead: dispatchers that other entries call (kernels.exp_sum, under attention's softmax), first of all: this
    process compiles them before the entries that call them, which then find them compiled here, where a helper
    taking them as entries of their own would compile them a second time (Gemma3's first run: exp_sum, 0.47 s)."""
    first = [c for c in calls if c.dispatcher in lead]
    rest = [c for c in calls if c.dispatcher not in lead]
    heavy = [c for c in rest if _heavy(c.dispatcher)]
    light = [c for c in rest if not _heavy(c.dispatcher)]
    return first + heavy[0::2] + light + heavy[1::2][::-1]


def _claim(directory: str, i: int) -> bool:
    try:
        os.close(os.open(os.path.join(directory, str(i)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _done_path(directory: str, i: int) -> str:
    return os.path.join(directory, f"{i}.done")


def _running(procs: list) -> int:
    """How many of the helper processes `procs` have not exited."""
    return sum(p.poll() is None for p in procs)


def _compile_unclaimed(directory: str, i: int, compile_entry: Callable, *args) -> None:
    """Entry i of the claims directory's list, unless someone claimed it: claim it, compile_entry(*args), mark it
    done (a failure too: whoever waits for it then compiles it itself, or the next run does)."""
    if not _claim(directory, i):
        return
    try:
        compile_entry(*args)
    except Exception:  # noqa: BLE001 - compiled again where it is needed
        pass
    finally:
        open(_done_path(directory, i), "wb").close()


_HELPER = "import sys; from ggufrun.quants import jit; jit.helper(sys.argv[1])"
# what starting helpers or giving them a list can raise (no temporary directory, a kernel that cannot be pickled):
# this process then compiles without them
_CANNOT_START = (OSError, pickle.PicklingError, TypeError, AttributeError)


def start_helpers(calls: list[KernelCall] | None, n: int) -> tuple[str, list]:
    """Start n helper processes compiling `calls` from the last one backwards, in a new claims directory; returns
    (directory, processes). calls=None starts them ahead of the list (publish_calls gives it to them later): they
    import the kernels' modules and warm up Numba's compiler meanwhile. The caller removes the directory when done
    (stop_helpers)."""
    directory = tempfile.mkdtemp(prefix="ggufrun-compile-")
    try:
        if calls is not None:
            publish_calls(directory, calls)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    procs = []
    for _ in range(n):
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", _HELPER, directory], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        except OSError:  # no interpreter to start (embedded Python...): this process compiles everything
            break
    return directory, procs


def publish_calls(directory: str, calls: list[KernelCall]) -> None:
    """Give the helpers of `directory` their list (written whole, then renamed into place: a helper never reads
    half a list)."""
    path = os.path.join(directory, "calls.pickle")
    with open(path + ".tmp", "wb") as f:
        pickle.dump([(_qualified_name(c.dispatcher), c.argtypes) for c in calls], f)
    os.replace(path + ".tmp", path)


def stop_helpers(started: tuple[str, list] | None) -> None:
    """Stop the helpers start_helpers started (what they still compile is not needed) and remove their directory."""
    if not started:
        return
    directory, procs = started
    for p in procs:
        p.kill()
        p.wait()
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def cache_is_cold() -> bool:
    """Whether Numba's on-disk cache has never held ggufrun's kernels (the first run ever, or a new NUMBA_CACHE_DIR):
    rmsnorm, which every architecture's forward pass uses, has no index file where Numba would look for it. False
    when that cannot be told (another Numba's cache layout)."""
    from ..model.kernels import rmsnorm

    try:
        return not os.path.exists(rmsnorm._cache._cache_file._index_path)
    except AttributeError:
        return False


def compile_calls(
    calls: list[KernelCall],
    n_helpers: int = 0,
    on_compile: Callable[[int, int], None] | None = None,
    started: tuple[str, list] | None = None,
) -> bool:
    """Compile (or load from Numba's on-disk cache) every entry of `calls`, in order; return whether any compiled.

    At the first real compilation (not a cache load), starts n_helpers helper processes that compile the list
    from its end into the on-disk cache, and from then on takes from them what they have claimed; helpers started
    ahead (start_helpers(None, n), `started`) get the list at once instead. Either way they are stopped on return.
    on_compile(i, n) is called when entry i (0-based) of n starts a real compilation.
    """
    from numba.core import event

    state = {"index": 0, "compiled": False, "announced": -1, "dir": None, "procs": []}
    if started:
        try:
            publish_calls(started[0], calls)
        except _CANNOT_START:  # they wait for nothing: this process does it all
            stop_helpers(started)
            n_helpers, started = 0, None
        else:
            state["dir"], state["procs"] = started

    class Listener(event.Listener):
        def on_start(self, ev):
            i = state["index"]
            if state["announced"] == i:
                return
            state["announced"], state["compiled"] = i, True
            if on_compile is not None:
                on_compile(i, len(calls))
            if state["dir"] is None and n_helpers > 0 and i + 1 < len(calls):
                state["dir"] = ""  # one try: without helpers (no temporary directory...), this process does it all
                try:
                    state["dir"], state["procs"] = start_helpers(calls, n_helpers)
                except _CANNOT_START:
                    return
                _claim(state["dir"], i)

        def on_end(self, ev):
            pass

    try:
        with event.install_listener("numba:compile", Listener()):
            for i, call in enumerate(calls):
                state["index"] = i
                directory = state["dir"]
                if directory and not _claim(directory, i):
                    _wait_for_helper(directory, i, state["procs"])
                call.dispatcher.compile(call.argtypes)
    finally:  # every entry is compiled by now: what a helper still does is not needed
        stop_helpers((state["dir"], state["procs"]))
    return state["compiled"]


class Background:
    """Kernels a helper process compiles into Numba's on-disk cache while this process goes on without them
    (compile_in_background): ready(which) says, without waiting, whether the kernels `which` (dispatchers; None:
    all) can be used, and loads them once the helper has marked them done (or compiles them here if no helper is
    left to). At interpreter exit (or when the object is collected) it waits for the helper to finish, so that the
    next process finds everything cached, and removes its directory."""

    def __init__(self, calls: list[KernelCall], started: tuple[str, list]):
        self.calls = calls
        self._started = started
        self._done = [_done_path(started[0], i) for i in range(len(calls))]
        self._loaded = [False] * len(calls)
        self._finalizer = weakref.finalize(self, _finish_helpers, started, calls)

    def helpers_running(self) -> int:
        """How many of its helper processes still compile (0 once they are done or stopped): the cores they keep
        busy (Transformer passes run beside them on the cores left)."""
        if not self._finalizer.alive:
            return 0
        return _running(self._started[1])

    def _entries(self, which) -> list[int]:
        return [i for i, c in enumerate(self.calls) if which is None or c.dispatcher in which]

    def ready(self, which=None) -> bool:
        entries = self._entries(which)
        if self._finalizer.alive:
            alive = _running(self._started[1]) > 0
            if alive and not all(os.path.exists(self._done[i]) for i in entries):
                return False
            if not alive or all(map(os.path.exists, self._done)):
                self._finalizer.detach()
                stop_helpers(self._started)  # done (or gone): nothing of theirs is needed any more
        for i in entries:  # from the cache the helper wrote (compiled here where it failed)
            if not self._loaded[i]:
                self.calls[i].dispatcher.compile(self.calls[i].argtypes)
                self._loaded[i] = True
        return True


def compile_in_background(calls: list[KernelCall], n_helpers: int) -> Background | None:
    """Start a helper compiling `calls` (all of them, from the end) into Numba's on-disk cache; None where none can
    start (the caller compiles them itself)."""
    if n_helpers < 1 or not calls:
        return None
    try:
        started = start_helpers(calls, 1)
    except _CANNOT_START:
        return None
    if not started[1]:
        stop_helpers(started)
        return None
    return Background(calls, started)


def _finish_helpers(started: tuple[str, list], calls: list[KernelCall] | None = None, timeout: float = 120.0) -> None:
    """Let the helpers finish what they compile (bounded), then stop them and remove their directory. With `calls`
    (their list), this process, idle now, compiles the entries no helper has claimed yet from the front of the list
    while the helper works from its end: a process that answered and exits (`ggufrun run` on the first run ever)
    waits about half as long on 2 cores."""
    deadline = time.monotonic() + timeout
    directory, procs = started
    if _running(procs):
        print("ggufrun: saving the kernels still compiling for the next run (first run only)...", file=sys.stderr,
              flush=True)  # fmt: skip
    try:
        for i, call in enumerate(calls or ()):
            if time.monotonic() > deadline or not _running(procs):
                break  # out of time, or no helper left (the next run compiles what is missing)
            _compile_unclaimed(directory, i, call.dispatcher.compile, call.argtypes)
        for p in procs:
            p.wait(max(0.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    stop_helpers(started)


def _wait_for_helper(directory: str, i: int, procs: list) -> None:
    """Wait until entry i, claimed by a helper, is marked done or no helper is left to do it."""
    done = _done_path(directory, i)
    while not os.path.exists(done) and _running(procs):
        time.sleep(0.01)


def helper(directory: str) -> None:
    """A helper process: compile the claims directory's list from the end, every entry no one has claimed. Started
    ahead of its list, it first imports the kernels' modules and compiles a trivial function (Numba's one-time set-up,
    ~0.5 s), then waits for the list; it leaves when its directory goes or its parent dies."""
    path = os.path.join(directory, "calls.pickle")
    if not os.path.exists(path):
        parent = os.getppid()
        _warm_up()
        while not os.path.exists(path):
            if os.getppid() != parent or not os.path.isdir(directory):
                return
            time.sleep(0.005)
    with open(path, "rb") as f:
        entries = pickle.load(f)
    for i in reversed(range(len(entries))):
        _compile_unclaimed(directory, i, lambda entry: _resolve(entry[0]).compile(entry[1]), entries[i])


def _warm_up() -> None:
    """Import the kernels' modules and compile one trivial function, not cached: what every first compilation in a
    process pays for once (Numba's typing and target contexts, LLVM's set-up). Then compile the parallel loop that
    every launcher calls (launch.parallel_items, 0.5 s) into the on-disk cache, while the main process still reads
    the model file: it loads it from there instead of compiling it too."""
    import numba

    from ..model import kernels  # noqa: F401
    from . import dot  # noqa: F401
    from .launch import export_parallel_items

    numba.njit(nogil=True)(_no_op_int)(1)
    export_parallel_items()


def _no_op_int(x):
    return x + 1
