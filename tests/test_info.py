"""`ggufrun inspect`: summarize() against what gguf-py reports, and the command line through cli.main."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import gguf
import pytest
from synthetic import write_gguf
from test_reader import gguf_py_facts  # cached: gguf-py takes ~9 s to read Gemma 3
from test_split import METADATA, NAMES, make_tensors

from ggufrun.cli import main
from ggufrun.info import summarize
from ggufrun.reader import GGUFFile

GOLDEN = Path(__file__).parent / "data" / "golden"


def expected_from_gguf_py(paths: list[Path]) -> dict:
    """Tensor count, types, parameter count and bytes as gguf-py reads them (summed over shards)."""
    tensors = {}
    metadata = {}
    for p in paths:
        facts = gguf_py_facts(str(p))
        tensors.update(facts["tensors"])
        metadata = metadata or facts["metadata"]
    types = Counter(gguf.GGMLQuantizationType(t["type"]).name for t in tensors.values())
    return {
        "n_tensors": len(tensors),
        "tensors_per_type": dict(types),
        "n_params": sum(t["n_elements"] for t in tensors.values()),
        "weight_bytes": sum(t["n_bytes"] for t in tensors.values()),
        "metadata": {k: v for k, (_, v) in metadata.items()},
    }


def check_summary(path: Path, paths: list[Path], n_ctx=None) -> dict:
    want = expected_from_gguf_py(paths)
    with GGUFFile(path) as f:
        s = summarize(f, n_ctx=n_ctx)
    assert s["n_tensors"] == want["n_tensors"]
    assert s["tensors_per_type"] == want["tensors_per_type"]
    assert s["n_params"] == want["n_params"]
    assert s["weight_bytes"] == want["weight_bytes"] == sum(s["bytes_per_type"].values())
    assert s["bits_per_weight"] == pytest.approx(8 * want["weight_bytes"] / want["n_params"])
    assert [t["name"] for t in s["tensors"]] == [n for p in paths for n in gguf_py_facts(str(p))["tensors"]]
    assert s["files"] == [str(p) for p in paths]
    assert s["file_bytes"] == sum(p.stat().st_size for p in paths)
    json.dumps(s)  # JSON-ready
    return s


def kv_cache_bytes(meta: dict, arch: str, n_ctx: int) -> int:
    """The issue's formula: 2 x n_layer x n_ctx x n_head_kv x head_dim x 2 bytes (F16)."""
    n_embd, n_head = meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"]
    head_dim = meta.get(f"{arch}.attention.key_length", n_embd // n_head)
    return 2 * meta[f"{arch}.block_count"] * n_ctx * meta[f"{arch}.attention.head_count_kv"] * head_dim * 2


@pytest.mark.real
def test_smollm2(smollm2_path):
    s = check_summary(smollm2_path, [smollm2_path], n_ctx=2048)
    meta = expected_from_gguf_py([smollm2_path])["metadata"]
    assert s["architecture"] == "llama"
    assert s["tokenizer"]["model"] == "gpt2" and s["tokenizer"]["vocab_size"] == len(meta["tokenizer.ggml.tokens"])
    assert s["tokenizer"]["n_merges"] == len(meta["tokenizer.ggml.merges"])
    assert s["has_chat_template"] is True
    kv = kv_cache_bytes(meta, "llama", 2048)
    assert s["memory"] == {
        "n_ctx": 2048,
        "weights_bytes": s["weight_bytes"],
        "kv_cache_bytes": kv,
        "total_bytes": s["weight_bytes"] + kv,
    }
    # long arrays are summarised, short values kept
    assert s["metadata"]["tokenizer.ggml.tokens"]["length"] == 49152
    assert s["metadata"]["tokenizer.ggml.tokens"]["first"] == meta["tokenizer.ggml.tokens"][:5]
    assert s["metadata"]["llama.block_count"] == meta["llama.block_count"]


@pytest.mark.real
def test_gemma3(gemma3_path):
    s = check_summary(gemma3_path, [gemma3_path])
    meta = expected_from_gguf_py([gemma3_path])["metadata"]
    assert s["architecture"] == "gemma3"
    assert s["tokenizer"]["model"] == "llama" and s["tokenizer"]["vocab_size"] == 262144
    assert s["has_chat_template"] == ("tokenizer.chat_template" in meta)
    # default n_ctx: the model's context length; head_dim from attention.key_length (256, not 640 / 4)
    n_ctx = meta["gemma3.context_length"]
    assert s["memory"]["n_ctx"] == n_ctx
    assert s["memory"]["kv_cache_bytes"] == kv_cache_bytes(meta, "gemma3", n_ctx)


def test_split_model(tmp_path):
    shards = write_gguf(tmp_path / "m.gguf", METADATA, make_tensors(NAMES), split_max_tensors=3)
    s = check_summary(shards[0], shards, n_ctx=64)
    assert s["n_tensors"] == len(NAMES)
    assert len({t["file"] for t in s["tensors"]}) == 3


@pytest.mark.parametrize("name", ["small-llama-q4_k_s", "small-qwen2-q8_0"])
def test_small_golden(name):
    path = GOLDEN / f"{name}.gguf"
    s = check_summary(path, [path], n_ctx=512)
    meta = expected_from_gguf_py([path])["metadata"]
    arch = meta["general.architecture"]
    assert s["memory"]["kv_cache_bytes"] == kv_cache_bytes(meta, arch, 512)
    assert s["tokenizer"]["vocab_size"] == meta[f"{arch}.vocab_size"]


# -- the command line ----------------------------------------------------------------------------------------


def test_cli_text(capsys):
    path = GOLDEN / "small-llama-q4_k_s.gguf"
    assert main(["inspect", str(path), "--n-ctx", "512"]) == 0
    out = capsys.readouterr().out
    want = expected_from_gguf_py([path])
    assert "architecture llama" in out
    assert f"in {want['n_tensors']} tensors" in out
    assert "KV cache (F16, n_ctx=512)" in out
    for name in gguf_py_facts(str(path))["tensors"]:
        assert name in out


def test_cli_json_split(capsys, tmp_path):
    shards = write_gguf(tmp_path / "m.gguf", METADATA, make_tensors(NAMES), split_max_tensors=3)
    assert main(["inspect", str(shards[0]), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    with GGUFFile(shards[0]) as f:
        assert s == json.loads(json.dumps(summarize(f)))
    assert s["n_tensors"] == len(NAMES)


def test_cli_errors(capsys, tmp_path):
    assert main(["inspect", str(tmp_path / "nope.gguf")]) == 1
    assert "neither an existing file nor a known model name" in capsys.readouterr().err
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x10\0\0\0\0\0\0\0{}" + bytes(16))
    assert main(["inspect", str(bad)]) == 1
    assert "safetensors" in capsys.readouterr().err
    assert main(["inspect", str(GOLDEN / "small-llama-q8_0.gguf"), "--n-ctx", "0"]) == 1
    assert "--n-ctx" in capsys.readouterr().err
