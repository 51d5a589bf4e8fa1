"""GGUF reader: one read-only mmap per file, metadata parsed up front, tensors as zero-copy NumPy views.

File layout (GGUF v2/v3, little-endian; see llama.cpp `ggml/src/gguf.cpp` and gguf-py `gguf_reader.py`):
    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x  (key: string, value_type: u32, value)
    n_tensors x (name: string, n_dims: u32, ne: u64[n_dims] (innermost first), ggml_type: u32, offset: u64)
    padding to `general.alignment` (default 32)
    tensor data, each tensor at data_start + offset
where string = (len: u64, utf-8 bytes) and an array value = (elem_type: u32, count: u64, elements).

Every count, length and offset is checked against the file before it is used, so a hostile file gives a
GGUFError naming the field and byte offset, never a huge allocation, a crash or a hang. Opening reads only the
header: tensor data stays on disk until a view of it is read. Metadata values are Python scalars and strings,
NumPy arrays for arrays of numbers, lists for arrays of strings, or a StringArray (UTF-8 bytes and offsets, decoded
per item) for arrays of LAZY_STRINGS strings or more: a vocabulary, merges.

A split model is NAME-00001-of-0000N.gguf ... NAME-0000N-of-0000N.gguf, each shard a full GGUF file with
`split.no` / `split.count` / `split.tensors.count` (llama.cpp `examples/gguf-split`); the metadata lives in the
first shard and the tensors are spread over all of them.
"""

from __future__ import annotations

import mmap
import operator
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import GGUFError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8  # llama.cpp refuses nested arrays outright; we read a few levels, never a bomb
MAX_NESTED_ARRAYS = 1 << 16  # per file: a Python object per 12-byte nested array would outgrow the file
MAX_SPLITS = 9999  # the -NNNNN-of-NNNNN.gguf name has five digits
LAZY_STRINGS = 4096  # string arrays at least this long are read as StringArray, shorter ones as lists

# GGUF metadata value types (gguf-py constants.GGUFValueType)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VALUE_TYPE_NAMES = [
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
]  # fmt: skip
_SCALAR_STRUCTS = {
    UINT8: struct.Struct("<B"),
    INT8: struct.Struct("<b"),
    UINT16: struct.Struct("<H"),
    INT16: struct.Struct("<h"),
    UINT32: struct.Struct("<I"),
    INT32: struct.Struct("<i"),
    FLOAT32: struct.Struct("<f"),
    BOOL: struct.Struct("<B"),
    UINT64: struct.Struct("<Q"),
    INT64: struct.Struct("<q"),
    FLOAT64: struct.Struct("<d"),
}
_SCALAR_DTYPES = {t: np.dtype(s.format) for t, s in _SCALAR_STRUCTS.items()}  # BOOL reads as uint8

# Looking a type up in a dict is ~50x faster than calling the enum; this runs once per tensor.
_GGML_TYPES = {int(t): t for t in GGMLQuantizationType}

# Typed NumPy views for the plain number types; everything else is a view of raw uint8 blocks.
# BF16 has no NumPy dtype: its view is uint16 (the high half of a float32).
_FLOAT_VIEW_DTYPES = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.BF16: np.dtype("<u2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("<i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    shape: NumPy order (rows last-but-one, the innermost GGUF dimension last).
    data:  zero-copy view into the mmap: typed for F32/F16/F64/I* (BF16 as uint16), raw uint8 blocks
           of shape (*shape[:-1], shape[-1] // block_size * type_size) for quantized types.
    """

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in `file`
    nbytes: int
    data: np.ndarray
    file: Path

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class StringArray(Sequence[str]):
    """A metadata array of strings kept as its UTF-8 bytes and offsets; an item is decoded when it is read.

    Arrays of at least LAZY_STRINGS strings (vocabularies and merges) come as this instead of a list: Gemma 3's
    262,144 tokens take 4.7 MB here (2.6 MB of text and NULs, 2.1 MB of offsets) against 21 MiB as Python strings.
    The bytes were checked to be UTF-8 when the file was opened, so reading an item cannot fail. Compares equal to
    any list or tuple of the same strings.
    """

    __slots__ = ("_data", "_starts")

    def __init__(self, data: bytes, starts: np.ndarray):
        # data: each string preceded by one NUL; starts (n + 1): where string i begins (after its NUL), and
        # len(data) + 1 last, so that string i is data[starts[i] : starts[i + 1] - 1]
        self._data, self._starts = data, starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return [self._item(j) for j in range(a, b, step)]
            if a >= b:
                return []
            # one decode and one split for the run (no string holds a NUL: the reader checked)
            return self._data[int(self._starts[a]) - 1 : int(self._starts[b]) - 1].decode("utf-8").split("\x00")[1:]
        n = len(self)
        i = operator.index(i)  # an integer (NumPy integers included), as a list takes
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string array index {i} out of range for {n} strings")
        return self._item(i)

    def _item(self, i: int) -> str:
        return self._data[int(self._starts[i]) : int(self._starts[i + 1]) - 1].decode("utf-8")

    def __iter__(self):
        for lo in range(0, len(self), 4096):  # a block of strings at a time, not all at once
            yield from self[lo : lo + 4096]

    def lengths(self) -> np.ndarray:
        """Each string's length in UTF-8 bytes."""
        return np.diff(self._starts) - 1

    def __eq__(self, other):
        if isinstance(other, StringArray):
            return self._data == other._data and np.array_equal(self._starts, other._starts)
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # like a list

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; every failure names the field and offset."""

    __slots__ = ("buf", "pos", "size", "path", "nested_left")

    def __init__(self, buf, path: Path, pos: int = 0):
        self.buf = buf
        self.pos = pos
        self.size = len(buf)
        self.path = path
        self.nested_left = MAX_NESTED_ARRAYS

    def fail(self, what: str, at: int | None = None) -> GGUFError:
        at = self.pos if at is None else at
        return GGUFError(f"{self.path}: {what} (at byte offset {at})")

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise self.fail(f"truncated file: {what} needs {n} bytes, {self.size - self.pos} remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what}: string length {n} runs past the end of the file ({self.size} bytes)", start)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: string is not valid UTF-8 ({e.reason})", start + 8 + e.start) from None

    def scalar(self, vtype: int, what: str):
        st = _SCALAR_STRUCTS[vtype]
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return bool(v) if vtype == BOOL else v

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype == STRING:
            return self.string(what)
        if vtype in _SCALAR_STRUCTS:
            return self.scalar(vtype, what)
        if vtype != ARRAY:
            raise self.fail(f"{what}: unknown metadata value type {vtype} (expected 0..12)", self.pos - 4)
        at = self.pos
        if depth >= MAX_ARRAY_NESTING:
            raise self.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_NESTING} levels", at)
        etype = self.u32(f"{what} array element type")
        count = self.u64(f"{what} array element count")
        if etype in _SCALAR_DTYPES:
            dt = _SCALAR_DTYPES[etype]
            if count > (self.size - self.pos) // dt.itemsize:
                raise self.fail(
                    f"{what}: array of {count} x {VALUE_TYPE_NAMES[etype]} runs past the end of the file", at
                )
            # A copy, so that metadata does not pin the mmap open after close().
            arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
            self.pos += count * dt.itemsize
            return arr.astype(bool) if etype == BOOL else arr
        if etype == STRING:
            if count > (self.size - self.pos) // 8:
                raise self.fail(f"{what}: array of {count} strings cannot fit in the file", at)
            return self.string_array(count, what)
        if etype == ARRAY:
            # Each nested array takes at least 12 bytes (element type + count): the count is bounded by
            # the file, and the depth by MAX_ARRAY_NESTING, so no bomb gets through.
            if count > (self.size - self.pos) // 12:
                raise self.fail(f"{what}: array of {count} arrays cannot fit in the file", at)
            self.nested_left -= count
            if self.nested_left < 0:
                raise self.fail(f"{what}: more than {MAX_NESTED_ARRAYS} nested arrays in the file", at)
            return [self.value(ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise self.fail(f"{what}: unknown array element type {etype} (expected 0..12)", at)

    # -- arrays of strings: the one hot spot of opening a file (262,144 tokens for Gemma 3) ------------

    def string_array(self, count: int, what: str) -> list[str] | StringArray:
        """`count` consecutive (u64 length, bytes) strings, parsed with NumPy instead of a Python loop."""
        if count == 0:
            return []
        fields, lengths = self._string_fields(count, what)
        self.pos = int(fields[-1] + 8 + lengths[-1])
        return self._decode_strings(fields, lengths, what)

    def _string_fields(self, count: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Byte offsets of the length fields of `count` chained strings starting at self.pos, and the lengths.

        Where string i+1 starts depends on the length of string i, so the offsets form a chain that a
        Python loop walks one step at a time (~0.3 us a step). Instead, guess every length field in a window
        of the buffer at once, then *prove* the guess: string 0's field is at pos, and if guessed field i+1
        sits exactly at field_i + 8 + length_i for all i < k, the first k guesses are the true chain, by
        induction. Guessing: a u64 read at a byte offset is a length field candidate when it is a plausible
        length (fits in the rest of the file); text bytes make huge u64s, so only the positions at and just
        before real length fields (whose high bytes are zero) pass, and of each run of adjacent candidates the
        last one is the field. A wrong guess only shortens the proven prefix and the walk resumes after it.
        Cost stays proportional to progress: the window grows while guesses hold and shrinks after a miss,
        and after 64 passes that proved little (not a vocabulary, or a hostile one) the plain loop finishes.
        """
        out_fields, out_lengths = [], []
        pos, left, size = self.pos, count, self.size
        cap = 1 << 20  # bytes scanned per pass
        bytes_per_string = 16.0  # 8-byte length + text, measured as we go; bounds the last window
        unprofitable = 0
        while left and unprofitable < 64:
            wlen = min(size - pos, cap, int(left * bytes_per_string * 1.5) + 4096)
            proven = self._proven_chain(pos, wlen, left)
            if proven is None:
                f, n = self._walk_strings(pos, 1, what, count - left)
                unprofitable += 1
                cap = 1 << 16
            else:
                f, n, window_end = proven
                used = int(f[-1] + 8 + n[-1]) - pos
                bytes_per_string = used / len(f)
                unprofitable += len(f) < 64
                cap = min(cap * 4, 1 << 26) if window_end else max(2 * used, 1 << 16)
            out_fields.append(f)
            out_lengths.append(n)
            left -= len(f)
            pos = int(f[-1] + 8 + n[-1])
        if left:
            f, n = self._walk_strings(pos, left, what, count - left)
            out_fields.append(f)
            out_lengths.append(n)
        fields = np.concatenate(out_fields) if len(out_fields) > 1 else out_fields[0]
        lengths = np.concatenate(out_lengths) if len(out_lengths) > 1 else out_lengths[0]
        return fields, lengths

    def _proven_chain(self, pos: int, wlen: int, limit: int):
        """(fields, lengths, hit_window_end) for the longest proven chain (<= limit strings) from pos, or None."""
        if wlen < 8:
            return None
        remain = self.size - pos
        # u64 at every byte offset of the window (an overlapping, unaligned strided view: no copy).
        u64s = np.ndarray((wlen - 7,), dtype="<u8", buffer=self.buf, offset=pos, strides=(1,))
        plausible = u64s <= remain - 8
        last_of_run = plausible.copy()
        last_of_run[:-1] &= ~plausible[1:]
        n_cand = int(np.count_nonzero(last_of_run))
        # Real fields are >= 8 bytes apart; many more candidates than that means this is not a string array
        # (or a hostile one): do not allocate for them.
        if n_cand == 0 or n_cand > wlen // 8 + 1:
            return None
        cand = np.flatnonzero(last_of_run)  # relative offsets, int64
        if cand[0] != 0:
            return None
        lens = u64s[cand].astype(np.int64)  # < remain, so no overflow
        nxt = cand + 8 + lens
        m = min(len(cand), limit)
        broken = np.flatnonzero(nxt[: m - 1] != cand[1:m])
        k = int(broken[0]) + 1 if len(broken) else m
        if nxt[k - 1] > remain:
            k -= 1  # the last string runs past the end of the file: let the plain loop report it
            if k == 0:
                return None
        # The chain may only stop early at the window's end (the next field lies beyond it).
        window_end = not len(broken) and k < limit
        return cand[:k] + pos, lens[:k], window_end

    def _walk_strings(self, pos: int, n: int, what: str, first: int) -> tuple[np.ndarray, np.ndarray]:
        """The plain loop: n chained strings from pos, one step at a time (fallback for odd arrays)."""
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        fields = np.empty(n, dtype=np.int64)
        lengths = np.empty(n, dtype=np.int64)
        for i in range(n):
            if pos + 8 > size:
                raise self.fail(f"truncated file: {what}[{first + i}] length needs 8 bytes", pos)
            (ln,) = unpack(buf, pos)
            if ln > size - pos - 8:
                raise self.fail(
                    f"{what}[{first + i}]: string length {ln} runs past the end of the file ({size} bytes)", pos
                )
            fields[i] = pos
            lengths[i] = ln
            pos += 8 + ln
        return fields, lengths

    def _decode_strings(self, fields: np.ndarray, lengths: np.ndarray, what: str) -> list[str] | StringArray:
        """Check the strings with one UTF-8 decode instead of one per string; return them as a list (split from
        that decode) or, from LAZY_STRINGS strings on, as a StringArray of the bytes."""
        start, end = int(fields[0]), int(fields[-1] + 8 + lengths[-1])
        region = np.frombuffer(self.buf, dtype=np.uint8, count=end - start, offset=start)
        # Drop bytes 0..6 of each 8-byte length and keep byte 7, which is 0 for any length < 2^56: it
        # becomes a NUL separator in front of each string.
        keep = np.ones(end - start, dtype=bool)
        rel = fields - start
        for k in range(7):
            keep[rel + k] = False
        joined = region[keep]
        if np.count_nonzero(joined == 0) != len(fields):
            # Some string holds a NUL byte itself: decode one by one.
            return self._decode_each(fields, lengths, what)
        data = joined.tobytes()
        del joined
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            # A separator (0x00) is a whole character, so a bad sequence lies inside one string.
            seps = np.cumsum(np.concatenate(([0], lengths[:-1] + 1)))  # separator index of each string
            i = int(np.searchsorted(seps, e.start, side="right")) - 1
            at = int(fields[i] + 8 + (e.start - seps[i] - 1))
            raise self.fail(f"{what}[{i}]: string is not valid UTF-8 ({e.reason})", at) from None
        if len(fields) < LAZY_STRINGS:
            return text.split("\x00")[1:]
        del text
        starts = np.empty(len(fields) + 1, dtype=np.int64)
        starts[0] = 1
        np.cumsum(lengths + 1, out=starts[1:])
        starts[1:] += 1
        return StringArray(data, starts)

    def _decode_each(self, fields: np.ndarray, lengths: np.ndarray, what: str) -> list[str]:
        mv = memoryview(self.buf)
        out = []
        try:
            for i, (f, n) in enumerate(zip(fields.tolist(), lengths.tolist())):
                try:
                    out.append(str(mv[f + 8 : f + 8 + n], "utf-8"))
                except UnicodeDecodeError as e:
                    raise self.fail(f"{what}[{i}]: string is not valid UTF-8 ({e.reason})", f + 8 + e.start) from None
        finally:
            mv.release()
        return out


def _sniff_not_gguf(head: bytes, path: Path) -> GGUFError:
    """Say what a non-GGUF file looks like, and how to get a GGUF. Nothing here unpickles anything."""
    convert = "convert the original model with llama.cpp's convert_hf_to_gguf.py"

    def refuse(what: str, advice: str = convert) -> GGUFError:
        return GGUFError(f"{path}: not a GGUF file: {what} (magic at byte offset 0: {head[:4]!r}); {advice}")

    if head[:4] == b"FUGG":
        return refuse("a big-endian GGUF file, which is not supported", "use a little-endian GGUF")
    if head[:4] == b"PK\x03\x04":
        return refuse("a zip archive (a PyTorch .pt/.bin checkpoint?); it was not unpickled")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return refuse("a Python pickle (a legacy PyTorch .bin/.pt checkpoint?); it was not unpickled")
    # safetensors: u64 length of a JSON header, then the header
    if len(head) >= 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 1 << 30:
        return refuse("a safetensors file")
    if head[:4] in (b"ggml", b"ggmf", b"ggjt", b"lmgg", b"fmgg", b"tjgg"):
        return refuse("a pre-GGUF GGML/GGJT file", "re-convert the original model to GGUF with llama.cpp")
    return refuse("expected the magic b'GGUF'", "is this a GGUF model file?")


class _Shard:
    """One mmapped GGUF file: header, metadata and tensor table."""

    def __init__(self, path: Path):
        self.path = path
        self.mm = None
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                head = f.read(24)
                if GGUF_MAGIC.startswith(head[:4]):  # empty, a cut magic, or a cut header
                    raise GGUFError(
                        f"{path}: truncated file: {size} bytes is smaller than a GGUF header (24 bytes) "
                        f"(at byte offset {size})"
                    )
                raise _sniff_not_gguf(head, path)
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = size
        try:
            self._parse(size)
        except BaseException:
            self.close()
            raise

    def _parse(self, size: int) -> None:
        mm, path = self.mm, self.path
        if mm[:4] != GGUF_MAGIC:
            raise _sniff_not_gguf(mm[:16], path)
        c = _Cursor(mm, path, 4)
        version = c.u32("version")
        if version == 1:
            raise c.fail("GGUF version 1 is not supported (only v2 and v3); re-convert the model", 4)
        if version not in (2, 3):
            if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
                # The magic reads the same either way; the version gives a big-endian file away.
                raise c.fail("big-endian GGUF files are not supported; use a little-endian GGUF", 4)
            raise c.fail(f"unsupported GGUF version {version} (expected 2 or 3)", 4)
        self.version = version
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("metadata key/value count")
        # Each KV needs >= 8 (key length) + 1 (key) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8.
        if n_kv > (size - c.pos) // 14:
            raise c.fail(f"metadata key/value count {n_kv} cannot fit in the file ({size} bytes)", 16)
        if n_tensors > (size - c.pos) // 32:
            raise c.fail(f"tensor count {n_tensors} cannot fit in the file ({size} bytes)", 8)

        meta: dict[str, object] = {}
        types: dict[str, int] = {}
        value_at: dict[str, int] = {}
        for i in range(n_kv):
            at = c.pos
            key = c.string(f"metadata key #{i}")
            if not key:
                raise c.fail(f"metadata key #{i} is empty", at)
            if key in meta:
                raise c.fail(f"duplicate metadata key {key!r}", at)
            vtype = c.u32(f"value type of {key!r}")
            if vtype > FLOAT64:
                raise c.fail(f"{key!r}: unknown metadata value type {vtype} (expected 0..12)", c.pos - 4)
            value_at[key] = c.pos
            meta[key] = c.value(vtype, key)
            types[key] = vtype
        self.metadata = meta
        self.value_types = types

        alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in meta:
            at = value_at["general.alignment"]
            if types["general.alignment"] != UINT32:
                raise c.fail(
                    f"general.alignment must be a UINT32, got {VALUE_TYPE_NAMES[types['general.alignment']]}",
                    at,
                )
            if alignment == 0 or alignment & (alignment - 1):
                raise c.fail(f"general.alignment must be a power of two, got {alignment}", at)
        self.alignment = alignment

        infos = []
        names = set()
        for i in range(n_tensors):
            at = c.pos
            name = c.string(f"tensor #{i} name")
            if name in names:
                raise c.fail(f"duplicate tensor name {name!r}", at)
            names.add(name)
            dims_at = c.pos
            n_dims = c.u32(f"tensor {name!r} n_dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise c.fail(f"tensor {name!r}: n_dims is {n_dims}, expected 1..{MAX_DIMS}", dims_at)
            ne = [c.u64(f"tensor {name!r} dimension {d}") for d in range(n_dims)]
            type_at = c.pos
            ttype = c.u32(f"tensor {name!r} type")
            offset_at = c.pos
            offset = c.u64(f"tensor {name!r} data offset")
            infos.append((name, ne, ttype, offset, dims_at, type_at, offset_at))

        self.data_start = data_start = (c.pos + alignment - 1) // alignment * alignment
        if n_tensors and data_start > size:
            raise c.fail(
                f"truncated file: tensor data should start at byte {data_start} but the file has {size} bytes",
                c.pos,
            )

        self.tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, ne, ttype, offset, dims_at, type_at, offset_at in infos:
            qtype = _GGML_TYPES.get(ttype)
            if qtype is None:
                raise c.fail(f"tensor {name!r} has unknown ggml type {ttype}", type_at)
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_el = 1
            for d, n in enumerate(ne):
                if n == 0:
                    raise c.fail(f"tensor {name!r} dimension {d} is 0; every dimension must be >= 1", dims_at)
                if n > _INT64_MAX:
                    raise c.fail(f"tensor {name!r} dimension {d} is {n}, more than int64 can hold", dims_at)
                n_el *= n
            if n_el > _INT64_MAX:
                raise c.fail(f"tensor {name!r} shape {ne} has {n_el} elements, more than int64 can count", dims_at)
            if ne[0] % block:
                raise c.fail(
                    f"tensor {name!r} row length {ne[0]} is not a multiple of the {qtype.name} block size {block}",
                    dims_at,
                )
            nbytes = n_el // block * type_size
            if offset % alignment:
                raise c.fail(f"tensor {name!r} data offset {offset} is not aligned to {alignment} bytes", offset_at)
            start = data_start + offset
            if start + nbytes > size:
                raise c.fail(
                    f"tensor {name!r} data [{start}, {start + nbytes}) runs past the end of the file ({size} bytes)",
                    offset_at,
                )
            shape = tuple(reversed(ne))
            if qtype in _FLOAT_VIEW_DTYPES:
                data = np.frombuffer(mm, dtype=_FLOAT_VIEW_DTYPES[qtype], count=n_el, offset=start)
                data = data.reshape(shape)
            else:
                data = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start)
                data = data.reshape(*shape[:-1], shape[-1] // block * type_size)
            self.tensors[name] = TensorInfo(name, qtype, shape, start, nbytes, data, path)
            spans.append((start, start + nbytes, name, offset_at))
        spans.sort()
        for (_s0, e0, n0, _), (s1, _e1, n1, at1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise c.fail(f"tensors {n0!r} and {n1!r} overlap (file bytes {s1}..{e0})", at1)

    def release_pages(self, view: np.ndarray) -> bool:
        """Tell the OS this process no longer needs the whole pages under `view` (a view into this shard's map);
        they stay in the page cache and are read again on a later access. Whether the view lies in this map."""
        if self.mm is None or view.size == 0:
            return False
        base = np.frombuffer(self.mm, dtype=np.uint8).ctypes.data
        start = view.ctypes.data - base
        end = start + view.nbytes
        if not (0 <= start and end <= self.size and view.flags.c_contiguous):
            return False
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page
        if last > first and hasattr(self.mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self.mm.madvise(mmap.MADV_DONTNEED, first, last - first)
        return True

    def close(self) -> None:
        if self.mm is not None:
            self.tensors = {}
            try:
                self.mm.close()
            except BufferError:
                # NumPy views handed out earlier still point into the map; it closes when they are freed.
                pass
            self.mm = None


_SHARD_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


class GGUFFile:
    """A GGUF model file (or the first shard of a split model), opened read-only and zero-copy.

    metadata:    key -> value (scalars as Python values, numeric arrays as NumPy arrays, string arrays
                 as list[str]); value_types: key -> GGUF value type number (gguf.GGUFValueType).
    tensors:     name -> TensorInfo, across all shards of a split model.

    >>> with GGUFFile("model.gguf") as f:
    ...     f.metadata["general.architecture"], f.tensors["token_embd.weight"].shape
    ('llama', (49152, 576))
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no such GGUF file: {self.path}")
        if self.path.is_dir():
            raise GGUFError(f"{self.path} is a directory, not a GGUF file")
        self.tensors: dict[str, TensorInfo] = {}
        first = _Shard(self.path)
        self.shards = [first]
        try:
            self._open_splits(first)
            for shard in self.shards:
                for name, t in shard.tensors.items():
                    if name in self.tensors:
                        raise GGUFError(f"{shard.path}: tensor {name!r} is also in {self.tensors[name].file.name}")
                    self.tensors[name] = t
            expected = first.metadata.get("split.tensors.count")
            if expected is not None and expected != len(self.tensors):
                raise GGUFError(
                    f"{self.path}: split.tensors.count says {expected} tensors, the "
                    f"{len(self.shards)} shard(s) hold {len(self.tensors)}"
                )
        except BaseException:
            self.close()
            raise
        self.metadata = first.metadata
        self.value_types = first.value_types
        self.version = first.version
        self.alignment = first.alignment

    def _open_splits(self, first: _Shard) -> None:
        meta = first.metadata
        count = meta.get("split.count")
        if count is None:
            return
        no = meta.get("split.no", 0)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SPLITS:
            raise GGUFError(f"{self.path}: split.count {count!r} is not between 1 and {MAX_SPLITS}")
        if no != 0:
            raise GGUFError(
                f"{self.path}: this is shard {no + 1} of {count} (split.no={no}); open the first shard "
                f"(-00001-of-{count:05d}.gguf) instead"
            )
        if count == 1:
            return
        m = _SHARD_NAME.match(self.path.name)
        if not m or int(m.group(2)) != 1 or int(m.group(3)) != count:
            raise GGUFError(
                f"{self.path}: split.count is {count} but the file name is not NAME-00001-of-{count:05d}.gguf, "
                f"so the other shards cannot be found"
            )
        total = meta.get("split.tensors.count")
        for i in range(1, count):
            p = self.path.with_name(f"{m.group(1)}-{i + 1:05d}-of-{count:05d}.gguf")
            if not p.exists():
                raise GGUFError(f"{self.path}: shard {i + 1} of {count} of this split model is missing: {p}")
            shard = _Shard(p)
            self.shards.append(shard)
            got = tuple(shard.metadata.get(k) for k in ("split.no", "split.count", "split.tensors.count"))
            if got != (i, count, total):
                raise GGUFError(
                    f"{p}: does not belong with {self.path.name}: expected split.no={i}, split.count={count}, "
                    f"split.tensors.count={total}; found {got[0]}, {got[1]}, {got[2]}"
                )

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    @property
    def paths(self) -> list[Path]:
        """The file of each shard (one path for an unsplit model)."""
        return [s.path for s in self.shards]

    def release_pages(self, view: np.ndarray) -> None:
        """Let the OS drop this process's pages under `view`, a tensor's data (or a part of it) that the caller has
        copied and will not read again soon (see _Shard.release_pages); a view of no shard is left alone."""
        for shard in self.shards:
            if shard.release_pages(view):
                return

    def close(self) -> None:
        for s in getattr(self, "shards", []):
            s.close()
        self.tensors = {}

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, arch={self.architecture!r}, tensors={len(self.tensors)})"
