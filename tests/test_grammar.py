"""Constrained decoding (ggufrun.grammar): response_format checks, the mask on real vocabularies, composition with
the sampler chain, and JSON Schema output that always parses and validates, driven by SmolLM2 and Gemma3."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from ggufrun.errors import GrammarError
from ggufrun.grammar import Constraint, compile_constraint, engine_tokenizer, grammar_of
from ggufrun.reader import GGUFFile
from ggufrun.sampling import Sampler, SamplingParams
from ggufrun.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def smol_tok(smollm2_path):
    return load_tokenizer(GGUFFile(smollm2_path).metadata)


@pytest.fixture(scope="module")
def gemma_tok(gemma3_path):
    return load_tokenizer(GGUFFile(gemma3_path).metadata)


def run_random(constraint: Constraint, tok, params: SamplingParams, seed: int, max_tokens: int = 200) -> list[int]:
    """Sample with random logits under the constraint until an end-of-generation token or is_done."""
    rng = np.random.default_rng(seed)
    sampler = Sampler(params, tok.n_vocab)
    out: list[int] = []
    for _ in range(max_tokens):
        logits = rng.normal(0, 3, tok.n_vocab).astype(np.float32)
        token, _ = sampler.sample(logits, out, constraint=constraint)
        if token in tok.eog_ids:
            assert constraint.is_accepting
            return out
        constraint.advance(token)
        out.append(token)
        if constraint.is_done:
            return out
    raise AssertionError(f"no end after {max_tokens} tokens: {tok.detokenize(out)!r}")


# ---- response_format ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, field",
    [
        ("json", "response_format"), ({"type": "xml"}, "response_format.type"), ({}, "no 'type'"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema is missing"),
        ({"type": "json_schema", "json_schema": {"schema": True}}, "json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}, "json_schema.name"),
        ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "json_schema.strict"),
        ({"type": "json_object", "schema": [1]}, "response_format.schema"),
        ({"type": "grammar", "grammar": ""}, "response_format.grammar"),
        ({"type": "grammar"}, "response_format.grammar"),
        ({"type": "regex", "regex": 5}, "response_format.regex"),
    ],
)  # fmt: skip
def test_bad_response_format_names_the_field(value, field):
    with pytest.raises(GrammarError, match=re.escape(field)):
        grammar_of(value)


def test_text_and_none_need_no_constraint(smol_tok):
    assert compile_constraint(None, smol_tok) is None
    assert compile_constraint({"type": "text"}, smol_tok) is None


@pytest.mark.parametrize(
    "value, what",
    [
        ({"type": "regex", "regex": "[a-"}, "regex"),
        ({"type": "grammar", "grammar": "root ::= foo"}, "grammar"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}}, "json_schema"),
    ],
)
def test_grammars_that_do_not_compile_raise(smol_tok, value, what):
    with pytest.raises(GrammarError, match=f"response_format[ .]{what}"):
        compile_constraint(value, smol_tok)


def test_engine_tokenizer_is_cached_and_marks_control_tokens(smol_tok):
    engine = engine_tokenizer(smol_tok)
    assert engine is engine_tokenizer(smol_tok)
    assert engine.vocab_size == smol_tok.n_vocab
    im_end = smol_tok.token_id("<|im_end|>")
    assert engine.is_special_token(im_end) and not engine.is_special_token(smol_tok.tokenize("Hello")[0])
    assert set(engine.eos_tokens) == set(smol_tok.eog_ids)


# ---- the mask ---------------------------------------------------------------------------------------------------


def test_apply_masks_in_place_and_eog_only_when_accepting(smol_tok):
    c = compile_constraint({"type": "regex", "regex": "(yes|no)!?"}, smol_tok)
    n = smol_tok.n_vocab
    logits = np.zeros(n + 7, np.float32)  # an output matrix padded past the vocabulary
    c.apply(logits)
    allowed = np.flatnonzero(logits == 0)
    texts = {smol_tok.token_to_bytes(int(i)) for i in allowed}
    assert texts and all(b"yes".startswith(t) or b"no".startswith(t) or t in (b"yes!", b"no!") for t in texts)
    assert np.all(np.isneginf(logits[n:]))
    assert not any(i in smol_tok.eog_ids for i in allowed)  # nothing matched yet
    for t in smol_tok.tokenize("yes", add_special=False):
        c.advance(t)
    assert c.is_accepting and not c.is_done  # "!" may still come
    logits[:] = 0
    c.apply(logits)
    eog_allowed = {i for i in smol_tok.eog_ids if logits[i] == 0}
    assert eog_allowed == set(smol_tok.eog_ids)
    c.advance(smol_tok.tokenize("!", add_special=False)[0])
    assert c.is_done
    with pytest.raises(GrammarError, match="not allowed"):
        c.advance(smol_tok.tokenize("x", add_special=False)[0])


def test_reset_starts_over(smol_tok):
    c = compile_constraint({"type": "regex", "regex": "ab"}, smol_tok)
    for t in smol_tok.tokenize("ab", add_special=False):
        c.advance(t)
    assert c.is_accepting
    c.reset()
    assert not c.is_accepting
    with pytest.raises(GrammarError, match="token 99999999"):
        c.advance(99999999)


@pytest.mark.parametrize("tok_name", ["smol_tok", "gemma_tok"])
@pytest.mark.parametrize(
    "response_format, check",
    [
        ({"type": "regex", "regex": r"[0-9]{3}-[0-9]{4}"}, lambda s: re.fullmatch(r"[0-9]{3}-[0-9]{4}", s)),
        ({"type": "regex", "regex": r"(red|green|blue) (cat|dog)s?"},
         lambda s: re.fullmatch(r"(red|green|blue) (cat|dog)s?", s)),
        ({"type": "grammar", "grammar": 'root ::= "(" num ("," num)* ")"\nnum ::= [1-9] [0-9]?'},
         lambda s: re.fullmatch(r"\([1-9][0-9]?(,[1-9][0-9]?)*\)", s)),
        ({"type": "grammar", "grammar": 'root ::= answer\nanswer ::= "yes" | "no" | "maybe"'},
         lambda s: s in ("yes", "no", "maybe")),
        ({"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": -3, "maximum": 3},
                                             "b": {"type": "boolean"}}, "required": ["n", "b"],
            "additionalProperties": False}}},
         lambda s: jsonschema.validate(json.loads(s), {
             "type": "object", "properties": {"n": {"type": "integer", "minimum": -3, "maximum": 3},
                                              "b": {"type": "boolean"}}, "required": ["n", "b"],
             "additionalProperties": False}) is None),
    ],
)  # fmt: skip
def test_random_logits_always_match(request, tok_name, response_format, check):
    """Random logits stand for any model: whatever is sampled under the mask matches, on both vocabularies."""
    tok = request.getfixturevalue(tok_name)
    c = compile_constraint(response_format, tok)
    for seed in range(3):
        c.reset()
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        text = tok.detokenize(run_random(c, tok, params, seed))
        assert check(text), text


def test_mask_comes_before_the_filters(smol_tok):
    """Bias, top-k and greedy all see only allowed tokens: a forbidden token with +100 bias is never drawn, and
    top_k=1 keeps the best *allowed* token, not the best overall."""
    tok = smol_tok
    digits = [tok.tokenize(str(d), add_special=False)[0] for d in range(10)]
    letter = tok.tokenize("a", add_special=False)[0]
    logits = np.zeros(tok.n_vocab, np.float32)
    logits[letter] = 50.0  # the model's favourite is not allowed
    logits[digits[7]] = 5.0
    logits[digits[3]] = 4.0
    for params in (
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, seed=1),
        SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=1),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=1, logit_bias={letter: 100.0}),
        SamplingParams(temperature=0.5, repetition_penalty=1.5, frequency_penalty=1.0, seed=1),
    ):
        c = compile_constraint({"type": "regex", "regex": "[0-9]"}, tok)
        token, logprob = Sampler(params, tok.n_vocab).sample(logits, [letter], constraint=c)
        assert token == digits[7], params
        ids, probs = Sampler(params, tok.n_vocab).distribution(logits, [letter], constraint=c)
        assert set(ids.tolist()) <= set(digits) and abs(probs.sum() - 1) < 1e-9


def test_sampler_without_constraint_unchanged(smol_tok):
    logits = np.random.default_rng(0).normal(size=smol_tok.n_vocab).astype(np.float32)
    params = SamplingParams(temperature=0.7, seed=3)
    assert Sampler(params, smol_tok.n_vocab).sample(logits) == Sampler(params, smol_tok.n_vocab).sample(
        logits, constraint=None
    )


# ---- >= 20 JSON Schemas on real models ----------------------------------------------------------------------------

NUM = {"type": "number", "minimum": -100, "maximum": 100}


def integer(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


POINT = {"type": "object", "properties": {"x": NUM, "y": NUM}, "required": ["x", "y"], "additionalProperties": False}
NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"first": NAME, "last": NAME}, "required": ["first", "last"]},
        "address": {"type": "object", "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]}}, "required": ["person", "address"]},
    "int_array": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2,
                  "maxItems": 4},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    "bounded_number": {"type": "object", "properties": {"score": {"type": "number", "exclusiveMinimum": 0,
                                                                  "maximum": 10}}, "required": ["score"]},
    "booleans": {"type": "object", "properties": {"done": {"type": "boolean"}, "urgent": {"type": "boolean"}},
                 "required": ["done", "urgent"], "additionalProperties": False},
    "optional": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                                  "note": {"type": "string", "maxLength": 10}},
                 "required": ["id"], "additionalProperties": False},
    "ref": {"type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
            "required": ["start", "end"], "$defs": {"point": POINT}},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [integer(0, 99), NAME]}},
               "required": ["value"]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
                "required": ["code"]},
    "array_of_objects": {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "minItems": 1,
        "items": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[a-z]{2,4}$"},
                                                   "qty": {"type": "integer", "minimum": 1, "maximum": 5}},
                  "required": ["sku", "qty"], "additionalProperties": False}}}, "required": ["items"]},
    "const": {"type": "object", "properties": {"version": {"const": 2}, "ok": {"type": "boolean"}},
              "required": ["version", "ok"]},
    "nullable": {"type": "object", "properties": {"nickname": {"type": ["string", "null"], "maxLength": 8}},
                 "required": ["nickname"]},
    "matrix": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                                                       "items": integer(0, 9)}},
    "tagged_union": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"},
                                          "r": {"type": "number", "minimum": 0, "maximum": 9}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": integer(1, 9)},
         "required": ["kind", "side"], "additionalProperties": False}]},
    "date": {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"]},
    "string_array": {"type": "array", "items": {"enum": ["apple", "pear", "plum"]}, "minItems": 1, "maxItems": 3},
    "lengths": {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 6,
                                                          "pattern": "^[a-z]+$"}}, "required": ["word"]},
    "negative": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": -1},
                                                  "b": {"type": "integer", "minimum": -5, "maximum": -1}},
                 "required": ["a", "b"], "additionalProperties": False},
    "fraction": {"type": "object", "properties": {"p": {"type": "number", "minimum": 0.5, "maximum": 1.5}},
                 "required": ["p"]},
    "defs_chain": {"$ref": "#/$defs/order", "$defs": {
        "order": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                                   "lines": {"type": "array", "items": {"$ref": "#/$defs/line"},
                                                             "minItems": 1, "maxItems": 2}},
                  "required": ["id", "lines"], "additionalProperties": False},
        "line": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
                 "required": ["n"], "additionalProperties": False}}},
}  # fmt: skip


def closed(schema):
    """OpenAI's strict mode: every object lists its properties and allows no others (a small model otherwise
    invents keys with endless strings)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


SCHEMAS = {name: closed(schema) for name, schema in SCHEMAS.items()}
GEMMA_SCHEMAS = ["person", "ref", "array_of_objects"]
SAMPLED_SCHEMAS = ["nested", "int_array", "any_of", "pattern", "array_of_objects", "tagged_union", "date"]
MAX_TOKENS = 160


class Driver:
    """A model and a prompt; each run decodes under a constraint through the generation loop (generate.stream),
    which reuses the prompt's cached K/V."""

    def __init__(self, path, prompt: str):
        import ggufrun

        self.model = ggufrun.load(path, n_ctx=512, n_threads=1)
        self.ids = self.model.tokenize(prompt, add_special=True, parse_special=True)

    def run(self, constraint: Constraint, params: SamplingParams, max_tokens: int = MAX_TOKENS) -> str:
        from ggufrun.generate import stream

        m = self.model
        chunks = list(stream(self.ids, m.transformer, m.cache, m.tokenizer, params, max_tokens, constraint=constraint))
        text = "".join(c.text for c in chunks)
        if chunks[-1].finish_reason == "length":
            raise AssertionError(f"no end after {max_tokens} tokens: {text!r}")
        if chunks[-1].token in m.tokenizer.eog_ids:
            assert constraint.is_accepting
        return text


@pytest.fixture(scope="module")
def smol(smollm2_path):
    prompt = (
        "<|im_start|>system\nYou reply with one JSON value.<|im_end|>\n"
        "<|im_start|>user\nGive me an example.<|im_end|>\n<|im_start|>assistant\n"
    )
    return Driver(smollm2_path, prompt)


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    prompt = "<start_of_turn>user\nReply with one JSON value: an example.<end_of_turn>\n<start_of_turn>model\n"
    return Driver(gemma3_path, prompt)


def check_json(text: str, schema: dict) -> None:
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())


def test_at_least_twenty_schemas():
    assert len(SCHEMAS) >= 20


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_greedy_smollm2(smol, name):
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
    text = smol.run(compile_constraint(rf, smol.model.tokenizer), SamplingParams(temperature=0.0))
    check_json(text, SCHEMAS[name])


@pytest.mark.real
@pytest.mark.parametrize("name", SAMPLED_SCHEMAS)
def test_json_schema_sampled_smollm2(smol, name):
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}
    c = compile_constraint(rf, smol.model.tokenizer)
    for seed in (1,):
        c.reset()
        text = smol.run(c, SamplingParams(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, seed=seed))
        check_json(text, SCHEMAS[name])


@pytest.mark.real
def test_json_object_smollm2(smol):
    """Any object: plain greedy SmolLM2 repeats a key forever (valid JSON that never ends); the repetition penalty
    composes with the mask and ends it."""
    params = SamplingParams(temperature=0, repetition_penalty=1.3)
    text = smol.run(compile_constraint({"type": "json_object"}, smol.model.tokenizer), params)
    assert isinstance(json.loads(text), dict)


@pytest.mark.real
@pytest.mark.parametrize("name", GEMMA_SCHEMAS)
def test_json_schema_gemma3(gemma, name):
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}
    c = compile_constraint(rf, gemma.model.tokenizer)
    check_json(gemma.run(c, SamplingParams(temperature=0.0)), SCHEMAS[name])
    c.reset()
    check_json(gemma.run(c, SamplingParams(temperature=0.8, seed=4)), SCHEMAS[name])
