"""Chat templates: the Jinja template stored in the GGUF file, rendered in a sandbox, or a documented fallback.

A template is untrusted code from a downloaded file. It runs in Jinja2's ImmutableSandboxedEnvironment
(no `__class__`/`__globals__`/`__subclasses__`, no list.append/dict.update on anything), with three more guards
so that a hostile template fails with ChatTemplateError instead of hanging or eating memory:
    - a time limit, checked on every line the compiled template executes (a trace function that only
      follows the template's own code, active during render() only);
    - a size limit on every value the template builds (`*`, `**`, `+`, `%`, `~`, block captures, filters
      and string methods that can multiply their input, such as center, indent, join, replace) and on the output;
    - inputs are copied to plain dicts/lists/strings first, so nothing the caller passed can be touched.
Templates compile on first use, so a broken template never stops a model from loading.

Same environment as Hugging Face transformers (trim_blocks, lstrip_blocks, loopcontrols; `raise_exception`,
`strftime_now`, `tojson` without HTML escaping; `{% generation %}` tags rendered as their body).

Fallbacks when the file has no template (llama.cpp src/llama-chat.cpp, LLM_CHAT_TEMPLATE_GEMMA / _CHATML):
    gemma*: "<start_of_turn>user\\n{content}<end_of_turn>\\n" ... "<start_of_turn>model\\n"; "assistant" is
            "model"; system messages are trimmed and folded into the next user turn as "{system}\\n\\n";
            message contents are trimmed (ASCII whitespace); no BOS in the text (tokenize adds it).
    others: ChatML "<|im_start|>{role}\\n{content}<|im_end|>\\n" ... "<|im_start|>assistant\\n".

>>> t = ChatTemplate(CHATML)
>>> t.render([{"role": "user", "content": "Hi"}])
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import functools
import json
import re
import string
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from .errors import ChatTemplateError

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
DEFAULT_MAX_CHARS = 8 * 1024 * 1024  # per value and for the output; raised to 8x the input size for big inputs
MAX_INT_BITS = 1 << 16
_TEMPLATE_FILENAME = "<ggufrun chat template>"


class _Timeout(BaseException):
    """Raised inside the template's frames when its time is up (BaseException: no `except Exception` in
    Jinja's runtime can swallow it)."""


# ---- the sandbox ------------------------------------------------------------------------------------------------
def _size(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def _format_widths(fmt: str) -> list[int]:
    """Field widths/precisions in a %-style or {}-style format string."""
    nums = [int(w) for m in re.finditer(r"%[-#0 +]*(\d*)(?:\.(\d*))?", fmt) for w in m.groups() if w]
    try:
        for _, _, spec, _ in string.Formatter().parse(fmt):
            nums += [int(w) for w in re.findall(r"\d+", spec or "")]
    except ValueError:
        pass  # a malformed {} format fails later, in the call itself
    return nums


def _make_environment():
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """{% generation %}...{% endgeneration %} (HF's assistant-mask marker) renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class GuardedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node: nodes.Concat, frame) -> None:
            # `a ~ b` joins through the environment so that its size is checked
            self.write("environment.guarded_str_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Sandbox(ImmutableSandboxedEnvironment):
        code_generator_class = GuardedCodeGenerator
        intercepted_binops = frozenset(["*", "**", "+", "%"])
        _limits = threading.local()  # the size limit of the render running in this thread

        @property
        def max_chars(self) -> int:
            return getattr(self._limits, "max_chars", DEFAULT_MAX_CHARS)

        @max_chars.setter
        def max_chars(self, value: int) -> None:
            self._limits.max_chars = value

        def __init__(self):
            super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationTag])
            self.globals.pop("lipsum", None)  # builds any amount of text in plain Python
            self.filters["tojson"] = _tojson
            self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}
            self.concat = self.guarded_concat  # block captures, macro bodies, {% filter %} blocks

        def unsafe_undefined(self, obj, attribute):
            # fail at the access itself, not only when the result is used
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

        # size checks
        def check(self, value, what: str):
            n = _size(value)
            if n > self.max_chars:
                raise ChatTemplateError(f"chat template built a value of {n} items in {what} (limit {self.max_chars})")
            if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
                raise ChatTemplateError(f"chat template built an integer of {value.bit_length()} bits in {what}")
            return value

        def guarded_concat(self, parts) -> str:
            parts = [p if isinstance(p, str) else str(p) for p in parts]
            n = sum(map(len, parts))
            if n > self.max_chars:
                raise ChatTemplateError(f"chat template built a text of {n} characters (limit {self.max_chars})")
            return "".join(parts)

        def guarded_str_join(self, parts) -> str:
            return self.guarded_concat(parts)

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if _size(seq) and isinstance(times, int) and _size(seq) * times > self.max_chars:
                        raise ChatTemplateError(f"chat template repeats a value {times} times (limit {self.max_chars})")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > MAX_INT_BITS:
                    raise ChatTemplateError(f"chat template computes {left} ** {right}, too large")
            elif operator == "%" and isinstance(left, str):
                self._check_widths(left)
            elif operator == "+" and _size(left) + _size(right) > self.max_chars:
                raise ChatTemplateError(f"chat template built a value over {self.max_chars} items with +")
            return self.check(super().call_binop(context, operator, left, right), f"'{operator}'")

        def _check_widths(self, fmt: str) -> None:
            widths = _format_widths(fmt)
            if widths and max(widths) > self.max_chars:
                raise ChatTemplateError(f"chat template formats with a width of {max(widths)} (limit {self.max_chars})")

        def _check_growth(self, name: str, value, args: tuple, kwargs: dict) -> None:
            """Reject calls whose result would pass the limit before making them."""
            ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
            if any(abs(i) > self.max_chars for i in ints):
                raise ChatTemplateError(f"chat template calls {name} with a number over {self.max_chars}")
            text = value if isinstance(value, str) else ""
            expected = 0
            if name in ("center", "ljust", "rjust", "zfill") and ints:
                expected = max(ints)
            elif name == "indent":
                width = args[0] if args else kwargs.get("width", 4)
                expected = len(text) + (text.count("\n") + 1) * (width if isinstance(width, int) else len(str(width)))
            elif name == "expandtabs":
                expected = len(text) + text.count("\t") * (ints[0] if ints else 8)
            elif name == "replace" and len(args) >= 2:
                old, new = str(args[0]), str(args[1])
                count = text.count(old) if old else len(text) + 1
                expected = len(text) + count * max(0, len(new) - len(old))
            elif name in ("format", "format_map") and isinstance(value, str):
                self._check_widths(value)
            if expected > self.max_chars:
                raise ChatTemplateError(f"chat template's {name}() would build {expected} characters")

        def _guard_filter(self, name: str, f):
            from jinja2.utils import _PassArg

            skip = 0 if _PassArg.from_obj(f) is None else 1

            @functools.wraps(f)
            def guarded(*args, **kwargs):
                head, (value, *rest) = args[:skip], args[skip:] or (None,)
                if name == "join":
                    value = list(value)
                    sep = str(rest[0]) if rest else str(kwargs.get("d", ""))
                    if sum(len(str(v)) for v in value) + len(sep) * len(value) > self.max_chars:
                        raise ChatTemplateError(f"chat template's join would pass {self.max_chars} characters")
                self._check_growth(name, value, tuple(rest), kwargs)
                return self.check(f(*head, value, *rest, **kwargs), f"filter {name}")

            return guarded

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
            name = getattr(__obj, "__name__", "")
            # str.format arrives wrapped by the sandbox (SandboxedEnvironment.wrap_str_format)
            owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(owner, str):
                if name == "join" and args:
                    items = list(args[0])
                    if sum(len(str(v)) for v in items) + len(owner) * len(items) > __self.max_chars:
                        raise ChatTemplateError(f"chat template's join would pass {__self.max_chars} characters")
                    args = (items, *args[1:])
                __self._check_growth(name, owner, args, kwargs)
            return __self.check(super().call(__context, __obj, *args, **kwargs), f"call to {name or __obj!r}")

    return Sandbox


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """tojson as in transformers' chat templates (plain json.dumps; Jinja's own escapes <, > and &)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise ChatTemplateError(f"chat template: {message}")


def _strftime_now(fmt):
    return datetime.now().strftime(str(fmt))


@functools.lru_cache(maxsize=1)
def _sandbox_class():
    return _make_environment()


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
    """A chat template: Jinja source compiled on first render, in the guarded sandbox.

    source: Jinja text (tokenizer.chat_template, a user string, or CHATML / GEMMA).
    bos_token, eos_token: texts the template can use as {{ bos_token }} / {{ eos_token }}.
    timeout_s, max_chars: the render time limit and the size limit for values and the output.
    """

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        name: str = "custom",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_chars: int = DEFAULT_MAX_CHARS,
    ):
        if not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be a str, got {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self._env = None
        self._template = None

    def compile(self) -> None:
        """Compile now (render() does it on first use); raises ChatTemplateError on a syntax error."""
        if self._template is not None:
            return
        from jinja2 import TemplateSyntaxError

        env = _sandbox_class()()
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            code = env.compile(self.source, filename=_TEMPLATE_FILENAME)
            self._template = env.template_class.from_code(env, code, env.make_globals(None))
        except TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template ({self.name}) has a syntax error at line {e.lineno}: {e.message}"
            ) from None
        self._env = env

    def render(
        self, messages: Sequence[Mapping], add_generation_prompt: bool = True, tools: Sequence | None = None, **extra
    ) -> str:
        """The prompt text for a conversation.

        messages: [{"role": "system"|"user"|"assistant"|..., "content": "..."}, ...]
        tools: tool definitions for templates that support them; extra: more template variables
        (e.g. enable_thinking=False), which may also override bos_token / eos_token.
        """
        from jinja2.exceptions import SecurityError, TemplateError

        self.compile()
        variables = {
            "messages": _plain(list(messages), "messages"),
            "add_generation_prompt": bool(add_generation_prompt),
            "tools": _plain(tools, "tools"),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        variables.update({k: _plain(v, k) for k, v in extra.items()})
        env = self._env
        env.max_chars = max(self.max_chars, 8 * _input_chars(variables))
        out: list[str] = []
        total = 0
        deadline = time.perf_counter() + self.timeout_s

        def trace_lines(frame, event, arg):
            if time.perf_counter() > deadline:
                raise _Timeout
            return trace_lines

        def trace_calls(frame, event, arg):
            # follow only the template's own code: its loops are where unbounded work can hide
            return trace_lines if frame.f_code.co_filename == _TEMPLATE_FILENAME else None

        previous = sys.gettrace()
        sys.settrace(trace_calls)
        try:
            for piece in self._template.root_render_func(self._template.new_context(variables)):
                total += len(piece)
                if total > env.max_chars:
                    raise ChatTemplateError(f"chat template output passed {env.max_chars} characters")
                out.append(piece)
        except _Timeout:
            raise ChatTemplateError(f"chat template ({self.name}) took longer than {self.timeout_s} s") from None
        except ChatTemplateError:
            raise
        except SecurityError as e:
            raise ChatTemplateError(f"chat template ({self.name}) broke a sandbox rule: {e}") from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
            raise ChatTemplateError(f"chat template ({self.name}) failed: {type(e).__name__}: {e}") from None
        except (RecursionError, MemoryError, OverflowError) as e:
            raise ChatTemplateError(f"chat template ({self.name}) ran out of resources: {type(e).__name__}") from None
        finally:
            sys.settrace(previous)
        return "".join(out)

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"


def _token_text(metadata: Mapping, key: str) -> str:
    tokens, i = metadata.get("tokenizer.ggml.tokens"), metadata.get(key)
    if tokens is None or i is None or not 0 <= int(i) < len(tokens):
        return ""
    return tokens[int(i)]


def chat_template_from_metadata(
    metadata: Mapping, name: str | None = None, override: str | None = None
) -> ChatTemplate | None:
    """The model's chat template: `override` (a Jinja string, or "chatml"/"gemma"), else the file's
    `tokenizer.chat_template` (`tokenizer.chat_template.<name>` when a name is given), else the fallback
    for the architecture (gemma* -> GEMMA, others -> CHATML). None for files without a vocabulary.
    Nothing is compiled here: errors in the template appear at render time.
    """
    bos = _token_text(metadata, "tokenizer.ggml.bos_token_id")
    eos = _token_text(metadata, "tokenizer.ggml.eos_token_id")
    if override is not None:
        if override in BUILTIN_TEMPLATES:
            return ChatTemplate(BUILTIN_TEMPLATES[override], bos, eos, name=override)
        return ChatTemplate(override, bos, eos, name="override")
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    source = metadata.get(key)
    if source is not None:
        return ChatTemplate(str(source), bos, eos, name=key)
    if name is not None:
        names = metadata.get("tokenizer.chat_templates") or []
        raise ChatTemplateError(f"no {key} in this file; named templates here: {list(names) or 'none'}")
    if metadata.get("tokenizer.ggml.model") in (None, "none", "no_vocab"):
        return None
    arch = str(metadata.get("general.architecture", ""))
    if arch.startswith("gemma"):
        return ChatTemplate(GEMMA, bos, eos, name="gemma (fallback)")
    return ChatTemplate(CHATML, bos, eos, name="chatml (fallback)")


__all__ = ["BUILTIN_TEMPLATES", "CHATML", "GEMMA", "ChatTemplate", "ChatTemplateError", "chat_template_from_metadata"]
