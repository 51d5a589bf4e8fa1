"""The `ggufrun` command line: `main(argv)` wires together one module per command.

    ggufrun run PROMPT        ggufrun.cli.run      (stream one answer; shares ggufrun.cli.generation with chat)
    ggufrun chat              ggufrun.cli.chat     (interactive multi-turn chat in the terminal)
    ggufrun inspect FILE      ggufrun.cli.inspect  (ggufrun.info.summarize as text or JSON)
    ggufrun pull [NAME ...]   ggufrun.cli.pull     (ggufrun.hub.pull)
    ggufrun serve [MODEL]     ggufrun.cli.serve    (ggufrun.server.create_app under uvicorn)
    ggufrun perplexity MODEL  ggufrun.cli.perplexity (ggufrun.perplexity: perplexity, KL divergence to a base)

Each command module has `add_parser(subparsers)` and `run(args) -> int` and imports the library it drives only
inside `run`, so building the parser (and `--help`, `--version`, `inspect`, `pull`) never imports Numba.

Exit status: 0 on success; 1 for an error the user can fix (printed as one line naming the command, never a
traceback); 2 for a usage error (argparse); 130 after Ctrl-C; 141 when the reader of our output went away
(`ggufrun inspect X --json | head`): as a process killed by SIGPIPE, but quietly. Python ignores SIGPIPE and turns
it into BrokenPipeError; we point stdout at /dev/null so the interpreter's final flush cannot fail again, as the
Python documentation recommends (library/signal.html, "Note on SIGPIPE"). SIGPIPE is not reset to its default
action, which would also kill `ggufrun serve` on a client's closed socket.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import __version__

# command -> module with add_parser(subparsers) and run(args) -> int
COMMANDS = {
    "run": "ggufrun.cli.run",
    "chat": "ggufrun.cli.chat",
    "inspect": "ggufrun.cli.inspect",
    "pull": "ggufrun.cli.pull",
    "serve": "ggufrun.cli.serve",
    "perplexity": "ggufrun.cli.perplexity",
}
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggufrun", description="Run GGUF language models on the CPU.")
    parser.add_argument("--version", action="version", version=f"ggufrun {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def _silence_stdout() -> None:
    """After a broken pipe: send whatever is still buffered (and the final flush at exit) to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (replaced in-process): nothing to protect
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    from ..errors import GGUFError, PullError

    command = importlib.import_module(COMMANDS[args.command])
    try:
        status = command.run(args) or 0
        sys.stdout.flush()  # a closed pipe shows up here at the latest, while we can still handle it
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (GGUFError, PullError, FileNotFoundError, ValueError) as e:
        print(f"ggufrun {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
