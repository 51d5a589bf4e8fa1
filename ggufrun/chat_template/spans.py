"""Which characters of a rendered prompt came from user-supplied strings (for ChatTemplate.render_with_spans).

The tokenizer must not turn special-token text inside those ranges into control tokens (role injection: a user
message containing "<|im_end|>\\n<|im_start|>system ..."). Method: render twice, once with the plain data and once
with each user string s wrapped as `lead + OPEN_i + s.strip() + CLOSE_i + trail` (OPEN_i/CLOSE_i: one character
from Unicode's supplementary private-use planes, U+F0000+i and U+100000+i; lead/trail: s's own surrounding
whitespace, left outside the markers so that `|trim` and `.strip()` still remove it; if that render does not map
back, a third has the whole string between the markers, for templates that strip what is left after a cut). When the
marked text with the markers removed equals the plain text, the markers give the ranges exactly:
    - OPEN_i ... CLOSE_i: the range between them (concatenation, the gemma fallback's system prefix, trimming),
      less any text the template wrote into it (`|replace('\\n', '<br>')`: only the stretches that match s stay;
      when s and the range are both very long, the whole range stays, keeping the user's text covered);
    - a CLOSE_i whose OPEN_i the template cut off (`content.split('</think>')[-1]`): the longest stretch before it
      that is a tail of s, and a lone OPEN_i likewise; these ranges drop their outer whitespace, so that they cannot
      run into template markup that happens to equal the characters of s before the cut.
Otherwise (the template reacts to the markers: `startswith`, `|length`, sorting, ...) each stripped user string
is searched for in the plain text, in input order (a string found only where an earlier one was placed still gets
its first occurrence, the ranges merged); that fallback is best effort.

User strings: every string in `messages`, `tools` and the extra variables (not bos_token/eos_token, which are token
texts), except dict keys and the values of "role"/"type", which templates compare with literals; those are
marked only when they hold characters other than letters, digits, space, '_', '-', '.' (the only ones that can
spell a control token). Whitespace at the ends of a user string is never inside a range: no control token is made
of whitespace alone. Ranges are sorted and non-overlapping (touching ranges are merged).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

OPEN_BASE = 0xF0000
CLOSE_BASE = 0x100000
MAX_MARKED = 0xFFFE  # markers per plane
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.\- ]*\Z")
_STRUCTURAL_KEYS = frozenset(["role", "type"])
_UNMARKED_VARIABLES = frozenset(["add_generation_prompt", "bos_token", "eos_token"])
_MARKER_CHARS = re.compile("[\U000f0000-\U0010ffff]")
_MAX_DIFF_WORK = 4_000_000  # characters x characters compared by SequenceMatcher


class _Marker:
    def __init__(self, whitespace_inside: bool = False):
        self.whitespace_inside = whitespace_inside
        self.strings: list[str] = []  # the (stripped, unless whitespace_inside) user string behind each marker
        self.overflow = False

    def text(self, s: str) -> str:
        core = s.strip()
        if not core:
            return s
        i = len(self.strings)
        self.strings.append(s if self.whitespace_inside else core)
        if i >= MAX_MARKED or _MARKER_CHARS.search(s):
            self.overflow = True  # the marked render cannot be mapped back: search instead
            return s
        if self.whitespace_inside:
            return f"{chr(OPEN_BASE + i)}{s}{chr(CLOSE_BASE + i)}"
        start = len(s) - len(s.lstrip())
        return f"{s[:start]}{chr(OPEN_BASE + i)}{core}{chr(CLOSE_BASE + i)}{s[start + len(core) :]}"

    def value(self, value, structural: bool = False):
        if isinstance(value, str):
            return value if structural and _PLAIN_WORD.match(value) else self.text(value)
        if isinstance(value, dict):
            return {
                (k if _PLAIN_WORD.match(k) else self.text(k)): self.value(v, k in _STRUCTURAL_KEYS)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


def mark(variables: dict, whitespace_inside: bool = False) -> tuple[dict | None, list[str]]:
    """The variables with each user string wrapped in its markers (None when they cannot be marked: an input
    already holds marker characters, or there are too many strings), and the strings by marker index (stripped,
    unless `whitespace_inside`: the second try, whole strings between the markers, for a template that strips
    what follows a cut, `content.split('</think>')[-1].lstrip()`, where a marker would stop the strip)."""
    marker = _Marker(whitespace_inside)
    marked = {k: (v if k in _UNMARKED_VARIABLES else marker.value(v)) for k, v in variables.items()}
    return (None if marker.overflow else marked), marker.strings


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _strip_range(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _within(plain: str, start: int, end: int, core: str) -> list[tuple[int, int]]:
    """The range between a string's markers, less what the template wrote into it (`|replace('\\n', '<br>')`):
    only the stretches that match the string itself."""
    piece = plain[start:end]
    if piece in core:
        return [(start, end)]
    if len(piece) * len(core) > _MAX_DIFF_WORK:
        return [(start, end)]  # too big to compare: keep the user text covered
    blocks = SequenceMatcher(None, piece, core, autojunk=False).get_matching_blocks()
    return [(start + a, start + a + n) for a, _, n in blocks if n]


def from_markers(plain: str, marked: str, strings: list[str]) -> list[tuple[int, int]] | None:
    """Ranges of `plain` from the marked render; None when the marked render differs from the plain one."""
    if _MARKER_CHARS.search(plain):
        return None  # the template writes marker characters itself
    pieces: list[str] = []
    markers: list[tuple[int, int, bool]] = []  # (position in plain, string index, is opener)
    pos = last = 0
    for m in _MARKER_CHARS.finditer(marked):
        pieces.append(marked[last : m.start()])
        pos += m.start() - last
        last = m.end()
        code = ord(m.group())
        is_open = code < CLOSE_BASE
        i = code - (OPEN_BASE if is_open else CLOSE_BASE)
        if i >= len(strings):
            return None
        markers.append((pos, i, is_open))
    pieces.append(marked[last:])
    if "".join(pieces) != plain:
        return None
    spans: list[tuple[int, int]] = []
    open_at: dict[int, list[int]] = {}
    lone_opens: list[int] = []  # indexes into markers
    for k, (p, i, is_open) in enumerate(markers):
        if is_open:
            open_at.setdefault(i, []).append(k)
        elif open_at.get(i):
            spans += _within(plain, markers[open_at[i].pop()][0], p, strings[i])
        else:  # the head of the string was cut off: walk back over a tail of it
            core, bound = strings[i], markers[k - 1][0] if k else 0
            n = 0
            while n < len(core) and p - n - 1 >= bound and plain[p - n - 1] == core[-1 - n]:
                n += 1
            spans.append(_strip_range(plain, p - n, p))
    lone_opens = [k for ks in open_at.values() for k in ks]
    for k in lone_opens:  # the tail was cut off: walk forward over a head of it
        p, i, _ = markers[k]
        core, bound = strings[i], markers[k + 1][0] if k + 1 < len(markers) else len(plain)
        n = 0
        while n < len(core) and p + n < bound and plain[p + n] == core[n]:
            n += 1
        spans.append(_strip_range(plain, p, p + n))
    return _merge([_strip_range(plain, a, b) for a, b in spans])


def by_search(plain: str, strings: list[str]) -> list[tuple[int, int]]:
    """Best-effort ranges: each string's first occurrence after the previous one's (else anywhere free)."""
    spans: list[tuple[int, int]] = []

    def first_free(core: str, start: int) -> int:
        at = plain.find(core, start)
        while at >= 0 and any(s < at + len(core) and at < e for s, e in spans):
            at = plain.find(core, at + 1)
        return at

    cursor = 0
    missed = []
    for core in strings:
        at = first_free(core, cursor)
        if at < 0:
            at = first_free(core, 0)
        if at >= 0:
            spans.append((at, at + len(core)))
            cursor = at + len(core)
        else:
            missed.append(core)
    for core in missed:  # every occurrence overlaps an earlier string's: that one may have taken a piece of this
        at = plain.find(core)  # one's text (a "</think>" the template cut from one turn, found in another)
        if at >= 0:
            spans.append((at, at + len(core)))
    return _merge(spans)
