"""Chat templates: the Jinja template stored in the GGUF file, or a built-in one, rendered out of harm's way.

A template is untrusted code from a downloaded file. It compiles and renders in a worker process (worker.py: a
fresh interpreter with a memory limit and a wall-clock deadline, killed and replaced on a breach) inside Jinja2's
immutable sandbox with size and time guards (sandbox.py). Whatever a template does (a syntax error, a memory bomb,
a sort over millions of items, 20 000 macros, nesting too deep to parse), the caller gets a ChatTemplateError within
the time limit plus 0.25 s, and this process's memory does not grow. A template that failed to compile is
remembered, so it fails at once the next time. The environment is the one of Hugging Face transformers
(trim_blocks, lstrip_blocks, loopcontrols; `raise_exception`, `strftime_now`, `tojson` without HTML escaping;
`{% generation %}` tags rendered as their body).

render_with_spans() also returns the character ranges of the prompt that came from user-supplied strings, for a
tokenizer that must not turn special-token text inside them into control tokens (spans.py).

Which template (chat_template_from_metadata), in this order:
    1. `override`: a built-in name ("chatml", "gemma") or Jinja source;
    2. the file's `tokenizer.chat_template` (or `tokenizer.chat_template.<name>`);
    3. a built-in fallback, only for instruction/chat models: general.finetune, general.name, general.basename or
       a general.tags entry has the word it, instruct, instruction, chat, sft, dpo, rlhf or conversational (what
       llama.cpp's convert_hf_to_gguf.py takes from the model's name: "gemma-3-270m-it" -> finetune "it",
       "Qwen2.5-0.5B-Instruct" -> "Instruct"). A base model (Gemma3-270M: name "Gemma 3 270m", no finetune) gets
       None: its text is not a conversation, and callers use plain completion.
The fallbacks follow llama.cpp src/llama-chat.cpp (LLM_CHAT_TEMPLATE_GEMMA / _CHATML):
    gemma*: "<start_of_turn>user\\n{content}<end_of_turn>\\n" ... "<start_of_turn>model\\n"; "assistant" is
            "model"; system messages are trimmed and folded into the next user turn as "{system}\\n\\n";
            message contents are trimmed (ASCII whitespace); no BOS in the text (tokenize adds it).
    others: ChatML "<|im_start|>{role}\\n{content}<|im_end|>\\n" ... "<|im_start|>assistant\\n".
`ChatTemplate.origin` says which one applies and why, for the CLI to print.

>>> t = ChatTemplate(CHATML)
>>> t.render([{"role": "user", "content": "Hi"}])
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from ..errors import ChatTemplateError
from . import spans as _spans
from .sandbox import DEFAULT_MAX_CHARS
from .worker import pool

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

GEMMA = (
    "{%- set ws = ' \\t\\n\\r\\x0b\\x0c' -%}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + (message['content'] | trim(ws)) -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if ns.system and role != 'model' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
    "{{- (message['content'] | trim(ws)) + '<end_of_turn>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

BUILTIN_TEMPLATES = {"chatml": CHATML, "gemma": GEMMA}

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_COMPILE_TIMEOUT_S = 1.0  # 25x what a 10 kB template takes to compile
CHAT_MODEL_WORDS = frozenset(["it", "instruct", "instruction", "chat", "sft", "dpo", "rlhf", "conversational"])
_CHAT_MODEL_KEYS = ("general.finetune", "general.name", "general.basename", "general.tags")

_compile_failures: OrderedDict[str, str] = OrderedDict()  # source -> error message, newest last
_compile_failures_lock = threading.Lock()
_MAX_REMEMBERED_FAILURES = 256


def _plain(value, path: str):
    """A copy of the caller's data as dicts, lists and scalars: the template never sees the originals."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise ChatTemplateError(f"{path} is a {type(value).__name__}; chat messages must be dicts, lists and scalars")


def _input_chars(value) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_input_chars(k) + _input_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(map(_input_chars, value))
    return 0


class ChatTemplate:
    """A chat template: Jinja source, compiled on first render in a worker process, rendered there.

    source: Jinja text (tokenizer.chat_template, a user string, or CHATML / GEMMA).
    bos_token, eos_token: texts the template can use as {{ bos_token }} / {{ eos_token }} (the tokenizer's).
    name: a short label for error messages; origin: which template this is and why (for the CLI).
    timeout_s, compile_timeout_s: wall-clock limits for one render and for compiling.
    max_chars: the size limit for values and the output (raised to 8x the input size for big inputs).
    """

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        name: str = "custom",
        origin: str = "a custom template",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        max_chars: int = DEFAULT_MAX_CHARS,
    ):
        if not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be a str, got {type(source).__name__}")
        for arg, value in (("bos_token", bos_token), ("eos_token", eos_token)):
            if not isinstance(value, str):
                raise ChatTemplateError(f"{arg} must be a str, got {type(value).__name__}")
        for arg, value in (("timeout_s", timeout_s), ("compile_timeout_s", compile_timeout_s)):
            if not (isinstance(value, (int, float)) and 0 < value <= 600):
                raise ChatTemplateError(f"{arg} must be a number of seconds in (0, 600], got {value!r}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self.origin = origin
        self.timeout_s = float(timeout_s)
        self.compile_timeout_s = float(compile_timeout_s)
        self.max_chars = max_chars
        pool().prestart()

    def _run(self, runs: list[dict]) -> tuple[list[str | None], list[str | None]]:
        with _compile_failures_lock:
            failure = _compile_failures.get(self.source)
        if failure is not None:
            raise ChatTemplateError(failure)
        max_chars = max([self.max_chars, *(8 * _input_chars(v) for v in runs)])
        failure, texts, errors = pool().run(self.source, self.name, runs, timeout_s=self.timeout_s,
                                            compile_timeout_s=self.compile_timeout_s, max_chars=max_chars)  # fmt: skip
        if failure is not None:
            with _compile_failures_lock:
                _compile_failures[self.source] = failure
                while len(_compile_failures) > _MAX_REMEMBERED_FAILURES:
                    _compile_failures.popitem(last=False)
            raise ChatTemplateError(failure)
        return texts, errors

    def compile(self) -> None:
        """Compile now (render() does it on first use); raises ChatTemplateError on a syntax error or when
        compiling passes its time or memory limit."""
        self._run([])

    def _variables(self, messages, add_generation_prompt, tools, extra) -> dict:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
        variables = {
            "messages": _plain(list(messages), "messages"),
            "add_generation_prompt": bool(add_generation_prompt),
            "tools": _plain(tools, "tools"),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        variables.update({str(k): _plain(v, str(k)) for k, v in extra.items()})
        return variables

    def render(
        self, messages: Sequence[Mapping], add_generation_prompt: bool = True, tools: Sequence | None = None, **extra
    ) -> str:
        """The prompt text for a conversation.

        messages: [{"role": "system"|"user"|"assistant"|..., "content": "..."}, ...]
        tools: tool definitions for templates that support them; extra: more template variables
        (e.g. enable_thinking=False), which may also override bos_token / eos_token.
        """
        texts, errors = self._run([self._variables(messages, add_generation_prompt, tools, extra)])
        if errors[0] is not None:
            raise ChatTemplateError(errors[0])
        return texts[0]

    def render_with_spans(
        self, messages: Sequence[Mapping], add_generation_prompt: bool = True, tools: Sequence | None = None, **extra
    ) -> tuple[str, list[tuple[int, int]]]:
        """render()'s text, and the sorted, non-overlapping [start, end) character ranges of it that came from
        user-supplied strings (message contents, names, tool calls and results, tools, extra values).

        >>> ChatTemplate(CHATML).render_with_spans([{"role": "user", "content": "Hi"}])
        ('<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n', [(17, 19)])
        """
        variables = self._variables(messages, add_generation_prompt, tools, extra)
        marked, strings = _spans.mark(variables)
        runs = [variables] if marked is None or not strings else [variables, marked]
        texts, errors = self._run(runs)
        if errors[0] is not None:
            raise ChatTemplateError(errors[0])
        text = texts[0]
        if len(runs) == 2:
            found = _spans.from_markers(text, texts[1], strings) if errors[1] is None else None
            if found is None:  # the template strips what a cut leaves: whole strings between the markers
                marked, whole = _spans.mark(variables, whitespace_inside=True)
                texts, errors = self._run([marked])
                found = _spans.from_markers(text, texts[0], whole) if errors[0] is None else None
            if found is not None:
                return text, found
        return text, _spans.by_search(text, strings)

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, origin={self.origin!r}, {len(self.source)} chars)"


def chat_model_evidence(metadata: Mapping) -> str | None:
    """Why the metadata marks an instruction/chat model ("general.finetune is 'it'"), or None for a base model."""
    for key in _CHAT_MODEL_KEYS:
        value = metadata.get(key)
        for text in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(text, str) and CHAT_MODEL_WORDS & set(re.split(r"[^a-z0-9]+", text.lower())):
                return f"{key} is {text!r}" if key != "general.tags" else f"general.tags has {text!r}"
    return None


def chat_template_from_metadata(
    metadata: Mapping,
    override: str | None = None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    name: str | None = None,
) -> ChatTemplate | None:
    """The model's chat template (see the module docstring for the order), or None when none applies: a file
    without a vocabulary, or a base model without a template of its own.

    override: a built-in name ("chatml", "gemma") or Jinja source. bos_token / eos_token: the tokenizer's token
    texts. name: use the file's named template `tokenizer.chat_template.<name>` (ChatTemplateError if absent).
    Nothing is compiled here: errors in the template appear at render time.
    """
    tokens = {"bos_token": bos_token, "eos_token": eos_token}
    if override is not None:
        if not isinstance(override, str):
            raise ChatTemplateError(f"override must be a built-in name or Jinja source, got {type(override).__name__}")
        if override in BUILTIN_TEMPLATES:
            return ChatTemplate(BUILTIN_TEMPLATES[override], **tokens, name=override,
                                origin=f"built-in {override} (asked for)")  # fmt: skip
        return ChatTemplate(override, **tokens, name="override", origin="a custom template (asked for)")
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    source = metadata.get(key)
    if source is not None:
        origin = "the file's template" if name is None else f"the file's template {name!r}"
        return ChatTemplate(str(source), **tokens, name=key, origin=origin)
    if name is not None:
        names = metadata.get("tokenizer.chat_templates") or []
        raise ChatTemplateError(f"no {key} in this file; named templates here: {list(names) or 'none'}")
    if metadata.get("tokenizer.ggml.model") in (None, "none", "no_vocab"):
        return None
    evidence = chat_model_evidence(metadata)
    if evidence is None:
        return None
    builtin = "gemma" if str(metadata.get("general.architecture", "")).startswith("gemma") else "chatml"
    return ChatTemplate(BUILTIN_TEMPLATES[builtin], **tokens, name=f"{builtin} (fallback)",
                        origin=f"built-in {builtin} (the file has none; {evidence})")  # fmt: skip


__all__ = [
    "BUILTIN_TEMPLATES",
    "CHATML",
    "GEMMA",
    "ChatTemplate",
    "ChatTemplateError",
    "chat_model_evidence",
    "chat_template_from_metadata",
]
