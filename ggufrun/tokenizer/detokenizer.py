"""Streaming detokenizer (token ids in, final text out, one token at a time) and llama.cpp's clean-up of spaces.

clean_up_spaces() is the `clean_spaces` step of llama_vocab::impl::detokenize (src/llama-vocab.cpp), used by
Tokenizer.detokenize and by StreamingDetokenizer.

The concatenation of everything add_token() and finalize() return equals tokenizer.detokenize(all ids)
exactly (same skip_special), because it applies the same steps incrementally:
    - per-token pieces (Tokenizer.token_piece), the first one losing a leading space when the model
      has add_space_prefix (SentencePiece's "▁Hello" at the start of a text is "Hello");
    - llama.cpp's clean-up of spaces (" ." -> "."), for the BPE models that ask for it: text is held back
      only while a space or apostrophe near its end could still be affected by the next bytes;
    - UTF-8 decoding with an incremental decoder, so a character split over several byte tokens
      (<0xF0><0x9F><0x99><0x82>) is held until complete; invalid bytes become U+FFFD as in detokenize.
Each step costs O(length of the new piece): amortised O(1) per token.

>>> detok = StreamingDetokenizer(tok)
>>> for t in ids:
...     print(detok.add_token(t), end="", flush=True)
>>> print(detok.finalize())
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Tokenizer

# ---- clean-up of spaces (llama_vocab::impl::detokenize, clean_spaces) ----------------------------------------------
_CLEAN_TRIGGERS = (b" ?", b" !", b" .", b" ,", b" ' ", b" 's", b" 'm", b" 're", b" 've")


def clean_up_spaces(text: bytes) -> bytes:
    """llama.cpp's three in-place passes over detokenized bytes: drop the space in " ?", " !", " .", " ,";
    turn " ' " into "'"; drop the space before 's, 'm, 're, 've. Removing a space never creates a new
    trigger, so text without any is returned as is."""
    if not any(t in text for t in _CLEAN_TRIGGERS):
        return text
    t = bytearray(text)
    n, total = len(t), 1 if t else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0  # the space after the apostrophe is skipped
        t[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, t[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):  # 're 've
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


def _safe_cut(buf: bytes, start: int) -> bool:
    """True if clean_up_spaces may split buf at `start` without changing the result: no decision about a
    space before the cut depends on bytes after it (the cut is not right after a space or an apostrophe,
    and no apostrophe sits just before, as in " 're")."""
    return buf[start - 1] not in b" '" and b"'" not in buf[max(0, start - 3) : start - 1]


class StreamingDetokenizer:
    """Incremental detokenizer for one token stream (reset() starts a new one).

    skip_special: hide control tokens, as Tokenizer.detokenize(skip_special=True).
    text: everything returned so far; last_segment: the text returned since the last read of last_segment.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        tokenizer._check_text_model()
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.reset()

    def reset(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._started = False  # the first token decides the leading-space rule
        self._strip_space = False  # the next non-empty piece loses one leading space
        self._pending = b""  # bytes not yet through clean_up_spaces (clean-up models only)
        self._done = b""  # the last few bytes already cleaned, context for _safe_cut
        self._segments: list[str] = []
        self._text: str | None = ""
        self._read = 0  # characters of text already handed out by last_segment

    def add_token(self, token_id: int) -> str:
        """Feed one token; return the text that became final (possibly "")."""
        tok = self.tokenizer
        token_id = int(token_id)
        if not self._started:
            self._started = True
            if self.skip_special and tok.add_bos and token_id == tok.bos_id:
                return ""  # detokenize drops this BOS and then keeps the next piece's space
            self._strip_space = tok.add_space_prefix
            piece = tok.token_piece(token_id, special=not self.skip_special)
            if self._strip_space and piece[:1] == b" ":
                piece = piece[1:]
            self._strip_space = False
        else:
            piece = tok.token_piece(token_id, special=not self.skip_special)
        if not piece:
            return ""
        if tok.clean_spaces:
            piece = self._clean(piece)
        return self._emit(self._decoder.decode(piece, final=False))

    def _clean(self, piece: bytes) -> bytes:
        old = len(self._pending)
        buf = self._done + self._pending + piece
        base = len(self._done)
        # positions at or before `old` were checked when they arrived, and a cut's safety never changes
        for cut in range(old + len(piece), old, -1):
            if _safe_cut(buf, base + cut):
                ready, self._pending = buf[base : base + cut], buf[base + cut :]
                self._done = (self._done + ready)[-3:]
                return clean_up_spaces(ready)
        self._pending = buf[base:]
        return b""

    def _emit(self, text: str) -> str:
        if text:
            self._segments.append(text)
            self._text = None
        return text

    def finalize(self) -> str:
        """Flush everything held back (an incomplete UTF-8 character becomes U+FFFD, as in detokenize)."""
        tail = clean_up_spaces(self._pending) if self._pending else b""
        self._done = (self._done + self._pending)[-3:]
        self._pending = b""
        return self._emit(self._decoder.decode(tail, final=True))

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = "".join(self._segments)
            self._segments = [self._text]
        return self._text

    @property
    def last_segment(self) -> str:
        text = self.text
        segment, self._read = text[self._read :], len(text)
        return segment
