"""Parallel kernels: a launcher hands its serial worker's own compiled code to one shared parallel loop.

    @launcher(_rows_q4_1, DOT_PARALLEL)        # the worker: njit, takes the launcher's arrays and a range n0, n1
    def dot_q4_1(w, d, s, qs, sums, out):      # the launcher: compiled serial, called from Python
        run_items("_rows_q4_1", (w, d, s, qs, sums, out), N, CHUNK)   # worker(..., n0, n0 + CHUNK) on the threads

Why: Numba's parfor passes are slow on large loop bodies, and the inlined row / attention functions are large; so
the parallel work only calls a serial worker. Numba links a called function's code into the caller's module and
optimises and compiles it there again, so a worker is called by name instead (its code is built once). And a
prange kernel is two modules of its own (the gufunc holding the loop body, then the function that starts it):
~0.6 s of compilation each, for a loop that only calls the worker (dot_q8_0_x8_one: 0.67 s). So every launcher
shares one prange loop, parallel_items(item, args, total, step), compiled once (0.5 s), which calls
item(args, n0, n1) for n0 in range(0, total, step) on Numba's threads; a launcher compiles serial (0.16 s).

How: a Launcher first compiles or loads parallel_items and its worker for the launcher's argument types, and
registers their code addresses under names derived from the functions and those types (export_worker, llvmlite's
add_symbol). run_items(name, args, total, step) emits, in the launcher's module, an item function that unpacks the
argument tuple and calls the worker by that name, stores the tuple in the launcher's stack frame (the arrays without
their reference counts, as Numba's gufuncs pass them: the launcher holds them; counting them per item made the
threads contend on one cache line, Q8_0 16384 x 1024 matvec 340 -> 560 us), and calls parallel_items by name with
both addresses. Names are resolved by the JIT linker; Numba's on-disk cache keeps a launcher's machine code with
them unresolved: loading it needs them registered first, which Launcher.compile (the path of every compilation and
cache load) does before anything else. So launchers are called from Python only: a cached Numba function that
called one would be loaded without that step. The worker's code is the same either way.

A launcher whose own code needs a parallel loop besides its worker's (the tiled products' activation layouts on
AVX-512: dot._plus128, dot._pairs_q8_k) is a prange_launcher: compiled parallel, it lays out its activations in a
prange loop of its own and then hands the worker to run_items as any launcher does. call_worker calls a worker by
name from any compiled code (dev/machine_state.py's fixed shares per thread, dev/work_stealing.py's static split).

Who runs which item: each of a region's threads starts on an equal run of consecutive items and takes them one at a
time from the front; a thread done with its run takes the back half of another thread's remaining run (work
stealing, _steal). A static split (OpenMP's schedule(static), what prange does) ends when the slowest thread is done.
On a 2-core VM whose cores at times ran at different speeds (another tenant on one of them), Q4_1 3,072 x 576 on 2
threads (dev/work_stealing.py: each iteration times the product on 1 thread pinned to either core, then on 2 threads
static and with stealing), medians where one core was 1.35x or more slower: 39.1 / 86.4 / 182.6 us static against
32.2 / 69.4 / 138.3 with stealing at 1 / 8 / 16 rows (0.80-0.83x); with both cores within 1.15x, 0.97-1.00x. A
thread takes its own items with one compare-and-swap on its own cache line, so an item costs what it cost under the
static split (one shared counter that every thread claimed from, guided, cost 4-8% a SmolLM2 step on even cores).
Items write disjoint outputs, so which thread runs one never changes a bit.

Workers are found by their function name (`run_items("_rows_q4_1", ...)`), which must be unique among launchers.
"""

from __future__ import annotations

import hashlib

import llvmlite.binding as llb
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils, sigutils
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

WORKERS: dict = {}  # worker function name -> its dispatcher
_EXPORTED: set[str] = set()


def worker_symbol(worker, argtypes) -> str:
    """The name a worker's compiled version for `argtypes` is exported under (the same in every process)."""
    key = f"{worker.py_func.__module__}.{worker.py_func.__qualname__}{tuple(argtypes)}"
    return f"ggufrun.worker.{worker.py_func.__name__}.{hashlib.sha1(key.encode()).hexdigest()[:16]}"


def export_worker(worker, argtypes: tuple) -> str:
    """Compile (or load) `worker` for `argtypes` and make its code resolvable by worker_symbol's name."""
    name = worker_symbol(worker, argtypes)
    if name not in _EXPORTED:
        worker.compile(argtypes)
        cres = worker.overloads[argtypes]
        address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        if not address:
            raise RuntimeError(f"no compiled code for {worker.py_func.__qualname__}{argtypes}")
        llb.add_symbol(name, address)
        _EXPORTED.add(name)
    return name


def worker_argtypes(argtypes) -> tuple:
    """A launcher's argument types (those passed on) plus the worker's range (n0, n1)."""
    return tuple(argtypes) + (types.intp, types.intp)


def _exported_name(caller: str, worker_name: str, argtypes: tuple) -> str:
    """The name WORKERS[worker_name]'s version for argtypes is exported under, which must be exported already."""
    name = worker_symbol(WORKERS[worker_name], argtypes)
    if name not in _EXPORTED:  # a cached launcher would reference a name its Launcher.compile does not export
        raise TypeError(f"{caller}: {worker_name}{argtypes} is not what the launcher exported")
    return name


def _call_by_name(context, builder, name: str, argtypes: tuple, values: list) -> None:
    """A call of the Numba function (returning none) whose code is exported under `name` (export_worker)."""
    fn = cgutils.get_or_insert_function(builder.module, context.call_conv.get_function_type(types.none, argtypes), name)
    context.call_conv.call_function(builder, fn, types.none, argtypes, values)


@intrinsic
def call_worker(typingctx, worker_name, args):
    """WORKERS[worker_name](*args), args = (launcher's arguments..., n0, n1), as a call to the worker's own compiled
    code (exported by Launcher.compile) instead of a copy of it in the caller's module."""
    if not isinstance(worker_name, types.StringLiteral) or not isinstance(args, types.BaseTuple):
        return None
    argtypes = worker_argtypes(args.types[:-2])
    name = _exported_name("call_worker", worker_name.literal_value, argtypes)

    def codegen(context, builder, sig, llargs):
        values = [builder.extract_value(llargs[1], i) for i in range(len(args))]
        values[-2:] = [context.cast(builder, v, t, types.intp) for v, t in zip(values[-2:], args.types[-2:])]
        _call_by_name(context, builder, name, argtypes, values)
        return context.get_dummy_value()

    return types.none(worker_name, args), codegen


_ITEM = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), ir.IntType(64), ir.IntType(64)])
_LOOP_ARGS = (types.intp, types.intp, types.intp, types.intp)  # parallel_items(item, args, total, step)


@intrinsic
def _call_item(typingctx, item, args, n0, n1):
    """item(args, n0, n1): item an address of _ITEM's type (run_items' item function), args the address of its tuple."""

    def codegen(context, builder, sig, llargs):
        fn = builder.inttoptr(llargs[0], _ITEM.as_pointer())
        builder.call(fn, [builder.inttoptr(llargs[1], _ITEM.args[0]), llargs[2], llargs[3]])
        return context.get_dummy_value()

    return types.none(types.intp, types.intp, types.intp, types.intp), codegen


@intrinsic
def _thread_count(typingctx):
    """The calling thread's Numba thread count: Numba's threading layer's get_num_threads, called by the name that
    layer registers (numba/np/ufunc/parallel.py), so that a cached function can call it (numba.get_num_threads
    embeds the function's address and keeps Numba from caching its caller)."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads")
        return builder.call(fn, [])  # declared as Numba's parfor lowering declares it

    return types.intp(), codegen


@intrinsic
def _lane_words(typingctx, lanes):
    """The address of `lanes` int64 words, each in a cache line of its own, on the caller's stack (its frame
    outlives the parallel region that uses them): the lanes' ranges of items (_take, _steal)."""

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        raw = builder.alloca(i64, size=builder.add(builder.mul(args[0], ir.Constant(i64, 8)), ir.Constant(i64, 8)))
        at = builder.ptrtoint(raw, i64)
        return builder.and_(builder.add(at, ir.Constant(i64, 63)), ir.Constant(i64, -64))  # 64-byte aligned

    return types.intp(types.intp), codegen


@intrinsic
def _load(typingctx, addr):
    """The int64 at addr, read atomically (acquire)."""

    def codegen(context, builder, sig, args):
        return builder.load_atomic(builder.inttoptr(args[0], ir.IntType(64).as_pointer()), "acquire", 8)

    return types.int64(types.intp), codegen


@intrinsic
def _store(typingctx, addr, value):
    """Store the int64 value at addr atomically (release)."""

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], builder.inttoptr(args[0], ir.IntType(64).as_pointer()), "release", 8)
        return context.get_dummy_value()

    return types.none(types.intp, types.int64), codegen


@intrinsic
def _swap(typingctx, addr, old, new):
    """Compare and swap the int64 at addr: new where it holds old; whether it did."""

    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.extract_value(builder.cmpxchg(ptr, args[1], args[2], "acq_rel", "acquire"), 1)

    return types.boolean(types.intp, types.int64, types.int64), codegen


_LOW = (1 << 32) - 1  # a lane's word: the first item it has left in the low 32 bits, the end of its range above


@njit(inline="always", nogil=True)
def _take(word):
    """The next item of the lane whose word is at `word`, taken from the front of its range; -1 once it is empty."""
    while True:
        w = _load(word)
        first, end = w & _LOW, w >> 32
        if first >= end:
            return -1
        if _swap(word, w, w + 1):
            return first


@njit(inline="always", nogil=True)
def _steal(words, lane, lanes):
    """Move the back half of another lane's range (the first one found with items left, from lane + 1 on) into this
    lane's empty range; whether there was any."""
    for k in range(1, lanes):
        word = words + 64 * ((lane + k) % lanes)
        while True:
            w = _load(word)
            first, end = w & _LOW, w >> 32
            if first >= end:
                break
            cut = end - (end - first + 1) // 2
            if _swap(word, w, (cut << 32) | first):
                _store(words + 64 * lane, (end << 32) | cut)
                return True
    return False


@njit(cache=True, nogil=True, parallel=True, error_model="numpy", boundscheck=False)
def parallel_items(item, args, total, step):
    """item(args, n0, min(total, n0 + step)) for n0 in range(0, total, step), the items shared among Numba's threads
    (at the calling thread's thread count): every launcher's parallel loop (run_items). Each thread starts on an
    equal run of consecutive items, taken one at a time from the front (_take), and once its run is done takes the
    back half of another's that has items left (_steal; work stealing), so that a thread slowed by another program
    on its core hands its work to the others instead of holding them up at the region's end."""
    n = (total + step - 1) // step
    if n > _LOW >> 1:
        raise ValueError("parallel_items: 2**31 work items or more")
    lanes = min(n, _thread_count())
    words = _lane_words(lanes)
    for t in range(lanes):
        _store(words + 64 * t, ((t + 1) * n // lanes) << 32 | (t * n // lanes))
    for t in prange(lanes):
        more = True
        while more:
            c = _take(words + 64 * t)
            while c >= 0:
                _call_item(item, args, c * step, min(total, c * step + step))
                c = _take(words + 64 * t)
            more = _steal(words, t, lanes)


@intrinsic
def run_items(typingctx, worker_name, args, total, step):
    """WORKERS[worker_name](*args, n0, min(total, n0 + step)) for n0 in range(0, total, step), on the threads
    (parallel_items), each a call to the worker's own compiled code (exported by Launcher.compile). A single work
    item (0 < total <= step) runs on the calling thread without a parallel region, whose start costs more than it
    shares out (2 threads: Q8_1 quantizing 2 x 576 values 1.35 us on this thread against 3.62 us as one item)."""
    if not isinstance(worker_name, types.StringLiteral) or not isinstance(args, types.BaseTuple):
        return None
    argtypes = worker_argtypes(args.types)
    name = _exported_name("run_items", worker_name.literal_value, argtypes)
    loop = worker_symbol(parallel_items, _LOOP_ARGS)

    def codegen(context, builder, sig, llargs):
        module, i64 = builder.module, ir.IntType(64)
        tuple_type = context.get_value_type(args)
        item = module.globals.get(name + ".item")
        if item is None:  # void item(i8* args, i64 n0, i64 n1): the worker on the tuple at args
            item = ir.Function(module, _ITEM, name + ".item")
            item.linkage = "internal"
            b = ir.IRBuilder(item.append_basic_block())
            packed = b.load(b.bitcast(item.args[0], tuple_type.as_pointer()))
            values = [b.extract_value(packed, i) for i in range(len(args))] + list(item.args[1:])
            _call_by_name(context, b, name, argtypes, values)
            b.ret_void()
        packed = llargs[1]
        for i, t in enumerate(args.types):  # arrays without their reference counts (the caller holds them)
            if isinstance(t, types.Array):
                a = context.make_array(t)(context, builder, value=builder.extract_value(packed, i))
                a.meminfo = cgutils.get_null_value(a.meminfo.type)
                a.parent = cgutils.get_null_value(a.parent.type)
                packed = builder.insert_value(packed, a._getvalue(), i)
        with builder.goto_entry_block():  # whole cache lines of their own: read by every thread, written by none
            raw = builder.alloca(ir.ArrayType(ir.IntType(8), -(-context.get_abi_sizeof(tuple_type) // 64) * 64))
        raw.align = 64
        slot = builder.bitcast(raw, tuple_type.as_pointer())
        builder.store(packed, slot)
        values = [builder.ptrtoint(item, i64), builder.ptrtoint(slot, i64)]
        values += [context.cast(builder, v, t, types.intp) for v, t in zip(llargs[2:], sig.args[2:])]
        total, step = values[2], values[3]
        zero = ir.Constant(i64, 0)
        one_item = builder.and_(builder.icmp_signed(">", total, zero), builder.icmp_signed("<=", total, step))
        with builder.if_else(one_item) as (here, threads):
            with here:
                builder.call(item, [builder.bitcast(slot, _ITEM.args[0]), zero, total])
            with threads:
                _call_by_name(context, builder, loop, _LOOP_ARGS, values)
        return context.get_dummy_value()

    return types.none(worker_name, args, total, step), codegen


def export_parallel_items() -> None:
    """Compile (or load) parallel_items and make its code resolvable by name (what every launcher calls)."""
    export_worker(parallel_items, _LOOP_ARGS)


class Launcher(CPUDispatcher):
    """A kernel that calls its serial worker through run_items: before
    compiling or loading a version of the kernel, parallel_items and the worker's version for the same arguments are
    compiled or loaded and exported."""

    def compile(self, sig):
        args, _ = sigutils.normalize_signature(sig)
        export_parallel_items()
        used = range(len(args)) if self.worker_args is None else self.worker_args
        export_worker(self.worker, worker_argtypes(args[i] for i in used))
        return super().compile(sig)


def _launcher(worker, options: dict, worker_args: tuple[int, ...] | None):
    name = worker.py_func.__name__
    if WORKERS.setdefault(name, worker) is not worker:
        raise ValueError(f"launcher: a worker named {name} is registered already")

    def wrap(py_func):
        dispatcher = njit(**options)(py_func)
        dispatcher.__class__ = Launcher
        dispatcher.worker, dispatcher.worker_args = worker, worker_args
        return dispatcher

    return wrap


def launcher(worker, options: dict, worker_args: tuple[int, ...] | None = None):
    """Decorator: a Launcher of `worker`, compiled serial with `options` (their `parallel` dropped: the threads are
    parallel_items'), whose body hands the work to run_items. The worker takes the launcher's arguments worker_args
    (indices; None: all of them) and a range n0, n1. Without reference counting (_nrt=False, quants/jit.py): a
    launcher only hands its arrays on, and its Python wrapper then makes no MemInfo per array argument."""
    return _launcher(worker, {k: v for k, v in options.items() if k != "parallel"} | {"_nrt": False}, worker_args)


def prange_launcher(worker, options: dict, worker_args: tuple[int, ...] | None = None):
    """Decorator: a Launcher of `worker` compiled with `options` (which must include parallel=True), for launchers
    with parallel loops of their own besides run_items'."""
    return _launcher(worker, options, worker_args)
