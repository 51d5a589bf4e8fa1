"""GGUF reader: one read-only mmap per file, metadata parsed up front, tensors as zero-copy NumPy views.

File layout (GGUF v2/v3, little-endian; see llama.cpp `ggml/src/gguf.cpp` and gguf-py `gguf_reader.py`):
    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x  (key: string, value_type: u32, value)
    n_tensors x (name: string, n_dims: u32, ne: u64[n_dims] (innermost first), ggml_type: u32, offset: u64)
    padding to `general.alignment` (default 32)
    tensor data, each tensor at data_start + offset
where string = (len: u64, utf-8 bytes) and an array value = (elem_type: u32, count: u64, elements).

Every count, length and offset is checked against the file before it is used, so a hostile file gives a
GGUFError naming the field and byte offset, never a huge allocation, a crash or a hang.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import GGUFError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# GGUF metadata value types (gguf-py constants.GGUFValueType)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_DTYPES = {
    UINT8: np.dtype("<u1"),
    INT8: np.dtype("<i1"),
    UINT16: np.dtype("<u2"),
    INT16: np.dtype("<i2"),
    UINT32: np.dtype("<u4"),
    INT32: np.dtype("<i4"),
    FLOAT32: np.dtype("<f4"),
    BOOL: np.dtype("<u1"),
    UINT64: np.dtype("<u8"),
    INT64: np.dtype("<i8"),
    FLOAT64: np.dtype("<f8"),
}
_VALUE_TYPE_NAMES = [
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
]  # fmt: skip

# Typed NumPy views for the float types; everything else is a view of raw uint8 blocks.
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


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    shape: NumPy order (rows last-but-one, the innermost GGUF dimension last).
    data:  zero-copy view into the mmap: typed for F32/F16 (BF16 as uint16), raw uint8 blocks
           of shape (*shape[:-1], shape[-1] // block_size * type_size) for quantized types.
    """

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in its file
    nbytes: int
    data: np.ndarray
    file: Path

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; every failure names the field and offset."""

    __slots__ = ("buf", "pos", "size", "path")

    def __init__(self, buf, path: Path, pos: int = 0):
        self.buf = buf
        self.pos = pos
        self.size = len(buf)
        self.path = path

    def fail(self, what: str, at: int | None = None) -> GGUFError:
        at = self.pos if at is None else at
        return GGUFError(f"{self.path}: {what} (at byte offset {at})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
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
            raise self.fail(f"{what}: string length {n} runs past the end of the file", start)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: string is not valid UTF-8 ({e.reason})", start) from None

    def scalar(self, vtype: int, what: str):
        dt = _SCALAR_DTYPES[vtype]
        self.need(dt.itemsize, what)
        v = np.frombuffer(self.buf, dtype=dt, count=1, offset=self.pos)[0]
        self.pos += dt.itemsize
        if vtype == BOOL:
            return bool(v)
        if vtype in (FLOAT32, FLOAT64):
            return float(v)
        return int(v)

    def string_array(self, count: int, what: str) -> list[str]:
        # Each element is (u64 length, bytes). A Python loop over the lengths is unavoidable (each
        # offset depends on the previous length) but it touches only ints; the decode happens once
        # on the joined bytes, which is the slow part when done per string.
        buf, pos, size = self.buf, self.pos, self.size
        if count * 8 > size - pos:
            raise self.fail(f"{what}: array of {count} strings cannot fit in the file")
        unpack = _U64.unpack_from
        starts = [0] * count
        ends = [0] * count
        for i in range(count):
            if pos + 8 > size:
                raise self.fail(f"truncated file: {what}[{i}] length", pos)
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                raise self.fail(f"{what}[{i}]: string length {n} runs past the end of the file", pos - 8)
            starts[i] = pos
            pos += n
            ends[i] = pos
        mv = memoryview(buf)
        out = [None] * count
        try:
            for i in range(count):
                out[i] = str(mv[starts[i] : ends[i]], "utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}[{i}]: string is not valid UTF-8 ({e.reason})", starts[i]) from None
        finally:
            mv.release()
        self.pos = pos
        return out

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype == STRING:
            return self.string(what)
        if vtype in _SCALAR_DTYPES:
            return self.scalar(vtype, what)
        if vtype == ARRAY:
            if depth >= 8:
                raise self.fail(f"{what}: arrays nested deeper than 8 levels")
            at = self.pos
            etype = self.u32(f"{what} element type")
            count = self.u64(f"{what} element count")
            if etype not in _SCALAR_DTYPES and etype not in (STRING, ARRAY):
                raise self.fail(f"{what}: unknown array element type {etype}", at)
            if etype in _SCALAR_DTYPES:
                dt = _SCALAR_DTYPES[etype]
                if count > (self.size - self.pos) // dt.itemsize:
                    raise self.fail(f"{what}: array of {count} x {dt.itemsize} bytes runs past the end", at)
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
                self.pos += count * dt.itemsize
                return arr.astype(bool) if etype == BOOL else arr
            if etype == STRING:
                return self.string_array(count, what)
            # Nested arrays: each element takes at least 12 bytes (type + count).
            if count > (self.size - self.pos) // 12:
                raise self.fail(f"{what}: array of {count} arrays cannot fit in the file", at)
            return [self.value(ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise self.fail(f"{what}: unknown metadata value type {vtype}")


def _sniff_not_gguf(head: bytes, path: Path) -> GGUFError:
    """Say what a non-GGUF file looks like, and how to get a GGUF."""
    convert = "convert it with llama.cpp's convert_hf_to_gguf.py"
    if head[:4] == b"FUGG":
        return GGUFError(f"{path}: big-endian GGUF files are not supported; use a little-endian GGUF")
    if head[:2] == b"PK":
        return GGUFError(f"{path}: this is a zip archive (a PyTorch checkpoint?), not a GGUF file; {convert}")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return GGUFError(
            f"{path}: this is a Python pickle (a PyTorch .bin/.pt checkpoint?), not a GGUF file; "
            f"it was not unpickled; {convert}"
        )
    if len(head) >= 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if 0 < n < 1 << 30:
            return GGUFError(f"{path}: this is a safetensors file, not a GGUF file; {convert}")
    if head[:4] in (b"ggml", b"ggmf", b"ggjt", b"lmgg", b"fmgg", b"tjgg"):
        return GGUFError(f"{path}: this is a pre-GGUF GGML file; convert it to GGUF with llama.cpp's tools")
    return GGUFError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")


class _Shard:
    """One mmapped GGUF file: header, metadata and tensor table."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                head = f.read(24)
                if head[:4] == GGUF_MAGIC or size == 0:
                    raise GGUFError(f"{path}: truncated file: {size} bytes is smaller than a GGUF header")
                raise _sniff_not_gguf(head, path)
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
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
            raise GGUFError(f"{path}: GGUF version 1 is not supported (only v2 and v3); re-convert the model")
        if version not in (2, 3):
            if version & 0xFFFF == 0 and (version >> 16) in (2, 3):
                raise GGUFError(f"{path}: big-endian GGUF files are not supported; use a little-endian GGUF")
            raise GGUFError(f"{path}: unsupported GGUF version {version} (expected 2 or 3)")
        self.version = version
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("metadata key/value count")
        # Each KV needs >= 8 (key len) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8.
        if n_kv > (size - c.pos) // 13:
            raise c.fail(f"metadata key/value count {n_kv} cannot fit in the file", 16)
        if n_tensors > (size - c.pos) // 32:
            raise c.fail(f"tensor count {n_tensors} cannot fit in the file", 8)

        meta: dict[str, object] = {}
        types: dict[str, int] = {}
        for i in range(n_kv):
            at = c.pos
            key = c.string(f"metadata key #{i}")
            if key in meta:
                raise c.fail(f"duplicate metadata key {key!r}", at)
            vtype = c.u32(f"value type of {key!r}")
            if vtype > FLOAT64:
                raise c.fail(f"{key!r}: unknown metadata value type {vtype}", c.pos - 4)
            meta[key] = c.value(vtype, key)
            types[key] = vtype
        self.metadata = meta
        self.value_types = types

        alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            not isinstance(alignment, int)
            or isinstance(alignment, bool)
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            raise GGUFError(f"{path}: general.alignment must be a power of two, got {alignment!r}")
        self.alignment = alignment

        infos = []
        names = set()
        for i in range(n_tensors):
            at = c.pos
            name = c.string(f"tensor #{i} name")
            if name in names:
                raise c.fail(f"duplicate tensor name {name!r}", at)
            names.add(name)
            n_dims = c.u32(f"tensor {name!r} n_dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise c.fail(f"tensor {name!r}: n_dims {n_dims} outside 1..{MAX_DIMS}", c.pos - 4)
            ne = [c.u64(f"tensor {name!r} dimension {d}") for d in range(n_dims)]
            type_at = c.pos
            ttype = c.u32(f"tensor {name!r} type")
            offset = c.u64(f"tensor {name!r} data offset")
            infos.append((name, ne, ttype, offset, at, type_at))

        self.data_start = data_start = (c.pos + alignment - 1) // alignment * alignment
        if data_start > size and n_tensors:
            raise GGUFError(f"{path}: truncated file: tensor data would start at {data_start}, file has {size}")

        self.tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, ne, ttype, offset, at, type_at in infos:
            try:
                qtype = GGMLQuantizationType(ttype)
            except ValueError:
                raise GGUFError(
                    f"{path}: tensor {name!r} has unknown ggml type {ttype} (at byte offset {type_at})"
                ) from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_el = 1
            for d, n in enumerate(ne):
                if n == 0 or n > size * 64:
                    raise GGUFError(
                        f"{path}: tensor {name!r} dimension {d} is {n} (at byte offset {at}); "
                        f"must be between 1 and what the file can hold"
                    )
                n_el *= n
            if n_el > size * 64:
                raise GGUFError(f"{path}: tensor {name!r} has {n_el} elements, more than the file can hold")
            if ne[0] % block:
                raise GGUFError(
                    f"{path}: tensor {name!r} row length {ne[0]} is not a multiple of the "
                    f"{qtype.name} block size {block}"
                )
            nbytes = n_el // block * type_size
            if offset % alignment:
                raise GGUFError(
                    f"{path}: tensor {name!r} data offset {offset} is not aligned to {alignment} bytes"
                )
            start = data_start + offset
            if start + nbytes > size:
                raise GGUFError(
                    f"{path}: tensor {name!r} data [{start}, {start + nbytes}) runs past the end of the "
                    f"file ({size} bytes)"
                )
            shape = tuple(int(n) for n in reversed(ne))
            if qtype in _FLOAT_VIEW_DTYPES:
                data = np.frombuffer(mm, dtype=_FLOAT_VIEW_DTYPES[qtype], count=n_el, offset=start)
                data = data.reshape(shape)
            else:
                data = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start)
                data = data.reshape(*shape[:-1], shape[-1] // block * type_size)
            self.tensors[name] = TensorInfo(name, qtype, shape, start, nbytes, data, path)
            spans.append((start, start + nbytes, name))
        spans.sort()
        for (s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise GGUFError(f"{path}: tensors {n0!r} and {n1!r} overlap (bytes {s1}..{e0})")

    def close(self) -> None:
        mm = getattr(self, "mm", None)
        if mm is not None:
            self.tensors = {}
            try:
                mm.close()
            except BufferError:
                # NumPy views handed out earlier still point into the map; it closes when they are freed.
                pass
            self.mm = None


class GGUFFile:
    """A GGUF model file (or the first shard of a split model), opened read-only and zero-copy.

    >>> with GGUFFile("model.gguf") as f:
    ...     f.metadata["general.architecture"], f.tensors["token_embd.weight"].shape
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no such GGUF file: {self.path}")
        if self.path.is_dir():
            raise GGUFError(f"{self.path} is a directory, not a GGUF file")
        first = _Shard(self.path)
        self.shards = [first]
        try:
            self._open_splits(first)
        except BaseException:
            self.close()
            raise
        self.metadata = first.metadata
        self.value_types = first.value_types
        self.version = first.version
        self.alignment = first.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for shard in self.shards:
            for name, t in shard.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{shard.path}: tensor {name!r} appears in more than one shard")
                self.tensors[name] = t
        expected = first.metadata.get("split.tensors.count")
        if expected is not None and expected != len(self.tensors):
            raise GGUFError(
                f"{self.path}: split.tensors.count says {expected} tensors, the shards hold {len(self.tensors)}"
            )

    def _open_splits(self, first: _Shard) -> None:
        count = first.metadata.get("split.count")
        if count is None or count == 1:
            return
        no = first.metadata.get("split.no", 0)
        if not isinstance(count, int) or not 1 <= count <= 9999:
            raise GGUFError(f"{self.path}: split.count {count!r} is not between 1 and 9999")
        if no != 0:
            raise GGUFError(f"{self.path}: is shard {no + 1} of {count}; open the first shard (00001) instead")
        import re

        m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", self.path.name)
        if not m:
            raise GGUFError(
                f"{self.path}: split.count is {count} but the file name is not NAME-00001-of-{count:05d}.gguf"
            )
        prefix = m.group(1)
        for i in range(1, count):
            p = self.path.with_name(f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf")
            if not p.exists():
                raise GGUFError(f"{self.path}: split model shard {i + 1} of {count} is missing: {p}")
            shard = _Shard(p)
            self.shards.append(shard)
            s_no, s_count = shard.metadata.get("split.no"), shard.metadata.get("split.count")
            if s_no != i or s_count != count:
                raise GGUFError(
                    f"{p}: expected split.no={i}, split.count={count}; found split.no={s_no}, "
                    f"split.count={s_count}"
                )

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

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
