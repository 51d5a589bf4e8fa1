"""Sampling: logits [n_vocab] + token history -> (token, log-probability).

The chain, in the order of llama.cpp's default sampler sequence (common/common.h `samplers`, built by
common/sampling.cpp with the logit bias first and the `dist` sampler last; DRY, top-n-sigma, typical-p and XTC are
off by default there and not implemented here):

    logit_bias -> penalties -> logits_processors -> constraint -> top_k -> top_p -> min_p -> temperature -> sample

- logit_bias: `logit += bias` per token id; -inf forbids a token, a large value (e.g. +100) forces it.
- penalties over the last `penalty_last_n` history tokens (-1 = the whole history, 0 = off), as
  llama_sampler_penalties_apply (src/llama-sampler.cpp): a token seen `count > 0` times gets
  `logit = logit / repetition_penalty` if logit > 0 else `logit * repetition_penalty`, then
  `logit -= count * frequency_penalty + presence_penalty` (OpenAI's frequency/presence semantics).
- logits_processors: user callables `f(token_ids, logits) -> logits`, in order (mlx-lm's signature).
- constraint (a `ggufrun.grammar.Constraint`, passed per call): sets the tokens its grammar does not allow next to
  -inf. llama.cpp applies the grammar before the chain (common_sampler_sample with grammar_first); bias and
  penalties only shift logits, so what matters is that the mask comes before the filters: top-k/top-p/min-p see
  only allowed tokens and greedy takes the best allowed token. After the processors, none can re-allow a token.
- top_k: keep the k largest logits (0 = off); ties at the k-th value keep the lowest token ids.
- top_p: softmax over what is left, keep the smallest most-probable prefix whose cumulative probability reaches
  top_p, including the token that crosses it (1 = off).
- min_p: keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p) (0 = off).
- temperature: divide the kept logits by it, softmax, draw one token by inverse CDF with `rng.random()`.
  temperature 0 is greedy: the argmax after bias/penalties/processors (no random number is drawn); like
  llama.cpp, the filters before temperature do not change the argmax, so they are skipped.

As in llama.cpp, top_p and min_p see the distribution *before* temperature; temperature only reshapes the kept
set. Same seed + same inputs => same tokens, in any process: the draw depends only on the generator state and on
a candidate order that is fully determined by the logits (logit descending, then token id). seed -1 (llama.cpp's
LLAMA_DEFAULT_SEED convention) or None draws fresh entropy.

Reported log-probabilities (token_logprobs; OpenAI `logprobs`/`top_logprobs`, llama-server `n_probs`) are those
of the model's own distribution: the log-softmax of the raw logits, before logit_bias, penalties, the constraint,
the filters and temperature. This is what llama-server reports by default (server `post_sampling_probs: false`
takes `llama_get_logits_ith` through a plain softmax), and it does not change with the sampling settings. The
sampled token's entry comes from the same distribution, so it is <= the best alternative's and equal to its own
entry whenever it is among the top k.

>>> params = SamplingParams.preset("chat", seed=1)
>>> sampler = Sampler(params, n_vocab=len(logits))
>>> token, logprob = sampler.sample(logits, history=prompt_ids)
>>> token_logprobs(logits, token, top_k=5)   # OpenAI-style logprob + top_logprobs of the raw logits
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .grammar import Constraint

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]

# Named parameter sets from common practice; everything not named keeps the SamplingParams default.
PRESETS: dict[str, dict] = {
    "code": {"temperature": 0.0},  # exact, reproducible completions
    "chat": {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.05},  # varied but on topic
    "creative": {"temperature": 1.0, "top_p": 0.95, "repetition_penalty": 1.1},  # wide spread, fewer loops
    "agent": {"temperature": 0.0},  # tool calls and plans must not wander
}

# top_p without top_k: sort only a prefix of this many tokens, 16x longer while it does not reach top_p
# (llama.cpp's top-p also tries 256 first); the nucleus of a trained model almost always fits in the first.
_TOP_P_PREFIX = 256


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. Defaults are llama-cpp-python's `create_completion` defaults.

    >>> SamplingParams(temperature=0.7, top_p=0.9, seed=1)
    >>> SamplingParams.preset("code")           # greedy
    >>> SamplingParams.preset("chat", seed=3)   # preset + overrides
    """

    temperature: float = 0.8  # >= 0; 0 = greedy
    top_k: int = 40  # >= 0; 0 = off
    top_p: float = 0.95  # (0, 1]; 1 = off
    min_p: float = 0.05  # [0, 1]; 0 = off
    repetition_penalty: float = 1.0  # > 0; 1 = off; > 1 discourages repeats
    frequency_penalty: float = 0.0  # any; subtracted once per occurrence
    presence_penalty: float = 0.0  # any; subtracted once if present
    penalty_last_n: int = 64  # >= -1; history window for the penalties; -1 = whole history, 0 = off
    logit_bias: Mapping[int, float] | None = None  # {token id: bias}; -inf forbids the token
    seed: int | None = None  # >= 0; None or -1 = fresh entropy
    logits_processors: Sequence[LogitsProcessor] = field(default=())  # f(token_ids, logits) -> logits

    def __post_init__(self):
        def number(name: str, ok: Callable[[float], bool], allowed: str) -> None:
            v = getattr(self, name)
            if not _is_number(v) or not math.isfinite(v) or not ok(float(v)):
                raise ValueError(f"{name} must be {allowed}, got {v!r}")
            object.__setattr__(self, name, float(v))

        def integer(name: str, ok: Callable[[int], bool], allowed: str) -> None:
            v = getattr(self, name)
            if not _is_int(v) or not ok(int(v)):
                raise ValueError(f"{name} must be {allowed}, got {v!r}")
            object.__setattr__(self, name, int(v))

        number("temperature", lambda v: v >= 0, "a finite number >= 0 (0 = greedy)")
        integer("top_k", lambda v: v >= 0, "an integer >= 0 (0 = off)")
        number("top_p", lambda v: 0 < v <= 1, "a number in (0, 1] (1 = off)")
        number("min_p", lambda v: 0 <= v <= 1, "a number in [0, 1] (0 = off)")
        number("repetition_penalty", lambda v: v > 0, "a finite number > 0 (1 = off)")
        number("frequency_penalty", lambda v: True, "a finite number")
        number("presence_penalty", lambda v: True, "a finite number")
        integer("penalty_last_n", lambda v: v >= -1, "an integer >= -1 (-1 = whole history, 0 = off)")
        if self.seed is not None:
            integer("seed", lambda v: v >= -1, "None, -1 (random) or an integer >= 0")
            if self.seed == -1:
                object.__setattr__(self, "seed", None)

        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise ValueError(f"logit_bias must be a mapping {{token id: bias}}, got {self.logit_bias!r}")
            bias = {}
            for k, v in self.logit_bias.items():
                if not _is_int(k) or k < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {k!r}")
                if not _is_number(v) or math.isnan(v) or v == math.inf:
                    raise ValueError(f"logit_bias[{k}] must be a finite number or -inf, got {v!r}")
                bias[int(k)] = float(v)
            object.__setattr__(self, "logit_bias", bias)  # a copy: later edits by the caller do not leak in

        procs = self.logits_processors
        if callable(procs) or not isinstance(procs, Sequence):
            raise ValueError(f"logits_processors must be a sequence of callables, got {procs!r}")
        for i, f in enumerate(procs):
            if not callable(f):
                raise ValueError(f"logits_processors[{i}] must be callable f(token_ids, logits), got {f!r}")
        object.__setattr__(self, "logits_processors", tuple(procs))

    @classmethod
    def preset(cls, name: str, **overrides) -> SamplingParams:
        """A preset from PRESETS (code, chat, creative, agent), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @property
    def penalties_on(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )


# --- the steps, as small functions on arrays -------------------------------------------------------------------


def apply_logit_bias(logits: np.ndarray, ids: np.ndarray, biases: np.ndarray) -> None:
    """logits[ids] += biases, in place. ids are distinct."""
    logits[ids] += biases


def apply_penalties(
    logits: np.ndarray, window: np.ndarray, repetition: float, frequency: float, presence: float
) -> None:
    """Penalise, in place, every token that occurs in `window` (the last penalty_last_n history tokens).

    Float32 arithmetic as llama_sampler_penalties_apply (src/llama-sampler.cpp): dividing a negative logit would
    make the token *more* likely, so non-positive logits are multiplied instead.
    """
    ids, counts = np.unique(window, return_counts=True)  # [n_distinct]
    x = logits[ids]  # float32 [n_distinct]
    rep = np.float32(repetition)
    x = np.where(x <= 0, x * rep, x / rep)
    x -= counts.astype(np.float32) * np.float32(frequency) + np.float32(presence)
    logits[ids] = x


# top_k reads a strided sample of 1/_TOP_K_STRIDE of the logits first (when it holds >= 4k of them) to narrow
# the candidates cheaply; see top_k_ids.
_TOP_K_STRIDE = 16


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, ordered by logit descending then id ascending. int64 [min(k, n)].

    The k-th largest value of any subset is <= the k-th largest of the whole array, so the k-th largest of a
    strided sample is a safe lower bound: every token at or above it (the true top k plus ~stride * k others)
    becomes a candidate, and only the candidates are partitioned and sorted. This is exact, and about 3x faster
    than partitioning the whole vocabulary. Of several tokens tied at the k-th value the lowest ids are kept, so
    the set never depends on the partition's internal order.
    """
    n = logits.shape[0]
    if k >= n:
        ids = np.arange(n)
    else:
        ids = None
        if n >= 4 * _TOP_K_STRIDE * k:
            sample = np.partition(logits[::_TOP_K_STRIDE], -k)  # [n / stride]
            ids = np.flatnonzero(logits >= sample[-k])  # [>= k] candidates, ascending
        if ids is None or len(ids) > n // 2:  # no sample, or it did not narrow much (many ties)
            ids = np.arange(n)
        vals = logits[ids]
        ids = ids[vals >= np.partition(vals, -k)[-k]]  # [>= k]: ties at the k-th value all come in
    order = np.argsort(-logits[ids], kind="stable")  # ids ascend, so a stable sort breaks ties by id
    return ids[order[:k]]


def top_p_count(sorted_probs: np.ndarray, p: float) -> int:
    """How many of the probabilities (sorted descending) form the top-p nucleus: up to and including the one at
    which the cumulative sum reaches p; all of them if it never does."""
    cum = np.cumsum(sorted_probs)
    return min(int(np.searchsorted(cum, p, side="left")) + 1, len(sorted_probs))


def min_p_threshold(max_logit: float, p: float) -> np.float32:
    """Smallest logit kept by min_p: p_i >= p * p_max  <=>  logit_i >= max_logit + log(p) (float32, as llama.cpp)."""
    return np.float32(max_logit) + np.float32(math.log(p))


def softmax(x: np.ndarray) -> np.ndarray:
    """float64 probabilities of logits x (any -inf gets 0)."""
    w = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return w / w.sum()


def draw(weights_cdf: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the index i with cdf[i-1] <= u * total < cdf[i]; zero-weight entries are never chosen."""
    j = int(np.searchsorted(weights_cdf, u * weights_cdf[-1], side="right"))
    if j == len(weights_cdf):  # u * total rounded up to total: take the last entry that has weight
        j = int(np.searchsorted(weights_cdf, weights_cdf[-1], side="left"))
    return j


# --- the chain ----------------------------------------------------------------------------------------------------


class Sampler:
    """Picks tokens from logits with SamplingParams; owns its random generator and work buffers.

    >>> sampler = Sampler(SamplingParams(temperature=0.7, seed=1), n_vocab=49152)
    >>> token, logprob = sampler.sample(logits, history=ids)   # logits: float32 [49152], left unchanged
    """

    def __init__(self, params: SamplingParams, n_vocab: int):
        if not _is_int(n_vocab) or n_vocab < 1:
            raise ValueError(f"n_vocab must be an integer >= 1, got {n_vocab!r}")
        self.params = params
        self.n_vocab = n_vocab = int(n_vocab)
        bias = params.logit_bias or {}
        for tid in bias:
            if tid >= n_vocab:
                raise ValueError(f"logit_bias token id {tid} is outside the vocabulary [0, {n_vocab})")
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))  # [n_bias]
        self._bias_vals = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))  # [n_bias]
        self._logits = np.empty(n_vocab, dtype=np.float32)  # [n_vocab] the caller's logits, then each step's
        self._scratch = np.empty(n_vocab, dtype=np.float32)  # [n_vocab] exp work space
        self._cdf = None  # float64 [n_vocab], made when first drawing from the whole vocabulary
        self.reset()

    def greedy_as_is(self, history: Sequence[int] | np.ndarray = ()) -> bool:
        """Whether sample(logits, history) with no constraint is the argmax of the logits with at most this
        sampler's logit_bias added (temperature 0, no penalty that history can change, no logits processor): what
        sample_greedy_rows gives."""
        p = self.params
        return p.temperature == 0.0 and not p.logits_processors and not (p.penalties_on and len(history))

    def add_bias(self, x: np.ndarray) -> None:
        """x += this sampler's logit_bias, in place (what sample does to its copy of the logits first)."""
        if len(self._bias_ids):
            apply_logit_bias(x, self._bias_ids, self._bias_vals)

    def reset(self, seed: int | None = None) -> None:
        """Restart the random generator: from `seed`, else from params.seed (None -> fresh entropy); seed -1 is
        fresh entropy too."""
        if seed is not None and (not _is_int(seed) or seed < -1):
            raise ValueError(f"seed must be None, -1 (random) or an integer >= 0, got {seed!r}")
        if seed == -1:
            self.rng = np.random.default_rng()
            return
        self.rng = np.random.default_rng(self.params.seed if seed is None else int(seed))

    def sample(
        self,
        logits: np.ndarray,
        history: Sequence[int] | np.ndarray = (),
        *,
        constraint: Constraint | None = None,
        logprob: bool = True,
    ) -> tuple[int, float | None]:
        """(token, log-probability) for one step. `logits` float [n_vocab] is not modified; `history` is every
        token so far (prompt + generated), read for the penalties and passed to the logits processors.
        `constraint` (ggufrun.grammar.Constraint) masks the tokens its grammar does not allow next; the caller then
        calls `constraint.advance(token)`.

        The log-probability is under the distribution the token was drawn from (after every filter and the
        temperature, renormalised); for greedy, the log-softmax of the biased, penalised, processed logits. With
        logprob=False a greedy step gives None instead and skips the normaliser, one exp per vocabulary entry (a
        sampled step's costs nothing extra: its draw needs the sum).
        """
        p = self.params
        x, best = self._prepare(logits, history, constraint)  # float32 [n_vocab], its argmax
        m = float(x[best])
        if p.temperature == 0.0:
            if not logprob:
                return best, None
            from .model.kernels import exp_total  # Numba: loaded with the first model, not by `import ggufrun`

            return best, -math.log(exp_total(x, np.float32(m)))

        ids = self._filter(x, m)  # int64 [n_kept], or None = the whole vocabulary
        inv_t = 1.0 / p.temperature
        if ids is None:
            s = self._scratch
            np.subtract(x, np.float32(m), out=s)
            s *= np.float32(inv_t)
            np.exp(s, out=s)
            if self._cdf is None:
                self._cdf = np.empty(self.n_vocab, dtype=np.float64)
            cdf = np.cumsum(s, dtype=np.float64, out=self._cdf)
            j = draw(cdf, self.rng.random())
            return j, (float(x[j]) - m) * inv_t - math.log(cdf[-1])
        z = (x[ids].astype(np.float64) - m) * inv_t  # [n_kept] <= 0
        cdf = np.cumsum(np.exp(z))
        j = draw(cdf, self.rng.random())
        return int(ids[j]), float(z[j]) - math.log(cdf[-1])

    def distribution(
        self, logits: np.ndarray, history: Sequence[int] | np.ndarray = (), *, constraint: Constraint | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [n_kept], probs float64 [n_kept]): the distribution `sample` draws from for these inputs,
        after every filter and the temperature; for greedy, the argmax with probability 1. Draws nothing.

        >>> ids, probs = sampler.distribution(logits)   # e.g. the top alternatives for an API's top_logprobs
        """
        x, best = self._prepare(logits, history, constraint)
        if self.params.temperature == 0.0:
            return np.array([best], dtype=np.int64), np.ones(1)
        ids = self._filter(x, float(x[best]))
        if ids is None:
            ids = np.arange(self.n_vocab)
        z = (x[ids].astype(np.float64) - x[best]) / self.params.temperature
        w = np.exp(z)
        return ids, w / w.sum()

    def _prepare(self, logits: np.ndarray, history, constraint) -> tuple[np.ndarray, int]:
        """Copy logits into the work buffer, apply logit_bias, penalties, the logits processors and the constraint;
        return the buffer and its argmax, checked finite."""
        p = self.params
        if getattr(logits, "shape", None) != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},) (n_vocab), got {np.shape(logits)}")
        x = self._logits
        np.copyto(x, logits)
        self.add_bias(x)
        if p.penalties_on and len(history):
            window = history if p.penalty_last_n < 0 else history[-p.penalty_last_n :]
            window = np.asarray(window, dtype=np.int64)  # [<= penalty_last_n]
            lo, hi = int(window.min()), int(window.max())
            if lo < 0 or hi >= self.n_vocab:
                bad = lo if lo < 0 else hi
                raise ValueError(f"history holds token id {bad}, outside the vocabulary [0, {self.n_vocab})")
            apply_penalties(x, window, p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        if p.logits_processors:
            ids = np.asarray(history, dtype=np.int64)
            for i, f in enumerate(p.logits_processors):
                out = f(ids, x)
                if out is not x:
                    if np.shape(out) != (self.n_vocab,):
                        raise ValueError(
                            f"logits_processors[{i}] returned shape {np.shape(out)}, expected ({self.n_vocab},)"
                        )
                    np.copyto(x, out)
        if constraint is not None:
            constraint.apply(x)
        best = int(np.argmax(x))  # the first of equal maxima (as llama.cpp's greedy); NaN counts as a maximum
        m = float(x[best])
        if not math.isfinite(m):
            what = "NaN" if math.isnan(m) else "+inf" if m > 0 else "-inf everywhere"
            raise ValueError(
                f"logits are {what} after logit_bias, penalties, logits_processors and constraint (token {best}); "
                f"expected finite values with at least one above -inf"
            )
        return x, best

    def _filter(self, x: np.ndarray, m: float) -> np.ndarray | None:
        """top_k -> top_p -> min_p on logits x (max m): the kept ids in a fixed order, or None if all are kept."""
        p = self.params
        n = self.n_vocab
        ids = None
        if 0 < p.top_k < n:
            ids = top_k_ids(x, p.top_k)
            if p.top_p < 1.0:
                ids = ids[: top_p_count(softmax(x[ids]), p.top_p)]
        elif p.top_p < 1.0:
            # Softmax over the whole vocabulary; the nucleus is a prefix of the sorted order, so sort only as
            # far as needed: a short prefix first, everything if that does not reach top_p.
            s = self._scratch
            np.subtract(x, np.float32(m), out=s)
            np.exp(s, out=s)
            total = float(np.sum(s))  # float32 pairwise sum: relative error ~1e-7 * log2(n)
            k = _TOP_P_PREFIX
            while True:
                ids = top_k_ids(x, k)
                probs = np.exp(x[ids].astype(np.float64) - m) / total
                if probs.sum() >= p.top_p or k >= n:
                    break
                k *= 16
            ids = ids[: top_p_count(probs, p.top_p)]
        if p.min_p > 0.0:
            t = min_p_threshold(m, p.min_p)  # the max logit is never filtered out, so m is still the max
            if ids is None:
                ids = np.flatnonzero(x >= t)  # ascending ids: any fixed order will do for the draw
                return None if len(ids) == n else ids
            ids = ids[x[ids] >= t]
        if ids is not None:
            ids = ids[x[ids] > -np.inf]  # -inf survives top_k when fewer than k logits are finite
        return ids


def sample_greedy_rows(
    logits: np.ndarray, rows: np.ndarray, samplers: Sequence[Sampler], logprob: Sequence[bool] | None = None
) -> list[tuple[int, float | None] | None]:
    """Sampler.sample's (token, log-probability) for rows `rows` (int64) of logits float32 [M, n_vocab], the row of
    samplers[i] at rows[i], each greedy as is (Sampler.greedy_as_is): each row's logit_bias added in place, then all
    rows at once on the compute threads (kernels.greedy_rows: the same bits); None for a row whose logits are not
    finite: its sampler, given the row as it is left, raises the error it raises alone (a finite bias added again makes
    no value that is not finite finite). Those rows keep the biases added. logprob[i] False: that row's
    log-probability is None, as Sampler.sample(..., logprob=False) gives (default: every row's)."""
    from .model.kernels import greedy_rows  # Numba: loaded with the first model, not by `import ggufrun`
    from .runtime import on_compute_thread

    for i, sampler in zip(rows.tolist(), samplers):
        sampler.add_bias(logits[i])
    want = np.ones(len(rows), dtype=np.uint8) if logprob is None else np.array(logprob, dtype=np.uint8)
    best, sums = np.empty(len(rows), dtype=np.int64), np.empty(len(rows), dtype=np.float64)
    on_compute_thread(greedy_rows, logits, rows, want, best, sums)  # the thread that starts every parallel region
    return [((int(b), -math.log(t) if w else None) if math.isfinite(t) else None) for b, t, w in zip(best, sums, want)]


# --- reported log-probabilities -----------------------------------------------------------------------------------

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprobs:
    """A token's log-probability and the top alternatives, under the model's raw distribution.

    top_ids int64 [k] and top_logprobs float64 [k] are sorted by log-probability descending (ties: lower id
    first); every value is <= 0.
    """

    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray

    def top(self) -> list[tuple[int, float]]:
        """[(token id, logprob), ...] best first."""
        return [(int(i), float(v)) for i, v in zip(self.top_ids, self.top_logprobs)]


def token_logprobs(logits: np.ndarray, token: int, top_k: int = 0) -> TokenLogprobs:
    """log-softmax of the raw `logits` (float [n_vocab], not modified) at `token`, and its `top_k` (0..20) best
    entries: what OpenAI's `logprobs`/`top_logprobs` and llama-server's `n_probs` report (see the module docstring).

    One pass for the log-normaliser and an exact partial selection for the top k (top_k_ids), never a full sort.

    >>> lp = token_logprobs(logits, token, top_k=5)
    >>> lp.logprob, lp.top()
    """
    if not _is_int(top_k) or not 0 <= top_k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_k!r}")
    x = np.asarray(logits)
    if x.ndim != 1 or x.shape[0] == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    if not _is_int(token) or not 0 <= token < x.shape[0]:
        raise ValueError(f"token must be an id in [0, {x.shape[0]}), got {token!r}")
    m = float(np.max(x))
    if not math.isfinite(m):
        raise ValueError(f"logits must be finite with at least one above -inf to report logprobs, max is {m}")
    w = np.exp(x - np.float32(m), dtype=np.float32)  # float32 [n_vocab] in (0, 1]
    log_z = m + math.log(float(np.sum(w, dtype=np.float64)))
    ids = top_k_ids(x, int(top_k)) if top_k else np.zeros(0, dtype=np.int64)
    return TokenLogprobs(
        token=int(token),
        logprob=min(0.0, float(x[token]) - log_z),
        top_ids=ids.astype(np.int64),
        top_logprobs=np.minimum(0.0, x[ids].astype(np.float64) - log_z),
    )
