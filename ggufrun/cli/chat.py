"""`ggufrun chat`: interactive multi-turn chat in the terminal.

Keys and commands, as in llama.cpp's `llama-cli` conversation mode and common shells:
- line editing and history (Left/Right, Up/Down, Ctrl-R, ...) through the standard library's `readline` where it
  exists (GNU readline or libedit: Linux, macOS); elsewhere input() without editing;
- Ctrl-C at the prompt clears the line; Ctrl-C while an answer streams stops that answer (the generator is closed,
  which stops all work at once; the partial answer stays in the conversation); Ctrl-D or /exit quits;
- /reset clears the conversation (the --system prompt stays) and says so; /help lists the commands.

Each turn reuses the KV cache of the conversation so far (Model.chat's prefix reuse), so only new tokens are
computed; after /reset the next answer is the one a fresh conversation gets.
"""

from __future__ import annotations

import sys

from .generation import add_model_args, generation_kwargs, load_model, note, stream_answer

PROMPT = "> "
COMMANDS = {
    "/help": "list these commands",
    "/reset": "clear the conversation (the --system prompt stays)",
    "/exit": "quit (also /quit or Ctrl-D)",
}
KEYS = "Ctrl-C stops an answer, or clears the line at the prompt; Up/Down recall earlier lines"
RESET_MESSAGE = "conversation cleared"


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="interactive multi-turn chat in the terminal (Ctrl-C stops an answer)")
    add_model_args(p)


def _enable_line_editing() -> None:
    """Importing readline makes input() edit lines and keep a history (only when stdin is a terminal)."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401
        except ImportError:  # Windows' Python has none: input() still works, without editing
            pass


def help_text() -> str:
    lines = [f"  {name:8s} {what}" for name, what in COMMANDS.items()]
    return "\n".join([*lines, f"  {KEYS}"])


def _read_line() -> str | None:
    """The next line typed; None at end of input (Ctrl-D). Ctrl-C clears the line and asks again."""
    while True:
        try:
            return input(PROMPT)
        except KeyboardInterrupt:
            sys.stdout.write("\n")  # readline has dropped the line; start a fresh one
            sys.stdout.flush()
        except EOFError:
            sys.stdout.write("\n")
            sys.stdout.flush()
            return None


def run(args) -> int:
    model = load_model(args)
    if model.chat_template is None:
        print(
            f"ggufrun chat: {model.path.name} has no chat template (a base model?); --chat-template chatml|gemma|FILE "
            "applies one, or `ggufrun run --raw` completes plain text",
            file=sys.stderr,
        )
        return 1
    _enable_line_editing()
    kw = generation_kwargs(args, model, preset="chat")
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    note(f"{model.path.name} — /help lists the commands, /exit or Ctrl-D quits, Ctrl-C stops an answer")
    while True:
        line = _read_line()
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        word = text.split()[0]
        if word.startswith("/") and word == text:  # a lone /word is a command; "/usr/bin is..." is a message
            if word in ("/exit", "/quit"):
                return 0
            if word == "/reset":
                messages = list(system)
                note(RESET_MESSAGE)
            elif word == "/help":
                print(help_text(), flush=True)
            else:
                note(f"unknown command {word}; /help lists the commands")
            continue
        messages.append({"role": "user", "content": line})
        reply = ""
        try:
            reply, _ = stream_answer(model.chat(messages, **kw), not args.no_stats)
        except KeyboardInterrupt:  # Ctrl-C before the first chunk (while the prompt was being rendered)
            sys.stdout.write("\n")
            note("[stopped]")
        messages.append({"role": "assistant", "content": reply})
