"""Byte-level BPE ("gpt2" vocabularies): llama.cpp's llm_tokenizer_bpe_session, run by HF `tokenizers`.

Each pre-tokenized word (pretokenizer.py) has its UTF-8 bytes mapped to the GPT-2 byte alphabet
(src/unicode.cpp unicode_byte_to_utf8_map), then the lowest-rank adjacent pair of `tokenizer.ggml.merges` is merged
first (leftmost on ties) until no pair has a rank; with ignore_merges a word that is itself a token is taken whole.
HF's BPE model runs exactly that loop. decode_byte_level() is llama.cpp's llama_decode_text for token pieces.
Checked in tests/test_tokenizer.py against a naive merge loop and llama.cpp's token ids (SmolLM2).

Long runs of one character (a word of 10 MB of spaces) cost HF ~3 us per character, so a run is cut where the
merge loop provably never joins across the cut. For a character c let P = 2^J be the end of the doubling chain
(c,c) -> c^2, (c^2,c^2) -> c^4, ... whose merge ranks increase, when (2^(j+1), 2^j) lengths never merge before
(2^j, 2^j) does (checked per character in _run_block). Then the loop on c^N runs in sweeps: all (c,c) pairs merge
from the left (the lowest rank present, ties to the left), then all (c^2,c^2) pairs, ..., leaving c^P blocks from
the left; c^P never merges with c^P, and every other merge involves the leftovers at the end of the run, which can
take no more than the longest c-run token (Lmax characters) out of the blocks before them. So the first k blocks,
k = (N - 2P - Lmax) // P, are k tokens c^P, and the rest, starting at a multiple of every sweep's pair length,
evolves as the run c^(N - kP) alone. Words shorter than _RUN_MIN go to HF whole.
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


_RUN_MIN = 4096  # one-character words at least this long are cut into blocks (module docstring)


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
        self._vocab = vocab
        self._ranks = {pair: rank for rank, pair in enumerate(pairs)}
        self._run_blocks: dict[str, tuple[int, int, int] | None] = {}

    def _run_block(self, c: str) -> tuple[int, int, int] | None:
        """(P, id of c^P, Lmax) when runs of the character c can be cut into c^P blocks (module docstring)."""
        if c not in self._run_blocks:
            ranks, block, prev_rank = self._ranks, 1, -1
            while (c * block, c * block) in ranks:
                rank = ranks[(c * block, c * block)]
                front = ranks.get((c * 2 * block, c * block))
                if rank < prev_rank or (front is not None and front < rank):
                    self._run_blocks[c] = None
                    return None
                prev_rank, block = rank, block * 2
            longest = max((len(t) for t in self._vocab if t == c * len(t)), default=0)
            self._run_blocks[c] = (block, self._vocab[c * block], longest) if block > 1 else None
        return self._run_blocks[c]

    def _encode_words(self, words: list[str]) -> list[int]:
        return self.hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids if words else []

    def encode(self, text: str) -> list[int]:
        words = [w.encode("utf-8", "surrogatepass").decode("latin-1").translate(BYTE_TO_CHAR)
                 for w in self.pre.split(text)]  # fmt: skip
        if not any(len(w) >= _RUN_MIN for w in words):
            return self._encode_words(words)
        out: list[int] = []
        batch: list[str] = []
        for w in words:
            run = self._run_block(w[0]) if len(w) >= _RUN_MIN and w.count(w[0]) == len(w) else None
            if run is None:
                batch.append(w)
                continue
            block, block_id, longest = run
            k = max(0, (len(w) - 2 * block - longest) // block)
            out += self._encode_words(batch)
            out += [block_id] * k
            batch = [w[k * block :]]
        return out + self._encode_words(batch)
