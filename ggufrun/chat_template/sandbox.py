"""The Jinja sandbox a chat template compiles and renders in, inside the render worker (see worker.py).

Jinja2's ImmutableSandboxedEnvironment (no `__class__`/`__globals__`/`__subclasses__`, no list.append/dict.update
on anything) with the same settings as Hugging Face transformers' chat templates (trim_blocks, lstrip_blocks,
loopcontrols; `raise_exception`, `strftime_now`, `tojson` without HTML escaping; `{% generation %}` renders its
body), plus guards so that most hostile templates fail with a clear ChatTemplateError before the worker's hard
limits (memory rlimit, wall-clock kill) have to end them:
    - a time limit, checked on every line the compiled template executes (a trace function that only
      follows the template's own code);
    - a size limit on every value the template builds (`*`, `**`, `+`, `%`, `~`, block captures, filters and string
      methods that can multiply their input, such as center, indent, join, replace), on the text of every value it
      turns into a string (`{{ x }}`, `~`, `|string`, `|tojson`, `|pprint`, `|join`, `%`, `.format`) before that
      text is built, and on the output.
What these guards cannot see (one C-level call that runs long, such as `|sort` over millions of items) is ended
by the worker's limits.
"""

from __future__ import annotations

import functools
import json
import re
import string
import sys
import threading
import time
from datetime import datetime

from ..errors import ChatTemplateError

DEFAULT_MAX_CHARS = 8 * 1024 * 1024  # per value and for the output; raised to 8x the input size for big inputs
MAX_INT_BITS = 1 << 16
TEMPLATE_FILENAME = "<ggufrun chat template>"
_STRINGIFYING_FILTERS = frozenset(["string", "tojson", "pprint", "join", "format", "urlencode", "xmlattr"])


class _Timeout(BaseException):
    """Raised inside the template's frames when its time is up (BaseException: no `except Exception` in
    Jinja's runtime can swallow it)."""


def _size(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def text_size(value, limit: int, _depth: int = 0) -> int:
    """An upper-bound-ish size of str(value) that stops counting once it passes `limit` (so a list of
    8 million references to one 8 MB string costs two steps, not 8 million)."""
    if isinstance(value, str):
        return len(value) + 2  # the quotes repr() adds inside a container
    if isinstance(value, (bool, float)) or value is None:
        return 8
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, dict):
        items = [x for kv in value.items() for x in kv]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        from jinja2.utils import Namespace

        if isinstance(value, Namespace):  # prints its attributes
            return text_size(object.__getattribute__(value, "_Namespace__attrs"), limit, _depth + 1)
        return 64
    if _depth > 64 or 2 * len(items) > limit:
        return limit + 1
    total = 2
    for item in items:
        total += 2 + text_size(item, limit - total, _depth + 1)
        if total > limit:
            break
    return total


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

        def _output_child_pre(self, node, frame, finalize) -> None:
            # `{{ x }}` turns x into text through the environment (autoescape is off in this sandbox)
            self.write("environment.guarded_str(")
            if finalize.src is not None:
                self.write(finalize.src)

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
            self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
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

        def check_text(self, value, what: str) -> None:
            """Refuse to turn a value into text when that text would pass the limit."""
            if not isinstance(value, str) and text_size(value, self.max_chars) > self.max_chars:
                raise ChatTemplateError(f"chat template turns a value of over {self.max_chars} characters into text "
                                        f"in {what}")  # fmt: skip

        def guarded_str(self, value) -> str:
            if isinstance(value, str):
                return value
            self.check_text(value, "{{ }}")
            return str(value)

        def guarded_concat(self, parts) -> str:
            parts = list(parts)
            total = 0
            for i, p in enumerate(parts):
                if not isinstance(p, str):
                    self.check_text(p, "a text join")
                    parts[i] = p = str(p)
                total += len(p)
                if total > self.max_chars:
                    raise ChatTemplateError(f"chat template built a text of over {self.max_chars} characters")
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
                self.check_text(right, "'%'")
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
                self.check_text([*args, *kwargs.values()], f"{name}()")
            if expected > self.max_chars:
                raise ChatTemplateError(f"chat template's {name}() would build {expected} characters")

        def _check_join(self, items: list, sep: str) -> None:
            limit = self.max_chars
            if text_size(items, limit) > limit or len(sep) * len(items) > limit:
                raise ChatTemplateError(f"chat template's join would pass {limit} characters")
            if sum(text_size(v, limit) for v in items) > limit:
                raise ChatTemplateError(f"chat template's join would pass {limit} characters")

        def _guard_filter(self, name: str, f):
            from jinja2.utils import _PassArg

            skip = 0 if _PassArg.from_obj(f) is None else 1

            @functools.wraps(f)
            def guarded(*args, **kwargs):
                head, (value, *rest) = args[:skip], args[skip:] or (None,)
                if name == "join":
                    value = list(value)
                    self._check_join(value, str(rest[0]) if rest else str(kwargs.get("d", "")))
                elif name in _STRINGIFYING_FILTERS:
                    # pprint indents nested values: allow for that by counting the value twice
                    self.check_text([value, value] if name == "pprint" else value, f"filter {name}")
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
                    __self._check_join(items, owner)
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
def _environment():
    return _make_environment()()


def compile_template(source: str, name: str):
    """The compiled template; ChatTemplateError on a syntax error or a template too deeply nested to parse
    (MemoryError passes through, as in render_template)."""
    from jinja2 import TemplateSyntaxError

    env = _environment()
    try:
        code = env.compile(source, filename=TEMPLATE_FILENAME)
        return env.template_class.from_code(env, code, env.make_globals(None))
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template ({name}) has a syntax error at line {e.lineno}: {e.message}") from None
    except SyntaxError as e:  # Python's compiler refused the generated code (e.g. too many nested blocks)
        raise ChatTemplateError(f"chat template ({name}) cannot be compiled: {e.msg}") from None
    except RecursionError:
        raise ChatTemplateError(f"chat template ({name}) is too deeply nested: RecursionError") from None


def render_template(template, variables: dict, *, name: str, timeout_s: float, max_chars: int) -> str:
    """Render a compiled template with plain-data variables under the time and size guards. MemoryError passes
    through: the worker answers it and then exits, as its heap may be in a poor state."""
    from jinja2.exceptions import SecurityError, TemplateError

    env = template.environment
    env.max_chars = max_chars
    out: list[str] = []
    total = 0
    deadline = time.perf_counter() + timeout_s

    def trace_lines(frame, event, arg):
        if time.perf_counter() > deadline:
            raise _Timeout
        return trace_lines

    def trace_calls(frame, event, arg):
        # follow only the template's own code: its loops are where unbounded work can hide
        return trace_lines if frame.f_code.co_filename == TEMPLATE_FILENAME else None

    previous = sys.gettrace()
    sys.settrace(trace_calls)
    try:
        for piece in template.root_render_func(template.new_context(variables)):
            total += len(piece)
            if total > max_chars:
                raise ChatTemplateError(f"chat template output passed {max_chars} characters")
            out.append(piece)
    except _Timeout:
        raise ChatTemplateError(f"chat template ({name}) took longer than {timeout_s} s") from None
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template ({name}) broke a sandbox rule: {e}") from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
        raise ChatTemplateError(f"chat template ({name}) failed: {type(e).__name__}: {e}") from None
    except (RecursionError, OverflowError) as e:
        raise ChatTemplateError(f"chat template ({name}) ran out of resources: {type(e).__name__}") from None
    finally:
        sys.settrace(previous)
    return "".join(out)
