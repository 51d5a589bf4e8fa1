"""Chat templates: SmolLM2's own template, the Gemma/ChatML fallbacks as llama.cpp's src/llama-chat.cpp writes
them, the Hugging Face environment features, and hostile templates that must fail fast and touch nothing."""

from __future__ import annotations

import copy
import time

import pytest

from ggufrun.chat_template import CHATML, GEMMA, ChatTemplate, ChatTemplateError, chat_template_from_metadata
from ggufrun.reader import GGUFFile
from ggufrun.tokenizer import load_tokenizer

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Name a color."},
]


@pytest.fixture(scope="module")
def smollm2_md(smollm2_path):
    with GGUFFile(smollm2_path) as f:
        return f.metadata


@pytest.fixture(scope="module")
def gemma3_md(gemma3_path):
    with GGUFFile(gemma3_path) as f:
        return f.metadata


# ---- the model's own template -------------------------------------------------------------------------------------
@pytest.mark.real
def test_smollm2_template_renders_chatml(smollm2_md):
    t = chat_template_from_metadata(smollm2_md)
    assert t.name == "tokenizer.chat_template"
    assert t.render(CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nName a color.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # no system message: the template's own default system prompt comes first
    assert t.render(CHAT[1:2], add_generation_prompt=False) == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    )


@pytest.mark.real
def test_rendered_chat_tokenizes_with_single_special_tokens(smollm2_md):
    tok = load_tokenizer(smollm2_md)
    text = chat_template_from_metadata(smollm2_md).render(CHAT)
    ids = tok.tokenize(text)
    im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    assert ids.count(im_start) == 5 and ids.count(im_end) == 4
    tail = tok.tokenize("assistant\n", add_special=False)
    assert ids[0] == im_start and ids[-1 - len(tail) :] == [im_start, *tail]
    assert tok.detokenize(ids) == text


@pytest.mark.real
def test_gemma3_uses_the_gemma_fallback(gemma3_md):
    assert "tokenizer.chat_template" not in gemma3_md
    t = chat_template_from_metadata(gemma3_md)
    assert t.source == GEMMA and (t.bos_token, t.eos_token) == ("<bos>", "<eos>")
    # llama.cpp (LLM_CHAT_TEMPLATE_GEMMA): system folded into the next user turn, "assistant" -> "model",
    # contents trimmed, no BOS in the text
    assert t.render(CHAT) == (
        "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nName a color.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    tok = load_tokenizer(gemma3_md)
    ids = tok.tokenize(t.render(CHAT))
    assert ids[:2] == [tok.bos_id, tok.token_id("<start_of_turn>")] and ids.count(tok.token_id("<end_of_turn>")) == 3


def test_fallbacks_match_llama_cpp_formats():
    msgs = [
        {"role": "system", "content": "  sys \n"},
        {"role": "user", "content": "\tq1 "},
        {"role": "assistant", "content": "a1"},
    ]
    assert ChatTemplate(GEMMA).render(msgs, add_generation_prompt=False) == (
        "<start_of_turn>user\nsys\n\nq1<end_of_turn>\n<start_of_turn>model\na1<end_of_turn>\n"
    )
    # a system message right before a model turn waits for the next user turn
    assert ChatTemplate(GEMMA).render([{"role": "system", "content": "S"}, *msgs[2:], msgs[1]]) == (
        "<start_of_turn>model\na1<end_of_turn>\n<start_of_turn>user\nS\n\nq1<end_of_turn>\n<start_of_turn>model\n"
    )
    # ChatML keeps contents as they are
    assert ChatTemplate(CHATML).render(msgs) == (
        "<|im_start|>system\n  sys \n<|im_end|>\n<|im_start|>user\n\tq1 <|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>assistant\n"
    )


def test_lookup_override_and_fallback_choice():
    md = {"general.architecture": "qwen2", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"]}
    assert chat_template_from_metadata(md).source == CHATML
    assert chat_template_from_metadata({**md, "general.architecture": "gemma2"}).source == GEMMA
    assert chat_template_from_metadata({**md, "tokenizer.ggml.model": "none"}) is None
    assert chat_template_from_metadata(md, override="gemma").source == GEMMA
    user = chat_template_from_metadata(md, override="{{ bos_token }}{{ messages[0]['content'] }}")
    assert user.name == "override" and user.render([{"role": "user", "content": "x"}]) == "x"
    md["tokenizer.ggml.bos_token_id"] = 1
    assert chat_template_from_metadata(md, override="{{ bos_token }}").render([]) == "b"
    named = {**md, "tokenizer.chat_template.tool_use": "{{ 'tools' }}", "tokenizer.chat_templates": ["tool_use"]}
    assert chat_template_from_metadata(named, name="tool_use").render([]) == "tools"
    with pytest.raises(ChatTemplateError, match="tool_use"):
        chat_template_from_metadata(named, name="rag")


def test_broken_template_fails_at_render_not_load():
    md = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.chat_template": "{% for %}"}
    t = chat_template_from_metadata(md)  # no error yet
    with pytest.raises(ChatTemplateError, match="syntax error at line 1"):
        t.render([{"role": "user", "content": "hi"}])


# ---- the Hugging Face environment -----------------------------------------------------------------------------------
def test_environment_features():
    msgs = [{"role": "user", "content": "<b>&"}]
    render = lambda src, **kw: ChatTemplate(src).render(msgs, **kw)  # noqa: E731
    assert render("{{ messages | tojson }}") == '[{"role": "user", "content": "<b>&"}]'  # no HTML escaping
    assert render("{{ {'b': 1, 'a': [1]} | tojson(indent=2) }}") == '{\n  "b": 1,\n  "a": [\n    1\n  ]\n}'
    assert render("{% generation %}{{ messages[0].content }}{% endgeneration %}") == "<b>&"
    assert render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "012"
    assert render("{{ strftime_now('%Y') }}") == time.strftime("%Y")
    assert render("{% if tools %}T{% endif %}{{ tools | length if tools else 0 }}", tools=[{"name": "f"}]) == "T1"
    assert render("{{ enable_thinking }}", enable_thinking=False) == "False"
    # trim_blocks + lstrip_blocks: block tags leave no newline or indentation behind
    assert render("  {% if true %}\nx\n  {% endif %}\ny") == "x\ny"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")


# ---- hostile templates ------------------------------------------------------------------------------------------
HOSTILE = {
    "__class__": "{{ ''.__class__ }}",
    "__subclasses__": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "__globals__": "{{ cycler.__init__.__globals__ }}",
    "list.append": "{% set _ = messages.append({'role': 'x'}) %}",
    "dict.update": "{% set _ = messages[0].update({'content': 'x'}) %}",
    "dict.pop": "{{ messages[0].pop('content') }}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "str * n": "{{ 'x' * 1000000000 }}",
    "list * n": "{{ ([1] * 1000000000) | length }}",
    "big power": "{{ 10 ** 1000000000 }}",
    "doubling ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "center": "{{ 'x' | center(1000000000) }}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
    "% width": "{{ '%1000000000s' % 'x' }}",
    "format width": "{{ '{:>1000000000}'.format('x') }}",
    "replace": "{% set s = 'a' * 100000 %}{{ s | replace('a', s) }}",
    "join": "{% set s = 'a' * 1000000 %}{{ ([s] * 100000) | join }}",
    "block capture": "{% set s = 'a' * 1000000 %}{% set x %}{% for i in range(100000) %}{{ s }}{% endfor %}"
    "{% endset %}",
    "indent": "{% set s = '\\n' * 100000 %}{{ s | indent(100000, true, true) }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "include": "{% include '/etc/passwd' %}",
    "lipsum": "{{ lipsum(1000000000) }}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_fails_fast_and_touches_nothing(name):
    messages = [{"role": "user", "content": "hi", "meta": {"tags": ["a"]}}]
    before = copy.deepcopy(messages)
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError):
        ChatTemplate(HOSTILE[name], timeout_s=0.5).render(messages)
    assert time.perf_counter() - t0 < 3.0
    assert messages == before


def test_inputs_must_be_plain_data():
    with pytest.raises(ChatTemplateError, match="messages"):
        ChatTemplate(CHATML).render([{"role": "user", "content": object()}])
