"""Sampler tests on hand-made distributions; the oracle is a plain float64 re-statement of llama.cpp's chain."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggufrun.sampling import (
    PRESETS,
    Sampler,
    SamplingParams,
    apply_penalties,
    draw,
    sample_greedy_rows,
    token_logprobs,
    top_k_ids,
)

ROOT = Path(__file__).resolve().parents[1]
NO_FILTERS = dict(top_k=0, top_p=1.0, min_p=0.0)


def logits_of(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def kept(params: SamplingParams, logits, history=()) -> set[int]:
    ids, _ = Sampler(params, len(logits)).distribution(np.asarray(logits, dtype=np.float32), history)
    return set(ids.tolist())


def reference(logits, temperature, top_k, top_p, min_p) -> dict[int, float]:
    """{token: probability} after top_k -> top_p -> min_p -> temperature, written from the definitions."""
    x = np.asarray(logits, dtype=np.float64)
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))  # by logit, ties by lower id
    if top_k > 0:
        order = order[:top_k]
    if top_p < 1:
        w = np.exp(x[order] - x[order[0]])
        cum = np.cumsum(w / w.sum())
        order = order[: next(i for i, c in enumerate(cum) if c >= top_p) + 1]
    if min_p > 0:
        order = [i for i in order if x[i] >= x[order[0]] + math.log(min_p)]
    w = np.exp((x[order] - x[order[0]]) / temperature)
    return dict(zip(order, w / w.sum()))


# --- SamplingParams ----------------------------------------------------------------------------------------------


def test_defaults_are_llama_cpp_python_create_completion():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty, p.penalty_last_n) == (1.0, 0.0, 0.0, 64)
    assert (p.logit_bias, p.seed, p.logits_processors) == (None, None, ())


@pytest.mark.parametrize(
    "name, value",
    [
        ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "0.5"),
        ("temperature", True), ("top_k", -1), ("top_k", 2.0), ("top_k", True), ("top_p", 0.0), ("top_p", 1.01),
        ("top_p", -0.5), ("top_p", math.nan), ("min_p", -0.01), ("min_p", 1.01), ("min_p", math.nan),
        ("repetition_penalty", 0.0), ("repetition_penalty", -1.1), ("repetition_penalty", math.inf),
        ("frequency_penalty", math.nan), ("frequency_penalty", -math.inf), ("presence_penalty", math.inf),
        ("penalty_last_n", -2), ("penalty_last_n", 64.0), ("seed", -2), ("seed", 1.5), ("seed", "1"),
        ("logit_bias", {"5": 1.0}), ("logit_bias", {1.5: 1.0}), ("logit_bias", {-1: 1.0}), ("logit_bias", {True: 1}),
        ("logit_bias", {3: math.nan}), ("logit_bias", {3: math.inf}), ("logit_bias", {3: "x"}), ("logit_bias", [1]),
        ("logits_processors", [1]), ("logits_processors", lambda ids, x: x), ("logits_processors", 3),
    ],
)  # fmt: skip
def test_bad_values_raise_naming_the_argument(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


def test_valid_edges_and_normalisation():
    p = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=1, repetition_penalty=1e-3, penalty_last_n=-1,
                       frequency_penalty=-2, presence_penalty=2, seed=np.int64(7), logit_bias={np.int32(3): -math.inf},
                       logits_processors=[lambda ids, x: x])  # fmt: skip
    assert isinstance(p.temperature, float) and isinstance(p.seed, int) and isinstance(p.logits_processors, tuple)
    assert p.logit_bias == {3: -math.inf} and type(next(iter(p.logit_bias))) is int
    bias = {1: 2.0}
    q = SamplingParams(logit_bias=bias)
    bias[2] = 5.0
    assert q.logit_bias == {1: 2.0}  # a copy


def test_presets():
    assert set(PRESETS) == {"code", "chat", "creative", "agent"}
    assert SamplingParams.preset("code").temperature == 0 and SamplingParams.preset("agent").temperature == 0
    chat = SamplingParams.preset("chat")
    assert (chat.temperature, chat.top_p, chat.repetition_penalty) == (0.7, 0.9, 1.05)
    creative = SamplingParams.preset("creative")
    assert (creative.temperature, creative.top_p, creative.repetition_penalty) == (1.0, 0.95, 1.1)
    assert creative.top_k == 40 and creative.min_p == 0.05  # unnamed fields keep the defaults
    over = SamplingParams.preset("chat", seed=3, temperature=0.2)
    assert (over.seed, over.temperature, over.top_p) == (3, 0.2, 0.9)
    with pytest.raises(ValueError, match="code, chat, creative, agent"):
        SamplingParams.preset("wild")
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.preset("chat", top_p=2.0)


# --- Sampler arguments -------------------------------------------------------------------------------------------


def test_logit_bias_id_outside_vocabulary():
    Sampler(SamplingParams(logit_bias={99: 1.0}), 100)
    with pytest.raises(ValueError, match="logit_bias token id 100"):
        Sampler(SamplingParams(logit_bias={5: 1.0, 100: 1.0}), 100)
    with pytest.raises(ValueError, match="n_vocab"):
        Sampler(SamplingParams(), 0)


def test_bad_logits_and_history():
    s = Sampler(SamplingParams(repetition_penalty=1.1), 4)
    with pytest.raises(ValueError, match=r"logits must have shape \(4,\)"):
        s.sample(np.zeros(5, np.float32), [])
    with pytest.raises(ValueError, match="NaN"):
        s.sample(np.array([0, np.nan, 1, 2], np.float32), [])
    with pytest.raises(ValueError, match="-inf everywhere"):
        s.sample(np.full(4, -np.inf, np.float32), [])
    with pytest.raises(ValueError, match="history holds token id 4"):
        s.sample(np.zeros(4, np.float32), [1, 4])
    bad = Sampler(SamplingParams(logits_processors=[lambda ids, x: x[:2]]), 4)
    with pytest.raises(ValueError, match=r"logits_processors\[0\] returned shape \(2,\)"):
        bad.sample(np.zeros(4, np.float32), [])


# --- the filters -------------------------------------------------------------------------------------------------


def test_top_k_keeps_the_k_largest_lowest_ids_on_ties():
    x = [1.0, 5.0, 3.0, 4.0, 2.0]
    assert kept(SamplingParams(top_k=2, top_p=1, min_p=0), x) == {1, 3}
    assert kept(SamplingParams(top_k=1, top_p=1, min_p=0), x) == {1}
    assert kept(SamplingParams(top_k=0, top_p=1, min_p=0), x) == set(range(5))  # 0 = off
    assert kept(SamplingParams(top_k=9, top_p=1, min_p=0), x) == set(range(5))
    assert kept(SamplingParams(top_k=2, top_p=1, min_p=0), [1.0, 3.0, 3.0, 3.0, 0.0]) == {1, 2}
    assert kept(SamplingParams(top_k=3, top_p=1, min_p=0), [3.0, 1.0, 3.0, 2.0, 2.0, 2.0]) == {0, 2, 3}
    ties = np.zeros(200, np.float32)
    ties[150:] = -1.0
    assert kept(SamplingParams(top_k=37, top_p=1, min_p=0), ties) == set(range(37))  # too many ties to sort by luck
    # the public helper: order by logit descending, then id
    assert top_k_ids(np.array([2, 7, 7, 1, 7], np.float32), 3).tolist() == [1, 2, 4]


def test_top_k_ids_matches_a_full_sort():
    # sizes on both sides of the strided-sample shortcut (n >= 64 k), with and without many ties
    rng = np.random.default_rng(3)
    for n, k in [(100, 1), (5000, 40), (5000, 100), (49152, 40), (49152, 1000), (70000, 1), (3000, 2999)]:
        on_stride = rng.standard_normal(n)
        on_stride[::16][:k] += 100  # the top k all inside the strided sample: its k-th must be the bound
        for x in (rng.standard_normal(n), rng.integers(-50, 50, n), np.repeat(rng.standard_normal(n // 500 + 1), 500),
                  on_stride):  # fmt: skip
            x = x[:n].astype(np.float32)
            want = sorted(range(n), key=lambda i: (-x[i], i))[:k]
            assert top_k_ids(x, k).tolist() == want, (n, k)


def test_top_p_includes_the_token_that_crosses_the_threshold():
    x = logits_of([0.1, 0.4, 0.25, 0.15, 0.1])  # sorted: 1 (.4), 2 (.65), 3 (.80), 0/4 (.90, 1.0)
    p = dict(top_k=0, min_p=0.0)
    assert kept(SamplingParams(top_p=0.3, **p), x) == {1}
    assert kept(SamplingParams(top_p=0.6, **p), x) == {1, 2}
    assert kept(SamplingParams(top_p=0.66, **p), x) == {1, 2, 3}
    assert kept(SamplingParams(top_p=0.85, **p), x) == {1, 2, 3, 0}  # tie at .1: the lower id first
    assert kept(SamplingParams(top_p=1.0, **p), x) == set(range(5))
    # after top_k=3 the probabilities are renormalised (.5, .3125, .1875), so 0.78 is crossed one token earlier
    assert kept(SamplingParams(top_p=0.78, **p), x) == {1, 2, 3}
    assert kept(SamplingParams(top_p=0.78, top_k=3, min_p=0.0), x) == {1, 2}


def test_top_p_over_the_whole_vocabulary_beyond_the_first_sorted_prefix():
    x = np.zeros(5000, np.float32)  # uniform: the nucleus holds thousands of tokens, ties broken by id
    assert kept(SamplingParams(top_p=0.5001, top_k=0, min_p=0.0), x) == set(range(2501))
    x[4321] = 20.0  # one dominant token
    assert kept(SamplingParams(top_p=0.9, top_k=0, min_p=0.0), x) == {4321}


def test_min_p_is_relative_to_the_max_probability():
    x = logits_of([0.4, 0.2, 0.2, 0.1, 0.1])
    p = dict(top_k=0, top_p=1.0)
    assert kept(SamplingParams(min_p=0.45, **p), x) == {0, 1, 2}  # p >= 0.18: both tied 0.2 kept
    assert kept(SamplingParams(min_p=0.55, **p), x) == {0}  # p >= 0.22: both tied 0.2 dropped
    assert kept(SamplingParams(min_p=0.2, **p), x) == set(range(5))  # p >= 0.08
    assert kept(SamplingParams(min_p=0.0, **p), x) == set(range(5))  # 0 = off
    assert kept(SamplingParams(min_p=1.0, **p), logits_of([0.3, 0.3, 0.2, 0.2])) == {0, 1}  # ties at the max
    assert kept(SamplingParams(min_p=1.0, top_k=3, top_p=1.0), logits_of([0.3, 0.3, 0.2, 0.2])) == {0, 1}
    assert kept(SamplingParams(min_p=0.45, top_k=4, top_p=1.0), x) == {0, 1, 2}
    # the same cut in a large vocabulary without top_k (the whole-vocabulary path)
    big = np.full(3000, -30.0, np.float32)
    big[[7, 1500, 2999]] = logits_of([0.5, 0.3, 0.1])
    assert kept(SamplingParams(min_p=0.5, **p), big) == {7, 1500}


def test_chain_order_top_p_before_min_p_before_temperature():
    x = logits_of([0.4, 0.25, 0.15, 0.1, 0.1])
    # llama.cpp: top_p on the whole set keeps {0,1,2} (.4, .65, .80), min_p 0.3 (p >= .12) keeps them all.
    # min_p first would renormalise {0,1,2} to .5/.8125 and top_p would drop token 2.
    assert kept(SamplingParams(top_k=0, top_p=0.78, min_p=0.3), x) == {0, 1, 2}
    # top_p sees the distribution before temperature: .5/.8 keeps {0,1}; at T=2 first (.415/.737) it would keep 3
    y = logits_of([0.5, 0.3, 0.2])
    ids, probs = Sampler(SamplingParams(temperature=2.0, top_k=0, top_p=0.75, min_p=0.0), 3).distribution(y)
    expect = np.sqrt([0.5, 0.3]) / np.sqrt([0.5, 0.3]).sum()
    assert ids.tolist() == [0, 1] and np.allclose(probs, expect, atol=1e-6)


def test_distribution_matches_the_reference_chain_on_random_logits():
    rng = np.random.default_rng(1234)
    for case in range(150):
        n = int(rng.integers(2, 400))
        x = (rng.standard_normal(n) * rng.uniform(0.3, 4)).astype(np.float32)
        kw = dict(
            temperature=float(rng.choice([0.3, 0.7, 1.0, 1.7])),
            top_k=int(rng.choice([0, 1, 5, 40, 1000])),
            top_p=float(rng.choice([1.0, 0.95, 0.8, 0.5])),
            min_p=float(rng.choice([0.0, 0.05, 0.2])),
        )
        ids, probs = Sampler(SamplingParams(**kw), n).distribution(x)
        ref = reference(x, **kw)
        got = dict(zip(ids.tolist(), probs.tolist()))
        assert got.keys() == ref.keys(), (case, kw)
        assert np.allclose([got[i] for i in ref], list(ref.values()), rtol=1e-5, atol=1e-9), (case, kw)


# --- greedy, temperature, sampling -------------------------------------------------------------------------------


def test_greedy_is_argmax_and_logprob_is_log_softmax():
    rng = np.random.default_rng(5)
    s = Sampler(SamplingParams(temperature=0.0, seed=0), 1000)
    for _ in range(20):
        x = (rng.standard_normal(1000) * 3).astype(np.float32)
        token, logprob = s.sample(x, [])
        x64 = x.astype(np.float64)
        assert token == int(np.argmax(x))
        assert logprob == pytest.approx(x64[token] - x64.max() - np.log(np.exp(x64 - x64.max()).sum()), abs=1e-5)
    tie = np.array([1, 4, 4, 0], np.float32)
    assert Sampler(SamplingParams(temperature=0.0), 4).sample(tie, [])[0] == 1  # the first of equal maxima
    ids, probs = Sampler(SamplingParams.preset("code"), 4).distribution(tie)
    assert ids.tolist() == [1] and probs.tolist() == [1.0]


def test_greedy_rows_at_once_give_each_samplers_bits():
    """sample_greedy_rows (a batched step's greedy rows on the threads) gives what each row's greedy Sampler gives
    it: the same token (the first of equal maxima, -0.0 and 0.0 equal; a logit_bias added) and log-probability bits;
    a row whose maximum is +inf, or with a NaN, gets None, and its sampler then raises as it does on its own."""
    rng = np.random.default_rng(9)
    logits = (rng.standard_normal((6, 3000)) * 4).astype(np.float32)
    logits[1, [5, 900]] = logits[1].max() + 1.0  # a tie: the first one
    logits[2] = 0.0
    logits[2, 7] = -0.0
    logits[3, 42] = np.inf
    logits[4, 100] = np.nan
    sampler = Sampler(SamplingParams(temperature=0.0), 3000)
    biased = Sampler(SamplingParams(temperature=0.0, logit_bias={3: 1.0, 11: 99.0}), 3000)  # 11 wins row 5
    assert sampler.greedy_as_is([1, 2]) and biased.greedy_as_is([1, 2])
    assert not Sampler(SamplingParams(temperature=0.7), 3000).greedy_as_is()
    assert not Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.2), 3000).greedy_as_is([1, 2])
    samplers = [sampler, sampler, sampler, sampler, sampler, biased]
    solo = [s.sample(row, []) if i not in (3, 4) else None for i, (s, row) in enumerate(zip(samplers, logits))]
    assert solo[5][0] == 11 and solo[1][0] == 5 and solo[2][0] == 0
    rows = np.array([5, 0, 1, 2, 3, 4], np.int64)  # in any order
    got = dict(zip(rows.tolist(), sample_greedy_rows(logits.copy(), rows, [samplers[i] for i in rows])))
    assert [got[i] for i in range(6)] == solo
    without = sample_greedy_rows(logits.copy(), rows, [samplers[i] for i in rows], [False] * 6)  # no normaliser
    assert dict(zip(rows.tolist(), without)) == {i: None if s is None else (s[0], None) for i, s in enumerate(solo)}
    assert [s.sample(row, [], logprob=False) for s, row in zip(samplers[:3], logits)] == [
        (t, None) for t, _ in solo[:3]
    ]
    drawn = Sampler(SamplingParams(temperature=0.8, seed=1), 3000)
    assert drawn.sample(logits[0], [], logprob=False) == Sampler(SamplingParams(temperature=0.8, seed=1), 3000).sample(
        logits[0], []
    )  # a draw needs the sum anyway: its log-probability stays
    after = logits.copy()
    assert sample_greedy_rows(after, np.array([3, 4], np.int64), [biased, biased]) == [None, None]
    with pytest.raises(ValueError, match=r"\+inf"):
        biased.sample(after[3], [])
    with pytest.raises(ValueError, match="NaN"):
        biased.sample(after[4], [])


@pytest.mark.parametrize("temperature, expect", [(0.5, [0.25, 0.09, 0.04]), (2.0, np.sqrt([0.5, 0.3, 0.2]))])
def test_temperature_reshapes_the_distribution(temperature, expect):
    # softmax(log(p) / T) is p ** (1/T) renormalised: T=0.5 -> .658/.237/.105, T=2 -> .415/.322/.263
    expect = np.asarray(expect) / np.sum(expect)
    x = logits_of([0.5, 0.3, 0.2])
    s = Sampler(SamplingParams(temperature=temperature, seed=11, **NO_FILTERS), 3)
    _, probs = s.distribution(x)
    assert np.allclose(probs, expect, atol=1e-6)
    draws = np.array([s.sample(x, [])[0] for _ in range(20_000)])
    assert np.allclose(np.bincount(draws, minlength=3) / len(draws), expect, atol=0.01)


def test_temperature_one_without_filters_samples_the_softmax():
    x = logits_of([0.5, 0.3, 0.2])
    s = Sampler(SamplingParams(temperature=1.0, seed=2, **NO_FILTERS), 3)
    draws = np.array([s.sample(x, [])[0] for _ in range(20_000)])
    assert np.allclose(np.bincount(draws, minlength=3) / len(draws), [0.5, 0.3, 0.2], atol=0.01)


# chi-square critical values at significance 0.001 (standard tables), by degrees of freedom
CHI2_CRIT_0001 = {3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458}


def test_sampled_frequencies_match_the_filtered_renormalised_distribution():
    # 8 tokens; each filter drops some: top_k=6 drops 0 and 2 (.02, .015); top_p=0.9 over the 6 left (sum .965)
    # reaches .953 at token 6 and drops 7 (.045); min_p=0.35 keeps p >= .105 and drops 6 (.10)
    probs = np.array([0.02, 0.30, 0.015, 0.22, 0.18, 0.12, 0.10, 0.045])
    x = logits_of(probs)
    kw = dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.35)
    ref = reference(x, **kw)
    assert set(ref) == {1, 3, 4, 5}
    s = Sampler(SamplingParams(seed=20240611, **kw), len(x))
    n_draws = 20_000
    draws = np.array([s.sample(x, [])[0] for _ in range(n_draws)])
    assert set(np.unique(draws).tolist()) <= set(ref)
    observed = np.array([np.count_nonzero(draws == t) for t in ref])
    expected = n_draws * np.array(list(ref.values()))
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_CRIT_0001[len(ref) - 1], chi2


def test_draw_inverse_cdf_never_picks_zero_weight_entries():
    cdf = np.cumsum([0.0, 0.0, 1.0, 0.0, 3.0, 0.0])
    assert [draw(cdf, u) for u in (0.0, 0.2, 0.2499, 0.25, 0.9999, np.nextafter(1.0, 0.0))] == [2, 2, 2, 4, 4, 4]


def test_whole_vocabulary_sampling_frequencies():
    # no filters: the full-vocabulary path (cumulative sum over every token); -inf tokens are never drawn
    x = np.full(1000, -np.inf, np.float32)
    x[[3, 500, 999, 42]] = logits_of([0.4, 0.3, 0.2, 0.1])
    s = Sampler(SamplingParams(seed=3, temperature=1.0, **NO_FILTERS), 1000)
    draws = np.array([s.sample(x, [])[0] for _ in range(20_000)])
    assert set(np.unique(draws).tolist()) <= {3, 500, 999, 42}
    observed = np.array([np.count_nonzero(draws == t) for t in (3, 500, 999, 42)])
    expected = 20_000 * np.array([0.4, 0.3, 0.2, 0.1])
    assert ((observed - expected) ** 2 / expected).sum() < CHI2_CRIT_0001[3]


def test_logprob_is_that_of_the_distribution_sampled_from():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(500) * 2).astype(np.float32)
    for kw in (dict(), dict(top_k=0), NO_FILTERS, dict(temperature=1.5, top_p=0.5)):
        s = Sampler(SamplingParams(seed=4, **kw), 500)
        ids, probs = s.distribution(x)
        table = dict(zip(ids.tolist(), np.log(probs).tolist()))
        for _ in range(30):
            token, logprob = s.sample(x, [])
            assert logprob == pytest.approx(table[token], abs=1e-5), kw


# --- logit bias, penalties, processors ---------------------------------------------------------------------------


def test_logit_bias_forbids_and_forces():
    x = logits_of([0.6, 0.3, 0.1])
    forbid = SamplingParams(logit_bias={0: -math.inf}, seed=1, **NO_FILTERS)
    s = Sampler(forbid, 3)
    assert 0 not in {s.sample(x, [])[0] for _ in range(500)}
    assert Sampler(SamplingParams(temperature=0, logit_bias={0: -math.inf}), 3).sample(x, [])[0] == 1
    force = Sampler(SamplingParams(logit_bias={2: 100.0}, seed=1, **NO_FILTERS), 3)
    assert {force.sample(x, [])[0] for _ in range(500)} == {2}
    # a finite bias shifts the logit by exactly that much
    biased = Sampler(SamplingParams(logit_bias={2: math.log(3.0)}, temperature=1.0, **NO_FILTERS), 3)
    _, probs = biased.distribution(x)
    assert np.allclose(probs, np.array([0.6, 0.3, 0.3]) / 1.2, atol=1e-6)


def seen_by_processor(params: dict, x, history) -> np.ndarray:
    """The logits after bias and penalties, as the first logits processor receives them."""
    got = []
    s = Sampler(SamplingParams(logits_processors=[lambda ids, lg: got.append(lg.copy()) or lg], **params), len(x))
    s.sample(np.asarray(x, np.float32), history)
    return got[0]


def test_repetition_penalty_llama_cpp_semantics():
    x = [2.0, -1.0, 0.5, 3.0, 0.0, -2.0]
    hist = [0, 1, 1, 4, 5, 5, 5]
    # seen tokens 0, 1, 4, 5: positive logits divided, the rest multiplied; 2 and 3 untouched
    got = seen_by_processor(dict(repetition_penalty=2.0), x, hist)
    assert got.tolist() == [1.0, -2.0, 0.5, 3.0, 0.0, -4.0]
    got = seen_by_processor(dict(repetition_penalty=0.5), x, hist)  # < 1 encourages repeats
    assert got.tolist() == [4.0, -0.5, 0.5, 3.0, 0.0, -1.0]


def test_frequency_and_presence_penalties_openai_semantics():
    x = [2.0, -1.0, 0.5, 3.0, 0.0, -2.0]
    hist = np.array([0, 1, 1, 4, 5, 5, 5])  # counts: 0:1, 1:2, 4:1, 5:3
    got = seen_by_processor(dict(frequency_penalty=0.5, presence_penalty=0.25), x, hist)
    want = [2.0 - 0.5 - 0.25, -1.0 - 1.0 - 0.25, 0.5, 3.0, 0.0 - 0.5 - 0.25, -2.0 - 1.5 - 0.25]
    assert np.allclose(got, want, atol=1e-6)
    got = seen_by_processor(dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25), x, hist)
    want = [1.0 - 0.75, -2.0 - 1.25, 0.5, 3.0, 0.0 - 0.75, -4.0 - 1.75]  # repetition first, then subtraction
    assert np.allclose(got, want, atol=1e-6)
    got = seen_by_processor(dict(frequency_penalty=-1.0), x, hist)  # negative: encourage
    assert np.allclose(got, [3.0, 1.0, 0.5, 3.0, 1.0, 1.0], atol=1e-6)


def test_penalty_window():
    x = [1.0, 1.0, 1.0, 1.0]
    hist = [3, 3, 0, 1, 2]
    assert seen_by_processor(dict(presence_penalty=1.0, penalty_last_n=2), x, hist).tolist() == [1, 0, 0, 1]
    assert seen_by_processor(dict(presence_penalty=1.0, penalty_last_n=-1), x, hist).tolist() == [0, 0, 0, 0]
    assert seen_by_processor(dict(presence_penalty=1.0, penalty_last_n=0), x, hist).tolist() == [1, 1, 1, 1]
    assert seen_by_processor(dict(presence_penalty=1.0, penalty_last_n=99), x, hist).tolist() == [0, 0, 0, 0]
    assert seen_by_processor(dict(), x, hist).tolist() == [1, 1, 1, 1]  # defaults: penalties off


def test_apply_penalties_helper_in_float32():
    x = np.array([0.3, -0.7, 1.9], np.float32)
    apply_penalties(x, np.array([0, 1, 1]), 1.3, 0.1, 0.2)
    want = [np.float32(0.3) / np.float32(1.3) - np.float32(0.3), np.float32(-0.7) * np.float32(1.3) - np.float32(0.4)]
    assert x.dtype == np.float32 and x[:2].tolist() == pytest.approx(want, abs=1e-7) and x[2] == np.float32(1.9)


def test_processors_run_in_order_after_bias_and_may_return_new_arrays():
    calls = []

    def first(ids, lg):
        calls.append(("first", ids.tolist(), lg.copy()))
        out = lg.astype(np.float64)  # a new array of another dtype: copied back
        out[1] += 10
        return out

    def second(ids, lg):
        calls.append(("second", ids.tolist(), lg.copy()))
        lg[2] = -np.inf  # in place
        return lg

    s = Sampler(SamplingParams(temperature=0, logit_bias={0: 1.0}, logits_processors=[first, second]), 3)
    token, _ = s.sample(np.zeros(3, np.float32), [2, 1])
    assert [c[0] for c in calls] == ["first", "second"] and calls[0][1] == [2, 1]
    assert calls[0][2].tolist() == [1, 0, 0] and calls[1][2].tolist() == [1, 10, 0]
    assert token == 1


def test_callers_logits_are_not_modified():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(300) * 2).astype(np.float32)
    before = x.copy()
    params = SamplingParams(
        seed=1,
        repetition_penalty=1.3,
        frequency_penalty=0.2,
        presence_penalty=0.1,
        logit_bias={5: 3.0, 6: -math.inf},
        logits_processors=[lambda ids, lg: lg.__imul__(2)],  # in place on the sampler's buffer
    )
    s = Sampler(params, 300)
    for t in range(10):
        s.sample(x, list(range(t * 5)))
    s.distribution(x, [1, 2])
    assert np.array_equal(x, before)
    x64 = x.astype(np.float64)  # other float dtypes are accepted and left alone too
    Sampler(SamplingParams(seed=1), 300).sample(x64, [])
    assert np.array_equal(x64, before.astype(np.float64))


# --- determinism -------------------------------------------------------------------------------------------------

DRAW_SCRIPT = """
import numpy as np
from ggufrun.sampling import Sampler, SamplingParams
x = (np.random.default_rng(77).standard_normal(2000) * 2).astype(np.float32)
s = Sampler(SamplingParams(seed=123, temperature=1.0, top_k=0, top_p=0.9, repetition_penalty=1.1), 2000)
hist = []
for _ in range(50):
    hist.append(s.sample(x, hist)[0])
print(" ".join(map(str, hist)))
"""


def run_draws() -> list[int]:
    ns: dict = {}
    from contextlib import redirect_stdout
    from io import StringIO

    buf = StringIO()
    with redirect_stdout(buf):
        exec(DRAW_SCRIPT, ns)
    return [int(t) for t in buf.getvalue().split()]


def test_same_seed_same_tokens_in_process_and_across_processes():
    a = run_draws()
    assert a == run_draws() and len(set(a)) > 5  # varied draws, reproduced exactly
    out = subprocess.run([sys.executable, "-c", DRAW_SCRIPT], capture_output=True, text=True, cwd=ROOT, check=True)
    assert [int(t) for t in out.stdout.split()] == a


def test_reset_and_seeds():
    x = (np.random.default_rng(1).standard_normal(100) * 2).astype(np.float32)
    s = Sampler(SamplingParams(seed=5, **NO_FILTERS), 100)
    first = [s.sample(x, [])[0] for _ in range(40)]
    s.reset()
    assert [s.sample(x, [])[0] for _ in range(40)] == first
    s.reset(seed=6)
    other = [s.sample(x, [])[0] for _ in range(40)]
    assert other != first
    s.reset(seed=6)
    assert [s.sample(x, [])[0] for _ in range(40)] == other
    with pytest.raises(ValueError, match="seed"):
        s.reset(seed=-3)
    a, b = (Sampler(SamplingParams(**NO_FILTERS), 100) for _ in range(2))  # seed None: fresh entropy each
    assert [a.sample(x, [])[0] for _ in range(40)] != [b.sample(x, [])[0] for _ in range(40)]


def test_large_vocabulary_default_params():
    n = 262_144
    x = (np.random.default_rng(8).standard_normal(n) * 3).astype(np.float32)
    s = Sampler(SamplingParams(seed=1), n)
    top40 = set(np.argsort(-x)[:40].tolist())
    for _ in range(5):
        token, logprob = s.sample(x, [])
        assert token in top40 and logprob <= 0


def test_seed_minus_one_is_random():
    """llama.cpp's convention: seed -1 draws fresh entropy, like None."""
    assert SamplingParams(seed=-1).seed is None
    x = (np.random.default_rng(1).standard_normal(100) * 2).astype(np.float32)
    a, b = (Sampler(SamplingParams(seed=-1, **NO_FILTERS), 100) for _ in range(2))
    assert [a.sample(x)[0] for _ in range(40)] != [b.sample(x)[0] for _ in range(40)]
    s = Sampler(SamplingParams(seed=5, **NO_FILTERS), 100)
    first = [s.sample(x)[0] for _ in range(40)]
    s.reset(seed=-1)
    assert [s.sample(x)[0] for _ in range(40)] != first
    with pytest.raises(ValueError, match="-1 \\(random\\)"):
        s.reset(seed=-2)


# --- reported log-probabilities ----------------------------------------------------------------------------------


def log_softmax64(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


@pytest.mark.parametrize("n", [10, 49_152, 262_144])
def test_token_logprobs_match_a_float64_log_softmax(n):
    x = (np.random.default_rng(n).standard_normal(n) * 4).astype(np.float32)
    before = x.copy()
    ref = log_softmax64(x)
    order = sorted(range(n), key=lambda i: (-ref[i], i))
    for k in (0, 1, 5, 20):
        token = order[3] if n > 3 else 0
        lp = token_logprobs(x, token, top_k=k)
        k_eff = min(k, n)
        assert lp.top_ids.tolist() == order[:k_eff]
        np.testing.assert_allclose(lp.top_logprobs, ref[order[:k_eff]], atol=2e-5)
        assert np.all(lp.top_logprobs <= 0) and np.all(np.diff(lp.top_logprobs) <= 0)
        assert abs(lp.logprob - ref[token]) < 2e-5 and lp.logprob <= 0
        if k > 3:  # the sampled token is among the alternatives: the very same number
            assert dict(lp.top())[token] == lp.logprob
    np.testing.assert_array_equal(x, before)  # not modified


def test_token_logprobs_ties_bias_and_edges():
    tie = np.array([1.0, 3.0, 3.0, 0.0, 3.0], np.float32)
    lp = token_logprobs(tie, 0, top_k=2)
    assert lp.top_ids.tolist() == [1, 2] and lp.top_logprobs[0] == lp.top_logprobs[1]
    assert abs(lp.logprob - log_softmax64(tie)[0]) < 1e-6
    peaked = np.array([0.0, 1000.0], np.float32)  # all mass on one token: exactly 0, never above
    assert token_logprobs(peaked, 1, top_k=2).top_logprobs[0] == 0.0
    masked = np.array([-np.inf, 2.0, 1.0], np.float32)  # -inf entries are allowed: probability 0
    assert token_logprobs(masked, 0, top_k=3).logprob == -np.inf
    for bad in (-1, 21, 2.0, True):
        with pytest.raises(ValueError, match="top_logprobs"):
            token_logprobs(tie, 0, top_k=bad)
    with pytest.raises(ValueError, match="token"):
        token_logprobs(tie, 5)
    with pytest.raises(ValueError, match="finite"):
        token_logprobs(np.array([np.nan, 1.0], np.float32), 0)
    with pytest.raises(ValueError, match="1-D"):
        token_logprobs(np.zeros((2, 2), np.float32), 0)


def test_reported_logprobs_are_the_raw_distribution_not_the_sampled_one():
    """OpenAI/llama-server report the model's distribution: temperature, filters and bias do not change it."""
    x = (np.random.default_rng(3).standard_normal(1000) * 2).astype(np.float32)
    token, sampled_lp = Sampler(SamplingParams(temperature=0.3, top_k=5, seed=1, logit_bias={7: 5.0}), 1000).sample(x)
    reported = token_logprobs(x, token, top_k=5)
    assert abs(reported.logprob - log_softmax64(x)[token]) < 1e-5
    assert reported.logprob < sampled_lp  # the sampled distribution is much sharper


def test_exp_total_is_exp_sums_sum_without_writing():
    """kernels.exp_total (16-lane exps straight into the sums) against exp_sum (the exps written, then summed): the same
    float64 bits, at lengths around the 32-value steps, with values whose exps clamp to 0 / go subnormal (x - m at and
    below -104, -87 .. -104), exactly 0, and large positive ones (overflow to inf); NaN makes both NaN; x unchanged."""
    from ggufrun.model.kernels import exp_sum, exp_total

    rng = np.random.default_rng(11)
    for n in (1, 31, 32, 33, 95, 1000, 49_152):
        x = (rng.standard_normal(n) * 30).astype(np.float32)
        x[: min(n, 8)] = np.array([-104.0, -104.5, -300.0, -90.0, -87.3, 0.0, 95.0, -0.0], np.float32)[: min(n, 8)]
        top = x[np.isfinite(x)].max()  # m past the top: every exp tiny or subnormal, so the clamp at -104 shows
        for m in (np.float32(0.0), np.float32(top), np.float32(-3.5), np.float32(top + 90), np.float32(top + 101)):
            kept = x.copy()
            got = exp_total(x, m)
            want = exp_sum(x.copy(), m)
            assert np.array_equal(x.view(np.int32), kept.view(np.int32))
            assert np.float64(got).view(np.int64) == np.float64(want).view(np.int64), (n, m, got, want)
        if n > 40:
            y = x.copy()
            y[37] = np.nan
            assert math.isnan(exp_total(y, np.float32(0.0))) and math.isnan(exp_sum(y.copy(), np.float32(0.0)))


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 4095, 4097, 262_144])
def test_greedy_rows_argmax_and_sum_at_every_length(n):
    """kernels.greedy_rows' vector passes (the maximum 32 values a step, its first index 16 compares a step, the float64
    sum in 8-lane sums) at lengths around the vectors' sizes: np.argmax's index wherever the maximum sits (first, in a
    tie across two blocks, last, second to last); the sum of the row's exps (exp_sum leaves them in the row) within
    1e-12 of float64 NumPy's sum of the same values, the bits exp_sum gives alone, the rows left as they were; rows
    whose sum is not wanted get the same argmax and 1.0; a NaN anywhere (in the first 32 values, past them, in the
    last n % 32) makes the sum NaN, wanted or not."""
    from ggufrun.model.kernels import exp_sum, greedy_rows

    rng = np.random.default_rng(n)
    base = rng.standard_normal(n).astype(np.float32)
    rows = []
    for at in sorted({0, n // 2, max(0, n - 2), n - 1}):
        x = base.copy()
        x[at] = 8.0
        rows.append(x)
    if n >= 40:
        x = base.copy()
        x[[n - 20, 17]] = 8.0  # a tie: the first one, in another block
        rows.append(x)
    logits = np.stack(rows)
    best, sums = np.zeros(len(rows), np.int64), np.zeros(len(rows))
    given = logits.copy()
    ones = np.ones(len(rows), np.uint8)
    greedy_rows(given, np.arange(len(rows), dtype=np.int64), ones, best, sums)
    assert np.array_equal(given.view(np.int32), logits.view(np.int32))
    best_only, skipped = np.zeros_like(best), np.zeros_like(sums)  # want 0: the argmax alone, the sum left at 1.0
    greedy_rows(given, np.arange(len(rows), dtype=np.int64), ones * 0, best_only, skipped)
    assert np.array_equal(best_only, best) and np.all(skipped == 1.0)
    for i, x in enumerate(rows):
        assert best[i] == np.argmax(x)
        e = x.copy()
        assert exp_sum(e, np.float32(8.0)) == sums[i]
        want = e.astype(np.float64).sum()  # the same float32 exps, summed by NumPy
        assert abs(sums[i] - want) <= 1e-12 * want and sums[i] >= 1.0
    for at in sorted({0, 35 % n, n - 1}):  # a NaN in the first 32 values, past them, in the last n % 32
        x = base.copy()
        x[at] = np.nan
        for want in (1, 0):  # NaN with or without the sum
            out = np.zeros(1)
            greedy_rows(x[None].copy(), np.zeros(1, np.int64), np.full(1, want, np.uint8), np.zeros(1, np.int64), out)
            assert math.isnan(out[0])
