"""Helpers for the server tests: a real uvicorn server on 127.0.0.1 in a thread, and model wrappers that make
timing and failure observable on the tiny synthetic model (tests/synthetic.py)."""

from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving `app` on a free port until stop()."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
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

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ModelWrapper:
    """A ggufrun.Model with generate() wrapped: every chunk is delayed by `delay` seconds (a slow model), and
    the chunk after `fail_after` chunks raises `error` instead (a generation that breaks mid-stream); `sampling`
    adds sampling arguments to every generation (e.g. a logit_bias that keeps a random model from stopping)."""

    def __init__(self, model, delay: float = 0.0, fail_after: int | None = None, error=None, sampling=None):
        self._model, self.delay, self.fail_after, self.error = model, delay, fail_after, error
        self.sampling = sampling or {}

    def __getattr__(self, name):
        return getattr(self._model, name)

    def generate(self, *args, **kwargs):
        inner = self._model.generate(*args, **{**self.sampling, **kwargs})

        def chunks():
            try:
                for i, chunk in enumerate(inner):
                    if self.fail_after is not None and i == self.fail_after:
                        raise self.error
                    time.sleep(self.delay)
                    yield chunk
            finally:
                inner.close()

        return chunks()
