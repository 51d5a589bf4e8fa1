"""Speculative decoding (ggufrun.speculative): greedy output identical to plain decoding (synthetic and real models,
n-gram and draft-model drafts, with penalties, logit_bias, logprobs, a grammar and a shared cache), the sampling
acceptance rule reproducing the target distribution (chi-square against the exact probabilities), the drafters, the
adaptive draft length, and bad arguments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from synthetic import write_model

import ggufrun
from ggufrun.sampling import Sampler, SamplingParams
from ggufrun.speculative import DraftLength, NgramDrafter, Speculation, verify

REPEAT = [5, 6, 7, 8, 9, 10, 11, 12] * 4  # a prompt whose n-grams recur, so that prompt lookup finds drafts


@pytest.fixture(scope="module")
def tiny(tiny_path):
    m = ggufrun.load(tiny_path, n_ctx=128, n_threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory, tiny):
    """Another random model with the same vocabulary: a poor draft, so many drafts are rejected."""
    path = write_model(tmp_path_factory.mktemp("spec") / "draft.gguf", tokenizer="bytes", ctx=256, seed=11)
    m = ggufrun.load(path, n_ctx=128, n_threads=2)
    yield m
    m.close()


def _run(model, prompt, **kw):
    chunks = list(model.generate(prompt, **kw))
    return [c.token for c in chunks], chunks


# ---- greedy: the same tokens ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft_tokens", [1, 3, 8])
def test_greedy_ngram_matches_plain_decoding(tiny, draft_tokens):
    plain, _ = _run(tiny, REPEAT, max_tokens=40, temperature=0)
    spec = Speculation("ngram", draft_tokens=draft_tokens, adaptive=False)
    fast, chunks = _run(tiny, REPEAT, max_tokens=40, temperature=0, speculative=spec)
    assert fast == plain
    s = chunks[-1].stats
    assert s.drafted_tokens > 0 and 0 <= s.accepted_tokens <= s.drafted_tokens
    assert s.generated_tokens == len(plain)


def test_greedy_draft_model_matches_plain_decoding(tiny, tiny_draft):
    plain, _ = _run(tiny, REPEAT, max_tokens=30, temperature=0)
    for draft, all_accepted in ((tiny_draft, False), (tiny, True)):  # the target as its own draft accepts all
        spec = Speculation(draft, draft_tokens=4, adaptive=False)
        fast, chunks = _run(tiny, REPEAT, max_tokens=30, temperature=0, speculative=spec)
        assert fast == plain
        s = chunks[-1].stats
        assert s.drafted_tokens > 0
        assert (s.accepted_tokens == s.drafted_tokens) == all_accepted


def test_greedy_with_penalties_bias_and_logprobs_matches(tiny):
    kw = dict(max_tokens=30, temperature=0, repetition_penalty=1.3, frequency_penalty=0.2, penalty_last_n=16,
              logit_bias={7: 2.0, 9: -math.inf}, logprobs=3)  # fmt: skip
    plain, pc = _run(tiny, REPEAT, **kw)
    fast, fc = _run(tiny, REPEAT, speculative=Speculation("ngram", draft_tokens=5, adaptive=False), **kw)
    assert fast == plain and 9 not in fast
    assert [c.logprob for c in fc] == [c.logprob for c in pc]
    assert [c.top_logprobs for c in fc] == [c.top_logprobs for c in pc]


def test_greedy_with_a_grammar_matches(tiny):
    rf = {"type": "regex", "regex": "(ab|abc|b)+c"}
    plain, pc = _run(tiny, REPEAT, max_tokens=20, temperature=0, response_format=rf)
    fast, fc = _run(tiny, REPEAT, max_tokens=20, temperature=0, response_format=rf,
                    speculative=Speculation("ngram", draft_tokens=4, adaptive=False))  # fmt: skip
    assert fast == plain
    assert "".join(c.text for c in fc) == "".join(c.text for c in pc)
    assert fc[-1].finish_reason == pc[-1].finish_reason


def test_interleaved_generations_on_one_cache_stay_exact(tiny):
    """Another generation using the cache between speculative passes forces a re-sync; both stay exact."""
    a_plain, _ = _run(tiny, REPEAT, max_tokens=24, temperature=0)
    b_prompt = [40, 41, 42, 40, 41, 42, 40]
    b_plain, _ = _run(tiny, b_prompt, max_tokens=24, temperature=0)
    spec = Speculation("ngram", draft_tokens=3, adaptive=False)
    a = tiny.generate(REPEAT, max_tokens=24, temperature=0, speculative=spec)
    b = tiny.generate(b_prompt, max_tokens=24, temperature=0)
    got_a, got_b = [], []
    for ca, cb in zip(a, b):
        got_a.append(ca.token)
        got_b.append(cb.token)
    got_a += [c.token for c in a]
    got_b += [c.token for c in b]
    assert got_a == a_plain and got_b == b_plain


def test_max_tokens_and_context_limits_hold(tiny):
    spec = Speculation("ngram", draft_tokens=8, adaptive=False)
    for n in (0, 1, 2, 5):
        toks, chunks = _run(tiny, REPEAT, max_tokens=n, temperature=0, speculative=spec)
        assert toks == _run(tiny, REPEAT, max_tokens=n, temperature=0)[0]
    # the context (128) ends the generation at the same token as without speculation
    toks, chunks = _run(tiny, REPEAT * 3, max_tokens=200, temperature=0, speculative=spec)
    assert toks == _run(tiny, REPEAT * 3, max_tokens=200, temperature=0)[0]
    assert chunks[-1].finish_reason == "length" or chunks[-1].token in tiny.tokenizer.eog_ids


def test_load_with_a_draft_model_and_speculative_false(tiny_path, tiny):
    m = ggufrun.load(tiny_path, n_ctx=128, n_threads=2, draft_model=tiny_path)
    try:
        assert m.speculative is not None
        toks, chunks = _run(m, REPEAT, max_tokens=20, temperature=0)
        assert toks == _run(tiny, REPEAT, max_tokens=20, temperature=0)[0]
        assert chunks[-1].stats.drafted_tokens > 0
        _, chunks = _run(m, REPEAT, max_tokens=20, temperature=0, speculative=False)
        assert chunks[-1].stats.drafted_tokens == 0
    finally:
        m.speculative.close()
        m.close()


# ---- sampling: the target's distribution ---------------------------------------------------------------------------


def _chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> tuple[bool, float, float]:
    """Pearson's chi-square of counts against probs, categories with expected count < 5 pooled; the statistic must
    stay below the 0.999 quantile (Wilson-Hilferty approximation)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    z = 3.09  # 0.999 normal quantile
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return stat < limit, stat, limit


def _sampling_setup(tiny):
    tf = tiny.transformer
    prompt = np.array([5, 6, 7, 8], dtype=np.int64)
    params = SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.2, seed=1)
    sampler = Sampler(params, tf.config.n_vocab)
    p_ids, p = sampler.distribution(tf.logits(prompt, cache=tf.new_cache())[-1], prompt)
    full = np.zeros(tf.config.n_vocab)
    full[p_ids] = p
    return tf, prompt, sampler, full


def test_ngram_speculative_sampling_reproduces_the_target_distribution(tiny):
    """verify() on fixed rows, many times, with point-mass drafts: the first token follows p(row 0), and the second,
    given that the first draft was kept, follows p(row 1)."""
    tf, prompt, sampler, p0 = _sampling_setup(tiny)
    order = np.argsort(-p0)
    drafts = np.array([order[1], order[0]], dtype=np.int64)  # the second most likely token: kept sometimes
    rows = tf.logits(np.concatenate([prompt, drafts]), cache=tf.new_cache())[len(prompt) - 1 :]  # [3, n_vocab]
    h1 = np.concatenate([prompt, drafts[:1]])
    p1_ids, p1_probs = sampler.distribution(rows[1], h1)
    p1 = np.zeros_like(p0)
    p1[p1_ids] = p1_probs
    first = np.zeros(len(p0), dtype=np.int64)
    second = np.zeros(len(p0), dtype=np.int64)
    history = np.zeros(len(prompt) + 3, dtype=np.int64)
    history[: len(prompt)] = prompt
    for _ in range(6000):
        history[len(prompt) : len(prompt) + 2] = drafts
        out, accepted = verify(sampler, rows, history, len(prompt), drafts, [], None, None)
        token, logprob, _ = out[0]
        first[token] += 1
        assert logprob == pytest.approx(math.log(p0[token]))
        if token == drafts[0]:
            assert accepted >= 1 and len(out) >= 2
            second[out[1][0]] += 1
    ok, stat, limit = _chi_square_ok(first, p0)
    assert ok, f"first token: chi-square {stat:.1f} >= {limit:.1f}"
    assert second.sum() > 300
    ok, stat, limit = _chi_square_ok(second, p1)
    assert ok, f"second token: chi-square {stat:.1f} >= {limit:.1f}"


def test_draft_model_speculative_sampling_reproduces_the_target_distribution(tiny):
    """A draft drawn from a distribution q far from p, kept with probability min(1, p/q), else replaced from
    max(0, p - q): the token that comes out follows p."""
    tf, prompt, sampler, p0 = _sampling_setup(tiny)
    n_vocab = len(p0)
    rng = np.random.default_rng(0)
    w = rng.random(n_vocab) ** 4
    q = w / w.sum()
    q_cdf = np.cumsum(q)
    after: dict[int, np.ndarray] = {}  # draft -> the target's logits after it
    first = np.zeros(n_vocab, dtype=np.int64)
    history = np.zeros(len(prompt) + 2, dtype=np.int64)
    history[: len(prompt)] = prompt
    row0 = tf.logits(prompt, cache=tf.new_cache())[-1]
    kept = 0
    for _ in range(6000):
        d = int(np.searchsorted(q_cdf, rng.random() * q_cdf[-1], side="right"))
        if d not in after:
            after[d] = tf.logits(np.append(prompt, d), cache=tf.new_cache())[-1]
        rows = np.stack([row0, after[d]])
        history[len(prompt)] = d
        out, accepted = verify(sampler, rows, history, len(prompt), np.array([d]), [(np.arange(n_vocab), q)],
                               None, None)  # fmt: skip
        first[out[0][0]] += 1
        kept += accepted
    ok, stat, limit = _chi_square_ok(first, p0)
    assert ok, f"chi-square {stat:.1f} >= {limit:.1f}"
    expected_kept = np.minimum(p0, q).sum() * 6000  # the acceptance rate of the rule is sum(min(p, q))
    assert abs(kept - expected_kept) < 5 * math.sqrt(expected_kept) + 1


def test_sampling_end_to_end_is_reproducible_with_a_seed(tiny):
    spec = Speculation("ngram", draft_tokens=4, adaptive=False, ngram_min=1)
    kw = dict(max_tokens=25, temperature=0.5, seed=7, speculative=spec)
    a, ca = _run(tiny, REPEAT, **kw)
    b, _ = _run(tiny, REPEAT, **kw)
    assert a == b and ca[-1].stats.drafted_tokens > 0


# ---- parts ---------------------------------------------------------------------------------------------------------


def test_ngram_drafter_takes_the_latest_longest_match():
    d = NgramDrafter(ngram_max=3, ngram_min=1)
    h = np.array([1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3], dtype=np.int64)
    assert d.propose(h, 3).tolist() == [4, 9, 2]  # (1, 2, 3) occurred at 0; (2, 3) alone would give 5, 6
    h = np.array([7, 2, 3, 4, 8, 2, 3, 5, 2, 3], dtype=np.int64)
    assert d.propose(h, 2).tolist() == [5, 2]  # the latest earlier (2, 3)
    assert NgramDrafter(3, 2).propose(np.array([1, 2, 3, 4]), 4).tolist() == []
    assert d.propose(np.array([1, 1, 1, 1]), 5).tolist() == [1]  # overlapping: only what follows is drafted


def test_ngram_drafter_default_tells_repeated_code_apart_by_the_longer_context():
    """Two methods that share their last 4 tokens and continue differently: the default drafter matches the 6 tokens
    that say which method it is in, where 4-grams would take the latest (wrong) one; matches of LONG_MATCH or more
    tokens count as one source."""
    a = [10, 11, 1, 2, 3, 4, 20, 21]  # "class A ... def push(self, item): <body A>"
    b = [12, 13, 1, 2, 3, 4, 30, 31]  # "class B ... def push(self, item): <body B>"
    h = np.array(a + b + [10, 11, 1, 2, 3, 4], dtype=np.int64)
    assert NgramDrafter(ngram_max=4).propose(h, 2).tolist() == [30, 31]
    d = NgramDrafter()
    assert d.propose(h, 2).tolist() == [20, 21] and d.matched == 6
    assert d.source == NgramDrafter.LONG_MATCH
    assert Speculation().ngram_max == d.ngram_max == 16


def test_ngram_drafter_index_matches_a_full_scan_as_the_history_grows():
    """The drafter's index, grown call by call (and started over for another history), proposes what a scan of
    every earlier window proposes."""

    def scan(history, k, n_max, n_min):
        n_hist = history.shape[0]
        for n in range(min(n_max, n_hist - 1), n_min - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(history[: n_hist - 1], n)
            hits = np.flatnonzero((windows == history[n_hist - n :]).all(axis=1))
            if hits.size:
                return history[int(hits[-1]) + n :][:k]
        return history[:0]

    rng = np.random.default_rng(3)
    for _ in range(60):
        n_max = int(rng.integers(1, 5))
        n_min = int(rng.integers(1, n_max + 1))
        d = NgramDrafter(n_max, n_min)
        for _ in range(2):  # a second, unrelated history: the index starts over
            full = rng.integers(0, 4, 60)
            n = int(rng.integers(1, 4))
            while n <= full.shape[0]:
                assert d.propose(full[:n], 5).tolist() == scan(full[:n], 5, n_max, n_min).tolist()
                n += int(rng.integers(1, 4))


def test_draft_length_adapts_to_acceptance_and_cost():
    dl = DraftLength(k_max=8, adaptive=True)
    dl.timed(1, 0.010)
    for m in range(2, 10):
        dl.timed(m, 0.010 + 0.006 * (m - 1))  # each extra token costs 60% of a one-token pass
    for _ in range(30):
        dl.observe(8, 8)
    assert dl.choose(8) == 8 and dl.choose(3) == 3
    for _ in range(60):
        dl.observe(4, 0)
    assert dl.choose(8) == 0
    assert DraftLength(k_max=5, adaptive=False).choose(8) == 5
    probing = DraftLength(k_max=8, adaptive=True, probe_every=4)
    probing.timed(1, 0.010)
    for _ in range(60):
        probing.observe(4, 0)
    assert [probing.choose(8) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]
    # probes whose token is rejected space out (4 -> 8 -> 16 plain steps), one accepted brings back every 4
    picks = []
    for _ in range(28):
        k = probing.choose(8)
        picks.append(k)
        if k:
            probing.observe(1, 0)
    assert [i for i, k in enumerate(picks) if k] == [3, 11, 27]  # every 4th step, then 8th, then 16th
    assert probing.probe_every == 32
    probing._probing = True  # as after choose() probed
    probing.observe(1, 1)
    assert probing.probe_every == 4


def test_draft_length_tries_longer_drafts_and_survives_a_stalled_pass():
    """Passes cost 10 ms + 3 ms per extra token (SmolLM2-135M's proportions at 2 threads) and every draft is
    accepted: the draft length climbs to the most allowed, sizes never timed included, and two passes stretched 20x
    by a descheduled thread do not keep long drafts away for good."""
    dl = DraftLength(k_max=10, adaptive=True)
    picks = []
    for i in range(60):
        k = dl.choose(10)
        dl.observe(max(k, 1), max(k, 1))
        dl.timed(k + 1, (0.010 + 0.003 * k) * (20.0 if i in (2, 3) else 1.0))  # two passes in a row stall
        picks.append(k)
    assert picks[0] < picks[2] < 10 and picks[2] >= 4  # the stalls hit long drafts, tried before ever timed
    assert picks[-20:] == [10] * 20
    assert abs(dl.estimate(11) - 0.040) < 0.004


def test_bad_arguments_are_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match="speculative"):
        tiny.generate(REPEAT, speculative="medusa")
    with pytest.raises(ValueError, match="draft_tokens"):
        Speculation("ngram", draft_tokens=0)
    with pytest.raises(ValueError, match="ngram_min"):
        Speculation("ngram", ngram_max=2, ngram_min=3)
    other = write_model(tmp_path / "other.gguf", vocab=64, seed=2)
    with pytest.raises(ValueError, match="draft_model.*vocabulary"):
        ggufrun.load(tiny.path, n_ctx=64, n_threads=2, draft_model=other)
    o = ggufrun.load(other, n_ctx=64, n_threads=2)
    try:
        with pytest.raises(ValueError, match="n_vocab"):
            tiny.generate(REPEAT, speculative=o)
    finally:
        o.close()


# ---- real models ---------------------------------------------------------------------------------------------------

CODE = '''def area(width, height):
    """The area of a rectangle."""
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height
'''


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_real_model_greedy_output_is_identical(request, which):
    template = "gemma" if which == "gemma3_path" else None  # the Gemma3 270M file is a base model: no template
    m = ggufrun.load(request.getfixturevalue(which), n_ctx=512, n_threads=2, chat_template=template)
    try:
        msgs = [{"role": "user", "content": "Rewrite this code, renaming area to rect_area. Only the code.\n\n" + CODE}]
        plain = [c.token for c in m.chat(msgs, max_tokens=40, temperature=0)]
        chunks = list(m.chat(msgs, max_tokens=40, temperature=0,
                             speculative=Speculation("ngram", draft_tokens=6, adaptive=False)))  # fmt: skip
        assert [c.token for c in chunks] == plain
        assert chunks[-1].stats.accepted_tokens > 0
    finally:
        m.close()


# ---- command line --------------------------------------------------------------------------------------------------


def test_cli_speculative_flag(tiny_path, capsys):
    from ggufrun.cli import main

    base = ["run", "--model", str(tiny_path), "--raw", "--temp", "0", "-n", "12", "-t", "2"]
    prompt = "abcabcabcabcabc"
    assert main([*base, "--no-stats", prompt]) == 0
    plain = capsys.readouterr().out
    assert main([*base, "--speculative", "ngram", "--draft-tokens", "3", prompt]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    assert main([*base, "--no-stats", "--speculative", str(tiny_path), prompt]) == 0
    assert capsys.readouterr().out == plain
    assert main([*base, "--draft-tokens", "3", prompt]) != 0
    assert "--draft-tokens needs --speculative" in capsys.readouterr().err
