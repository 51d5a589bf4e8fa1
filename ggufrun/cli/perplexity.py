"""`ggufrun perplexity MODEL --file TEXT`: perplexity of MODEL over TEXT, and KL divergence against base logits
(ggufrun.perplexity; llama.cpp's `llama-perplexity -f TEXT [--kl-divergence-base B [--kl-divergence]]`).

    ggufrun perplexity MODEL --file corpus.txt                         perplexity, windows of --ctx 512
    ggufrun perplexity MODEL --file corpus.txt --reference --kl-save base.npz
                                                                      the float reference pass makes a base
    ggufrun perplexity OTHER --kl-base base.npz                        compare another run with it (its tokens)

`--reference` runs ggufrun.reference (weights dequantized to float32, no activation quantization, no float16 KV
cache) instead of the Numba runtime. A progress bar goes to stderr, the summary table to stdout (`--json`: the
numbers as one JSON object).
"""

from __future__ import annotations

import json
import sys
import time

from .generation import note


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="perplexity of MODEL over a text; KL divergence against saved base logits")
    p.add_argument("model", help="model path or known name")
    p.add_argument("--file", "-f", default=None, help="the text to score (UTF-8; not needed with --kl-base)")
    p.add_argument("--ctx", "-c", type=int, default=None, help="window length in tokens (default 512, or the base's)")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many windows (default all)")
    kl = p.add_mutually_exclusive_group()
    kl.add_argument("--kl-base", default=None, metavar="BASE.npz", help="compare with these saved base logits")
    kl.add_argument("--kl-save", default=None, metavar="BASE.npz", help="save this run's top-k logits as a base")
    p.add_argument("--top-k", type=int, default=None, help="logits per position kept by --kl-save (default 1024)")
    p.add_argument(
        "--reference",
        action="store_true",
        help="run the float reference forward pass (ggufrun.reference) instead of the runtime",
    )
    p.add_argument("--threads", "-t", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"--file: {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--file: cannot read {path!r} as UTF-8 text: {e}") from None


class ProgressBar:
    """`[#####.....] 3/8 windows  PPL 12.3456  4.2 s` redrawn in place on a terminal; one line per window when
    stderr is not a terminal (a log file)."""

    def __init__(self, stream=None, width: int = 30):
        self.stream = sys.stderr if stream is None else stream
        self.width, self.t0 = width, time.perf_counter()
        self.tty = self.stream.isatty()

    def __call__(self, done: int, total: int, ppl: float) -> None:
        filled = self.width * done // total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {done}/{total} windows  PPL {ppl:.4f}  {time.perf_counter() - self.t0:.1f} s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run(args) -> int:
    from ..perplexity import DEFAULT_CTX, DEFAULT_TOP_K, perplexity

    for name in ("ctx", "chunks", "top_k", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.top_k is not None and args.kl_save is None:
        raise ValueError("--top-k sets what --kl-save keeps; it needs --kl-save")
    if args.file is None and args.kl_base is None:
        raise ValueError("--file TEXT is required (or --kl-base BASE.npz, whose tokens are then scored)")
    text = _read_text(args.file) if args.file is not None else None

    from ..perplexity import KLBase

    base = KLBase.load(args.kl_base) if args.kl_base is not None else None
    n_ctx = args.ctx if args.ctx is not None else (base.n_ctx if base is not None else DEFAULT_CTX)
    if args.reference:
        from ..hub import resolve
        from ..reader import GGUFFile
        from ..reference import ReferenceModel
        from ..tokenizer import load_tokenizer

        path = resolve(args.model)
        gguf = GGUFFile(path)
        try:
            model = ReferenceModel(gguf, dtype="float32", n_ctx=n_ctx)
            tokenizer = load_tokenizer(gguf.metadata)
        except BaseException:
            gguf.close()
            raise
        label = f"{path.name} (float reference)"
    else:
        from ..llm import load

        model = load(args.model, n_ctx=n_ctx, n_threads=args.threads)
        tokenizer = model.tokenizer
        label = f"{model.path.name} (ggufrun)"
    note(f"{label}: windows of {n_ctx} tokens")
    try:
        result = perplexity(
            model,
            text,
            tokenizer=tokenizer,
            n_ctx=n_ctx,
            n_chunks=args.chunks,
            kl_base=base,
            kl_save=args.kl_save,
            top_k=args.top_k or DEFAULT_TOP_K,
            progress=ProgressBar(),
            label=label,
        )
    finally:
        (gguf if args.reference else model).close()
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(result.table())
    if args.kl_save is not None:
        note(f"base logits saved to {args.kl_save}")
    return 0
