"""OpenAI-compatible HTTP server: `ggufrun serve MODEL` (extra: `pip install ggufrun[server]`).

Starlette + uvicorn (the common ASGI stack): SSE streaming with flow control, disconnect detection and a
small, well-tested HTTP layer we do not have to write ourselves. The core library never imports this module.

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health.

How requests meet the model:
- One model, one generation at a time. All model work runs on one dedicated thread (Numba's thread count is a
  per-thread setting, and the model is not thread-safe); requests wait their turn in FIFO order, and past
  `max_queue` waiting requests the server answers 503 with Retry-After instead of piling up.
- Backpressure: the next token is computed only when the previous chunk has been handed to the client's socket
  (one `next()` per chunk), so a stalled client stalls its own generation instead of growing a buffer.
- A client that disconnects cancels its request: the generator is closed after the token in flight, which frees
  the model for the next request within one token time.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from .sampling import SamplingParams

MAX_BODY_BYTES = 1 << 20  # a request body above this is answered 413


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

    async def call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def stream(self, make_chunks):
        """Async iterator over the chunks of `make_chunks()` (a function returning a generator)."""
        if self.lock.locked() and self.waiting >= self.max_queue:
            raise QueueFull(self.waiting)
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
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
            self.busy = False
            self.requests_served += 1
            self.lock.release()


# ---- request parsing ---------------------------------------------------------------------------------------------

_NUMBER = (int, float)


def _field(body: dict, name: str, types, default=None, check=None, what: str = ""):
    if name not in body or body[name] is None:
        return default
    v = body[name]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise APIError(400, f"'{name}' must be {what or types}, got {v!r}", param=name)
    if not isinstance(v, types):
        raise APIError(400, f"'{name}' must be {what or types}, got {type(v).__name__}", param=name)
    if check is not None and not check(v):
        raise APIError(400, f"'{name}' must be {what}, got {v!r}", param=name)
    return v


def parse_sampling(body: dict, n_vocab: int) -> tuple[dict, int | None, list[str]]:
    """(SamplingParams kwargs, max_tokens or None, stop strings) from an OpenAI request body."""
    _field(body, "n", int, 1, lambda v: v == 1, "1 (only one choice per request is supported)")  # validated only
    max_tokens = _field(body, "max_completion_tokens", int, None, lambda v: v >= 0, "an integer >= 0")
    if max_tokens is None:
        max_tokens = _field(body, "max_tokens", int, None, lambda v: v >= 0, "an integer >= 0")
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        stops = stop
    else:
        raise APIError(400, "'stop' must be a string or a list of at most 16 strings", param="stop")
    kw = {}
    for name, key, what in (
        ("temperature", "temperature", "a number >= 0"),
        ("top_p", "top_p", "a number in (0, 1]"),
        ("min_p", "min_p", "a number in [0, 1]"),
        ("frequency_penalty", "frequency_penalty", "a number"),
        ("presence_penalty", "presence_penalty", "a number"),
        ("repetition_penalty", "repetition_penalty", "a number > 0"),
    ):
        v = _field(body, key, _NUMBER, None, None, what)
        if v is not None:
            kw[name] = float(v)
    top_k = _field(body, "top_k", int, None, None, "an integer >= 0")
    if top_k is not None:
        kw["top_k"] = top_k
    seed = _field(body, "seed", int, None, None, "an integer")
    if seed is not None:
        kw["seed"] = seed
    bias = _field(body, "logit_bias", dict, None, None, "an object mapping token ids to numbers")
    if bias:
        parsed = {}
        for k, v in bias.items():
            try:
                tid = int(k)
            except (TypeError, ValueError):
                raise APIError(400, f"'logit_bias' key {k!r} is not a token id", param="logit_bias") from None
            if not 0 <= tid < n_vocab:
                raise APIError(400, f"'logit_bias' token id {tid} is outside [0, {n_vocab})", param="logit_bias")
            if isinstance(v, bool) or not isinstance(v, _NUMBER):
                raise APIError(400, f"'logit_bias' value for {k} must be a number", param="logit_bias")
            parsed[tid] = float(v)
        kw["logit_bias"] = parsed
    try:
        SamplingParams(**kw)  # validate ranges now, while we can still answer 400
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e)) from None
    return kw, max_tokens, stops


def _message_content(m, i: int) -> str:
    content = m.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a 'role' string", param="messages")
        if m["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(400, f"messages[{i}].role {m['role']!r} is not a known role", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _message_content(m, i)})
    return out


# ---- the app -----------------------------------------------------------------------------------------------------


def create_app(model, model_id: str | None = None, api_key: str | None = None, max_queue: int = 64):
    """The Starlette app serving `model` (a ggufrun.Model). `app.state.runner` exposes counters for tests."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from .errors import ContextOverflowError

    model_id = model_id or model.path.stem
    runner = ModelRunner(model, max_queue=max_queue)
    created = int(time.time())

    def error_response(e: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status == 503 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", code="invalid_api_key")

    async def read_json(request: Request) -> dict:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise APIError(413, f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > MAX_BODY_BYTES:
                raise APIError(413, f"request body is over the limit of {MAX_BODY_BYTES} bytes")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object")
        name = data.get("model")
        if name is not None and name != model_id:
            raise APIError(404, f"model {name!r} is not served here; this server serves {model_id!r}",
                           param="model", code="model_not_found")  # fmt: skip
        return data

    def usage(stats) -> dict:
        p, c = stats.prompt_tokens, stats.generated_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def finish_reason(chunk) -> str:
        return "length" if chunk.finish_reason == "length" else "stop"

    async def complete(request: Request, chat: bool):
        check_auth(request)
        body = await read_json(request)
        kw, max_tokens, stops = parse_sampling(body, model.n_vocab)
        stream = _field(body, "stream", bool, False, None, "a boolean")
        opts = _field(body, "stream_options", dict, {}, None, "an object")
        include_usage = bool(opts.get("include_usage"))
        if chat:
            messages = parse_messages(body)
            try:
                ids = await runner.call(model.chat_ids, messages)
            except ValueError as e:
                raise APIError(400, str(e), param="messages") from None
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = prompt
            elif isinstance(prompt, str):
                ids = await runner.call(model.tokenize, prompt)
            else:
                raise APIError(400, "'prompt' must be a string or a list of token ids", param="prompt")
        if len(ids) >= model.n_ctx:
            raise APIError(400, f"prompt has {len(ids)} tokens; this model's context holds {model.n_ctx}",
                           param="messages" if chat else "prompt", code="context_length_exceeded")  # fmt: skip
        if max_tokens is None:
            max_tokens = model.n_ctx - len(ids) if chat else 16

        def make_chunks():
            try:
                return model.generate(ids, max_tokens, stops, **kw)
            except ContextOverflowError as e:
                raise APIError(400, str(e), code="context_length_exceeded") from None
            except ValueError as e:
                raise APIError(400, str(e)) from None

        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion.chunk" if chat else "text_completion"
        base = {"id": rid, "object": obj, "created": int(time.time()), "model": model_id}
        chunks = runner.stream(make_chunks)

        if not stream:
            text, last = [], None
            async for c in chunks:
                text.append(c.text)
                last = c
            out = "".join(text)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": out}, "logprobs": None,
                          "finish_reason": finish_reason(last)}  # fmt: skip
            else:
                choice = {"index": 0, "text": out, "logprobs": None, "finish_reason": finish_reason(last)}
            return JSONResponse(
                {
                    **base,
                    "object": "chat.completion" if chat else "text_completion",
                    "choices": [choice],
                    "usage": usage(last.stats),
                }  # fmt: skip
            )

        # Start the generation before answering 200, so that queue-full and bad-request errors get their status.
        first = await chunks.__anext__()

        def event(choice_delta, finish=None, extra=None) -> str:
            if chat:
                choice = {"index": 0, "delta": choice_delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": choice_delta, "logprobs": None, "finish_reason": finish}
            return "data: " + json.dumps({**base, "choices": [choice], **(extra or {})}) + "\n\n"

        async def sse():
            c = first
            try:
                if chat:
                    yield event({"role": "assistant", "content": ""})
                while True:
                    if c.text:
                        yield event({"content": c.text} if chat else c.text)
                    if c.finish_reason is not None:
                        yield event({} if chat else "", finish_reason(c))
                        if include_usage:
                            yield "data: " + json.dumps({**base, "choices": [], "usage": usage(c.stats)}) + "\n\n"
                        break
                    c = await chunks.__anext__()
            except StopAsyncIteration:
                pass
            except APIError as e:
                yield "data: " + json.dumps(e.body()) + "\n\n"
            finally:
                await chunks.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    async def completions(request: Request):
        return await complete(request, chat=False)

    async def models(request: Request):
        check_auth(request)
        return JSONResponse(
            {"object": "list", "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "ggufrun"}]}
        )

    async def health(request: Request):
        return JSONResponse(
            {
                "status": "ok",
                "model": model_id,
                "busy": runner.busy,
                "waiting": runner.waiting,
                "tokens_generated": runner.tokens_generated,
                "requests_served": runner.requests_served,
            }  # fmt: skip
        )

    async def on_api_error(request, exc: APIError):
        return error_response(exc)

    async def on_http_error(request, exc: HTTPException):
        msg = {404: f"no route {request.method} {request.url.path}", 405: f"method {request.method} not allowed"}
        return error_response(APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail))))

    async def on_error(request, exc: Exception):
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_error},
    )
    app.state.runner = runner
    app.state.model_id = model_id
    return app
