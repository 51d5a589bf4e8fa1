"""GGUFFile against gguf-py's GGUFReader (the oracle): metadata, tensor names, types, shapes and bytes.

Also: tensors are zero-copy views of the mmap, opening reads no tensor bytes, and the vectorised string-array
parse agrees with gguf-py on awkward string arrays (NULs, empty strings, long strings, non-ASCII).
"""

from __future__ import annotations

import functools
import mmap
import resource
import struct
import tracemalloc
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import Typed, write_gguf

from ggufrun.reader import LAZY_STRINGS, GGUFFile, StringArray

GOLDEN = Path(__file__).parent / "data" / "golden"
SMALL = sorted(GOLDEN.glob("small-*.gguf"))


@functools.cache
def gguf_py_facts(path: str) -> dict:
    """What gguf-py's GGUFReader reads from one file, as plain data.

    Cached for the session (tests/test_info.py reuses it): GGUFReader takes ~9 s on Gemma 3's vocabulary.
    """
    r = gguf.GGUFReader(path)
    metadata = {name: (int(f.types[0]), f.contents()) for name, f in r.fields.items() if not name.startswith("GGUF.")}
    tensors = {
        t.name: {
            "type": int(t.tensor_type),
            "shape": tuple(int(n) for n in reversed(t.shape.tolist())),  # GGUF order -> NumPy order
            "n_elements": int(t.n_elements),
            "n_bytes": int(t.n_bytes),
            "offset": int(t.data_offset),
            "crc32": zlib.crc32(np.ascontiguousarray(t.data).view(np.uint8)),
        }
        for t in r.tensors
    }
    version = int(r.fields["GGUF.version"].contents())
    del r
    return {"metadata": metadata, "tensors": tensors, "version": version}


def assert_same_as_gguf_py(path: Path) -> None:
    facts = gguf_py_facts(str(path))
    with GGUFFile(path) as f:
        assert f.version == facts["version"]
        assert list(f.metadata) == list(facts["metadata"])
        for key, (vtype, want) in facts["metadata"].items():
            got = f.metadata[key]
            assert f.value_types[key] == vtype, key
            if isinstance(got, np.ndarray):
                got = got.tolist()
            if isinstance(want, list) and want and isinstance(want[0], str):  # long string arrays stay bytes
                assert isinstance(got, StringArray) == (len(want) >= LAZY_STRINGS), key
                assert got == want and want == got, key
                got = list(got)
            assert got == want, key
            assert type(got) is type(want), key
        assert list(f.tensors) == list(facts["tensors"])
        for name, want in facts["tensors"].items():
            t = f.tensors[name]
            assert int(t.type) == want["type"], name
            assert t.shape == want["shape"], name
            assert t.n_elements == want["n_elements"], name
            assert t.nbytes == want["n_bytes"] == t.data.nbytes, name
            assert t.offset == want["offset"], name
            assert zlib.crc32(t.data) == want["crc32"], name


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_small_golden_files_match_gguf_py(path):
    assert_same_as_gguf_py(path)


@pytest.mark.real
def test_smollm2_matches_gguf_py(smollm2_path):
    assert_same_as_gguf_py(smollm2_path)


@pytest.mark.real
def test_gemma3_matches_gguf_py(gemma3_path):
    assert_same_as_gguf_py(gemma3_path)


def _backing_object(arr: np.ndarray):
    b = arr
    while isinstance(b, np.ndarray):
        b = b.base
    return b.obj if isinstance(b, memoryview) else b


@pytest.mark.parametrize("name", ["small-llama-f32", "small-llama-f16", "small-llama-bf16", "small-llama-q4_k_s"])
def test_tensor_views_are_zero_copy_and_typed(name):
    with GGUFFile(GOLDEN / f"{name}.gguf") as f:
        for t in f.tensors.values():
            assert not t.data.flags.owndata and not t.data.flags.writeable
            assert isinstance(_backing_object(t.data), mmap.mmap), t.name
            block, type_size = gguf.GGML_QUANT_SIZES[t.type]
            if t.type == gguf.GGMLQuantizationType.F32:
                assert t.data.dtype == np.float32 and t.data.shape == t.shape
            elif t.type == gguf.GGMLQuantizationType.F16:
                assert t.data.dtype == np.float16 and t.data.shape == t.shape
            elif t.type == gguf.GGMLQuantizationType.BF16:
                assert t.data.dtype == np.uint16 and t.data.shape == t.shape
            else:
                assert t.data.dtype == np.uint8
                assert t.data.shape == (*t.shape[:-1], t.shape[-1] // block * type_size)
    # a float tensor reads back as the writer's numbers
    with GGUFFile(GOLDEN / "small-llama-f32.gguf") as f:
        w = f.tensors["blk.0.attn_q.weight"].data
        ref = gguf.GGUFReader(GOLDEN / "small-llama-f32.gguf")
        want = next(t for t in ref.tensors if t.name == "blk.0.attn_q.weight").data
        np.testing.assert_array_equal(w, want)


def test_close_and_context_manager():
    path = GOLDEN / "small-llama-q8_0.gguf"
    with GGUFFile(path) as f:
        assert f.tensors and f.architecture == "llama"
    assert f.tensors == {}
    f.close()  # twice is fine
    # a view kept past close() stays readable (the map closes when the view goes)
    g = GGUFFile(path)
    view = g.tensors["output_norm.weight"].data
    g.close()
    assert np.isfinite(view).all()


def test_opening_reads_no_tensor_bytes(tmp_path):
    """A 256 MiB tensor in a sparse file: opening must neither copy it nor fault its pages in."""
    path = tmp_path / "sparse.gguf"
    n_rows, n_cols = 4096, 16384  # F32: 256 MiB
    write_gguf(path, tensors={"big.weight": ((n_rows, n_cols), np.float32)}, data=False)
    header = path.stat().st_size
    data_start = (header + 31) // 32 * 32
    with open(path, "r+b") as fh:
        fh.truncate(data_start + n_rows * n_cols * 4)  # a hole: reading it would fault 65536 pages

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    tracemalloc.start()
    faults0 = faults()
    f = GGUFFile(path)
    open_faults = faults() - faults0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    try:
        t = f.tensors["big.weight"]
        assert t.shape == (n_rows, n_cols) and t.offset == data_start
        assert peak < 4 << 20, f"opening allocated {peak} bytes"
        # Calibrate against reading the tensor once (the kernel maps many pages per fault): pages that
        # opening had touched would already be mapped, so the read would fault less than opening did.
        faults0 = faults()
        assert float(t.data[:, ::1024].sum()) == 0.0  # one float in every 4 KiB page
        read_faults = faults() - faults0
        assert open_faults * 10 < read_faults, (open_faults, read_faults)
    finally:
        f.close()


# -- the vectorised string-array parse ---------------------------------------------------------------------


def _write_strings(path: Path, strings: list[str]) -> None:
    # (gguf-py cannot write an empty array: see test_reader_hostile.py); the parse must end exactly where the
    # array does, at test.after
    metadata = {"test.strings": strings, "test.after": Typed(7, gguf.GGUFValueType.UINT32)}
    write_gguf(path, metadata, {"t": np.arange(8, dtype=np.float32)})


def _check_strings(path: Path, strings: list[str]) -> None:
    _write_strings(path, strings)
    with GGUFFile(path) as f:
        assert f.metadata["test.strings"] == strings
        assert f.metadata["test.after"] == 7
        np.testing.assert_array_equal(f.tensors["t"].data, np.arange(8, dtype=np.float32))
    assert gguf_py_facts.__wrapped__(str(path))["metadata"]["test.strings"][1] == strings


AWKWARD = {
    "vocab": [f"tok{i}_{'x' * (i % 13)}" for i in range(5000)],
    "non_ascii": ["▁le", "é", "日本語", "🙂", "Ġthe", "\u00a0", "ẞ"] * 300,
    "empty_runs": ["", "", "a", "", "", "", "bc", ""] * 200,
    "nul_inside": ["a\x00b", "\x00", "\x00\x00\x00\x00\x00\x00\x00x", "plain"] * 300,
    "looks_like_lengths": ["\x05\x00\x00\x00\x00\x00\x00\x00", "\x01\x00", "abc"] * 300,
    "long_strings": ["y" * 70_000, "short", "z" * 100_000, ""],
    "long_average": [f"{i:05d}" + "w" * 120 for i in range(3000)],
    "single": ["only"],
    "all_empty": [""] * 1000,
}


@pytest.mark.parametrize("kind", list(AWKWARD))
def test_string_arrays_match_gguf_py(tmp_path, kind):
    _check_strings(tmp_path / f"{kind}.gguf", AWKWARD[kind])


def test_long_string_arrays_are_bytes_and_offsets_read_like_lists(tmp_path):
    """From LAZY_STRINGS strings on, an array is a StringArray: every way a list is read (index, negative index,
    slices with and without a step, iteration, len, equality both ways) gives the list's strings, and an index out
    of range raises IndexError."""
    strings = [["", "a", "▁le", "日本語", "🙂", "Ġthe", "x" * 300][i % 7] + str(i % 11) * (i % 3) for i in range(6000)]
    strings[5] = strings[5998] = ""
    path = tmp_path / "long.gguf"
    _write_strings(path, strings)
    with GGUFFile(path) as f:
        got = f.metadata["test.strings"]
        assert isinstance(got, StringArray) and len(got) == len(strings) and repr(got) == "StringArray(6000 strings)"
        assert list(got) == strings and got == strings and strings == got and got != strings[:-1]
        assert [got[i] for i in range(len(strings))] == strings and got[-1] == strings[-1] and got[-6000] == ""
        assert got[np.int64(3)] == strings[3]
        with pytest.raises(TypeError):
            got[1.0]
        for sl in (slice(0, 0), slice(5, 4100), slice(-7, None), slice(None, None, 7), slice(100, 5, -3)):
            assert got[sl] == strings[sl], sl
        assert got.lengths().tolist() == [len(t.encode()) for t in strings]
        for bad in (6000, -6001):
            with pytest.raises(IndexError):
                got[bad]
        assert f.metadata["test.after"] == 7


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=12), min_size=1, max_size=400))
def test_string_arrays_property(tmp_path, strings):
    path = tmp_path / "prop.gguf"
    _write_strings(path, strings)
    with GGUFFile(path) as f:
        assert f.metadata["test.strings"] == strings


def test_all_value_types_and_nested_arrays(tmp_path):
    """Every metadata value type, scalar and array, and a nested array, read back as gguf-py reads them."""
    path = tmp_path / "types.gguf"
    T = gguf.GGUFValueType
    values = {
        T.UINT8: 200, T.INT8: -100, T.UINT16: 60000, T.INT16: -30000, T.UINT32: 4_000_000_000,
        T.INT32: -2_000_000_000, T.FLOAT32: 1.5, T.BOOL: True, T.STRING: "héllo",
        T.UINT64: 2**63 + 5, T.INT64: -(2**62), T.FLOAT64: 1e-300,
    }  # fmt: skip
    metadata = {}
    for vt, v in values.items():
        metadata[f"s.{vt.name}"] = Typed(v, vt)
        if vt != T.STRING:
            metadata[f"a.{vt.name}"] = Typed([v, v], T.ARRAY, vt)
    metadata["a.STRING"] = Typed(["x", "yy"], T.ARRAY, T.STRING)
    write_gguf(path, metadata)
    # gguf-py's writer cannot write a nested array; append one by hand: [[1, 2], [3]] of INT32
    nested = b"".join(
        [struct.pack("<Q", 8), b"a.nested", struct.pack("<IIQ", 9, 9, 2)]
        + [struct.pack("<IQ", 5, len(x)) + np.array(x, "<i4").tobytes() for x in ([1, 2], [3])]
    )
    raw = bytearray(path.read_bytes())
    struct.pack_into("<Q", raw, 16, struct.unpack_from("<Q", raw, 16)[0] + 1)  # n_kv + 1
    path.write_bytes(bytes(raw) + nested)

    with GGUFFile(path) as f:
        for vt, v in values.items():
            got = f.metadata[f"s.{vt.name}"]
            assert f.value_types[f"s.{vt.name}"] == vt
            assert got == v and type(got) is type(v), vt.name
        assert f.metadata["a.STRING"] == ["x", "yy"]
        assert f.metadata["a.BOOL"].dtype == bool and f.metadata["a.BOOL"].tolist() == [True, True]
        assert f.metadata["a.FLOAT32"].dtype == np.float32
        assert f.metadata["a.UINT64"].tolist() == [2**63 + 5] * 2
        assert [x.tolist() for x in f.metadata["a.nested"]] == [[1, 2], [3]]
    facts = gguf_py_facts.__wrapped__(str(path))["metadata"]
    with GGUFFile(path) as f:
        for key, (vtype, want) in facts.items():
            if key == "a.nested":
                continue  # gguf-py flattens nested arrays ([1, 2, 3]); checked by hand above
            got = f.metadata[key]
            assert f.value_types[key] == vtype, key
            assert (got.tolist() if isinstance(got, np.ndarray) else got) == want, key
