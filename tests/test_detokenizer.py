"""Streaming detokenizer: one token at a time must give exactly Tokenizer.detokenize of the whole sequence,
never a partial character, for real tokenizations of emoji/CJK text (byte-level BPE pieces and Gemma's
<0xNN> byte-fallback tokens) and for the clean-up of spaces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggufrun.reader import GGUFFile
from ggufrun.tokenizer import StreamingDetokenizer, load_tokenizer
from ggufrun.tokenizer.bpe import BYTE_TO_CHAR

TEXTS = [
    "🙂🚀✨ emoji run 👨‍👩‍👧‍👦 🇫🇷 👍🏽",
    "LLM 推理分两个截然不同的阶段。理解这两个阶段是理解所有推理优化的基础。",
    "日本語のテキスト、한국어 문장, e\u0301 a\u0308, हिन्दी, ไทย",
    "rare: \U0001d49c\U0001d4b7 \U00020bb7 \ue000 \u0cf3 \U0001fae8",
    "   spaces\tand\ttabs\n\nnewlines  <|im_end|> <end_of_turn>",
]


@pytest.fixture(scope="module")
def tokenizers(smollm2_path, gemma3_path):
    out = {}
    for name, path in (("smollm2", smollm2_path), ("gemma3", gemma3_path)):
        with GGUFFile(path) as f:
            out[name] = load_tokenizer(f.metadata)
    return out


def _stream(tok, ids, skip_special=False):
    d = StreamingDetokenizer(tok, skip_special=skip_special)
    pieces = [d.add_token(i) for i in ids]
    pieces.append(d.finalize())
    assert d.text == "".join(pieces)
    return pieces


@pytest.mark.real
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@pytest.mark.parametrize("skip_special", [False, True])
def test_stream_equals_detokenize(tokenizers, name, skip_special):
    tok = tokenizers[name]
    for text in TEXTS:
        ids = tok.tokenize(text)  # with BOS and parsed special tokens
        pieces = _stream(tok, ids, skip_special)
        assert "".join(pieces) == tok.detokenize(ids, skip_special=skip_special), text
        # valid text in, so no piece may hold U+FFFD: nothing was ever cut inside a character
        assert all("\ufffd" not in p for p in pieces), pieces


@pytest.mark.real
def test_characters_held_until_complete(tokenizers):
    # Gemma has no token for these, so each goes out as 4 <0xNN> byte-fallback tokens
    gemma = tokenizers["gemma3"]
    ids = gemma.tokenize("\U00020bb7\U0001fae8", add_special=False)
    assert [gemma.token_text(i) for i in ids[:4]] == ["<0xF0>", "<0xA0>", "<0xAE>", "<0xB7>"]
    assert _stream(gemma, ids) == ["", "", "", "\U00020bb7", "", "", "", "\U0001fae8", ""]
    # byte-level BPE: the emoji's four bytes come in pieces smaller than the character
    smol = tokenizers["smollm2"]
    ids = smol.tokenize("🙂", add_special=False)
    assert len(ids) > 1
    pieces = _stream(smol, ids)
    assert pieces[-2] == "🙂" and all(p == "" for p in pieces[:-2] + pieces[-1:])


@pytest.mark.real
def test_incomplete_character_flushed_as_replacement(tokenizers):
    gemma = tokenizers["gemma3"]
    ids = [gemma.token_id("<0xF0>"), gemma.token_id("<0x9F>"), gemma.token_id("Hi")]
    pieces = _stream(gemma, ids)
    assert "".join(pieces) == gemma.detokenize(ids) == "\ufffdHi"
    ids = ids[:2]
    assert _stream(gemma, ids) == ["", "", "\ufffd"]


@pytest.mark.real
def test_reset_and_last_segment(tokenizers):
    tok = tokenizers["smollm2"]
    d = StreamingDetokenizer(tok)
    for i in tok.tokenize("Hello world"):
        d.add_token(i)
    assert d.last_segment == "Hello world" and d.last_segment == ""
    d.reset()
    assert d.text == ""
    for i in tok.tokenize("again"):
        d.add_token(i)
    assert d.finalize() == "" and d.text == "again"


@pytest.mark.real
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_ids_stream(tokenizers, data):
    # any id sequence, special and byte tokens included: the stream still equals detokenize
    for tok in tokenizers.values():
        ids = data.draw(st.lists(st.integers(0, tok.n_vocab - 1), max_size=12))
        ids = data.draw(st.sampled_from([ids, [tok.bos_id, *ids]]))
        skip = data.draw(st.booleans())
        assert "".join(_stream(tok, ids, skip)) == tok.detokenize(ids, skip_special=skip)


@pytest.fixture(scope="module")
def cleaning_tokenizers(smollm2_path, gemma3_path):
    """SmolLM2's vocabulary under the gpt-2 pre-tokenizer (llama.cpp cleans up spaces there), and Gemma's
    with add_space_prefix (the first piece loses its leading space, as in Llama-2-style SentencePiece)."""
    with GGUFFile(smollm2_path) as f:
        smol = dict(f.metadata)
    with GGUFFile(gemma3_path) as f:
        gemma = dict(f.metadata)
    smol["tokenizer.ggml.pre"] = "gpt-2"
    gemma["tokenizer.ggml.add_space_prefix"] = True
    return load_tokenizer(smol), load_tokenizer(gemma)


@pytest.mark.real
@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from([" ", "'", "s", "m", "re", "ve", "t", ".", ",", "!", "?", "x", "Hello", "é"])))
def test_stream_with_space_cleanup_and_prefix(cleaning_tokenizers, words):
    text = "".join(words)
    for tok in cleaning_tokenizers:
        for ids in (tok.tokenize(text), tok.tokenize(text, add_special=False)):
            for skip in (False, True):
                assert "".join(_stream(tok, ids, skip)) == tok.detokenize(ids, skip_special=skip)


@pytest.mark.real
def test_space_prefix_rule(cleaning_tokenizers):
    _, gemma = cleaning_tokenizers
    ids = gemma.tokenize("Hello", add_special=False)
    assert gemma.token_text(ids[0]) == "\u2581Hello"  # the prefix space SentencePiece adds ...
    assert "".join(_stream(gemma, ids)) == gemma.detokenize(ids) == "Hello"  # ... is removed again


def test_needs_a_vocabulary(golden_dir):
    with GGUFFile(golden_dir / "small-llama-f32.gguf") as f:
        tok = load_tokenizer(f.metadata)
    with pytest.raises(ValueError, match="no vocabulary"):
        StreamingDetokenizer(tok)


def test_amortised_cost():
    """Pending bytes stay bounded while spaces and apostrophes stream through (no quadratic rescans)."""
    tokens = ["<s>", *BYTE_TO_CHAR]
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3] + [1] * 256, dtype=np.int32),
        "tokenizer.ggml.merges": [],
    }
    tok = load_tokenizer(md)
    d = StreamingDetokenizer(tok)
    ids = tok.tokenize("a 'b ' c . " * 2000, add_special=False)
    longest = 0
    for i in ids:
        d.add_token(i)
        longest = max(longest, len(d._pending))
    d.finalize()
    assert longest <= 16 and d.text == tok.detokenize(ids)
