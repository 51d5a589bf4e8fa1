"""The forward pass against llama.cpp's logits on the tiny synthetic models (tests/data/golden/small-*.gguf).

Bounds from tests/data/golden/README.md: mean|diff| <= 0.03 x std(golden), max|diff| <= 0.2 x std, argmax equal on
>= 90% of rows; F32/F16 weights: max|diff| <= 0.01 x std. (A wrong rope layout lands near mean 0.25 x std.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggufrun.model import Transformer
from ggufrun.reader import GGUFFile

GOLDEN = Path(__file__).parent / "data" / "golden"
SMALL = sorted(p.stem for p in GOLDEN.glob("small-*.gguf"))
EXACT_TYPES = ("-f32", "-f16")  # float weights: llama.cpp quantizes no activations


def load(stem: str, **kwargs) -> tuple[Transformer, dict]:
    golden = np.load(GOLDEN / f"{stem}.logits.npz")
    return Transformer(GGUFFile(GOLDEN / f"{stem}.gguf"), **kwargs), golden


def check_close(stem: str, mine: np.ndarray, golden: np.ndarray) -> None:
    assert mine.shape == golden.shape and mine.dtype == np.float32
    std = golden.std()
    diff = np.abs(mine - golden)
    mean_rel, max_rel = diff.mean() / std, diff.max() / std
    agree = np.mean(mine.argmax(1) == golden.argmax(1))
    where = f"{stem}: mean|diff| {mean_rel:.4f} std, max {max_rel:.4f} std, argmax agreement {agree:.3f}"
    assert mean_rel <= 0.03, where
    assert max_rel <= (0.01 if stem.endswith(EXACT_TYPES) else 0.2), where
    assert agree >= 0.9, where


@pytest.mark.parametrize("stem", SMALL)
def test_golden_logits(stem):
    tf, g = load(stem)
    tokens, n_prompt = g["tokens"], int(g["n_prompt"])
    # as llama.cpp produced them: the prompt in one batch, then one token at a time
    first = tf.forward(tokens[:n_prompt], all_logits=True)
    steps = [tf.forward(tokens[i : i + 1]).copy() for i in range(n_prompt, len(tokens) - 1)]
    assert tf.cache.n_past == len(tokens) - 1
    check_close(stem, np.concatenate([first, np.stack(steps)]), g["logits"])
    # and teacher-forced in a fresh context
    check_close(stem, tf.logits(tokens[:-1]), g["logits"])


@pytest.mark.parametrize("stem", SMALL)
def test_batch_invariance(stem):
    """Every weight type and architecture here: the prompt in one batch, in chunks of 7, one token at a time, and
    after a cached prefix give the same bits (matmul vs matvec kernels, block vs single-query attention)."""
    tf, g = load(stem)
    tokens = g["tokens"]
    whole = tf.logits(tokens)
    chunked, _ = load(stem, n_batch=7)
    np.testing.assert_array_equal(chunked.logits(tokens), whole)
    tf.cache.reset()
    single = np.stack([tf.forward(tokens[i : i + 1]).copy() for i in range(len(tokens))])
    np.testing.assert_array_equal(single, whole)
    tf.cache.truncate(5)
    np.testing.assert_array_equal(tf.forward(tokens[5:], all_logits=True), whole[5:])
