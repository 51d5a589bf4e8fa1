"""Mixture-of-experts blocks (qwen2moe, qwen3moe, Mixtral-style llama) on small synthetic files: the forward pass
against the float64 NumPy reference, batch invariance, the routing kernels against NumPy, the bytes a decode step
reads, malformed expert metadata and tensors, and `ggufrun inspect`'s expert summary.

llama.cpp's own logits for such files are the goldens small-{qwen2moe,qwen3moe,mixtral}-q8_0 (test_model_golden.py).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from reference import reference_logits
from synthetic import Typed, rewrite_gguf, write_model

from ggufrun.errors import GGUFError
from ggufrun.info import format_text, summarize
from ggufrun.model import ModelConfig, Transformer, kernels
from ggufrun.reader import GGUFFile

VARIANTS = {
    "mixtral": {"arch": "llama", "n_expert": 4, "n_expert_used": 2},
    "qwen2moe": {"arch": "qwen2moe", "n_expert": 6, "n_expert_used": 2, "ff_exp": 32, "shared_ff": 64},
    "qwen3moe": {"arch": "qwen3moe", "n_expert": 8, "n_expert_used": 3, "ff_exp": 32},
}
TOKENS = np.random.default_rng(1).integers(0, 96, 23)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe")


def open_variant(model_dir, name) -> GGUFFile:
    path = model_dir / f"{name}.gguf"
    if not path.exists():
        write_model(path, **VARIANTS[name])
    return GGUFFile(path)


@pytest.mark.parametrize("name", VARIANTS)
def test_matches_reference(model_dir, name):
    f = open_variant(model_dir, name)
    ref = reference_logits(f, TOKENS)
    tf = Transformer(f, n_batch=8, kv_dtype=np.float32)
    assert np.abs(tf.logits(TOKENS) - ref).max() / ref.std() < 1e-3


@pytest.mark.parametrize("name", VARIANTS)
def test_batch_invariance(model_dir, name):
    """A token's logits are the same bits alone, in prefill chunks of any size, and beside other sequences."""
    tf = Transformer(open_variant(model_dir, name))
    whole = tf.logits(TOKENS)
    np.testing.assert_array_equal(Transformer(tf.gguf, n_batch=5).logits(TOKENS), whole)
    tf.cache.reset()
    steps = np.stack([tf.forward(TOKENS[i : i + 1]).copy() for i in range(len(TOKENS))])
    np.testing.assert_array_equal(steps, whole)
    a, b = tf.new_cache(), tf.new_cache()
    rows = tf.forward_batch([(a, TOKENS[:10]), (b, TOKENS[:4])]).copy()
    np.testing.assert_array_equal(rows, whole[[9, 3]])
    rows = tf.forward_batch([(a, TOKENS[10:11]), (b, TOKENS[4:11])])
    np.testing.assert_array_equal(rows, whole[[10, 10]])


def test_decode_takes_its_experts_in_one_product_per_matrix():
    """With an interleaved type (Q8_0) each expert's gate and up are copied into one matrix whose rows they are
    views of (LayerWeights.ffn_gate_up_exps), all experts' into one array (ffn_gate_up_stack), their downs into
    another (ffn_down_stack); a decode step takes its chosen experts' gate / up in one product and their downs in
    another: the same bits as each expert's fused product, as the three products apart, and as the prefill."""
    from dataclasses import replace
    from pathlib import Path

    f = GGUFFile(Path(__file__).parent / "data" / "golden" / "small-qwen3moe-q8_0.gguf")
    tf = Transformer(f)
    layer = tf.weights.layers[0]
    assert len(layer.ffn_gate_up_exps) == tf.config.n_expert
    fused = layer.ffn_gate_up_exps[1]
    assert np.shares_memory(fused.w, layer.ffn_gate_exps[1].w) and np.shares_memory(fused.w, layer.ffn_up_exps[1].w)
    # all experts' gate / up in one array, all their down matrices in another (weights.repack_matrices)
    assert np.shares_memory(fused.w.base, layer.ffn_gate_up_exps[0].w)
    assert layer.ffn_down_exps[1].packed and np.shares_memory(layer.ffn_down_exps[1].w.base, layer.ffn_down_exps[0].w)
    # and as stacks whose k chosen experts a decode step runs in one kernel call per matrix (Projector.experts)
    assert layer.ffn_gate_up_stack.w is fused.w.base and layer.ffn_down_stack.w is layer.ffn_down_exps[0].w.base
    calls = []
    experts = tf._project.experts
    tf._project.experts = lambda *a, **kw: calls.append(a[1]) or experts(*a, **kw)
    whole = tf.logits(TOKENS).copy()
    assert not calls  # prefill runs each chosen expert on its rows
    tf.cache.reset()
    steps = np.stack([tf.forward(TOKENS[i : i + 1]).copy() for i in range(len(TOKENS))])
    np.testing.assert_array_equal(steps, whole)
    assert len(calls) == 2 * len(TOKENS) * tf.config.n_layer
    for fields in ({"ffn_gate_up_stack": None}, {"ffn_gate_up_exps": ()}):  # each expert's fused gate / up; apart
        tf.weights = replace(tf.weights, layers=tuple(replace(lw, **fields) for lw in tf.weights.layers))
        tf.cache.reset()
        apart = np.stack([tf.forward(TOKENS[i : i + 1]).copy() for i in range(len(TOKENS))])
        np.testing.assert_array_equal(apart, steps)
    assert len(calls) == 2 * len(TOKENS) * tf.config.n_layer


def test_config(model_dir):
    c = ModelConfig.from_gguf(open_variant(model_dir, "qwen2moe"))
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (6, 2, 32, 64)
    assert c.spec.shared_expert and not c.spec.expert_weights_norm
    c = ModelConfig.from_gguf(open_variant(model_dir, "mixtral"))
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (4, 2, c.n_ff, 0)
    assert c.spec.expert_weights_norm
    c = ModelConfig.from_gguf(open_variant(model_dir, "qwen3moe"))
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (8, 3, 32, 0)


def test_decode_reads_only_the_chosen_experts(model_dir):
    """Per decode step each block reads n_expert_used of its n_expert experts' matrices (the rest of the 3-D tensor
    is untouched); a prefill reads each chosen expert once, whatever the number of tokens routed to it."""
    tf = Transformer(open_variant(model_dir, "qwen3moe"))
    c, layers = tf.config, tf.weights.layers
    per_expert = layers[0].expert_bytes
    assert per_expert == 3 * 32 * 64 * 4  # gate, up, down of one expert, F32
    tf.forward(TOKENS[:8])
    assert tf.expert_bytes_read <= c.n_layer * c.n_expert * per_expert
    for _ in range(3):
        before = tf.expert_bytes_read
        tf.forward([5])
        assert tf.expert_bytes_read - before == c.n_layer * c.n_expert_used * per_expert
    # the views share the file's memory: no expert was copied
    t = tf.gguf.tensors["blk.0.ffn_up_exps.weight"]
    assert all(np.shares_memory(lin.w, t.data) for lin in layers[0].ffn_up_exps)


def test_decode_allocates_nothing(tmp_path):
    path = write_model(tmp_path / "wide.gguf", "qwen2moe", vocab=8192, n_expert=6, ff_exp=32, shared_ff=64)
    tf = Transformer(GGUFFile(path))
    for _ in range(5):
        tf.forward([3])
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(50):
            tf.forward([3])
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 1024, f"decode grew traced memory by {after - before} bytes over 50 steps"
    assert peak - before < 8192, f"a decode step allocated {peak - before} bytes at its peak"


# ---- routing kernels against NumPy -----------------------------------------------------------------------------


def _route(logits, k, sigmoid=False, norm=False):
    sel, weights = np.zeros((logits.shape[0], k), np.int32), np.zeros((logits.shape[0], k), np.float32)
    kernels.route(logits.astype(np.float32).copy(), sigmoid, norm, sel, weights)
    return sel, weights


def test_route_softmax_top_k():
    logits = np.random.default_rng(0).standard_normal((50, 16)).astype(np.float32)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :4]
    sel, weights = _route(logits, 4)
    np.testing.assert_array_equal(sel, top)
    np.testing.assert_allclose(weights, np.take_along_axis(p, top, 1), rtol=1e-6)
    sel, weights = _route(logits, 4, norm=True)
    chosen = np.take_along_axis(p, top, 1)
    np.testing.assert_allclose(weights, chosen / chosen.sum(1, keepdims=True), rtol=1e-6)


def test_route_ties_sigmoid_and_clamp():
    # ties: the lower index first (std::sort's insertion sort for up to 16 experts keeps equal keys in order)
    sel, weights = _route(np.array([[1.0, 3.0, 1.0, 3.0, 0.0, 3.0]]), 4)
    assert sel.tolist() == [[1, 3, 5, 0]]
    assert weights[0, 0] == weights[0, 1] == weights[0, 2] > weights[0, 3]
    logits = np.array([[-2.0, 0.5, 4.0, -1.0]])
    sel, weights = _route(logits, 2, sigmoid=True)
    assert sel.tolist() == [[2, 1]]
    np.testing.assert_allclose(weights[0], 1 / (1 + np.exp(-logits[0, [2, 1]])), rtol=1e-6)
    # norm: the sum is clamped below at 2^-14 (build_moe_ffn), so tiny sigmoid weights are not blown up to 1
    sel, weights = _route(np.array([[-30.0, -31.0, -40.0]]), 2, sigmoid=True, norm=True)
    expected = 1 / (1 + np.exp([30.0, 31.0])) / 6.103515625e-5
    np.testing.assert_allclose(weights[0], expected, rtol=1e-5)


def test_group_and_combine():
    rng = np.random.default_rng(3)
    m, k, n_expert, n = 9, 3, 7, 5
    sel = np.stack([rng.permutation(n_expert)[:k] for _ in range(m)]).astype(np.int32)
    offsets, order, active = np.zeros(n_expert + 1, np.int32), np.zeros(m * k, np.int32), np.zeros(n_expert, np.int32)
    n_active = kernels.group_by_expert(sel, offsets, order, active)
    assert active[:n_active].tolist() == sorted(set(sel.ravel().tolist()))
    for e in range(n_expert):
        expected = [t * k + r for t in range(m) for r in range(k) if sel[t, r] == e]
        assert order[offsets[e] : offsets[e + 1]].tolist() == expected
    y = rng.standard_normal((m * k, n)).astype(np.float32)
    w = rng.random((m, k)).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    kernels.combine_experts(y, w, out)
    expected = y[0::k] * w[:, :1]
    for r in range(1, k):
        expected = expected + y[r::k] * w[:, r : r + 1]  # products rounded, then added in rank order
    np.testing.assert_array_equal(out, expected)


# ---- malformed files -----------------------------------------------------------------------------------------


def test_bad_expert_metadata(model_dir, tmp_path):
    src = model_dir / "qwen3moe.gguf"
    open_variant(model_dir, "qwen3moe")
    cases = [
        ({"qwen3moe.expert_used_count": Typed(9, 4)}, r"expert_used_count = 9 is out of range: expected 1 \.\. 8"),
        ({"qwen3moe.expert_count": None}, r"'qwen3moe\.expert_count' is missing"),
        ({"qwen3moe.expert_count": Typed(0, 4)}, r"expert_count = 0 is out of range"),
        ({"qwen3moe.expert_count": Typed(5000, 4)}, r"expert_count = 5000 is out of range: expected 1 \.\. 1024"),
        ({"qwen3moe.expert_count": Typed(4, 4)}, r"ffn_gate_inp\.weight.*\(8, 64\).*\(4, 64\).*expert_count 4"),
        ({"qwen3moe.expert_used_count": Typed(2.0, 6)}, r"expert_used_count = 2\.0 must be an integer"),
        ({"qwen3moe.expert_feed_forward_length": Typed(16, 4)}, r"ffn_gate_exps.*\(8, 32, 64\).*\(8, 16, 64\)"),
    ]
    for i, (changes, message) in enumerate(cases):
        path = rewrite_gguf(src, tmp_path / f"bad{i}.gguf", changes)
        with pytest.raises(GGUFError, match=message):
            Transformer(GGUFFile(path))


def test_bad_expert_tensors(tmp_path):
    kw = dict(arch="qwen2moe", n_expert=4, ff_exp=32, shared_ff=64)
    cases = [
        ({"blk.1.ffn_down_exps.weight": None}, r"blk\.1\.ffn_down_exps\.weight.*missing"),
        # a 2-D stand-in for a 3-D expert tensor never reaches a kernel
        ({"blk.0.ffn_up_exps.weight": (np.zeros((128, 64), np.float32), None)}, r"ffn_up_exps.*\(128, 64\)"),
        ({"blk.0.ffn_gate_inp_shexp.weight": None}, r"ffn_gate_inp_shexp\.weight.*missing"),
        ({"blk.0.ffn_gate.weight": (np.zeros((128, 64), np.float32), None)}, r"blk\.0\.ffn_gate\.weight.*not used"),
    ]
    for i, (override, message) in enumerate(cases):
        path = write_model(tmp_path / f"t{i}.gguf", **kw, override=override)
        with pytest.raises(GGUFError, match=message):
            Transformer(GGUFFile(path))
    # a dense llama file with a router but no expert_count: the router would be ignored, so it is refused
    path = write_model(tmp_path / "dense.gguf", override={"blk.0.ffn_gate_inp.weight": (np.zeros((4, 64)), None)})
    with pytest.raises(GGUFError, match=r"ffn_gate_inp\.weight.*not used"):
        Transformer(GGUFFile(path))


def test_inspect_shows_experts(model_dir):
    f = open_variant(model_dir, "qwen2moe")
    s = summarize(f)
    expert_params = 2 * 6 * 3 * 32 * 64  # 2 blocks x 6 experts x (gate, up, down) [32 x 64]
    assert s["experts"] == {"count": 6, "used": 2, "active_params": s["n_params"] - expert_params * 4 // 6}
    assert "experts       6, 2 used per token" in format_text(s)
    assert summarize(open_variant(model_dir, "mixtral"))["experts"]["count"] == 4
    with GGUFFile(write_model(model_dir / "dense.gguf")) as dense:
        assert summarize(dense)["experts"] is None


def test_load_and_chat(tmp_path):
    """The whole stack on a MoE file: kernels compiled for the experts' own weight type (F16 here), a chat reply."""
    import ggufrun

    rng = np.random.default_rng(0)
    experts = (rng.standard_normal((8, 32, 64)) / 8).astype(np.float16)
    path = write_model(
        tmp_path / "chat.gguf", "qwen3moe", n_expert=8, ff_exp=32, tokenizer="bytes",
        override={f"blk.{il}.ffn_up_exps.weight": (experts, None) for il in range(2)},
    )  # fmt: skip
    model = ggufrun.load(path)
    assert {e.qtype.name for e in model.transformer.weights.layers[0].ffn_up_exps} == {"F16"}
    chunks = list(model.chat([{"role": "user", "content": "hi"}], max_tokens=6, temperature=0))
    assert chunks[-1].finish_reason in ("length", "stop")
