"""The first run ever: an empty Numba cache compiles every kernel with a notice (and helper processes), and the
next process finds them all cached."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = """
import sys, ggufrun
m = ggufrun.load(sys.argv[1], n_threads=2, n_ctx=64)
print(m.detokenize([int(m.logits(m.tokenize("The capital of France is"))[-1].argmax())]))
"""


@pytest.mark.real
def test_empty_jit_cache_compiles_with_a_notice_then_is_cached(smollm2_path, tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    run = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-c", CODE, str(smollm2_path)], env=env, capture_output=True, text=True, timeout=600
    )
    first = run()
    assert first.returncode == 0, first.stderr
    assert "ggufrun: compiling kernels (first run only)..." in first.stderr
    second = run()
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr  # everything, helpers' kernels included, came from the cache
    assert first.stdout == second.stdout == " Paris\n"  # the greedy next token, from kernels compiled either way
