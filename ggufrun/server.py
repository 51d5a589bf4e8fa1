"""OpenAI-compatible HTTP server and chat page: `ggufrun serve MODEL` (needs `pip install -e ".[server]"`).

Starlette + uvicorn (the common ASGI stack): SSE streaming, disconnect detection and a small, well-tested HTTP
layer we do not have to write ourselves. The core library never imports this module.

Endpoints (request and response shapes follow OpenAI's API reference, "Create chat completion" and the legacy
"Create completion"; the conventions it leaves open follow llama.cpp's tools/server/server.cpp):
    POST /v1/chat/completions, POST /v1/completions   streaming (SSE) and not
    GET  /v1/models, GET /v1/models/{id}               the one served model
    POST /v1/embeddings                                501, naming what to use instead
    GET  /health                                       counters, no authentication; "compiling": true while a
                                                       helper still compiles the batched kernels (the first run
                                                       after an install: batched steps run row by row meanwhile)
    GET  /                                             a single-page chat UI (ggufrun/static/chat.html)

The model name: one model is served, so any `model` string is accepted (as llama-server does); responses and
/v1/models carry the served id (`model_id`, default the file name), which the server logs at start.

Every request field is either implemented or answered 400 naming it (OpenAI-style error JSON with `param`); a
field is never accepted and then ignored:
    implemented       model, messages (role, content as a string or text parts, name, tool_call_id, an assistant's
                      tool_calls), prompt (a string, a one-string list, or token ids), max_tokens,
                      max_completion_tokens, stop, stream, stream_options.include_usage, temperature, top_p,
                      frequency_penalty, presence_penalty, logit_bias, seed, n (= 1); chat: response_format
                      (json_object, json_schema, grammar, regex: ggufrun.grammar), tools, tool_choice,
                      parallel_tool_calls (ggufrun.tool_calls), logprobs + top_logprobs; completions: logprobs
                      (0..20 alternatives), echo
    sampling extras   top_k, min_p, repetition_penalty, penalty_last_n (ggufrun.sampling.SamplingParams; llama.cpp
                      semantics), accepted by both endpoints
    harmless          user, metadata, prompt_cache_key, safety_identifier (labels for the caller's bookkeeping),
                      service_tier "auto"/"default"
    default only      fields of features not built are accepted only with the value that asks for the default
                      behaviour, and answered 400 otherwise: functions [] and function_call "none" (deprecated:
                      send tools), best_of 1, suffix "", store false, modalities ["text"], verbosity "medium",
                      stream_options.include_obfuscation false; audio, prediction, reasoning_effort and
                      web_search_options only as null
    anything else     400 "unknown field"
`null` means "not given" for every field. Ranges are OpenAI's where it documents one (temperature [0, 2], penalties
[-2, 2], logit_bias [-100, 100]), chosen elsewhere so that no accepted value can overflow float32 in the sampler.

Safety: every error a request can cause is a 4xx naming the field (non-JSON numbers such as NaN/Infinity/1e999,
lone UTF-16 surrogates and nesting deeper than MAX_DEPTH are found before any field is used); a body over
MAX_BODY_BYTES is 413; only a server bug gives 500. An error after a stream has started ends the stream with an
OpenAI-style `data: {"error": ...}` event and `data: [DONE]` (the `openai` client raises it as an APIError).

How requests meet the model (`parallel`, `ggufrun serve --parallel N`):
- parallel >= 2 (EngineRunner): requests are the slots of one ggufrun.batch.BatchEngine, as llama-server's `-np N`
  slots (tools/server/server.cpp): every step is one forward pass for the next token of each generating request
  plus one chunk of a prompt being evaluated (continuous batching, chunked prefill), and each request gets the
  tokens it would get alone (the engine is batch-invariant and gives every request its own sampler, seed, stop
  strings, constraint and logprobs). Requests beyond the slots wait in arrival order; past `max_queue` waiting the
  server answers 503 with Retry-After. The engine runs ahead of a slow reader by at most max_tokens chunks.
- parallel 1 (ModelRunner): one generation at a time through Model.generate (speculative decoding applies), all
  model work on one dedicated thread (Numba's thread count is a per-thread setting); requests wait their turn in
  FIFO order, 503 past `max_queue`. Backpressure: the next token is computed only when the previous chunk has been
  handed to the client's socket (one `next()` per chunk), so a stalled client stalls its own generation.
- Prompt preparation (chat templates, tokenizing, grammars, echo's log-probabilities) runs on the one model thread
  in both modes.
- A client that disconnects, streaming or not, cancels its request: a task watches the connection and sets the
  generation's cancel event, so its slot (or the model) is free within one step (a queued request whose client
  left is dropped when its turn comes, without running).
- With tools, a streamed reply's text and tool calls are sent when generation ends, once the reply has been parsed
  (its text cannot be told from a call before then); log-probabilities still stream with every token.
- CORS is off unless `create_app(..., cors_origins=[...])` names the origins allowed to call the API from a browser.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources

from .errors import ContextOverflowError, GrammarError
from .sampling import MAX_TOP_LOGPROBS, SamplingParams
from .tool_calls import with_tool_calls

MAX_BODY_BYTES = 1 << 20  # a request body above this is answered 413
MAX_DEPTH = 32  # JSON nesting deeper than this is answered 400 (no valid request comes close)
MAX_STOPS = 16
PAGE = "chat.html"  # in ggufrun/static, served at /

log = logging.getLogger("uvicorn.error")  # uvicorn's own logger: shown at its --log-level, with its format


class APIError(Exception):
    """An error answered as OpenAI-style JSON: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        return {
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            501: "not_supported_error",
            503: "server_overloaded",
        }.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class QueueFull(APIError):
    def __init__(self, n: int):
        super().__init__(503, f"server busy: {n} requests already waiting; retry later", code="queue_full")


class ModelRunner:
    """Serialises model work on one thread and hands out chunks one at a time (see module docstring)."""

    def __init__(self, model, max_queue: int = 64):
        self.model = model
        self.max_queue = max_queue
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ggufrun-model")
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.busy = False
        self.tokens_generated = 0  # every token produced for any request (for tests and /health)
        self.requests_served = 0
        self.requests_cancelled = 0  # requests whose client left before they finished

    async def call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def stream(self, make_chunks, cancel: threading.Event | None = None):
        """Async iterator over the chunks of `make_chunks()` (a function returning a generator). Yields nothing
        if `cancel` is set by the time the request's turn comes."""
        if self.lock.locked() and self.waiting >= self.max_queue:
            raise QueueFull(self.waiting)
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        if cancel is not None and cancel.is_set():
            self.requests_cancelled += 1
            self.lock.release()
            return
        self.busy = True
        gen = None
        try:
            gen = await self.call(make_chunks)
            while True:
                chunk = await self.call(next, gen, None)
                if chunk is None:
                    break
                if chunk.token is not None:
                    self.tokens_generated += 1
                yield chunk
        finally:
            if gen is not None:
                # Runs after the token in flight (one worker thread): stops the generation for good.
                self.executor.submit(gen.close)
            if cancel is not None and cancel.is_set():
                self.requests_cancelled += 1
            self.busy = False
            self.requests_served += 1
            self.lock.release()

    def generate(self, ids, max_tokens, stop, cancel, constraint, logprobs, sampling, tool_format):
        """Async iterator over the chunks of one request, run alone through Model.generate (speculative decoding,
        when the model has it, applies)."""

        def make_chunks():
            chunks = self.model.generate(ids, max_tokens, stop, cancel=cancel, constraint=constraint,
                                         logprobs=logprobs, **sampling)  # fmt: skip
            return chunks if tool_format is None else with_tool_calls(chunks, tool_format)

        return self.stream(make_chunks, cancel)

    def close(self) -> None:
        self.executor.shutdown(wait=False)


class EngineRunner(ModelRunner):
    """Requests as slots of one ggufrun.batch.BatchEngine (continuous batching, chunked prefill, prefix reuse):
    up to `parallel` generate at once, one forward pass per step for all of them; the rest wait in arrival order,
    and past `max_queue` waiting the server answers 503. Prompt preparation (templates, tokenizing, grammars) still
    runs on the runner's one model thread. The event loop waits for chunks without a thread per request: the
    engine wakes it (submit's notify) and it reads with Stream.poll()."""

    def __init__(self, model, parallel: int, max_queue: int = 64):
        from .batch import SLOT_MEMORY_SHARE, BatchEngine, available_memory_bytes
        from .model.kv_cache import prefault_group_keys

        super().__init__(model, max_queue)
        self.engine = BatchEngine.from_model(model, n_slots=parallel)
        # the slots' key pages faulted in now, before the server listens, as llama-server holds its whole KV cache
        # from the start: a fresh slot's first token otherwise faults in all of them (Gemma3, 16 slots: the first
        # step of 16 new requests 0.48 s instead of 0.05 s); beside the steps, that kernel work made them stall.
        # Not when they would take more than the share of the memory available that default_slots plans with (an
        # explicit --parallel with a long n_ctx): they are then faulted in as slots are first used.
        group = self.engine.slots[0].group_kv
        self.keys_mb = group[0].nbytes / 1e6 if group is not None and not self.engine.slots[0].quantized else 0.0
        available = available_memory_bytes()
        fits = available is None or self.keys_mb * 1e6 <= available * SLOT_MEMORY_SHARE
        self.keys_prefaulted = fits and prefault_group_keys(self.engine.slots)

    @property
    def parallel(self) -> int:
        return self.engine.n_slots

    @property
    def busy(self) -> bool:
        """Some request holds a slot or waits for one."""
        engine = getattr(self, "engine", None)
        return engine is not None and (engine.n_active > 0 or engine.n_waiting > 0)

    @busy.setter
    def busy(self, value) -> None:  # ModelRunner's flag; the engine's own counts answer here
        pass

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        engine = getattr(self, "engine", None)
        return 0 if engine is None else engine.n_waiting

    @waiting.setter
    def waiting(self, value) -> None:
        pass

    async def generate(self, ids, max_tokens, stop, cancel, constraint, logprobs, sampling, tool_format):
        engine = self.engine
        if engine.n_active >= engine.n_slots and engine.n_waiting >= self.max_queue:
            raise QueueFull(engine.n_waiting)
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        params = self.model._params(sampling.pop("preset", None), dict(sampling))
        # token_logprob False: the replies carry log-probabilities only where `logprobs` asks (their own path)
        stream = engine.submit(ids, params, max_tokens, stop, cancel=cancel, constraint=constraint,
                               logprobs=logprobs, notify=lambda: loop.call_soon_threadsafe(ready.set),
                               token_logprob=False)  # fmt: skip
        # with tools, the reply is parsed for calls at its end: with_tool_calls reads the chunks as they come
        arrived: deque = deque()
        parsed = None if tool_format is None else with_tool_calls((arrived.popleft() for _ in iter(int, 1)),
                                                                   tool_format)  # fmt: skip
        finished = False
        try:
            while True:
                ready.clear()
                chunk = stream.poll()
                if chunk is None:
                    await ready.wait()
                    continue
                if chunk.token is not None:
                    self.tokens_generated += 1
                if parsed is not None:
                    arrived.append(chunk)
                    chunk = next(parsed)
                finished = chunk.finish_reason is not None
                if chunk.finish_reason == "cancelled":
                    return  # the client is gone
                yield chunk
                if finished:
                    return
        except StopIteration:
            return
        finally:
            stream.close()
            if cancel is not None and cancel.is_set() or not finished:
                self.requests_cancelled += 1
            self.requests_served += 1

    def close(self) -> None:
        self.engine.close()
        super().close()


# ---- reading the body --------------------------------------------------------------------------------------------


class NonFiniteNumber:
    """A number JSON cannot carry (NaN, Infinity, 1e999), kept as its text so that the field holding it can be
    named in the error instead of failing the whole body or overflowing later."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _parse_float(text: str):
    v = float(text)
    return v if math.isfinite(v) else NonFiniteNumber(text)


def describe(v) -> str:
    """A short, ASCII-safe description of a JSON value for an error message (never the whole of a big value)."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, (int, float)):
        text = repr(v) if not isinstance(v, int) or v.bit_length() < 200 else f"an integer of {len(str(v))} digits"
        return text
    if isinstance(v, NonFiniteNumber):
        return f"{v.text} (not a JSON number)"
    if isinstance(v, str):
        return json.dumps(v[:40] + ("..." if len(v) > 40 else ""))
    if isinstance(v, list):
        return f"an array of {len(v)} item{'' if len(v) == 1 else 's'}"
    if isinstance(v, dict):
        keys = ", ".join(json.dumps(k[:20]) for k in list(v)[:5])
        return f"an object with keys [{keys}{', ...' if len(v) > 5 else ''}]"
    return type(v).__name__


def _path(top: str, parts) -> str:
    out = top
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def check_values(body: dict) -> None:
    """400 naming the top-level field for a lone UTF-16 surrogate in any string or key (no tokenizer can encode
    it: sentencepiece raises) or nesting deeper than MAX_DEPTH. Iterative, so depth costs no recursion."""
    for top, value in body.items():
        todo = [(value, ())]
        while todo:
            v, parts = todo.pop()
            if len(parts) > MAX_DEPTH:
                raise APIError(400, f"'{top}' nests deeper than {MAX_DEPTH} levels", param=top)
            if isinstance(v, str):
                _check_text(v, top, parts)
            elif isinstance(v, list):
                todo.extend((x, (*parts, i)) for i, x in enumerate(v))
            elif isinstance(v, dict):
                for k, x in v.items():
                    _check_text(k, top, (*parts, "<key>"))
                    todo.append((x, (*parts, k)))


def _check_text(s: str, top: str, parts) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        where = _path(top, [p if isinstance(p, int) else json.dumps(p)[1:-1] for p in parts])
        raise APIError(400, f"{where} holds a lone UTF-16 surrogate {s[e.start]!r} at character {e.start}, "
                            "which is not text (send a valid surrogate pair or the character itself)",
                       param=top) from None  # fmt: skip


def parse_body(raw: bytes) -> dict:
    """The request object from the raw body: 400 for invalid JSON, a non-object, or what check_values finds."""
    try:
        data = json.loads(raw, parse_constant=NonFiniteNumber, parse_float=_parse_float)
    except RecursionError:
        raise APIError(400, "request body nests JSON too deeply to read") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer over Python's digit limit
        raise APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {describe(data)}")
    check_values(data)
    return data


# ---- request fields ----------------------------------------------------------------------------------------------


def _bad(name: str, want: str, v) -> APIError:
    return APIError(400, f"'{name}' must be {want}, got {describe(v)}", param=name)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, lo: float, hi: float, want: str, ok=None) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    # int/float comparisons are exact for any int, so a huge integer is refused here, never overflows float()
    if not _is_number(v) or not lo <= v <= hi or (ok is not None and not ok(v)):
        raise _bad(name, want, v)
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int | None, want: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        raise _bad(name, want, v)
    return v


def _string(body: dict, name: str) -> str | None:
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise _bad(name, "a string", v)
    return v


def _boolean(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, "true or false", v)
    return v


def _never(v) -> bool:
    return False


# Fields of features not built yet: accepted only with the value that asks for the default behaviour.
# name -> (accepts(value), the accepted value and why the others are refused)
_DEFAULT_ONLY = {
    "n": (lambda v: _is_int(v) and v == 1, "1 (one choice per request; send several requests for more)"),
    "functions": (lambda v: v == [], '[] (the deprecated "functions": send "tools")'),
    "function_call": (lambda v: v == "none", '"none" (the deprecated "function_call": send "tool_choice")'),
    "best_of": (lambda v: _is_int(v) and v == 1, "1 (best-of sampling is not supported yet)"),
    "suffix": (lambda v: v == "", '"" (insertion with a suffix is not supported yet)'),
    "store": (lambda v: v is False, "false (this server stores nothing)"),
    "modalities": (lambda v: v == ["text"], '["text"] (this server answers in text only)'),
    "verbosity": (lambda v: v == "medium", '"medium" (the model cannot be asked for another verbosity)'),
    "audio": (_never, "null (this server answers in text only)"),
    "prediction": (_never, "null (predicted outputs are not supported)"),
    "reasoning_effort": (_never, "null (reasoning effort is not supported)"),
    "web_search_options": (_never, "null (this server cannot search the web)"),
}

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                   "repetition_penalty", "penalty_last_n", "seed", "logit_bias")  # fmt: skip
_COMMON_FIELDS = {"model", "max_tokens", "n", "stop", "stream", "stream_options", "user", *SAMPLING_FIELDS}
CHAT_FIELDS = frozenset(_COMMON_FIELDS | {
    "messages", "max_completion_tokens", "metadata", "prompt_cache_key", "safety_identifier", "service_tier",
    "parallel_tool_calls", "logprobs", "store", "response_format", "tools", "tool_choice", "functions",
    "function_call", "top_logprobs", "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
    "verbosity",
})  # fmt: skip
COMPLETION_FIELDS = frozenset(_COMMON_FIELDS | {"prompt", "echo", "best_of", "suffix", "logprobs"})


def parse_sampling(body: dict, n_vocab: int) -> dict:
    """SamplingParams keyword arguments from the request's sampling fields (ranges in the module docstring)."""
    kw = {}
    t = _number(body, "temperature", 0, 2, "0 (greedy) or a number in [1e-30, 2]", lambda v: v == 0 or v >= 1e-30)
    for name, value in (
        ("temperature", t),
        ("top_p", _number(body, "top_p", 0, 1, "a number in (0, 1]", lambda v: v > 0)),
        ("min_p", _number(body, "min_p", 0, 1, "a number in [0, 1]")),
        ("frequency_penalty", _number(body, "frequency_penalty", -2, 2, "a number in [-2, 2]")),
        ("presence_penalty", _number(body, "presence_penalty", -2, 2, "a number in [-2, 2]")),
        ("repetition_penalty", _number(body, "repetition_penalty", 0.01, 100, "a number in [0.01, 100] (1 = off)")),
        ("top_k", _integer(body, "top_k", 0, None, "an integer >= 0 (0 = off)")),
        ("penalty_last_n", _integer(body, "penalty_last_n", -1, None, "an integer >= -1 (-1 = all, 0 = off)")),
        ("seed", _integer(body, "seed", 0, 2**64 - 1, "an integer in [0, 2**64)")),
    ):
        if value is not None:
            kw[name] = value
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise _bad("logit_bias", "an object mapping token ids to numbers in [-100, 100]", bias)
        parsed = {}
        for k, v in bias.items():
            if not (k.isascii() and k.isdigit() and len(k) <= 10):
                raise APIError(400, f"'logit_bias' key {describe(k)} is not a token id", param="logit_bias")
            tid = int(k)
            if tid >= n_vocab:
                raise APIError(400, f"'logit_bias' token id {tid} is outside [0, {n_vocab})", param="logit_bias")
            if not _is_number(v) or not -100 <= v <= 100:
                raise APIError(400, f"'logit_bias' value for token {tid} must be a number in [-100, 100], "
                                    f"got {describe(v)}", param="logit_bias")  # fmt: skip
            parsed[tid] = float(v)
        kw["logit_bias"] = parsed
    try:
        SamplingParams(**kw)  # the library's own checks agree with the ranges above; kept as a guard
    except (ValueError, TypeError) as e:
        name = str(e).split(" ", 1)[0]
        raise APIError(400, str(e), param=name if name in SAMPLING_FIELDS else None) from None
    return kw


def _check_field_set(body: dict, chat: bool) -> None:
    """400 naming the first field this endpoint does not know, or a default-only field with another value."""
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for name, v in body.items():
        if name not in known:
            other = "/v1/completions" if chat else "/v1/chat/completions"
            hint = f" (it belongs to {other})" if name in (COMPLETION_FIELDS if chat else CHAT_FIELDS) else ""
            raise APIError(400, f"unknown field {describe(name)}{hint}", param=name)
        if v is None:
            continue
        rule = _DEFAULT_ONLY.get(name)
        if rule is not None and not rule[0](v):
            raise _bad(name, rule[1], v)


def _check_harmless(body: dict) -> None:
    for name in ("model", "user", "prompt_cache_key", "safety_identifier"):
        _string(body, name)
    tier = body.get("service_tier")
    if tier is not None and tier not in ("auto", "default"):
        raise _bad("service_tier", '"auto" or "default" (there is one tier here)', tier)
    _boolean(body, "parallel_tool_calls", True)
    meta = body.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values())):
        raise _bad("metadata", "an object of strings", meta)


def _parse_stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and len(stop) <= MAX_STOPS and all(isinstance(s, str) for s in stop):
        return stop
    raise _bad("stop", f"a string or a list of at most {MAX_STOPS} strings", stop)


def _parse_stream_options(body: dict, stream: bool) -> bool:
    """include_usage from stream_options (which needs stream: true)."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise _bad("stream_options", 'an object such as {"include_usage": true}', opts)
    if not stream:
        raise APIError(400, "'stream_options' is only allowed with \"stream\": true", param="stream_options")
    for k, v in opts.items():
        if k == "include_usage" and (v is None or isinstance(v, bool)):
            continue
        if k == "include_obfuscation" and v in (None, False):
            continue
        raise APIError(400, f"'stream_options' holds {describe(k)}: {describe(v)}; accepted: include_usage "
                            "(true/false), include_obfuscation (false)", param="stream_options")  # fmt: skip
    return bool(opts.get("include_usage"))


_ROLES = ("system", "developer", "user", "assistant", "tool")
# message keys beyond role/content: name and tool_call_id go to the chat template; the others only as null/[]
_MESSAGE_PASSED = ("name", "tool_call_id")
_MESSAGE_EMPTY = ("refusal", "function_call", "audio")


def _message_content(m: dict, i: int) -> str:
    content = m.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for j, part in enumerate(content):
            if (not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str)
                    or set(part) - {"type", "text"}):  # fmt: skip
                raise APIError(400, f"messages[{i}].content[{j}] must be {{\"type\": \"text\", \"text\": STRING}} "
                                    f"(only text is supported), got {describe(part)}", param="messages")  # fmt: skip
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"messages[{i}].content must be a string or a list of text parts, got {describe(content)}",
                   param="messages")  # fmt: skip


def _parse_message_tool_calls(calls, i: int) -> list[dict]:
    """An assistant turn's tool_calls: [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise APIError(400, f"{where} must be a list of tool calls, got {describe(calls)}", param="messages")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        ok = (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments", ""), str)
              and c.get("type", "function") == "function" and isinstance(c.get("id", ""), str))  # fmt: skip
        if ok:
            try:
                json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                ok = False
        if not ok:
            raise APIError(400, f"{where}[{j}] must be {{\"id\": STRING, \"type\": \"function\", \"function\": "
                                f"{{\"name\": STRING, \"arguments\": JSON TEXT}}}}, got {describe(c)}",
                           param="messages")  # fmt: skip
        out.append({"id": c.get("id", f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn.get("arguments") or "{}"}})  # fmt: skip
    return out


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "a non-empty list of messages", messages)
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a 'role' string, got {describe(m)}",
                           param="messages")  # fmt: skip
        if m["role"] not in _ROLES:
            raise APIError(400, f"messages[{i}].role {describe(m['role'])} is not one of {', '.join(_ROLES)}",
                           param="messages")  # fmt: skip
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": _message_content(m, i)}
        for k, v in m.items():
            if k in ("role", "content") or v is None:
                continue
            if k in _MESSAGE_PASSED and isinstance(v, str):
                msg[k] = v
            elif k == "tool_calls":
                msg[k] = _parse_message_tool_calls(v, i)
            elif k in _MESSAGE_EMPTY and v == []:
                continue
            else:
                want = "a string" if k in _MESSAGE_PASSED else "null (not supported yet)"
                if k not in _MESSAGE_PASSED + _MESSAGE_EMPTY:
                    want = f"absent: messages take role, content, tool_calls, {', '.join(_MESSAGE_PASSED)}"
                raise APIError(400, f"messages[{i}].{describe(k)[1:-1]} must be {want}, got {describe(v)}",
                               param="messages")  # fmt: skip
        out.append(msg)
    return out


def parse_prompt(body: dict, n_vocab: int) -> str | list[int]:
    """The completion prompt: a string (also as a one-string list) or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            if len(prompt) == 1:
                return prompt[0]
            raise APIError(400, f"'prompt' holds {len(prompt)} prompts; send one per request", param="prompt")
        if all(_is_int(t) for t in prompt):
            bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise APIError(400, f"'prompt' token id {describe(bad)} is outside [0, {n_vocab})", param="prompt")
            return prompt
    raise _bad("prompt", "a string or a non-empty list of token ids", prompt)


@dataclass
class CompletionRequest:
    """A validated request: everything the endpoint needs, nothing left to check against the model but the
    prompt's length."""

    chat: bool
    sampling: dict  # SamplingParams keyword arguments
    stop: list[str]
    max_tokens: int | None  # None: the endpoint's default
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] | None = None  # chat
    prompt: str | list[int] | None = None  # completions
    logprobs: int | None = None  # None: off; k: each token's logprob and k alternatives
    echo: bool = False  # completions: the prompt comes back before the completion
    chat_options: dict = field(default_factory=dict)  # Model.prepare_chat keyword arguments (tools, response_format)


def parse_request(body: dict, chat: bool, n_vocab: int) -> CompletionRequest:
    """Validate a /v1/chat/completions (chat=True) or /v1/completions body; APIError(400, param=field) on the
    first field that is wrong, unknown, or asks for something not supported (see the module docstring)."""
    _check_field_set(body, chat)
    _check_harmless(body)
    max_tokens = None
    if chat:
        max_tokens = _integer(body, "max_completion_tokens", 0, None, "an integer >= 0")
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 0, None, "an integer >= 0")
    stream = _boolean(body, "stream", False)
    req = CompletionRequest(
        chat=chat,
        sampling=parse_sampling(body, n_vocab),
        stop=_parse_stop(body),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=_parse_stream_options(body, stream),
    )
    if chat:
        req.messages = parse_messages(body)
        req.chat_options = _parse_chat_options(body)
        if _boolean(body, "logprobs", False):
            req.logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, f"an integer in [0, {MAX_TOP_LOGPROBS}]")
            req.logprobs = req.logprobs or 0
        elif body.get("top_logprobs") is not None:
            raise APIError(400, "'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
    else:
        req.prompt = parse_prompt(body, n_vocab)
        req.logprobs = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS, f"null or an integer in [0, {MAX_TOP_LOGPROBS}]")
        req.echo = _boolean(body, "echo", False)
    return req


def _parse_chat_options(body: dict) -> dict:
    """response_format, tools, tool_choice, parallel_tool_calls, checked here so that a bad one is a 400 naming it
    (the grammar itself is compiled against the vocabulary when the prompt is prepared)."""
    from .errors import GrammarError
    from .grammar import grammar_of
    from .tool_calls import check_tools

    options = {"parallel_tool_calls": _boolean(body, "parallel_tool_calls", True)}
    rf = body.get("response_format")
    if rf is not None:
        try:
            grammar_of(rf)
        except GrammarError as e:
            raise APIError(400, str(e), param="response_format") from None
        options["response_format"] = rf
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools == []:
        tools = None  # no tools offered
    if tools is not None:
        try:
            check_tools(tools, choice)
        except GrammarError as e:
            raise APIError(400, str(e), param="tool_choice" if "tool_choice" in str(e) else "tools") from None
        options["tools"] = tools
    elif choice not in (None, "none", "auto"):
        raise APIError(400, f"'tool_choice' {describe(choice)} needs 'tools'", param="tool_choice")
    if choice is not None:
        options["tool_choice"] = choice
    return options


# ---- the app -----------------------------------------------------------------------------------------------------


async def _say_when_compiled(transformer, every_s: float = 1.0) -> None:
    """Log once the background compile the server started with is done (Transformer.compiling)."""
    t0 = time.monotonic()
    while transformer.compiling:
        await asyncio.sleep(every_s)
    log.info(
        "ggufrun: the batched kernels are compiled (%.0f s after start): batched steps at full speed",
        time.monotonic() - t0,
    )


async def _watch_disconnect(receive, cancel: threading.Event) -> None:
    """Set `cancel` when the client goes away (ASGI http.disconnect; the body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def chat_page() -> str:
    return resources.files(__package__).joinpath("static", PAGE).read_text(encoding="utf-8")


def create_app(
    model,
    model_id: str | None = None,
    api_key: str | None = None,
    max_queue: int = 64,
    cors_origins=None,
    parallel: int = 1,
):
    """The Starlette app serving `model` (a ggufrun.Model). `app.state.runner` exposes counters for tests.

    parallel: requests generated at once. 1: one at a time through Model.generate (ModelRunner; speculative
    decoding applies); N >= 2: N slots of one continuous-batching engine (EngineRunner, ggufrun.batch), each request
    getting the tokens it would get alone. `ggufrun serve` picks batch.default_slots(...) unless told --parallel.

    cors_origins: None (no CORS headers: browsers allow only same-origin pages, such as the chat page at /), or
    an origin / list of origins ("https://example.org", or "*" for any) whose pages may call the API.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    if isinstance(cors_origins, str):
        cors_origins = [cors_origins]
    if cors_origins is not None:
        cors_origins = list(cors_origins)
        if not all(isinstance(o, str) and o for o in cors_origins):
            raise ValueError(f"cors_origins must be None, an origin string or a list of them, got {cors_origins!r}")
    if not isinstance(max_queue, int) or max_queue < 0:
        raise ValueError(f"max_queue must be an integer >= 0, got {max_queue!r}")

    model_id = model_id or model.path.stem
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise ValueError(f"parallel must be a positive integer, got {parallel!r}")
    runner = ModelRunner(model, max_queue) if parallel == 1 else EngineRunner(model, parallel, max_queue)
    created = int(time.time())
    model_card = {"id": model_id, "object": "model", "created": created, "owned_by": "ggufrun"}
    page = chat_page()

    class JSON(JSONResponse):
        """JSON with non-ASCII escaped: valid for any text, a lone surrogate included."""

        def render(self, content) -> bytes:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")

    def sse_data(obj) -> str:
        return "data: " + json.dumps(obj, allow_nan=False) + "\n\n"

    def error_response(e: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status == 503 else None
        return JSON(e.body(), status_code=e.status, headers=headers)

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", code="invalid_api_key")

    async def read_body(request: Request) -> dict:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise APIError(413, f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > MAX_BODY_BYTES:
                raise APIError(413, f"request body is over the limit of {MAX_BODY_BYTES} bytes")
        return parse_body(bytes(body))

    def usage(stats) -> dict:
        p, c = stats.prompt_tokens, stats.generated_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def finish_reason(chunk) -> str:
        return chunk.finish_reason if chunk.finish_reason in ("length", "tool_calls") else "stop"

    def token_entry(piece: bytes, logprob: float) -> dict:
        return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}

    def token_text(token: int) -> str:
        return model.tokenizer.token_piece(token, special=True).decode("utf-8", "replace")

    def chat_logprobs(chunk) -> dict:
        """OpenAI's chat `logprobs.content` entry for one generated token (its bytes come with the chunk)."""
        return {**token_entry(chunk.token_bytes, chunk.logprob),
                "top_logprobs": [token_entry(b, lp) for _, lp, b in chunk.top_logprobs]}  # fmt: skip

    def completion_logprobs(tokens: list, offset0: int) -> dict:
        """The legacy completions `logprobs` object for [(token, logprob or None, top or None), ...]."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = offset0
        for token, logprob, top in tokens:
            text = token_text(token)
            out["tokens"].append(text)
            out["token_logprobs"].append(logprob)
            out["top_logprobs"].append(None if top is None else {token_text(t): lp for t, lp, *_ in top})
            out["text_offset"].append(offset)
            offset += len(text)
        return out

    async def prepare(req: CompletionRequest):
        """(prompt ids, constraint, tool-call format or None) on the model thread; 400 for what the template,
        tokenizer or grammar engine refuse."""
        param = "messages" if req.chat else "prompt"
        constraint = fmt = None
        try:
            if req.chat:
                prepared = await runner.call(lambda: model.prepare_chat(req.messages, **req.chat_options))
                ids, constraint = prepared.ids, prepared.constraint
                fmt = prepared.tool_format if prepared.tools_offered else None
            elif isinstance(req.prompt, str):
                ids = await runner.call(model.tokenize, req.prompt)
            else:
                ids = req.prompt
        except GrammarError as e:
            where = "response_format" if "response_format" in req.chat_options else "tools"
            raise APIError(400, str(e), param=where) from None
        except ValueError as e:  # ChatTemplateError, TokenizerError, no template
            raise APIError(400, str(e), param=param) from None
        if not ids:
            raise APIError(400, f"'{param}' has no tokens (this model adds no BOS token)", param=param)
        if len(ids) >= model.n_ctx:
            raise APIError(400, f"prompt has {len(ids)} tokens; this model's context holds {model.n_ctx} and "
                                "at least one more is needed to generate", param=param,
                           code="context_length_exceeded")  # fmt: skip
        return ids, constraint, fmt

    async def overflow_as_400(chunks, chat: bool):
        """The chunks, with a prompt that does not fit the context answered 400 (context_length_exceeded)."""
        try:
            async for c in chunks:
                yield c
        except ContextOverflowError as e:
            raise APIError(
                400, str(e), param="messages" if chat else "prompt", code="context_length_exceeded"
            ) from None
        finally:
            await chunks.aclose()

    async def echo_logprobs(req: CompletionRequest, ids: list[int]) -> list:
        """(token, logprob, top) of every prompt token for `echo` with `logprobs` (the first has no logprob)."""
        scored = await runner.call(lambda: model.logprobs(ids, top_logprobs=req.logprobs)) if len(ids) > 1 else []
        return [(ids[0], None, None)] + [(lp.token, lp.logprob, lp.top()) for lp in scored]

    async def complete(request: Request, chat: bool):
        check_auth(request)
        req = parse_request(await read_body(request), chat, model.n_vocab)
        cancel = threading.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(request.receive, cancel))
        handed_off = False
        try:
            ids, constraint, tool_format = await prepare(req)
            max_tokens = req.max_tokens
            if max_tokens is None:
                max_tokens = model.n_ctx - len(ids) if chat else 16  # OpenAI's default for completions
            echo_text = ""
            if req.echo:
                echo_text = req.prompt if isinstance(req.prompt, str) else model.detokenize(ids)
            echoed = await echo_logprobs(req, ids) if req.echo and req.logprobs is not None else []

            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
            obj = "chat.completion.chunk" if chat else "text_completion"
            base = {"id": rid, "object": obj, "created": int(time.time()), "model": model_id}
            chunks = overflow_as_400(
                runner.generate(ids, max_tokens, req.stop, cancel, constraint, req.logprobs, dict(req.sampling),
                                tool_format),
                chat,
            )  # fmt: skip

            if not req.stream:
                text, scored, last = [], [], None
                async for c in chunks:
                    text.append(c.text)
                    if c.token is not None:
                        scored.append(c)
                    last = c
                if last is None or cancel.is_set():
                    return Response(status_code=499)  # the client has gone; nobody reads this
                out = "".join(text)
                if chat:
                    message = {"role": "assistant", "content": out}
                    if tool_format is not None:
                        calls = last.tool_calls
                        message = {"role": "assistant", "content": last.content or (None if calls else ""),
                                   **({"tool_calls": calls} if calls else {})}  # fmt: skip
                    logprobs = {"content": [chat_logprobs(c) for c in scored]} if req.logprobs is not None else None
                    choice = {"index": 0, "message": message, "logprobs": logprobs,
                              "finish_reason": finish_reason(last)}  # fmt: skip
                else:
                    logprobs = None
                    if req.logprobs is not None:
                        generated = [(c.token, c.logprob, c.top_logprobs) for c in scored]
                        logprobs = completion_logprobs(echoed + generated, 0)
                    choice = {"index": 0, "text": echo_text + out, "logprobs": logprobs,
                              "finish_reason": finish_reason(last)}  # fmt: skip
                return JSON(
                    {
                        **base,
                        "object": "chat.completion" if chat else "text_completion",
                        "choices": [choice],
                        "usage": usage(last.stats),
                    }  # fmt: skip
                )

            # Start the generation before answering 200, so that queue-full and bad-request errors get their status.
            try:
                first = await chunks.__anext__()
            except StopAsyncIteration:
                return Response(status_code=499)
            handed_off = True
        finally:
            if not handed_off:
                watcher.cancel()

        def event(choice_delta, finish=None, logprobs=None) -> str:
            if chat:
                choice = {"index": 0, "delta": choice_delta, "logprobs": logprobs, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": choice_delta, "logprobs": logprobs, "finish_reason": finish}
            return sse_data({**base, "choices": [choice]})

        def chunk_logprobs(c):
            if req.logprobs is None or c.token is None:
                return None
            if chat:
                return {"content": [chat_logprobs(c)]}
            return completion_logprobs([(c.token, c.logprob, c.top_logprobs)], 0)

        async def sse():
            c = first
            try:
                if chat:
                    yield event({"role": "assistant", "content": ""})
                elif req.echo:
                    yield event(echo_text, logprobs=completion_logprobs(echoed, 0) if echoed else None)
                while True:
                    lp = chunk_logprobs(c)
                    if tool_format is not None:  # the text goes out once parsed for calls, at the end
                        if lp is not None:
                            yield event({}, logprobs=lp)
                    elif c.text or lp is not None:
                        yield event({"content": c.text} if chat else c.text, logprobs=lp)
                    if c.finish_reason is not None:
                        if tool_format is not None:
                            if c.content:
                                yield event({"content": c.content})
                            if c.tool_calls:
                                deltas = [{"index": i, **call} for i, call in enumerate(c.tool_calls)]
                                yield event({"tool_calls": deltas})
                        yield event({} if chat else "", finish_reason(c))
                        if req.include_usage:
                            yield sse_data({**base, "choices": [], "usage": usage(c.stats)})
                        break
                    c = await chunks.__anext__()
            except StopAsyncIteration:  # cancelled: the client is gone
                pass
            except APIError as e:
                yield sse_data(e.body())
            except Exception as e:  # a server bug: end the stream the way an OpenAI client understands
                log.exception("generation failed mid-stream")
                yield sse_data(APIError(500, f"internal error: {type(e).__name__}: {e}").body())
            finally:
                watcher.cancel()
                await chunks.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    async def completions(request: Request):
        return await complete(request, chat=False)

    async def embeddings(request: Request):
        check_auth(request)
        raise APIError(501, "this server does not compute embeddings (/v1/embeddings): it serves a text-generation "
                            "model; run an embedding model under llama.cpp's `llama-server --embeddings`, or score "
                            "text with ggufrun's Python API (Model.logits)", code="not_supported")  # fmt: skip

    async def models(request: Request):
        check_auth(request)
        return JSON({"object": "list", "data": [model_card]})

    async def one_model(request: Request):
        check_auth(request)
        name = request.path_params["name"]
        if name != model_id:
            raise APIError(404, f"model {describe(name)} is not served here; this server serves {describe(model_id)}",
                           param="model", code="model_not_found")  # fmt: skip
        return JSON(model_card)

    async def health(request: Request):
        return JSON(
            {
                "status": "ok",
                "model": model_id,
                "busy": runner.busy,
                "parallel": parallel,
                "waiting": runner.waiting,
                "tokens_generated": runner.tokens_generated,
                "requests_served": runner.requests_served,
                "requests_cancelled": runner.requests_cancelled,
                "compiling": model.transformer.compiling,
            }  # fmt: skip
        )

    async def index(request: Request):
        return HTMLResponse(page)

    async def on_api_error(request, exc: APIError):
        return error_response(exc)

    async def on_http_error(request, exc: HTTPException):
        msg = {404: f"no route {request.method} {request.url.path}", 405: f"method {request.method} not allowed"}
        return error_response(APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail))))

    async def on_error(request, exc: Exception):
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    @asynccontextmanager
    async def lifespan(app):
        log.info("ggufrun: serving %r as model %r (requests may name any model); chat page at /", str(model.path),
                 model_id)  # fmt: skip
        if parallel > 1:
            log.info("ggufrun: %d requests generate at once (--parallel), in one batch", parallel)
            keys_mb = getattr(runner, "keys_mb", 0.0)
            if keys_mb:
                log.info("ggufrun: the slots' keys (%.0f MB) %s", keys_mb, "were faulted in at start" if
                         runner.keys_prefaulted else "are faulted in as the slots are first used")  # fmt: skip
        watch = None
        if model.transformer.compiling:
            log.info("ggufrun: the batched kernels still compile in the background (the first run after an install "
                     "or an update, about a minute on 2 cores): requests are answered meanwhile, prompts and "
                     "concurrent requests row by row; GET /health says \"compiling\" until then")  # fmt: skip
            watch = asyncio.create_task(_say_when_compiled(model.transformer))
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            runner.close()

    middleware = []
    if cors_origins is not None:
        from starlette.middleware.cors import CORSMiddleware

        middleware.append(Middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"], max_age=600))  # fmt: skip
    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{name:path}", one_model, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        middleware=middleware,
        exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_error},
        lifespan=lifespan,
    )
    app.state.runner = runner
    app.state.model_id = model_id
    return app
