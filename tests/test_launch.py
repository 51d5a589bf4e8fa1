"""ggufrun.quants.launch: launchers hand their worker to the one shared parallel loop (run_items, parallel_items)."""

import sys

import numba
import numpy as np
import pytest

from ggufrun.quants import launch
from ggufrun.runtime import _ThreadCount


@numba.njit(nogil=True)
def _mark_items(hits, ranges, tids, scale, n0, n1):
    """Worker: every index of n0..n1 counted once, the range and the thread that ran it recorded at n0."""
    for i in range(n0, n1):
        hits[i] += scale
    ranges[n0, 0], ranges[n0, 1] = n0, n1
    tids[n0] = numba.get_thread_id()


@launch.launcher(_mark_items, {"nogil": True, "parallel": True}, (0, 1, 2, 3))  # step is the launcher's own
def mark_items(hits, ranges, tids, scale, step):
    launch.run_items("_mark_items", (hits, ranges, tids, scale), hits.shape[0], step)


@numba.njit(nogil=True)
def _column_sums(x, out, n0, n1):
    for j in range(n0, n1):
        s = 0.0
        for i in range(x.shape[0]):
            s += x[i, j]
        out[j] = s


@launch.launcher(_column_sums, {"nogil": True})
def column_sums(x, out):
    launch.run_items("_column_sums", (x, out), x.shape[1], 3)


@pytest.mark.parametrize("total, step", [(1, 1), (7, 3), (64, 1), (1000, 16), (5, 8)])
def test_run_items_calls_the_worker_once_per_item_with_its_range(total, step):
    hits = np.zeros(total, np.int64)
    ranges = np.full((total, 2), -1, np.int64)
    tids = np.full(total, -1, np.int64)
    mark_items(hits, ranges, tids, 2, step)
    assert (hits == 2).all()  # every index once, the scalar argument passed through
    starts = np.arange(0, total, step)
    assert ranges[starts].tolist() == [[s, min(total, s + step)] for s in starts]
    others = np.setdiff1d(np.arange(total), starts)
    assert (ranges[others] == -1).all()
    assert ((tids[starts] >= 0) & (tids[starts] < numba.get_num_threads())).all()  # run on the region's threads


@numba.njit(nogil=True)
def _slow_on_the_caller(hits, tids, spin, n0, n1):
    """Worker: each item counted once and its thread recorded; on the calling thread (id 0) an item first spins."""
    tid = numba.get_thread_id()
    x = 1.0
    if tid == 0:
        for _ in range(spin):
            x = np.sqrt(x + 1.0)  # a chain of square roots, which the compiler cannot fold
    for i in range(n0, n1):
        hits[i] += 1 + (x < 0.0)  # x never negative: keeps the spin
        tids[i] = tid


@launch.launcher(_slow_on_the_caller, {"nogil": True, "parallel": True})
def slow_on_the_caller(hits, tids, spin):
    launch.run_items("_slow_on_the_caller", (hits, tids, spin), hits.shape[0], 1)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 threads")
def test_a_slow_thread_hands_its_items_to_the_others():
    # each thread starts on an equal run of the items; the calling thread here takes ~0.5 ms an item, the others
    # none, so they take the back half of its run again and again (work stealing): it runs far fewer than its half
    n = 64
    hits, tids = np.zeros(n, np.int64), np.full(n, -1, np.int64)
    # Numba keeps the thread count per thread: an earlier test may have left this one at 1
    with _ThreadCount(2):
        slow_on_the_caller(hits, tids, 0)  # compile
        hits[:], tids[:] = 0, -1
        slow_on_the_caller(hits, tids, 100_000)
    assert (hits == 1).all()  # every item once, none lost or run twice by a steal
    assert (tids == 0).sum() <= n // 4, tids.tolist()


def test_run_items_runs_every_item_once_however_the_threads_take_them():
    # random region sizes, items of uneven cost (the caller's slow): steals race with the owners' takes
    rng = np.random.default_rng(0)
    # all the threads (an earlier test may have left this one at 1)
    with _ThreadCount(numba.config.NUMBA_NUM_THREADS):
        for _ in range(300):
            n = int(rng.integers(1, 400))
            hits, tids = np.zeros(n, np.int64), np.full(n, -1, np.int64)
            slow_on_the_caller(hits, tids, int(rng.integers(0, 3000)))
            assert (hits == 1).all()


def test_launchers_compile_serial_and_share_one_parallel_loop():
    assert not mark_items.targetoptions.get("parallel")  # `parallel` dropped: the threads are parallel_items'
    assert launch.parallel_items.targetoptions.get("parallel")
    mark_items(np.zeros(4, np.int64), np.zeros((4, 2), np.int64), np.zeros(4, np.int64), 1, 1)
    assert launch.worker_symbol(launch.parallel_items, launch._LOOP_ARGS) in launch._EXPORTED


def test_run_items_leaves_reference_counts_as_they_were_and_takes_any_layout():
    # the items get the arrays without their reference counts (the launcher holds them): nothing is freed or kept
    # alive by the calls; a strided view (layout 'A') works as a contiguous array does
    x = np.arange(60.0).reshape(6, 10)
    view, out = x[::2, 1::2], np.zeros(5)
    before = sys.getrefcount(x), sys.getrefcount(view), sys.getrefcount(out)
    for _ in range(200):
        column_sums(view, out)
    assert (sys.getrefcount(x), sys.getrefcount(view), sys.getrefcount(out)) == before
    assert out.tolist() == view.sum(axis=0).tolist()


def test_a_worker_name_is_registered_once():
    impostor = numba.njit(lambda *a: None)
    impostor.py_func.__name__ = "_mark_items"
    with pytest.raises(ValueError, match="_mark_items"):
        launch.launcher(impostor, {"nogil": True})
