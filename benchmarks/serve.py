"""Many users at once: N concurrent streaming clients, each with its own prompt, greedy, a fixed number of tokens.

    python benchmarks/serve.py smollm2-135m-instruct --clients 1,8,16 --max-tokens 48 --threads 2 --chart serve.png
    python benchmarks/serve.py smollm2-135m-instruct --url http://127.0.0.1:8000 --clients 1,8,16
    python benchmarks/serve.py smollm2-135m-instruct --engine   # in-process BatchEngine, no HTTP
    python benchmarks/serve.py smollm2-135m-instruct --rounds 5 --probes 0 --long-prompt-tokens 0   # ratios only
    python benchmarks/serve.py smollm2-135m-instruct --rounds 3 --llama-server /path/to/llama.cpp/build/bin/llama-server

Three targets. The default starts `ggufrun serve MODEL --parallel P` (P = the largest client count, at least 8) in
a subprocess on a free 127.0.0.1 port and drives it over HTTP: POST /v1/completions with `stream: true`, one
connection per client, prompts sent as token ids. `--url` drives a server already running; `--engine` runs
ggufrun.batch.BatchEngine in this process, the clients being threads that iterate engine.submit().

Measured, and printed (JSON with --json, PNG chart with --chart):
- for each client count: every client's time to first token (TTFT) and decode tokens/s, the aggregate tokens/s
  (all tokens / wall time from the first request to the last token, prefills included), the decode tokens/s while
  every client is decoding (from the last first token to the first last token), and their ratios to one client's;
- for each client count, where the CPU time went (Linux, a server this run started or --engine): the target's
  --threads busiest threads (its compute threads), its other threads (HTTP, the batch engine's scheduling, sampling,
  --engine's client threads) and this load generator, per token; on a machine with as many cores as compute threads
  the last two take their time from the first;
- the TTFT of a request arriving while 7 others stream, against the same request alone (medians of --probes);
- a --long-prompt-token prompt (default 2,000) arriving while 4 clients stream: the longest gap between two
  tokens of those streams while it is prefilled, against their median gap before it arrived, and one prefill
  chunk's time (its prefill time x --prefill-chunk / its length; --prefill-chunk is the server's n_batch, 256).
With --llama-server, llama.cpp's server is started beside ggufrun's (the same model, slots, threads, context per
slot and prompt batch) and driven by the same clients in every round, after ggufrun: each prints its own ratios to
one client, and ggufrun's tokens/s over llama-server's are printed per client count (medians of the rounds' own).
End-of-generation tokens are masked (logit_bias -100 over HTTP, -inf in-process), so every client generates
exactly --max-tokens tokens.
Before measuring, it waits while a target still compiles its batched kernels in the background (ggufrun's
/health "compiling", Transformer.compiling in-process: the first run after an install or a change to the
kernels answers before they are ready and runs its batched steps row by row until then).

Numbers for the issue are taken on a quiet machine (README.md, "Many users at once", has every run). 2026-12-03,
Intel Xeon with AMX, 2 threads, over HTTP, `--clients 1,8,16 --max-tokens 48 --rounds 2` (medians of the rounds'
own ratios to one client, aggregate / while all decode):
    SmolLM2 Q4_1:  1 client 199-205 / 250 tok/s;  8 clients 1.89x / 2.16x;  16 clients 2.33x / 2.84x
    Gemma3 Q4_K_M: 1 client 85-89 / 93-97 tok/s;  8 clients 2.60x / 2.88x;  16 clients 3.60x / 4.47x
    (after the pair tiles' prefetch, --probes 0 --long-prompt-tokens 0: SmolLM2 8 clients 2.24x / 2.77x, 16 clients
    2.40x / 2.93x; Gemma3 3.40x / 4.11x and 4.13x / 5.34x)
    TTFT alone / beside 7 streams: SmolLM2 0.045 / 0.067 s, Gemma3 0.051 / 0.078 s; a 2,000-token prompt beside
    4 streams: chunk / longest gap 0.255 / 0.223 s and 0.193 / 0.167 s.
2026-12-04, AMD EPYC Zen 4 (AVX-512, no AMX), 2 threads, over HTTP, `--rounds 2` (the defaults otherwise):
    SmolLM2 Q4_1:  1 client 171-176 / 187-191 tok/s;  8 clients 2.70x / 3.03x;  16 clients 3.26x / 3.87x
    Gemma3 Q4_K_M: 1 client 86-96 / 91-100 tok/s;  8 clients 4.36x / 4.89x;  16 clients 5.05x / 5.81x
  later (17:16, the tiles' stack accumulators aligned, batched steps' Q / K / V in one product):
    SmolLM2 Q4_1:  1 client 145-154 / 160-166 tok/s;  8 clients 3.37x / 3.89x;  16 clients 4.06x / 4.89x
    Gemma3 Q4_K_M: 1 client 84-86 / 87-89 tok/s;  8 clients 4.37x / 4.86x;  16 clients 5.28x / 6.36x
  later (18:24-18:35, the quantizer's block max vectorised, a warm-up per client count, `--rounds 3`, three runs):
    SmolLM2 Q4_1:  1 client 157-204 tok/s;  8 clients 2.89-3.27x / 3.14-3.69x;  16 clients 2.93-3.43x / 3.19-3.96x
    Gemma3 Q4_K_M: 1 client 84-116 tok/s;   8 clients 3.23-4.38x / 3.47-4.81x;  16 clients 3.88-4.92x / 4.28-5.57x
  later (20:00-20:04, against llama-server of llama.cpp 0c1e570 in the same rounds, `--rounds 3 --probes 0
  --long-prompt-tokens 0 --llama-server ...`; ratios to one client, then ggufrun's tokens/s over llama-server's):
    SmolLM2 Q4_1:  ggufrun 8 clients 2.93x / 3.33x, 16 clients 3.41x / 4.06x; llama-server 1.68x / 1.75x and
                   1.72x / 1.81x; ggufrun / llama-server 1 client 1.67x / 1.41x, 8 clients 2.93x / 2.62x,
                   16 clients 3.31x / 3.08x
    Gemma3 Q4_K_M: ggufrun 4.40x / 4.89x and 5.68x / 6.37x; llama-server 2.18x / 2.17x and 2.65x / 2.81x;
                   ggufrun / llama-server 1.22x / 1.18x, 2.47x / 2.59x, 2.66x / 2.70x
2026-12-06, Intel Xeon with AMX (300 MB L3), 2 threads, `--rounds 3`, after products of 16-31 rows left the AMX tiles:
    SmolLM2 Q4_1:  1 client 110-121 tok/s;  8 clients 3.19x / 3.71x;  16 clients 4.19x / 5.05x
    Gemma3 Q4_K_M: 1 client 59-62 tok/s;    8 clients 4.40x / 4.81x;  16 clients 5.22x / 6.00x
  later (13:27, work stealing in the kernels' parallel loop, attention weighted 3x in PromptCost; `--rounds 3`):
    SmolLM2 Q4_1:  1 client 147-226 tok/s;  8 clients 2.78x / 3.26x;  16 clients 2.91x / 3.39x (a fast phase: the
                   one-sequence step took ~4 ms, and the ratios fall as it speeds up)
    Gemma3 Q4_K_M: 1 client 77-93 tok/s;    8 clients 4.49x / 4.94x;  16 clients 5.56x / 6.29x
    TTFT alone / beside 7: 0.027 / 0.034 s and 0.030 / 0.051 s; a 2,000-token prompt beside 4 streams, chunk /
    longest gap: 0.303 / 0.188 s and 0.289 / 0.231 s.
  later (15:08, Q8_0 products of 16 rows on the AMX tiles prefetching their weights; `--rounds 5`):
    SmolLM2 Q4_1:  1 client 102-140 tok/s;  8 clients 3.04x / 3.43x;  16 clients 3.71x / 4.38x
    Gemma3 Q4_K_M: 1 client 55-76 tok/s;    8 clients 4.44x / 4.77x;  16 clients 5.82x / 6.67x (rounds 4.85-9.01x;
                   at 15:12 5.90x / 6.99x, at 15:19-15:20 with --clients 1,16 6.01-6.50x / 7.05-7.45x)
    TTFT alone / beside 7: 0.028 / 0.038 s and 0.046 / 0.079 s; a 2,000-token prompt beside 4 streams, chunk /
    longest gap: 0.422 / 0.263 s and 0.381 / 0.331 s.
A batched step's products run near the multiply units' rate (two pairs of groups at a time or the VNNI tiles up to 31
rows, AMX from 32), which caps the batching gain of these small models, whose weights a single decode step reads from
cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from _common import ROOT, env_line, environment, log, prompt_ids, wait_compiled, write_json


class Client:
    """One streaming request: when it started, when each token arrived."""

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.t_start = 0.0
        self.t_tokens: list[float] = []
        self.error: BaseException | None = None

    @property
    def ttft(self) -> float:
        return self.t_tokens[0] - self.t_start

    @property
    def decode_tps(self) -> float:
        n = len(self.t_tokens)
        return (n - 1) / (self.t_tokens[-1] - self.t_tokens[0]) if n > 1 else 0.0


class EngineTarget:
    """Clients in this process, on one BatchEngine."""

    def __init__(self, model, n_slots: int, prefill_chunk: int | None):
        from ggufrun.batch import BatchEngine
        from ggufrun.sampling import SamplingParams

        self.engine = BatchEngine.from_model(model, n_slots=n_slots, prefill_chunk=prefill_chunk)
        self.pid = os.getpid()  # the engine's threads are this process's (thread_cpu_s)
        bias = {t: float("-inf") for t in model.tokenizer.eog_ids}
        self.params = SamplingParams(temperature=0, logit_bias=bias)

    def compiling(self) -> bool:
        """Whether the model's batched kernels are still compiling in a helper process (Transformer.compiling)."""
        return self.engine.tf.compiling

    def run(self, client: Client, max_tokens: int, started=None, stop=None) -> None:
        client.t_start = time.perf_counter()
        # token_logprob False, as the server submits: no log-normaliser over the vocabulary for a reply that reports
        # no log-probabilities (Gemma3's 16 greedy rows of a batched step: 1.5-1.7 ms with it, 0.6-0.7 without)
        for chunk in self.engine.submit(client.ids, self.params, max_tokens, token_logprob=False):
            if chunk.token is not None:
                client.t_tokens.append(time.perf_counter())
                if started is not None:
                    started.set()
            if stop is not None and stop.is_set():
                break  # dropping the stream cancels the request

    def close(self) -> None:
        self.engine.close()


class EventStream(asyncio.Protocol):
    """One streaming request over HTTP/1.1 as an asyncio protocol: the response parsed as it arrives, in the callback
    that receives it (status line, headers, chunked body, the SSE events' JSON), each token event timed there.

    Why not asyncio streams: their readline / readexactly steps wake the client's task three times a chunk, and the
    load generator shares the cores with the server it measures. AMD EPYC Zen 4 VM, 2 cores, SmolLM2, `--rounds 3`,
    two alternating pairs of runs (this process's CPU a token, per round): with the streams / this way, 1 client
    0.17-0.21 / 0.14-0.16 ms, 8 clients 0.05-0.08 / 0.04-0.06, 16 clients 0.04-0.05 / 0.04 (the ratios moved within
    the runs' noise)."""

    def __init__(self, client: Client, request: bytes, done, started, stop):
        self.client, self.request, self.done, self.started, self.stop = client, request, done, started, stop
        self.transport = None
        self.buf = bytearray()
        self.head = True  # before the end of the headers
        self.status = ""
        self.refused = False  # the status was not 200: the error body comes whole, up to connection_lost
        self.events = b""  # event-stream text not yet ending in a newline

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def _end(self, error: BaseException | None = None) -> None:
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.buf += data
        if self.refused:
            return
        try:
            if self.head:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
                self.status = lines[0]
                if self.status.split()[1:2] != ["200"]:
                    self.refused = True
                    return
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                if headers.get("transfer-encoding", "").lower() != "chunked":
                    raise RuntimeError(f"expected a chunked event stream, got headers {headers}")
                del self.buf[: end + 4]
                self.head = False
            while True:  # whole chunks: "size\r\n" payload "\r\n"
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(bytes(self.buf[:eol]).split(b";")[0], 16)
                if size == 0:
                    self._end()
                    return
                if len(self.buf) < eol + 2 + size + 2:
                    return
                self._events(bytes(self.buf[eol + 2 : eol + 2 + size]))
                del self.buf[: eol + 2 + size + 2]
                if self.stop is not None and self.stop.is_set():
                    self._end()  # closing the connection cancels the request
                    return
        except Exception as e:  # noqa: BLE001 - the client's failure, raised in run()
            self._end(e)

    def _events(self, payload: bytes) -> None:
        *lines, self.events = (self.events + payload).split(b"\n")
        for line in lines:
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"server error: {event['error']}")
            if event.get("choices") and event["choices"][0].get("text") is not None:
                self.client.t_tokens.append(time.perf_counter())
                if self.started is not None:
                    self.started.set()

    def connection_lost(self, exc) -> None:
        if self.done.done():
            return
        if self.refused and self.status:
            body = bytes(self.buf).partition(b"\r\n\r\n")[2].decode(errors="replace")
            self.done.set_exception(RuntimeError(f"server answered {self.status.strip()}: {body}"))
        else:
            self.done.set_exception(exc or ConnectionError("the server closed the connection mid-stream"))


class ServerTarget:
    """Clients over HTTP to `ggufrun serve` (POST /v1/completions, stream: true).

    Every connection is an EventStream on one event loop in a thread of its own (HTTP/1.1, the chunked SSE body
    parsed as it comes); `run` hands a client to it and waits. On a 2-core machine the load generator
    shares the cores with the server it measures: one httpx client per thread took ~25 % of a core with 16 clients
    (Gemma3, 16 x 300 tokens: 1.5 s of CPU in 4.3 s), time the server's two compute threads then lost.
    """

    def __init__(self, url: str, eog_ids, api_key: str | None, server: SpawnedServer | None = None):
        from urllib.parse import urlsplit

        self.server = server
        self.pid = server.proc.pid if server is not None else None  # a server this run started (thread_cpu_s)
        self.health = url.rstrip("/") + "/health"
        self.url = url.rstrip("/") + "/v1/completions"
        parts = urlsplit(url.rstrip("/"))
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = (parts.path or "") + "/v1/completions"
        self.bias = {str(t): -100 for t in eog_ids}
        self.auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        # uvloop where installed (the server extra's event loop, `ggufrun serve`'s too): this process's CPU a token,
        # Zen 4 VM, SmolLM2, 2 alternating pairs of runs, uvloop / asyncio's loop: 1 client 0.13-0.15 / 0.17-0.23 ms,
        # 8 clients 0.04-0.05 / 0.05-0.06, 16 clients 0.03-0.04 / 0.04-0.05
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="clients", daemon=True)
        self.thread.start()

    def compiling(self) -> bool:
        """Whether the server says its batched kernels are still compiling (ggufrun's /health "compiling"; a server
        without that field, llama-server, never is)."""
        import httpx

        return bool(httpx.get(self.health, timeout=10).json().get("compiling", False))

    def run(self, client: Client, max_tokens: int, started=None, stop=None) -> None:
        future = asyncio.run_coroutine_threadsafe(self._stream(client, max_tokens, started, stop), self.loop)
        future.result()

    async def _stream(self, client: Client, max_tokens: int, started, stop) -> None:
        body = json.dumps({"model": "any", "prompt": client.ids, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "logit_bias": self.bias}).encode()  # fmt: skip
        head = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{self.auth}Connection: close\r\n\r\n")  # fmt: skip
        done = self.loop.create_future()
        client.t_start = time.perf_counter()
        transport, _ = await self.loop.create_connection(
            lambda: EventStream(client, head.encode() + body, done, started, stop), self.host, self.port
        )
        try:
            await done
        finally:
            transport.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        if self.server is not None:  # the server this run started
            self.server.close()


class SpawnedServer:
    """`ggufrun serve MODEL --parallel P ...` in a subprocess on a free port of 127.0.0.1, until close()."""

    def __init__(self, model: str, parallel: int, threads: int, n_ctx: int, kv_dtype: str):
        self._start(
            [sys.executable, "-m", "ggufrun", "serve", model, "--parallel", str(parallel), "--threads", str(threads),
             "--n-ctx", str(n_ctx), "--kv-dtype", kv_dtype],
            "ggufrun serve",
        )  # fmt: skip

    def _start(self, cmd: list[str], what: str) -> None:
        import socket

        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd += ["--port", str(port)]
        log(" ".join(cmd[1:] if cmd[0] == sys.executable else cmd))
        # its log to a file, not a pipe nobody reads while it runs (llama-server logs every request: a full pipe would
        # stop it)
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600  # the first start compiles kernels
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{what} exited with {self.proc.returncode}: {self.log.read()[-4000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                self.close()
                raise RuntimeError(f"{what} did not answer /health within 600 s")
            time.sleep(0.5)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class SpawnedLlamaServer(SpawnedServer):
    """llama.cpp's `llama-server -m MODEL -np P` in a subprocess on a free port of 127.0.0.1, the same client count,
    threads, context per slot and prompt batch as ggufrun's (its -c is the whole context, shared by the slots;
    continuous batching is its default), until close()."""

    def __init__(self, binary: str, model: str, parallel: int, threads: int, n_ctx: int, kv_dtype: str, batch: int):
        self._start(
            [binary, "-m", model, "-np", str(parallel), "-c", str(parallel * n_ctx), "-t", str(threads), "-tb",
             str(threads), "-b", str(batch), "-ub", str(batch), "-ctk", kv_dtype, "-ctv", kv_dtype, "--no-webui"],
            "llama-server",
        )  # fmt: skip


class Prompts:
    """Distinct prompts of exactly n ids, never two alike (no request finds another's prompt in a cache): a
    request number, then the benchmark text."""

    def __init__(self, tokenize, n: int):
        self.tokenize, self.n = tokenize, n
        self.text = prompt_ids(tokenize, n)
        self.count = 0

    def take(self, k: int) -> list[list[int]]:
        out = []
        for _ in range(k):
            self.count += 1
            head = self.tokenize(f"Request {self.count}:")
            out.append((head + self.text)[: self.n])
        return out


def thread_cpu_s(pid: int | None) -> dict[int, float] | None:
    """CPU seconds (user + system) each thread of process `pid` has used, by thread id, from /proc (Linux; None
    elsewhere, for pid None, or once the process is gone). Resolution: the kernel's clock tick (10 ms at 100 Hz)."""
    if pid is None:
        return None
    try:
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 (state) is fields[0]
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # fields 14 and 15: utime, stime
        return out
    except (OSError, ValueError, IndexError):
        return None


def cpu_split(before: dict[int, float] | None, after: dict[int, float] | None, n_busy: int) -> tuple[float, float]:
    """(CPU seconds of the n_busy threads that used the most between two thread_cpu_s readings, of all the others):
    a server's compute threads (ggufrun: the compute thread and Numba's workers; llama-server: its -t threads)
    against its HTTP side, which on a machine with as many cores as compute threads takes its time from them.
    (nan, nan) without both readings."""
    if before is None or after is None:
        return float("nan"), float("nan")
    used = sorted((t - before.get(tid, 0.0) for tid, t in after.items()), reverse=True)
    return sum(used[:n_busy]), sum(used[n_busy:])


def steady_decode_tps(clients: list[Client]) -> float:
    """Tokens per second while every client was decoding: from the last first token to the first last token."""
    lo, hi = max(c.t_tokens[0] for c in clients), min(c.t_tokens[-1] for c in clients)
    if hi <= lo:
        return 0.0
    return sum(sum(1 for t in c.t_tokens if lo < t <= hi) for c in clients) / (hi - lo)


def run_clients(target, prompts: list[list[int]], max_tokens: int) -> tuple[list[Client], float]:
    """All clients at once; returns them and the wall time from the first start to the last token."""
    clients = [Client(p) for p in prompts]

    def go(c: Client) -> None:
        try:
            target.run(c, max_tokens)
        except BaseException as e:  # reported below, with the client it happened to
            c.error = e

    threads = [threading.Thread(target=go, args=(c,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        if c.error is not None:
            raise RuntimeError(f"a client failed: {c.error!r}") from c.error
    return clients, max(c.t_tokens[-1] for c in clients) - t0


def probe_ttft(
    target, background: list[list[int]], probes: list[list[int]], max_tokens: int
) -> tuple[list[float], int]:
    """TTFT of each of `probes` (1 token each), one after another, while `background` clients stream (up to
    max_tokens each; they are stopped after the probes). Returns the TTFTs and how many background clients were
    streaming when the probes started (a server that runs one request at a time streams only one of them)."""
    ready = [threading.Event() for _ in background]
    stop = threading.Event()
    clients = [Client(p) for p in background]
    threads = [threading.Thread(target=target.run, args=(c, max_tokens, e, stop)) for c, e in zip(clients, ready)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + 60
    for e in ready:
        e.wait(max(0.0, deadline - time.perf_counter()))
    streaming = sum(e.is_set() for e in ready)
    out = []
    for probe in probes:
        c = Client(probe)
        target.run(c, 1)
        out.append(c.ttft)
    stop.set()
    for t in threads:
        t.join()
    return out, streaming


def long_prompt_delay(target, background: list[list[int]], long_prompt: list[int], max_tokens: int, chunk: int):
    """A long prompt arriving while `background` clients stream: returns (the streams' median gap between tokens
    before it arrived, their longest gap while it was prefilled, its prefill time, one chunk's share of that, their
    median gap while it was prefilled, the tokens each stream got meanwhile). A chunk attends to more positions
    than the one before, so the last chunks take longer than the average share."""
    ready = [threading.Event() for _ in background]
    stop = threading.Event()
    clients = [Client(p) for p in background]
    threads = [threading.Thread(target=target.run, args=(c, max_tokens, e, stop)) for c, e in zip(clients, ready)]
    for t in threads:
        t.start()
    for e in ready:
        e.wait(120)
    time.sleep(1.0)  # a second of steady decoding to compare with
    probe = Client(long_prompt)
    target.run(probe, 1)
    t0, t1 = probe.t_start, probe.t_tokens[0]
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    before, during = [], []
    for c in clients:
        for a, b in zip(c.t_tokens, c.t_tokens[1:]):
            if b <= t0:
                before.append(b - a)
            elif a < t1:
                during.append(b - a)
    prefill = t1 - t0  # a full chunk's share of it (a last, shorter chunk costs less than a full one)
    per_stream = len(during) / max(1, len(clients))  # tokens each stream still got while the prompt was prefilled
    return (
        statistics.median(before) if before else 0.0,
        max(during, default=0.0),
        prefill,
        prefill * chunk / len(long_prompt),
        statistics.median(during) if during else 0.0,
        per_stream,
    )


def chart(path: str, results: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no chart")
        return
    last = {(r["target"], r["clients"]): r for r in results["runs"]}  # the last round of each target and count
    names = list(dict.fromkeys(name for name, _ in last))
    counts = list(dict.fromkeys(n for _, n in last))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        a.bar([i + k * width for i in range(len(counts))], [last[name, n]["aggregate_tps"] for n in counts], width,
              label=name)  # fmt: skip
    a.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(counts))], [str(n) for n in counts])
    if len(names) > 1:
        a.legend()
    a.set_xlabel("concurrent clients")
    a.set_ylabel("aggregate tokens/s")
    a.set_title(results["model"])
    if "ttft_alone_median_s" in results:
        b.bar(["alone", f"{results['ttft_busy_clients']} streaming"],
              [results["ttft_alone_median_s"], results["ttft_busy_median_s"]])  # fmt: skip
        b.set_ylabel("median TTFT (s)")
    if "long_prompt" in results:
        lp = results["long_prompt"]
        c.bar(["gap before", "longest gap\nduring prefill", "one prefill\nchunk"],
              [lp["median_gap_before_s"], lp["max_gap_during_s"], lp["chunk_s"]])  # fmt: skip
        c.set_ylabel("s")
        c.set_title(f"{lp['prompt_tokens']}-token prompt beside {lp['streams']} streams")
    fig.tight_layout()
    fig.savefig(path)
    log(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default="smollm2-135m-instruct", help="model path or known name")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--engine", action="store_true", help="drive ggufrun.batch.BatchEngine in-process instead of starting a server"
    )
    mode.add_argument("--url", default=None, help="drive a running `ggufrun serve` at this URL instead")
    p.add_argument("--api-key", default=None)
    p.add_argument("--clients", default="1,8,16", help="comma-separated client counts (default 1,8,16)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--kv-dtype", default="f16", choices=["f16", "q8_0", "f32"])
    p.add_argument("--parallel", type=int, default=None, help="slots of the started server (default: max(8, clients))")
    p.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens per step (the server's n_batch)")
    p.add_argument("--long-prompt-tokens", type=int, default=2000, help="0: skip the long-prompt measurement")
    p.add_argument("--probes", type=int, default=5, help="TTFT probes alone and beside 7 streaming clients")
    p.add_argument("--rounds", type=int, default=1, help="run the client counts this many times, interleaved; "
                   "ratios to one client are then medians of each round's own ratios")  # fmt: skip
    p.add_argument("--llama-server", default=None, metavar="BIN",
                   help="also drive llama.cpp's llama-server (this binary, started with the same model, slots, "
                   "threads, context per slot and batch) in every round, after ggufrun; prints ggufrun's tokens/s "
                   "over llama-server's")  # fmt: skip
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--chart", default=None, help="write a PNG chart here (needs matplotlib)")
    args = p.parse_args()
    counts = [int(n) for n in args.clients.split(",")]

    import ggufrun

    if args.engine:
        model = ggufrun.load(args.model, n_ctx=args.n_ctx, n_threads=args.threads, kv_dtype=args.kv_dtype, quiet=True)
        tokenize = model.tokenize
        target = EngineTarget(model, max(max(counts), 8), args.prefill_chunk)
        model_name = model.path.name
        tokenizer_eog = model.tokenizer.eog_ids
    else:
        from ggufrun.hub import resolve
        from ggufrun.reader import GGUFFile
        from ggufrun.tokenizer import load_tokenizer

        path = resolve(args.model, quiet=True)
        tok = load_tokenizer(GGUFFile(path).metadata)
        tokenize = tok.tokenize
        tokenizer_eog = tok.eog_ids
        server = None
        if not args.url:
            parallel = args.parallel or max(8, max(counts))
            server = SpawnedServer(str(path), parallel, args.threads, args.n_ctx, args.kv_dtype)
        target = ServerTarget(args.url or server.url, tok.eog_ids, args.api_key, server)
        model_name = os.path.basename(path)
    prompts = Prompts(tokenize, args.prompt_tokens)
    env = environment(args.threads)
    mode = "engine" if args.engine else "server"
    log(f"{model_name}: {env_line(env)}; {'in-process engine' if args.engine else 'server ' + target.url}")

    results = {"model": model_name, "mode": mode, "kv_dtype": args.kv_dtype, "env": env,
               "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens, "runs": []}  # fmt: skip
    targets = {"ggufrun": target}
    try:
        if args.llama_server:
            parallel = args.parallel or max(8, max(counts))
            path = str(model.path) if args.engine else str(path)
            llama = SpawnedLlamaServer(args.llama_server, path, parallel, args.threads, args.n_ctx, args.kv_dtype,
                                       args.prefill_chunk)  # fmt: skip
            targets["llama.cpp"] = ServerTarget(llama.url, tokenizer_eog, None, llama)
            results["llama_server"] = args.llama_server
        results["compile_wait_s"] = {name: wait_compiled(name, t.compiling) for name, t in targets.items()}
        for t in targets.values():  # warm-up: each count's batched kernels are loaded at their first call
            for n in counts:
                run_clients(t, prompts.take(n), 4)
        by_count: dict[tuple[str, int], list[tuple[float, float]]] = {(k, n): [] for k in targets for n in counts}
        against: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}  # ggufrun / llama.cpp, per round
        for r in range(args.rounds):
            if args.rounds > 1:
                print(f"round {r + 1} of {args.rounds}")
            this_round: dict[tuple[str, int], tuple[float, float]] = {}
            for name, t in targets.items():
                single = None
                if len(targets) > 1:
                    print(name)
                for n in counts:
                    load0 = os.getloadavg()[0]
                    cpu0, mine0 = thread_cpu_s(t.pid), time.process_time()
                    clients, wall = run_clients(t, prompts.take(n), args.max_tokens)
                    mine = time.process_time() - mine0
                    busy, other = cpu_split(cpu0, thread_cpu_s(t.pid), args.threads)
                    tokens = sum(len(c.t_tokens) for c in clients)
                    agg = tokens / wall
                    steady = steady_decode_tps(clients)
                    single = single or ((agg, steady) if n == 1 else None)
                    this_round[name, n] = (agg, steady)
                    run = {"target": name, "clients": n, "round": r, "wall_s": wall, "aggregate_tps": agg,
                           "decode_tps_all_streaming": steady, "ttft_s": [c.ttft for c in clients],
                           "decode_tps": [c.decode_tps for c in clients],
                           "load_avg": [load0, os.getloadavg()[0]],
                           "cpu_s": {"busiest_threads": busy, "other_threads": other,
                                     "load_generator": None if args.engine else mine}}  # fmt: skip
                    results["runs"].append(run)
                    ratio = f" ({agg / single[0]:.2f}x one client)" if single else ""
                    ratio_steady = f" ({steady / single[1]:.2f}x)" if single and single[1] else ""
                    print(
                        f"{n:3d} clients: aggregate {agg:6.1f} tok/s{ratio}, while all decode {steady:6.1f} tok/s"
                        f"{ratio_steady}; wall {wall:.1f} s; load average {load0:.1f}"
                    )
                    if not math.isnan(busy):  # the target's threads could be read
                        who = "the process's" if args.engine else f"{name}'s"
                        gen = (
                            "" if args.engine else f", this load generator {mine:.2f} s ({mine / tokens * 1e3:.2f} ms)"
                        )
                        print(
                            f"      CPU: {busy:.2f} s on {who} {args.threads} busiest threads, {other:.2f} s on its "
                            f"others ({other / tokens * 1e3:.2f} ms a token){gen}"
                        )
                    for i, c in enumerate(clients):
                        print(f"      client {i:2d}: TTFT {c.ttft:6.2f} s, decode {c.decode_tps:6.1f} tok/s")
                if 1 in counts:  # each count's ratios to this round's one-client run, whatever the order
                    one = this_round[name, 1]
                    for n in counts:
                        agg, steady = this_round[name, n]
                        by_count[name, n].append((agg / one[0], steady / one[1] if one[1] else 0.0))
            if len(targets) > 1:
                for n in counts:
                    (a, b), (la, lb) = this_round["ggufrun", n], this_round["llama.cpp", n]
                    against[n].append((a / la, b / lb if lb else 0.0))
        if args.rounds > 1 and 1 in counts:
            results["median_ratios"] = {}
            for name in targets:
                medians = {n: (statistics.median(a for a, _ in by_count[name, n]),
                               statistics.median(b for _, b in by_count[name, n])) for n in counts}  # fmt: skip
                results["median_ratios"][name] = {str(n): {"aggregate": a, "all_decoding": b}
                                                  for n, (a, b) in medians.items()}  # fmt: skip
                print(f"{name}: ratios to one client, medians of the rounds' own: " + ", ".join(
                    f"{n} clients {a:.2f}x / {b:.2f}x" for n, (a, b) in medians.items() if n != 1))  # fmt: skip
        if len(targets) > 1:
            over = results["ggufrun_over_llama_cpp"] = {
                str(n): {"aggregate": statistics.median(a for a, _ in v),
                         "all_decoding": statistics.median(b for _, b in v)}
                for n, v in against.items()
            }  # fmt: skip
            pairs = ", ".join(f"{n} clients {r['aggregate']:.2f}x / {r['all_decoding']:.2f}x" for n, r in over.items())
            print(f"ggufrun / llama.cpp tokens/s, medians of the rounds' own (aggregate / while all decode): {pairs}")
        if args.probes:  # --probes 0 skips the TTFT measurement
            alone, _ = probe_ttft(target, [], prompts.take(args.probes), args.max_tokens)
            long = min(512, args.n_ctx - args.prompt_tokens)
            beside, busy = probe_ttft(target, prompts.take(7), prompts.take(args.probes), long)
            results.update(ttft_busy_clients=busy, ttft_alone_median_s=statistics.median(alone),
                           ttft_busy_median_s=statistics.median(beside))  # fmt: skip
            print(
                f"TTFT of a new request: alone {statistics.median(alone):.3f} s, beside {busy} streaming clients "
                f"{statistics.median(beside):.3f} s (medians of {args.probes}); load average {os.getloadavg()}"
            )
        if args.long_prompt_tokens:
            long_prompt = Prompts(tokenize, args.long_prompt_tokens).take(1)[0]
            gap, worst, prefill, per_chunk, gap_during, tokens_during = long_prompt_delay(
                target, prompts.take(4), long_prompt, args.n_ctx - args.prompt_tokens - 8, args.prefill_chunk
            )
            results["long_prompt"] = {"prompt_tokens": len(long_prompt), "streams": 4, "median_gap_before_s": gap,
                                      "max_gap_during_s": worst, "median_gap_during_s": gap_during,
                                      "tokens_per_stream_during": tokens_during, "prefill_s": prefill,
                                      "chunk_s": per_chunk}  # fmt: skip
            print(
                f"{len(long_prompt)}-token prompt beside 4 streams: prefill {prefill:.2f} s "
                f"({per_chunk:.3f} s per {args.prefill_chunk}-token chunk on average); the streams' gap between "
                f"tokens {gap:.3f} s before, {gap_during:.3f} s median / {worst:.3f} s at most during it, "
                f"{tokens_during:.1f} tokens each meanwhile"
            )
    finally:
        for t in targets.values():
            t.close()
    write_json(args.json, results)
    if args.chart:
        chart(args.chart, results)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
