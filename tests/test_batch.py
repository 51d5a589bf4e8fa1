"""Batched decoding: Transformer.forward_batch gives every sequence the bits forward() gives it alone (synthetic
llama, qwen2 and gemma3 with a sliding window, and SmolLM2), and the continuous-batching engine (ggufrun.batch)
gives every request the chunks it gets alone while requests join, leave, share prefixes and prefill in chunks.

Engine tests watch the steps through a wrapper around forward_batch that records each call's (cache, rows) and,
when gated, lets the engine run only as many steps as the test allows, so interleavings are deterministic.
"""

from __future__ import annotations

import math
import mmap
import threading
import time

import numpy as np
import pytest
from synthetic import write_model

from ggufrun.batch import BatchEngine, batch_generate
from ggufrun.errors import ContextOverflowError
from ggufrun.model import Transformer
from ggufrun.reader import GGUFFile
from ggufrun.sampling import SamplingParams

VARIANTS = {
    "llama": {},
    "qwen2": {"arch": "qwen2"},
    # 6 layers: 5 local (window 5) then 1 global
    "gemma3": {"arch": "gemma3", "n_layer": 6, "n_kv": 1, "window": 5, "softcap": 5.0},
}
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("batch")


def _transformer(model_dir, name, **kwargs) -> Transformer:
    path = model_dir / f"{name}.gguf"
    if not path.exists():
        write_model(path, **VARIANTS[name])
    return Transformer(GGUFFile(path), **kwargs)


def _alone(tf, ids) -> np.ndarray:
    """Logits after the last of `ids`, evaluated alone in a fresh cache by forward()."""
    return tf.forward(np.asarray(ids), cache=tf.new_cache()).copy()


# ---- forward_batch -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grouped", [False, True], ids=["caches", "group"])
@pytest.mark.parametrize("name", VARIANTS)
def test_forward_batch_is_bit_identical_to_forward(model_dir, name, grouped):
    """Prompts of 1..19 tokens (n_batch 8: some straddle passes, gemma3's window crosses them), then decode steps,
    then a step mixing decode rows with a prompt chunk: every row equals forward() on that sequence alone. With
    `group` the caches are slots of one KVCache group, whose decode rows take kernels.attend_group."""
    tf = _transformer(model_dir, name, n_ctx=64, n_batch=8)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 96, n).tolist() for n in (7, 1, 19, 3, 12)]
    caches = tf.new_caches(len(prompts) + 1)[1:] if grouped else [tf.new_cache() for _ in prompts]
    rows = tf.forward_batch(list(zip(caches, prompts))).copy()
    assert rows.shape == (len(prompts), tf.config.n_vocab)
    for p, row in zip(prompts, rows):
        np.testing.assert_array_equal(row, _alone(tf, p))
    seqs = [list(p) for p in prompts]
    for _ in range(3):
        nxt = [int(r.argmax()) for r in rows]
        rows = tf.forward_batch([(c, [t]) for c, t in zip(caches, nxt)]).copy()
        for s, t, row in zip(seqs, nxt, rows):
            s.append(t)
            np.testing.assert_array_equal(row, _alone(tf, s))
    assert [c.tokens.tolist() for c in caches] == seqs
    # decode rows of two sequences + an 11-token chunk of a new one, in one call
    new = tf.new_cache()
    chunk = rng.integers(0, 96, 11).tolist()
    nxt = [int(r.argmax()) for r in rows[:2]]
    mixed = tf.forward_batch([(caches[0], [nxt[0]]), (new, chunk), (caches[1], [nxt[1]])]).copy()
    np.testing.assert_array_equal(mixed[0], _alone(tf, seqs[0] + [nxt[0]]))
    np.testing.assert_array_equal(mixed[1], _alone(tf, chunk))
    np.testing.assert_array_equal(mixed[2], _alone(tf, seqs[1] + [nxt[1]]))


@pytest.mark.real
def test_forward_batch_smollm2(smollm2_path):
    """Four sequences (one of them longer than n_batch) and two batched decode steps on SmolLM2 Q4_1."""
    tf = Transformer(GGUFFile(smollm2_path), n_ctx=128, n_batch=16)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, tf.config.n_vocab, n).tolist() for n in (9, 1, 21, 4)]
    caches = tf.new_caches(len(prompts))  # as a BatchEngine's slots: decode attention through attend_group
    rows = tf.forward_batch(list(zip(caches, prompts))).copy()
    for _ in range(2):
        for p, row in zip(prompts, rows):
            np.testing.assert_array_equal(row, _alone(tf, p))
        nxt = [int(r.argmax()) for r in rows]
        for p, t in zip(prompts, nxt):
            p.append(t)
        rows = tf.forward_batch([(c, [t]) for c, t in zip(caches, nxt)]).copy()


def test_forward_batch_refuses_bad_input_before_any_change(model_dir):
    tf = _transformer(model_dir, "llama", n_ctx=16)
    a, b = tf.new_cache(), tf.new_cache()
    tf.forward([1, 2, 3], cache=a)
    tf.forward(list(range(10)), cache=b)
    before = (a.tokens.tolist(), b.tokens.tolist(), a.version, b.version)
    with pytest.raises(ContextOverflowError, match=r"seqs\[1\].*n_ctx=16"):
        tf.forward_batch([(a, [4, 5]), (b, list(range(7)))])
    with pytest.raises(ValueError, match="same KVCache appears twice"):
        tf.forward_batch([(a, [4]), (a, [5])])
    with pytest.raises(ValueError, match=r"seqs\[0\] ids: token id 96 is out of range"):
        tf.forward_batch([(a, [96])])
    with pytest.raises(ValueError, match=r"seqs\[1\] ids must be a non-empty"):
        tf.forward_batch([(a, [4]), (b, [])])
    with pytest.raises(ValueError, match=r"seqs\[0\] cache must be a KVCache"):
        tf.forward_batch([("cache", [4])])
    with pytest.raises(ValueError, match="non-empty list"):
        tf.forward_batch([])
    assert (a.tokens.tolist(), b.tokens.tolist(), a.version, b.version) == before


def test_kv_cache_group_slots_are_independent_caches(model_dir):
    """Slots of a group share arrays but not contents: writing, truncating and copying one leaves the others."""
    tf = _transformer(model_dir, "llama", n_ctx=32)
    a, b, c = tf.new_caches(3)
    assert a.group_kv[0] is b.group_kv[0] and (a.slot, b.slot, c.slot) == (0, 1, 2)
    ra = tf.forward([7, 8, 9], cache=a).copy()
    rb = tf.forward([1, 2], cache=b).copy()
    np.testing.assert_array_equal(ra, _alone(tf, [7, 8, 9]))
    np.testing.assert_array_equal(rb, _alone(tf, [1, 2]))
    c.copy_prefix(a, 2)
    np.testing.assert_array_equal(tf.forward([5], cache=c), _alone(tf, [7, 8, 5]))
    np.testing.assert_array_equal(tf.forward([3], cache=b), _alone(tf, [1, 2, 3]))
    assert a.nbytes == tf.new_cache().nbytes
    with pytest.raises(ValueError, match="n must be a positive integer"):
        tf.new_caches(0)


def _smaps_field(array: np.ndarray, field: str) -> list[str] | None:
    """The values of line `field` (e.g. "VmFlags:") of the kernel's smaps entry for the mapping holding array's first
    byte (Linux), else None."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    address, inside = array.__array_interface__["data"][0], False
    for line in lines:
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith(field):
            return line.split()[1:]
    return None


def _vm_flags(array: np.ndarray) -> set[str] | None:
    """The kernel's VmFlags of the mapping holding array's first byte (Linux), else None."""
    flags = _smaps_field(array, "VmFlags:")
    return None if flags is None else set(flags)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no madvise(MADV_HUGEPAGE) on this platform")
def test_a_groups_keys_ask_for_huge_pages_and_a_single_caches_do_not(model_dir):
    """The keys of a group of slots are madvised for transparent huge pages (batched decode writes a position into
    every key row of every slot); a single cache's keys and every value array keep 4 KB pages."""
    tf = _transformer(model_dir, "llama", n_ctx=32)
    group = tf.new_caches(2)[0]
    flags = _vm_flags(group.group_kv[0])
    if flags is None:
        pytest.skip("no /proc/self/smaps")
    assert "hg" in flags
    assert "hg" not in _vm_flags(group.group_kv[1])
    assert "hg" not in _vm_flags(tf.new_cache().k)


def _mapping_rss_kb(array: np.ndarray) -> int | None:
    """The kernel's Rss (kB) of the mapping holding array's first byte (Linux), else None."""
    rss = _smaps_field(array, "Rss:")
    return None if rss is None else int(rss[0])


def test_prefault_group_keys_brings_the_pages_in_and_changes_nothing(model_dir):
    """prefault_group_keys makes a group's key pages resident without touching what the slots hold (it may run
    beside the steps); a single cache is left alone."""
    from ggufrun.model.kv_cache import prefault_group_keys

    tf = _transformer(model_dir, "llama", n_ctx=256)
    caches = tf.new_caches(3)
    keys = caches[0].group_kv[0]
    before = _mapping_rss_kb(keys)
    if before is None:
        pytest.skip("no /proc/self/smaps")
    want = tf.forward([7, 8, 9], cache=caches[1]).copy()
    held = keys.copy()
    assert prefault_group_keys([tf.new_cache()]) is False
    if not prefault_group_keys(caches):
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    after = _mapping_rss_kb(keys)
    assert after * 1024 >= keys.nbytes * 0.99 > before * 1024 * 2, (before, after, keys.nbytes)
    np.testing.assert_array_equal(keys, held)
    np.testing.assert_array_equal(tf.forward([5], cache=caches[1]), _alone(tf, [7, 8, 9, 5]))
    np.testing.assert_array_equal(want, _alone(tf, [7, 8, 9]))


def test_kv_cache_copy_prefix(model_dir):
    tf = _transformer(model_dir, "qwen2", n_ctx=32)
    src, dst = tf.new_cache(), tf.new_cache()
    tf.forward([7, 8, 9, 10, 11], cache=src)
    tf.forward([1, 1], cache=dst)
    dst.copy_prefix(src, 3)
    assert dst.tokens.tolist() == [7, 8, 9]
    np.testing.assert_array_equal(tf.forward([12], cache=dst), _alone(tf, [7, 8, 9, 12]))
    with pytest.raises(ValueError, match=r"n must be an integer in \[0, 5\]"):
        dst.copy_prefix(src, 6)


# ---- the engine --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import ggufrun

    path = write_model(tmp_path_factory.mktemp("engine") / "tiny.gguf", tokenizer="bytes", ctx=256, seed=3)
    m = ggufrun.load(path, n_ctx=128, n_threads=2)
    yield m
    m.close()


class Steps:
    """Wraps a transformer's forward_batch: records [(cache, rows), ...] per call; when gated, each call waits
    for allow()."""

    def __init__(self, tf, monkeypatch, gated: bool = False):
        self.inner = tf.forward_batch
        self.calls: list[list[tuple[object, int]]] = []
        self.gate = threading.Semaphore(0) if gated else None
        monkeypatch.setattr(tf, "forward_batch", self)

    def __call__(self, seqs):
        if self.gate is not None:
            assert self.gate.acquire(timeout=60), "the test never allowed this step"
        self.calls.append([(cache, len(ids)) for cache, ids in seqs])
        return self.inner(seqs)

    def allow(self, n: int = 1) -> None:
        self.gate.release(n)

    def wait_calls(self, n: int) -> None:
        for _ in range(6000):
            if len(self.calls) >= n:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"the engine ran {len(self.calls)} steps, expected {n}")

    def open(self) -> None:
        self.allow(100000)


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(k)).tolist() for k in rng.integers(lo, hi, n)]


def _solo(model, ids, max_tokens, stop=None, **sampling):
    """(text, token, logprob, finish_reason) of every chunk Model.generate gives `ids` alone."""
    sampling.setdefault("temperature", 0)
    return [(c.text, c.token, c.logprob, c.finish_reason) for c in model.generate(ids, max_tokens, stop, **sampling)]


def _key(chunks):
    return [(c.text, c.token, c.logprob, c.finish_reason) for c in chunks]


def test_eight_concurrent_submissions_get_their_solo_chunks(tiny):
    """Eight threads submit at once to a 4-slot engine (so four wait for a slot): greedy and seeded sampling
    give each exactly the chunks Model.generate gives it alone."""
    prompts = _prompts(8)
    sampling = [{"temperature": 0} if i % 2 else {"temperature": 0.9, "seed": i} for i in range(8)]
    expected = [_solo(tiny, p, 20, **s) for p, s in zip(prompts, sampling)]
    results: list = [None] * 8
    with BatchEngine.from_model(tiny, n_slots=4) as engine:

        def client(i):
            results[i] = _key(engine.submit(prompts[i], SamplingParams(**sampling[i]), max_tokens=20))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert engine.n_active == 0
    assert results == expected
    assert engine.decode_rows > engine.steps  # some steps advanced several sequences


def _greedy_rows_seen(tiny, monkeypatch, record) -> list:
    """Once the batched greedy sampler is ready (a fresh Numba cache: the background helper compiles greedy_rows
    last), every call the engine makes to sample_greedy_rows appends record(rows, want) to the list returned."""
    import ggufrun.batch as batch

    deadline = time.monotonic() + 300
    while not tiny.transformer.batch_sampling_ready():
        assert time.monotonic() < deadline, "kernels.greedy_rows never became ready"
        time.sleep(0.05)
    seen = []
    at_once = batch.sample_greedy_rows

    def spy(logits, rows, samplers, want=None):
        seen.append(record(rows, want))
        return at_once(logits, rows, samplers, want)

    monkeypatch.setattr(batch, "sample_greedy_rows", spy)
    return seen


def test_greedy_rows_of_a_step_are_sampled_together_with_their_solo_bits(tiny, monkeypatch):
    """A step's greedy rows with nothing but a logit_bias to change their logits are sampled at once
    (sampling.sample_greedy_rows); a request with a repetition penalty or a seeded temperature beside them keeps its
    own sampler. Every chunk (text, token, logprob) is what the request gets alone."""
    seen = _greedy_rows_seen(tiny, monkeypatch, lambda rows, want: len(rows))
    prompts = _prompts(6, seed=3)
    sampling = [{}, {}, {}, {"logit_bias": {7: 50.0}}, {"repetition_penalty": 1.3}, {"temperature": 0.8, "seed": 4}]
    expected = [_solo(tiny, p, 12, **s) for p, s in zip(prompts, sampling)]
    with BatchEngine.from_model(tiny, n_slots=6) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)  # no step before all six are in (the tiny model
        # could otherwise finish a request before the next one is submitted)
        streams = [engine.submit(p, SamplingParams(**{"temperature": 0, **s}), 12) for p, s in zip(prompts, sampling)]
        steps.open()
        got = [_key(s) for s in streams]
    assert got == expected
    assert seen and max(seen) == 4  # the plain and the biased greedy rows, never the penalised or the sampled one


def test_token_logprob_off_gives_the_same_chunks_without_logprobs(tiny, monkeypatch):
    """submit(token_logprob=False) (the server's requests): every chunk's text, token and finish reason as with it on
    and its logprob None, whether the step sampled its greedy row with others (sample_greedy_rows, which then skips
    the row's normaliser), alone (a repetition penalty) or from a temperature; with logprobs=k the raw
    log-probabilities still come."""
    seen = _greedy_rows_seen(tiny, monkeypatch, lambda rows, want: list(want))
    prompts = _prompts(5, seed=5)
    sampling = [{}, {}, {"logit_bias": {7: 50.0}}, {"repetition_penalty": 1.3}, {"temperature": 0.8, "seed": 4}]
    expected = [_solo(tiny, p, 10, **s) for p, s in zip(prompts, sampling)]
    solo_raw = _key(tiny.generate(prompts[0], 10, temperature=0, logprobs=2))
    with BatchEngine.from_model(tiny, n_slots=6) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        streams = [engine.submit(p, SamplingParams(**{"temperature": 0, **s}), 10, token_logprob=False)
                   for p, s in zip(prompts, sampling)]  # fmt: skip
        raw = engine.submit(prompts[0], GREEDY, 10, logprobs=2, token_logprob=False)
        steps.open()
        got = [_key(s) for s in streams]
        got_raw = _key(raw)
    assert got == [[(text, token, None, reason) for text, token, _, reason in e] for e in expected]
    assert got_raw == solo_raw and all(lp is not None for _, _, lp, _ in solo_raw)
    assert seen and all(not any(want) for want in seen)  # the greedy rows at once, none with its normaliser


def test_a_request_arriving_mid_stream_joins_the_batch(tiny, monkeypatch):
    a_ids, b_ids = _prompts(2, seed=1)
    with BatchEngine.from_model(tiny, n_slots=2) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        a = engine.submit(a_ids, GREEDY, max_tokens=24)
        steps.allow(5)  # prefill + 4 decode steps
        head = [next(a) for _ in range(5)]
        steps.wait_calls(5)
        b = engine.submit(b_ids, GREEDY, max_tokens=10)
        steps.open()
        a_chunks, b_chunks = head + list(a), list(b)
    assert _key(a_chunks) == _solo(tiny, a_ids, 24)
    assert _key(b_chunks) == _solo(tiny, b_ids, 10)
    a_cache = steps.calls[0][0][0]
    first_b = next(i for i, call in enumerate(steps.calls) if any(cache is not a_cache for cache, _ in call))
    b_cache = next(cache for cache, _ in steps.calls[first_b] if cache is not a_cache)
    # B's prompt, evaluated whole in that step, ran without A's decode row; the next step advanced both
    assert dict(steps.calls[first_b]) == {b_cache: len(b_ids)}
    assert dict(steps.calls[first_b + 1]) == {a_cache: 1, b_cache: 1}
    assert sum(len(call) == 2 for call in steps.calls) >= 9  # B's decode steps ran beside A's


def test_cancel_leaves_at_once(tiny, monkeypatch):
    a_ids, b_ids, c_ids = _prompts(3, seed=4)
    with BatchEngine.from_model(tiny, n_slots=3) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        a = engine.submit(a_ids, GREEDY, max_tokens=40)
        b = engine.submit(b_ids, GREEDY, max_tokens=12)
        cancel = threading.Event()
        c = engine.submit(c_ids, GREEDY, max_tokens=40, cancel=cancel)
        steps.allow(6)  # three prefills, then every one decodes
        steps.wait_calls(6)
        assert engine.n_active == 3
        b_cache = engine.slots[b._request.slot]  # (which steps took which prompts depends on when each arrived)
        a.close()  # the consumer leaves
        cancel.set()  # C's own cancel event
        steps.allow(2)  # the step in flight (built before the cancels), then the next one
        steps.wait_calls(8)
        assert [cache for cache, _ in steps.calls[7]] == [b_cache]
        assert engine.n_active == 1
        steps.open()
        b_chunks = list(b)
        c_chunks = list(c)
    assert _key(b_chunks) == _solo(tiny, b_ids, 12)  # the others are unaffected
    assert c_chunks[-1].finish_reason == "cancelled" and len(c_chunks) < 40
    assert _key(c_chunks[:-1]) == _solo(tiny, c_ids, 40)[: len(c_chunks) - 1]
    with pytest.raises(StopIteration):
        next(a)


def test_dropping_the_iterator_cancels(tiny, monkeypatch):
    with BatchEngine.from_model(tiny, n_slots=2) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        steps.allow(2)
        first = next(iter(engine.submit(_prompts(1, seed=3)[0], GREEDY, max_tokens=100)))  # the Stream is dropped
        steps.open()
        other = list(engine.submit([5, 6, 7], GREEDY, max_tokens=5))
    assert first.token is not None and other[-1].finish_reason == "length"
    a_cache = steps.calls[0][0][0]
    # the prefill, the decode step allowed, at most the step in flight: then it is gone
    assert sum(any(cache is a_cache for cache, _ in call) for call in steps.calls) <= 3
    assert engine.n_active == 0


def test_shared_prefix_is_computed_once(tiny, monkeypatch):
    """Four requests with one 40-token system prefix: only the first computes it, the others copy its K/V; a
    later turn of a finished conversation reuses its own slot."""
    rng = np.random.default_rng(4)
    system = rng.integers(0, 256, 40).tolist()
    prompts = [system + rng.integers(0, 256, 5 + i).tolist() for i in range(4)]
    with BatchEngine.from_model(tiny, n_slots=4) as engine:
        steps = Steps(tiny.transformer, monkeypatch)
        with engine._cond:  # all four queued before the engine runs: the first cannot finish and free its slot first
            streams = [engine.submit(p, GREEDY, max_tokens=8) for p in prompts]
        results = [list(s) for s in streams]
        assert engine.prefill_rows == 40 + sum(len(p) - 40 for p in prompts)
        assert engine.copied_tokens == 3 * 40
        assert [r[-1].stats.cached_tokens for r in results] == [0, 40, 40, 40]
        # the next turn of conversation 2: its whole history is in its slot
        turn = prompts[2] + [c.token for c in results[2]][:-1] + [9, 10]
        again = list(engine.submit(turn, GREEDY, max_tokens=6))
        assert again[-1].stats.cached_tokens == len(turn) - 2
    for p, r in zip(prompts, results):
        assert _key(r) == _solo(tiny, p, 8)
    assert _key(again) == _solo(tiny, turn, 6)
    assert sum(rows for call in steps.calls for _, rows in call) == engine.rows


def test_prompts_arriving_together_are_evaluated_in_one_step(tiny, monkeypatch):
    """Four short distinct prompts submitted before the engine runs are all evaluated in its first step (their rows
    fit in one prefill chunk), and each still gets exactly its solo chunks."""
    prompts = _prompts(4, seed=8, lo=3, hi=12)
    with BatchEngine.from_model(tiny, n_slots=4, prefill_chunk=64) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        with engine._cond:  # the engine cannot start a step before all four are queued
            streams = [engine.submit(p, GREEDY, max_tokens=6) for p in prompts]
        steps.open()
        results = [list(s) for s in streams]
    assert [rows for _, rows in steps.calls[0]] == [len(p) for p in prompts]
    assert engine.prefill_rows == sum(len(p) for p in prompts)
    for p, r in zip(prompts, results):
        assert _key(r) == _solo(tiny, p, 6)


def test_a_prompt_budget_splits_between_prompts_in_arrival_order(tiny, monkeypatch):
    """With 16 prompt rows per step, two 12-token prompts take 12 + 4 rows, then the second one's last 8."""
    prompts = [list(range(1, 13)), list(range(101, 113))]
    with BatchEngine.from_model(tiny, n_slots=2, prefill_chunk=16) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        with engine._cond:  # the engine cannot start a step before both are queued
            streams = [engine.submit(p, GREEDY, max_tokens=3) for p in prompts]
        steps.open()
        results = [list(s) for s in streams]
    assert [rows for _, rows in steps.calls[0]] == [12, 4]
    assert [rows for _, rows in steps.calls[1]] == [1, 8]  # the first generates while the second finishes
    for p, r in zip(prompts, results):
        assert _key(r) == _solo(tiny, p, 3)


def test_chunked_prefill_interleaves_with_decode(tiny, monkeypatch):
    """A 45-token prompt arriving while another request generates is evaluated at most 8 tokens per step, each step
    also advancing the other request, which keeps streaming meanwhile. Later chunks attend to more positions, so
    they hold fewer rows: each step's prompt rows cost at most what 8 rows at positions 0..7 cost (PromptCost)."""
    a_ids = _prompts(1, seed=5)[0]
    b_ids = np.random.default_rng(6).integers(0, 256, 45).tolist()
    with BatchEngine.from_model(tiny, n_slots=2, prefill_chunk=8) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        a = engine.submit(a_ids, GREEDY, max_tokens=30)
        steps.allow(math.ceil(len(a_ids) / 8) + 1)  # A's prompt, then one decode step
        first = [next(a), next(a)]
        b = engine.submit(b_ids, GREEDY, max_tokens=5)
        steps.open()
        a_chunks, b_chunks = first + list(a), list(b)
    a_cache = steps.calls[0][0][0]
    b_steps = [dict(call) for call in steps.calls if any(cache is not a_cache for cache, _ in call)]
    expected, start = [], 0
    while start < len(b_ids):
        expected.append(engine.cost.rows(start, engine.step_budget, min(8, len(b_ids) - start)))
        start += expected[-1]
    assert expected[0] == 8 and max(expected[1:]) < 8  # this tiny model's attention is a large part of a row
    assert all(engine.cost.of(s, n) <= engine.step_budget for s, n in zip(np.cumsum([0, *expected]), expected))
    prefill = [next(rows for cache, rows in call.items() if cache is not a_cache) for call in b_steps[: len(expected)]]
    assert prefill == expected
    assert all(call.get(a_cache) == 1 for call in b_steps[: len(expected)])  # A decoded in every one of them
    assert _key(a_chunks) == _solo(tiny, a_ids, 30)
    assert _key(b_chunks) == _solo(tiny, b_ids, 5)


def test_prompt_cost_grows_with_the_attended_positions_and_stops_at_the_window(model_dir):
    from ggufrun.batch import PromptCost

    def costs(name):
        tf = _transformer(model_dir, name, n_ctx=64)
        pc = PromptCost(tf)
        return tf, pc, [pc.of(p, 1) for p in range(64)]

    tf, pc, full = costs("llama")
    assert full[0] > 1.0 and all(b > a for a, b in zip(full, full[1:]))  # every position attends to one more
    assert pc.of(3, 5) == pytest.approx(sum(full[3:8]))
    budget = pc.of(0, 8)
    assert pc.rows(0, budget, 16) == 8 and pc.rows(40, budget, 16) < 8  # later rows cost more
    assert pc.rows(40, 0.0, 16) == 1 and pc.rows(60, 1e9, 16) == 4  # at least one row; never past n_ctx
    tf, pc, swa = costs("gemma3")  # sliding-window layers stop growing at the window
    w = tf.config.sliding_window
    assert 0 < w < 60 and any(tf.config.swa_layers) and not all(tf.config.swa_layers)
    steps = np.diff(swa)
    assert steps[w + 1 :].max() < steps[: w - 1].min()  # past the window only the global layers still grow


def test_batch_generate_returns_results_in_order(tiny):
    prompts = _prompts(5, seed=7)
    solo = [_solo(tiny, p, 12) for p in prompts]
    texts = batch_generate(tiny, prompts, max_tokens=12, temperature=0)
    assert texts == ["".join(c[0] for c in s) for s in solo]
    # a stop string taken from the middle of one solo text: trimmed exactly as alone
    full = texts[0]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    chunks = batch_generate(tiny, prompts[:2], max_tokens=12, stop=[stop], temperature=0, chunks=True)
    assert [_key(c) for c in chunks] == [_solo(tiny, p, 12, stop=[stop]) for p in prompts[:2]]
    assert chunks[0][-1].finish_reason == "stop"
    assert batch_generate(tiny, ["The", "A cat"], max_tokens=4, temperature=0) == [
        tiny.complete("The", 4, temperature=0),
        tiny.complete("A cat", 4, temperature=0),
    ]


def test_submit_checks_its_arguments(tiny):
    with BatchEngine.from_model(tiny, n_slots=1) as engine:
        with pytest.raises(ValueError, match="max_tokens"):
            engine.submit([1, 2], GREEDY, max_tokens=-1)
        with pytest.raises(TypeError, match="stop"):
            engine.submit([1, 2], GREEDY, stop=[1])
        with pytest.raises(ValueError, match=r"prompt_ids: token id 9999 is outside the vocabulary"):
            engine.submit([1, 9999], GREEDY)
        with pytest.raises(TypeError, match=r"prompt_ids must be a sequence of integer token ids, got 1.5"):
            engine.submit([1.5, 2], GREEDY)
        with pytest.raises(ContextOverflowError, match="n_ctx"):
            engine.submit(list(range(128)), GREEDY)
        with pytest.raises(TypeError, match="params"):
            engine.submit([1, 2], {"temperature": 0})
        nothing = list(engine.submit([1, 2], GREEDY, max_tokens=0))
        assert [(c.text, c.finish_reason) for c in nothing] == [("", "length")]
    with pytest.raises(ValueError, match="n_slots"):
        BatchEngine.from_model(tiny, n_slots=0)
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([1, 2], GREEDY)


def test_close_cancels_unfinished_requests(tiny, monkeypatch):
    engine = BatchEngine.from_model(tiny, n_slots=1)
    steps = Steps(tiny.transformer, monkeypatch, gated=True)
    running = engine.submit([1, 2, 3], GREEDY, max_tokens=50)
    waiting = engine.submit([4, 5, 6], GREEDY, max_tokens=50)
    steps.allow(3)
    steps.wait_calls(3)
    closer = threading.Thread(target=engine.close)
    closer.start()
    steps.open()
    closer.join(30)
    assert not closer.is_alive()
    assert list(running)[-1].finish_reason == "cancelled"
    assert [(c.text, c.finish_reason) for c in waiting] == [("", "cancelled")]


def test_a_failing_logits_processor_ends_only_its_request(tiny):
    def broken(ids, logits):
        if len(ids) > 12:
            raise RuntimeError("processor broke")
        return logits

    good_ids = _prompts(1, seed=6)[0]
    with BatchEngine.from_model(tiny, n_slots=2) as engine:
        bad = engine.submit(
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplingParams(temperature=0, logits_processors=[broken]), 10
        )
        good = engine.submit(good_ids, GREEDY, max_tokens=10)
        with pytest.raises(RuntimeError, match="processor broke"):
            list(bad)
        assert _key(good) == _solo(tiny, good_ids, 10)
        assert engine.n_active == 0


def test_model_batch_generate_equals_generate_alone(tiny):
    prompts = [[1, 2, 3], [7, 8], [40, 41, 42, 43]]
    texts = tiny.batch_generate(prompts, max_tokens=6, temperature=0)
    assert texts == [tiny.complete(p, max_tokens=6, temperature=0) for p in prompts]


def test_batch_generate_takes_chats_and_response_format(tiny):
    """A prompt may be a chat's messages: its reply is what Model.chat gives it alone, beside text and token ids in
    the same batch; response_format constrains every reply as it constrains each alone."""
    chats = [[{"role": "user", "content": "Hello there"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]]  # fmt: skip
    prompts = [chats[0], "The", [7, 8, 9], chats[1]]
    texts = tiny.batch_generate(prompts, max_tokens=8, temperature=0)
    alone = ["".join(c.text for c in tiny.chat(p, 8, temperature=0)) if isinstance(p[0], dict)
             else tiny.complete(p, 8, temperature=0) for p in prompts]  # fmt: skip
    assert texts == alone
    assert texts[0] != texts[3]  # two different chats, not one reply twice
    rf = {"type": "regex", "regex": "(yes|no|maybe)!"}
    texts = tiny.batch_generate([chats[1], "The"], max_tokens=8, temperature=0, response_format=rf)
    assert texts == ["".join(c.text for c in tiny.chat(chats[1], 8, temperature=0, response_format=rf)),
                     tiny.complete("The", 8, temperature=0, response_format=rf)]  # fmt: skip
    assert all(t in ("yes!", "no!", "maybe!") for t in texts)
    (got,) = tiny.batch_generate([chats[0]], max_tokens=4, temperature=0, logprobs=2, chunks=True)
    want = list(tiny.chat(chats[0], 4, temperature=0, logprobs=2))
    assert [(c.text, c.logprob, c.top_logprobs) for c in got] == [(c.text, c.logprob, c.top_logprobs) for c in want]
    assert all(len(c.top_logprobs) == 2 for c in got if c.token is not None)


def test_batch_stream_gives_the_chunks_as_they_are_made(tiny):
    """batch_stream yields (i, chunk) as the engine makes them: per prompt, the chunks batch_generate returns, the
    prompts' chunks interleaved (they run together); leaving early cancels the rest and stops the engine."""
    prompts = [[{"role": "user", "content": "Hello there"}], "The", [7, 8, 9]]
    want = tiny.batch_generate(prompts, max_tokens=6, temperature=0, chunks=True)
    order = []
    got = [[], [], []]
    for i, chunk in tiny.batch_stream(prompts, max_tokens=6, temperature=0):
        order.append(i)
        got[i].append(chunk)
    assert [_key(c) for c in got] == [_key(c) for c in want]
    assert all(c[-1].finish_reason is not None for c in got)
    assert order != sorted(order)  # not one prompt after another
    it = tiny.batch_stream(prompts, max_tokens=50, temperature=0)
    i, first = next(it)
    assert first.finish_reason is None
    it.close()  # as breaking out of the loop does once the iterator is dropped
    assert not [t for t in threading.enumerate() if t.name == "ggufrun-batch"]
    assert tiny.complete("The", 6, temperature=0) == "".join(c.text for c in want[1])  # the model is free again
    with pytest.raises(TypeError, match="not one string"):
        tiny.batch_stream("The")  # checked at the call, before any work
    stop = threading.Event()
    seen = [[], [], []]
    for i, chunk in tiny.batch_stream(prompts, max_tokens=50, temperature=0, cancel=stop):
        seen[i].append(chunk)
        stop.set()  # after the first chunk: every generation ends before the next step
    assert [c[-1].finish_reason for c in seen] == ["cancelled"] * 3  # (how many steps ran first: the threads')
    done = [[c.finish_reason for _, c in tiny.batch_stream(prompts[1:], max_tokens=50, cancel=stop)]]
    assert done == [["cancelled", "cancelled"]]  # set before the first step: no token at all


def test_batch_generate_texts_skip_the_log_probabilities(tiny, monkeypatch):
    """Returning texts, batch_generate asks the engine for no per-token log-probability (a greedy step then skips
    each row's normaliser); with chunks=True the chunks carry them, as Model.generate's do."""
    asked = []
    submit = BatchEngine.submit

    def spy(self, ids, params=None, max_tokens=256, stop=None, cancel=None, constraint=None, logprobs=None,
            notify=None, token_logprob=True):  # fmt: skip
        asked.append(token_logprob)
        return submit(self, ids, params, max_tokens, stop, cancel, constraint, logprobs, notify, token_logprob)

    monkeypatch.setattr(BatchEngine, "submit", spy)
    texts = tiny.batch_generate(["The", "A cat"], max_tokens=4, temperature=0)
    chunks = tiny.batch_generate(["The", "A cat"], max_tokens=4, temperature=0, chunks=True)
    assert asked == [False, False, True, True]
    assert texts == ["".join(c.text for c in r) for r in chunks]
    assert all(c.logprob is not None for r in chunks for c in r if c.token is not None)


def test_batch_generate_names_the_prompt_it_cannot_take(tiny):
    chat = [{"role": "user", "content": "Hi"}]
    with pytest.raises(TypeError, match=r"prompts\[1\] must be text, token ids or a list of chat messages, got int"):
        tiny.batch_generate([chat, 3], max_tokens=2)
    with pytest.raises(TypeError, match=r"prompts\[0\] .* got dict"):
        tiny.batch_generate([{"role": "user", "content": "Hi"}], max_tokens=2)  # one chat, not wrapped in a list
    with pytest.raises(ValueError, match=r"prompts\[1\]: "):
        tiny.batch_generate(["A", [{"role": "user", "content": "x"}, 5]], max_tokens=2)
    with pytest.raises(TypeError, match=r"prompts\[1\] must be a sequence of integer token ids, got 2.5"):
        tiny.batch_generate(["A", [1, 2.5]], max_tokens=2)  # checked at the call, not truncated to 2
    with pytest.raises(ValueError, match=r"prompts\[0\]: token id 9999 is outside the vocabulary"):
        tiny.batch_stream([[1, 9999]])
    with pytest.raises(TypeError, match="does not take tools"):
        tiny.batch_generate([chat], max_tokens=2, tools=[])
    with pytest.raises(TypeError, match="stop"):
        tiny.batch_generate([chat], max_tokens=2, stop=[1])


def test_prompt_only_steps_never_come_twice_in_a_row(tiny, monkeypatch):
    """Requests that arrive one per step, each with a prompt finishing in its first step, while another streams: a
    step that ends a prompt leaves the decode rows out, but never two such steps in a row, so the stream advances
    at least every other step."""
    a_ids, *others = _prompts(5, seed=9)
    with BatchEngine.from_model(tiny, n_slots=5) as engine:
        steps = Steps(tiny.transformer, monkeypatch, gated=True)
        a = engine.submit(a_ids, GREEDY, max_tokens=30)
        steps.allow(2)  # A's prompt, then one decode step
        first = [next(a), next(a)]
        streams = []
        for p in others:  # one arrival before each step
            streams.append(engine.submit(p, GREEDY, max_tokens=4))
            steps.allow(1)
            steps.wait_calls(len(steps.calls) + 1)
        steps.open()
        a_chunks, results = first + list(a), [list(s) for s in streams]
    a_cache = steps.calls[0][0][0]
    with_a = [any(cache is a_cache for cache, _ in call) for call in steps.calls[2:]]
    assert not all(with_a)  # a prompt-only step happened
    assert all(x or y for x, y in zip(with_a, with_a[1:]))  # never two steps in a row without A
    assert _key(a_chunks) == _solo(tiny, a_ids, 30)
    for p, r in zip(others, results):
        assert _key(r) == _solo(tiny, p, 4)
