"""Speculative decoding: draft a few tokens cheaply, verify them with one batched forward pass of the model.

Two drafters, one verifier:
    NgramDrafter   prompt-lookup decoding (Saxena 2023, transformers' `prompt_lookup_num_tokens`, vLLM's `ngram`
                   proposer): the longest recent n-gram of prompt + output that occurred before is looked up, and
                   the tokens that followed its latest earlier occurrence are the draft. Costs no model.
    ModelDrafter   a small model with the same vocabulary drafts k tokens one by one (llama.cpp's
                   examples/speculative, `--model-draft`), in its own KV cache.
    verify()       the target model evaluates [last token, d1..dk] in one forward pass (all_logits); row j is the
                   distribution after d1..dj. Drafts are accepted left to right; the first rejected one is replaced
                   by a token drawn from the right distribution, and when all k are accepted row k gives one more
                   token, so every pass yields 1..k+1 tokens. The K/V of rejected drafts are rolled back with
                   cache.truncate.

Exactness. Greedy (temperature 0): each row goes through Sampler.sample exactly as the one-token loop does, and
the forward pass is batch-invariant (a token's logits are the same bits however it is batched), so the output is
token for token the non-speculative greedy output. Sampling: the speculative-sampling rule of Leviathan et al.
2023 ("Fast Inference from Transformers via Speculative Decoding", algorithm 1) and Chen et al. 2023: a drafted
token x drawn from q is accepted with probability min(1, p(x)/q(x)), else a token is drawn from
max(0, p - q) normalised; p is the target's distribution after the whole sampler chain (Sampler.distribution:
logit_bias, penalties, logits processors, constraint, top-k/top-p/min-p, temperature). For n-gram drafts q is a
point mass, so x is accepted with probability p(x), else drawn from p without x. Each emitted token is thus
distributed exactly as p, though the random stream differs from the non-speculative one (a seed gives the same
tokens on every speculative run, not the same tokens as without speculation).

Rows are processed strictly in order and processing stops at the first replaced token, so penalties, logits
processors and the grammar constraint see exactly the calls and histories of the one-token loop; reported
log-probabilities (logprobs=k) come from each token's own row.

Draft length. `draft_tokens` is the most tokens drafted per pass. With `adaptive` (the default) each pass drafts
the k in 0..draft_tokens that maximises expected tokens per second: (1 - a^(k+1)) / (1 - a) tokens for a pass of
k+1 tokens, with `a` the recent per-token acceptance rate and the pass's cost measured on this machine (a one-token
pass, plus a multi-token pass's fixed extra and a cost per extra row: DraftLength). When acceptance is low k falls
to 0 (plain one-token steps, no slower than without speculation). N-gram drafts that are found but not used are
still checked against the tokens that come, so the rate keeps up with the text; a draft model drafts one token
after every 8 plain steps for the same purpose, and its drafting time counts in the cost.
The gain is bounded by how much cheaper a token is in a batched pass than alone: on a memory-bound machine a pass
of 8 tokens costs little more than one, on a compute-bound CPU it can cost several times as much.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from .generate import _is_cancelled, check_prompt_fits, eval_prompt, prefill
from .sampling import Sampler, SamplingParams, draw, token_logprobs

DEFAULT_DRAFT_TOKENS = 10


@dataclass(frozen=True)
class Speculation:
    """How to speculate: `draft` is "ngram" or a loaded draft llm.Model (same vocabulary as the target).

    draft_tokens: most tokens drafted per verification pass (>= 1). adaptive: choose each pass's draft length from
    the measured acceptance rate and pass costs (else always draft as many as are found, up to draft_tokens).
    ngram_max / ngram_min: the longest and shortest n-gram looked up (n-gram drafts only). The longest match wins, so
    a long ngram_max tells apart the places where code or text repeats a few tokens with different continuations
    (two classes with the same method names): replaying Gemma3-270M's 200-token greedy answer to the rewrite prompt
    of benchmarks/speculative.py with drafts of up to 12 tokens, 4 -> 16 took it from 20 passes to 16 (181 -> 185
    drafted tokens accepted).

    >>> model.generate(prompt, speculative=Speculation("ngram", draft_tokens=8))
    """

    draft: object = "ngram"
    draft_tokens: int = DEFAULT_DRAFT_TOKENS
    adaptive: bool = True
    ngram_max: int = 16
    ngram_min: int = 2

    def __post_init__(self):
        def positive(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative {name} must be an integer >= 1, got {v!r}")

        positive("draft_tokens")
        positive("ngram_max")
        positive("ngram_min")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"speculative ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"speculative adaptive must be True or False, got {self.adaptive!r}")
        if self.draft != "ngram" and not hasattr(self.draft, "transformer"):
            raise ValueError(f"speculative draft must be 'ngram' or a loaded draft Model, got {self.draft!r}")


def as_speculation(value, target_tf=None) -> Speculation | None:
    """The `speculative=` argument of Model.generate/chat: None/False (off), "ngram", a draft Model, or a
    Speculation. Anything else, or a draft model whose vocabulary is not the target's (`target_tf`, a
    model.Transformer), is a ValueError naming the argument."""
    if value is None or value is False:
        return None
    if isinstance(value, Speculation):
        spec = value
    elif isinstance(value, str) and value == "ngram" or hasattr(value, "transformer"):
        spec = Speculation(draft=value)
    else:
        raise ValueError(f"speculative must be None, 'ngram', a draft Model or a Speculation, got {value!r}")
    if target_tf is not None and spec.draft != "ngram":
        check_same_vocabulary(spec.draft.transformer, target_tf)
    return spec


def check_same_vocabulary(draft_tf, target_tf) -> None:
    """ValueError unless the draft model has the target's vocabulary size (its token ids mean the same)."""
    if draft_tf.config.n_vocab != target_tf.config.n_vocab:
        raise ValueError(
            f"speculative draft model has {draft_tf.config.n_vocab} tokens (n_vocab) but the target has "
            f"{target_tf.config.n_vocab}: a draft model must share the target's vocabulary"
        )


def load_draft_model(draft, target, quiet: bool = False):
    """load(draft_model=...): a loaded Model as is, else the model at that path or name, loaded with the target's
    context size and threads; ValueError (naming draft_model) if its vocabulary is not the target's."""
    if hasattr(draft, "transformer"):
        model = draft
    else:
        from .llm import load

        model = load(draft, n_ctx=target.n_ctx, n_threads=target.n_threads, quiet=quiet)
    try:
        check_same_vocabulary(model.transformer, target.transformer)
    except ValueError as e:
        if model is not draft:
            model.close()
        raise ValueError(f"draft_model: {e}") from None
    return model


# ---- drafters ----------------------------------------------------------------------------------------------------


class NgramDrafter:
    """Prompt lookup: the continuation of the latest earlier occurrence of the longest matching suffix n-gram.

    An index (n-gram -> latest start, per n) grows with the history, so a call adds the new tokens' entries (after
    one vectorised comparison of the history with the one indexed) instead of comparing every window of the prompt
    and output with the suffix (0.55 ms a token on a 4,000-token context, now ~10 us). Successive calls normally pass
    one growing sequence; any other history starts the index over."""

    LONG_MATCH = 5  # matches of this many tokens or more are one source of drafts for DraftLength's acceptance counts

    def __init__(self, ngram_max: int = 16, ngram_min: int = 2):
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self._seen = np.zeros(0, np.int64)  # the history the index holds
        self._index: dict[int, dict[tuple, int]] = {}  # n -> {n-gram: latest start s with s + n < len(_seen)}
        self.matched = 0  # the n of the last call's match (0: none)

    @property
    def source(self) -> int:
        """The last call's drafts' source for DraftLength: the n of its match, with every n >= LONG_MATCH as one
        (each n of 5..16 apart would leave each with a few drafts to count, its rate mostly the prior)."""
        return min(self.matched, self.LONG_MATCH)

    def propose(self, history: np.ndarray, k: int) -> np.ndarray:
        """Up to k drafted ids (int64, maybe none) to follow `history` (prompt + output so far)."""
        n_hist = history.shape[0]
        n0 = self._seen.shape[0]
        if n0 > n_hist or not np.array_equal(history[:n0], self._seen):
            self._index, n0 = {}, 0
        self._seen = np.array(history, dtype=np.int64)
        lo = max(0, n0 - self.ngram_max)
        tail = self._seen[lo:].tolist()  # the tokens new windows and the suffix are made of
        for n in range(self.ngram_min, self.ngram_max + 1):
            index = self._index.setdefault(n, {})
            # windows starting at s <= n_hist - 1 - n: occurrences with at least one token after them
            for s in range(max(0, n0 - n), n_hist - n):
                index[tuple(tail[s - lo : s - lo + n])] = s
        for n in range(min(self.ngram_max, n_hist - 1), self.ngram_min - 1, -1):
            s = self._index[n].get(tuple(tail[len(tail) - n :]))
            if s is not None:
                self.matched = n
                return history[s + n : s + n + k].copy()
        self.matched = 0
        return history[:0].copy()


class ModelDrafter:
    """A small model with the target's vocabulary drafts tokens in its own KV cache.

    Greedy targets get greedy drafts; sampling targets get drafts drawn from the draft model's distribution under
    the same sampling parameters (without logits processors, which are the caller's own code and see only the
    target's steps), and that distribution is the q of the acceptance rule.
    """

    def __init__(self, draft_model, target_tf, params: SamplingParams):
        tf = draft_model.transformer
        check_same_vocabulary(tf, target_tf)
        self.model = draft_model
        self.tf = tf
        self.cache = tf.new_cache()
        self.sampler = Sampler(dataclasses.replace(params, logits_processors=()), tf.config.n_vocab)
        self.greedy = params.temperature == 0.0

    def propose(self, history: np.ndarray, k: int, rng) -> tuple[np.ndarray, list]:
        """(k drafted ids, their draft distributions [(ids, probs)] or [] when greedy)."""
        from .runtime import set_threads

        k = min(k, self.cache.n_ctx - history.shape[0])
        if k <= 0:
            return history[:0].copy(), []
        out = np.empty(k, dtype=np.int64)
        dists = []
        hist = np.empty(history.shape[0] + k, dtype=np.int64)
        hist[: history.shape[0]] = history
        n = history.shape[0]
        with self.tf.lock:
            set_threads(self.model.n_threads)
            logits, _ = eval_prompt(self.tf, self.cache, history)
            for j in range(k):
                if self.greedy:
                    token, _ = self.sampler.sample(logits, hist[:n])
                else:
                    ids, probs = self.sampler.distribution(logits, hist[:n])
                    token = int(ids[draw(np.cumsum(probs), rng.random())])
                    dists.append((ids, probs))
                out[j] = hist[n] = token
                n += 1
                if j + 1 < k:
                    logits = self.tf.forward(hist[n - 1 : n], cache=self.cache)
        return out, dists


# ---- draft length --------------------------------------------------------------------------------------------------


class DraftLength:
    """Chooses each pass's draft length from the acceptance rate and the measured cost of passes of m tokens.

    A pass of m tokens is modelled as `one * (1 + a + b * (m - 1))`: `one` the running mean of one-token passes, and
    a (a multi-token pass's fixed extra) and b (each extra row's) fitted to the measured passes of every size by
    least squares with decaying weights, pulled towards a = 0, b = PRIOR_PER_TOKEN by one pseudo-pass each. Two
    numbers shared by all sizes, not a table per size: a size whose only measurement was stretched by a busy machine
    would otherwise look dear forever and never be tried again, and sizes never tried would need a guess. Where
    only short passes have been timed (open-ended text, drafts of one or two tokens), their cost is known and
    longer ones are extrapolated with the prior slope. On SmolLM2-135M and Gemma3-270M at 2 threads an extra row
    costs 0.22-0.36 of a one-token pass at every m from 2 to 11 (the rows share each weight read).
    """

    DECAY = 0.95  # weight of the past in the acceptance counts and the cost fit

    PROBE_EVERY_MAX = 512  # plain steps between probes, at most, while probes keep failing

    PRIOR_PER_TOKEN = 0.25  # cost of an extra row before passes are timed, in one-token passes: on the cheap side
    # of what is measured, so that drafts are tried and from then on measured

    def __init__(self, k_max: int, adaptive: bool, probe_every: int = 0):
        self.k_max, self.adaptive = k_max, adaptive
        self.probe_every = probe_every  # > 0: after this many plain steps draft one token, to keep measuring;
        self._probe_base = probe_every  # doubled after every probe whose token is rejected, back to base when one
        self._probing = False  # is accepted (a draft model that never agrees costs ever less)
        self._plain_steps = 0
        # decayed counts of drafted tokens accepted / rejected, per source of drafts (the n of an n-gram match: on
        # SmolLM2-135M's answers a 2-gram match's next token was right 25-53% of the time, a 4-gram's 77-88%)
        self.accepted: dict[int, float] = {}
        self.rejected: dict[int, float] = {}
        self.one: float | None = None  # mean seconds of a one-token pass (None: none timed yet)
        self._n_one = 0
        # decayed sums over multi-token passes of w, x, r, x*x, x*r, with x = m - 1 and r = extra time / one
        self._sums = np.zeros(5)
        self.fixed, self.per_token = 0.0, self.PRIOR_PER_TOKEN  # a and b, in one-token passes

    def rate(self, source: int = 0) -> float:
        """Per-token acceptance of `source`'s drafts over the recent counts, with a prior of one half-accepted
        draft."""
        accepted = self.accepted.get(source, 0.0)
        return (accepted + 0.5) / (accepted + self.rejected.get(source, 0.0) + 1.0)

    def observe(self, drafted: int, accepted: int, source: int = 0) -> None:
        """A draft of `drafted` tokens from `source` had its first `accepted` accepted (the rest rejected after the
        first miss)."""
        d = self.DECAY
        self.accepted[source] = self.accepted.get(source, 0.0) * d + accepted
        self.rejected[source] = self.rejected.get(source, 0.0) * d + (1 if accepted < drafted else 0)
        if self._probing:
            self._probing = False
            self.probe_every = self._probe_base if accepted else min(2 * self.probe_every, self.PROBE_EVERY_MAX)

    def timed(self, m: int, seconds: float) -> None:
        """A pass of m tokens took `seconds`."""
        if m == 1:  # a running mean whose first samples weigh 1/n, later ones 1 - DECAY
            self._n_one += 1
            w = max(1.0 / self._n_one, 1.0 - self.DECAY)
            self.one = seconds if self.one is None else self.one + (seconds - self.one) * w
            return
        x = m - 1
        if self.one is None:  # no one-token pass timed yet: split this one by the current model
            self.one, self._n_one = seconds / (1.0 + self.fixed + self.per_token * x), 1
        # a stall (a descheduled thread) can stretch a pass many times over; no extra row costs more than a whole
        # one-token pass, so a sample is clipped there and one stall moves the fit by a bounded step
        r = min(max(seconds / self.one - 1.0, 0.0), float(x))
        self._sums = self._sums * self.DECAY + np.array([1.0, x, r, x * x, x * r])
        w, sx, sr, sxx, sxr = self._sums
        lam = 1.0  # the prior's weight: one pseudo-pass for each of a = 0 and b = PRIOR_PER_TOKEN
        det = (w + lam) * (sxx + lam) - sx * sx
        b = ((w + lam) * (sxr + lam * self.PRIOR_PER_TOKEN) - sx * sr) / det
        a = (sr - sx * b) / (w + lam)
        self.fixed, self.per_token = max(a, 0.0), max(b, 0.0)

    def estimate(self, m: int) -> float:
        """Seconds for a pass of m tokens (before any pass is timed, in units of a one-token pass)."""
        one = 1.0 if self.one is None else self.one
        return one if m == 1 else one * (1.0 + self.fixed + self.per_token * (m - 1))

    def choose(self, available: int, source: int = 0) -> int:
        """Tokens to draft this pass, given that `available` can be drafted from `source`."""
        k_top = min(available, self.k_max)
        if not self.adaptive or k_top <= 0:
            return k_top
        a = min(self.rate(source), 0.999)
        best_k, best_speed = 0, 1.0 / self.estimate(1)
        for k in range(1, k_top + 1):
            speed = (1 - a ** (k + 1)) / (1 - a) / self.estimate(k + 1)
            if speed > best_speed:
                best_k, best_speed = k, speed
        if best_k == 0 and self.probe_every:
            self._plain_steps += 1
            if self._plain_steps >= self.probe_every:
                self._plain_steps = 0
                self._probing = True
                return 1
        return best_k


# ---- verification --------------------------------------------------------------------------------------------------


def verify(sampler: Sampler, rows: np.ndarray, history: np.ndarray, n_hist: int, drafts: np.ndarray, dists: list,
           constraint, logprobs) -> tuple[list, int]:  # fmt: skip
    """Accept drafted tokens against the target's rows; return ([(token, logprob, top)], drafts accepted).

    rows: [len(drafts) + 1, n_vocab], row j the target's logits after history[:n_hist] + drafts[:j].
    history: the token buffer, with drafts written at n_hist.. (accepted ones stay, the rest are overwritten).
    dists: the draft distributions [(ids, probs)] per drafted token, or [] for point-mass drafts.
    """
    out = []
    accepted = 0
    greedy = sampler.params.temperature == 0.0
    for j in range(len(drafts) + 1):
        row = rows[j]
        hist = history[: n_hist + j]
        if j == len(drafts):  # every draft accepted: one more token from the last row
            token, logprob = sampler.sample(row, hist, constraint=constraint)
            ok = False
        elif greedy:
            token, logprob = sampler.sample(row, hist, constraint=constraint)
            ok = token == drafts[j]
        else:
            token, logprob, ok = _accept_or_resample(sampler, row, hist, int(drafts[j]), dists[j] if dists else None,
                                                     constraint)  # fmt: skip
        if constraint is not None:
            constraint.advance(token)
        top = None
        if logprobs is not None:
            lp = token_logprobs(row, token, logprobs)
            logprob, top = lp.logprob, lp.top()
        out.append((token, logprob, top))
        if not ok or (constraint is not None and constraint.is_done):
            break
        accepted += 1
    return out, accepted


def _accept_or_resample(sampler: Sampler, row, hist, draft: int, dist, constraint) -> tuple[int, float, bool]:
    """The speculative-sampling rule for one drafted token: (token, log p(token), whether the draft was kept)."""
    ids, probs = sampler.distribution(row, hist, constraint=constraint)  # the target's p, after the whole chain
    where = np.flatnonzero(ids == draft)
    p_draft = float(probs[where[0]]) if where.size else 0.0
    if dist is None:  # point mass: q(draft) = 1
        q_draft = 1.0
    else:
        q_ids, q_probs = dist
        qw = np.flatnonzero(q_ids == draft)
        q_draft = float(q_probs[qw[0]]) if qw.size else 0.0
    u = sampler.rng.random()
    if q_draft > 0.0 and u * q_draft < p_draft:
        return draft, math.log(p_draft), True
    # rejected: draw from max(0, p - q), normalised
    residual = probs.copy()
    if dist is None:
        residual[where] = 0.0
    else:
        q_full = np.zeros(sampler.n_vocab)
        q_full[q_ids] = q_probs
        residual = np.maximum(0.0, probs - q_full[ids])
    if not residual.sum() > 0.0:  # p == q up to rounding: p itself is the residual's limit
        residual = probs
    j = draw(np.cumsum(residual), sampler.rng.random())
    return int(ids[j]), math.log(float(probs[j])), False


# ---- the generation loop -------------------------------------------------------------------------------------------


def speculative_tokens(prompt_ids, tf, cache, sampler: Sampler, max_tokens: int, stats, spec: Speculation,
                       cancel=None, n_threads=None, constraint=None, logprobs=None):  # fmt: skip
    """generate.generate_tokens with speculation: the same (token, logprob, top_logprobs) stream (greedy: the same
    tokens), 1..k+1 tokens per forward pass. stats.drafted_tokens / accepted_tokens count the drafts."""
    from .runtime import set_threads

    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    n_prompt = prompt_ids.shape[0]
    check_prompt_fits(n_prompt, cache.n_ctx)
    ngram = spec.draft == "ngram"
    drafter = NgramDrafter(spec.ngram_max, spec.ngram_min) if ngram else ModelDrafter(spec.draft, tf, sampler.params)
    # n-gram drafts found but not used are checked for free (`shadow` below); a draft model's are not, so with
    # it a plain run is interrupted now and then by a one-token draft, and its cost counts in the pass's time
    length = DraftLength(spec.draft_tokens, spec.adaptive, probe_every=0 if ngram else 8)
    t_start = time.perf_counter()
    # prompt + generated ids (+ room for a pass's drafts past max_tokens' end)
    history = np.empty(n_prompt + max_tokens + spec.draft_tokens + 1, dtype=np.int64)
    history[:n_prompt] = prompt_ids
    n_hist = n_prompt
    stats.prompt_tokens = n_prompt

    with tf.lock:
        logits = prefill(tf, cache, prompt_ids, stats, t_start, cancel, n_threads)
        if logits is None:
            return
        batch, _ = verify(sampler, logits[None, :], history, n_hist, history[:0], [], constraint, logprobs)
        version = cache.version
    if max_tokens <= 0:
        return
    i = 0
    t_first = 0.0
    shadow = None  # a draft found but not used: checked against the token that comes
    source = 0  # where the drafts come from (DraftLength.rate): NgramDrafter.source; 0 for a draft model
    while True:
        for token, logprob, top in batch:
            if shadow is not None:
                length.observe(1, int(shadow == token), source)
                shadow = None
            history[n_hist] = token
            n_hist += 1
            i += 1
            stats.generated_tokens = i
            now = time.perf_counter()
            if i == 1:
                t_first = now
                stats.ttft_s = now - t_start
            else:
                stats.generation_tps = (i - 1) / (now - t_first)
            yield token, logprob, top
            if _is_cancelled(cancel):
                return
        if i >= max_tokens or n_hist > cache.n_ctx or _is_cancelled(cancel):
            return
        if constraint is not None and constraint.is_done:
            return
        # room: tokens still wanted after the next one, and KV slots for [last, drafts]
        room = min(max_tokens - i - 1, cache.n_ctx - n_hist)
        dists: list = []
        t0 = time.perf_counter()
        if room <= 0:
            drafts = history[:0]
        elif ngram:
            found = drafter.propose(history[:n_hist], min(room, spec.draft_tokens))
            source = drafter.source
            k = length.choose(found.shape[0], source)
            drafts = found[:k]
            if k == 0 and found.shape[0]:
                shadow = int(found[0])
        else:
            k = length.choose(room)
            drafts, dists = drafter.propose(history[:n_hist], k, sampler.rng) if k else (history[:0], [])
        k = drafts.shape[0]
        history[n_hist : n_hist + k] = drafts
        with tf.lock:
            if n_threads is not None:
                set_threads(n_threads)
            if cache.version != version or cache.n_past != n_hist - 1:  # somebody else used the cache
                eval_prompt(tf, cache, history[: n_hist - 1])
            if k == 0:
                rows = tf.forward(history[n_hist - 1 : n_hist], cache=cache)[None, :]
            else:
                rows = tf.forward(history[n_hist - 1 : n_hist + k], all_logits=True, cache=cache)
            batch, n_acc = verify(sampler, rows, history, n_hist, drafts, dists, constraint, logprobs)
            if k:
                cache.truncate(n_hist + n_acc)  # keep [last, accepted drafts]; the new last token is not evaluated
                length.observe(k, n_acc, source)
                stats.drafted_tokens += k
                stats.accepted_tokens += n_acc
            length.timed(k + 1, time.perf_counter() - t0)
            version = cache.version
