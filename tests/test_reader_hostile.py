"""Hostile and foreign files: every one is refused with a GGUFError that names the problem and a byte offset.

The corpus is built here, byte by byte, from a small valid file; then a hypothesis fuzz test mutates and
truncates real headers (the golden small models and a synthetic header with a few-thousand-string array):
only GGUFError may come out, never another exception, a crash, a hang or a MemoryError.
"""

from __future__ import annotations

import itertools
import pickle
import re
import struct
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import write_gguf

from ggufrun.errors import GGUFError
from ggufrun.reader import GGUFFile

GOLDEN = Path(__file__).parent / "data" / "golden"
T = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType


# -- a tiny GGUF writer that will write anything, including what gguf-py refuses to ----------------------


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return u64(len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + u32(vtype) + payload


def arr(etype: int, items: list[bytes]) -> bytes:
    return u32(etype) + u64(len(items)) + b"".join(items)


def ti(name: str | bytes, ne: list[int], ttype: int, offset: int) -> bytes:
    return s(name) + u32(len(ne)) + b"".join(u64(n) for n in ne) + u32(ttype) + u64(offset)


def build(kvs, tis, data=b"", *, version=3, n_tensors=None, n_kv=None, alignment=32) -> bytes:
    head = b"GGUF" + u32(version)
    head += u64(len(tis) if n_tensors is None else n_tensors) + u64(len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tis)
    return body + b"\0" * (-len(body) % alignment) + data


# A valid base: strings, scalars, numeric and string arrays (one empty), two tensors.
BASE_KVS = [
    kv("general.architecture", T.STRING, s("llama")),
    kv("llama.block_count", T.UINT32, u32(2)),
    kv("test.floats", T.ARRAY, arr(T.FLOAT32, [struct.pack("<f", x) for x in (1.0, 2.5, -3.0)])),
    kv("test.strings", T.ARRAY, arr(T.STRING, [s("a"), s("bc"), s(""), s("déf")])),
    kv("test.empty", T.ARRAY, arr(T.STRING, [])),
    kv("test.flag", T.BOOL, b"\x01"),
]
BASE_TIS = [ti("a.weight", [8], Q.F32, 0), ti("b.weight", [16, 2], Q.F16, 32)]
BASE_DATA = np.arange(8, dtype="<f4").tobytes() + np.arange(32, dtype="<f2").tobytes()
BASE = build(BASE_KVS, BASE_TIS, BASE_DATA)


def refused(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(GGUFError) as e:
        GGUFFile(path).close()
    return str(e.value)


def test_base_file_is_valid(tmp_path):
    path = tmp_path / "base.gguf"
    path.write_bytes(BASE)
    with GGUFFile(path) as f:
        assert f.metadata["test.strings"] == ["a", "bc", "", "déf"]
        assert f.metadata["test.empty"] == []
        assert f.metadata["test.floats"].tolist() == [1.0, 2.5, -3.0]
        assert f.metadata["test.flag"] is True
        np.testing.assert_array_equal(f.tensors["a.weight"].data, np.arange(8))
        assert f.tensors["b.weight"].shape == (2, 16)
    # gguf-py agrees that this is a valid file
    r = gguf.GGUFReader(path)
    assert [t.name for t in r.tensors] == ["a.weight", "b.weight"]


# -- truncation ----------------------------------------------------------------------------------------------

TRUNCATION = r"truncated|runs past the end|cannot fit|smaller than a GGUF header"


def test_truncation_at_every_byte(tmp_path):
    """Cut the base file at every length: every section boundary and the middle of every field."""
    for n in range(len(BASE)):
        msg = refused(tmp_path, BASE[:n])
        assert "byte offset" in msg, (n, msg)
        assert re.search(TRUNCATION, msg), (n, msg)


def _boundaries() -> dict[str, int]:
    pos = {"magic": 4, "version": 8, "tensor count": 16, "header": 24}
    at = 24
    for i, k in enumerate(BASE_KVS):
        at += len(k)
        pos[f"kv {i}"] = at
    for i, t in enumerate(BASE_TIS):
        at += len(t)
        pos[f"tensor info {i}"] = at
    pos["padding"] = at + 1
    pos["tensor a data"] = (at + 31) // 32 * 32 + 16
    pos["tensor b data"] = len(BASE) - 1
    return pos


@pytest.mark.parametrize(
    "section,expect",
    [
        ("magic", "smaller than a GGUF header"),
        ("header", "metadata key/value count 6 cannot fit"),
        ("kv 3", "metadata key #4"),
        ("kv 5", "tensor #0 name"),
        ("tensor info 0", "tensor #1 name"),
        ("tensor info 1", "tensor data should start"),
        ("padding", "tensor data should start"),
        ("tensor a data", "'a.weight' data .* runs past the end"),
        ("tensor b data", "'b.weight' data .* runs past the end"),
    ],
)
def test_truncation_at_section_boundaries_names_the_section(tmp_path, section, expect):
    msg = refused(tmp_path, BASE[: _boundaries()[section]])
    assert re.search(expect, msg), msg


# -- the corpus ----------------------------------------------------------------------------------------------

BIG = 1 << 63


def _nested(depth: int) -> bytes:
    inner = arr(T.UINT8, [b"\x01"])
    for _ in range(depth):
        inner = u32(T.ARRAY) + u64(1) + inner
    return inner


CORPUS = {
    # counts and lengths of 2^63
    "tensor count 2^63": (build(BASE_KVS, BASE_TIS, BASE_DATA, n_tensors=BIG), r"tensor count \d+ cannot fit"),
    "kv count 2^63": (build(BASE_KVS, BASE_TIS, BASE_DATA, n_kv=BIG), r"key/value count \d+ cannot fit"),
    "key length 2^63": (build([u64(BIG) + b"key" + u32(T.UINT8) + b"\0"], []), "string length .* runs past"),
    "string value length 2^63": (build([kv("k", T.STRING, u64(BIG) + b"abc")], []), "string length .* runs past"),
    "array length 2^63": (build([kv("k", T.ARRAY, u32(T.UINT32) + u64(BIG))], []), "array of .* runs past"),
    "string array length 2^63": (build([kv("k", T.ARRAY, u32(T.STRING) + u64(BIG))], []), "strings cannot fit"),
    "string in array length 2^63": (
        build([kv("k", T.ARRAY, arr(T.STRING, [s("ok"), u64(BIG) + b"xyz", s("z")]))], []),
        r"k\[1\]: string length .* runs past",
    ),
    "tensor name length 2^63": (build(BASE_KVS, [u64(BIG) + b"name"]), "tensor #0 name.* runs past"),
    # nested arrays
    "nested array bomb (deep)": (build([kv("k", T.ARRAY, _nested(1000))], []), "nested deeper than"),
    "nested array bomb (wide)": (build([kv("k", T.ARRAY, u32(T.ARRAY) + u64(1 << 40))], []), "arrays cannot fit"),
    "nested array bomb (many)": (
        build([kv("k", T.ARRAY, u32(T.ARRAY) + u64(70_000) + arr(T.UINT8, []) * 70_000)], []),
        "more than 65536 nested arrays",
    ),
    # unknown types
    "unknown value type": (build([kv("k", 13, u32(0))], []), "unknown metadata value type 13"),
    "unknown value type 2^32-1": (build([kv("k", 0xFFFFFFFF, u32(0))], []), "unknown metadata value type"),
    "unknown array element type": (build([kv("k", T.ARRAY, u32(77) + u64(1))], []), "unknown array element type 77"),
    "unknown ggml type 4 (removed Q4_2)": (build([], [ti("t", [32], 4, 0)], bytes(64)), "unknown ggml type 4"),
    "unknown ggml type 31": (build([], [ti("t", [32], 31, 0)], bytes(64)), "unknown ggml type 31"),
    "unknown ggml type 2^32-1": (build([], [ti("t", [32], 0xFFFFFFFF, 0)], bytes(64)), "unknown ggml type"),
    # shapes
    "n_dims 0": (build([], [ti("t", [], Q.F32, 0)], bytes(64)), "n_dims is 0"),
    "n_dims 5": (build([], [ti("t", [1, 1, 1, 1, 1], Q.F32, 0)], bytes(64)), "n_dims is 5"),
    "zero dimension": (build([], [ti("t", [4, 0], Q.F32, 0)], bytes(64)), "dimension 1 is 0"),
    "huge dimension 2^64-1": (build([], [ti("t", [2**64 - 1], Q.F32, 0)], bytes(64)), "more than int64 can hold"),
    "huge dimension 2^40": (build([], [ti("t", [4, 2**40], Q.F32, 0)], bytes(64)), "runs past the end"),
    "element count overflow": (
        build([], [ti("t", [2**32, 2**32], Q.F32, 0)], bytes(64)),
        "more than int64 can count",
    ),
    "row not a multiple of the block": (build([], [ti("t", [16, 2], Q.Q4_0, 0)], bytes(64)), "block size 32"),
    # data placement
    "tensor data past the end": (build(BASE_KVS, [ti("a.weight", [8], Q.F32, 64)], bytes(64)), "runs past the end"),
    "overlapping tensors": (
        build([], [ti("a", [16], Q.F32, 0), ti("b", [8], Q.F32, 32)], bytes(64)),
        "'a' and 'b' overlap",
    ),
    "misaligned tensor offset": (build([], [ti("a", [8], Q.F32, 8)], bytes(64)), "not aligned to 32"),
    "alignment not a power of two": (
        build([kv("general.alignment", T.UINT32, u32(48))], [ti("a", [8], Q.F32, 0)], bytes(64), alignment=48),
        "power of two, got 48",
    ),
    "alignment 0": (build([kv("general.alignment", T.UINT32, u32(0))], []), "power of two, got 0"),
    "alignment of the wrong type": (
        build([kv("general.alignment", T.FLOAT32, struct.pack("<f", 32.0))], []),
        "must be a UINT32, got FLOAT32",
    ),
    # names and keys
    "duplicate tensor names": (
        build([], [ti("a", [8], Q.F32, 0), ti("a", [8], Q.F32, 32)], bytes(64)),
        "duplicate tensor name 'a'",
    ),
    "duplicate keys": (build([kv("k", T.UINT8, b"\1"), kv("k", T.UINT8, b"\2")], []), "duplicate metadata key 'k'"),
    "empty key": (build([kv("", T.UINT8, b"\1")], []), "metadata key #0 is empty"),
    "non-UTF-8 key": (build([kv(b"k\xff", T.UINT8, b"\1")], []), "not valid UTF-8"),
    "non-UTF-8 string value": (build([kv("k", T.STRING, s(b"ab\xc3("))], []), "not valid UTF-8"),
    "non-UTF-8 in a string array": (
        build([kv("k", T.ARRAY, arr(T.STRING, [s(f"t{i}") for i in range(500)] + [s(b"\xe2\x82")]))], []),
        r"k\[500\]: string is not valid UTF-8",
    ),
    "non-UTF-8 in a string array with NULs": (
        build([kv("k", T.ARRAY, arr(T.STRING, [s("a\0b"), s(b"\xff"), s("c")]))], []),
        r"k\[1\]: string is not valid UTF-8",
    ),
    "non-UTF-8 tensor name": (build([], [ti(b"\xfe", [8], Q.F32, 0)], bytes(64)), "not valid UTF-8"),
    # versions
    "GGUF v1": (build(BASE_KVS, BASE_TIS, BASE_DATA, version=1), "version 1 is not supported"),
    "GGUF v4": (build(BASE_KVS, BASE_TIS, BASE_DATA, version=4), "unsupported GGUF version 4"),
}


@pytest.mark.parametrize("case", list(CORPUS))
def test_hostile_corpus(tmp_path, case):
    data, expect = CORPUS[case]
    msg = refused(tmp_path, data)
    assert re.search(expect, msg), msg
    assert "byte offset" in msg, msg
    assert str(tmp_path) in msg  # names the file


def test_byte_offsets_point_at_the_field(tmp_path):
    """The offset in the message is where the bad field starts, not just somewhere."""
    data = build([kv("k", T.UINT8, b"\1"), kv("k", T.UINT8, b"\2")], [])
    second_key_at = 24 + len(kv("k", T.UINT8, b"\1"))
    assert f"byte offset {second_key_at})" in refused(tmp_path, data)
    data = build([], [ti("t", [32], 99, 0)], bytes(64))
    type_at = 24 + 8 + 1 + 4 + 8
    assert f"byte offset {type_at})" in refused(tmp_path, data)


def test_big_endian_gguf_is_refused(tmp_path):
    path = tmp_path / "be.gguf"
    write_gguf(path, tensors={"t": np.arange(8, dtype=np.float32)}, endianess=gguf.GGUFEndian.BIG)  # byte-swapped
    msg = refused(tmp_path, path.read_bytes())
    assert "big-endian" in msg and "byte offset 4" in msg


# -- not a GGUF file at all ------------------------------------------------------------------------------


class _Tripwire:
    """Unpickling this would create a file: proof that a pickle was (not) loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_safetensors_is_recognised(tmp_path):
    header = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    msg = refused(tmp_path, u64(len(header)) + header + bytes(8), "model.safetensors")
    assert "safetensors" in msg and "convert_hf_to_gguf.py" in msg


def test_legacy_pickle_is_recognised_and_never_unpickled(tmp_path):
    trip = tmp_path / "unpickled"
    for protocol in (2, 3, 4, 5):
        msg = refused(tmp_path, pickle.dumps({"w": _Tripwire(trip)}, protocol=protocol), "pytorch_model.bin")
        assert "pickle" in msg and "not unpickled" in msg and "convert_hf_to_gguf.py" in msg
    assert not trip.exists()


def test_zip_checkpoint_is_recognised_and_never_unpickled(tmp_path):
    trip = tmp_path / "unpickled"
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as z:  # the layout torch.save writes
        z.writestr("archive/data.pkl", pickle.dumps({"w": _Tripwire(trip)}, protocol=2))
        z.writestr("archive/version", "3\n")
    msg = refused(tmp_path, path.read_bytes(), "model.pt")
    assert "zip" in msg and "not unpickled" in msg and "convert_hf_to_gguf.py" in msg
    assert not trip.exists()


@pytest.mark.parametrize(
    "data,expect",
    [
        (b"ggjt" + bytes(60), "pre-GGUF"),
        (b"hello, world: this is a text file\n" * 4, "expected the magic b'GGUF'"),
        (b"", "smaller than a GGUF header"),
        (b"GGUF\x03\x00\x00\x00", "smaller than a GGUF header"),
        (b"\x7fELF" + bytes(60), "expected the magic"),
    ],
    ids=["ggjt", "text", "empty", "header-only", "elf"],
)
def test_other_files_are_refused(tmp_path, data, expect):
    assert expect in refused(tmp_path, data)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile(tmp_path)
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "nope.gguf")


# -- fuzzing real headers --------------------------------------------------------------------------------


def _vocab_header() -> bytes:
    """A synthetic tokenizer-style header: a few thousand strings (some odd), scores, a few tensors."""
    tokens = [f"▁tok{i}" if i % 7 else f"<0x{i % 256:02X}>" for i in range(3000)] + ["", "", "a\0b", "é" * 9]
    kvs = BASE_KVS + [
        kv("tokenizer.ggml.tokens", T.ARRAY, arr(T.STRING, [s(t) for t in tokens])),
        kv("tokenizer.ggml.scores", T.ARRAY, arr(T.FLOAT32, [struct.pack("<f", -i) for i in range(len(tokens))])),
    ]
    return build(kvs, BASE_TIS, BASE_DATA)


def _field_offsets(path: Path) -> np.ndarray:
    """Byte offsets of the header's fields (counts, lengths, types, dimensions, offsets), found by gguf-py.

    The fuzzer writes forged numbers there often, rather than by luck; of a long array only the first and
    last few elements count.
    """
    r = gguf.GGUFReader(path)
    out = set()
    for f in list(r.fields.values()) + [t.field for t in r.tensors]:
        offs = f.offset + np.cumsum([0] + [p.nbytes for p in f.parts[:-1]])
        out.update(offs[:8].tolist() + offs[-3:].tolist())
    return np.array(sorted(out))


def _fuzz_bases(tmp: Path) -> list[tuple[bytes, int, np.ndarray]]:
    """(file bytes, header length, field offsets) of each base; mutations land in the header."""
    out = []
    for name in ("small-llama-q4_k_s", "small-qwen3-q8_0"):
        path = GOLDEN / f"{name}.gguf"
        with GGUFFile(path) as f:
            header = min(t.offset for t in f.tensors.values())
        out.append((path.read_bytes(), header, _field_offsets(path)))
    vocab = tmp / "vocab.gguf"
    vocab.write_bytes(_vocab_header())
    out.append((vocab.read_bytes(), len(_vocab_header()) - len(BASE_DATA), _field_offsets(vocab)))
    return out


INTERESTING_U64 = [0, 1, 2, 7, 8, 31, 32, 255, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]

mutation = st.one_of(
    st.tuples(st.just("byte"), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
    st.tuples(st.just("u32"), st.floats(0, 1, exclude_max=True), st.sampled_from([0, 1, 3, 4, 9, 12, 13, 99])),
    st.tuples(st.just("u64"), st.floats(0, 1, exclude_max=True), st.sampled_from(INTERESTING_U64)),
    st.tuples(st.just("field u64"), st.floats(0, 1, exclude_max=True), st.sampled_from(INTERESTING_U64)),
    st.tuples(st.just("field u32"), st.floats(0, 1, exclude_max=True), st.sampled_from([0, 5, 9, 13, 99, 2**32 - 1])),
    st.tuples(st.just("delete"), st.floats(0, 1, exclude_max=True), st.integers(1, 16)),
    st.tuples(st.just("insert"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=16)),
)
_counter = itertools.count()


def _mutate(data: bytes, header: int, fields: np.ndarray, mutations, cut) -> bytes:
    b = bytearray(data)
    for kind, where, arg in mutations:
        at = int(where * header)
        if kind.startswith("field"):
            at = int(fields[int(where * len(fields))])
            kind = kind[6:]
        if kind == "byte":
            b[at] = arg
        elif kind == "u32":
            b[at : at + 4] = u32(arg)
        elif kind == "u64":
            b[at : at + 8] = u64(arg)
        elif kind == "delete":
            del b[at : at + arg]
        else:
            b[at:at] = arg
    if cut is not None:
        b = b[: int(cut * len(b))]
    return bytes(b)


@pytest.fixture(scope="module")
def fuzz_bases(tmp_path_factory):
    return _fuzz_bases(tmp_path_factory.mktemp("fuzz-bases"))


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@given(
    base=st.integers(0, 2),
    mutations=st.lists(mutation, min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
def test_fuzz_real_headers(tmp_path_factory, fuzz_bases, base, mutations, cut):
    data, header, fields = fuzz_bases[base]
    path = tmp_path_factory.getbasetemp() / f"fuzz{next(_counter)}.gguf"
    path.write_bytes(_mutate(data, header, fields, mutations, cut))
    try:
        f = GGUFFile(path)
    except GGUFError:
        pass
    else:
        # Whatever opened must be usable: every view lies inside the file.
        for t in f.tensors.values():
            assert t.data.nbytes == t.nbytes
            t.data.reshape(-1)[-1:].tobytes()
        for v in f.metadata.values():
            repr(v)
        f.close()
    finally:
        path.unlink()
