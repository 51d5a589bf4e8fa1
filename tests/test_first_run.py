"""The first run ever: an empty Numba cache compiles every kernel with a progress line per kernel (and helper
processes compiling the list from its other end), and the next process finds them all cached. The recording pass
that lists the kernels (quants.jit.record_calls) and the progress line (runtime.CompileProgress) on their own."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from ggufrun.runtime import CompileProgress

CODE = """
import sys, ggufrun
m = ggufrun.load(sys.argv[1], n_threads=2, n_ctx=64)
print(m.detokenize([int(m.logits(m.tokenize("The capital of France is"))[-1].argmax())]))
"""

PROGRESS = re.compile(r"ggufrun: compiling kernels (\d+)/(\d+) \(first run only\)")


@pytest.mark.real
def test_empty_jit_cache_compiles_with_progress_then_is_cached(smollm2_path, tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    run = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-c", CODE, str(smollm2_path)], env=env, capture_output=True, text=True, timeout=600
    )
    first = run()
    assert first.returncode == 0, first.stderr
    steps = [(int(i), int(n)) for i, n in PROGRESS.findall(first.stderr)]
    assert steps and steps[0][0] == 1, first.stderr  # the first kernel compiles here, and says so
    n = steps[0][1]
    assert all(total == n for _, total in steps) and [i for i, _ in steps] == sorted({i for i, _ in steps})
    # the helper process (n_threads=2) compiled the last kernels of the list: this process loaded them
    assert len(steps) < n and steps[-1][0] < n, first.stderr
    assert "compiling kernels (first run only)..." not in first.stderr  # the recording missed no kernel
    second = run()
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr  # everything, helpers' kernels included, came from the cache
    assert first.stdout == second.stdout == " Paris\n"  # the greedy next token, from kernels compiled either way


RECORD = """
import sys
from ggufrun.model import Transformer
from ggufrun.quants import jit
from ggufrun.reader import GGUFFile
tf = Transformer(GGUFFile(sys.argv[1]), n_ctx=32)
calls = jit.record_calls(tf.warmup)
assert all(not c.dispatcher.overloads for c in calls)  # recorded, not compiled
for c in calls:
    print(jit._qualified_name(c.dispatcher), len(c.argtypes))
"""


def test_recording_lists_the_forward_pass_kernels_in_order_without_compiling(tmp_path):
    from synthetic import write_model

    path = write_model(tmp_path / "tiny.gguf", ctx=64, seed=1)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))  # empty: nothing compiled anywhere yet
    out = subprocess.run([sys.executable, "-c", RECORD, str(path)], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert len(names) == len(set(names))  # one entry per kernel: every layer calls the same compiled version
    k = "ggufrun.model.kernels:"
    for kernel in (
        "rmsnorm",
        "qkv_rope_store",
        "attend_rows",
        "add_norm",
        "add_norm_rows",
        "qkv_rope_store_rows",
        "qkv_rope_store_spans",
        "swiglu",
        "swiglu_rows",
        "attend_one",
        "qkv_rope_store_group",
        "attend_group",
    ):  # fmt: skip  (a batching server's decode steps too)
        assert k + kernel in names, names
    assert "ggufrun.quants.dot:dot_f32" in names, names
    # forward-pass order: prefill (attend_rows) first, the decode-only kernels last
    assert names.index(k + "rmsnorm") < names.index(k + "attend_rows") < names.index(k + "attend_one")
    # decode's own (prefill takes qkv_rope_store_rows, add_norm_rows, swiglu_rows)
    assert names[-4:] == [k + "qkv_rope_store", k + "attend_one", k + "add_norm", k + "swiglu"]
    assert not [f for _, _, files in os.walk(tmp_path / "numba-cache") for f in files]  # nothing cached either


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_one_line_per_kernel_in_a_log_and_one_rewritten_line_on_a_terminal():
    log = io.StringIO()
    p = CompileProgress(log)
    p(0, 9)
    p(2, 9)
    p.close()
    assert log.getvalue() == (
        "ggufrun: compiling kernels 1/9 (first run only)\nggufrun: compiling kernels 3/9 (first run only)\n"
    )
    term = _Terminal()
    p = CompileProgress(term)
    p(0, 9)
    p(8, 9)
    p.close()
    assert term.getvalue() == (
        "\rggufrun: compiling kernels 1/9 (first run only)\rggufrun: compiling kernels 9/9 (first run only)\n"
    )
    quiet = io.StringIO()
    CompileProgress(quiet).close()  # nothing compiled: nothing printed
    assert quiet.getvalue() == ""


def test_compile_calls_compiles_in_order_and_without_helpers_when_they_cannot_start(monkeypatch):
    import numba

    from ggufrun.quants import jit

    @numba.njit
    def plus_one(x):
        return x + 1

    @numba.njit
    def twice(x):
        return 2 * x

    calls = jit.record_calls(lambda: (plus_one(1), twice(2.0), plus_one(3)))
    assert [(c.dispatcher, [str(t) for t in c.argtypes]) for c in calls] == [
        (plus_one, ["int64"]),
        (twice, ["float64"]),
    ]  # recorded once per (kernel, types), nothing compiled
    assert not plus_one.overloads and not twice.overloads

    def no_helpers(calls, n):
        raise OSError("no temporary directory")

    monkeypatch.setattr(jit, "start_helpers", no_helpers)
    started = []
    assert jit.compile_calls(calls, n_helpers=1, on_compile=lambda i, n: started.append((i, n))) is True
    assert started == [(0, 2), (1, 2)]
    assert plus_one(1) == 2 and twice(2.0) == 4.0
    assert jit.compile_calls(calls, n_helpers=1, on_compile=lambda i, n: started.append((i, n))) is False
    assert len(started) == 2  # compiled already: no progress
    # a failure before any kernel was skipped is the caller's own
    with pytest.raises(ZeroDivisionError):
        jit.record_calls(lambda: 1 / 0)
    assert jit.record_calls(lambda: plus_one(1) + twice(1.0)) == []  # compiled: they ran


LAUNCH = """
import numpy as np
from ggufrun.quants import dot
w = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)
w.flags.writeable = False
x = np.stack([np.ones(40, np.float32), np.arange(40, dtype=np.float32)])
out = np.zeros((2, 3), np.float32)
dot.dot_f32(w, x, out)
hits = sum(dot.dot_f32.stats.cache_hits.values()), sum(dot._rows_f32.stats.cache_hits.values())
print(repr((out.tolist(), hits)))
"""


def test_a_dot_launcher_calls_its_worker_by_name_also_when_both_come_from_the_cache(tmp_path):
    # the launcher's cached machine code references the worker by an exported name: a fresh process that loads
    # both from the on-disk cache must register the name before the launcher's code is linked
    import numpy as np

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    run = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-c", LAUNCH], env=env, capture_output=True, text=True, timeout=600
    )
    first, second = run(), run()
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    (out1, hits1), (out2, hits2) = (eval(r.stdout.strip()) for r in (first, second))
    w = np.arange(3 * 40, dtype=np.float64).reshape(3, 40)
    x = np.stack([np.ones(40), np.arange(40.0)])
    assert out1 == out2 == (x @ w.T).tolist()  # small integers: exact in float32
    assert hits1 == (0, 0) and hits2 == (1, 1)  # compiled, then both loaded


def test_every_parallel_attention_kernel_is_a_launcher_of_a_registered_worker():
    # the attention kernels call their serial workers by name (ggufrun.quants.launch), as the dot kernels do;
    # a second worker of the same name would make call_worker ambiguous, so it is refused
    import numba

    from ggufrun.model import kernels
    from ggufrun.quants import launch

    for name in ("attend_one", "attend_group", "attend_rows", "attend_one_q8_0", "attend_rows_q8_0"):
        kernel = getattr(kernels, name)
        assert isinstance(kernel, launch.Launcher), name
        assert launch.WORKERS[kernel.worker.py_func.__name__] is kernel.worker
    impostor = numba.njit(lambda *a: None)
    impostor.py_func.__name__ = "_attend_rows_slots"
    with pytest.raises(ValueError, match="_attend_rows_slots"):
        launch.launcher(impostor, {"parallel": True})


def test_inliner_copies_a_callee_scope_once_per_copy_and_keeps_copies_independent():
    from numba.core import inline_closurecall, ir

    from ggufrun.quants import jit

    assert isinstance(inline_closurecall.copy, jit._SharedMemoCopy)
    loc = ir.Loc("f.py", 1)
    scope = ir.Scope(None, loc)
    blocks = []
    for i in range(3):
        b = ir.Block(scope, loc)
        b.append(ir.Assign(ir.Const(i, loc), scope.define(f"v{i}", loc), loc))
        blocks.append(b)
    first = [inline_closurecall.copy.deepcopy(b) for b in blocks]  # as InlineWorker.inline_ir's copy_ir does
    assert all(c.scope is first[0].scope for c in first) and first[0].scope is not scope  # one copy of the scope
    assert sorted(first[0].scope.localvars._con) == ["v0", "v1", "v2"]
    again = [inline_closurecall.copy.deepcopy(b) for b in blocks]  # a second copy of the same blocks
    assert again[0].scope is not first[0].scope and again[0].body[0] is not first[0].body[0]
    assert [c.body[0].value.value for c in again] == [0, 1, 2]
    assert inline_closurecall.copy.deepcopy([1, [2]]) == [1, [2]]  # anything else: copy.deepcopy


def test_balanced_order_puts_the_parallel_kernels_at_both_ends_of_the_list():
    from types import SimpleNamespace

    from ggufrun.quants import jit

    def call(name, parallel):
        return jit.KernelCall(SimpleNamespace(name=name, targetoptions={"parallel": True} if parallel else {}), ())

    calls = [call("a", False), call("dot1", True), call("b", False), call("att", True), call("dot2", True)]
    order = [c.dispatcher.name for c in jit.balanced(calls)]
    assert order == ["dot1", "dot2", "a", "b", "att"]  # helpers take the list from its end: att first
    assert jit.balanced([]) == []
    lead = (calls[2].dispatcher,)  # an entry that others call: first, whatever it is
    assert [c.dispatcher.name for c in jit.balanced(calls, lead)] == ["b", "dot1", "dot2", "a", "att"]


EARLY = """
import os, shutil, sys
from ggufrun.quants import jit
from ggufrun.runtime import start_compile_helpers
assert jit.cache_is_cold()
assert start_compile_helpers(1) is None  # one thread: no helper
directory, procs = start_compile_helpers(2)
assert len(procs) == 1 and os.path.isdir(directory) and procs[0].poll() is None  # waiting for its list
shutil.rmtree(directory)  # the load failed before the list: a helper whose directory went leaves by itself
assert procs[0].wait(timeout=120) == 0
started = start_compile_helpers(2)
jit.stop_helpers(started)
assert not os.path.exists(started[0]) and started[1][0].returncode is not None
print("ok")
"""


def test_helpers_start_before_the_model_file_is_read_only_on_a_cold_cache(tmp_path):
    if (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) < 2:
        pytest.skip("one core: no compile helpers")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    out = subprocess.run([sys.executable, "-c", EARLY], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr
    from ggufrun.quants import jit
    from ggufrun.runtime import start_compile_helpers

    if not jit.cache_is_cold():  # this process's cache holds the kernels already: nothing is started
        assert start_compile_helpers(2) is None


class Compiling:
    """A stand-in for quants.jit.Background: the multi-row kernels become ready on the `after`-th pass that looks."""

    def __init__(self, after: int, on_ready=None, busy: int = 0):
        self.after, self.on_ready, self.busy = after, on_ready, busy

    def helpers_running(self) -> int:
        return self.busy

    def ready(self, which=None) -> bool:
        from ggufrun.model.transformer import TILED

        if which is TILED:  # a pass looks at the products once, first
            self.after -= 1
        if self.after < 0 and self.on_ready is not None:
            self.on_ready()
            self.on_ready = None
        return self.after < 0


NO_LATE_COMPILE = """
import json, subprocess, sys
import numpy as np
model = sys.argv[1]
# the first run only loads the model: every kernel compiled and cached (the multi-row ones by a helper, saved at exit)
subprocess.run([sys.executable, "-c", "import sys, ggufrun; ggufrun.load(sys.argv[1], n_ctx=128)", model], check=True)
import ggufrun
from numba.core import event
m = ggufrun.load(model, n_ctx=128)
compiled = []
class Listener(event.Listener):
    def on_start(self, ev):
        compiled.append(str(ev.data.get("dispatcher")))
    def on_end(self, ev):
        pass
with event.install_listener("numba:compile", Listener()):
    tf = m.transformer
    n = tf.config.n_vocab
    tf.forward(np.arange(1, 80) % n)  # a 79-token prompt: the multi-row kernels at their shared-out sizes
    caches = tf.new_caches(3)
    tf.forward_batch([(c, np.arange(5, 75) % n) for c in caches])  # three prompts in one pass (a server's)
    tf.forward_batch([(c, [1]) for c in caches])  # and a batched decode step
print(json.dumps(compiled))
"""


def _no_late_compile(folder):
    """(argv, env) of NO_LATE_COMPILE on a Q4_0 golden model with a Numba cache of its own (~15 s on 2 cores)."""
    from conftest import GOLDEN

    env = dict(os.environ, NUMBA_CACHE_DIR=str(folder / "cache"))
    return [sys.executable, "-c", NO_LATE_COMPILE, str(GOLDEN / "small-llama-q4_0.gguf")], env


@pytest.mark.background.with_args(_no_late_compile)
def test_nothing_compiles_in_a_generation_after_the_first_load(background):
    """After a first run that only loads the model, a long prompt, a pass of several prompts and a batched step
    compile nothing: the warm-up pass (2 rows) reaches every kernel they run, the multi-row ones at sizes they share
    out too. (The parallel Q8_1 quantizer used to compile in the middle of the first prompt of more than 4 tokens.)"""
    import json

    returncode, stdout, stderr = background
    assert returncode == 0, stderr[-3000:]
    assert json.loads(stdout.strip().splitlines()[-1]) == []


def _multi_row_kernels_raise(tf, monkeypatch):
    """Make tf's multi-row kernels (kernels.attend_rows, each repacked matrix's tiled dot) raise when called; returns
    a function that puts the real ones back and the number of matrices that have a one-row kernel."""
    from dataclasses import replace

    from ggufrun.model import kernels
    from ggufrun.model.linear import Linear

    def not_yet(*args):
        raise AssertionError("a multi-row kernel called while it compiles")

    real, owners = kernels.attend_rows, [tf.weights, *tf.weights.layers]
    monkeypatch.setattr(kernels, "attend_rows", not_yet)
    swapped = []
    for owner in owners:
        for name, lin in list(vars(owner).items()):
            if isinstance(lin, Linear) and lin.dot is not lin.dot_one:
                swapped.append((owner, name, lin))
                object.__setattr__(owner, name, replace(lin, dot=not_yet))

    def restore():
        monkeypatch.setattr(kernels, "attend_rows", real)
        for owner, name, lin in swapped:
            object.__setattr__(owner, name, lin)

    return restore, len(swapped)


@pytest.mark.parametrize("stem", ["small-gemma2-q8_0", "small-llama-q4_1"])  # sliding window 8 + softcap; plain
def test_prefill_while_the_multi_row_kernels_compile_gives_the_same_bits(stem, monkeypatch):
    """While a helper still compiles the multi-row kernels (Transformer.pending), a pass of several rows runs
    attend_one per row and each product's one-row kernel: every logit is the bits of the prefill in one pass, and
    the multi-row kernels are taken up once ready."""
    import numpy as np
    from test_model_golden import GOLDEN

    from ggufrun.model import Transformer
    from ggufrun.reader import GGUFFile

    tf = Transformer(GGUFFile(GOLDEN / f"{stem}.gguf"), n_ctx=64)
    ids = np.random.default_rng(5).integers(3, tf.config.n_vocab, 40)
    ref = tf.logits(ids)  # the multi-row kernels: prefill in one pass
    restore, n_swapped = _multi_row_kernels_raise(tf, monkeypatch)
    assert n_swapped >= 7 * tf.config.n_layer  # every matrix of every block is repacked
    tf.pending = Compiling(after=10**9)
    assert np.array_equal(tf.logits(ids), ref)
    a, b = tf.new_cache(), tf.new_cache()  # two sequences in one pass, both ending in it: a 2-row output product
    rows = tf.forward_batch([(a, ids[:20]), (b, ids[:30])])
    assert np.array_equal(rows[0], ref[19]) and np.array_equal(rows[1], ref[29])
    tf.pending = Compiling(after=2, on_ready=restore)  # ready at the third pass: chunks before and after it
    cache = tf.new_cache()
    rows = [tf.forward(ids[a : a + 10], all_logits=True, cache=cache) for a in range(0, 40, 10)]
    assert np.array_equal(np.concatenate(rows), ref) and tf.pending is None


def test_passes_run_on_the_cores_a_compiling_helper_leaves(monkeypatch):
    """While a helper compiles in the background (Transformer.pending), forward and forward_batch passes run on
    the cores it leaves, the same bits; the caller's thread count is back after each pass and once it is done."""
    import numba
    import numpy as np
    from test_model_golden import GOLDEN

    from ggufrun.model import Transformer
    from ggufrun.reader import GGUFFile
    from ggufrun.runtime import set_threads, usable_cores

    cores = usable_cores()
    if cores < 2 or numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: no compile helpers")
    tf = Transformer(GGUFFile(GOLDEN / "small-llama-q4_1.gguf"), n_ctx=64)
    ids = np.random.default_rng(6).integers(3, tf.config.n_vocab, 12)
    seen = []
    blocks = tf._blocks
    monkeypatch.setattr(tf, "_blocks", lambda *a: seen.append(numba.get_num_threads()) or blocks(*a))
    before = numba.get_num_threads()
    set_threads(2)
    try:
        ref = tf.logits(ids)
        assert seen == [2]
        tf.pending = Compiling(after=10**9, busy=cores - 1)  # every core but one busy compiling
        assert np.array_equal(tf.logits(ids), ref) and seen[-1] == 1
        rows = tf.forward_batch([(tf.new_cache(), ids), (tf.new_cache(), ids[:5])])
        assert np.array_equal(rows[0], ref[-1]) and np.array_equal(rows[1], ref[4]) and seen[-1] == 1
        assert numba.get_num_threads() == 2
        tf.pending = Compiling(after=10**9, busy=0)  # its helper is done: the caller's count again
        assert np.array_equal(tf.logits(ids), ref) and seen[-1] == 2
    finally:
        set_threads(before)


def _compiling_helper() -> subprocess.Popen:
    """A stand-in for a helper process still at work (the tests stop it)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _finished_helper() -> subprocess.Popen:
    """A stand-in for a helper process that has exited."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone


def test_background_compile_is_used_when_done_and_done_here_when_its_helper_is_gone(tmp_path):
    import numba

    from ggufrun.quants import jit

    @numba.njit
    def plus_two(x):
        return x + 2

    calls = jit.record_calls(lambda: plus_two(1))
    directory = tmp_path / "claims"
    directory.mkdir()
    waiting = _compiling_helper()
    b = jit.Background(calls, (str(directory), [waiting]))
    assert not b.ready() and not plus_two.overloads  # its helper is still at it
    open(jit._done_path(str(directory), 0), "wb").close()
    assert b.ready() and plus_two(1) == 3  # done: loaded (here compiled: this test's helper wrote no cache)
    assert waiting.poll() is not None and not directory.exists()  # the helper stopped, its directory gone
    gone = _finished_helper()

    @numba.njit
    def plus_three(x):
        return x + 3

    directory.mkdir()
    b = jit.Background(jit.record_calls(lambda: plus_three(1)), (str(directory), [gone]))
    assert b.ready() and plus_three(1) == 4  # no helper left, nothing done: compiled here


def _two_kernels_beside_a_helper(tmp_path, a: int, b: int):
    """(f, g, their recorded calls, an empty claims directory, a stand-in helper at work): two fresh kernels x + a and
    x + b, neither compiled yet."""
    import numba

    from ggufrun.quants import jit

    f, g = numba.njit(lambda x: x + a), numba.njit(lambda x: x + b)
    calls = jit.record_calls(lambda: (f(1), g(1)))
    directory = tmp_path / "claims"
    directory.mkdir()
    return f, g, calls, directory, _compiling_helper()


def test_background_kernels_are_taken_up_as_each_is_done(tmp_path):
    from ggufrun.quants import jit

    plus_four, plus_five, calls, directory, helper = _two_kernels_beside_a_helper(tmp_path, 4, 5)
    b = jit.Background(calls, (str(directory), [helper]))
    assert not b.ready({plus_four}) and not b.ready() and b.helpers_running() == 1
    open(jit._done_path(str(directory), 0), "wb").close()  # the helper's first entry done
    assert b.ready({plus_four}) and plus_four(1) == 5  # loaded (here: compiled) while the helper goes on
    assert not b.ready() and not b.ready({plus_five}) and helper.poll() is None and not plus_five.overloads
    open(jit._done_path(str(directory), 1), "wb").close()
    assert b.ready() and plus_five(1) == 6
    assert helper.poll() is not None and not directory.exists() and b.helpers_running() == 0


def test_at_exit_this_process_compiles_the_entries_no_helper_has_claimed(tmp_path):
    """What a helper still compiles when the process is done (Background's finalizer, at exit): this process takes
    the unclaimed entries from the front of the list, the helper keeps its own, then the helper is waited for
    (bounded) and stopped."""
    import numba

    from ggufrun.quants import jit

    plus_six, plus_seven, calls, directory, helper = _two_kernels_beside_a_helper(tmp_path, 6, 7)
    assert jit._claim(str(directory), 1)  # the helper is at the last entry
    jit._finish_helpers((str(directory), [helper]), calls, timeout=1.0)
    assert plus_six.overloads and not plus_seven.overloads  # the first compiled here, the helper's left to it
    assert helper.poll() is not None and not directory.exists()  # waited for (1 s here), stopped, cleaned up
    gone = _finished_helper()

    @numba.njit
    def plus_eight(x):
        return x + 8

    directory.mkdir()
    jit._finish_helpers((str(directory), [gone]), jit.record_calls(lambda: plus_eight(1)))
    assert not plus_eight.overloads and not directory.exists()  # no helper left: the next run compiles it


def test_a_batched_steps_greedy_rows_sample_alone_while_their_kernel_compiles(monkeypatch):
    """While a helper still compiles kernels.greedy_rows (Transformer.pending), a batch engine's greedy rows are
    sampled one at a time by their own samplers: the same chunks; once it is ready they are sampled together."""
    import numpy as np
    from test_model_golden import GOLDEN

    import ggufrun
    import ggufrun.batch as batch
    from ggufrun.batch import BatchEngine
    from ggufrun.sampling import SamplingParams

    model = ggufrun.load(str(GOLDEN / "small-llama-q4_1.gguf"), n_ctx=64, n_threads=1)
    prompts = [list(np.random.default_rng(i).integers(3, model.config.n_vocab, 6)) for i in range(3)]
    alone = [[c.token for c in model.generate(p, max_tokens=8, temperature=0)] for p in prompts]
    seen = []
    at_once = batch.sample_greedy_rows
    monkeypatch.setattr(batch, "sample_greedy_rows", lambda *a: seen.append(len(a[1])) or at_once(*a))

    def run():
        with BatchEngine.from_model(model, n_slots=3) as engine:
            streams = [engine.submit(p, SamplingParams(temperature=0), 8) for p in prompts]
            return [[c.token for c in s] for s in streams]

    model.transformer.pending = Compiling(after=10**9)
    assert not model.transformer.batch_sampling_ready()
    assert run() == alone and seen == []
    model.transformer.pending = None
    assert run() == alone and seen and max(seen) == 3


def test_health_says_compiling_while_a_helper_compiles_and_the_benchmark_waits_for_it(monkeypatch):
    """Transformer.compiling is True while a helper still compiles in the background and False once it is done (or
    there is none); the server's /health says so, and benchmarks/serve.py waits for it before measuring (a run that
    did not measured the row-by-row passes: Gemma3's 16-client ratio ~2x instead of ~5x)."""
    from pathlib import Path

    import httpx
    from live_server import LiveServer
    from test_model_golden import GOLDEN

    import ggufrun
    from ggufrun.server import create_app

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import serve

    model = ggufrun.load(str(GOLDEN / "small-llama-q4_1.gguf"), n_ctx=64, n_threads=1)
    tf = model.transformer
    assert not tf.compiling  # nothing pending
    with LiveServer(create_app(model, model_id="tiny", parallel=2)) as s:
        health = lambda: httpx.get(s.url + "/health").json()  # noqa: E731
        assert health()["compiling"] is False
        helper = Compiling(after=10**9, busy=1)
        tf.pending = helper
        try:
            assert tf.compiling and health()["compiling"] is True
            target = serve.ServerTarget(s.url, model.tokenizer.eog_ids, None)
            try:
                assert target.compiling()
                monkeypatch.setattr(serve.time, "sleep", lambda _: None)  # its poll: the helper ends at the 3rd look
                looks = []
                monkeypatch.setattr(target, "compiling", lambda: looks.append(1) or len(looks) < 3)
                assert serve.wait_compiled("ggufrun", target.compiling) >= 0 and len(looks) == 3
            finally:
                target.close()
            helper.busy = 0  # its helper is done: passes may load what it compiled
            assert not tf.compiling and health()["compiling"] is False
        finally:
            tf.pending = None
    model.close()


def test_the_server_says_at_start_that_its_batched_kernels_compile_and_when_they_are_done():
    """A server started while a helper still compiles (the first run after an install) logs so at start, and logs
    again once the helper is done."""
    import logging
    import time

    from starlette.testclient import TestClient
    from test_model_golden import GOLDEN

    import ggufrun
    from ggufrun.server import create_app

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("uvicorn.error")  # the server's logger (uvicorn's own)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    model = ggufrun.load(str(GOLDEN / "small-llama-q4_1.gguf"), n_ctx=64, n_threads=1)
    helper = Compiling(after=10**9, busy=1)
    model.transformer.pending = helper
    try:
        with TestClient(create_app(model, model_id="tiny", parallel=2)) as client:
            assert client.get("/health").json()["compiling"] is True
            assert any("still compile in the background" in m for m in said)
            assert not any("are compiled" in m for m in said)
            helper.busy = 0
            deadline = time.monotonic() + 10
            while not any("are compiled" in m for m in said) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.get("/health").json()["compiling"] is False
        assert any("the batched kernels are compiled" in m for m in said)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        model.transformer.pending = None
        model.close()
