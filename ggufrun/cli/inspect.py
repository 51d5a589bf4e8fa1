"""`ggufrun inspect FILE|NAME [--json] [--n-ctx N]`: what a GGUF file holds and the RAM running it takes.

Prints ggufrun.info.summarize() as text (ggufrun.info.format_text) or as JSON. Reads only the header.
"""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="show what a GGUF file holds and the RAM it needs",
        description="Architecture, hyper-parameters, metadata, tensor table, bytes per type, parameter count, "
        "bits per weight, tokenizer, chat template and RAM needed for weights + KV cache.",
    )
    p.add_argument("file", metavar="FILE", help="a GGUF file (first shard of a split model) or a known model name")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--n-ctx", type=int, default=None, metavar="N", help="context length for the KV-cache estimate "
        "(default: the model's context_length)"
    )  # fmt: skip


def run(args) -> int:
    from ..hub import resolve
    from ..info import format_text, summarize
    from ..reader import GGUFFile

    if args.n_ctx is not None and args.n_ctx <= 0:
        raise ValueError(f"--n-ctx must be a positive number of tokens, got {args.n_ctx}")
    path = resolve(args.file)
    with GGUFFile(path) as f:
        s = summarize(f, n_ctx=args.n_ctx)
    if args.json:
        json.dump(s, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_text(s))
    return 0
