"""Constrained decoding: a `response_format` -> a per-generation Constraint that masks the logits to the tokens a
grammar allows, so the output always matches a JSON Schema, a GBNF grammar or a regex.

Accepted `response_format` values (OpenAI's chat-completions field, plus llama-server's extensions):

    {"type": "text"}                                   no constraint (compile_constraint returns None)
    {"type": "json_object"}                            any JSON object; {"schema": {...}} narrows it (llama-server)
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}
    {"type": "grammar", "grammar": "root ::= ..."}     a llama.cpp GBNF grammar (grammars/README.md), or Lark
    {"type": "regex", "regex": "[0-9]{3}-[0-9]{4}"}    the whole output matches the regex

Anything else raises GrammarError (a ValueError) naming the field and the value.

The engine is llguidance (github.com/guidance-ai/llguidance), the one llama.cpp itself links for
`%llguidance` grammars (common/llguidance.cpp). Measured here before choosing (2 shared cores, one JSON schema
with $ref, an enum array, integer bounds and a string pattern):

    engine         install          compile, 49k | 262k vocab     GBNF  regex  JSON Schema
    llguidance     7.6 MB, no deps  ~1 ms | ~1 ms (lazy lexer)    yes   yes    $ref, anyOf, patterns, bounds
    outlines-core  2.3 MB, no deps  0.11 s | 1.2 s (full index)   no    yes    $ref, anyOf, patterns; no bounds
    xgrammar       needs torch, transformers and triton (GBs): rejected on install size alone

benchmarks/grammar.py (one thread, shared cores), a 48-token generation under a JSON Schema:

    model          n_vocab  vocabulary view (once)  compile  decode ms/token plain -> masked  mask alone  overhead
    SmolLM2-135M   49152    0.66 s                  1.7 ms   37.9 -> 38.2                     0.10 ms     +0.8%
    Gemma3-270M    262144   3.69 s                  1.8 ms   79.8 -> 81.0                     0.32 ms     +1.5%

outlines-core compiles every schema into a regular expression and indexes it against the whole vocabulary (a
second per schema at Gemma's 262k tokens) and cannot express GBNF; llguidance runs an Earley parser over a lazily
built lexer, so a schema compiles in about a millisecond and the per-token mask is well under a millisecond.

The engine works from our vocabulary (no HF tokenizer files): every token's bytes as ggufrun's Tokenizer renders
them (byte-level BPE decoded, SentencePiece '▁' -> ' ', <0xNN> -> the byte), control tokens prefixed with b"\\xff"
(llguidance's mark for special tokens, as llama.cpp's llguidance integration does) so no text can spell them, and
the end-of-generation ids as its EOS set. It is built once per Tokenizer (0.7 s for 49k tokens, 3.7 s for 262k)
and cached.

Known limit (of llguidance's JSON grammar, and why tests bound their numbers): a JSON number's digits are not
capped (llama.cpp's json-schema-to-grammar caps them at 16), so a greedy small model can loop on "10.0000..." until
max_tokens; a free-form object (json_object, or no `additionalProperties: false`) can likewise repeat keys.

Use, one generation (the sampler applies the mask after logit_bias, penalties and logits_processors and before
top-k/top-p/min-p/temperature, so the filters only see allowed tokens and greedy takes the best allowed token):

>>> constraint = compile_constraint({"type": "json_object"}, model.tokenizer)
>>> while not constraint.is_done:
...     token, logprob = sampler.sample(logits, history, constraint=constraint)
...     if token in model.tokenizer.eog_ids:
...         break                            # only offered once the grammar accepts
...     constraint.advance(token)
...     logits = model.transformer.forward([token])

`is_done` is true once nothing but an end-of-generation token may follow (e.g. after the closing brace of a JSON
object); the loop may stop there without sampling the end token. Checked by tests/test_grammar.py: >= 20 schemas on
SmolLM2 (greedy and sampled) and Gemma3, every output parsed and validated with the jsonschema package.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping

import llguidance
import numpy as np

from .errors import GrammarError
from .tokenizer import Tokenizer

# Whitespace allowed between JSON tokens: llama.cpp's json-schema-to-grammar SPACE_RULE
# (`| " " | "\n"{1,2} [ \t]{0,20}`). Unbounded whitespace lets a small model loop on newlines forever.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"
JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "grammar", "regex")


# ---- the engine's view of our vocabulary ---------------------------------------------------------------------


class _VocabularyView(llguidance.TokenizerWrapper):
    """What llguidance.LLTokenizer reads from a tokenizer: token bytes, special ids, and a tokenize function."""

    def __init__(self, tokenizer: Tokenizer):  # not super().__init__: that one probes an HF tokenizer
        n = tokenizer.n_vocab
        tokens: list[bytes] = []
        special: list[int] = []
        piece = tokenizer.token_piece
        for i in range(n):
            full = piece(i, special=True)
            if full and not piece(i, special=False):  # control/unknown: rendered only when special tokens are
                full = b"\xff" + full  # cannot be produced by text, only named as a special token
                special.append(i)
            tokens.append(full)
        eog = sorted(tokenizer.eog_ids)
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else (eog[0] if eog else None)
        self.bos_token_id = tokenizer.bos_id
        self.tokens = tokens
        self.special_token_ids = special
        self.is_tokenizer_wrapper = True
        self._tokenizer = tokenizer

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.tokenize(text, add_special=False, parse_special=False)


_ENGINE_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENGINE_LOCK = threading.Lock()


def engine_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The llguidance tokenizer for `tokenizer`, built on first use and cached for as long as it lives."""
    if not isinstance(tokenizer, Tokenizer):
        raise GrammarError(f"tokenizer must be a ggufrun Tokenizer, got {type(tokenizer).__name__}")
    with _ENGINE_LOCK:
        found = _ENGINE_TOKENIZERS.get(tokenizer)
        if found is None:
            if tokenizer.model == "none" or tokenizer.n_vocab == 0:
                raise GrammarError("constrained decoding needs a vocabulary; this model has none (tokenizer 'none')")
            eog = sorted(tokenizer.eog_ids)
            if not eog:
                raise GrammarError("constrained decoding needs an end-of-generation token; the vocabulary has none")
            view = _VocabularyView(tokenizer)
            found = llguidance.LLTokenizer(view, n_vocab=tokenizer.n_vocab, eos_token=eog)
            _ENGINE_TOKENIZERS[tokenizer] = found
        return found


# ---- response_format -> engine grammar -----------------------------------------------------------------------


def _json_schema_grammar(schema, where: str) -> str:
    if isinstance(schema, bool) or not isinstance(schema, Mapping):
        raise GrammarError(f"{where} must be a JSON Schema object, got {schema!r}")
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise GrammarError(f"{where} is not JSON-serialisable: {e}") from None
    return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)


def grammar_of(response_format) -> str | None:
    """The llguidance grammar for a `response_format` value (see the module docstring), or None for plain text.

    GrammarError names the field that is wrong. The grammar is only parsed, not yet checked against a vocabulary:
    compile_constraint does that.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise GrammarError(f"response_format must be an object with a 'type', got {response_format!r}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})
        return _json_schema_grammar(schema, "response_format.schema")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise GrammarError(
                f"response_format.json_schema must be an object {{'name', 'schema', 'strict'}}, got {spec!r}"
            )
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise GrammarError(f"response_format.json_schema.name must be a string, got {name!r}")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise GrammarError(f"response_format.json_schema.strict must be true or false, got {strict!r}")
        if "schema" not in spec:
            raise GrammarError("response_format.json_schema.schema is missing (the JSON Schema to follow)")
        return _json_schema_grammar(spec["schema"], "response_format.json_schema.schema")
    if kind == "grammar":
        text = response_format.get("grammar")
        if not isinstance(text, str) or not text.strip():
            raise GrammarError(f"response_format.grammar must be a non-empty GBNF grammar string, got {text!r}")
        try:
            return llguidance.grammar_from("gbnf", text)
        except ValueError as e:
            raise GrammarError(f"response_format.grammar: {e}") from None
    if kind == "regex":
        text = response_format.get("regex")
        if not isinstance(text, str) or not text:
            raise GrammarError(f"response_format.regex must be a non-empty regular expression, got {text!r}")
        return llguidance.LLMatcher.grammar_from_regex(text)
    raise GrammarError(
        f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}"
        if "type" in response_format
        else f"response_format has no 'type' (one of {', '.join(RESPONSE_FORMAT_TYPES)}): {dict(response_format)!r}"
    )


def compile_constraint(response_format, tokenizer: Tokenizer) -> Constraint | None:
    """A fresh Constraint for one generation that follows `response_format`; None when it asks for plain text.

    >>> c = compile_constraint({"type": "regex", "regex": "(yes|no)"}, model.tokenizer)
    """
    grammar = grammar_of(response_format)
    if grammar is None:
        return None
    kind = response_format.get("type")
    json_digits = kind in ("json_object", "json_schema")
    return Constraint(grammar, tokenizer, what=f"response_format {kind}", json_digits=json_digits)


# A JSON number's digits run at most this long: llama.cpp's json-schema-to-grammar writes the integral part as
# [1-9][0-9]{0,15} and the fraction as [0-9]{1,16}. The engine's JSON grammar sets no such bound, and a small
# model under greedy decoding was seen to write "10.000000..." until max_tokens.
MAX_JSON_DIGITS = 16
_LEADING_DIGITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _leading_digits(tokenizer: Tokenizer) -> np.ndarray:
    """int32 [n_vocab]: how many ASCII digits each token's text starts with (0 for control tokens)."""
    with _ENGINE_LOCK:
        found = _LEADING_DIGITS.get(tokenizer)
        if found is None:
            found = np.zeros(tokenizer.n_vocab, dtype=np.int32)
            for i in range(tokenizer.n_vocab):
                piece = tokenizer.token_piece(i, special=False)
                n = len(piece) - len(piece.lstrip(b"0123456789"))
                found[i] = n
            _LEADING_DIGITS[tokenizer] = found
        return found


# ---- per-generation state ------------------------------------------------------------------------------------


class Constraint:
    """One generation's grammar state: which tokens may come next.

    apply(logits) sets every disallowed id to -inf in place (float32 [n_vocab]; ids past the vocabulary too);
    end-of-generation ids stay allowed only where the grammar accepts. advance(token) moves past a sampled token.
    is_done: nothing but an end-of-generation token may follow. is_accepting: the text so far is complete.
    """

    def __init__(self, grammar: str, tokenizer: Tokenizer, what: str = "grammar", json_digits: bool = False):
        self.tokenizer = tokenizer
        engine = engine_tokenizer(tokenizer)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, engine)
        if is_error:
            raise GrammarError(f"{what} does not compile: {messages[0].strip()}")
        self._matcher = llguidance.LLMatcher(engine, grammar, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"{what} does not compile: {self._matcher.get_error()}")
        self.what = what
        self.n_vocab = tokenizer.n_vocab
        self._bitmask = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)  # [n_vocab / 32] one bit per token
        # JSON output: digit runs outside strings are capped at MAX_JSON_DIGITS (see there)
        self._lead = _leading_digits(tokenizer) if json_digits else None
        self._digits = 0  # length of the digit run the output ends with, outside strings
        self._in_string = self._escape = False

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens that may come next."""
        self._check()
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        return np.unpackbits(self._bitmask.view(np.uint8), count=self.n_vocab, bitorder="little").view(bool)

    def apply(self, logits: np.ndarray) -> None:
        """Set the logits of every token the grammar does not allow next to -inf, in place."""
        if logits.ndim != 1 or logits.shape[0] < self.n_vocab:
            raise ValueError(f"logits must be 1-D with at least {self.n_vocab} entries (n_vocab), got {logits.shape}")
        allowed = self.allowed()
        if self._digits and self._lead is not None:
            capped = allowed & (self._lead <= MAX_JSON_DIGITS - self._digits)
            if capped.any():  # never leave nothing allowed: a schema may need a longer number (a huge minimum)
                allowed = capped
        np.putmask(logits[: self.n_vocab], ~allowed, -np.inf)
        logits[self.n_vocab :] = -np.inf  # padding rows of the output matrix are no tokens

    def advance(self, token: int) -> None:
        """Move past `token` (the one just sampled). GrammarError if the grammar does not allow it."""
        self._check()
        token = int(token)
        if not 0 <= token < self.n_vocab or not self._matcher.consume_token(token):
            raise GrammarError(
                f"token {token} is not allowed by the {self.what} here: {self._matcher.get_error() or 'out of range'}"
            )
        if self._lead is not None:
            self._track_json(self.tokenizer.token_piece(token, special=False))

    def _track_json(self, piece: bytes) -> None:
        """Follow string quoting and the trailing digit run of JSON output through one token's bytes."""
        for b in piece:
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif b == 0x5C:  # backslash
                    self._escape = True
                elif b == 0x22:  # closing quote
                    self._in_string = False
            elif b == 0x22:
                self._in_string, self._digits = True, 0
            elif 0x30 <= b <= 0x39:
                self._digits += 1
            else:
                self._digits = 0

    @property
    def is_done(self) -> bool:
        """Nothing but an end-of-generation token may follow."""
        return self._matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The output so far is a complete match (an end-of-generation token would be allowed)."""
        return self._matcher.is_accepting()

    def reset(self) -> None:
        """Back to the start, for another generation with the same constraint."""
        self._matcher.reset()
        self._digits = 0
        self._in_string = self._escape = False

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarError(f"{self.what}: {self._matcher.get_error()}")

    def __repr__(self) -> str:
        return f"Constraint({self.what}, n_vocab={self.n_vocab}, accepting={self.is_accepting})"
