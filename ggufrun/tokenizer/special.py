"""Special tokens: token types and attributes, special-token ids from metadata, and cutting special-token text out
of a text before the model's tokenizer sees it.

Follows llama.cpp src/llama-vocab.cpp:
  - token attributes (llama_token_attr) from `tokenizer.ggml.token_type`, and the end-of-turn / FIM /
    end-of-generation tokens llama_vocab::impl::load detects by their text;
  - special-token ids (`tokenizer.ggml.bos_token_id`, ...): read_special_id() accepts an integer in range only.
    A value of the wrong type is a GGUFError naming the key; an id outside the vocabulary warns and means "no such
    token" (llama.cpp warns and falls back to its default id, which for SmolLM2 would prepend <jupyter_start>);
  - SpecialTokenSplitter.split() is tokenizer_st_partition: every special token in turn, longest UTF-8 text first
    (ties by id), cuts all its occurrences out of the text fragments that are left, scanning each fragment from
    the left; control/unknown tokens only with parse_special (user-defined ones always); a token with the LSTRIP
    (RSTRIP) attribute also removes the C-isspace whitespace before (after) it within the fragment.

llama.cpp re-scans every fragment for every special token: O(special tokens x text). split() gives the same
fragments in O(text) per special token that actually occurs in the text: one regex pass over a trie of all special
texts finds which occur, each occurring token is searched with str.find in a copy of the text where consumed
characters are replaced by a sentinel no special text contains, so occurrences never span two fragments.
Compiling that regex takes 0.12-0.2 s for Gemma3's 6,414 special texts, so a process's texts of up to WALK_CHARS
characters (a typed prompt, a chat turn) are scanned without it while it is not compiled yet: from each character
a special text starts with, the trie is walked as far as the text follows it (~1 us a candidate character; at most
WALK_CHARS x the longest special text steps, where the regex stays linear on any text).
literal_spans mark ranges of the text in which control/unknown token text is not recognised (as with
parse_special=False there) while user-defined tokens still are. Checked in tests/test_tokenizer.py against a
direct transcription of tokenizer_st_partition and against llama.cpp's token ids.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from enum import IntFlag

import numpy as np

from ..errors import GGUFError

# GGUF token types (gguf-py constants.TokenType, llama.cpp llama_token_type)
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)


class Attr(IntFlag):
    """Per-token attributes, as llama.cpp's llama_token_attr (src/llama-vocab.cpp keeps them per token)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


TYPE_TO_ATTR = np.array(
    [Attr.UNDEFINED, Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED, Attr.UNUSED, Attr.BYTE],
    dtype=np.uint16,
)
SPECIAL_ATTRS = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN  # cut out of text before tokenizing
HIDDEN_ATTRS = Attr.CONTROL | Attr.UNKNOWN  # not parsed / not shown unless special tokens are asked for

# token texts llama.cpp recognises as end-of-turn / end-of-message / fill-in-the-middle / end-of-generation
# (llama_vocab::impl::load, "auto-detect special tokens by text")
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>")  # fmt: skip
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")  # fmt: skip
SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id", "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id", "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id", "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id", "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id", "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}  # fmt: skip
C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale: what the lstrip/rstrip attributes strip
WALK_CHARS = 4096  # texts up to this long are scanned by walking the trie until the regex is compiled
_C_SPACE_RUN = re.compile("[" + re.escape(C_SPACE) + "]*")


def read_special_id(metadata: dict, key: str, n_vocab: int) -> int | None:
    """The token id stored under `key` (e.g. tokenizer.ggml.bos_token_id), or None for an id outside the
    vocabulary (with a warning). The caller handles a missing key. Raises GGUFError for a non-integer value."""
    value = metadata[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise GGUFError(f"{key} is {shown} ({type(value).__name__}): expected a token id (an integer)")
    if not 0 <= int(value) < n_vocab:
        warnings.warn(
            f"{key} = {int(value)} is not a token id of this vocabulary ({n_vocab} tokens): the model has no such "
            "token",
            stacklevel=4,
        )
        return None
    return int(value)


def check_literal_spans(literal_spans, text_length: int) -> list[tuple[int, int]]:
    """literal_spans as a list of (start, end) ints, sorted, non-overlapping, within the text; else ValueError."""
    spans: list[tuple[int, int]] = []
    prev_end = 0
    for item in literal_spans:
        try:
            start, end = item
        except (TypeError, ValueError):
            raise ValueError(f"literal_spans: {item!r} is not a (start, end) pair") from None
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in (start, end)):
            raise ValueError(f"literal_spans: ({start!r}, {end!r}) must be two integers")
        if not prev_end <= start <= end <= text_length:
            raise ValueError(
                f"literal_spans: ({start}, {end}) must be sorted, not overlap the previous span (ending at "
                f"{prev_end}) and lie within the text (length {text_length})"
            )
        if end > start:
            spans.append((int(start), int(end)))
        prev_end = int(end)
    return spans


class _TrieNode(dict):
    """char -> child node; `text` is the special text ending here (None if none)."""

    text: str | None = None


def _trie_pattern(node: _TrieNode) -> str:
    """A regex matching, at a position, the longest special text of the trie starting there (greedy `?` tries
    the longer texts first; a node with one child and no text of its own is written as a plain string)."""
    alternatives = []
    for ch, child in node.items():
        run = [ch]
        while len(child) == 1 and child.text is None:
            ((nxt, child),) = child.items()
            run.append(nxt)
        alternatives.append(re.escape("".join(run)) + _trie_pattern(child))
    if not alternatives:
        return ""
    group = "(?:" + "|".join(alternatives) + ")"
    return group + "?" if node.text is not None else group


class SpecialTokenSplitter:
    """tokenizer_st_partition for one vocabulary: split(text) -> text fragments (str) and special token ids (int)."""

    def __init__(self, tokens: Sequence[str], attrs: np.ndarray):
        special = np.flatnonzero(attrs & SPECIAL_ATTRS)
        # llama.cpp's cache_special_tokens order: longest UTF-8 text first; ties by id
        order = sorted(
            ((tokens[i], int(i), int(attrs[i])) for i in special),
            key=lambda e: (-len(e[0].encode("utf-8", "surrogatepass")), e[1]),
        )
        self._entries = order  # (text, id, attr) in the order the tokens cut
        self._ranks: dict[str, list[int]] = {}  # text -> positions in _entries (several ids may share a text)
        for rank, (text, _, _) in enumerate(order):
            self._ranks.setdefault(text, []).append(rank)
        self._trie = _TrieNode()
        for text in self._ranks:
            node = self._trie
            for ch in text:
                node = node.setdefault(ch, _TrieNode())
            node.text = text
        self._scan: re.Pattern | None = None
        self._related: dict[str, tuple[str, ...]] = {}
        # where a trie walk can start: the characters some special text starts with, as a character class
        firsts = "".join(re.escape(c) for c in sorted({t[0] for t in self._ranks}))
        self._starts = re.compile(f"[{firsts}]") if firsts else None
        self._longest = max(map(len, self._ranks), default=0)
        used = set("".join(self._ranks)) | set(C_SPACE)
        # the sentinel for consumed characters: a character no special text contains (nor whitespace, which the
        # LSTRIP/RSTRIP attributes would strip)
        self._sentinel = next(chr(c) for c in range(0x110000) if chr(c) not in used)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def _scanner(self) -> re.Pattern:
        if self._scan is None:
            try:
                self._scan = re.compile(_trie_pattern(self._trie), re.DOTALL)
            except (RecursionError, re.error, OverflowError):  # a vocabulary with thousands of nested prefixes
                texts = sorted(self._ranks, key=len, reverse=True)
                self._scan = re.compile("|".join(map(re.escape, texts)), re.DOTALL)
        return self._scan

    def _related_texts(self, found: str) -> tuple[str, ...]:
        """Special texts that may occur where a leftmost-longest scan found `found` without reporting them: those
        starting inside it (at offset 0 too, if shorter), whether they end inside it or run past its end."""
        related = self._related.get(found)
        if related is None:
            out = set()
            for i in range(len(found)):
                node = self._trie
                for ch in found[i:]:
                    node = node.get(ch)
                    if node is None:
                        break
                    if node.text is not None:
                        out.add(node.text)
                else:
                    if i > 0:  # every text continuing the suffix found[i:] may run past the end of `found`
                        stack = [node]
                        while stack:
                            n = stack.pop()
                            if n.text is not None:
                                out.add(n.text)
                            stack.extend(n.values())
            out.discard(found)
            related = self._related[found] = tuple(out)
        return related

    def _occurring(self, text: str) -> list[int]:
        """Positions in the cutting order (_entries) of the special tokens whose text occurs in `text`."""
        if self._starts is None:
            return []
        if self._scan is None and len(text) <= WALK_CHARS:
            texts = self._walk(text)
        else:
            found = set(self._scanner().findall(text))
            texts = set(found)
            for f in found:
                texts.update(t for t in self._related_texts(f) if t not in texts and t in text)
        return sorted(rank for t in texts for rank in self._ranks[t])

    def _walk(self, text: str) -> set[str]:
        """The special texts occurring in `text` (overlapping ones included): from every character a special text
        starts with, the trie walked as far as the text follows it."""
        texts: set[str] = set()
        trie, add, longest = self._trie, texts.add, self._longest
        for m in self._starts.finditer(text):
            node = trie
            for ch in text[m.start() : m.start() + longest]:
                node = node.get(ch)
                if node is None:
                    break
                if node.text is not None:
                    add(node.text)
        return texts

    def split(self, text: str, parse_special: bool, literal_spans: Sequence[tuple[int, int]] = ()) -> list[str | int]:
        """Fragments of `text` in order: str for text the model's tokenizer encodes, int for a special token.

        literal_spans: sorted, non-overlapping (start, end) ranges of `text` (see check_literal_spans) in which
        control/unknown tokens are not recognised.
        """
        if not self._entries or not text:
            return [text] if text else []
        sentinel = self._sentinel
        masked = text  # consumed characters -> sentinel
        masked_literal = None  # masked, also with the literal spans as sentinel (searched for control tokens)
        if literal_spans and parse_special:
            masked_literal = _blank(text, literal_spans, sentinel)
        claims: list[tuple[int, int, int]] = []  # (first consumed char, end of consumed chars, token id)
        for rank in self._occurring(text):
            tok_text, tok_id, attr = self._entries[rank]
            hidden = attr & HIDDEN_ATTRS
            if hidden and not parse_special:
                continue
            src = masked_literal if hidden and masked_literal is not None else masked
            at = src.find(tok_text)
            if at < 0:
                continue
            lstrip, rstrip, size = bool(attr & Attr.LSTRIP), bool(attr & Attr.RSTRIP), len(tok_text)
            consumed: list[tuple[int, int]] = []
            cursor = 0  # where the scan resumes: after this token's previous match and what it stripped
            find, add = src.find, consumed.append
            while at >= 0:
                start, stop = at, at + size
                if lstrip and at > cursor:
                    start = cursor + len(masked[cursor:at].rstrip(C_SPACE))
                if rstrip:
                    stop = _C_SPACE_RUN.match(masked, stop).end()
                add((start, stop))
                cursor = stop
                at = find(tok_text, cursor)
            claims += [(start, stop, tok_id) for start, stop in consumed]
            masked = _blank(masked, consumed, sentinel)
            if masked_literal is not None:
                masked_literal = _blank(masked_literal, consumed, sentinel)
        claims.sort()
        out: list[str | int] = []
        prev = 0
        for start, stop, tok_id in claims:
            if start > prev:
                out.append(text[prev:start])
            out.append(tok_id)
            prev = stop
        if prev < len(text):
            out.append(text[prev:])
        return out


def _blank(text: str, spans: Sequence[tuple[int, int]], sentinel: str) -> str:
    """`text` with the characters of the sorted, non-overlapping spans replaced by `sentinel`."""
    parts, prev = [], 0
    for start, stop in spans:
        parts.append(text[prev:start])
        parts.append(sentinel * (stop - start))
        prev = stop
    parts.append(text[prev:])
    return "".join(parts)
