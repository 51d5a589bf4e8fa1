"""benchmarks/serve.py's HTTP clients (ServerTarget: raw HTTP/1.1 on one event loop, the chunked SSE body parsed as
it comes) against a real `ggufrun serve` app on 127.0.0.1 with the tiny synthetic model: every client sees the
events an ordinary client sees, an error answer is an error, and a stop event ends a stream early; its parser
(EventStream) reads the same events whatever bytes each read brings. And its CPU
accounting: thread_cpu_s reads a thread's CPU time from /proc, cpu_split takes the busiest threads apart."""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

import pytest
from live_server import LiveServer

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import serve  # noqa: E402


def text_events(url: str, ids: list[int], max_tokens: int, bias: dict) -> int:
    """How many events with a `text` field httpx reads from the same request (what ServerTarget counts)."""
    body = {"model": "any", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "logit_bias": bias}  # fmt: skip
    n = 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:])["choices"]
                n += bool(choices and choices[0].get("text") is not None)
    return n


def test_server_target_streams_what_an_ordinary_client_reads(chat_model):
    from ggufrun.server import create_app

    prompts = [chat_model.tokenize(f"client {i} says hello") for i in range(3)]
    with LiveServer(create_app(chat_model, model_id="tiny", parallel=4)) as s:
        target = serve.ServerTarget(s.url, chat_model.tokenizer.eog_ids, None)
        try:
            clients, wall = serve.run_clients(target, prompts, 12)
            want = [text_events(s.url, p, 12, target.bias) for p in prompts]
        finally:
            target.close()
    assert [len(c.t_tokens) for c in clients] == want
    assert all(n > 2 for n in want)  # tokens' text (bytes of one character come together), then the finish event
    assert all(c.t_start < c.t_tokens[0] <= c.t_tokens[-1] for c in clients) and wall > 0


def test_server_target_reports_an_error_answer_and_stops_when_told(chat_model):
    from ggufrun.server import create_app

    n_vocab = chat_model.transformer.config.n_vocab
    with LiveServer(create_app(chat_model, model_id="tiny", parallel=2)) as s:
        target = serve.ServerTarget(s.url, chat_model.tokenizer.eog_ids, None)
        try:
            with pytest.raises(RuntimeError, match="400"):
                target.run(serve.Client([1, n_vocab + 5]), 4)  # a token id past the vocabulary
            started, stop = threading.Event(), threading.Event()
            stop.set()  # already set: the stream ends after the first chunk that carries a token
            client = serve.Client(chat_model.tokenize("a long answer"))
            target.run(client, 400, started, stop)
            assert started.is_set() and 1 <= len(client.t_tokens) < 400
        finally:
            target.close()


class FakeTransport:
    def __init__(self):
        self.written, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def chunked_reply(events: list[bytes]) -> bytes:
    """An HTTP/1.1 200 event stream: each event its own chunk, then the last chunk."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 10_000])
def test_event_stream_reads_the_same_events_whatever_the_reads_bring(step):
    import asyncio

    text = [b'data: {"choices": [{"text": "%s"}]}\n\n' % t for t in (b"a", b"\\u00e9", b"")]
    split = b'data: {"choices": [{"text": "b"}]}\n\n'  # one event in two chunks
    finish = b'data: {"choices": [{"text": null, "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
    reply = chunked_reply([*text, split[:9], split[9:], finish])
    loop = asyncio.new_event_loop()
    try:
        client, done, transport = serve.Client([1]), loop.create_future(), FakeTransport()
        stream = serve.EventStream(client, b"GET", done, None, None)
        stream.connection_made(transport)
        for i in range(0, len(reply), step):
            stream.data_received(reply[i : i + step])
        assert done.done() and done.result() is None and transport.closed and transport.written == b"GET"
        assert len(client.t_tokens) == 4  # "a", "é", "" and "b": events with a text; not the finish event

        error = b'data: {"error": {"message": "boom"}}\n\n'
        client, done = serve.Client([1]), loop.create_future()
        stream = serve.EventStream(client, b"GET", done, None, None)
        stream.connection_made(FakeTransport())
        for i in range(0, len(chunked_reply([error])), step):
            stream.data_received(chunked_reply([error])[i : i + step])
        with pytest.raises(RuntimeError, match="server error: .*boom"):
            done.result()

        client, done = serve.Client([1]), loop.create_future()  # cut off mid-stream
        stream = serve.EventStream(client, b"GET", done, None, None)
        stream.connection_made(FakeTransport())
        stream.data_received(reply[: len(reply) // 2])
        stream.connection_lost(None)
        with pytest.raises(ConnectionError, match="mid-stream"):
            done.result()
    finally:
        loop.close()


def test_a_spawned_server_that_exits_is_reported_with_its_log(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="llama-server exited with 3: error: failed to load model"):
        serve.SpawnedLlamaServer(str(fake), "model.gguf", 2, 2, 512, "f16", 256)


def test_cpu_split_takes_the_busiest_threads_apart_from_the_others():
    before = {1: 1.0, 2: 5.0, 3: 0.5}
    after = {1: 3.0, 2: 6.0, 3: 0.75, 4: 0.25}  # thread 4 started in between
    assert serve.cpu_split(before, after, 2) == (3.0, 0.5)
    assert serve.cpu_split(before, after, 1) == (2.0, 1.5)
    busy, other = serve.cpu_split(None, after, 2)
    assert math.isnan(busy) and math.isnan(other)  # the target's threads could not be read


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_thread_cpu_s_sees_a_thread_use_the_cpu():
    import os
    import time

    me = threading.get_native_id()
    before = serve.thread_cpu_s(os.getpid())
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.3:  # CPU time of this thread, however busy the machine
        pass
    after = serve.thread_cpu_s(os.getpid())
    assert after[me] - before[me] >= 0.2
    assert serve.thread_cpu_s(None) is None
