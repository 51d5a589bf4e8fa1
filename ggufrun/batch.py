"""Continuous batching: many generations on one model at once, every step one forward pass for all of them.

Follows llama.cpp's server (tools/server/server.cpp, `update_slots`): `n_slots` slots, each with its own KV cache;
each step batches the next token of every generating request with at most `prefill_chunk` rows of the prompts
being evaluated (chunked prefill: a long prompt costs the others one chunk's time per step, not its whole prefill;
short prompts that arrive together are evaluated in the same step), in one `Transformer.forward_batch`. A step that
evaluates short prompts whole leaves the decode rows out, at most every other step (vLLM's scheduler also runs new
prompts before decode steps): a new request's first token then waits for the step in flight and its own prompt, not
for the others' rows too. Requests join between steps and leave as soon as they finish or are cancelled. Every
request gets the tokens it would get alone (forward_batch is batch-invariant; each has its own Sampler, so a seed
gives the same draws), with the text, stop strings, finish reasons and stats of ggufrun.generate.stream, and its
output constraint (grammar.Constraint: response_format, tool calls) and log-probabilities when asked for. A step's
greedy rows that nothing but a logit_bias changes are sampled together on the compute threads
(sampling.sample_greedy_rows: the bits each request's Sampler gives it).
The KV caches are of the transformer's kv_dtype (f16, q8_0 or f32): batch invariance holds for each.

    engine = BatchEngine.from_model(model, n_slots=8)
    for chunk in engine.submit(model.tokenize("Once upon a time"), SamplingParams(temperature=0), max_tokens=32):
        print(chunk.text, end="")
    engine.close()
    texts = batch_generate(model, ["Once upon a time", "The capital of France is"], max_tokens=32, temperature=0)
    replies = batch_generate(model, [[{"role": "user", "content": "Hi!"}], [{"role": "user", "content": "2+2?"}]])
    for i, chunk in batch_stream(model, ["Once upon a time", "The capital of France is"], max_tokens=32):
        print(i, chunk.text)  # both prompts' chunks, as each step makes them

Slots and prefix reuse (server.cpp's `get_available_slot` by longest common prefix, plus a copy): a request is
given a slot when its prompt evaluation starts, in arrival order, while the step has prompt rows to spare. It takes
the free slot whose cache shares the longest prefix with its prompt (a later turn of a chat finds its earlier turns
there), else the least recently used free one; if another slot (busy or not) shares a longer prefix, those K/V
positions are copied from it (KVCache.copy_prefix). A prompt sharing SHARE_WAIT or more leading tokens with one
still being evaluated waits until that one is done and then copies, so a system prompt shared by many requests
that arrive together is computed once.

Threads: one background thread runs the steps, holding the transformer's lock during each forward pass and the
samples that read its logits, so the model stays usable from elsewhere (Model.generate takes turns with it).
`submit` may be called from any thread; each returned Stream is an iterator read by one consumer, fed through a
queue. Breaking out of a loop over a Stream (dropping it), `Stream.close()`, or a `cancel` event ends the request
before the next step.

Wiring: `Model.batch_generate(prompts, **kw)` is `batch_generate(model, prompts, **kw)` (`batch_stream` likewise),
which collects `batch_stream`'s chunks: one engine, every request's `notify` on one queue; a server's `--parallel N`
is one `BatchEngine.from_model(model, n_slots=N)` whose `submit` each request iterates from its worker thread.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from .generate import (
    FINISH_CANCELLED,
    FINISH_LENGTH,
    Chunk,
    GenerationStats,
    ReplyText,
    check_prompt_fits,
    check_stop,
    peak_rss_mb,
    token_ids,
)
from .model.kv_cache import common_prefix_length
from .runtime import set_threads, signals_to_main_thread
from .sampling import MAX_TOP_LOGPROBS, Sampler, SamplingParams, sample_greedy_rows, token_logprobs

# a waiting prompt that shares this many leading tokens with one being evaluated waits for it, then copies them
SHARE_WAIT = 32


def _positive_int(value, name: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class _Request:
    """One submitted generation: what it asked for, where it is, and the queue its chunks go to."""

    def __init__(self, prompt: np.ndarray, sampler: Sampler, max_tokens: int, reply: ReplyText, cancel, n_ctx,
                 constraint=None, logprobs: int | None = None, token_logprob: bool = True):  # fmt: skip
        self.prompt = prompt  # int64 [n_prompt]
        self.sampler = sampler
        self.constraint = constraint  # a grammar.Constraint masking each step's logits, or None
        self.logprobs = logprobs  # None, or k: report raw log-probabilities and the k best alternatives
        self.token_logprob = token_logprob  # False: Chunk.logprob None where logprobs is None (greedy: no normaliser)
        self.budget = min(max_tokens, n_ctx - prompt.shape[0] + 1)  # the last token sampled needs no KV slot
        self.reply = reply  # tokens -> text, stop strings, end-of-generation
        self.cancel_event = cancel  # the caller's threading.Event or callable, or None
        self.cancelled = threading.Event()  # set by Stream.close()
        self.stats = GenerationStats(prompt_tokens=prompt.shape[0])
        self.chunks: queue.SimpleQueue = queue.SimpleQueue()  # Chunk objects, or an exception to raise
        self.notify = None  # called (on the engine's thread) after every item put, for an asyncio consumer
        self.history = np.empty(prompt.shape[0] + max(self.budget, 0), np.int64)  # prompt + sampled ids
        self.history[: prompt.shape[0]] = prompt
        self.n_hist = prompt.shape[0]
        self.slot: int | None = None
        self.n_eval = 0  # prompt positions in the slot's cache (prefill until n_eval == n_prompt)
        self.token: int | None = None  # the last token sampled, evaluated by the next step
        self.finished = False
        self.t_submit = time.perf_counter()
        self.t_prefill = 0.0
        self.t_first = 0.0

    def put(self, item) -> None:
        self.chunks.put(item)
        if self.notify is not None:
            self.notify()

    def is_cancelled(self) -> bool:
        if self.cancelled.is_set():
            return True
        c = self.cancel_event
        if c is None:
            return False
        return c.is_set() if hasattr(c, "is_set") else bool(c())


class Stream:
    """The chunks of one submitted request, as the engine produces them: an iterator of generate.Chunk whose last
    item has finish_reason and stats. close() (or dropping the iterator, as breaking out of a for loop does)
    cancels the request: it leaves the batch before the next step."""

    def __init__(self, engine: BatchEngine, request: _Request):
        self._engine = engine
        self._request = request
        self._done = False

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Chunk:
        if self._done:
            raise StopIteration
        return self._take(self._request.chunks.get())

    def poll(self) -> Chunk | None:
        """The next chunk if the engine has produced it, else None, without waiting (for an event loop woken by
        submit's `notify`); raises as next() does, StopIteration after the last chunk."""
        if self._done:
            raise StopIteration
        try:
            item = self._request.chunks.get_nowait()
        except queue.Empty:
            return None
        return self._take(item)

    def _take(self, item) -> Chunk:
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finish_reason is not None:
            self._done = True
        return item

    def close(self) -> None:
        """Cancel the request (no effect once it finished)."""
        if not self._done:
            self._done = True
            self._engine._cancel(self._request)

    def __del__(self):
        if not self._done:
            self._request.cancelled.set()


class PromptCost:
    """The estimated cost of evaluating prompt rows, by position, in units of one row at position 0.

    A row's matrix products cost the same at every position; its attention grows with the positions it attends to
    (capped by a sliding window on the layers that have one). Estimated by multiply-adds: the layers' matrices
    (a mixture-of-experts block counts its n_expert_used experts) against n_head x (head_dim_k + head_dim_v) per
    attended position and layer (the scores and the weighted sum of the values), those weighted ATTENTION_COST
    times a product's: the products multiply 8-bit integers (64 a VNNI instruction, more on AMX tiles), attention
    float32 (16 an FMA). The batch engine fills each step
    with prompt rows whose cost stays within that of prefill_chunk rows at positions 0.., so the steps that carry
    the last chunks of a long prompt (each attending to thousands of positions) take no longer than its first
    step, and the streams decoding beside it wait no longer between tokens (the chunked-prefill token budget of
    Sarathi-Serve, arXiv:2403.02310, with the attention term added).
    """

    # an attention multiply-add's cost in units of a product's. A 2,000-token prompt beside 4 decoding streams (Intel
    # Xeon with AMX, 2 threads, the batch engine's steps timed, two rounds each): with attention weighted as the
    # products (1), the steps grew from 193-267 ms (252 prompt rows at positions 0..251) to 286-335 ms on Gemma3 (205
    # rows at 1,795..1,999) and 362-539 ms on SmolLM2 (its last three steps, 175-161 rows): the streams' longest wait
    # was one of the last steps, above the prompt's mean time per chunk. Both models' step times fit a weight of 2.9.
    ATTENTION_COST = 3.0

    def __init__(self, transformer):
        c = transformer.config
        macs = 0.0
        for layer in transformer.weights.layers:
            experts = {id(m) for m in (*layer.ffn_gate_exps, *layer.ffn_up_exps, *layer.ffn_down_exps)}
            for m in layer.matrices:
                share = c.n_expert_used / max(1, c.n_expert) if id(m) in experts else 1.0
                macs += share * m.n_out * m.n_in
        per_position = c.n_head * (c.head_dim_k + c.head_dim_v)  # per layer and attended position
        n = transformer.n_ctx
        attended = np.zeros(n, np.float64)  # positions attended by a row at position p, summed over layers
        p = np.arange(1, n + 1, dtype=np.float64)
        for swa in c.swa_layers:
            attended += np.minimum(p, c.sliding_window) if swa and c.sliding_window > 0 else p
        cost = 1.0 + self.ATTENTION_COST * attended * per_position / max(macs, 1.0)
        self.cumulative = np.concatenate(([0.0], np.cumsum(cost)))  # [n_ctx + 1]: cost of rows at positions < p

    def of(self, start: int, n: int) -> float:
        """Cost of n rows at positions start..start+n-1."""
        return float(self.cumulative[start + n] - self.cumulative[start])

    def rows(self, start: int, budget: float, limit: int) -> int:
        """How many rows from position `start` on fit in `budget` (at least 1, at most `limit`)."""
        limit = min(limit, self.cumulative.shape[0] - 1 - start)
        fit = int(np.searchsorted(self.cumulative, self.cumulative[start] + budget, side="right")) - 1 - start
        return max(1, min(limit, fit))


class BatchEngine:
    """Continuous batching over one transformer and tokenizer (see the module docstring).

    n_slots: sequences generated at once (each slot owns a KVCache of n_ctx positions; requests beyond wait).
    prefill_chunk: prompt tokens evaluated per step (default: the transformer's n_batch), fewer when decode
    rows fill the pass or when the prompt rows attend to many positions (PromptCost: a step's prompt rows cost at
    most what prefill_chunk rows at positions 0.. cost). n_threads: Numba threads for the steps (default: leave the
    setting alone).
    skip_special: hide control tokens in the streamed text.

    Counters for tests and benchmarks: steps, rows (token rows through the model), prefill_rows, decode_rows,
    copied_tokens (prompt positions copied from another slot).
    """

    def __init__(
        self,
        transformer,
        tokenizer,
        n_slots: int = 4,
        prefill_chunk: int | None = None,
        n_threads: int | None = None,
        skip_special: bool = True,
    ):
        self.tf = transformer
        self.tokenizer = tokenizer
        self.n_slots = _positive_int(n_slots, "n_slots")
        self.prefill_chunk = _positive_int(prefill_chunk if prefill_chunk is not None else transformer.n_batch,
                                           "prefill_chunk")  # fmt: skip
        self.n_threads = None if n_threads is None else _positive_int(n_threads, "n_threads")
        self.skip_special = skip_special
        self.n_vocab = transformer.config.n_vocab
        self.slots = transformer.new_caches(self.n_slots)  # one group: decode attention in one call per layer
        self.cost = PromptCost(transformer)
        self.step_budget = self.cost.of(0, min(self.prefill_chunk, transformer.n_ctx))  # a first chunk's cost
        self._owner: list[_Request | None] = [None] * self.n_slots
        self._last_used = [0] * self.n_slots  # step at which each slot was last released
        self._waiting: deque[_Request] = deque()  # submitted, no slot yet, in arrival order
        self._active: list[_Request] = []  # holding a slot, in admission order
        self._cond = threading.Condition(threading.RLock())
        self._closed = False
        self.steps = self.rows = self.prefill_rows = self.decode_rows = self.copied_tokens = 0
        self._last_prompt_only = False  # the last step ran prompt rows only (_step)
        self._thread = threading.Thread(target=self._run, name="ggufrun-batch", daemon=True)
        with signals_to_main_thread():  # Ctrl-C must reach the main thread (see ggufrun.runtime)
            self._thread.start()

    @classmethod
    def from_model(cls, model, **kwargs) -> BatchEngine:
        """An engine over a ggufrun.Model's transformer and tokenizer, on the model's thread count."""
        kwargs.setdefault("n_threads", model.n_threads)
        return cls(model.transformer, model.tokenizer, **kwargs)

    # ---- the caller's side ------------------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        max_tokens: int = 256,
        stop: str | Sequence[str] | None = None,
        cancel=None,
        constraint=None,
        logprobs: int | None = None,
        notify=None,
        token_logprob: bool = True,
    ) -> Stream:
        """Queue a generation of `prompt_ids`; return the Stream of its chunks. Thread-safe.

        params: SamplingParams (default SamplingParams()); a seed gives the draws it gives alone. stop: stop
        strings. cancel: a threading.Event or a callable returning True, checked before every step. constraint: a
        grammar.Constraint of this request alone (response_format, a tool call), as in generate.stream: it masks
        every step's logits, advances with each token and ends the reply when done. logprobs: None, or k in 0..20
        for each chunk's raw log-probability, token bytes and k best alternatives (Chunk.top_logprobs). notify: a
        callable the engine's thread calls after queueing each chunk (e.g. an event loop's call_soon_threadsafe of
        an event's set), so that a consumer can wait without a thread and read with Stream.poll(). token_logprob:
        False leaves each Chunk.logprob None unless `logprobs` asks for them (Sampler.sample(logprob=False): a greedy
        request then skips the normaliser, one exp per vocabulary entry a token; the server passes False, as it
        reports log-probabilities only through `logprobs`). Bad values
        raise here (ValueError / TypeError naming the argument; ContextOverflowError for a prompt that leaves no
        room to generate).
        """
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        reply = ReplyText(self.tokenizer, stop, self.skip_special)  # checks `stop`
        ids = token_ids(prompt_ids, self.n_vocab, "prompt_ids")
        if logprobs is not None and (
            not isinstance(logprobs, (int, np.integer)) or isinstance(logprobs, bool)
            or not 0 <= logprobs <= MAX_TOP_LOGPROBS
        ):  # fmt: skip
            raise ValueError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {logprobs!r}")
        if constraint is not None and not (hasattr(constraint, "advance") and hasattr(constraint, "is_done")):
            raise TypeError(f"constraint must be a grammar.Constraint, got {type(constraint).__name__}")
        check_prompt_fits(ids.shape[0], self.tf.n_ctx)
        sampler = Sampler(params, self.n_vocab)
        request = _Request(ids, sampler, int(max_tokens), reply, cancel, self.tf.n_ctx, constraint,
                           None if logprobs is None else int(logprobs), bool(token_logprob))  # fmt: skip
        request.notify = notify
        with self._cond:
            if self._closed:
                raise RuntimeError("this BatchEngine is closed")
            if request.budget <= 0:  # nothing to generate: no work at all
                self._finish(request, FINISH_LENGTH, "")
            else:
                self._waiting.append(request)
                self._cond.notify()
        return Stream(self, request)

    def _cancel(self, request: _Request) -> None:
        request.cancelled.set()
        with self._cond:
            self._cond.notify()

    @property
    def n_active(self) -> int:
        """Requests holding a slot (evaluating their prompt or generating)."""
        return len(self._active)

    @property
    def n_waiting(self) -> int:
        """Requests submitted and not yet given a slot."""
        return len(self._waiting)

    def close(self) -> None:
        """Stop the engine: unfinished requests end with finish_reason "cancelled"; the slots' caches stay."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> BatchEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the engine's thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        if self.n_threads is not None:
            set_threads(self.n_threads)  # Numba keeps the thread count per calling thread
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._active:
                    self._cond.wait()
                if self._closed:
                    for request in [*self._active, *self._waiting]:
                        self._finish_cancelled(request)
                    self._waiting.clear()
                    return
            try:
                self._step()
            except BaseException as e:  # a bug or an out-of-memory: every request in flight gets the error
                with self._cond:
                    failed = [*self._active]
                for request in failed:
                    self._release(request)
                    request.put(e)

    def _step(self) -> None:
        """Drop cancelled requests, start waiting prompts while this step has prompt rows to spare, then run one
        forward pass: one token for every generating request plus up to prefill_chunk prompt rows, taken from the
        prompts being evaluated in admission order while their cost (PromptCost) stays within step_budget, that of
        prefill_chunk rows at the start of a prompt."""
        with self._cond:
            for request in [r for r in (*self._active, *self._waiting) if r.is_cancelled()]:
                self._finish_cancelled(request)
            n_decoding = sum(1 for r in self._active if r.token is not None)
            budget = min(self.prefill_chunk, max(1, self.tf.n_batch - n_decoding))  # prompt rows in this pass
            self._admit(budget)
            active = list(self._active)
        decoding = [r for r in active if r.token is not None]
        chunks: list[tuple[_Request, np.ndarray]] = []
        cost_left = self.step_budget
        for r in active:
            if budget > 0 and cost_left > 0 and r.n_eval < r.prompt.shape[0]:
                n = self.cost.rows(r.n_eval, cost_left, min(budget, r.prompt.shape[0] - r.n_eval))
                chunks.append((r, r.prompt[r.n_eval : r.n_eval + n]))
                budget -= n
                cost_left -= self.cost.of(r.n_eval, n)
        # Prompts evaluated whole in this step (short ones, as a chat turn) run without the decode rows (the others'
        # next tokens, and those rows' logits over the whole vocabulary), so that a request's first token costs what
        # it costs alone plus the step in flight when it arrived. Never two such steps in a row: the streams lose at
        # most one step in two, to a step that costs at most step_budget (one chunk). A long prompt's chunks, its
        # last one too, still run beside the decode rows.
        prompt_only = (
            bool(chunks and decoding)
            and not self._last_prompt_only
            and all(
                r.n_eval == r.stats.cached_tokens and r.n_eval + chunk.shape[0] == r.prompt.shape[0]
                for r, chunk in chunks
            )
        )
        self._last_prompt_only = prompt_only
        if prompt_only:
            decoding = []
        seqs = [(self.slots[r.slot], r.history[r.n_hist - 1 : r.n_hist]) for r in decoding]
        seqs += [(self.slots[r.slot], chunk) for r, chunk in chunks]
        if not seqs:
            return
        sampled: list[tuple[_Request, int, float, list | None]] = []
        failed: list[tuple[_Request, Exception]] = []
        with self.tf.lock:
            if self.n_threads is not None:
                set_threads(self.n_threads)
            logits = self.tf.forward_batch(seqs)
            to_sample = list(enumerate(decoding))  # (row of logits, request)
            for i, (r, chunk) in enumerate(chunks, len(decoding)):
                r.n_eval += chunk.shape[0]
                if r.n_eval == r.prompt.shape[0]:
                    to_sample.append((i, r))
            # greedy rows with nothing but a logit_bias to change their logits: at once on the threads (the same bits)
            greedy = [(i, r) for i, r in to_sample if self._greedy_as_is(r)]
            picked = {}
            if len(greedy) > 1 and self.tf.batch_sampling_ready():
                rows = np.array([i for i, _ in greedy], dtype=np.int64)
                samplers = [r.sampler for _, r in greedy]
                want = [r.token_logprob for _, r in greedy]
                picked = dict(zip(rows.tolist(), sample_greedy_rows(logits, rows, samplers, want)))
            for i, r in to_sample:
                if picked.get(i) is not None:
                    sampled.append((r, *picked[i], None))
                    continue
                try:  # a request's own logits processor or grammar may raise: that request ends with its error
                    sampled.append(self._pick(r, logits[i]))
                except Exception as e:
                    failed.append((r, e))
        for request, error in failed:
            self._release(request)
            request.put(error)
        self.steps += 1
        self.decode_rows += len(decoding)
        self.prefill_rows += sum(chunk.shape[0] for _, chunk in chunks)
        self.rows = self.decode_rows + self.prefill_rows
        for request, token, logprob, top in sampled:
            self._emit(request, token, logprob, top)

    @staticmethod
    def _greedy_as_is(r: _Request) -> bool:
        """The request's next token is the argmax of its logits plus its logit_bias, with no log-probabilities to
        report (sampling.sample_greedy_rows)."""
        return r.constraint is None and r.logprobs is None and r.sampler.greedy_as_is(r.history[: r.n_hist])

    def _pick(self, r: _Request, row: np.ndarray) -> tuple[_Request, int, float, list | None]:
        """One request's token from its logits row, as generate._pick: sampled (through its constraint, which then
        advances), with the raw log-probabilities when asked for."""
        token, logprob = r.sampler.sample(row, r.history[: r.n_hist], constraint=r.constraint,
                                          logprob=r.token_logprob and r.logprobs is None)  # fmt: skip
        if r.constraint is not None:
            r.constraint.advance(token)
        if r.logprobs is None:
            return r, token, logprob if r.token_logprob else None, None
        lp = token_logprobs(row, token, r.logprobs)
        return r, token, lp.logprob, lp.top()

    def _admit(self, budget: int) -> None:
        """Give waiting requests slots, in arrival order, while the prompts being evaluated leave some of this step's
        `budget` prompt rows unused; each reuses or copies the longest cached prefix of its prompt. A request whose
        prompt shares SHARE_WAIT or more leading tokens with a prompt still being evaluated waits for it to finish,
        then copies that prefix instead of computing it a second time."""
        free = [s for s in range(self.n_slots) if self._owner[s] is None]
        evaluating = [r for r in self._active if r.n_eval < r.prompt.shape[0]]
        budget -= sum(r.prompt.shape[0] - r.n_eval for r in evaluating)
        while self._waiting and free and budget > 0:
            request = self._waiting[0]
            if request.is_cancelled():
                self._finish_cancelled(request)
                continue
            prompt, n = request.prompt, request.prompt.shape[0]
            if any(common_prefix_length(prompt, r.prompt) >= SHARE_WAIT for r in evaluating):
                return
            self._waiting.popleft()
            shared = [min(cache.common_prefix(prompt), n - 1) for cache in self.slots]  # at least one id to evaluate
            slot = max(free, key=lambda s: (shared[s], -self._last_used[s]))
            donor = max(range(self.n_slots), key=lambda s: shared[s])
            cache = self.slots[slot]
            if shared[donor] > shared[slot]:
                cache.copy_prefix(self.slots[donor], shared[donor])
                self.copied_tokens += shared[donor]
            else:
                cache.truncate(shared[slot])
            request.slot = slot
            request.n_eval = request.stats.cached_tokens = cache.n_past
            request.t_prefill = time.perf_counter()
            self._owner[slot] = request
            self._active.append(request)
            free.remove(slot)
            evaluating.append(request)
            budget -= n - request.n_eval

    def _emit(self, request: _Request, token: int, logprob: float, top: list | None = None) -> None:
        """A sampled token: text out through the detokenizer and the stop strings, or the request's end."""
        stats = request.stats
        request.history[request.n_hist] = token
        request.n_hist += 1
        n = stats.generated_tokens = request.n_hist - request.prompt.shape[0]
        now = time.perf_counter()
        if n == 1:
            request.t_first = now
            stats.ttft_s = now - request.t_submit
            prefill_s = now - request.t_prefill
            stats.prompt_tps = (stats.prompt_tokens - stats.cached_tokens) / prefill_s if prefill_s > 0 else 0.0
        else:
            stats.generation_tps = (n - 1) / (now - request.t_first)
        complete = request.constraint is not None and request.constraint.is_done
        text, reason = request.reply.push(token, last=n == request.budget, complete=complete)
        top_bytes = token_bytes = None
        if top is not None:  # logprobs asked for: the bytes of the token and of its alternatives, as stream() gives
            piece = self.tokenizer.token_piece
            top_bytes, token_bytes = [(t, lp, piece(t, special=True)) for t, lp in top], piece(token, special=True)
        if reason is not None:
            self._finish(request, reason, text, token, logprob, top_bytes, token_bytes)
        else:
            request.token = token
            request.put(Chunk(text, token, logprob, top_logprobs=top_bytes, token_bytes=token_bytes))

    def _finish_cancelled(self, request: _Request) -> None:
        self._finish(request, FINISH_CANCELLED, request.reply.close())

    def _finish(self, request: _Request, reason: str, text: str, token=None, logprob=None, top=None,
                token_bytes=None) -> None:  # fmt: skip
        request.stats.peak_rss_mb = peak_rss_mb()
        self._release(request)
        request.put(Chunk(text, token, logprob, reason, request.stats, top, token_bytes))

    def _release(self, request: _Request) -> None:
        """Take the request out of the batch now; its slot's cache keeps its tokens for prefix reuse."""
        with self._cond:
            request.finished = True
            if request in self._waiting:
                self._waiting.remove(request)
            if request.slot is not None:
                self._owner[request.slot] = None
                self._last_used[request.slot] = self.steps
                self._active.remove(request)
                request.slot = None


MAX_DEFAULT_SLOTS = 8  # past this, a decode step's attention over every slot's context outweighs the shared weights
SLOT_MEMORY_SHARE = 0.5  # of the memory available now, what the slots' KV caches may take when full


def _prompt_work(model, prompt, i: int, add_special: bool, response_format) -> tuple[Sequence[int], object]:
    """batch_generate's prompts[i] as (token ids, its own output Constraint or None): text tokenized as
    Model.generate tokenizes it, token ids as they are, a chat's messages rendered as Model.chat renders them."""
    if isinstance(prompt, str):
        ids = model.tokenize(prompt, add_special=add_special)
    elif isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, (Sequence, np.ndarray)):
        raise TypeError(f"prompts[{i}] must be text, token ids or a list of chat messages, got {type(prompt).__name__}")
    elif len(prompt) and isinstance(prompt[0], Mapping):  # a chat: its messages
        try:
            prepared = model.prepare_chat(prompt, response_format=response_format)
        except (TypeError, ValueError) as e:  # the same error, naming the prompt
            try:
                named = type(e)(f"prompts[{i}]: {e}")
            except Exception:
                raise e from None
            raise named from e
        return prepared.ids, prepared.constraint
    else:
        ids = token_ids(prompt, model.n_vocab, f"prompts[{i}]")
    if response_format is None:
        return ids, None
    from .grammar import compile_constraint

    return ids, compile_constraint(response_format, model.tokenizer)


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_slots(transformer, available: int | None = None) -> int:
    """Slots a server runs by default: MAX_DEFAULT_SLOTS, fewer when that many full KV caches of n_ctx positions
    (each transformer.cache.nbytes) would take more than SLOT_MEMORY_SHARE of the memory available now; at least 1.
    A cache's pages cost memory only once written, so this bounds the worst case (every slot at n_ctx).

    >>> default_slots(model.transformer)  # SmolLM2 at n_ctx 4096, f16 KV: 8 (80 MiB per slot)
    """
    if available is None:
        available = available_memory_bytes()
    per_slot = max(1, transformer.cache.nbytes)
    if available is None:
        return MAX_DEFAULT_SLOTS
    return max(1, min(MAX_DEFAULT_SLOTS, int(available * SLOT_MEMORY_SHARE) // per_slot))


def batch_generate(
    model,
    prompts: Sequence[str | Sequence[int] | Sequence[Mapping]],
    max_tokens: int = 256,
    stop: str | Sequence[str] | None = None,
    *,
    chunks: bool = False,
    **kwargs,
) -> list[str] | list[list[Chunk]]:
    """Generate from every prompt at once on a ggufrun.Model; results in the prompts' order: the text of each (or,
    with chunks=True, its list of Chunks, the last with finish_reason and stats).

    A prompt is text (tokenized with add_special, as Model.generate does), token ids, or a chat: a list of messages
    [{"role": ..., "content": ...}, ...] rendered by the model's chat template as Model.chat renders it (its reply
    is the model's next turn). Each prompt gets what Model.generate (a chat: Model.chat) gives it alone with the same
    arguments. Sampling arguments are SamplingParams fields or a preset, shared by every prompt. response_format
    (Model.generate's) constrains every reply, each with a Constraint of its own; logprobs (None, or k in 0..20)
    gives each chunk its log-probability and k best alternatives (with chunks=True). cancel (a threading.Event or a
    callable returning True) ends every generation still running, as Model.generate's ends its one. Tools are not
    taken here: a chat with tools goes through Model.chat, or the server. n_slots: prompts generated at once
    (default: all of them, at most 16); prefill_chunk: BatchEngine's. The keyword arguments are batch_stream's,
    which gives the same chunks as they are made.

    >>> batch_generate(model, ["Once upon a time", "The capital of France is"], max_tokens=16, temperature=0)
    >>> batch_generate(model, [[{"role": "user", "content": "Hi!"}], "The capital of France is"], max_tokens=16)
    """
    prompts = prompts if isinstance(prompts, (str, bytes)) else list(prompts)  # (one string: batch_stream says no)
    # texts carry no log-probabilities: a greedy step then skips each row's normaliser (Gemma3, 16 prompts x 48
    # tokens, greedy, the two in turns, medians of 6: 1.54 -> 1.51 s)
    kwargs.setdefault("token_logprob", chunks)
    stream = batch_stream(model, prompts, max_tokens, stop, **kwargs)
    results: list[list[Chunk]] = [[] for _ in range(len(prompts))]
    for i, chunk in stream:
        results[i].append(chunk)
    return results if chunks else ["".join(c.text for c in r) for r in results]


def batch_stream(
    model,
    prompts: Sequence[str | Sequence[int] | Sequence[Mapping]],
    max_tokens: int = 256,
    stop: str | Sequence[str] | None = None,
    *,
    n_slots: int | None = None,
    prefill_chunk: int | None = None,
    preset: str | None = None,
    add_special: bool = True,
    response_format=None,
    logprobs: int | None = None,
    cancel=None,
    token_logprob: bool = True,
    **sampling,
) -> Iterator[tuple[int, Chunk]]:
    """batch_generate's generations as they are made: (i, chunk) for each chunk of prompts[i], in the order the
    engine produces them (every step gives each running prompt its next chunk; a prompt's chunks come in their own
    order, its last with finish_reason and stats). batch_generate explains the arguments, checked at the call; the
    work starts at the first next(). Leaving the loop early (or close()) cancels every generation still running.
    token_logprob: False leaves each Chunk.logprob None unless `logprobs` asks (BatchEngine.submit's; batch_generate
    passes False when it returns texts).

    >>> for i, chunk in batch_stream(model, ["Once upon a time", "The capital of France is"], max_tokens=16):
    ...     print(i, chunk.text)
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of prompts (text, token ids or a chat's messages), not one string")
    for name in ("tools", "tool_choice", "parallel_tool_calls"):
        if name in sampling:
            raise TypeError(f"batch_generate does not take {name}: give a chat with tools to Model.chat, or serve it")
    prompts = list(prompts)
    params = SamplingParams.preset(preset, **sampling) if preset is not None else SamplingParams(**sampling)
    stop = check_stop(stop)
    work = [_prompt_work(model, p, i, add_special, response_format) for i, p in enumerate(prompts)]
    return _stream_all(model, work, params, max_tokens, stop, logprobs, cancel, bool(token_logprob), n_slots,
                       prefill_chunk)  # fmt: skip


def _stream_all(model, work, params, max_tokens, stop, logprobs, cancel, token_logprob, n_slots, prefill_chunk):
    """batch_stream's generator: one engine for the prompts in `work` [(ids, constraint), ...]; each request's
    notify puts its index on one queue per chunk made, which this thread waits on."""
    if not work:
        return
    made: queue.SimpleQueue = queue.SimpleQueue()
    engine = BatchEngine.from_model(model, n_slots=n_slots or min(len(work), 16), prefill_chunk=prefill_chunk)
    streams: list[Stream] = []
    try:
        for i, (ids, constraint) in enumerate(work):
            notify = functools.partial(made.put, i)
            streams.append(engine.submit(ids, params, max_tokens, stop, cancel, constraint, logprobs, notify,
                                         token_logprob))  # fmt: skip
        left = len(streams)
        while left:
            i = made.get()
            chunk = streams[i].poll()  # one chunk per notify (raises the request's error, if it failed)
            if chunk is not None:
                left -= chunk.finish_reason is not None
                yield i, chunk
    finally:
        for stream in streams:
            stream.close()
        engine.close()
