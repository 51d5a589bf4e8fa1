"""Token generation: prompt -> prefill (with prefix reuse) -> sample/decode loop -> streamed text chunks.

Three layers, as in mlx-lm's generate.py:
    generate_tokens(...)  yields (token, logprob) pairs; the model does work only when the next pair is asked for,
                          so breaking out of the loop (or .close() on the generator) stops all work at once.
    stream(...)           yields Chunk objects: UTF-8-safe text deltas, stop strings held back and trimmed,
                          finish_reason and stats on the last chunk.
    Model.complete(...)   joins the text (see llm.py).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .detokenizer import StreamingDetokenizer
from .errors import ContextOverflowError
from .sampling import Sampler, SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"


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

    def summary(self) -> str:
        return (
            f"{self.prompt_tokens} prompt tokens ({self.cached_tokens} cached), "
            f"{self.generated_tokens} generated, TTFT {self.ttft_s:.2f} s, "
            f"prompt {self.prompt_tps:.1f} tok/s, generation {self.generation_tps:.1f} tok/s, "
            f"peak RSS {self.peak_rss_mb:.0f} MB"
        )


@dataclass
class Chunk:
    """One step of a streamed generation.

    text:          new text, never part of a UTF-8 character, never part of a stop string (may be "")
    token:         the token sampled at this step (None on a closing chunk that sampled nothing)
    logprob:       its log-probability under the distribution it was sampled from
    finish_reason: None until the last chunk, then "stop" | "length" | "cancelled"
    stats:         on the last chunk only
    """

    text: str
    token: int | None = None
    logprob: float | None = None
    finish_reason: str | None = None
    stats: GenerationStats | None = field(default=None, repr=False)


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


def check_prompt_fits(n_prompt: int, n_ctx: int) -> None:
    """A prompt needs at least one token and one free KV slot beyond itself to generate from."""
    if n_prompt == 0:
        raise ValueError("prompt is empty: give at least one token (this model adds no BOS token)")
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"prompt has {n_prompt} tokens but the context holds {n_ctx} (n_ctx) and at least one more is "
            f"needed to generate; load the model with a larger n_ctx or shorten the prompt"
        )


def generate_tokens(
    model,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    max_tokens: int,
    stats: GenerationStats,
    cancel=None,
    on_prefill_chunk: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[int, float]]:
    """Yield (token, logprob) until the caller stops asking or the context is full.

    The KV cache keeps the longest prefix shared with the previous request (prefix reuse); the caller sees
    ContextOverflowError before any work if the prompt alone does not fit.
    """
    tf = model.transformer
    prompt_ids = list(prompt_ids)
    n_prompt = len(prompt_ids)
    check_prompt_fits(n_prompt, tf.n_ctx)
    t_start = time.perf_counter()

    # Prefix reuse: keep cached positions that match; always recompute at least the last prompt token so that
    # there are logits to sample from.
    cached = model._cached_ids
    n_keep = 0
    limit = min(len(cached), n_prompt - 1)
    while n_keep < limit and cached[n_keep] == prompt_ids[n_keep]:
        n_keep += 1
    tf.truncate(n_keep)
    del cached[n_keep:]
    stats.prompt_tokens = n_prompt
    stats.cached_tokens = n_keep

    n_batch = tf.n_batch
    logits = None
    for start in range(n_keep, n_prompt, n_batch):
        if _is_cancelled(cancel):
            return
        part = prompt_ids[start : start + n_batch]
        logits = tf.forward(part)
        cached.extend(part)
        if on_prefill_chunk is not None:
            on_prefill_chunk(start + len(part) - n_keep, n_prompt - n_keep)
    t_prefill = time.perf_counter() - t_start
    stats.prompt_tps = (n_prompt - n_keep) / t_prefill if t_prefill > 0 else 0.0

    # prompt + generated ids, for the penalties; filled in place so decode allocates nothing per token
    history = np.empty(n_prompt + max_tokens, dtype=np.int64)
    history[:n_prompt] = prompt_ids
    n_hist = n_prompt
    t_first = 0.0
    for i in range(max_tokens):
        token, logprob = sampler.sample(logits, history[:n_hist])
        history[n_hist] = token
        n_hist += 1
        stats.generated_tokens = i + 1
        now = time.perf_counter()
        if i == 0:
            t_first = now
            stats.ttft_s = now - t_start
        else:
            stats.generation_tps = i / (now - t_first)
        yield token, logprob
        # Resumed: the caller wants another token. Evaluate this one unless the context is full.
        if i + 1 == max_tokens or tf.n_past >= tf.n_ctx:
            return
        if _is_cancelled(cancel):
            return
        logits = tf.forward([token])
        cached.append(token)


def stream(
    model,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    stop: Sequence[str] | str | None = None,
    cancel=None,
    skip_special: bool = True,
) -> Iterator[Chunk]:
    """Chunks of text for a prompt; see Chunk. Stops at an end-of-generation token, a stop string,
    max_tokens or a full context."""
    if isinstance(stop, str):
        stop = [stop]
    stops = StopMatcher(stop or [])
    tok = model.tokenizer
    detok = StreamingDetokenizer(tok, skip_special=skip_special) if tok.model != "none" else None
    eog = tok.eog_ids
    sampler = Sampler(params, model.n_vocab)
    stats = GenerationStats()
    tf = model.transformer

    def finish(reason: str, text: str, token=None, logprob=None) -> Chunk:
        stats.peak_rss_mb = peak_rss_mb()
        return Chunk(text, token, logprob, reason, stats)

    # the last sampled token is never evaluated, so it needs no KV slot of its own
    budget = min(max_tokens, tf.n_ctx - len(prompt_ids) + 1)
    tokens = generate_tokens(model, prompt_ids, sampler, budget, stats, cancel)
    try:
        for n, (token, logprob) in enumerate(tokens, 1):
            if token in eog:
                tail, _ = stops.push(detok.finalize() if detok else "")
                yield finish(FINISH_STOP, tail + stops.flush(), token, logprob)
                return
            text = detok.add_token(token) if detok else ""
            text, hit = stops.push(text)
            if hit:
                yield finish(FINISH_STOP, text, token, logprob)
                return
            if n == budget:
                tail, hit = stops.push(detok.finalize() if detok else "")
                reason = FINISH_STOP if hit else FINISH_LENGTH
                yield finish(reason, text + tail + ("" if hit else stops.flush()), token, logprob)
                return
            yield Chunk(text, token, logprob)
        # The token loop ended early: cancelled, or nothing to generate.
        tail, _ = stops.push(detok.finalize() if detok else "")
        reason = FINISH_CANCELLED if _is_cancelled(cancel) else FINISH_LENGTH
        yield finish(reason, tail + stops.flush())
    finally:
        tokens.close()
