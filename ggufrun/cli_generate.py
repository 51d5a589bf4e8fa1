"""`ggufrun run` (stream one completion) and `ggufrun chat` (interactive multi-turn chat in the terminal)."""

from __future__ import annotations

import argparse
import sys


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None, help="model path or known name (default: smollm2-135m-instruct)")
    p.add_argument("--n-ctx", type=int, default=None, help="context length (default: min(4096, trained))")
    p.add_argument("--threads", "-t", type=int, default=None, help="threads (default: physical cores)")
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
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default=None, help="system prompt for chat-formatted prompts")
    p.add_argument("--no-stats", action="store_true", help="do not print the one-line summary after an answer")


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="stream a completion of PROMPT (chat-formatted when the model has a template)")
    _add_model_args(run)
    run.add_argument("--raw", action="store_true", help="complete PROMPT as plain text, without the chat template")
    run.add_argument("prompt", help="the prompt ('-' reads it from standard input)")
    run.set_defaults(func=run_command)
    chat = sub.add_parser("chat", help="interactive multi-turn chat in the terminal (Ctrl-C stops an answer)")
    _add_model_args(chat)
    chat.set_defaults(func=chat_command)


def _sampling(args) -> dict:
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
            "presence_penalty", "seed")  # fmt: skip
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def _load(args):
    from .llm import load

    return load(args.model, n_ctx=args.n_ctx, n_threads=args.threads)


def _dim(text: str) -> str:
    return f"\x1b[2m{text}\x1b[0m" if sys.stderr.isatty() else text


def _stream_answer(model, chunks, show_stats: bool) -> str:
    """Print chunks as they come; return the text. Ctrl-C stops the answer (the generator is closed)."""
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
        print(_dim("[stopped]"), file=sys.stderr)
        return "".join(out)
    sys.stdout.write("\n")
    if show_stats and last is not None and last.stats is not None:
        s = last.stats
        print(
            _dim(
                f"[{s.generated_tokens} tokens, {last.finish_reason}; TTFT {s.ttft_s:.2f} s; "
                f"prompt {s.prompt_tokens} tok @ {s.prompt_tps:.0f} tok/s; generation {s.generation_tps:.1f} tok/s]"
            ),
            file=sys.stderr,
        )
    return "".join(out)


def run_command(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = _load(args)
    kw = dict(max_tokens=args.max_tokens, stop=args.stop, preset=args.preset, **_sampling(args))
    if args.raw or model.chat_template is None:
        chunks = model.generate(prompt, **kw)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": prompt}
        ]
        chunks = model.chat(messages, **kw)
    _stream_answer(model, chunks, not args.no_stats)
    return 0


def chat_command(args) -> int:
    model = _load(args)
    if model.chat_template is None:
        print(f"ggufrun chat: {model.path.name} has no chat template; use `ggufrun run --raw`", file=sys.stderr)
        return 1
    kw = dict(max_tokens=args.max_tokens, stop=args.stop, preset=args.preset or "chat", **_sampling(args))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(_dim(f"{model.path.name} — /reset clears the chat, /exit or Ctrl-D quits, Ctrl-C stops an answer"),
          file=sys.stderr)  # fmt: skip
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip():
            continue
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": line})
        reply = _stream_answer(model, model.chat(messages, **kw), not args.no_stats)
        messages.append({"role": "assistant", "content": reply})
