"""The OpenAI-compatible server with a real model (SmolLM2), where the answers' quality matters: a real uvicorn
server on 127.0.0.1 and the official `openai` client. Everything else is tested on the tiny synthetic model
(test_server_api.py, test_server_fuzz.py, test_server_page.py)."""

from __future__ import annotations

import concurrent.futures

import pytest
from live_server import LiveServer

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.real

API_KEY = "test-key"


@pytest.fixture(scope="module")
def model(smollm2_model):
    smollm2_model.reset()
    return smollm2_model


@pytest.fixture(scope="module")
def server(model):
    from ggufrun.server import create_app

    with LiveServer(create_app(model, model_id="smollm2", api_key=API_KEY)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


QUESTION = [  # an answer the float model prefers by 1.6 logits or more at every token (tests/test_generate.py, FRANCE)
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name the capital of France."},
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
