"""`ggufrun run PROMPT`: stream one answer to PROMPT ('-' reads it from standard input).

With a chat template (the model's, or `--chat-template NAME|FILE`) the prompt is sent as a user message, after
`--system` if given; `--raw` sends it as plain text. A model without a chat template (a base model) gets the
prompt as plain text, with a note on stderr saying so and how to apply a template. Stats go to stderr.
"""

from __future__ import annotations

import sys

from .generation import add_model_args, generation_kwargs, load_model, note, stream_answer


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="stream an answer to PROMPT (chat-formatted when the model has a template)")
    add_model_args(p)
    p.add_argument("--raw", action="store_true", help="complete PROMPT as plain text, without a chat template")
    p.add_argument("prompt", help="the prompt ('-' reads it from standard input)")


def run(args) -> int:
    if args.raw and args.chat_template is not None:
        raise ValueError("--raw sends the prompt without a chat template; drop --raw or --chat-template")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = load_model(args)
    kw = generation_kwargs(args, model)
    if args.raw:
        chunks = model.generate(prompt, **kw)
    elif model.chat_template is None:
        note(
            f"{model.path.name} has no chat template (a base model?): the prompt is sent as plain text; "
            "--chat-template chatml|gemma|FILE applies one"
        )
        chunks = model.generate(prompt, **kw)
    else:
        system = [{"role": "system", "content": args.system}] if args.system else []
        chunks = model.chat([*system, {"role": "user", "content": prompt}], **kw)
    stream_answer(chunks, not args.no_stats)
    return 0
