"""Tool calls: which format a model family writes them in, parsing a reply into OpenAI `tool_calls`, and the
constraint that makes a required call valid.

Nothing here renders prompts: the model's own chat template renders `tools` (ChatTemplate.render(tools=...)).
The formats follow llama.cpp common/chat.cpp (common_chat_templates_apply_jinja picks a handler from the template
source; each handler has a parser and, for tool_choice "required", a grammar):

    format     families                               what the model writes
    hermes     Hermes 2 Pro, Qwen2.5/Qwen3 (<tool_call> <tool_call>{"name": "f", "arguments": {...}}</tool_call>, once
               in the template)                       per call
    smollm2    SmolLM2 (ChatML with its "SmolLM"      <tool_call>[{"name": "f", "arguments": {...}}, ...]</tool_call>,
               system line; its function-calling      one list (SmolLM2's published tool prompt; the 135M template
               prompt)                                does not render tools, so the app's system prompt must)
    llama3     Llama 3.1/3.2/3.3 (ipython role or     {"name": "f", "parameters": {...}}, optionally after
               <|python_tag|> in the template)        <|python_tag|>; several separated by ";" or newlines
    mistral    Mistral Nemo/Small ([TOOL_CALLS])      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
    pythonic   Gemma 2/3 (architecture gemma*, or     ```tool_code\\nf(a=1, b="x")\\n``` or [f(a=1), g(b=2)]
               <start_of_turn> in the template)       (Gemma's function-calling guide; llama.cpp's pythonic parser)
    generic    anything else                          {"tool_calls": [{"name": "f", "arguments": {...}}, ...]}
                                                      (llama.cpp's generic handler, the JSON it asks for)

Entry points:

>>> fmt = detect_format(model.chat_template.source, model.architecture)      # "hermes", "smollm2", ...
>>> reply = parse_tool_calls(text, fmt)      # ParsedReply(content="...", tool_calls=[{"id": "call_...", ...}])
>>> constraint = tool_call_constraint(fmt, tools, "required", model.tokenizer)   # or None for "auto"/"none"

tool_choice "auto" needs only the parser; "required" or {"type": "function", "function": {"name": ...}} gets a
grammar: the family's wrapper around a JSON Schema union (anyOf) of the allowed functions, each
{"name": const, "arguments": the function's `parameters`}, so a call always names a given function and its
arguments validate against that function's schema. tool_choice "none" gets neither (the reply is plain content).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import llguidance

from .errors import GrammarError
from .grammar import JSON_OPTIONS, Constraint
from .tokenizer import Tokenizer

FORMATS = ("hermes", "smollm2", "llama3", "mistral", "pythonic", "generic")


def detect_format(template_source: str | None, architecture: str | None = None) -> str:
    """The tool-call format of a model, from its chat template source and its architecture (the table above)."""
    src = template_source or ""
    arch = (architecture or "").lower()
    if "<tool_call>[" in src or "named SmolLM" in src:
        return "smollm2"
    if "<tool_call>" in src:
        return "hermes"
    if "<|start_header_id|>ipython<|end_header_id|>" in src or "<|python_tag|>" in src:
        return "llama3"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if arch.startswith("gemma") or "<start_of_turn>" in src:
        return "pythonic"
    return "generic"


# ---- parsing ------------------------------------------------------------------------------------------------


@dataclass
class ParsedReply:
    """A reply split into its text content and OpenAI tool calls
    ([{"id": "call_...", "type": "function", "function": {"name": ..., "arguments": "<JSON string>"}}])."""

    content: str
    tool_calls: list[dict] = field(default_factory=list)


def _call(name, arguments) -> dict | None:
    """An OpenAI tool call, or None if `name`/`arguments` are not a function name and an object of arguments."""
    if not isinstance(name, str) or not name:
        return None
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string already
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _json_calls(value, args_key: str) -> list[dict] | None:
    """Calls from a decoded JSON value: one {"name", args_key} object or a list of them; None if it is not that."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or "name" not in item:
            return None
        args = item.get(args_key, item.get("arguments", item.get("parameters")))
        call = _call(item["name"], args)
        if call is None:
            return None
        calls.append(call)
    return calls


def _decode_json_prefix(text: str, start: int) -> tuple[object, int] | None:
    """(value, end) of the JSON value starting at text[start] (after whitespace), or None."""
    decoder = json.JSONDecoder()
    i = start
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    try:
        return decoder.raw_decode(text, i)
    except json.JSONDecodeError:
        return None


def _parse_tagged(text: str, open_tag: str, close_tag: str | None, args_key: str) -> ParsedReply:
    """Every `open_tag` JSON `close_tag` block becomes calls; what is left (and any block that does not parse)
    stays content."""
    content, calls, pos = [], [], 0
    while True:
        at = text.find(open_tag, pos)
        if at < 0:
            break
        decoded = _decode_json_prefix(text, at + len(open_tag))
        found = _json_calls(decoded[0], args_key) if decoded else None
        end = decoded[1] if decoded else -1
        if found is not None and close_tag is not None:
            rest = text[end:]
            stripped = rest.lstrip()
            if stripped.startswith(close_tag):
                end += len(rest) - len(stripped) + len(close_tag)
            elif stripped:  # an unterminated block followed by more text is not a call
                found = None
        if found is None:
            content.append(text[pos : at + len(open_tag)])
            pos = at + len(open_tag)
            continue
        content.append(text[pos:at])
        calls += found
        pos = end
    content.append(text[pos:])
    return ParsedReply("".join(content).strip(), calls)


def _parse_llama3(text: str) -> ParsedReply:
    """{"name": ..., "parameters": ...} objects (after an optional <|python_tag|>), separated by ; or whitespace.
    As llama.cpp, a reply is calls only if it starts with one; otherwise it is all content."""
    body = text.replace("<|python_tag|>", "", 1) if text.lstrip().startswith("<|python_tag|>") else text
    calls, pos = [], 0
    while True:
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
        if pos >= len(body) or body[pos] != "{":
            break
        decoded = _decode_json_prefix(body, pos)
        found = _json_calls(decoded[0], "parameters") if decoded else None
        if found is None:
            break
        calls += found
        pos = decoded[1]
    if not calls:
        return ParsedReply(text.strip(), [])
    return ParsedReply(body[pos:].strip(), calls)


def _parse_generic(text: str) -> ParsedReply:
    """{"tool_calls": [...]} or {"tool_call": {...}} or {"response": "..."} as the whole reply."""
    decoded = _decode_json_prefix(text, 0)
    if decoded is None or text[decoded[1] :].strip() or not isinstance(decoded[0], dict):
        return ParsedReply(text.strip(), [])
    value = decoded[0]
    if "tool_calls" in value or "tool_call" in value:
        found = _json_calls(value.get("tool_calls", value.get("tool_call")), "arguments")
        if found is not None:
            return ParsedReply("", found)
    if isinstance(value.get("response"), str) and len(value) == 1:
        return ParsedReply(value["response"], [])
    return ParsedReply(text.strip(), [])


_PY_CONSTANTS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _py_value(node: ast.AST):
    """A Python literal (or JSON's true/false/null) from an argument expression; ValueError otherwise."""
    if isinstance(node, ast.Name) and node.id in _PY_CONSTANTS:
        return _PY_CONSTANTS[node.id]
    if isinstance(node, ast.List):
        return [_py_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_py_value(k): _py_value(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _python_calls(code: str) -> list[dict] | None:
    """Calls from `f(a=1)`, `[f(a=1), g(b="x")]` or several lines of calls; None if it is not only that."""
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except SyntaxError:
        return None
    nodes: list[ast.AST] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        nodes += stmt.value.elts if isinstance(stmt.value, ast.List) else [stmt.value]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)  # dotted names (module.func) stay whole
        try:
            args = {kw.arg: _py_value(kw.value) for kw in node.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError):
            return None
        calls.append(_call(name, args))
    return calls or None


_TOOL_CODE = re.compile(r"```(?:tool_code|python|tool_call)?\s*\n(.*?)\n?```", re.DOTALL)


def _parse_pythonic(text: str) -> ParsedReply:
    """```tool_code blocks of calls, or the whole reply as a [f(a=1), ...] list of calls."""
    content, calls, pos = [], [], 0
    for m in _TOOL_CODE.finditer(text):
        found = _python_calls(m.group(1))
        if found is None:
            continue
        content.append(text[pos : m.start()])
        calls += found
        pos = m.end()
    content.append(text[pos:])
    if not calls and text.strip().startswith("["):
        found = _python_calls(text)
        if found is not None:
            return ParsedReply("", found)
    return ParsedReply("".join(content).strip(), calls)


def parse_tool_calls(text: str, fmt: str) -> ParsedReply:
    """Split a model's reply into content and OpenAI tool calls, for tool-call format `fmt` (see FORMATS).

    A block that looks like a call but does not parse stays in the content, as llama.cpp does.

    >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "hermes").tool_calls
    [{'id': 'call_...', 'type': 'function', 'function': {'name': 'f', 'arguments': '{"a": 1}'}}]
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if fmt in ("hermes", "smollm2"):  # SmolLM2 writes a list inside the tags, Hermes one object: accept either
        return _parse_tagged(text, "<tool_call>", "</tool_call>", "arguments")
    if fmt == "mistral":
        return _parse_tagged(text, "[TOOL_CALLS]", None, "arguments")
    if fmt == "llama3":
        return _parse_llama3(text)
    if fmt == "pythonic":
        return _parse_pythonic(text)
    if fmt == "generic":
        return _parse_generic(text)
    raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")


def with_tool_calls(chunks, fmt: str):
    """Pass generate.Chunks through; on the last one (unless cancelled), parse the whole reply in format `fmt`: its
    `content` is the text without the calls, and when there are calls, `tool_calls` holds them and finish_reason is
    "tool_calls". Used by Model.chat and the server."""
    from .generate import FINISH_CANCELLED, FINISH_TOOL_CALLS

    text = []
    for chunk in chunks:
        text.append(chunk.text)
        if chunk.finish_reason is not None and chunk.finish_reason != FINISH_CANCELLED:
            reply = parse_tool_calls("".join(text), fmt)
            chunk.content = reply.content
            if reply.tool_calls:
                chunk.tool_calls = reply.tool_calls
                chunk.finish_reason = FINISH_TOOL_CALLS
        yield chunk


def format_tool_calls(calls: Sequence[Mapping], fmt: str) -> str:
    """The text a model of format `fmt` writes for OpenAI `tool_calls` (the inverse of parse_tool_calls), for
    rendering an assistant turn's calls into a template that does not handle `tool_calls` itself.

    >>> format_tool_calls([{"function": {"name": "f", "arguments": '{"a": 1}'}}], "hermes")
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    """
    parsed = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tool_calls[{i}] must be {{'function': {{'name': ..., 'arguments': ...}}}}, got {call!r}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise ValueError(f"tool_calls[{i}].function.arguments is not JSON: {e}") from None
        parsed.append((fn["name"], args))
    if fmt == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in parsed)
    if fmt == "smollm2":
        return f"<tool_call>{json.dumps([{'name': n, 'arguments': a} for n, a in parsed])}</tool_call>"
    if fmt == "mistral":
        return f"[TOOL_CALLS]{json.dumps([{'name': n, 'arguments': a} for n, a in parsed])}"
    if fmt == "llama3":
        return "\n".join(json.dumps({"name": n, "parameters": a}) for n, a in parsed)
    if fmt == "pythonic":
        if not all(isinstance(a, Mapping) for _, a in parsed):
            raise ValueError("pythonic tool calls need arguments that are JSON objects")
        calls_text = ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in parsed)
        return f"[{calls_text}]"
    if fmt == "generic":
        return json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in parsed]})
    raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")


# ---- the constraint for tool_choice "required" / a named function --------------------------------------------


def _functions(tools) -> list[tuple[str, dict]]:
    """[(name, parameters schema)] from an OpenAI `tools` list, checked."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not tools:
        raise GrammarError(f"tools must be a non-empty list of {{'type': 'function', 'function': ...}}, got {tools!r}")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise GrammarError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}, got {tool!r}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise GrammarError(f"tools[{i}].function.name must be 1-64 of [A-Za-z0-9_.-], got {name!r}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise GrammarError(f"tools[{i}].function.parameters must be a JSON Schema object, got {params!r}")
        out.append((name, dict(params)))
    return out


def _chosen(functions: list[tuple[str, dict]], tool_choice) -> list[tuple[str, dict]] | None:
    """The functions a call must be one of, or None when tool_choice asks for no constraint ("auto", "none")."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        return functions
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(tool_choice, Mapping) or tool_choice.get("type") != "function" or not isinstance(name, str):
        raise GrammarError(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, "
            f"got {tool_choice!r}"
        )
    named = [f for f in functions if f[0] == name]
    if not named:
        raise GrammarError(f"tool_choice names function {name!r}, which is not in tools ({[f[0] for f in functions]})")
    return named


def check_tools(tools, tool_choice="auto") -> None:
    """GrammarError naming what is wrong with an OpenAI `tools` list or `tool_choice`, before any grammar is built.
    Each function's `parameters` must be a JSON Schema the engine accepts."""
    functions = _functions(tools)
    _chosen(functions, tool_choice)
    for name, params in functions:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(params), defaults=JSON_OPTIONS)
            err = llguidance.LLMatcher.validate_grammar(grammar)
        except (TypeError, ValueError) as e:
            err = str(e)
        if err:
            raise GrammarError(f"tools: function {name!r} has parameters the schema engine refuses: {err}")


def _call_schema(functions: list[tuple[str, dict]], args_key: str) -> tuple[dict, dict]:
    """(JSON Schema of one call, definitions): anyOf one {"name": const, args_key: parameters} object per function.

    Each function's `$defs`/`definitions` are taken out, to go to the root of the grammar's schema (_lark_json),
    where its "#/$defs/..." references point once the parameters are nested; two functions defining one name
    differently is a GrammarError."""
    shared: dict[str, dict] = {}
    options = []
    for name, params in functions:
        params = dict(params)
        for key in ("$defs", "definitions"):
            defs = params.pop(key, None)
            if not isinstance(defs, Mapping):
                continue
            for def_name, definition in defs.items():
                if shared.setdefault(key, {}).setdefault(def_name, definition) != definition:
                    raise GrammarError(f"tools: functions define {key}/{def_name} differently; rename one of them")
        if params.get("type") == "object" and "additionalProperties" not in params:
            # no arguments beyond the declared ones, as llama.cpp's json-schema-to-grammar reads a schema that
            # does not say (common/json-schema-to-grammar.cpp); a call with unknown arguments is of no use
            params["additionalProperties"] = False
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    return (options[0] if len(options) == 1 else {"anyOf": options}), shared


def _lark_json(schema: dict, definitions: dict | None = None) -> str:
    """An inline JSON Schema in llguidance's Lark, with the definitions at its root and our whitespace rule."""
    return "%json " + json.dumps({**schema, **(definitions or {}), "x-guidance": JSON_OPTIONS})


def _kwargs_lark(params: dict) -> str:
    """Lark for the keyword arguments `a=..., b=...` of one call: required parameters in schema order, then any
    of the optional ones in schema order; each value a JSON value of the parameter's schema, with the function's
    definitions at its root (JSON literals are Python literals but for true/false/null, which the parser reads
    too)."""
    props = params.get("properties", {}) if isinstance(params.get("properties"), Mapping) else {}
    definitions = {k: params[k] for k in ("$defs", "definitions") if isinstance(params.get(k), Mapping)}
    required = [p for p in params.get("required", []) if p in props]
    optional = [p for p in props if p not in required]

    def item(p: str) -> str:
        return f"{json.dumps(p + '=')} {_lark_json(props[p], definitions)}"

    def later(ps: list[str]) -> str:  # each of ps, or not, in order, each after a comma
        return " ".join(f'(", " {item(p)})?' for p in ps)

    if required:
        return " ".join([' ", " '.join(item(p) for p in required), later(optional)]).strip()
    if not optional:
        return '""'
    # optional parameters only: the first one present has no comma before it
    return "(" + " | ".join(f"{item(p)} {later(optional[i + 1 :])}".strip() for i, p in enumerate(optional)) + ")?"


def tool_call_grammar(fmt: str, tools, tool_choice="required", parallel_tool_calls: bool = True) -> str | None:
    """Lark grammar (llguidance's dialect, with inline %json schemas) for the calls `tool_choice` requires in
    format `fmt`; None for "auto"/"none" (parse the reply, do not constrain it)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    chosen = _chosen(_functions(tools), tool_choice)
    if chosen is None:
        return None

    def repeated(call: str, separator: str) -> str:  # one call, or several when parallel calls are allowed
        return f"{call} ({json.dumps(separator)} {call})*" if parallel_tool_calls else call

    if fmt == "hermes":
        call = f'"<tool_call>\\n" {_lark_json(*_call_schema(chosen, "arguments"))} "\\n</tool_call>"'
        return f"start: {repeated('call', chr(10))}\ncall: {call}\n"
    if fmt == "llama3":
        return f"start: {repeated('call', '; ')}\ncall: {_lark_json(*_call_schema(chosen, 'parameters'))}\n"
    if fmt == "pythonic":  # one ```tool_code block, a call per line
        calls = " | ".join(f'{json.dumps(name + "(")} {_kwargs_lark(params)} ")"' for name, params in chosen)
        return f'start: "```tool_code\\n" {repeated("call", chr(10))} "\\n```"\ncall: {calls}\n'
    call, definitions = _call_schema(chosen, "arguments")
    array = {"type": "array", "items": call, "minItems": 1}
    if not parallel_tool_calls:
        array["maxItems"] = 1
    if fmt == "smollm2":
        return f'start: "<tool_call>" {_lark_json(array, definitions)} "</tool_call>"\n'
    if fmt == "mistral":
        return f'start: "[TOOL_CALLS]" {_lark_json(array, definitions)}\n'
    schema = {
        "type": "object",
        "properties": {"tool_calls": array},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    return f"start: {_lark_json(schema, definitions)}\n"  # generic


def tool_call_constraint(
    fmt: str, tools, tool_choice, tokenizer: Tokenizer, parallel_tool_calls: bool = True
) -> Constraint | None:
    """A Constraint that makes the reply one or more valid calls in format `fmt` (tool_choice "required" or a
    named function); None for "auto" and "none".

    >>> c = tool_call_constraint("smollm2", tools, "required", model.tokenizer)
    """
    grammar = tool_call_grammar(fmt, tools, tool_choice, parallel_tool_calls)
    if grammar is None:
        return None
    return Constraint(llguidance.LLMatcher.grammar_from_lark(grammar), tokenizer, what=f"{fmt} tool-call grammar")
