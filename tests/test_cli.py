"""The command line on a tiny random-weight model (tests/synthetic.py): no download, seconds per test.

What a user sees is checked against what the Python API computes for the same greedy requests: `run` prints the
answer, `chat` keeps (and after /reset forgets) the conversation, the REPL edits lines and handles Ctrl-C/Ctrl-D in
a real pseudo-terminal, a closed pipe ends a command quietly, and building the parser never imports Numba.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic import write_model

from ggufrun.cli import EXIT_BROKEN_PIPE, main
from ggufrun.cli.chat import RESET_MESSAGE, help_text
from ggufrun.cli.generation import template_origin

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden"
MAX_TOKENS = 8
GREEDY = ["--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--no-stats"]
CHAT_KW = dict(max_tokens=MAX_TOKENS, preset="chat", temperature=0)  # what `chat` + GREEDY asks for
LONG_CTX = 16384  # room for an answer that takes seconds, so that Ctrl-C surely lands while it streams


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8", TERM="xterm", INPUTRC=os.devnull)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny-chatml.gguf"
    write_model(path, tokenizer="bytes", ctx=LONG_CTX)
    return path


@pytest.fixture(scope="module")
def model(tiny):
    import ggufrun

    return ggufrun.load(tiny)


def _chat(model, *turns: str) -> list[str]:
    """Greedy answers to each user turn of one conversation, as the `chat` command computes them."""
    messages, out = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        out.append("".join(c.text for c in model.chat(messages, **CHAT_KW)))
        messages.append({"role": "assistant", "content": out[-1]})
    return out


def _run_cli(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggufrun", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=ROOT)  # fmt: skip


# ---- the command line itself -----------------------------------------------------------------------------------


def test_version_and_cheap_parser(capsys):
    import ggufrun

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"ggufrun {ggufrun.__version__}"
    # building every command's parser (what --help, inspect and pull pay for) imports no Numba
    code = "import sys; from ggufrun.cli import build_parser; build_parser(); print(sorted(m for m in sys.modules \
if m.split('.')[0] in ('numba', 'llvmlite', 'ggufrun.llm')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in ("run", "chat", "inspect", "pull", "serve"))


@pytest.mark.parametrize("kind", ["inspect", "run"])
def test_closed_pipe_ends_quietly(kind, tiny):
    # the reader is gone before the command writes anything: its first write meets a broken pipe
    args = {
        "inspect": ["inspect", str(GOLDEN / "small-llama-q8_0.gguf"), "--json"],
        "run": ["run", "--model", str(tiny), "--ignore-eos", "--max-tokens", "2000", "--no-stats", "Hi"],
    }[kind]
    p = subprocess.Popen([sys.executable, "-m", "ggufrun", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env(), cwd=ROOT)  # fmt: skip
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_seed_minus_one_means_random(tiny, capsys):
    from ggufrun.cli import build_parser
    from ggufrun.cli.generation import generation_kwargs

    class Tok:
        eog_ids = frozenset({7})

    class Fake:
        tokenizer = Tok()

    parse = build_parser().parse_args
    assert "seed" not in generation_kwargs(parse(["run", "--seed", "-1", "x"]), Fake())
    assert generation_kwargs(parse(["run", "--seed", "5", "x"]), Fake())["seed"] == 5
    assert generation_kwargs(parse(["run", "--ignore-eos", "x"]), Fake())["logit_bias"] == {7: float("-inf")}
    assert main(["run", "--model", str(tiny), "--seed", "-1", "--max-tokens", "4", "--no-stats", "Hi"]) == 0
    with pytest.raises(SystemExit) as e:
        main(["run", "--model", str(tiny), "--seed", "-2", "Hi"])
    assert e.value.code == 2 and "--seed" in capsys.readouterr().err


# ---- run ------------------------------------------------------------------------------------------------------


def _run(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["run", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_run_prints_the_chat_answer(tiny, model, capsys):
    (expected,) = _chat(model, "Hello there")
    assert expected.strip(), "the tiny model should answer this prompt with text"
    status, out, err = _run(capsys, "--model", str(tiny), *GREEDY, "--preset", "chat", "Hello there")
    assert status == 0 and out == expected + "\n"
    status, out, err = _run(capsys, "--model", str(tiny), "--temperature", "0", "--max-tokens", "4", "Hello there")
    assert status == 0 and "TTFT" in err and "tok/s" in err  # the stats line


def test_chat_template_option(tiny, model, capsys, tmp_path):
    prompt = "Hello there"
    _, default, _ = _run(capsys, "--model", str(tiny), *GREEDY, prompt)
    _, raw, _ = _run(capsys, "--model", str(tiny), *GREEDY, "--raw", prompt)
    assert default != raw  # the template matters for this prompt, so the checks below can fail
    # a Jinja file that renders the user's text alone: the same tokens as --raw, so the same answer
    template = tmp_path / "plain.jinja"
    template.write_text("{{ messages[-1]['content'] }}")
    status, out, err = _run(capsys, "--model", str(tiny), *GREEDY, "--chat-template", str(template), "-v", prompt)
    assert status == 0 and out == raw and "chat template:" in err
    # a built-in name
    status, gemma, _ = _run(capsys, "--model", str(tiny), *GREEDY, "--chat-template", "gemma", prompt)
    assert status == 0 and gemma != default
    # neither a name nor a file; --raw contradicts it
    status, out, err = _run(capsys, "--model", str(tiny), "--chat-template", "no-such-template", prompt)
    assert status == 1 and "--chat-template" in err and "no-such-template" in err and "Traceback" not in err
    status, out, err = _run(capsys, "--model", str(tiny), "--raw", "--chat-template", "chatml", prompt)
    assert status == 1 and "--raw" in err


def test_verbose_says_which_template(tiny, model, capsys):
    status, _, err = _run(capsys, "--model", str(tiny), *GREEDY, "--verbose", "Hi")
    assert status == 0 and f"chat template: {template_origin(model.chat_template)}" in err


def test_model_without_template(tiny, capsys, monkeypatch):
    import ggufrun.llm

    _, raw, _ = _run(capsys, "--model", str(tiny), *GREEDY, "--raw", "Once upon a time")
    monkeypatch.setattr(ggufrun.llm.Model, "chat_template", property(lambda self: None))  # a base model
    status, out, err = _run(capsys, "--model", str(tiny), *GREEDY, "Once upon a time")
    assert status == 0 and out == raw  # plain text
    assert "no chat template" in err and "--chat-template" in err
    assert main(["chat", "--model", str(tiny)]) == 1
    err = capsys.readouterr().err
    assert "no chat template" in err and "--chat-template" in err and "--raw" in err


# ---- serve ----------------------------------------------------------------------------------------------------


def test_serve_passes_cors_origins_only_when_given(tiny, monkeypatch, capsys):
    uvicorn = pytest.importorskip("uvicorn")
    import ggufrun.server

    calls = []
    monkeypatch.setattr(ggufrun.server, "create_app", lambda model, **kw: calls.append(kw) or "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append({"app": app, **kw}))
    assert main(["serve", str(tiny), "--cors", "http://a.test", "--cors", "http://b.test", "--port", "8123"]) == 0
    assert calls[0]["cors_origins"] == ["http://a.test", "http://b.test"]
    assert calls[1] == {"app": "app", "host": "127.0.0.1", "port": 8123, "log_level": "info"}
    calls.clear()
    assert main(["serve", str(tiny)]) == 0
    assert "cors_origins" not in calls[0]


def test_serve_without_the_server_extra(tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    assert main(["serve", str(tiny)]) == 1
    err = capsys.readouterr().err
    assert 'pip install -e ".[server]"' in err and "Traceback" not in err


# ---- chat through pipes -----------------------------------------------------------------------------------------


def test_chat_reset_really_clears_the_conversation(tiny, model):
    first, second_in_context = _chat(model, "My name is Ada.", "Hello!")
    (second_fresh,) = _chat(model, "Hello!")
    assert first.strip() and second_fresh.strip()
    assert second_in_context != second_fresh  # the conversation matters, so a /reset that kept it would be caught
    r = _run_cli("chat", "--model", str(tiny), *GREEDY, stdin="My name is Ada.\nHello!\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"> {first}\n> {second_in_context}\n> \n"  # Ctrl-D (end of input) quits after a newline
    r = _run_cli("chat", "--model", str(tiny), *GREEDY, stdin="My name is Ada.\n/reset\nHello!\n/help\n/nope\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"> {first}\n> > {second_fresh}\n> {help_text()}\n> > "
    assert all(cmd in help_text() for cmd in ("/help", "/reset", "/exit", "Ctrl-C"))
    assert RESET_MESSAGE in r.stderr and "unknown command /nope" in r.stderr


# ---- chat in a terminal ---------------------------------------------------------------------------------------


class Terminal:
    """A command on a pseudo-terminal that is its controlling tty, so that Ctrl-C typed here is SIGINT to it.

    Started with subprocess (not pty.fork: this process runs Numba's threads, and a fork of a threaded process
    may hang before it execs); a short start-up makes the terminal the new session's controlling tty and gives
    SIGINT its default action, as a shell on a terminal does: a test run started in the background (`pytest &` in a
    script, where bash ignores SIGINT for it) would otherwise pass the ignored SIGINT down, and a Python started
    with SIGINT ignored keeps ignoring it (no KeyboardInterrupt, so the Ctrl-C tests below fail).
    """

    BOOT = (
        "import fcntl, os, signal, sys, termios; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
        "os.execv(sys.executable, [sys.executable, '-m', 'ggufrun', *sys.argv[1:]])"
    )

    def __init__(self, *args: str):
        self.fd, tty = pty.openpty()
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", self.BOOT, *args], stdin=tty, stdout=tty, stderr=tty,
                                         env=_env(), cwd=ROOT, start_new_session=True)  # fmt: skip
        finally:
            os.close(tty)
        self.seen = b""

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, pattern: bytes, timeout: float = 60) -> bytes:
        """Read until `pattern` appears; return everything up to and including it (and drop it from the buffer)."""
        deadline = time.monotonic() + timeout
        while pattern not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} did not appear within {timeout} s; the terminal shows {self.seen!r}")
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the command has exited
                    data = b""
                if not data:
                    raise AssertionError(f"{pattern!r} never appeared before the end; the terminal shows {self.seen!r}")
                self.seen += data
        end = self.seen.index(pattern) + len(pattern)
        out, self.seen = self.seen[:end], self.seen[end:]
        return out

    def wait_for_input(self, timeout: float = 30) -> None:
        """Wait until the command's main thread is blocked waiting for terminal input (in select/poll).

        CPython's readline loop checks for signals only when select() is interrupted: a Ctrl-C that arrives while
        readline is still processing the previous keys is noticed at the next key only. A person never types that
        fast; a test does, so it waits here before a Ctrl-C at the prompt."""
        waiting = {"7", "23", "270", "271"}  # x86-64 poll, select, pselect6, ppoll
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.proc.pid}/syscall") as f:
                    if f.read().split(" ", 1)[0] in waiting:
                        return
            except OSError:  # no /proc or not allowed to read it: give the command time instead
                time.sleep(1.0)
                return
            time.sleep(0.01)
        raise AssertionError(f"the command did not wait for input within {timeout} s; the terminal shows {self.seen!r}")

    def expect_output(self, n: int, timeout: float = 60) -> None:
        """Wait until at least n more bytes have arrived."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"no output within {timeout} s; the terminal shows {self.seen!r}"
            if select.select([self.fd], [], [], left)[0]:
                self.seen += os.read(self.fd, 65536)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s; the terminal shows {self.seen!r}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.fd)


def _shown(text: str) -> bytes:
    """`text` as the terminal shows it (the tty turns "\\n" into "\\r\\n")."""
    return text.encode().replace(b"\n", b"\r\n")


@pytest.fixture
def terminal():
    opened = []

    def start(*args: str) -> Terminal:
        opened.append(Terminal(*args))
        return opened[-1]

    yield start
    for t in opened:
        t.close()


def test_chat_terminal_line_editing_and_ctrl_c_at_the_prompt(tiny, model, terminal):
    (fresh,) = _chat(model, "Hello!")
    (typed_after_junk,) = _chat(model, "junkHello!")
    again = _chat(model, "Hello!", "Hello!")[1]
    assert fresh.strip() and fresh != typed_after_junk  # so a Ctrl-C that kept "junk" would be caught
    t = terminal("chat", "--model", str(tiny), *GREEDY)
    t.expect(b"> ")
    t.send(b"junk")
    t.expect(b"junk")
    t.wait_for_input()
    t.send(b"\x03")  # Ctrl-C at the prompt: the line is dropped, the chat goes on
    t.expect(b"> ")
    t.send(b"Hello!\r")
    t.expect(_shown(fresh + "\n") + b"> ")
    t.send(b"\x1b[A")  # Up: the previous line comes back, and Enter sends it again
    t.expect(b"Hello!")
    t.send(b"\r")
    shown = t.expect(_shown(again + "\n") + b"> ")
    assert b"^[[A" not in shown
    t.send(b"/reset\r")
    t.expect(RESET_MESSAGE.encode())
    t.send(b"/exit\r")
    assert t.wait() == 0


def test_chat_terminal_ctrl_c_stops_an_answer_and_ctrl_d_quits(tiny, model, terminal):
    # --ignore-eos: the answer runs for thousands of tokens unless Ctrl-C stops it
    t = terminal("chat", "--model", str(tiny), "--n-ctx", str(LONG_CTX), "--temperature", "0", "--ignore-eos",
                 "--max-tokens", str(LONG_CTX - 100), "--no-stats")  # fmt: skip
    t.expect(b"> ")
    t.send(b"Hello!\r")
    t.expect(b"Hello!\r\n")
    started = time.monotonic()
    t.expect_output(3)  # the answer is streaming
    t.send(b"\x03")
    t.expect(b"[stopped]")
    assert time.monotonic() - started < 30
    t.expect(b"> ")
    t.send(b"/help\r")  # the chat goes on
    t.expect(b"/reset")
    t.expect(b"> ")
    t.send(b"\x04")  # Ctrl-D at an empty prompt quits
    assert t.wait() == 0
