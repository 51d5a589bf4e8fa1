"""Tokenizer from GGUF metadata (`tokenizer.ggml.*` keys only), giving the same token ids as llama.cpp.

tokenize(text) follows llama.cpp `src/llama-vocab.cpp` (llama_vocab::impl::tokenize):
    1. special-token partition (special.py, tokenizer_st_partition): control/unknown tokens (only with
       parse_special, and not inside literal_spans) and user-defined tokens (always) are cut out of the text,
       longest token text first;
    2. each remaining text fragment goes to the model's tokenizer:
       - "gpt2" (byte-level BPE, bpe.py): pre-tokenizer regexes chosen by `tokenizer.ggml.pre` (pretokenizer.py)
         split the fragment into words, and the merges of `tokenizer.ggml.merges` apply in rank order;
       - "llama" (SentencePiece-style, spm.py): spaces become U+2581 (plus one leading space after BOS/a special
         token when `add_space_prefix`), then the best-scoring adjacent pairs merge (llm_tokenizer_spm);
    3. BOS / EOS per `add_bos_token` / `add_eos_token`.

detokenize(ids) follows llama_vocab::impl::detokenize: per-token pieces (token_to_piece), one leading space
stripped from the first piece when `add_space_prefix`, llama.cpp's clean-up of spaces for BPE models
that ask for it (detokenizer.py), then UTF-8 decoding with U+FFFD for invalid bytes. StreamingDetokenizer
(detokenizer.py) does the same one token at a time.

A vocabulary is read once per model; its size is capped at MAX_VOCAB tokens (TokenizerError above it), which
bounds what a hostile file can make the loader allocate.

>>> tok = load_tokenizer(GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf").metadata)
>>> tok.tokenize("Hello, world!")
[19556, 28, 905, 17]
>>> tok.detokenize([19556, 28, 905, 17])
'Hello, world!'
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from ..errors import TokenizerError
from ..reader import StringArray
from .bpe import BPEBackend, decode_byte_level
from .detokenizer import StreamingDetokenizer, clean_up_spaces
from .pretokenizer import PRE_TYPES, PreTokenizer
from .special import (
    EOG_TEXTS,
    EOM_TEXTS,
    EOT_TEXTS,
    FIM_TEXTS,
    HIDDEN_ATTRS,
    SPECIAL_ATTRS,
    SPECIAL_ID_KEYS,
    TYPE_NORMAL,
    TYPE_TO_ATTR,
    Attr,
    SpecialTokenSplitter,
    check_literal_spans,
    read_special_id,
)
from .spm import SPM_SPACE, SPMBackend

# The largest vocabulary accepted. Real ones reach 262,144 (Gemma 3) and a few exceed 500k; 2**20 leaves room for
# those while capping what a hostile file can cost: a token takes ~300 bytes of Python objects here (its str, dict
# entry, attribute, piece cache, BPE/SentencePiece model; 2**20 synthetic tokens measured +290 MB peak RSS), where a
# 3M-token file of one-byte tokens (27 MB) grew to 2.1 GB.
MAX_VOCAB = 1 << 20
_ENCODE_CACHE_MAX_LEN = 256  # fragments up to this length are encoded once per tokenize() call

# texts Tokenizer._detect_special_tokens looks up (llama_vocab::impl::load)
_GPT_OSS_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # always rendered as text
_PHI3_RSTRIP = (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False))
_MASK_TEXT = "<mask>"
_DETECTED_TEXTS = frozenset(
    (*EOT_TEXTS, *EOM_TEXTS, *(t for texts in FIM_TEXTS.values() for t in texts), *EOG_TEXTS, *_GPT_OSS_TEXTS,
     *(t for t, _ in _PHI3_RSTRIP), _MASK_TEXT)
)  # fmt: skip


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build it with load_tokenizer(metadata).

    model: "gpt2" (byte-level BPE), "llama" (SentencePiece-style) or "none" (ids only: text methods raise
    TokenizerError). Token ids are plain ints; `eog_ids` are the ids that end generation.
    """

    def __init__(self, metadata: dict):
        md = metadata
        model = md.get("tokenizer.ggml.model")
        self.model: str = "none" if model in (None, "no_vocab") else str(model)
        self.pre: str | None = md.get("tokenizer.ggml.pre")
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
        self._tokens: Sequence[str] = []  # a list, or the reader's StringArray
        self._ids_by_text: dict[str, int] | None = None  # built on first use (_text_ids)
        self._attrs = np.zeros(0, dtype=np.uint16)
        self._splitter: SpecialTokenSplitter | None = None
        tokens = md.get("tokenizer.ggml.tokens")
        if self.model == "none" or tokens is None:
            if self.model != "none":
                self._unsupported = f"tokenizer.ggml.model is {self.model!r} but tokenizer.ggml.tokens is missing"
                self.model = "none"
            self.n_vocab: int = int(md.get(f"{md.get('general.architecture')}.vocab_size", 0))
            return

        scores, types = self._read_vocabulary(md, tokens)
        ids, regexes, ignore_merges = self._model_defaults()
        self._read_special_ids(md, ids)
        self._read_options(md)
        self._detect_special_tokens(ids, md)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = ids["bos"], ids["eos"], ids["unk"], ids["pad"]
        self.eot_id, self.eom_id = ids["eot"], ids["eom"]
        self._splitter = SpecialTokenSplitter(self._tokens, self._attrs)
        self._pieces: list[bytes | None] = [None] * self.n_vocab  # token_to_piece cache, filled on first use
        self._build_backend(md, scores, types, ids["unk"], regexes, ignore_merges)

    def _read_vocabulary(self, md: dict, tokens) -> tuple[np.ndarray, np.ndarray]:
        """Token texts (empty ones renamed as llama.cpp does), their attributes; returns (scores, types)."""
        if not isinstance(tokens, (list, tuple, StringArray)):
            raise TokenizerError(f"tokenizer.ggml.tokens is a {type(tokens).__name__}, expected an array of strings")
        if len(tokens) > MAX_VOCAB:
            raise TokenizerError(
                f"tokenizer.ggml.tokens has {len(tokens)} tokens, more than the {MAX_VOCAB} this loader accepts"
            )
        if isinstance(tokens, StringArray):  # the reader's bytes and offsets, decoded per token when read
            empty = np.flatnonzero(tokens.lengths() == 0).tolist()
            self._tokens = tokens if not empty else list(tokens)
        else:
            if not all(isinstance(t, str) for t in tokens):
                bad = next(t for t in tokens if not isinstance(t, str))
                raise TokenizerError(f"tokenizer.ggml.tokens holds a {type(bad).__name__}, expected strings only")
            self._tokens = list(tokens)
            empty = [i for i, t in enumerate(self._tokens) if not t]
        for i in empty:
            self._tokens[i] = f"[EMPTY_{i}]"
        n = self.n_vocab = len(self._tokens)
        scores = md.get("tokenizer.ggml.scores")
        types = md.get("tokenizer.ggml.token_type")
        try:
            scores = np.zeros(n, np.float32) if scores is None else np.asarray(scores, dtype=np.float32)[:n]
            types = np.full(n, TYPE_NORMAL, np.int32) if types is None else np.asarray(types, dtype=np.int64)[:n]
        except (TypeError, ValueError, OverflowError) as e:
            raise TokenizerError(f"tokenizer.ggml.scores/token_type must be arrays of numbers: {e}") from None
        if scores.ndim != 1 or types.ndim != 1 or len(scores) < n or len(types) < n:
            raise TokenizerError(
                f"tokenizer.ggml.scores/token_type have {len(scores)}/{len(types)} entries, expected {n} "
                "(one per token)"
            )
        self._attrs = TYPE_TO_ATTR[np.clip(types, 0, 6)].copy()
        self._attrs[(types < 0) | (types > 6)] = Attr.UNDEFINED
        return scores, types

    def _model_defaults(self) -> tuple[dict[str, int | None], list[str], bool]:
        """Per-model defaults, then per-pre options (llama_vocab::impl::load): returns (special ids by name, the
        pre-tokenizer regexes, ignore_merges). The default ids are llama.cpp's, for files that do not name them."""
        ids: dict[str, int | None] = dict.fromkeys(SPECIAL_ID_KEYS)
        regexes: list[str] = []
        ignore_merges = False
        if self.model == "llama":
            ids.update(bos=1, eos=2, unk=0)
            self.add_bos, self.add_space_prefix = True, True
        elif self.model == "gpt2":
            ids.update(bos=11, eos=11)
            self.clean_spaces = True
            pre = self.pre or "default"
            if self.pre is None:
                warnings.warn("tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer", stacklevel=4)
            if pre not in PRE_TYPES:
                warnings.warn(
                    f"tokenizer.ggml.pre {pre!r} is not supported (llama.cpp refuses it too): using the "
                    "'default' pre-tokenizer, tokens may differ from the model's training",
                    stacklevel=4,
                )
                pre = "default"
            regexes, opts = PRE_TYPES[pre]
            self.clean_spaces = opts.get("clean_spaces", True)
            ignore_merges = opts.get("ignore_merges", False)
            self.add_bos = opts.get("add_bos", False)
            if opts.get("no_bos"):
                ids["bos"] = None
        else:
            # the model still runs on token ids, and stops at the end-of-generation ids found below
            self._unsupported = f"tokenizer.ggml.model {self.model!r} is not supported (only 'gpt2' and 'llama')"
            warnings.warn(self._unsupported + ": text cannot be tokenized", stacklevel=4)
        return ids, regexes, ignore_merges

    def _read_special_ids(self, md: dict, ids: dict[str, int | None]) -> None:
        """Special-token ids named by the file replace the defaults; a default outside the vocabulary is dropped."""
        for name, key in SPECIAL_ID_KEYS.items():
            if key in md:
                ids[name] = read_special_id(md, key, self.n_vocab)
            elif ids[name] is not None and ids[name] >= self.n_vocab:
                ids[name] = None

    def _read_options(self, md: dict) -> None:
        """tokenizer.ggml.add_space_prefix / add_bos_token / add_eos_token override the model's defaults."""
        for key, attr in (("add_space_prefix", "add_space_prefix"), ("add_bos_token", "add_bos"),
                          ("add_eos_token", "add_eos")):  # fmt: skip
            value = md.get(f"tokenizer.ggml.{key}")
            if value is not None:
                setattr(self, attr, bool(value))

    def _build_backend(self, md: dict, scores, types, unk_id, regexes: list[str], ignore_merges: bool) -> None:
        """The model's own tokenizer for text fragments: byte-level BPE or SentencePiece."""
        if self.model == "gpt2":
            merges = md.get("tokenizer.ggml.merges")
            if merges is None:
                raise TokenizerError("tokenizer.ggml.model is 'gpt2' but tokenizer.ggml.merges is missing")
            self._backend = BPEBackend(self._text_ids(), merges, PreTokenizer(regexes), ignore_merges)
        elif self.model == "llama":
            self._backend = SPMBackend(self._tokens, scores, types, unk_id)
        else:
            self.model = "none"

    def _detect_special_tokens(self, ids: dict, md: dict) -> None:
        """End-of-turn/FIM/end-of-generation ids found by token text, with llama.cpp's attribute fixes."""
        if self._ids_by_text is not None:
            find = self._ids_by_text.get
        else:  # one pass over the texts looked up here, instead of a dictionary of the whole vocabulary
            find = {t: i for i, t in enumerate(self._tokens) if t in _DETECTED_TEXTS}.get

        def mark_control(i: int) -> None:
            self._attrs[i] |= Attr.CONTROL

        for name, texts in (("eot", EOT_TEXTS), ("eom", EOM_TEXTS), *FIM_TEXTS.items()):
            if ids[name] is None:
                found = [find(t) for t in texts if find(t) is not None]
                if found:
                    ids[name] = found[0]
                    mark_control(found[0])
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for t in EOG_TEXTS:
            i = find(t)
            if i is not None:
                eog.add(i)
                mark_control(i)
        # gpt-oss: these always render as text
        for t in _GPT_OSS_TEXTS:
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
            for i in np.flatnonzero(self._attrs & SPECIAL_ATTRS):
                self._attrs[i] |= Attr.RSTRIP
            for t, on in _PHI3_RSTRIP:
                i = find(t)
                if i is not None:
                    self._attrs[i] = (self._attrs[i] | Attr.RSTRIP) if on else (self._attrs[i] & ~Attr.RSTRIP)
        pre, arch = str(md.get("tokenizer.ggml.pre", "")), str(md.get("general.architecture", ""))
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if find(_MASK_TEXT) is not None:
                self._attrs[find(_MASK_TEXT)] |= Attr.LSTRIP

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
        return self._text_ids().get(text) if self._tokens else None

    def _text_ids(self) -> dict[str, int]:
        """Token text -> id (a repeated text maps to its last id), built on first use: 16 MB for Gemma3's 262k
        tokens, which a SentencePiece vocabulary needs only for token_id()."""
        if self._ids_by_text is None:
            self._ids_by_text = {t: i for i, t in enumerate(self._tokens)}
        return self._ids_by_text

    def is_special(self, token_id: int) -> bool:
        """Control, user-defined or unknown token: these are matched whole inside text (see tokenize)."""
        return bool(self._attrs[self._check_id(int(token_id))] & SPECIAL_ATTRS)

    def is_control(self, token_id: int) -> bool:
        """Control/unknown token: hidden by detokenize(skip_special=True)."""
        return bool(self._attrs[self._check_id(int(token_id))] & HIDDEN_ATTRS)

    @property
    def bos_text(self) -> str:
        return self._tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_text(self) -> str:
        return self._tokens[self.eos_id] if self.eos_id is not None else ""

    # ---- tokenize ---------------------------------------------------------------------------------------------
    def tokenize(
        self,
        text: str,
        add_special: bool = True,
        parse_special: bool = True,
        *,
        literal_spans: Sequence[tuple[int, int]] | None = None,
    ) -> list[int]:
        """Token ids of `text`, identical to llama.cpp's llama_tokenize.

        add_special: add BOS/EOS where the model asks for them (tokenizer.ggml.add_bos_token/add_eos_token).
        parse_special: match control tokens such as <|im_start|> inside the text; when False they are
        tokenized as plain text (user-defined tokens are always matched, as in llama.cpp).
        literal_spans: sorted, non-overlapping (start, end) character ranges of `text` (e.g. the user's content
        in a rendered chat) in which control token text is tokenized as plain text, as parse_special=False
        would; an occurrence that overlaps a span is not matched. Spans without such text change nothing.

        >>> tok.tokenize("<|im_start|>user\\nHi<|im_end|>")
        [1, 4093, 198, 17530, 2]
        """
        self._check_text_model()
        if not isinstance(text, str):
            raise TypeError(f"tokenize() needs a str, got {type(text).__name__}")
        spans = check_literal_spans(literal_spans, len(text)) if literal_spans is not None else []
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise TokenizerError(
                    "the model asks for a BOS token but has none (tokenizer.ggml.bos_token_id is missing or not a "
                    "token id)"
                )
            out.append(self.bos_id)
        frags = self._splitter.split(text, parse_special, spans)
        encode = self._backend.encode
        cache: dict[str, list[int]] = {}  # the same short fragment between special tokens is encoded once
        prev_special = True  # SPM: a leading space goes before the first fragment and after each special token
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.model == "llama":
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                frag = frag.replace(" ", SPM_SPACE)
            prev_special = False
            if len(frag) > _ENCODE_CACHE_MAX_LEN:
                out += encode(frag)
                continue
            ids = cache.get(frag)
            if ids is None:
                ids = cache[frag] = encode(frag)
            out += ids
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError(
                    "the model asks for an EOS token but has none (tokenizer.ggml.eos_token_id is missing or not a "
                    "token id)"
                )
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
        if attr & HIDDEN_ATTRS and not special:
            return b""
        piece = self._pieces[i]
        if piece is None:
            text = self._tokens[i]
            if attr & (HIDDEN_ATTRS | Attr.USER_DEFINED):
                piece = text.encode("utf-8", "surrogatepass")
            elif attr & Attr.NORMAL:
                if self.model == "gpt2":
                    piece = decode_byte_level(text)
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


__all__ = [
    "MAX_VOCAB",
    "Attr",
    "PreTokenizer",
    "StreamingDetokenizer",
    "Tokenizer",
    "TokenizerError",
    "clean_up_spaces",
    "load_tokenizer",
]
