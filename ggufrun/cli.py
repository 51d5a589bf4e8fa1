"""`ggufrun` command line: each subcommand lives in the module that does the work.

Subcommands register themselves through `add_parser(subparsers)` in their module; this file only wires
them together so that importing the CLI stays cheap (Numba is imported only by commands that run a model).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines add_parser(subparsers) and run(args) -> int
# (a module serving several subcommands registers them all and sets `func` on each subparser)
SUBCOMMANDS = {
    "run": "ggufrun.cli_generate",
    "chat": "ggufrun.cli_generate",
    "inspect": "ggufrun.info",
    "pull": "ggufrun.hub",
    "serve": "ggufrun.server",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggufrun", description="Run GGUF language models on the CPU.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in dict.fromkeys(SUBCOMMANDS.values()):
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.command])
    from .errors import GGUFError, PullError

    try:
        return (getattr(args, "func", None) or module.run)(args) or 0
    except (GGUFError, PullError, FileNotFoundError, ValueError) as e:
        print(f"ggufrun {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
