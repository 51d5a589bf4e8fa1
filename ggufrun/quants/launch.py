"""Parallel kernels whose prange body calls a serial worker's own compiled code.

    @launcher(_rows_q4_1)                      # the worker: njit, takes the launcher's arrays and a range n0, n1
    def dot_q4_1(w, d, s, qs, sums, out):      # the launcher: parallel, called from Python
        for c in prange(n_chunks):
            call_worker("_rows_q4_1", (w, d, s, qs, sums, out, n0, n1))

Why: Numba's parfor passes are slow on large loop bodies, and the inlined row / attention functions are large; so
the parallel loop only calls a serial worker. Numba links a called function's code into the caller's module and
optimises and compiles it there again; a parallel kernel is two modules (the gufunc holding the prange body, then
the function that starts it), so a worker's machine code was built up to three times, and the two extra builds were
most of a kernel's compile time (dot_q4_1: 2.0 -> 0.7 s CPU without them; attend_rows: see ggufrun.model.kernels).

How: a Launcher first compiles or loads its worker for the launcher's argument types and registers the worker's
code address under a name derived from the worker and those types (export_worker, llvmlite's add_symbol); the
prange body calls that name (call_worker), an external function that the JIT linker resolves. Numba's on-disk
cache keeps the launcher's machine code with the reference unresolved: loading it needs the name registered first,
which Launcher.compile (the path of every compilation and cache load) does before anything else. So launchers are
called from Python only: a cached Numba function that called one would be loaded without that step. The worker's
code is the same either way; one call per work item costs nothing measurable (dot products: matvec and 128-row
matmul on 5 types x 2 shapes, -2% to +4% per case, +0.6% on average, within this shared machine's noise).

Workers are found by their function name (`call_worker("_rows_q4_1", ...)`), which must be unique among launchers.
"""

from __future__ import annotations

import hashlib

import llvmlite.binding as llb
from numba import njit, types
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


@intrinsic
def call_worker(typingctx, worker_name, args):
    """WORKERS[worker_name](*args), args = (launcher's arguments..., n0, n1), as a call to the worker's own compiled
    code (exported by Launcher.compile) instead of a copy of it in the caller's module."""
    if not isinstance(worker_name, types.StringLiteral) or not isinstance(args, types.BaseTuple):
        return None
    worker = WORKERS[worker_name.literal_value]
    argtypes = worker_argtypes(args.types[:-2])
    name = worker_symbol(worker, argtypes)
    if name not in _EXPORTED:  # a cached launcher would reference a name its Launcher.compile does not export
        raise TypeError(f"call_worker: {worker_name.literal_value}{argtypes} is not what the launcher exported")

    def codegen(context, builder, sig, llargs):
        values = [builder.extract_value(llargs[1], i) for i in range(len(args))]
        values[-2:] = [context.cast(builder, v, t, types.intp) for v, t in zip(values[-2:], args.types[-2:])]
        fnty = context.call_conv.get_function_type(types.none, argtypes)
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        context.call_conv.call_function(builder, fn, types.none, argtypes, values)
        return context.get_dummy_value()

    return types.none(worker_name, args), codegen


class Launcher(CPUDispatcher):
    """A parallel kernel that calls its serial worker through call_worker: before compiling or loading a version
    of the kernel, the worker's version for the same arguments is compiled or loaded and exported."""

    def compile(self, sig):
        args, _ = sigutils.normalize_signature(sig)
        used = range(len(args)) if self.worker_args is None else self.worker_args
        export_worker(self.worker, worker_argtypes(args[i] for i in used))
        return super().compile(sig)


def launcher(worker, options: dict, worker_args: tuple[int, ...] | None = None):
    """Decorator: a Launcher (njit with `options`, which must include parallel=True) of `worker`, which takes the
    launcher's arguments worker_args (indices; None: all of them) and a range n0, n1."""
    name = worker.py_func.__name__
    if WORKERS.setdefault(name, worker) is not worker:
        raise ValueError(f"launcher: a worker named {name} is registered already")

    def wrap(py_func):
        dispatcher = njit(**options)(py_func)
        dispatcher.__class__ = Launcher
        dispatcher.worker, dispatcher.worker_args = worker, worker_args
        return dispatcher

    return wrap
