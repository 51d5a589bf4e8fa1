"""Byte-level BPE ("gpt2" vocabularies): llama.cpp's llm_tokenizer_bpe_session, run by HF `tokenizers`.

Each pre-tokenized word (pretokenizer.py) has its UTF-8 bytes mapped to the GPT-2 byte alphabet
(src/unicode.cpp unicode_byte_to_utf8_map), then the lowest-rank adjacent pair of `tokenizer.ggml.merges` is merged
first (leftmost on ties) until no pair has a rank; with ignore_merges a word that is itself a token is taken whole.
HF's BPE model runs exactly that loop. decode_byte_level() is llama.cpp's llama_decode_text for token pieces.
Checked in tests/test_tokenizer.py against a naive merge loop and llama.cpp's token ids (SmolLM2).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from .pretokenizer import PreTokenizer


# ---- GPT-2 byte alphabet (llama.cpp unicode_byte_to_utf8_map) ----------------------------------------------------
def _bytes_to_unicode() -> list[str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = [""] * 256, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()  # index: byte -> str.translate of a latin-1 decoded word
_CHAR_TO_BYTE = {ch: b for b, ch in enumerate(BYTE_TO_CHAR)}


def decode_byte_level(text: str) -> bytes:
    """A byte-level BPE token's text -> its bytes (llama_decode_text, including its odd [UNK_BYTE_..] marker)."""
    try:
        return bytes(_CHAR_TO_BYTE[ch] for ch in text)
    except KeyError:
        out = bytearray()
        for ch in text:
            b = _CHAR_TO_BYTE.get(ch)
            if b is not None:
                out.append(b)
            else:
                out += b"[UNK_BYTE_0x" + ch.encode().hex().encode() + text.encode() + b"]"
        return bytes(out)


class BPEBackend:
    """Byte-level BPE: llama.cpp's llm_tokenizer_bpe_session on each pre-tokenized word, run by HF tokenizers.

    Both merge the lowest-rank adjacent pair first (leftmost on ties) until no pair has a rank; with
    ignore_merges a word that is itself a token is taken whole.
    """

    def __init__(self, vocab: dict[str, int], merges: Sequence[str], pre: PreTokenizer, ignore_merges: bool):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models

        # llama.cpp splits a merge at the first space after position 0; the first rank of a repeated pair wins
        # (std::map::emplace, like dict.fromkeys). Byte-level merges hold no other spaces, so str.split does it
        # unless a merge starts with a space or has none.
        if all(m[:1] != " " and " " in m for m in merges):
            pairs: dict[tuple[str, str], None] = dict.fromkeys(tuple(m.split(" ", 1)) for m in merges)
        else:
            pairs = {}
            for m in merges:
                p = m.find(" ", 1)
                pairs.setdefault((m[:p], m[p + 1 :]) if p != -1 else ("", ""))
        bad = [p for p in pairs if p[0] not in vocab or p[1] not in vocab or p[0] + p[1] not in vocab]
        if bad:
            warnings.warn(
                f"tokenizer.ggml.merges: {len(bad)} merges name tokens that are not in the vocabulary "
                f"(first: {' '.join(bad[0])!r}); they are ignored",
                stacklevel=3,
            )
            for p in bad:
                del pairs[p]
        self.hf = HFTokenizer(models.BPE(vocab, list(pairs), ignore_merges=ignore_merges))
        self.pre = pre

    def encode(self, text: str) -> list[int]:
        words = [w.encode("utf-8", "surrogatepass").decode("latin-1").translate(BYTE_TO_CHAR)
                 for w in self.pre.split(text)]  # fmt: skip
        if not words:
            return []
        return self.hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids
