"""The server's HTTP behaviour on the tiny synthetic model (tests/synthetic.py: byte-level BPE + ChatML), with a
real uvicorn server: response shapes, the field policy, errors naming their field, disconnects, CORS, routes."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from live_server import LiveServer, ModelWrapper

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(chat_model):
    from ggufrun.server import create_app

    with LiveServer(create_app(chat_model, model_id="tiny", api_key=API_KEY)) as s:
        yield s


def post(server, path, body=None, raw=None, key=API_KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        headers["Content-Type"] = "application/json"
        return httpx.post(server.url + path, content=raw, headers=headers, timeout=30, **kw)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=30, **kw)


def assert_error(r, status: int, param: str | None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert err["param"] == param, err
    return err


def sse_events(text: str) -> list:
    """The data payloads of an SSE body, parsed ("[DONE]" kept as the string)."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---- responses -----------------------------------------------------------------------------------------------


def test_chat_completion_has_openai_shape(server):
    r = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and 0 < u["completion_tokens"] <= 5


def test_streamed_chat_equals_non_streamed(server, no_eog):
    body = {"messages": HI, "max_tokens": 12, "temperature": 0, "logit_bias": no_eog}
    whole = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    r = post(server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [e for e in events[:-1] if e["choices"]]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 12


def test_completion_accepts_token_ids(server, chat_model, no_eog):
    ids = chat_model.tokenize("hello there")
    body = {"max_tokens": 6, "temperature": 0, "logit_bias": no_eog}
    by_text = post(server, "/v1/completions", {**body, "prompt": "hello there"}).json()
    by_ids = post(server, "/v1/completions", {**body, "prompt": ids}).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


def test_completion_max_tokens_defaults_to_16(server, no_eog):
    r = post(server, "/v1/completions", {"prompt": "hello", "temperature": 0, "logit_bias": no_eog})
    assert r.json()["usage"]["completion_tokens"] == 16


def test_any_model_name_is_accepted_and_the_served_id_answers(server):
    r = post(server, "/v1/chat/completions", {"model": "gpt-4o", "messages": HI, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"


def test_models_lists_the_served_id(server):
    r = httpx.get(server.url + "/v1/models", headers=AUTH)
    assert [m["id"] for m in r.json()["data"]] == ["tiny"]


def test_model_retrieve(server):
    r = httpx.get(server.url + "/v1/models/tiny", headers=AUTH)
    assert r.status_code == 200 and r.json()["id"] == "tiny" and r.json()["object"] == "model"


def test_model_retrieve_unknown_is_404(server):
    r = httpx.get(server.url + "/v1/models/org/other-model", headers=AUTH)
    err = assert_error(r, 404, "model")
    assert err["code"] == "model_not_found" and "tiny" in err["message"]


def test_embeddings_is_501_naming_the_alternative(server):
    r = post(server, "/v1/embeddings", {"input": "hello", "model": "tiny"})
    err = assert_error(r, 501, None)
    assert "llama-server --embeddings" in err["message"]


def test_openai_client_against_tiny_model(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    r = client.chat.completions.create(model="anything", messages=HI, max_tokens=3, temperature=0)
    assert r.model == "tiny" and r.usage.completion_tokens <= 3
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_openai_client_raises_typed_errors(server):
    bad_key = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=HI, temperature=5)


# ---- fields that are implemented: they change the output -----------------------------------------------------


def test_top_k_1_is_greedy(server, no_eog):
    body = {"messages": HI, "max_tokens": 8, "logit_bias": no_eog}
    greedy = post(server, "/v1/chat/completions", {**body, "temperature": 0}).json()
    for seed in (1, 2, 3):
        r = post(server, "/v1/chat/completions", {**body, "temperature": 1.5, "top_k": 1, "seed": seed}).json()
        assert r["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]


def test_logit_bias_forces_a_token(server, chat_model):
    a = chat_model.tokenize("a")[0]
    r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0,
                                         "logit_bias": {str(a): 100}})  # fmt: skip
    assert r.json()["choices"][0]["text"] == "aaaa"


def test_stop_string_ends_generation(server, chat_model):
    a = chat_model.tokenize("a")[0]
    r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 8, "temperature": 0, "stop": ["aaa"],
                                         "logit_bias": {str(a): 100}})  # fmt: skip
    assert r.json()["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}


def test_seed_reproduces_a_sample(server, no_eog):
    body = {"messages": HI, "max_tokens": 8, "temperature": 1.0, "seed": 7, "logit_bias": no_eog}
    texts = {post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"] for _ in range(2)}
    assert len(texts) == 1


# ---- fields that are not implemented, or wrong: 400 naming them, unless they ask for the default ---------------


@pytest.mark.parametrize(
    "path, field, value",
    [
        ("/v1/chat/completions", "response_format", {"type": "xml"}),
        ("/v1/chat/completions", "response_format", {"type": "json_schema", "json_schema": {"schema": 5}}),
        ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "no spaces allowed"}}]),
        ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]),
        ("/v1/chat/completions", "tool_choice", "required"),  # without tools
        ("/v1/chat/completions", "functions", [{"name": "f"}]),
        ("/v1/chat/completions", "logprobs", "yes"),
        ("/v1/chat/completions", "top_logprobs", 2),  # without logprobs: true
        ("/v1/chat/completions", "n", 2),
        ("/v1/chat/completions", "store", True),
        ("/v1/chat/completions", "reasoning_effort", "low"),
        ("/v1/chat/completions", "modalities", ["text", "audio"]),
        ("/v1/chat/completions", "frobnicate", 1),
        ("/v1/chat/completions", "prompt", "hi"),
        ("/v1/completions", "echo", "yes"),
        ("/v1/completions", "best_of", 3),
        ("/v1/completions", "suffix", "end"),
        ("/v1/completions", "logprobs", 21),
        ("/v1/completions", "n", 2),
        ("/v1/completions", "messages", HI),
        ("/v1/completions", "max_completion_tokens", 4),
    ],
)
def test_unsupported_field_is_400_naming_it(server, path, field, value):
    base = {"messages": HI} if "chat" in path else {"prompt": "hi"}
    r = post(server, path, {**base, "max_tokens": 2, field: value})
    assert_error(r, 400, field)


@pytest.mark.parametrize(
    "field, value",
    [
        ("response_format", {"type": "text"}),
        ("tools", []),
        ("tool_choice", "none"),
        ("logprobs", False),
        ("n", 1),
        ("store", False),
        ("user", "someone"),
        ("metadata", {"k": "v"}),
        ("service_tier", "auto"),
        ("parallel_tool_calls", False),
        ("top_logprobs", None),
        ("min_p", 0.1),
        ("repetition_penalty", 1.1),
        ("penalty_last_n", 16),
    ],
)
def test_default_or_harmless_field_is_accepted(server, field, value):
    r = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, field: value})
    assert r.status_code == 200, r.text


# ---- bad values: 400 naming the field, never 500 -------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, param",
    [
        ('"temperature": "hot"', "temperature"),
        ('"temperature": NaN', "temperature"),
        ('"temperature": 1e999', "temperature"),
        ('"temperature": 1e-300', "temperature"),
        ('"top_p": 0', "top_p"),
        ('"seed": -1', "seed"),
        ('"seed": ' + "9" * 400, "seed"),
        ('"max_tokens": -1', "max_tokens"),
        ('"max_tokens": true', "max_tokens"),
        ('"logit_bias": {"5": 1e300}', "logit_bias"),
        ('"logit_bias": {"5": -Infinity}', "logit_bias"),
        ('"logit_bias": {"99999999": 1}', "logit_bias"),
        ('"logit_bias": {"1_0": 1}', "logit_bias"),
        ('"frequency_penalty": 1e39', "frequency_penalty"),
        ('"presence_penalty": -3', "presence_penalty"),
        ('"repetition_penalty": 1e-300', "repetition_penalty"),
        ('"stop": [1, 2]', "stop"),
        ('"stream": "yes"', "stream"),
        ('"stream_options": {"include_usage": true}', "stream_options"),
        ('"model": 5', "model"),
        ('"messages": [{"role": "wizard", "content": "hi"}]', "messages"),
        ('"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]', "messages"),
        ('"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]', "messages"),
        ('"messages": []', "messages"),
    ],
)
def test_bad_value_is_400_naming_the_field(server, raw, param):
    text = raw if raw.startswith('"messages"') else f'"messages": [{{"role": "user", "content": "hi"}}], {raw}'
    r = post(server, "/v1/chat/completions", raw=("{" + text + "}").encode())
    assert_error(r, 400, param)


def test_all_tokens_biased_down_still_generates(server, chat_model):
    bias = {str(t): -100 for t in range(chat_model.n_vocab)}
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "logit_bias": bias, "temperature": 0.7})
    assert r.status_code == 200, r.text


def test_lone_surrogate_is_400_naming_the_field(server):
    r = post(server, "/v1/chat/completions", raw=b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}')
    err = assert_error(r, 400, "messages")
    assert "surrogate" in err["message"] and "messages[0].content" in err["message"]


def test_surrogate_pair_is_text(server):
    r = post(server, "/v1/chat/completions", raw=b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], '
                                                 b'"max_tokens": 2}')  # fmt: skip
    assert r.status_code == 200, r.text


def test_deep_json_is_400(server):
    r = post(server, "/v1/chat/completions", raw=b"[" * 100_000 + b"]" * 100_000)
    assert_error(r, 400, None)


def test_moderately_deep_field_is_400_naming_it(server):
    r = post(server, "/v1/chat/completions", raw=b'{"metadata": ' + b"[" * 500 + b"]" * 500 + b"}")
    assert_error(r, 400, "metadata")


def test_malformed_json_is_400(server):
    r = post(server, "/v1/chat/completions", raw=b"{not json")
    assert "JSON" in assert_error(r, 400, None)["message"]


def test_body_over_limit_is_413(server):
    r = post(server, "/v1/completions", raw=b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
    assert r.status_code == 413


def test_prompt_over_context_is_400(server):
    r = post(server, "/v1/completions", {"prompt": "hello " * 2000})
    assert assert_error(r, 400, "prompt")["code"] == "context_length_exceeded"


def test_wrong_api_key_is_401(server):
    assert post(server, "/v1/completions", {"prompt": "hi"}, key="wrong").status_code == 401


def test_missing_api_key_is_401(server):
    assert post(server, "/v1/completions", {"prompt": "hi"}, key=None).status_code == 401


def test_unknown_route_is_404_json(server):
    r = httpx.get(server.url + "/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and "error" in r.json()


# ---- disconnects, failures, queueing ---------------------------------------------------------------------------


def slow_server(chat_model, delay=0.05, **kw):
    from ggufrun.server import create_app

    return LiveServer(create_app(ModelWrapper(chat_model, delay=delay), model_id="tiny", **kw))


def wait_idle(s, timeout=5.0) -> tuple[dict, float]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = httpx.get(s.url + "/health").json()
        if not h["busy"] and not h["waiting"]:
            return h, time.time() - t0
        time.sleep(0.01)
    raise AssertionError(f"server still busy after {timeout} s: {h}")


def test_dropped_non_streaming_requests_free_the_model(chat_model, no_eog):
    """4 non-streaming chats whose clients give up: the model is free within about one token (50 ms here),
    where it used to finish every generation (4 x 300 tokens x 50 ms = 60 s)."""
    body = {"messages": HI, "max_tokens": 300, "logit_bias": no_eog}
    with slow_server(chat_model, delay=0.05) as s:

        def dropped():
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(s.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.5))

        threads = [threading.Thread(target=dropped) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        h, waited = wait_idle(s)
        assert waited < 1.0, waited
        assert h["requests_cancelled"] == 4 and h["tokens_generated"] < 30, h
        t0 = time.time()
        r = httpx.post(s.url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=10)
        assert r.status_code == 200 and time.time() - t0 < 2


def test_dropped_stream_frees_the_model(chat_model, no_eog):
    with slow_server(chat_model, delay=0.05) as s:
        body = {"prompt": "hi", "max_tokens": 300, "stream": True, "logit_bias": no_eog}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
        h, waited = wait_idle(s)
        assert waited < 1.0 and h["tokens_generated"] < 10, (h, waited)


def _failing(chat_model):
    """The tiny model failing after two chunks; it never stops earlier (end-of-generation tokens banned)."""
    from ggufrun.server import create_app

    bias = {t: float("-inf") for t in chat_model.tokenizer.eog_ids}
    broken = ModelWrapper(chat_model, fail_after=2, error=RuntimeError("sampler broke"), sampling={"logit_bias": bias})
    return create_app(broken, model_id="tiny")


def test_error_mid_stream_ends_with_error_event_and_done(chat_model):
    app = _failing(chat_model)
    with LiveServer(app) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 20, "stream": True})
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["type"] == "server_error" and "sampler broke" in events[-2]["error"]["message"]
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIError, match="sampler broke"):
            list(client.chat.completions.create(model="tiny", messages=HI, max_tokens=20, stream=True))


def test_error_in_non_streaming_generation_is_500_json(chat_model):
    with LiveServer(_failing(chat_model)) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 20})
        err = assert_error(r, 500, None)
        assert err["type"] == "server_error" and "sampler broke" in err["message"]


def test_queue_limit_answers_503(chat_model, no_eog):
    with slow_server(chat_model, delay=0.05, max_queue=0) as s:
        body = {"prompt": "hi", "max_tokens": 200, "stream": True, "logit_bias": no_eog}
        with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # keep a reference: a dropped iterator closes the connection
            assert next(lines).startswith('data: {"id"')  # the first request now holds the model
            r2 = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert r2.status_code == 503 and r2.headers["retry-after"] == "1", r2.text
            assert r2.json()["error"]["code"] == "queue_full"


# ---- CORS, page, start-up ------------------------------------------------------------------------------------


def test_cors_is_off_by_default(server):
    r = httpx.get(server.url + "/v1/models", headers={**AUTH, "Origin": "http://page.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_preflight_and_stream(chat_model):
    from ggufrun.server import create_app

    with LiveServer(
        create_app(chat_model, model_id="tiny", api_key=API_KEY, cors_origins=["http://page.example"])
    ) as s:
        pre = httpx.options(s.url + "/v1/chat/completions", headers={
            "Origin": "http://page.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})  # fmt: skip
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://page.example"
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        r = httpx.post(s.url + "/v1/chat/completions", headers={**AUTH, "Origin": "http://page.example"},
                       json={"messages": HI, "max_tokens": 2, "stream": True})  # fmt: skip
        assert r.headers["access-control-allow-origin"] == "http://page.example"
        assert sse_events(r.text)[-1] == "[DONE]"
        other = httpx.options(s.url + "/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert other.status_code == 400


def test_chat_page_is_served_self_contained(server):
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert 'id="input"' in page and 'id="stop"' in page and "/v1/chat/completions" in page
    assert "http://" not in page and "https://" not in page and "src=" not in page  # nothing loaded from elsewhere


def test_startup_logs_the_served_model_id(chat_model):
    from starlette.testclient import TestClient

    from ggufrun.server import create_app

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("uvicorn.error")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with TestClient(create_app(chat_model, model_id="served-id")):
            pass
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert any("'served-id'" in r.getMessage() for r in records)
