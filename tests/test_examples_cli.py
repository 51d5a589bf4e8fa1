"""The examples and the run/chat commands, run as a user would (subprocesses on the real default model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.real


def _run(args, stdin=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_example_stream(smollm2_path):
    r = _run([sys.executable, "examples/stream.py", "Say hello."])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "generated" in r.stderr and "tok/s" in r.stderr


def test_example_sampling(smollm2_path):
    r = _run([sys.executable, "examples/sampling.py"])
    assert r.returncode == 0, r.stderr
    for name in ("code", "chat", "creative", "agent"):
        assert f"--- {name}" in r.stdout


def test_example_chat_reads_turns_until_eof(smollm2_path):
    r = _run([sys.executable, "examples/chat.py"], stdin="What is the capital of France?\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("you>") == 2 and "bot>" in r.stdout


def test_cli_run_streams_an_answer_with_summary(smollm2_path):
    args = ["--temperature", "0", "--max-tokens", "24", "--system", "You are a helpful assistant."]
    r = _run(
        [sys.executable, "-m", "ggufrun", "run", "--model", str(smollm2_path), *args, "What is the capital of France?"]
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "TTFT" in r.stderr and "tok/s" in r.stderr


def test_cli_run_raw_and_bad_arguments(smollm2_path):
    r = _run([sys.executable, "-m", "ggufrun", "run", "--model", str(smollm2_path), "--raw", "--temperature", "0",
              "--max-tokens", "4", "--no-stats", "The capital of France is"])  # fmt: skip
    assert r.returncode == 0 and "Paris" in r.stdout and r.stderr.strip() == ""
    r = _run([sys.executable, "-m", "ggufrun", "run", "--model", str(smollm2_path), "--top-p", "7", "hi"])
    assert r.returncode == 1 and "top_p" in r.stderr and "Traceback" not in r.stderr
    r = _run([sys.executable, "-m", "ggufrun", "run", "--model", "no-such-model", "hi"])
    assert r.returncode == 1 and "no-such-model" in r.stderr and "Traceback" not in r.stderr


def test_cli_chat_multi_turn(smollm2_path):
    turns = "My name is Ada.\n/reset\nHello!\n/exit\n"
    r = _run([sys.executable, "-m", "ggufrun", "chat", "--model", str(smollm2_path), "--max-tokens", "12",
              "--temperature", "0"], stdin=turns)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("> ") >= 3
