"""`ggufrun serve [MODEL]`: an OpenAI-compatible HTTP server (ggufrun.server.create_app) under uvicorn.

Needs the server extra (Starlette + uvicorn, with httptools and uvloop, which uvicorn takes when they are installed:
see pyproject.toml): `pip install -e ".[server]"` in a ggufrun checkout. `--cors ORIGIN`
(repeatable, off by default) lets browser pages from ORIGIN call the API (create_app's cors_origins).
`--parallel N`: requests generated at once, as slots of one continuous-batching engine (ggufrun.batch); the
default is batch.default_slots: 8, fewer when 8 full KV caches of n_ctx positions would take more than half the
memory available; 1 serves one request at a time through Model.generate (with --speculative, the only mode that
drafts). `--kv-dtype f16|q8_0|f32` (shared with run and chat): the KV cache's storage.
"""

from __future__ import annotations

import argparse
import sys

from .generation import add_load_args, load_model, note

INSTALL_HINT = 'ggufrun serve needs Starlette and uvicorn: pip install -e ".[server]" in a ggufrun checkout'


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (needs the server extra)")
    p.add_argument("model", nargs="?", default=None, help="model path or known name (default: smollm2-135m-instruct)")
    add_load_args(p, model_flag=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before answering 503 (default 64)")
    p.add_argument(
        "--parallel",
        "-np",
        type=int,
        default=None,
        metavar="N",
        help="requests generated at once, in one batch (default: 8, fewer when 8 KV caches of n_ctx positions "
        "would take more than half the available memory; 1: one at a time, as --speculative needs)",
    )
    p.add_argument("--model-id", default=None, help="the model name clients send (default: the file name)")
    p.add_argument(
        "--cors",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="allow browser requests from ORIGIN, e.g. http://localhost:3000 (repeatable; default: none)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        print(f"ggufrun serve: error: {INSTALL_HINT}", file=sys.stderr)
        return 1
    from .. import server

    if args.parallel is not None and args.parallel < 1:
        print(f"ggufrun serve: error: --parallel must be an integer >= 1, got {args.parallel}", file=sys.stderr)
        return 2
    model = load_model(args)
    from ..batch import default_slots

    parallel = args.parallel
    if parallel is None:
        parallel = 1 if model.speculative is not None else default_slots(model.transformer)
    if parallel > 1 and model.speculative is not None:
        raise ValueError(f"--speculative drafts only with --parallel 1 (one request at a time), not --parallel "
                         f"{parallel}: the batching engine does not draft")  # fmt: skip
    note(f"{parallel} request(s) at once (--parallel), n_ctx {model.n_ctx}, KV cache {model.cache.dtype}")
    if model.chat_template is None:
        note(f"{model.path.name} has no chat template (a base model?); --chat-template chatml|gemma|FILE applies one")
    extra = {"cors_origins": list(args.cors)} if args.cors else {}
    app = server.create_app(model, model_id=args.model_id, api_key=args.api_key, max_queue=args.max_queue,
                            parallel=parallel, **extra)  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
