"""Tool calls (ggufrun.tool_calls): format detection per family, parsing fixed replies into OpenAI tool_calls,
the grammars for tool_choice "required"/named, and a required call on SmolLM2 that comes out valid."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from ggufrun.errors import GrammarError
from ggufrun.reader import GGUFFile
from ggufrun.sampling import Sampler, SamplingParams
from ggufrun.tokenizer import load_tokenizer
from ggufrun.tool_calls import (
    FORMATS,
    detect_format,
    parse_tool_calls,
    tool_call_constraint,
    tool_call_grammar,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 12}}, "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def calls_of(reply) -> list[tuple[str, dict]]:
    out = []
    for call in reply.tool_calls:
        assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) > 10
        assert isinstance(call["function"]["arguments"], str)
        out.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
    return out


# ---- detection ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, arch, fmt",
    [
        ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{\"name\": ...}</tool_call>", "qwen2",
         "hermes"),
        ("<|start_header_id|>ipython<|end_header_id|>", "llama", "llama3"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama", "llama3"),
        ("[AVAILABLE_TOOLS]...[TOOL_CALLS]", "llama", "mistral"),
        ("<tool_call>[\n{\"name\": \"func_name1\", \"arguments\": {}}]</tool_call>", "llama", "smollm2"),
        (None, "gemma3", "pythonic"),
        ("{{ '<start_of_turn>' + role }}", "gemma2", "pythonic"),
        ("{{ '<|user|>' + message['content'] }}", "phi3", "generic"),
        (None, None, "generic"),
    ],
)  # fmt: skip
def test_detect_format(source, arch, fmt):
    assert detect_format(source, arch) == fmt


def test_detect_format_of_the_real_smollm2_template(smollm2_path):
    md = GGUFFile(smollm2_path).metadata
    assert detect_format(md["tokenizer.chat_template"], md["general.architecture"]) == "smollm2"


# ---- parsing, per family --------------------------------------------------------------------------------------


def test_parse_hermes():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>'
    )
    reply = parse_tool_calls(text, "hermes")
    assert calls_of(reply) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    assert reply.content == "Let me check."
    ids = [c["id"] for c in reply.tool_calls]
    assert len(set(ids)) == 2


def test_parse_smollm2_list():
    text = '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}},\n{"name": "get_time", "arguments": {}}\n]</tool_call>'  # noqa: E501
    reply = parse_tool_calls(text, "smollm2")
    assert calls_of(reply) == [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_time", {})]
    assert reply.content == ""


def test_parse_llama3():
    reply = parse_tool_calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', "llama3")
    assert calls_of(reply) == [("get_weather", {"city": "Rome"})] and reply.content == ""
    two = parse_tool_calls('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', "llama3")
    assert calls_of(two) == [("a", {}), ("b", {"x": 1})]
    prose = parse_tool_calls('The JSON is {"name": "a", "parameters": {}}', "llama3")
    assert prose.tool_calls == [] and prose.content.startswith("The JSON")


def test_parse_mistral():
    reply = parse_tool_calls('[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}}]', "mistral")
    assert calls_of(reply) == [("get_time", {"tz": "UTC"})]


def test_parse_pythonic():
    text = 'Sure.\n```tool_code\nget_weather(city="Paris", unit="celsius")\nget_time(tz=None)\n```'
    reply = parse_tool_calls(text, "pythonic")
    assert calls_of(reply) == [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"tz": None})]
    assert reply.content == "Sure."
    listed = parse_tool_calls('[get_weather(city="Lima", days=[1, 2], opts={"a": true}), get_time()]', "pythonic")
    assert calls_of(listed) == [
        ("get_weather", {"city": "Lima", "days": [1, 2], "opts": {"a": True}}),
        ("get_time", {}),
    ]
    code = parse_tool_calls("```python\nprint(open('x').read())\n```", "pythonic")  # not a call: positional args
    assert code.tool_calls == [] and "print" in code.content


def test_parse_generic():
    reply = parse_tool_calls('{"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}}]}', "generic")
    assert calls_of(reply) == [("get_time", {"tz": "UTC"})]
    one = parse_tool_calls('{"tool_call": {"name": "get_time", "arguments": {}}}', "generic")
    assert calls_of(one) == [("get_time", {})]
    assert parse_tool_calls('{"response": "Hello"}', "generic").content == "Hello"
    assert parse_tool_calls("Just text.", "generic").content == "Just text."


@pytest.mark.parametrize(
    "text, fmt",
    [
        ('<tool_call>{"name": "f", "arguments": {</tool_call>', "hermes"),  # broken JSON
        ('<tool_call>{"arguments": {}}</tool_call>', "hermes"),  # no name
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "hermes"),  # arguments not an object
        ('<tool_call>{"name": "f", "arguments": {}} and more text', "hermes"),  # never closed
        ("```tool_code\nimport os\n```", "pythonic"),
    ],
)
def test_malformed_calls_stay_content(text, fmt):
    reply = parse_tool_calls(text, fmt)
    assert reply.tool_calls == [] and reply.content == text.strip()


def test_arguments_given_as_a_json_string():
    reply = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "hermes")
    assert calls_of(reply) == [("f", {"a": 1})]


def test_unknown_format():
    with pytest.raises(ValueError, match="fmt must be one of"):
        parse_tool_calls("x", "xml")


# ---- grammars for tool_choice -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_tok(smollm2_path):
    return load_tokenizer(GGUFFile(smollm2_path).metadata)


def test_auto_and_none_are_not_constrained():
    assert tool_call_grammar("hermes", TOOLS, "auto") is None
    assert tool_call_grammar("hermes", TOOLS, "none") is None


@pytest.mark.parametrize(
    "tools, choice, match",
    [
        ([], "required", "tools must be a non-empty list"),
        ([{"type": "function"}], "required", r"tools\[0\]"),
        ([{"type": "function", "function": {"name": "bad name!"}}], "required", r"tools\[0\].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": 3}}], "required", "parameters"),
        (TOOLS, "sometimes", "tool_choice must be"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in tools"),
    ],
)
def test_bad_tools_and_tool_choice(tools, choice, match):
    with pytest.raises(GrammarError, match=match):
        tool_call_grammar("hermes", tools, choice)


def random_run(constraint, tok, seed: int, max_tokens: int = 300) -> str:
    rng = np.random.default_rng(seed)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed), tok.n_vocab)
    out: list[int] = []
    for _ in range(max_tokens):
        logits = rng.normal(0, 3, tok.n_vocab).astype(np.float32)
        # favour the end of strings and of the reply, so that random text ends within max_tokens
        logits[tok.tokenize('"', add_special=False)[0]] += 4
        logits[list(tok.eog_ids)] += 8
        token, _ = sampler.sample(logits, out, constraint=constraint)
        if token in tok.eog_ids:
            break
        constraint.advance(token)
        out.append(token)
        if constraint.is_done:
            break
    else:
        raise AssertionError(f"no end after {max_tokens} tokens: {tok.detokenize(out)!r}")
    return tok.detokenize(out)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_calls_always_parse_and_validate(smol_tok, fmt, choice):
    """Any token sequence the grammar lets through parses back into calls of the allowed functions whose
    arguments validate against their schemas."""
    for seed in range(3):
        c = tool_call_constraint(fmt, TOOLS, choice, smol_tok)
        text = random_run(c, smol_tok, seed)
        calls = calls_of(parse_tool_calls(text, fmt))
        assert calls, text
        for name, args in calls:
            assert name in (SCHEMAS if choice == "required" else {"get_weather"}), text
            jsonschema.validate(args, SCHEMAS[name])


def test_single_call_when_not_parallel(smol_tok):
    grammar = tool_call_grammar("smollm2", TOOLS, "required", parallel_tool_calls=False)
    assert '"maxItems": 1' in grammar
    c = tool_call_constraint("hermes", TOOLS, "required", smol_tok, parallel_tool_calls=False)
    assert len(calls_of(parse_tool_calls(random_run(c, smol_tok, 5), "hermes"))) == 1


# ---- a required call on SmolLM2 ---------------------------------------------------------------------------------

SMOLLM2_TOOL_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    '<tool_call>[\n{{"name": "func_name1", "arguments": {{"argument1": "value1"}}}},\n'
    "(more tool calls as required)\n]</tool_call>"
)


@pytest.mark.real
def test_required_call_on_smollm2(smollm2_path):
    import ggufrun

    model = ggufrun.load(smollm2_path, n_ctx=1024, n_threads=1)
    fmt = detect_format(model.metadata.get("tokenizer.chat_template"), model.architecture)
    system = SMOLLM2_TOOL_PROMPT.format(tools=json.dumps([t["function"] for t in TOOLS]))
    ids = model.chat_ids([{"role": "system", "content": system}, {"role": "user", "content": "Weather in Paris?"}])
    c = tool_call_constraint(fmt, TOOLS, "required", model.tokenizer)
    text = "".join(ch.text for ch in model.generate(ids, 80, temperature=0, constraint=c))
    calls = calls_of(parse_tool_calls(text, fmt))
    assert calls and all(name in SCHEMAS for name, _ in calls), text
    for name, args in calls:
        jsonschema.validate(args, SCHEMAS[name])
    assert calls[0][0] == "get_weather", text


@pytest.mark.parametrize("fmt", FORMATS)
def test_parameters_with_refs(smol_tok, fmt):
    """A function's $defs move to the grammar's root, so its "#/$defs/..." references still resolve."""
    params = {
        "type": "object",
        "properties": {"unit": {"$ref": "#/$defs/unit"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["unit", "days"],
        "additionalProperties": False,
        "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
    }
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": params}}]
    c = tool_call_constraint(fmt, tools, "required", smol_tok, parallel_tool_calls=False)
    calls = calls_of(parse_tool_calls(random_run(c, smol_tok, 1), fmt))
    assert [name for name, _ in calls] == ["forecast"]
    jsonschema.validate(calls[0][1], params)
    clash = [tools[0], {"type": "function", "function": {"name": "other", "parameters": {"$defs": {"unit": {}}}}}]
    if fmt != "pythonic":  # pythonic arguments are separate schemas, each with its own function's definitions
        with pytest.raises(GrammarError, match=r"\$defs/unit"):
            tool_call_grammar(fmt, clash)
