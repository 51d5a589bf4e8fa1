"""Structured output, tool calls and log-probabilities through the server, with the official `openai` clients
(Python, and the npm package when node/npm are on the machine) against a real uvicorn server on SmolLM2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from live_server import LiveServer
from test_grammar import SCHEMAS
from test_tool_calls import SCHEMAS as TOOL_SCHEMAS
from test_tool_calls import SMOLLM2_TOOL_PROMPT, TOOLS

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def server(smollm2_model):
    from ggufrun.server import create_app

    with LiveServer(create_app(smollm2_model, model_id="smollm2")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)


def test_json_schema_strict_answers_parse_and_validate(client):
    assert len(SCHEMAS) >= 20
    for name, schema in sorted(SCHEMAS.items()):
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        r = client.chat.completions.create(
            model="my-model", messages=[{"role": "user", "content": f"Give an example {name} as JSON."}],
            temperature=0, max_tokens=160, response_format=rf,
        )  # fmt: skip
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", (name, text)
        jsonschema.validate(json.loads(text), schema)


def _weather_chat():
    system = SMOLLM2_TOOL_PROMPT.format(tools=json.dumps([t["function"] for t in TOOLS]))
    return [{"role": "system", "content": system}, {"role": "user", "content": "What is the weather in Paris?"}]


def _check_call(call):
    assert call.type == "function" and call.id and call.function.name in TOOL_SCHEMAS
    jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])


def test_required_tool_call_is_a_valid_call(client):
    r = client.chat.completions.create(model="m", messages=_weather_chat(), tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=120)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        _check_call(call)
    named = client.chat.completions.create(
        model="m", messages=_weather_chat(), tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    assert {c.function.name for c in named.choices[0].message.tool_calls} == {"get_time"}  # parallel calls allowed


def test_streamed_tool_call_deltas_equal_the_whole_answer(client):
    kw = dict(model="m", messages=_weather_chat(), tools=TOOLS, tool_choice="required", temperature=0, max_tokens=120)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    deltas, finish = [], None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            deltas += chunk.choices[0].delta.tool_calls
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls"
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (i, c.function.name, c.function.arguments) for i, c in enumerate(whole)
    ]


def test_two_turn_tool_conversation(client, smollm2_model):
    messages = _weather_chat()
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=120)  # fmt: skip
    call = first.choices[0].message.tool_calls[0]
    _check_call(call)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=60)  # fmt: skip
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    # the call and the result are in the prompt the model saw, not dropped
    prompt = smollm2_model.detokenize(smollm2_model.prepare_chat(messages).ids)
    assert call.function.name in prompt and "18 degrees and sunny" in prompt


def test_top_logprobs_match_the_library(client, smollm2_model):
    messages = [{"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=8, logprobs=True,
                                       top_logprobs=5)  # fmt: skip
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    library = [c for c in smollm2_model.chat(messages, max_tokens=8, temperature=0, logprobs=5) if c.token is not None]
    assert len(library) == len(entries)
    for e, c in zip(entries, library):
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert e.logprob == c.logprob  # the same float, through JSON
        assert bytes(e.bytes) == smollm2_model.tokenizer.token_piece(c.token, special=True)


def test_completion_echo_with_logprobs_scores_the_prompt(client, smollm2_model):
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=3, temperature=0,
                                  logprobs=2, echo=True)  # fmt: skip
    choice = r.choices[0]
    assert choice.text.startswith("The capital of France is")
    n_prompt = len(smollm2_model.tokenize("The capital of France is"))
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == n_prompt + 3
    scored = smollm2_model.logprobs("The capital of France is")
    assert lp.token_logprobs[1:n_prompt] == [s.logprob for s in scored]
    assert "".join(lp.tokens) == choice.text


JS_CLIENT = """
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'not-needed' });
const stream = await client.chat.completions.create({
  model: 'my-model', stream: true, max_tokens: 24, temperature: 0,
  messages: [{ role: 'system', content: 'You are a helpful assistant.' },
             { role: 'user', content: 'Name the capital of France.' }],
});
for await (const chunk of stream) process.stdout.write(chunk.choices[0]?.delta?.content || '');
"""


def test_openai_npm_client_streams_a_reply(server, tmp_path_factory):
    """The JavaScript client as an app would use it: any model name, streaming."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    cache = Path(os.environ.get("GGUFRUN_CACHE", Path.home() / ".cache" / "ggufrun")) / "npm-openai"
    if not (cache / "node_modules" / "openai").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache), "openai@5"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        if r.returncode != 0:
            pytest.skip(f"npm could not install the openai package: {r.stderr[-300:]}")
    script = cache / "client.mjs"
    script.write_text(JS_CLIENT)
    r = subprocess.run(["node", str(script), server.url + "/v1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
