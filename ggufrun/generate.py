"""Token generation: prompt -> prefill (with prefix reuse) -> sample/decode loop -> streamed text chunks.

Three layers, as in mlx-lm's generate.py (`generate_step(prompt, model, prompt_cache=...)`):
    generate_tokens(prompt, transformer, cache, sampler, ...)
                          yields (token, logprob) pairs; the model does work only when the next pair is asked for,
                          so breaking out of the loop (or .close() on the generator) stops all work at once.
    stream(prompt, transformer, cache, tokenizer, params, ...)
                          yields Chunk objects: UTF-8-safe text deltas, stop strings held back and trimmed,
                          finish_reason and stats on the last chunk.
    Model.complete(...)   joins the text (see llm.py).
The loop works on a model.Transformer and a model.KVCache (the one record of which token ids are cached), not on
the user-facing Model, so it runs on any model file, tokenizer or not.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import ContextOverflowError
from .sampling import Sampler, SamplingParams, token_logprobs
from .tokenizer import StreamingDetokenizer

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"
FINISH_TOOL_CALLS = "tool_calls"


@dataclass
class GenerationStats:
    """Figures for one request; carried by the last chunk."""

    prompt_tokens: int = 0  # tokens in the prompt
    cached_tokens: int = 0  # prompt tokens whose KV was reused from the previous request
    generated_tokens: int = 0  # tokens sampled (an end-of-generation token counts)
    ttft_s: float = 0.0  # request start -> first token sampled
    prompt_tps: float = 0.0  # prompt tokens evaluated per second of prefill
    generation_tps: float = 0.0  # decode steps per second after the first token
    peak_rss_mb: float = 0.0  # process peak resident memory so far
    drafted_tokens: int = 0  # speculative decoding: tokens drafted and verified
    accepted_tokens: int = 0  # speculative decoding: drafted tokens the model accepted

    def summary(self) -> str:
        spec = f", drafted {self.drafted_tokens} (accepted {self.accepted_tokens})" if self.drafted_tokens else ""
        return (
            f"{self.prompt_tokens} prompt tokens ({self.cached_tokens} cached), "
            f"{self.generated_tokens} generated, TTFT {self.ttft_s:.2f} s, "
            f"prompt {self.prompt_tps:.1f} tok/s, generation {self.generation_tps:.1f} tok/s, "
            f"peak RSS {self.peak_rss_mb:.0f} MB{spec}"
        )


@dataclass
class Chunk:
    """One step of a streamed generation.

    text:          new text, never part of a UTF-8 character, never part of a stop string (may be "")
    token:         the token sampled at this step (None on a closing chunk that sampled nothing)
    logprob:       its log-probability under the distribution it was sampled from; when the caller asked for
                   `logprobs=k`, under the model's raw distribution instead (log-softmax of the logits, before
                   bias, penalties and filters: what OpenAI's API reports); None from a BatchEngine request
                   submitted with token_logprob=False
    finish_reason: None until the last chunk, then "stop" | "length" | "cancelled" | "tool_calls"
    stats:         on the last chunk only
    top_logprobs:  with `logprobs=k`: the k most likely tokens as (id, raw log-probability, bytes), best first
    token_bytes:   with `logprobs=k`: the sampled token's bytes (a token may hold part of a UTF-8 character)
    tool_calls:    chat with tools, last chunk: the calls parsed from the reply, as OpenAI `tool_calls`
    content:       chat with tools, last chunk: the reply's text without the tool-call markup
    """

    text: str
    token: int | None = None
    logprob: float | None = None
    finish_reason: str | None = None
    stats: GenerationStats | None = field(default=None, repr=False)
    top_logprobs: list[tuple[int, float, bytes]] | None = None
    token_bytes: bytes | None = None
    tool_calls: list[dict] | None = None
    content: str | None = None


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def _is_cancelled(cancel) -> bool:
    if cancel is None:
        return False
    if hasattr(cancel, "is_set"):
        return cancel.is_set()
    return bool(cancel())


class StopMatcher:
    """Holds back text that could still be the start of a stop string; trims at a match.

    Text is released only once no stop string can begin inside it, so a stop string split across tokens never leaks.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string matched)."""
        if not self.stops:
            return text, False
        buf = self.held + text
        hit = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if hit >= 0:
            self.held = ""
            return buf[:hit], True
        keep = 0
        for s in self.stops:
            # longest suffix of buf that is a proper prefix of s
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


class ReplyText:
    """Sampled tokens -> the reply's text: the streaming detokenizer, stop strings held back and trimmed, and the
    end-of-generation ids. One per generation; stream() and the batching engine both use it.

    push(token, last, complete) returns (text to emit, finish reason or None while the reply goes on); close()
    returns what is still held back when a reply ends early (cancelled, or the token loop ran out).
    """

    def __init__(self, tokenizer, stop=None, skip_special: bool = True):
        self.detok = StreamingDetokenizer(tokenizer, skip_special=skip_special) if tokenizer.model != "none" else None
        self.stops = StopMatcher(check_stop(stop))
        self.eog = tokenizer.eog_ids

    def push(self, token: int, last: bool = False, complete: bool = False) -> tuple[str, str | None]:
        """last: the token budget is spent; complete: the output constraint is done (both end the reply)."""
        if token in self.eog:
            return self.close(), FINISH_STOP
        text, hit = self.stops.push(self.detok.add_token(token) if self.detok else "")
        if hit:
            return text, FINISH_STOP
        if last or complete:
            tail, hit = self.stops.push(self.detok.finalize() if self.detok else "")
            reason = FINISH_STOP if hit or complete else FINISH_LENGTH
            return text + tail + ("" if hit else self.stops.flush()), reason
        return text, None

    def close(self) -> str:
        tail, _ = self.stops.push(self.detok.finalize() if self.detok else "")
        return tail + self.stops.flush()


def check_stop(stop) -> list[str]:
    """stop: None, a string, or a sequence of strings (OpenAI's `stop`); anything else is a TypeError naming it."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")


def token_ids(ids, n_vocab: int, name: str = "prompt") -> np.ndarray:
    """`ids` (a sequence of integers, or a 1-D integer NumPy array) as int64 [n], every id in [0, n_vocab). Anything
    else is an error naming `name`, never truncated or coerced: a TypeError for text, floats, bools or other objects,
    a ValueError for an id outside the vocabulary."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(f"{name} must be a 1-D sequence of integer token ids, got an array of {ids.dtype} "
                            f"{ids.shape}")  # fmt: skip
        out = ids[(ids < 0) | (ids >= n_vocab)]
        first = int(out[0]) if out.size else None
    else:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"{name} must be a sequence of integer token ids, got {type(ids).__name__}")
        ids = list(ids)
        bad = next((repr(i) for i in ids if not isinstance(i, (int, np.integer)) or isinstance(i, bool)), None)
        if bad is not None:
            raise TypeError(f"{name} must be a sequence of integer token ids, got {bad}")
        first = next((int(i) for i in ids if not 0 <= i < n_vocab), None)
    if first is not None:
        raise ValueError(f"{name}: token id {first} is outside the vocabulary [0, {n_vocab})")
    return np.asarray(ids, dtype=np.int64)


def check_prompt_fits(n_prompt: int, n_ctx: int) -> None:
    """A prompt needs at least one token and one free KV slot beyond itself to generate from."""
    if n_prompt == 0:
        raise ValueError("prompt is empty: give at least one token (this model adds no BOS token)")
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"prompt has {n_prompt} tokens but the context holds {n_ctx} (n_ctx) and at least one more is "
            f"needed to generate; load the model with a larger n_ctx or shorten the prompt"
        )


def eval_prompt(tf, cache, ids: np.ndarray, cancel=None) -> tuple[np.ndarray | None, int]:
    """Make `cache` hold `ids` and return (logits after the last id, positions reused).

    The cache keeps its longest prefix shared with `ids` (prefix reuse) and evaluates the rest in n_batch chunks;
    at least the last id is evaluated, so that there are logits. Returns (None, kept) if `cancel` fired between
    chunks. The logits are the model's buffer: the caller holds tf.lock until it has read them.
    """
    n = ids.shape[0]
    n_keep = min(cache.common_prefix(ids), n - 1)
    cache.truncate(n_keep)
    logits = None
    for start in range(n_keep, n, tf.n_batch):
        if _is_cancelled(cancel):
            return None, n_keep
        logits = tf.forward(ids[start : start + tf.n_batch], cache=cache)
    return logits, n_keep


def prefill(tf, cache, prompt_ids: np.ndarray, stats: GenerationStats, t_start: float, cancel=None,
            n_threads: int | None = None) -> np.ndarray | None:  # fmt: skip
    """A generation's first step, with tf.lock held by the caller (the logits are the model's buffer): the thread
    count, the prompt evaluated with prefix reuse (eval_prompt), stats.cached_tokens and prompt_tps. Returns the
    logits after the prompt, or None if `cancel` fired."""
    from .runtime import set_threads

    if n_threads is not None:
        set_threads(n_threads)
    logits, stats.cached_tokens = eval_prompt(tf, cache, prompt_ids, cancel)
    if logits is not None:
        t_prefill = time.perf_counter() - t_start
        stats.prompt_tps = (prompt_ids.shape[0] - stats.cached_tokens) / t_prefill if t_prefill > 0 else 0.0
    return logits


def generate_tokens(
    prompt_ids: Sequence[int],
    tf,
    cache,
    sampler: Sampler,
    max_tokens: int,
    stats: GenerationStats,
    cancel=None,
    n_threads: int | None = None,
    constraint=None,
    logprobs: int | None = None,
    speculative=None,
) -> Iterator[tuple[int, float, list[tuple[int, float]] | None]]:
    """Yield (token, logprob, top_logprobs) from the model `tf` (a model.Transformer) appending to `cache` (a
    model.KVCache), until the caller stops asking, max_tokens, the context is full, or `constraint` is done.

    constraint: a grammar.Constraint that masks each step's logits (after bias and penalties, before the filters)
    and advances with every sampled token. logprobs: None, or k in 0..20 to report each token's raw log-probability
    and the k best alternatives (sampling.token_logprobs); top_logprobs is None when logprobs is None.

    Every step holds tf.lock from the forward pass to the sample, so one model can be used from several threads,
    and checks that the cache still holds this generation's tokens (cache.version unchanged since its last step).
    If another generation used the cache in between, the step re-evaluates from the longest common prefix: both
    generations stay correct (bit-identical to running alone, by batch invariance), at the cost of the recompute.

    speculative: None, or a speculative.Speculation: draft tokens and verify them in one forward pass
    (speculative.speculative_tokens; greedy output is the same token for token).
    """
    if speculative is not None:
        from .speculative import speculative_tokens

        yield from speculative_tokens(prompt_ids, tf, cache, sampler, max_tokens, stats, speculative, cancel,
                                      n_threads, constraint, logprobs)  # fmt: skip
        return
    from .runtime import set_threads

    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    n_prompt = prompt_ids.shape[0]
    check_prompt_fits(n_prompt, cache.n_ctx)
    t_start = time.perf_counter()
    # prompt + generated ids, for the penalties and to re-sync the cache; filled in place (no allocation per token)
    history = np.empty(n_prompt + max_tokens, dtype=np.int64)
    history[:n_prompt] = prompt_ids
    n_hist = n_prompt
    stats.prompt_tokens = n_prompt

    with tf.lock:
        logits = prefill(tf, cache, prompt_ids, stats, t_start, cancel, n_threads)
        if logits is None:
            return
        token, logprob, top = _pick(sampler, logits, history[:n_hist], constraint, logprobs)
        version = cache.version
    t_first = 0.0
    for i in range(max_tokens):
        history[n_hist] = token
        n_hist += 1
        stats.generated_tokens = i + 1
        now = time.perf_counter()
        if i == 0:
            t_first = now
            stats.ttft_s = now - t_start
        else:
            stats.generation_tps = i / (now - t_first)
        yield token, logprob, top
        # Resumed: the caller wants another token. Evaluate this one unless the context is full.
        if i + 1 == max_tokens or n_hist > cache.n_ctx or _is_cancelled(cancel):
            return
        if constraint is not None and constraint.is_done:
            return
        with tf.lock:
            if n_threads is not None:
                set_threads(n_threads)
            if cache.version == version and cache.n_past == n_hist - 1:
                logits = tf.forward(history[n_hist - 1 : n_hist], cache=cache)
            else:  # somebody else used the cache since our last step
                logits, _ = eval_prompt(tf, cache, history[:n_hist], cancel)
                if logits is None:
                    return
            token, logprob, top = _pick(sampler, logits, history[:n_hist], constraint, logprobs)
            version = cache.version


def _pick(sampler: Sampler, logits, history, constraint, logprobs):
    """One sampled token: (token, logprob, top_logprobs), with the constraint advanced past it."""
    token, logprob = sampler.sample(logits, history, constraint=constraint)
    if constraint is not None:
        constraint.advance(token)
    if logprobs is None:
        return token, logprob, None
    lp = token_logprobs(logits, token, logprobs)
    return token, lp.logprob, lp.top()


def stream(
    prompt_ids: Sequence[int],
    tf,
    cache,
    tokenizer,
    params: SamplingParams,
    max_tokens: int,
    stop: Sequence[str] | str | None = None,
    cancel=None,
    skip_special: bool = True,
    n_threads: int | None = None,
    constraint=None,
    logprobs: int | None = None,
    speculative=None,
) -> Iterator[Chunk]:
    """Chunks of text for a prompt; see Chunk. Stops at an end-of-generation token, a stop string, max_tokens, a
    full context, or when `constraint` (a grammar.Constraint) is complete. logprobs, speculative: see
    generate_tokens."""
    reply = ReplyText(tokenizer, stop, skip_special)
    sampler = Sampler(params, tf.config.n_vocab)
    stats = GenerationStats()

    def chunk(text: str, token=None, logprob=None, top=None, reason=None) -> Chunk:
        """A Chunk; with top_logprobs (logprobs asked for), the token bytes of the token and its alternatives."""
        if reason is not None:
            stats.peak_rss_mb = peak_rss_mb()
        if top is None:
            return Chunk(text, token, logprob, reason, stats if reason else None)
        piece = tokenizer.token_piece
        top = [(t, lp, piece(t, special=True)) for t, lp in top]
        return Chunk(
            text, token, logprob, reason, stats if reason else None, top, token_bytes=piece(token, special=True)
        )

    def finish(reason: str, text: str, token=None, logprob=None, top=None) -> Chunk:
        return chunk(text, token, logprob, top, reason)

    # the last sampled token is never evaluated, so it needs no KV slot of its own
    budget = min(max_tokens, cache.n_ctx - len(prompt_ids) + 1)
    tokens = generate_tokens(prompt_ids, tf, cache, sampler, budget, stats, cancel, n_threads, constraint, logprobs,
                             speculative)  # fmt: skip
    try:
        for n, (token, logprob, top) in enumerate(tokens, 1):
            complete = constraint is not None and constraint.is_done
            text, reason = reply.push(token, last=n == budget, complete=complete)
            if reason is not None:
                yield finish(reason, text, token, logprob, top)
                return
            yield chunk(text, token, logprob, top)
        # The token loop ended early: cancelled, or nothing to generate.
        reason = FINISH_CANCELLED if _is_cancelled(cancel) else FINISH_LENGTH
        yield finish(reason, reply.close())
    finally:
        tokens.close()
