"""The OpenAI-compatible server: a real uvicorn server on 127.0.0.1 and the official `openai` client."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.real

API_KEY = "test-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, app):
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def model(smollm2_path):
    import ggufrun

    m = ggufrun.load(smollm2_path, n_ctx=512, n_threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def server(model):
    from ggufrun.server import create_app

    s = _Server(create_app(model, model_id="smollm2", api_key=API_KEY))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_chat_non_streaming_and_streaming_agree(client):
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    text = r.choices[0].message.content
    assert "Paris" in text
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    stream = client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    events = list(stream)
    assert events[0].choices[0].delta.role == "assistant"
    content = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert content == text
    finals = [e.choices[0].finish_reason for e in events if e.choices and e.choices[0].finish_reason]
    assert finals == [r.choices[0].finish_reason]
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == r.usage.completion_tokens


def test_completions_non_streaming_and_streaming_agree(client):
    r = client.completions.create(model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=8)
    text = r.choices[0].text
    assert "Paris" in text and r.choices[0].finish_reason == "length"
    events = list(client.completions.create(model="smollm2", prompt="The capital of France is", temperature=0,
                                            max_tokens=8, stream=True))  # fmt: skip
    assert "".join(e.choices[0].text for e in events) == text


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok"


def test_sixteen_concurrent_streams(client):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(16)]
    expected = {
        p: client.completions.create(model="smollm2", prompt=p, temperature=0, max_tokens=6).choices[0].text
        for p in prompts
    }

    def one(p):
        events = client.completions.create(model="smollm2", prompt=p, temperature=0, max_tokens=6, stream=True)
        return "".join(e.choices[0].text for e in events)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = dict(zip(prompts, pool.map(one, prompts)))
    assert got == expected


def test_disconnect_frees_the_model(client, server):
    health = lambda: httpx.get(server.url + "/health").json()  # noqa: E731
    before = health()["tokens_generated"]
    with httpx.stream("POST", server.url + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"prompt": "Tell me a very long story.", "max_tokens": 400, "stream": True,
                            "temperature": 0}, timeout=30) as r:  # fmt: skip
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: {"):
                got += 1
                if got == 3:
                    break
    # connection closed: generation stops within a token or two
    time.sleep(1.0)
    stopped = health()
    time.sleep(0.5)
    assert health()["tokens_generated"] == stopped["tokens_generated"]
    assert stopped["tokens_generated"] - before < 100
    assert not stopped["busy"]
    t = time.time()
    r = client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, temperature=0)
    assert r.choices[0].text is not None and time.time() - t < 10


def _post(server, path, body=None, raw=None, key=API_KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        headers["Content-Type"] = "application/json"
        return httpx.post(server.url + path, content=raw, headers=headers, timeout=30)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"messages": "hi"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_p": 3}, 400, None),
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}, 404, "model"),
    ],
)
def test_bad_requests(server, body, status, param):
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param:
        assert err["param"] == param


def test_malformed_json_huge_body_huge_prompt_auth_and_routes(server):
    r = _post(server, "/v1/chat/completions", raw=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = _post(server, "/v1/completions", raw=b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
    assert r.status_code == 413
    r = _post(server, "/v1/completions", {"prompt": "hello " * 2000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = _post(server, "/v1/completions", {"prompt": "hi"}, key="wrong")
    assert r.status_code == 401
    r = _post(server, "/v1/completions", {"prompt": "hi"}, key=None)
    assert r.status_code == 401
    r = httpx.get(server.url + "/v1/nothing", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 404 and "error" in r.json()
    # the openai client raises its typed errors
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_queue_limit_answers_503(model):
    from ggufrun.server import create_app

    s = _Server(create_app(model, model_id="m", max_queue=0))
    try:
        with httpx.stream("POST", s.url + "/v1/completions",
                          json={"prompt": "Once upon a time", "max_tokens": 200, "stream": True,
                                "logit_bias": {"0": -1e9, "2": -1e9}}) as r:  # fmt: skip
            lines = r.iter_lines()  # keep a reference: a dropped iterator closes the connection
            assert next(lines).startswith('data: {"id"')  # the first request now holds the model
            r2 = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert r2.status_code == 503 and r2.headers["retry-after"] == "1", r2.text
            assert json.loads(r2.text)["error"]["code"] == "queue_full"
    finally:
        s.stop()
