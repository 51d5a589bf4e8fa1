"""runtime.ThreadGovernor on a simulated machine (a fake clock and thread count: each step's duration is chosen by
the test), and on a real forward pass: switching thread counts inside a pass leaves every logit's bits unchanged."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from ggufrun.runtime import ThreadGovernor, _ThreadCount

QUIET_ONE = 200e-6  # seconds a step takes on 1 thread
SLICE = 4e-3  # a descheduled thread holds its region this long (a scheduler time slice)


class Machine:
    """A fake clock and Numba thread count; `cost(key, n)` is how long a step of `key` takes on n threads."""

    def __init__(self, n: int = 2):
        self.t = 0.0
        self.n = n
        self.sets: list[int] = []
        self.busy = False  # another process holds a core: every step on more than 1 thread stalls
        self.wake = 0.0  # what the first step on more threads after a step on 1 thread adds (workers asleep)
        self.prev_n = n

    def clock(self) -> float:
        return self.t

    def get(self) -> int:
        return self.n

    def set(self, n: int) -> None:
        self.n = n
        self.sets.append(n)

    def cost(self, key, n: int) -> float:
        if n == 1:
            return QUIET_ONE
        return SLICE if self.busy else QUIET_ONE / 1.8

    def governor(self, **kw) -> ThreadGovernor:
        return ThreadGovernor(clock=self.clock, get_threads=self.get, set_threads=self.set, **kw)

    def run_pass(self, gov: ThreadGovernor, keys=(3, 3, 3, 3, 5)) -> list[int]:
        """One forward pass of steps `keys`; returns the thread count each step ran on."""
        counts = []
        with gov:
            for key in keys:
                gov.step(key)
                counts.append(self.n)
                self.t += self.cost(key, self.n) + (self.wake if self.n > 1 and self.prev_n == 1 else 0.0)
                self.prev_n = self.n
        return counts

    def load_until_reduced(self, gov: ThreadGovernor, limit: int = 200) -> int:
        """Busy-machine steps until the governor drops to 1 thread (at most `limit`); returns the steps it took."""
        self.busy = True
        for i in range(limit):
            if self.run_pass(gov, keys=(3,)) == [1]:
                return i
        raise AssertionError(f"still on the full count after {limit} stalled steps")

    def one_stall(self, gov: ThreadGovernor) -> float:
        """A load that lasts until the governor drops to 1 thread, then quiet passes until the full count is back
        (at most 10 s simulated): the seconds from the drop to then."""
        self.load_until_reduced(gov)
        self.busy = False
        t_stall = self.t
        while gov.reduced and self.t < t_stall + 10:
            self.run_pass(gov)
        return self.t - t_stall

    def run_for(self, gov: ThreadGovernor, seconds: float) -> list[int]:
        counts: list[int] = []
        end = self.t + seconds
        while self.t < end:
            counts += self.run_pass(gov)
        return counts


def test_quiet_machine_runs_at_full_count():
    m = Machine()
    gov = m.governor()
    counts = m.run_for(gov, 5.0)
    assert m.n == 2  # the caller's count, restored after every pass
    # each key's first step and one per refresh_s measure the 1-thread time; everything else runs on 2 threads
    assert counts.count(1) <= 2 * (1 + 5.0 / gov.refresh_s) + 2
    assert counts.count(2) > 0.99 * len(counts)
    assert gov.stalls == 0 and not gov.reduced
    assert gov.steps == len(counts) and gov.steps_one == counts.count(1)


def test_a_load_drops_to_one_thread_within_the_cost_window():
    """A load stalls every full-count step: once the stalls make the last ~COST_WINDOW_S of full-count steps cost
    COST_LIMIT times their 1-thread time, steps run on 1 thread (here after 11 stalls, 44 ms), and stay there."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    m.busy = True
    counts = m.run_pass(gov, keys=(3,) * 60)
    first = counts.index(1)
    assert 2 < first and first * SLICE < gov.COST_WINDOW_S and counts[first:] == [1] * (60 - first)
    assert gov.stalls == first and gov.reduced
    assert m.n == 2  # restored for the caller at the end of the pass


def test_stalls_that_cost_less_than_the_limit_keep_the_full_count():
    """Two, then five stalls in a row, once in a while: the full count's steps, stalls included, still cost less than
    COST_LIMIT times 1-thread steps over the window (a VM descheduling a thread now and then, 1-16 ms)."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    for n_stalls in (2, 5, 2, 5):
        m.busy = True
        assert m.run_pass(gov, keys=(3,) * n_stalls) == [2] * n_stalls
        m.busy = False
        m.run_for(gov, 0.3)
    assert gov.stalls == 14 and not gov.reduced


def test_soon_after_a_load_one_stall_is_enough():
    """Within RECENT_LOAD_S of a probe that brought the full count back, the next stall drops to 1 thread at once."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    m.load_until_reduced(gov)
    m.busy = False
    while gov.reduced:
        m.run_pass(gov)  # a probe brings the full count back
    m.busy = True
    counts = m.run_pass(gov, keys=(3,) * 5)
    assert counts == [2, 1, 1, 1, 1] and gov.reduced
    m.busy = False
    m.run_for(gov, gov.RECENT_LOAD_S + 3.0)  # long quiet: a lone stall is ignored again
    m.busy = True
    assert m.run_pass(gov, keys=(3,))[0] == 2 and not gov.reduced


def test_a_lone_stall_keeps_the_full_count():
    """A single slow step (this process's own reader thread waking for a token) is not a load."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    for _ in range(20):
        m.busy = True
        counts = m.run_pass(gov, keys=(3,))
        m.busy = False
        counts += m.run_pass(gov)
        assert counts == [2] * 6
    assert gov.stalls == 20 and not gov.reduced


def test_bandwidth_bound_noise_is_not_a_stall():
    """A 1B+ model's decode step streams its weights from DRAM nearly as fast on 1 thread as on 2: its ordinary slow
    steps, 1.6x the best 1-thread step but within TYPICAL_RATIO of the usual 2-thread one, two in a row now and then,
    keep the full count; a descheduled thread's slice still stalls it."""
    m = Machine()
    n_full = [0]

    def cost(key, n):
        if n == 1:
            return 2.2e-3
        n_full[0] += 1
        return 3.5e-3 if n_full[0] % 10 in (5, 6) else 2.5e-3  # two slow steps in a row, every 10

    m.cost = cost
    gov = m.governor()
    counts = m.run_for(gov, 3.0)
    assert gov.stalls == 0 and not gov.reduced
    assert counts.count(2) > 0.98 * len(counts)
    m.cost = lambda key, n: 2.2e-3 if n == 1 else 2.5e-3 + SLICE  # another process takes a core
    assert m.load_until_reduced(gov) <= 20 and gov.reduced


def test_persistent_load_costs_about_one_stall_per_second():
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    onset = m.load_until_reduced(gov)
    seconds = 20.0
    t0 = m.t
    counts = m.run_for(gov, seconds)
    stalls = counts.count(2)
    # probes after 0.05, 0.1, 0.2, ... s, then once every probe_max_s
    assert stalls <= seconds / gov.probe_max_s + 8
    assert gov.probes == stalls and gov.stalls == onset + stalls  # after the onset, every stall was a probe
    wasted = (onset + stalls) * (SLICE - QUIET_ONE)
    assert wasted < 0.02 * (m.t - t0)


def test_long_stalls_are_probed_less_often():
    """On a crowded machine a descheduled thread waits tens of milliseconds: probes then space out so that they
    cost at most PROBE_BUDGET of the time."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    m.cost = lambda key, n: QUIET_ONE if n == 1 else 0.1
    t0 = m.t
    counts = m.run_for(gov, 60.0)
    wasted = counts.count(2) * (0.1 - QUIET_ONE)
    assert wasted < 1.5 * gov.PROBE_BUDGET * (m.t - t0)


def test_probe_brings_the_full_count_back_when_the_load_ends():
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    m.busy = True
    m.run_for(gov, 10.0)
    assert gov.reduced
    m.busy = False
    counts = m.run_for(gov, 2 * gov.probe_max_s)
    assert not gov.reduced
    tail = counts[len(counts) // 2 :]
    assert tail.count(2) > 0.95 * len(tail)


def test_intermittent_stall_returns_quickly():
    """One stall on a quiet machine costs about probe_min_s on 1 thread, not a whole probe_max_s."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    assert m.one_stall(gov) < 2 * gov.probe_min_s


def test_a_probe_that_pays_for_waking_the_workers_still_brings_the_full_count_back():
    """After steps on 1 thread the other workers sleep, and the first step on the full count, the probe, pays for
    waking them (here twice the usual full-count time above a 1-thread step): below PROBE_RATIO it is not a stall, so
    a quiet machine gets the full count back after one stall in about probe_min_s, and keeps it."""
    m = Machine()
    m.wake = 1.5 * QUIET_ONE
    gov = m.governor()
    m.run_for(gov, 0.5)
    assert m.one_stall(gov) < 2 * gov.probe_min_s
    counts = m.run_for(gov, 2.0)
    assert counts.count(2) > 0.98 * len(counts)


def test_pairs_of_slow_steps_that_still_beat_one_thread_keep_the_full_count():
    """A VM's steps sometimes take 2-4x their usual time with no other load: two such steps in a row are stalls by
    the ratios, but while the full count's steps, stalls included, cost less than 1-thread steps on average it
    stays (here 10% of full-count steps take 4x: 0.72 of a 1-thread step on average)."""
    m = Machine()
    n_full = [0]

    def cost(key, n):
        if n == 1:
            return QUIET_ONE
        n_full[0] += 1
        return (4 if n_full[0] % 20 in (0, 1) else 1) * QUIET_ONE / 1.8

    m.cost = cost
    gov = m.governor()
    counts = m.run_for(gov, 3.0)
    assert gov.stalls > 0
    assert counts.count(2) > 0.97 * len(counts)
    m.cost = lambda key, n: QUIET_ONE if n == 1 else SLICE  # a real load still sends the steps to 1 thread
    m.run_pass(gov, keys=(3,) * 40)
    assert gov.reduced


def test_one_thread_time_is_refreshed():
    """A step kind that became slower on 1 thread too (a longer context) is re-measured, so its full-count steps
    are not taken for stalls."""
    m = Machine()
    gov = m.governor(refresh_s=0.5)
    m.run_for(gov, 1.0)
    m.cost = lambda key, n: 3 * QUIET_ONE / (1 if n == 1 else 1.8)  # every step 3x longer, at any count
    m.run_for(gov, 0.2)  # the first full-count steps look like stalls against the old 1-thread time...
    m.run_for(gov, 5.0)  # ...until refreshes catch the new one up
    stalls = gov.stalls
    counts = m.run_for(gov, 5.0)
    assert gov.stalls == stalls
    assert counts.count(2) > 0.95 * len(counts)


def test_inflated_one_thread_time_is_brought_down():
    """A 1-thread time first measured while descheduled (20x too long) is re-measured every refresh_s, so that the
    stalls of a later load are still recognised as such."""
    m = Machine()
    quiet = m.cost
    m.cost = lambda key, n: 20 * QUIET_ONE if n == 1 else quiet(key, n)
    gov = m.governor(refresh_s=0.5)
    m.run_pass(gov)
    m.cost = quiet
    m.run_for(gov, 5.0)
    assert m.load_until_reduced(gov) * SLICE < 2 * gov.COST_WINDOW_S


def test_first_step_with_a_compilation_does_not_hide_stalls():
    """The very first step of a key can include seconds of JIT compilation: it is measured again at once, so a
    load that starts right after is still recognised."""
    m = Machine()
    quiet = m.cost
    m.cost = lambda key, n: 1.0 if m.t == 0 else quiet(key, n)
    gov = m.governor()
    m.run_pass(gov)
    m.cost = quiet
    m.busy = True
    counts = m.run_pass(gov, keys=(3,) * 10)
    assert gov.stalls == 2 and counts[-5:] == [1] * 5


def test_backoff_shrinks_after_the_load_ends():
    """After a long load (probes once per probe_max_s), each successful probe halves the backoff: a stall soon
    after returns faster than probe_max_s."""
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    m.busy = True
    m.run_for(gov, 10.0)
    m.busy = False
    m.run_for(gov, 2 * gov.probe_max_s)
    assert not gov.reduced
    assert m.one_stall(gov) < 0.6 * gov.probe_max_s


def test_keys_are_measured_separately():
    """A long step kind (the output projection) is not compared with the 1-thread time of a short one."""
    m = Machine()
    m.cost = lambda key, n: (10 if key == 5 else 1) * QUIET_ONE / (1 if n == 1 else 1.8)
    gov = m.governor()
    counts = m.run_for(gov, 3.0)
    assert gov.stalls == 0
    assert counts.count(2) > 0.99 * len(counts)


def test_sizes_of_one_key_are_compared_per_unit():
    """Prefill passes of different row counts share a key (a bucket of row counts): times are compared per row."""
    m = Machine()
    gov = m.governor()
    sizes = [8, 1, 5, 8, 2, 7]

    def run(seconds):
        counts, end = [], m.t + seconds
        while m.t < end:
            with gov:
                for size in sizes:
                    gov.step(7, size)
                    counts.append(m.n)
                    m.t += size * m.cost(7, m.n)
        return counts

    counts = run(3.0)
    assert gov.stalls == 0 and counts.count(2) > 0.99 * len(counts)
    m.busy = True
    run(0.2)
    assert gov.stalls >= 1 and gov.reduced


def test_restores_the_count_when_the_pass_raises():
    m = Machine()
    gov = m.governor()
    m.run_for(gov, 0.5)
    m.busy = True
    with pytest.raises(KeyboardInterrupt):
        with gov:
            for _ in range(40):  # stalls until the governor drops to 1 thread
                gov.step(3)
                m.t += m.cost(3, m.n)
            raise KeyboardInterrupt
    assert gov.reduced and m.n == 2


def test_one_thread_or_disabled_never_touches_the_count():
    m = Machine(n=1)
    gov = m.governor()
    m.run_for(gov, 1.0)
    assert m.sets == [] and gov.steps == 0
    m = Machine(n=2)
    gov = m.governor()
    gov.enabled = False
    m.busy = True
    counts = m.run_for(gov, 1.0)
    assert m.sets == [] and set(counts) == {2}


@pytest.mark.parametrize(
    "kw",
    [
        {"stall_ratio": 0},
        {"probe_min_s": -1.0},
        {"probe_max_s": "1"},
        {"refresh_s": True},
        {"probe_min_s": 2.0, "probe_max_s": 1.0},
    ],
)
def test_bad_settings_name_the_argument(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        ThreadGovernor(**kw)


def test_switching_threads_inside_a_pass_keeps_every_bit(tmp_path):
    """The governor changes Numba's count between steps of a real pass; logits stay the bits of a 1-thread run
    (kernels deal rows to threads; a row's arithmetic does not depend on the count)."""
    from synthetic import write_model

    from ggufrun.model import Transformer
    from ggufrun.reader import GGUFFile

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    path = write_model(tmp_path / "g.gguf", "gemma3", window=4, n_layer=4, ctx=64, seed=5)
    tf = Transformer(GGUFFile(path), n_ctx=64, n_batch=8)
    ids = np.arange(1, 21) % tf.config.n_vocab
    with _ThreadCount(1):  # the count restored afterwards, whatever the governor set
        tf.governor.enabled = False
        ref = tf.logits(ids).copy()
        ref_step = tf.forward([7]).copy()

        # a clock on which every other step looks like a stall: the count changes many times in each pass
        ticks = iter(np.cumsum(np.tile([1e-4, 5e-2, 1e-4, 1e-4], 10_000)))
        counts: list[int] = []

        def set_count(n):
            counts.append(n)
            numba.set_num_threads(n)

        tf.governor = ThreadGovernor(probe_min_s=1e-9, probe_max_s=1e-9, clock=lambda: float(next(ticks)),
                                     set_threads=set_count, get_threads=numba.get_num_threads)  # fmt: skip
        numba.set_num_threads(2)
        got = tf.logits(ids)
        got_step = tf.forward([7])
        assert numba.get_num_threads() == 2
    assert counts.count(1) >= 3 and counts.count(2) >= 3, counts
    assert tf.governor.stalls >= 2
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got_step, ref_step)


# ---- runtime.on_compute_thread: one OS thread starts every parallel region -------------------------------------


def test_compute_thread_runs_every_job_on_one_thread_with_the_callers_count():
    import threading

    from ggufrun.runtime import on_compute_thread

    def where():
        return threading.get_ident(), numba.get_num_threads()

    seen = []

    def caller(n):
        numba.set_num_threads(n)
        seen.append(on_compute_thread(where))

    threads = [threading.Thread(target=caller, args=(1 + i % 2,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with _ThreadCount(1):  # this thread's count as it was afterwards
        caller(1)
    assert len({ident for ident, _ in seen}) == 1  # all on one thread...
    assert seen[0][0] not in {t.ident for t in threads} | {threading.get_ident()}  # ...none of the callers'
    assert sorted(n for _, n in seen) == sorted([1, 2, 1, 2, 1])  # each with its caller's thread count
    assert on_compute_thread(lambda: on_compute_thread(where))[0] == seen[0][0]  # nested: runs in place


def test_compute_thread_raises_the_jobs_exception_in_the_caller():
    from ggufrun.runtime import on_compute_thread

    def fail(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad 3"):
        on_compute_thread(fail, 3)
    assert on_compute_thread(lambda a, b: a + b, 2, 3) == 5  # and keeps serving


def test_load_leaves_the_governor_untrained():
    # the kernels' recording pass skips every kernel it records: its steps (0.15 ms for a 13 ms output projection)
    # must not become the 1-thread times later steps are compared with
    from pathlib import Path

    import ggufrun

    m = ggufrun.load(str(Path(__file__).parent / "data" / "golden" / "small-llama-q4_0.gguf"), n_threads=2, quiet=True)
    gov = m.transformer.governor
    assert gov.enabled and gov.steps == 0 and not gov._one
