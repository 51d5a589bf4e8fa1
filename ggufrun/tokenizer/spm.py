"""SentencePiece-style vocabularies ("llama"): llama.cpp's llm_tokenizer_spm, run by `sentencepiece`.

llm_tokenizer_spm (src/llama-vocab.cpp) merges the best-scoring adjacent pair whose concatenation is a token (ties
to the left) until none is left, and writes characters no token covers as <0xNN> byte tokens. sentencepiece's BPE
model (bpe_model.cc) runs the same loop, so spm_model_proto() serializes a ModelProto from the GGUF tokens and
scores (without the protobuf package) and SPMBackend loads it from memory. The caller has already turned spaces
into U+2581 and added the leading space (Tokenizer.tokenize). Checked in tests/test_tokenizer.py against a naive
merge loop and llama.cpp's token ids (Gemma3).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import TokenizerError
from .special import TYPE_BYTE

SPM_SPACE = "\u2581"  # SentencePiece's visible space "▁"


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


PROTO_BLOCK = 16384  # pieces serialized per block: bounds the int64 temporaries (~8 per byte of token text)


def _pieces_proto(pieces: list[str], scores: np.ndarray, piece_types: np.ndarray) -> bytes:
    """The ModelProto.pieces records of `pieces`, vectorised: piece text, score and type per record."""
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
    return out.tobytes()


def spm_model_proto(pieces: Sequence[str], scores: np.ndarray, piece_types: np.ndarray, unk_id: int,
                    byte_fallback: bool, extra: Sequence[str] = ()) -> bytes:  # fmt: skip
    """Serialize a sentencepiece ModelProto (BPE, identity normalizer) without the protobuf package.

    ModelProto: pieces=1 {piece=1 string, score=2 float, type=3 enum}, trainer_spec=2 {model_type=3,
    byte_fallback=35, unk_id=40, bos_id=41, eos_id=42, pad_id=43}, normalizer_spec=3 {name=1,
    add_dummy_prefix=3, remove_extra_whitespaces=4, escape_whitespaces=5}. The pieces are `pieces` then `extra`
    (scores and piece_types cover both). Vectorised, PROTO_BLOCK pieces at a time: 262k pieces in ~50 ms; in one
    block the temporaries took Gemma3's load +61 MB at their peak (and +41 MB that the allocator kept), in blocks
    +4 MB; `pieces` may be the reader's StringArray, read a block at a time.
    """
    n = len(pieces)
    bounds = [(i, min(i + PROTO_BLOCK, n)) for i in range(0, n, PROTO_BLOCK)]
    parts = [_pieces_proto(pieces[a:b], scores[a:b], piece_types[a:b]) for a, b in bounds]
    if extra:
        parts.append(_pieces_proto(list(extra), scores[n:], piece_types[n:]))

    def field(num: int, v: int) -> bytes:
        return _varint(num << 3) + _varint(v)

    trainer = field(3, 2) + field(35, int(byte_fallback)) + field(40, unk_id)
    trainer += field(41, -1) + field(42, -1) + field(43, -1)
    normalizer = b"\x0a\x08identity" + field(3, 0) + field(4, 0) + field(5, 0)
    parts += [b"\x12", _varint(len(trainer)), trainer, b"\x1a", _varint(len(normalizer)), normalizer]
    return b"".join(parts)


class SPMBackend:
    """llama.cpp's llm_tokenizer_spm run by sentencepiece's BPE model (bpe_model.cc: the same score-ordered
    pair merging, ties to the left, unknown characters as <0xNN> bytes). Every token is a NORMAL piece so
    that, as in llama.cpp, any vocabulary entry (control tokens included) can be the result of a merge."""

    def __init__(self, tokens: Sequence[str], scores: np.ndarray, types: np.ndarray, unk_id: int | None):
        import sentencepiece

        n = len(tokens)
        byte_ids = np.flatnonzero(types == TYPE_BYTE)
        byte_fallback = len(byte_ids) == 256 and {tokens[i] for i in byte_ids} == {f"<0x{b:02X}>" for b in range(256)}
        piece_types = np.ones(n, dtype=np.uint8)
        if byte_fallback:
            piece_types[byte_ids] = 6  # BYTE
        extra = []
        if unk_id is None or not 0 <= unk_id < n or piece_types[unk_id] != 1:
            # sentencepiece needs one UNKNOWN piece; add one past the vocabulary that no text can produce
            extra = ["\x01<unk>\x01"]
            scores = np.append(scores, np.float32(0))
            piece_types = np.append(piece_types, np.uint8(1))
            unk_id = n
        piece_types[unk_id] = 2  # UNKNOWN
        proto = spm_model_proto(tokens, scores, piece_types, unk_id, byte_fallback, extra)
        self.sp = sentencepiece.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(f"tokenizer.ggml.tokens: cannot build the SentencePiece model: {e}") from e

    def encode(self, text: str) -> list[int]:
        return self.sp.EncodeAsIds(text) if text else []
