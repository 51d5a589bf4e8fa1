"""`ggufrun serve --parallel N`: concurrent requests as slots of one continuous-batching engine (ggufrun.batch),
over real HTTP on 127.0.0.1 with the tiny synthetic model (byte-level BPE + ChatML). Each client must get exactly
what it gets alone (greedy text, seeded samples, logprobs, stop strings, response_format), whatever else runs."""

from __future__ import annotations

import threading
import time

import pytest
from live_server import LiveServer
from synthetic import write_model

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

N_CLIENTS = 8


class SlowTransformer:
    """The model's transformer with every batched forward pass taking at least `delay` seconds longer."""

    def __init__(self, tf, delay: float):
        self._tf, self.delay = tf, delay

    def __getattr__(self, name):
        return getattr(self._tf, name)

    def forward_batch(self, seqs):
        time.sleep(self.delay)
        return self._tf.forward_batch(seqs)


class SlowModel:
    def __init__(self, model, delay: float):
        self._model, self.transformer = model, SlowTransformer(model.transformer, delay)

    def __getattr__(self, name):
        return getattr(self._model, name)


def requests(no_eog) -> list[tuple[str, dict]]:
    """Eight different requests: completions and chat, streamed or not, greedy and seeded, with logprobs, stop
    strings, response_format json_object, a required tool call; distinct prompts of different lengths."""
    out = []
    for i in range(N_CLIENTS):
        stream = i % 2 == 1
        if i % 4 < 2:
            body = {"prompt": f"client {i} says " + "la " * (3 * i), "max_tokens": 12 + i, "logit_bias": no_eog}
            path = "/v1/completions"
        else:
            body = {"messages": [{"role": "user", "content": f"hello number {i}" + "!" * i}], "max_tokens": 10 + i,
                    "logit_bias": no_eog}  # fmt: skip
            path = "/v1/chat/completions"
        body["stream"] = stream
        body["temperature"] = 0.0 if i < 4 else 0.9
        if i >= 4:
            body["seed"] = 100 + i
        if i == 2:
            body["logprobs"], body["top_logprobs"] = True, 3
        if i == 0:
            body["logprobs"] = 2
        if i == 5:
            body["stop"] = ["e", "a"]
        if i == 6:
            body["response_format"] = {"type": "json_object"}
            body["max_tokens"] = 40
        if i == 3:  # tools, a call required: the tool-call grammar constrains the reply, parsed at its end
            body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
            body["tool_choice"] = "required"
            body["max_tokens"] = 60
        out.append((path, body))
    return out


def answer(url: str, path: str, body: dict) -> dict:
    """What a client sees, minus ids and timestamps: text, finish reason, logprobs, usage."""
    if not body["stream"]:
        r = httpx.post(url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        j = r.json()
        choice = j["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        calls = choice.get("message", {}).get("tool_calls")
        return {"text": text, "finish": choice["finish_reason"], "logprobs": choice["logprobs"], "usage": j["usage"],
                "tool_calls": calls and [c["function"] for c in calls]}  # fmt: skip
    text, logprobs, finish, calls = [], [], None, []
    import json

    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            piece = choice["text"] if "text" in choice else choice["delta"].get("content")
            text.append(piece or "")
            calls += [c["function"] for c in choice.get("delta", {}).get("tool_calls") or []]
            if choice["logprobs"] is not None:
                logprobs.append(choice["logprobs"])
            finish = choice["finish_reason"] or finish
    return {"text": "".join(text), "finish": finish, "logprobs": logprobs, "tool_calls": calls}


def test_eight_concurrent_clients_get_what_they_get_alone(chat_model, no_eog):
    """8 clients at once on --parallel 8 get, field for field, what each gets alone from --parallel 1 (requests one
    at a time through Model.generate); the engine ran them batched (decode rows per step > 1)."""
    from ggufrun.server import create_app

    reqs = requests(no_eog)
    with LiveServer(create_app(chat_model, model_id="tiny", parallel=1)) as s:
        alone = [answer(s.url, path, body) for path, body in reqs]
    assert len({a["text"] for a in alone}) == N_CLIENTS  # distinct prompts, distinct answers
    app = create_app(chat_model, model_id="tiny", parallel=N_CLIENTS)
    with LiveServer(app) as s:
        results: list = [None] * N_CLIENTS
        start = threading.Barrier(N_CLIENTS)

        def client(i):
            start.wait()
            results[i] = answer(s.url, *reqs[i])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(N_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        engine = app.state.runner.engine
        assert engine.decode_rows > engine.steps, (engine.decode_rows, engine.steps)  # some steps were batched
    for i in range(N_CLIENTS):
        assert results[i] == alone[i], (i, reqs[i], results[i], alone[i])


def test_greedy_text_equals_model_generate(chat_model, no_eog):
    """The concurrent clients' greedy text equals Model.generate's for the same prompt run alone."""
    from ggufrun.server import create_app

    prompts = [f"story {i}: " + "ab" * i for i in range(N_CLIENTS)]
    bias = {int(k): v for k, v in no_eog.items()}
    expected = ["".join(c.text for c in chat_model.generate(p, 16, temperature=0, logit_bias=bias)) for p in prompts]
    with LiveServer(create_app(chat_model, model_id="tiny", parallel=N_CLIENTS)) as s:
        got: list = [None] * N_CLIENTS

        def client(i):
            body = {"prompt": prompts[i], "max_tokens": 16, "temperature": 0, "logit_bias": no_eog, "stream": True}
            got[i] = answer(s.url, "/v1/completions", body)["text"]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(N_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == expected


def wait_idle(url: str, timeout: float = 10.0) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = httpx.get(url + "/health").json()
        if not h["busy"] and not h["waiting"]:
            return h
        time.sleep(0.02)
    raise AssertionError(f"server still busy after {timeout} s: {h}")


def test_disconnect_cancels_the_slot(chat_model, no_eog):
    """A streaming client that leaves frees its slot within a few steps (20 ms each here), not after 400 tokens."""
    from ggufrun.server import create_app

    with LiveServer(create_app(SlowModel(chat_model, 0.02), model_id="tiny", parallel=4)) as s:
        body = {"prompt": "hi", "max_tokens": 400, "stream": True, "logit_bias": no_eog}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
        h = wait_idle(s.url)
        assert h["requests_cancelled"] == 1 and h["tokens_generated"] < 100, h
        assert h["parallel"] == 4


def test_queue_limit_answers_503(chat_model, no_eog):
    """--parallel 2 with max_queue 0: two streams hold the slots, a third request is answered 503."""
    from ggufrun.server import create_app

    with LiveServer(create_app(SlowModel(chat_model, 0.02), model_id="tiny", parallel=2, max_queue=0)) as s:
        body = {"prompt": "hi", "max_tokens": 300, "stream": True, "logit_bias": no_eog}
        with httpx.stream("POST", s.url + "/v1/completions", json=body) as r1:
            l1 = r1.iter_lines()
            assert next(l1).startswith("data: {")
            with httpx.stream("POST", s.url + "/v1/completions", json=body) as r2:
                l2 = r2.iter_lines()
                assert next(l2).startswith("data: {")
                r3 = httpx.post(s.url + "/v1/completions", json={**body, "stream": False})
                assert r3.status_code == 503 and r3.headers["retry-after"] == "1", r3.text


def test_prompt_too_long_is_400(chat_model):
    from ggufrun.server import create_app

    with LiveServer(create_app(chat_model, model_id="tiny", parallel=2)) as s:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": list(range(1, 90)) * 6, "max_tokens": 4})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_parallel_must_be_positive(chat_model):
    from ggufrun.server import create_app

    with pytest.raises(ValueError, match="parallel"):
        create_app(chat_model, parallel=0)


# ---- the command line ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny-chat.gguf"
    write_model(path, tokenizer="bytes", head_dim=32, ctx=512)
    return path


def test_serve_parallel_and_kv_dtype_reach_the_app(tiny_path, monkeypatch, capsys):
    """--parallel N and --kv-dtype go to create_app / load; without --parallel, batch.default_slots decides."""
    uvicorn = pytest.importorskip("uvicorn")
    import ggufrun.server
    from ggufrun.batch import default_slots
    from ggufrun.cli import main

    calls = []
    monkeypatch.setattr(ggufrun.server, "create_app", lambda model, **kw: calls.append((model, kw)) or "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    assert main(["serve", str(tiny_path), "--parallel", "3", "--kv-dtype", "q8_0", "--n-ctx", "256"]) == 0
    model, kw = calls[-1]
    assert kw["parallel"] == 3 and model.cache.dtype == "q8_0" and model.n_ctx == 256
    assert "3 request(s) at once" in capsys.readouterr().err
    assert main(["serve", str(tiny_path), "--n-ctx", "256"]) == 0
    model, kw = calls[-1]
    assert kw["parallel"] == default_slots(model.transformer) and model.cache.dtype == "f16"


def test_serve_bad_parallel_and_kv_dtype_are_clear_errors(tiny_path, capsys):
    from ggufrun.cli import main

    assert main(["serve", str(tiny_path), "--parallel", "0"]) == 2
    assert "--parallel must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", str(tiny_path), "--kv-dtype", "q4_0"])
    assert "invalid choice: 'q4_0'" in capsys.readouterr().err


def test_default_slots_follow_memory(chat_model):
    from ggufrun.batch import MAX_DEFAULT_SLOTS, default_slots

    per_slot = chat_model.transformer.cache.nbytes
    assert default_slots(chat_model.transformer, available=10**12) == MAX_DEFAULT_SLOTS
    assert default_slots(chat_model.transformer, available=2 * 3 * per_slot) == 3  # half the memory: 3 full caches
    assert default_slots(chat_model.transformer, available=0) == 1


def test_serve_speculative_needs_parallel_1(tiny_path, monkeypatch, capsys):
    """--speculative with --parallel N > 1 is refused, naming both (the engine does not draft); alone it serves
    one request at a time."""
    uvicorn = pytest.importorskip("uvicorn")
    import ggufrun.server
    from ggufrun.cli import main

    calls = []
    monkeypatch.setattr(ggufrun.server, "create_app", lambda model, **kw: calls.append(kw) or "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    assert main(["serve", str(tiny_path), "--speculative", "ngram", "--parallel", "4", "--n-ctx", "256"]) == 1
    err = capsys.readouterr().err
    assert "--speculative" in err and "--parallel 1" in err and not calls
    assert main(["serve", str(tiny_path), "--speculative", "ngram", "--n-ctx", "256"]) == 0
    assert calls[-1]["parallel"] == 1


def test_the_slots_keys_are_faulted_in_at_start_when_they_fit(chat_model, monkeypatch):
    """A batching server faults in its slots' key pages before it listens (kv_cache.prefault_group_keys), unless
    they would take more than the share of the available memory that batch.default_slots plans with."""
    import sys

    import ggufrun.batch
    from ggufrun.server import create_app

    app = create_app(chat_model, model_id="tiny", parallel=3)
    runner = app.state.runner
    try:
        assert runner.keys_mb == runner.engine.slots[0].group_kv[0].nbytes / 1e6 > 0
        assert runner.keys_prefaulted or not sys.platform.startswith("linux")  # (False on kernels before 5.14)
    finally:
        runner.close()
    monkeypatch.setattr(ggufrun.batch, "available_memory_bytes", lambda: int(runner.keys_mb * 1e6))
    app = create_app(chat_model, model_id="tiny", parallel=3)
    try:
        assert app.state.runner.keys_prefaulted is False
    finally:
        app.state.runner.close()
