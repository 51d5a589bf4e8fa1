"""Pre-tokenizers of byte-level BPE vocabularies: text -> words, exactly as llama.cpp splits them.

llama.cpp (src/llama-vocab.cpp, llm_tokenizer_bpe) picks a list of regexes by `tokenizer.ggml.pre` and runs them
with src/unicode.cpp unicode_regex_split: each regex splits every current piece further, the matches and the
text between them both becoming pieces. Regexes with \\p{..} classes run on "collapsed" text (every non-ASCII code
point replaced by one byte standing for its Unicode class); four common regexes run as hand-written code
(unicode_regex_split_custom_*), written here as equivalent Python regexes on the collapsed text.

PRE_TYPES maps each supported `tokenizer.ggml.pre` to (regexes, options), the options as llama_vocab::impl::load
sets them (clean_spaces, ignore_merges, add_bos, no_bos). Checked in tests/test_tokenizer.py against a full
Unicode regex engine (the `regex` package) and against llama.cpp's token ids.

>>> PreTokenizer(PRE_TYPES["gpt-2"][0]).split("Hello, world!")
['Hello', ',', ' world', '!']
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

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
PRE_TYPES: dict[str, tuple[list[str], dict]] = {}


def _pre(names: str, regexes: list[str], **options) -> None:
    for name in names.split():
        PRE_TYPES[name] = (regexes, options)


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
