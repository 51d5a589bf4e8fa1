"""What `ggufrun run` and `ggufrun chat` share: model and sampling options, loading, streaming an answer.

The options follow llama.cpp's `llama-cli` where they overlap (common/arg.cpp): `--temp`, `--top-k`, `--top-p`,
`--min-p`, `--repeat-penalty`, `--seed` (-1 = a random seed), `--ignore-eos` (every end-of-generation token gets
a logit bias of -inf), `--chat-template NAME|FILE` (a built-in template name or a Jinja file), `-n`, `-t`.
`--speculative ngram|PATH` turns on speculative decoding (ggufrun.speculative) with prompt-lookup drafts or a draft
model (llama.cpp's `--model-draft`), drafting at most `--draft-tokens` per pass (llama.cpp's `--draft-max`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

RANDOM_SEED = -1  # llama.cpp's LLAMA_DEFAULT_SEED: draw a fresh seed


def seed_arg(text: str) -> int:
    """--seed: an integer >= 0, or -1 for a random seed (llama.cpp's convention)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, or -1 for a random seed, got {text!r}") from None
    if seed < RANDOM_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, or -1 for a random seed, got {seed}")
    return seed


def add_load_args(p: argparse.ArgumentParser, model_flag: bool = True) -> None:
    """How to load the model (shared with `serve`)."""
    if model_flag:
        p.add_argument("--model", "-m", default=None, help="model path or known name (default: smollm2-135m-instruct)")
    p.add_argument("--n-ctx", type=int, default=None, help="context length (default: min(4096, trained))")
    p.add_argument("--threads", "-t", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|FILE",
        help="use this chat template instead of the model's: a built-in name (chatml, gemma) or a Jinja file",
    )
    p.add_argument(
        "--kv-dtype",
        default="f16",
        choices=["f16", "q8_0", "f32"],
        help="KV cache storage: f16 (default, as llama.cpp), q8_0 (about half the memory, as llama.cpp's "
        "-ctk q8_0 -ctv q8_0) or f32",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="say which chat template is used and why")
    p.add_argument(
        "--speculative",
        default=None,
        metavar="ngram|PATH",
        help="speculative decoding: 'ngram' drafts from prompt lookup, PATH (or a known name) is a draft model "
        "with the same vocabulary (greedy output is unchanged)",
    )
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=None,
        help="with --speculative: most tokens drafted per verification pass (default 10; fewer when acceptance is low)",
    )


def add_model_args(p: argparse.ArgumentParser) -> None:
    add_load_args(p)
    p.add_argument("--max-tokens", "-n", type=int, default=256, help="most tokens to generate (default 256)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--preset", choices=["code", "chat", "creative", "agent"], default=None)
    p.add_argument("--temperature", "--temp", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repeat-penalty", dest="repetition_penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--seed", type=seed_arg, default=None, help="random seed (default and -1: a fresh one)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at an end-of-generation token")
    p.add_argument("--system", default=None, help="system prompt for chat-formatted prompts")
    p.add_argument("--no-stats", action="store_true", help="do not print the one-line summary after an answer")


def generation_kwargs(args, model, preset: str | None = None) -> dict:
    """Keyword arguments for Model.generate / Model.chat from the command line."""
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
    kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    if args.seed is not None and args.seed != RANDOM_SEED:
        kw["seed"] = args.seed  # -1 and no --seed both mean seed=None: fresh entropy
    if args.ignore_eos:
        kw["logit_bias"] = {int(t): -math.inf for t in model.tokenizer.eog_ids}
    return dict(max_tokens=args.max_tokens, stop=args.stop, preset=args.preset or preset, **kw)


def chat_template_arg(value: str | None) -> str | None:
    """--chat-template: a built-in template name as is, a file's text, else a ValueError naming the option."""
    if value is None:
        return None
    from ..chat_template import BUILTIN_TEMPLATES

    if value in BUILTIN_TEMPLATES:
        return value
    path = Path(value)
    if not path.is_file():
        raise ValueError(
            f"--chat-template: {value!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) "
            "nor a Jinja file"
        )
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--chat-template: cannot read {value!r} as UTF-8 text: {e}") from None


def template_origin(template) -> str:
    """A short text saying which chat template is used and why (the template's own account when it has one)."""
    origin = getattr(template, "origin", None)
    if origin:
        return str(origin)
    name = getattr(template, "name", None)
    return str(name) if name else "the model's"


def load_model(args):
    """The model the options name; with --verbose, say which chat template it uses."""
    template = chat_template_arg(args.chat_template)
    from ..llm import load

    spec, k = getattr(args, "speculative", None), getattr(args, "draft_tokens", None)
    if k is not None and spec is None:
        raise ValueError("--draft-tokens needs --speculative ngram|PATH")
    if k is not None and k < 1:
        raise ValueError(f"--draft-tokens must be an integer >= 1, got {k}")
    draft = spec if spec not in (None, "ngram") else None
    model = load(args.model, n_ctx=args.n_ctx, n_threads=args.threads, chat_template=template, verbose=args.verbose,
                 draft_model=draft, kv_dtype=args.kv_dtype)  # fmt: skip
    if spec is not None:
        from ..speculative import DEFAULT_DRAFT_TOKENS, Speculation

        model.speculative = Speculation("ngram" if draft is None else model.speculative,
                                        draft_tokens=k or DEFAULT_DRAFT_TOKENS)  # fmt: skip
    if args.verbose and model.chat_template is not None:
        note(f"chat template: {template_origin(model.chat_template)}")
    return model


def dim(text: str) -> str:
    return f"\x1b[2m{text}\x1b[0m" if sys.stderr.isatty() else text


def note(text: str) -> None:
    """A dim line on stderr (kept out of the answer on stdout)."""
    print(dim(text), file=sys.stderr, flush=True)


def stream_answer(chunks, show_stats: bool) -> tuple[str, bool]:
    """Print chunks as they come. Returns (the text, whether Ctrl-C stopped it); the generator is closed on Ctrl-C,
    which stops all work at once and leaves the model usable."""
    out = []
    last = None
    try:
        for chunk in chunks:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            out.append(chunk.text)
            last = chunk
    except KeyboardInterrupt:
        chunks.close()
        sys.stdout.write("\n")
        sys.stdout.flush()
        note("[stopped]")
        return "".join(out), True
    sys.stdout.write("\n")
    sys.stdout.flush()
    if show_stats and last is not None and last.stats is not None:
        s = last.stats
        note(
            f"[{s.generated_tokens} tokens, {last.finish_reason}; TTFT {s.ttft_s:.2f} s; "
            f"prompt {s.prompt_tokens} tok @ {s.prompt_tps:.0f} tok/s; generation {s.generation_tps:.1f} tok/s"
            + (f"; drafted {s.drafted_tokens}, accepted {s.accepted_tokens}]" if s.drafted_tokens else "]")
        )
    return "".join(out), False
