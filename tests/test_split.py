"""Split models (NAME-0000k-of-0000N.gguf), written with gguf-py's GGUFWriter(split_max_tensors=...) (synthetic.py)."""

from __future__ import annotations

import shutil
import struct

import gguf
import numpy as np
import pytest
from synthetic import Typed, write_gguf

from ggufrun.errors import GGUFError
from ggufrun.reader import GGUFFile


def make_tensors(names: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i, name in enumerate(names):
        shape = (4 + i, 32) if i % 2 else (32,)
        out[name] = rng.standard_normal(shape).astype(np.float32 if i % 3 else np.float16)
    return out


# a little of everything a header holds: scalars and a string array, copied into every shard
METADATA = {
    "llama.block_count": Typed(2, gguf.GGUFValueType.UINT32),
    "llama.context_length": Typed(128, gguf.GGUFValueType.UINT32),
    "tokenizer.ggml.tokens": [f"t{i}" for i in range(300)],
}


NAMES = [f"blk.{i}.w" for i in range(7)]


@pytest.fixture
def split_model(tmp_path):
    tensors = make_tensors(NAMES)
    shards = write_gguf(tmp_path / "m.gguf", METADATA, tensors, split_max_tensors=3)
    return tensors, shards


def test_split_model_opens_all_shards(split_model, tmp_path):
    tensors, shards = split_model
    assert [p.name for p in shards] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    (tmp_path / "single").mkdir()
    single = write_gguf(tmp_path / "single" / "m.gguf", METADATA, tensors)
    with GGUFFile(shards[0]) as f, GGUFFile(single[0]) as g:
        assert f.paths == shards
        assert f.metadata["split.count"] == 3 and f.metadata["split.no"] == 0
        assert f.metadata["split.tensors.count"] == len(NAMES)
        assert f.metadata["llama.block_count"] == 2
        assert f.metadata["tokenizer.ggml.tokens"] == g.metadata["tokenizer.ggml.tokens"]
        assert list(f.tensors) == NAMES == list(g.tensors)
        for name, a in tensors.items():
            t = f.tensors[name]
            assert t.shape == a.shape == g.tensors[name].shape
            np.testing.assert_array_equal(t.data, a)
            np.testing.assert_array_equal(t.data, g.tensors[name].data)
        # tensors resolve into the shard that holds them, as gguf-py reads each shard
        for p in shards:
            for rt in gguf.GGUFReader(p).tensors:
                t = f.tensors[rt.name]
                assert t.file == p and t.offset == rt.data_offset
                assert int(t.type) == int(rt.tensor_type) and t.nbytes == rt.n_bytes
        assert {t.file for t in f.tensors.values()} == set(shards)


def test_missing_shard(split_model):
    _, shards = split_model
    shards[1].unlink()
    with pytest.raises(GGUFError, match=r"shard 2 of 3 .* is missing: .*m-00002-of-00003\.gguf"):
        GGUFFile(shards[0])


def test_opening_a_later_shard_points_to_the_first(split_model):
    _, shards = split_model
    with pytest.raises(GGUFError, match=r"shard 2 of 3.*open the first shard"):
        GGUFFile(shards[1])


def test_renamed_first_shard(split_model):
    _, shards = split_model
    renamed = shards[0].with_name("model.gguf")
    shards[0].rename(renamed)
    with pytest.raises(GGUFError, match="file name is not NAME-00001-of-00003.gguf"):
        GGUFFile(renamed)


def test_shard_from_another_model(split_model, tmp_path):
    """Same file name, but split.count / split.tensors.count / split.no do not match."""
    _, shards = split_model
    other = tmp_path / "other"
    other.mkdir()
    other_shards = write_gguf(other / "m.gguf", METADATA, make_tensors(NAMES + ["extra"], seed=1), split_max_tensors=3)
    shutil.copy(other_shards[2], shards[2])  # 8 tensors in that model, 7 in ours
    with pytest.raises(GGUFError, match=r"m-00003-of-00003\.gguf: does not belong.*split\.tensors\.count=7"):
        GGUFFile(shards[0])
    shutil.copy(shards[0], shards[1])  # shard 1 where shard 2 should be: split.no is 0, not 1
    with pytest.raises(GGUFError, match=r"expected split\.no=1"):
        GGUFFile(shards[0])


def test_tensor_in_two_shards(split_model, tmp_path):
    _, shards = split_model
    other = tmp_path / "other"
    other.mkdir()
    # same number of tensors and shards, but its second shard holds blk.0.w and blk.1.w again
    names = ["x0", "x1", "x2", "blk.0.w", "blk.1.w", "y0", "y1"]
    other_shards = write_gguf(other / "m.gguf", METADATA, make_tensors(names), split_max_tensors=3)
    shutil.copy(other_shards[1], shards[1])
    with pytest.raises(GGUFError, match="tensor 'blk.0.w' is also in m-00001-of-00003.gguf"):
        GGUFFile(shards[0])


def test_split_tensors_count_disagrees_with_the_shards(split_model):
    """Every shard claims 9 tensors (consistent metadata), the shards hold 7."""
    _, shards = split_model
    key = b"split.tensors.count"
    for p in shards:
        raw = bytearray(p.read_bytes())
        at = raw.index(key) + len(key)
        vtype, value = struct.unpack_from("<Ii", raw, at)
        assert vtype == gguf.GGUFValueType.INT32 and value == 7
        struct.pack_into("<i", raw, at + 4, 9)
        p.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match="split.tensors.count says 9 tensors, the 3 shard"):
        GGUFFile(shards[0])


def test_single_shard_split_metadata(tmp_path):
    """split.count = 1 is a plain file, whatever its name."""
    path = tmp_path / "one.gguf"
    T = gguf.GGUFValueType
    split = {
        "split.no": Typed(0, T.UINT16),
        "split.count": Typed(1, T.UINT16),
        "split.tensors.count": Typed(1, T.INT32),
    }
    write_gguf(path, split, {"t": np.ones(4, np.float32)})
    with GGUFFile(path) as f:
        assert list(f.tensors) == ["t"] and f.paths == [path]
