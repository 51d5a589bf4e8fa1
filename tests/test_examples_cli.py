"""The examples and the run/chat commands, run as a user would (subprocesses on the real default model).

The same commands on a tiny synthetic model, in a terminal too, are in test_cli.py."""

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


def test_example_batch_answers_every_question(smollm2_path):
    r = _run([sys.executable, "examples/batch.py", "Name three colors.", "Say hello."])
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split("\n> Say hello.\n")
    assert first.startswith("> Name three colors.\n") and first.split("\n", 1)[1].strip() and second.strip()
    assert sorted(line.split(":")[0] for line in r.stderr.splitlines() if " done" in line) == ["[0 done", "[1 done"]


def test_example_sampling(smollm2_path):
    r = _run([sys.executable, "examples/sampling.py"])
    assert r.returncode == 0, r.stderr
    sections = r.stdout.split("--- ")[1:]
    assert [s.split()[0] for s in sections] == ["code", "chat", "creative", "agent"]
    for s in sections:
        assert s.split("\n", 1)[1].strip(), f"no text under {s.split()[0]}"


def test_example_chat_reads_turns_until_eof(smollm2_path):
    r = _run([sys.executable, "examples/chat.py"], stdin="What is the capital of France?\n\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("you> bot> ") and r.stdout.endswith("\nyou> you> \n")  # the empty line is skipped
    assert r.stdout[len("you> bot> ") : -len("\nyou> you> \n")].strip()  # the answer (sampled) has text


def test_cli_run_streams_an_answer_with_summary(smollm2_path):
    args = ["--temperature", "0", "--max-tokens", "24", "--system", "You are a helpful assistant."]
    r = _run(
        [sys.executable, "-m", "ggufrun", "run", "--model", str(smollm2_path), *args, "Name the capital of France."]
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


def test_cli_chat_reset_starts_a_fresh_conversation(smollm2_path):
    chat = [sys.executable, "-m", "ggufrun", "chat", "--model", str(smollm2_path), "--max-tokens", "12",
            "--temperature", "0", "--no-stats"]  # fmt: skip
    fresh = _run(chat, stdin="Hello!\n")  # one turn, then end of input
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.startswith("> ") and fresh.stdout.endswith("\n> \n")
    answer = fresh.stdout[len("> ") : -len("\n> \n")]
    assert answer.strip()
    r = _run(chat, stdin="My name is Ada.\n/reset\nHello!\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("> ") and r.stdout.endswith(f"\n> > {answer}\n> ")  # greedy: as in a fresh chat
    assert r.stdout[len("> ") : -len(f"\n> > {answer}\n> ")].strip()  # the first answer has text too
    assert "conversation cleared" in r.stderr
