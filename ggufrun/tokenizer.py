"""Tokenizer from GGUF metadata (`tokenizer.ggml.*` keys only), giving the same token ids as llama.cpp.

tokenize(text) follows llama.cpp `src/llama-vocab.cpp` (llama_vocab::impl::tokenize):
    1. special-token partition (tokenizer_st_partition): control/unknown tokens (only with parse_special)
       and user-defined tokens (always) are cut out of the text, longest token text first;
    2. each remaining text fragment goes to the model's tokenizer:
       - "gpt2" (byte-level BPE): pre-tokenizer regexes chosen by `tokenizer.ggml.pre` split the fragment
         into words (`src/unicode.cpp` unicode_regex_split), each word's UTF-8 bytes are mapped to the GPT-2
         byte alphabet, and a HF `tokenizers` BPE model applies `tokenizer.ggml.merges` in rank order;
       - "llama" (SentencePiece-style): spaces become U+2581 (plus one leading space after BOS/a special
         token when `add_space_prefix`), then the best-scoring adjacent pair whose concatenation is a token
         is merged until none is left, unknown characters fall back to <0xNN> byte tokens
         (llm_tokenizer_spm). A `sentencepiece` BPE model serialized in memory from tokens + scores runs
         exactly that loop;
    3. BOS / EOS per `add_bos_token` / `add_eos_token`.

detokenize(ids) follows llama_vocab::impl::detokenize: per-token pieces (token_to_piece), one leading space
stripped from the first piece when `add_space_prefix`, llama.cpp's clean-up of spaces for BPE models
that ask for it, then UTF-8 decoding with U+FFFD for invalid bytes.

>>> tok = load_tokenizer(GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf").metadata)
>>> tok.tokenize("Hello, world!")
[19556, 28, 905, 17]
>>> tok.detokenize([19556, 28, 905, 17])
'Hello, world!'
"""

from __future__ import annotations

import re
import unicodedata
import warnings
from collections.abc import Sequence
from enum import IntFlag

import numpy as np

from .errors import TokenizerError

# GGUF token types (gguf-py constants.TokenType, llama.cpp llama_token_type)
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)

SPM_SPACE = "\u2581"  # SentencePiece's visible space "▁"


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


_TYPE_TO_ATTR = np.array(
    [Attr.UNDEFINED, Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED, Attr.UNUSED, Attr.BYTE],
    dtype=np.uint16,
)
_SPECIAL_ATTRS = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN  # cut out of text before tokenizing
_HIDDEN_ATTRS = Attr.CONTROL | Attr.UNKNOWN  # not parsed / not shown unless special tokens are asked for


# ---- character classes as llama.cpp sees them ------------------------------------------------------------------
# llama.cpp's pre-tokenizer works on its own Unicode tables (src/unicode-data.cpp, generated from the UCD 15.1
# by scripts/gen-unicode-data.py). We take categories from `unicodedata` plus the code points assigned in
# Unicode 15.0/15.1 that older Pythons (3.11 ships Unicode 14.0) still call unassigned.
_UNICODE_15_ADDITIONS = (
    (0x00CF3, 0x00CF3, "M"), (0x00ECE, 0x00ECE, "M"), (0x02FFC, 0x02FFF, "S"), (0x031EF, 0x031EF, "S"),
    (0x10EFD, 0x10EFF, "M"), (0x1123F, 0x11240, "L"), (0x11241, 0x11241, "M"), (0x11B00, 0x11B09, "P"),
    (0x11F00, 0x11F01, "M"), (0x11F02, 0x11F02, "L"), (0x11F03, 0x11F03, "M"), (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"), (0x11F34, 0x11F3A, "M"), (0x11F3E, 0x11F42, "M"), (0x11F43, 0x11F4F, "P"),
    (0x11F50, 0x11F59, "N"), (0x1342F, 0x1342F, "L"), (0x13439, 0x1343F, "C"), (0x13440, 0x13440, "M"),
    (0x13441, 0x13446, "L"), (0x13447, 0x13455, "M"), (0x1B132, 0x1B132, "L"), (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"), (0x1DF25, 0x1DF2A, "L"), (0x1E030, 0x1E06D, "L"), (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"), (0x1E4EC, 0x1E4EF, "M"), (0x1E4F0, 0x1E4F9, "N"), (0x1F6DC, 0x1F6DC, "S"),
    (0x1F774, 0x1F776, "S"), (0x1F77B, 0x1F77F, "S"), (0x1F7D9, 0x1F7D9, "S"), (0x1FA75, 0x1FA77, "S"),
    (0x1FA87, 0x1FA88, "S"), (0x1FAAD, 0x1FAAF, "S"), (0x1FABB, 0x1FABD, "S"), (0x1FABF, 0x1FABF, "S"),
    (0x1FACE, 0x1FACF, "S"), (0x1FADA, 0x1FADB, "S"), (0x1FAE8, 0x1FAE8, "S"), (0x1FAF7, 0x1FAF8, "S"),
    (0x2B739, 0x2B739, "L"), (0x2EBF0, 0x2EE5D, "L"), (0x31350, 0x323AF, "L"),
)  # fmt: skip

# White_Space property (PropList.txt), the set llama.cpp uses for \s
_WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)

# llama.cpp collapses every non-ASCII code point to one byte standing for its class before running a regex
# (unicode_regex_split, "collapsed" text): whitespace -> \x0B, \p{N} -> \xD1, \p{L} -> \xD2, \p{P} -> \xD3,
# \p{M} -> \xD4, \p{S} -> \xD5, anything else -> \xD0. We do the same, as str code points U+00D0..U+00D5.
_COLLAPSED = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}


def _major_category(cp: int) -> str:
    cat = unicodedata.category(chr(cp))[0]
    if cat == "C" and unicodedata.category(chr(cp)) == "Cn":
        for lo, hi, c in _UNICODE_15_ADDITIONS:
            if lo <= cp <= hi:
                return c
    return cat


class _CollapseTable(dict):
    """str.translate table: code point -> its collapsed class character, filled on first sight."""

    def __missing__(self, cp: int) -> str:
        if cp in _WHITESPACE:
            ch = "\x0b"
        else:
            ch = _COLLAPSED.get(_major_category(cp), "\xd0")
        if len(self) < 1 << 16:  # bounded: a text of every code point must not grow it to 1.1M entries
            self[cp] = ch
        return ch


_COLLAPSE = _CollapseTable({cp: cp for cp in range(128)})  # ASCII stays itself
# regexes without \p{..} run on code points, with non-ASCII whitespace turned into \x0B (std::wregex's \s
# only knows ASCII whitespace)
_WIDE = {cp: "\x0b" for cp in _WHITESPACE if cp > 0x7F}

# ASCII members of each class, as llama.cpp writes them into collapsed regexes (k_ucat_map)
_ASCII_CLASS = {
    cat: "".join(re.escape(chr(c)) for c in range(128) if unicodedata.category(chr(c))[0] == cat) for cat in "NLPMS"
}
_PROPERTY_CATEGORY = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S", "Lu": "L", "Ll": "L", "Lt": "L"}
_PROPERTY_CATEGORY.update({"Lm": "L", "Lo": "L"})


# ---- pre-tokenizer regexes (llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe) ---------------------------------
# Written as the regex text llama.cpp compiles (after C++ unescaping).
R_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
R_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
R_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
R_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
R_NEWLINES = r"[^\n]+|[\n]+"
_R_GPT4O_WORDS = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
)
R_GPT4O = _R_GPT4O_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
R_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
R_DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Non-ASCII regex characters are written as escapes: several are canonically equivalent to others (U+1F7D
# and U+03CE look alike) and must survive any Unicode normalisation of this file.
R_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PRE_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", R_GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]
_PRE_DEEPSEEK_LLM = [
    "[\r\n]",
    "\\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    _CJK_HANGUL,
    r"\p{N}+",
]
_PRE_DEEPSEEK_CODER = ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}"]
_PRE_DEEPSEEK3 = [r"\p{N}{1,3}", _CJK_KANA, R_DEEPSEEK3_WORDS]
_PRE_FALCON = [
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    "[0-9][0-9][0-9]",
]
_PRE_STARCODER = [r"\p{N}", R_GPT2]


# tokenizer.ggml.pre -> (regexes, options); options as llama.cpp sets them in llama_vocab::impl::load
_PRE_TYPES: dict[str, tuple[list[str], dict]] = {}


def _pre(names: str, regexes: list[str], **options) -> None:
    for name in names.split():
        _PRE_TYPES[name] = (regexes, options)


_NOCLEAN = {"clean_spaces": False}
_pre("default", _PRE_DEFAULT)
_pre("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4", [R_GPT2])
_pre("jina-v1-en jina-v2-code roberta-bpe mpt olmo jais", [R_GPT2])
_pre("trillion granite-docling", [R_GPT2], **_NOCLEAN)
_pre("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", [R_LLAMA3],
     ignore_merges=True, add_bos=True)  # fmt: skip
_pre("dbrx smaug-bpe", [R_LLAMA3])
_pre("chatglm-bpe", [R_LLAMA3], no_bos=True)
_pre("glm4 glm5", [R_LLAMA3], no_bos=True, ignore_merges=True)
_pre("deepseek-llm", _PRE_DEEPSEEK_LLM, **_NOCLEAN)
_pre("deepseek-coder", _PRE_DEEPSEEK_CODER, **_NOCLEAN)
_pre("deepseek-v3 hunyuan-dense joyai-llm hy_v4", _PRE_DEEPSEEK3, **_NOCLEAN)
_pre("falcon", _PRE_FALCON)
_pre("starcoder refact codeshell exaone minerva-7b mellum2", _PRE_STARCODER)
_pre("command-r smollm", _PRE_STARCODER, **_NOCLEAN)
_pre("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", [R_QWEN2], **_NOCLEAN)
_pre("stablelm2 megrez", [R_QWEN2])
_pre("qwen35", [R_QWEN35], **_NOCLEAN)
_pre("bloom gpt3-finnish", [R_BLOOM])
_pre("poro-chat", [R_BLOOM], **_NOCLEAN)
_pre("viking", [R_BLOOM, r"\p{N}"], **_NOCLEAN)
_pre("tekken", [R_TEKKEN], ignore_merges=True, add_bos=True, **_NOCLEAN)
_pre("gpt-4o llama4 kanana2 talkie minimax-m2", [R_GPT4O], **_NOCLEAN)
_pre("seed-coder", [_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                    r"|\s+(?!\S)|\s+"], **_NOCLEAN)  # fmt: skip
_pre("grok-2", [R_QWEN2], **_NOCLEAN)
_pre("ufakzeka", [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"], **_NOCLEAN)
_pre("laguna", [R_NEWLINES, R_QWEN2], **_NOCLEAN)
_pre("minicpm5", [r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"], ignore_merges=True)  # fmt: skip


# llama.cpp runs these four regexes with hand-written code (src/unicode.cpp unicode_regex_split_custom_*).
# Equivalent Python regexes on the collapsed text; every code point matches some branch, as in that code.
def _custom_patterns() -> dict[str, str]:
    L, N, M, W = "A-Za-z\xd2", "0-9\xd1", "\xd4", "\t\n\x0b\x0c\r "
    c = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
    ws = rf"[{W}]*[\r\n]+|[{W}]+(?![^{W}])|[{W}]+"
    return {
        R_GPT2: rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+",
        R_LLAMA3: rf"{c}|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^{W}{L}{N}]+[\r\n]*|{ws}",
        R_QWEN2: rf"{c}|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{W}{L}{N}]+[\r\n]*|{ws}",
        R_QWEN35: rf"{c}|[^\r\n{L}{N}]?[{L}{M}]+|[{N}]| ?[^{W}{L}{M}{N}]+[\r\n]*|{ws}",
        R_NEWLINES: R_NEWLINES,
    }


def _collapse_regex(expr: str) -> str:
    """Rewrite \\p{X} into the collapsed classes the way unicode_regex_split does ([marker + ASCII members])."""
    out, inside, i = [], False, 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
        elif inside and ch == "]" and expr[i - 1] != "\\":
            inside = False
        elif expr.startswith("\\p{", i):
            end = expr.find("}", i + 3)
            cat = _PROPERTY_CATEGORY.get(expr[i + 3 : end]) if end != -1 else None
            if cat is not None:
                body = re.escape(_COLLAPSED[cat]) + _ASCII_CLASS[cat]
                out.append(body if inside else f"[{body}]")
                i = end + 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _ecmascript_to_python(expr: str) -> str:
    """ECMAScript's `$` (no multiline) matches only at the very end; Python's also before a final newline."""
    out, inside, escaped = [], False, False
    for ch in expr:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "[":
            inside = True
        elif ch == "]":
            inside = False
        elif ch == "$" and not inside:
            ch = r"\Z"
        out.append(ch)
    return "".join(out)


class PreTokenizer:
    """Splits text into words like llama.cpp's unicode_regex_split for a list of regexes: each regex splits
    every current piece further, matches and the text between them both becoming pieces."""

    def __init__(self, regex_exprs: Sequence[str]):
        custom = _custom_patterns()
        self.steps: list[tuple[re.Pattern, bool]] = []  # (pattern, runs on the collapsed text)
        for expr in regex_exprs:
            if expr in custom:
                self.steps.append((re.compile(custom[expr], re.ASCII), True))
            elif "\\p{" in expr:
                self.steps.append((re.compile(_ecmascript_to_python(_collapse_regex(expr)), re.ASCII), True))
            else:
                self.steps.append((re.compile(_ecmascript_to_python(expr), re.ASCII), False))

    def split(self, text: str) -> list[str]:
        collapsed = text.translate(_COLLAPSE) if any(c for _, c in self.steps) else text
        wide = text.translate(_WIDE) if not all(c for _, c in self.steps) else text
        spans = [(0, len(text))]
        for pattern, on_collapsed in self.steps:
            src = collapsed if on_collapsed else wide
            new = []
            for start, end in spans:
                prev = start
                for m in pattern.finditer(src[start:end]):
                    a, b = m.start() + start, m.end() + start
                    if a > prev:
                        new.append((prev, a))
                    if b > a:
                        new.append((a, b))
                    prev = b
                if prev < end:
                    new.append((prev, end))
            spans = new
        return [text[a:b] for a, b in spans]


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


_BYTE_TO_CHAR = _bytes_to_unicode()  # index: byte -> str.translate of a latin-1 decoded word
_CHAR_TO_BYTE = {ch: b for b, ch in enumerate(_BYTE_TO_CHAR)}


def _byte_level_decode(text: str) -> bytes:
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


# ---- backends -------------------------------------------------------------------------------------------------
class _BPEBackend:
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
        words = [w.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TO_CHAR)
                 for w in self.pre.split(text)]  # fmt: skip
        if not words:
            return []
        return self.hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids


def _varint_lengths(v: np.ndarray) -> np.ndarray:
    return 1 + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21) + (v >= 1 << 28)


def _put_varints(out: np.ndarray, pos: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Write protobuf varints v (int64, 0 <= v < 2**35) at byte offsets pos; return the offsets after them."""
    n = _varint_lengths(v)
    for k in range(5):
        sel = n > k
        byte = ((v >> (7 * k)) & 0x7F) | np.where(n > k + 1, 0x80, 0)
        out[pos[sel] + k] = byte[sel]
    return pos + n


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _spm_model_proto(pieces: list[str], scores: np.ndarray, piece_types: np.ndarray, unk_id: int, byte_fallback: bool):
    """Serialize a sentencepiece ModelProto (BPE, identity normalizer) without the protobuf package.

    ModelProto: pieces=1 {piece=1 string, score=2 float, type=3 enum}, trainer_spec=2 {model_type=3,
    byte_fallback=35, unk_id=40, bos_id=41, eos_id=42, pad_id=43}, normalizer_spec=3 {name=1,
    add_dummy_prefix=3, remove_extra_whitespaces=4, escape_whitespaces=5}. Vectorised: 262k pieces in ~50 ms.
    """
    joined = np.frombuffer("\x00".join(pieces).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    seps = np.flatnonzero(joined == 0)
    if len(seps) != len(pieces) - 1:
        raise TokenizerError("tokenizer.ggml.tokens: a token contains a NUL character")
    starts = np.concatenate(([0], seps + 1)).astype(np.int64)
    plen = np.concatenate((seps, [len(joined)])).astype(np.int64) - starts
    inner = 1 + _varint_lengths(plen) + plen + 5 + 2  # piece tag+len+bytes, score tag+4, type tag+1
    rec = 1 + _varint_lengths(inner) + inner
    rec_start = np.concatenate(([0], np.cumsum(rec)[:-1])).astype(np.int64)
    out = np.empty(int(rec.sum()), dtype=np.uint8)
    out[rec_start] = 0x0A  # ModelProto.pieces, length-delimited
    pos = _put_varints(out, rec_start + 1, inner)
    out[pos] = 0x0A  # SentencePiece.piece
    pos = _put_varints(out, pos + 1, plen)
    src = np.delete(joined, seps)
    within = np.arange(len(src), dtype=np.int64) - np.repeat(np.concatenate(([0], np.cumsum(plen)[:-1])), plen)
    out[np.repeat(pos, plen) + within] = src
    pos = pos + plen
    out[pos] = 0x15  # SentencePiece.score, fixed32
    out[pos[:, None] + np.arange(1, 5)] = scores.astype("<f4").view(np.uint8).reshape(-1, 4)
    out[pos + 5] = 0x18  # SentencePiece.type, varint (1..6)
    out[pos + 6] = piece_types

    def field(num: int, v: int) -> bytes:
        return _varint(num << 3) + _varint(v)

    trainer = field(3, 2) + field(35, int(byte_fallback)) + field(40, unk_id)
    trainer += field(41, -1) + field(42, -1) + field(43, -1)
    normalizer = b"\x0a\x08identity" + field(3, 0) + field(4, 0) + field(5, 0)
    return out.tobytes() + b"\x12" + _varint(len(trainer)) + trainer + b"\x1a" + _varint(len(normalizer)) + normalizer


class _SPMBackend:
    """llama.cpp's llm_tokenizer_spm run by sentencepiece's BPE model (bpe_model.cc: the same score-ordered
    pair merging, ties to the left, unknown characters as <0xNN> bytes). Every token is a NORMAL piece so
    that, as in llama.cpp, any vocabulary entry (control tokens included) can be the result of a merge."""

    def __init__(self, tokens: list[str], scores: np.ndarray, types: np.ndarray, unk_id: int | None):
        import sentencepiece

        n = len(tokens)
        byte_ids = np.flatnonzero(types == TYPE_BYTE)
        byte_fallback = len(byte_ids) == 256 and {tokens[i] for i in byte_ids} == {f"<0x{b:02X}>" for b in range(256)}
        piece_types = np.ones(n, dtype=np.uint8)
        if byte_fallback:
            piece_types[byte_ids] = 6  # BYTE
        pieces = tokens
        if unk_id is None or not 0 <= unk_id < n or piece_types[unk_id] != 1:
            # sentencepiece needs one UNKNOWN piece; add one past the vocabulary that no text can produce
            pieces = [*tokens, "\x01<unk>\x01"]
            scores = np.append(scores, np.float32(0))
            piece_types = np.append(piece_types, np.uint8(1))
            unk_id = n
        piece_types[unk_id] = 2  # UNKNOWN
        proto = _spm_model_proto(pieces, scores, piece_types, unk_id, byte_fallback)
        self.sp = sentencepiece.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(f"tokenizer.ggml.tokens: cannot build the SentencePiece model: {e}") from e

    def encode(self, text: str) -> list[int]:
        return self.sp.EncodeAsIds(text) if text else []


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


# ---- the tokenizer ----------------------------------------------------------------------------------------------
# token texts llama.cpp recognises as end-of-turn / end-of-message / fill-in-the-middle / end-of-generation
# (llama_vocab::impl::load, "auto-detect special tokens by text")
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>")  # fmt: skip
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
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
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")  # fmt: skip
_SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id", "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id", "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id", "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id", "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id", "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}  # fmt: skip
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale: what the lstrip/rstrip attributes strip


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build it with load_tokenizer(metadata).

    model: "gpt2" (byte-level BPE), "llama" (SentencePiece-style) or "none" (ids only: text methods raise
    TokenizerError). Token ids are plain ints; `eog_ids` are the ids that end generation.
    """

    def __init__(self, metadata: dict):
        md = metadata
        model = md.get("tokenizer.ggml.model")
        arch = md.get("general.architecture")
        self.model: str = "none" if model in (None, "no_vocab") else str(model)
        self.pre: str | None = md.get("tokenizer.ggml.pre")
        tokens = md.get("tokenizer.ggml.tokens")
        self.bos_id: int | None = None
        self.eos_id: int | None = None
        self.eot_id: int | None = None
        self.eom_id: int | None = None
        self.unk_id: int | None = None
        self.pad_id: int | None = None
        self.add_bos = self.add_eos = self.add_space_prefix = self.clean_spaces = False
        self.eog_ids: frozenset[int] = frozenset()
        self._backend = None
        self._unsupported: str | None = None
        if self.model == "none" or tokens is None:
            if self.model != "none":
                self._unsupported = f"tokenizer.ggml.model is {self.model!r} but tokenizer.ggml.tokens is missing"
                self.model = "none"
            self.n_vocab: int = int(md.get(f"{arch}.vocab_size", 0))
            self._tokens: list[str] = []
            self._attrs = np.zeros(0, dtype=np.uint16)
            return

        # token texts, scores, types; empty texts renamed as llama.cpp does
        self._tokens = list(tokens)
        for i in [i for i, t in enumerate(self._tokens) if not t]:
            self._tokens[i] = f"[EMPTY_{i}]"
        n = self.n_vocab = len(self._tokens)
        self._token_to_id = {t: i for i, t in enumerate(self._tokens)}  # a repeated text maps to its last id
        scores = md.get("tokenizer.ggml.scores")
        scores = np.zeros(n, np.float32) if scores is None else np.asarray(scores, dtype=np.float32)[:n]
        types = md.get("tokenizer.ggml.token_type")
        types = np.full(n, TYPE_NORMAL, np.int32) if types is None else np.asarray(types, dtype=np.int32)[:n]
        if len(scores) < n or len(types) < n:
            raise TokenizerError(
                f"tokenizer.ggml.scores/token_type have {len(scores)}/{len(types)} entries, expected {n} "
                "(one per token)"
            )
        self._attrs = _TYPE_TO_ATTR[np.clip(types, 0, 6)].copy()
        self._attrs[(types < 0) | (types > 6)] = Attr.UNDEFINED

        # per-model defaults, then per-pre options, then explicit metadata (llama_vocab::impl::load;
        # the default ids are llama.cpp's, for files that do not name them)
        ids: dict[str, int | None] = dict.fromkeys(_SPECIAL_ID_KEYS)
        ignore_merges = False
        if self.model == "llama":
            ids.update(bos=1, eos=2, unk=0)
            self.add_bos, self.add_space_prefix = True, True
        elif self.model == "gpt2":
            ids.update(bos=11, eos=11)
            self.clean_spaces = True
            pre = self.pre or "default"
            if self.pre is None:
                warnings.warn("tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer", stacklevel=3)
            if pre not in _PRE_TYPES:
                warnings.warn(
                    f"tokenizer.ggml.pre {pre!r} is not supported (llama.cpp refuses it too): using the "
                    "'default' pre-tokenizer, tokens may differ from the model's training",
                    stacklevel=3,
                )
                pre = "default"
            regexes, opts = _PRE_TYPES[pre]
            self.clean_spaces = opts.get("clean_spaces", True)
            ignore_merges = opts.get("ignore_merges", False)
            self.add_bos = opts.get("add_bos", False)
            if opts.get("no_bos"):
                ids["bos"] = None
        else:
            # the model still runs on token ids, and stops at the end-of-generation ids found below
            self._unsupported = f"tokenizer.ggml.model {self.model!r} is not supported (only 'gpt2' and 'llama')"
            warnings.warn(self._unsupported + ": text cannot be tokenized", stacklevel=3)
        if "tokenizer.ggml.add_space_prefix" in md:
            self.add_space_prefix = bool(md["tokenizer.ggml.add_space_prefix"])
        for name, key in _SPECIAL_ID_KEYS.items():
            if ids[name] is not None and ids[name] >= n:
                ids[name] = None
            v = md.get(key)
            if v is not None and 0 <= int(v) < n:
                ids[name] = int(v)
        if "tokenizer.ggml.add_bos_token" in md:
            self.add_bos = bool(md["tokenizer.ggml.add_bos_token"])
        if "tokenizer.ggml.add_eos_token" in md:
            self.add_eos = bool(md["tokenizer.ggml.add_eos_token"])
        self._detect_special_tokens(ids, md)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = ids["bos"], ids["eos"], ids["unk"], ids["pad"]
        self.eot_id, self.eom_id = ids["eot"], ids["eom"]

        # special-token partition list: longest text first (llama.cpp: cache_special_tokens)
        special = np.flatnonzero(self._attrs & _SPECIAL_ATTRS)
        entries = sorted(
            ((self._tokens[i], int(i), int(self._attrs[i])) for i in special),
            key=lambda e: (-len(e[0].encode("utf-8", "surrogatepass")), e[1]),
        )
        # index by the first two characters (one for 1-character tokens): a text only needs the special
        # tokens whose key occurs in it, which keeps Gemma's 6k control tokens off the common path
        self._special_index: tuple[dict[str, list], dict[str, list]] = ({}, {})  # parse_special False, True
        for order, (tok_text, tok_id, attr) in enumerate(entries):
            for parsed in (False, True) if not attr & _HIDDEN_ATTRS else (True,):
                self._special_index[parsed].setdefault(tok_text[:2], []).append((order, tok_text, tok_id, attr))
        self._pieces: list[bytes | None] = [None] * n  # token_to_piece cache, filled on first use

        if self.model == "gpt2":
            merges = md.get("tokenizer.ggml.merges")
            if merges is None:
                raise TokenizerError("tokenizer.ggml.model is 'gpt2' but tokenizer.ggml.merges is missing")
            self._backend = _BPEBackend(self._token_to_id, merges, PreTokenizer(regexes), ignore_merges)
        elif self.model == "llama":
            self._backend = _SPMBackend(self._tokens, scores, types, ids["unk"])
        else:
            self.model = "none"

    def _detect_special_tokens(self, ids: dict, md: dict) -> None:
        """End-of-turn/FIM/end-of-generation ids found by token text, with llama.cpp's attribute fixes."""
        find = self._token_to_id.get

        def mark_control(i: int) -> None:
            self._attrs[i] |= Attr.CONTROL

        for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()):
            if ids[name] is None:
                found = [find(t) for t in texts if find(t) is not None]
                if found:
                    ids[name] = found[0]
                    mark_control(found[0])
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for t in _EOG_TEXTS:
            i = find(t)
            if i is not None:
                eog.add(i)
                mark_control(i)
        # gpt-oss: these always render as text
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if find(t) is not None:
                self._attrs[find(t)] = Attr.USER_DEFINED
        eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
        texts = {self._tokens[i]: i for i in eog}
        # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation
        if "<|end|>" in texts and (
            ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
            or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
        ):
            eog.discard(texts["<|end|>"])
            self._attrs[texts["<|end|>"]] = Attr.USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            self._attrs[texts["</s>"]] = Attr.NORMAL
        self.eog_ids = frozenset(int(i) for i in eog)
        # per-model token attributes llama.cpp sets by name
        name = str(md.get("general.name", "")).lower()
        if "phi-3" in name or "phi3" in name:
            for i in np.flatnonzero(self._attrs & _SPECIAL_ATTRS):
                self._attrs[i] |= Attr.RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                i = find(t)
                if i is not None:
                    self._attrs[i] = (self._attrs[i] | Attr.RSTRIP) if on else (self._attrs[i] & ~Attr.RSTRIP)
        pre, arch = str(md.get("tokenizer.ggml.pre", "")), str(md.get("general.architecture", ""))
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if find("<mask>") is not None:
                self._attrs[find("<mask>")] |= Attr.LSTRIP

    # ---- lookups ----------------------------------------------------------------------------------------------
    def _check_text_model(self) -> None:
        if self._backend is None:
            raise TokenizerError(
                self._unsupported
                or "this model has no vocabulary (tokenizer.ggml.model is 'none'): it runs on token ids only"
            )

    def _check_id(self, token_id: int) -> int:
        if not 0 <= token_id < len(self._tokens):
            if not self._tokens:
                self._check_text_model()
            raise TokenizerError(f"token id {token_id} is out of range for a vocabulary of {len(self._tokens)}")
        return token_id

    def token_text(self, token_id: int) -> str:
        """The vocabulary string of a token, as stored in tokenizer.ggml.tokens (e.g. 'Ġworld', '▁the')."""
        return self._tokens[self._check_id(int(token_id))]

    def token_id(self, text: str) -> int | None:
        """The id whose vocabulary string is exactly `text`, or None."""
        return self._token_to_id.get(text) if self._tokens else None

    def is_special(self, token_id: int) -> bool:
        """Control, user-defined or unknown token: these are matched whole inside text (see tokenize)."""
        return bool(self._attrs[self._check_id(int(token_id))] & _SPECIAL_ATTRS)

    def is_control(self, token_id: int) -> bool:
        """Control/unknown token: hidden by detokenize(skip_special=True)."""
        return bool(self._attrs[self._check_id(int(token_id))] & _HIDDEN_ATTRS)

    @property
    def bos_text(self) -> str:
        return self._tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_text(self) -> str:
        return self._tokens[self.eos_id] if self.eos_id is not None else ""

    # ---- tokenize ---------------------------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of the text: llama.cpp's tokenizer_st_partition. Each special token in turn,
        longest first, splits every remaining text fragment at all its occurrences."""
        index = self._special_index[parse_special]
        if not index:
            return [text]
        keys = {text[i : i + 2] for i in range(len(text) - 1)} | set(text)
        candidates = sorted(e for k in keys if k in index for e in index[k])
        frags: list[str | int] = [text]
        for _, tok_text, tok_id, attr in candidates:
            if tok_text not in text:
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok_text not in frag:
                    new.append(frag)
                    continue
                while True:
                    at = frag.find(tok_text)
                    if at < 0:
                        if frag:
                            new.append(frag)
                        break
                    left, frag = frag[:at], frag[at + len(tok_text) :]
                    if attr & Attr.LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if attr & Attr.RSTRIP:
                        frag = frag.lstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(tok_id)
            frags = new
        return frags

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, identical to llama.cpp's llama_tokenize.

        add_special: add BOS/EOS where the model asks for them (tokenizer.ggml.add_bos_token/add_eos_token).
        parse_special: match control tokens such as <|im_start|> inside the text; when False they are
        tokenized as plain text (user-defined tokens are always matched, as in llama.cpp).

        >>> tok.tokenize("<|im_start|>user\\nHi<|im_end|>")
        [1, 4093, 198, 17530, 2]
        """
        self._check_text_model()
        if not isinstance(text, str):
            raise TypeError(f"tokenize() needs a str, got {type(text).__name__}")
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise TokenizerError("the model asks for a BOS token but tokenizer.ggml.bos_token_id is missing")
            out.append(self.bos_id)
        frags = self._partition(text, parse_special) if text else []
        encode = self._backend.encode
        if self.model == "llama":
            prev_special = True  # a leading space goes before the first fragment and after each special token
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                out += encode(frag.replace(" ", SPM_SPACE))
                prev_special = False
        else:
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out += encode(frag)
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError("the model asks for an EOS token but tokenizer.ggml.eos_token_id is missing")
            out.append(self.eos_id)
        return out

    # ---- detokenize -------------------------------------------------------------------------------------------
    def token_to_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for: byte-level BPE text decoded, '▁' -> ' ', <0xNN> -> that byte;
        control/user-defined tokens give their text."""
        return self.token_piece(token_id, special=True)

    def token_piece(self, token_id: int, special: bool = True) -> bytes:
        """llama.cpp's token_to_piece: control/unknown tokens are b'' unless `special`."""
        i = self._check_id(int(token_id))
        attr = int(self._attrs[i])
        if attr & _HIDDEN_ATTRS and not special:
            return b""
        piece = self._pieces[i]
        if piece is None:
            text = self._tokens[i]
            if attr & (_HIDDEN_ATTRS | Attr.USER_DEFINED):
                piece = text.encode("utf-8", "surrogatepass")
            elif attr & Attr.NORMAL:
                if self.model == "gpt2":
                    piece = _byte_level_decode(text)
                else:
                    piece = text.replace(SPM_SPACE, " ").encode("utf-8", "surrogatepass")
            elif attr & Attr.BYTE:
                piece = bytes((int(text[3:5], 16),))
            else:
                piece = b""  # unused/undefined tokens render as nothing
            self._pieces[i] = piece
        return piece

    def _first_piece_strip(self, ids: Sequence[int], skip_special: bool) -> tuple[int, bool]:
        """(index of the first id to render, whether its piece loses one leading space)."""
        start, strip = 0, self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            start, strip = 1, False
        return start, strip

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of token ids, as llama.cpp's llama_detokenize(remove_special=skip_special,
        unparse_special=not skip_special), decoded as UTF-8 with U+FFFD for invalid bytes.

        skip_special: hide control tokens (BOS, <|im_end|>, ...); user-defined tokens are always shown.
        """
        self._check_text_model()
        ids = [int(i) for i in ids]
        start, strip = self._first_piece_strip(ids, skip_special)
        end = len(ids)
        if skip_special and self.add_eos and end > start and ids[end - 1] == self.eos_id:
            end -= 1
        special = not skip_special
        pieces = [self.token_piece(i, special) for i in ids[start:end]]
        if pieces and strip and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]
        data = b"".join(pieces)
        if self.clean_spaces:
            data = clean_up_spaces(data)
        return data.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab})"


def load_tokenizer(metadata: dict) -> Tokenizer:
    """Build the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.

    Always returns a Tokenizer; for files without a vocabulary (model "none"/"no_vocab") its text methods
    raise TokenizerError and the model still runs on token ids.

    >>> tok = load_tokenizer(GGUFFile(path).metadata)
    """
    return Tokenizer(metadata)


__all__ = ["Attr", "PreTokenizer", "Tokenizer", "TokenizerError", "clean_up_spaces", "load_tokenizer"]
