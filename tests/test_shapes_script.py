"""benchmarks/shapes.py: its shape table is the published models' (consistent head counts, parameter counts within
1% of the published ones), and its writer makes files ggufrun loads and runs (tiny versions of the shapes, F16,
no tokenizer; no llama.cpp needed)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import shapes  # noqa: E402

from ggufrun.reader import GGUFFile  # noqa: E402

# the architectures whose tiny versions are loaded and run (one shape each)
ONE_PER_ARCH = ["qwen2.5-0.5b", "llama3.2-1b", "gemma3-1b", "qwen3moe-30b-a3b-16e"]


@pytest.mark.parametrize("name", list(shapes.SHAPES))
def test_shape_is_consistent(name):
    s = shapes.SHAPES[name]
    assert s.n_head % s.n_head_kv == 0, "grouped-query attention: n_head is a multiple of n_head_kv"
    if s.arch in ("qwen2", "llama"):
        assert s.n_embd == s.n_head * s.head_dim  # their configs have no separate head_dim
    assert s.n_ff % 32 == 0 and s.n_embd % 32 == 0, "every quantized type needs rows of whole 32-value blocks"
    assert abs(s.n_params() - s.params) / s.params < 0.01, (s.n_params(), s.params)
    if s.n_expert:
        assert 0 < s.n_expert_used <= s.n_expert and s.expert_ff > 0
        assert s.n_active_params() < s.n_params()
    else:
        assert s.n_active_params() == s.n_params()
    names = [t[0] for t in s.tensors()]
    assert len(names) == len(set(names))
    assert ("output.weight" in names) == (not s.tied)


def test_reduced_moe_has_the_full_models_active_parameters():
    full, reduced = shapes.SHAPES["qwen3moe-30b-a3b"], shapes.SHAPES["qwen3moe-30b-a3b-16e"]
    router = full.n_layer * full.n_embd * (full.n_expert - reduced.n_expert)  # ffn_gate_inp, read whole
    assert reduced.n_active_params() + router == full.n_active_params()
    assert abs(full.n_active_params() - 3.35e9) / 3.35e9 < 0.01  # "A3B": 3.3B activated (Qwen3 model card)
    assert reduced.n_params() < full.n_params() / 5


@pytest.mark.parametrize("name", ONE_PER_ARCH)
def test_tiny_version_loads_and_runs(tmp_path, name):
    import ggufrun

    real = shapes.SHAPES[name]
    s = real.scaled()
    assert (s.arch, s.tied, s.n_head, s.n_head_kv) == (real.arch, real.tied, real.n_head, real.n_head_kv)
    path = shapes.write_shape(s, tmp_path / "tiny.gguf")
    with GGUFFile(path) as g:
        assert g.architecture == s.arch
        assert {n: t.shape for n, t in g.tensors.items()} == {n: shape for n, shape, _ in s.tensors()}
        assert sum(t.n_elements for t in g.tensors.values()) == s.n_params()
        assert {g.tensors[n].type.name for n, _, kind in s.tensors() if kind == "mat"} == {"F16"}
        total = sum(t.nbytes for t in g.tensors.values())
        read = shapes.decode_bytes(path, s.n_expert_used, s.n_expert)
        assert read == total if s.tied and not s.n_expert else read < total  # tied: token_embd is the output
    model = ggufrun.load(str(path), n_threads=1, n_ctx=64)
    try:
        assert model.n_vocab == s.vocab and model.config.n_layer == s.n_layer
        ids = [3, 1, 4, 1, 5, 9, 2, 6]
        logits = model.logits(ids)
        assert logits.shape == (len(ids), s.vocab) and np.isfinite(logits).all()
        assert logits.std() > 0.1  # random weights give spread logits, not a constant
        *_, last = model.generate(ids, max_tokens=4, temperature=0)
        assert last.stats.generated_tokens == 4
    finally:
        model.close()


def test_decode_bytes_counts_one_row_of_an_untied_embedding(tmp_path):
    s = shapes.SHAPES["qwen2.5-7b"].scaled()  # untied
    path = shapes.write_shape(s, tmp_path / "untied.gguf")
    with GGUFFile(path) as g:
        total = sum(t.nbytes for t in g.tensors.values())
        emb = g.tensors["token_embd.weight"]
        assert shapes.decode_bytes(path) == total - emb.nbytes + emb.nbytes // s.vocab
    moe = shapes.SHAPES["qwen3moe-30b-a3b-16e"].scaled()
    path = shapes.write_shape(moe, tmp_path / "moe.gguf")
    with GGUFFile(path) as g:
        exps = sum(t.nbytes for n, t in g.tensors.items() if "_exps" in n)
        rest = sum(t.nbytes for n, t in g.tensors.items() if "_exps" not in n and n != "token_embd.weight")
        emb = g.tensors["token_embd.weight"].nbytes // moe.vocab
    assert shapes.decode_bytes(path, moe.n_expert_used, moe.n_expert) == rest + emb + exps * 2 // 4
    assert math.isclose(moe.n_expert_used / moe.n_expert, 0.5)


def test_unknown_names_are_refused():
    with pytest.raises(SystemExit, match="--shapes: unknown"):
        shapes.main(["--shapes", "qwen9-100b"])
    with pytest.raises(SystemExit, match="--types: unknown"):
        shapes.main(["--types", "Q4_K_M,Q3_XYZ"])


def test_table_gives_each_rows_own_bandwidth_and_limit():
    row = {"shape": "llama3.2-1b", "type": "Q4_K_M", "file_gb": 0.8, "params_b": 1.24, "active_params_b": 1.24,
           "pp_tg_runs": "512/128 x3", "ggufrun_pp": {"median": 200.0}, "llama.cpp_pp": {"median": 100.0},
           "ggufrun_tg": {"median": 30.0}, "llama.cpp_tg": {"median": 40.0}, "load_avg": 0.5,
           "read_bandwidth_GBps": [36.0, 58.0, 40.0], "tg_limit": 50.0}  # fmt: skip
    line = shapes.table([row]).splitlines()[-1]
    assert "| 36.0-58.0 | 50.0 | 60% / 80% |" in line, line
    old = dict(row)
    del old["read_bandwidth_GBps"]  # a report written before the bandwidth was measured per round (--merge)
    assert "| - | 50.0 | 60% / 80% |" in shapes.table([old]).splitlines()[-1]
    assert all(
        len(x.split("|")) == len(shapes.table([row]).splitlines()[0].split("|"))
        for x in shapes.table([row]).splitlines()
    )


def test_report_names_ggufrun_batch_and_batch_must_be_positive(capsys):
    with pytest.raises(SystemExit, match="--batch must be >= 1"):
        shapes.main(["--shapes", "qwen2.5-0.5b", "--batch", "0"])
    row = {"shape": "llama3.2-1b", "type": "Q4_K_M", "file_gb": 0.8, "params_b": 1.24, "active_params_b": 1.24,
           "ggufrun_pp": {"median": 200.0}, "llama.cpp_pp": {"median": 100.0}, "ggufrun_tg": {"median": 30.0},
           "llama.cpp_tg": {"median": 40.0}, "load_avg": 0.5, "tg_limit": 50.0}  # fmt: skip
    args = {"pp": 512, "tg": 128, "repeat": 3, "threads": 2, "batch": 256}
    shapes.print_report([{"env": shapes.environment(2), "args": args, "read_bandwidth_GBps": 36.0, "rows": [row]}])
    assert "ggufrun n_batch 256;" in capsys.readouterr().out
