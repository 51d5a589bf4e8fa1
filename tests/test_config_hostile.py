"""Hostile model metadata: every `{arch}.*` key ModelConfig reads, forged, must give a GGUFError naming the key and
its value, fast and without allocating anything sized by the forged number; never another exception, never a
model that loads and then computes NaN or constant logits.

Each file is a small synthetic model (synthetic.write_model) with one key rewritten (synthetic.rewrite_gguf), loaded
as the package loads it: Transformer(GGUFFile(path), n_ctx=...). Ranges follow how llama.cpp reads each key
(src/llama-model.cpp load_hparams, src/llama-hparams.h); see ggufrun/model/config.py.
"""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import Typed, rewrite_gguf, write_model

from ggufrun.errors import GGUFError
from ggufrun.info import summarize
from ggufrun.model import Transformer
from ggufrun.reader import GGUFFile

T = gguf.GGUFValueType
N_CTX = 64
BASES = {
    "llama": {"arch": "llama"},  # 2 blocks, embedding 64, 4 heads of 16, 2 KV heads, FFN 128
    "gemma3": {"arch": "gemma3", "n_layer": 6, "n_kv": 1, "window": 5, "softcap": 5.0},
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bases")
    return {name: write_model(d / f"{name}.gguf", **kw) for name, kw in BASES.items()}


def forged(bases, tmp_path, base: str, changes: dict, name: str = "forged.gguf") -> Path:
    """The base model with `changes` ({key without the `{arch}.` prefix: value or Typed, or None: drop})."""
    full = {(k if k.startswith("general.") else f"{base}.{k}"): v for k, v in changes.items()}
    return rewrite_gguf(bases[base], tmp_path / name, full)


def load(path: Path) -> Transformer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # n_ctx above a forged context_length only warns
        return Transformer(GGUFFile(path), n_ctx=N_CTX)


def refused(path: Path, key: str, value: str) -> str:
    """Load `path`; the GGUFError must name `key` and show `value`."""
    with pytest.raises(GGUFError) as e:
        load(path)
    msg = str(e.value)
    assert key in msg and value in msg, msg
    return msg


# -- the issue's items, each failing on the code before the checks -------------------------------------------

LOAD_AND_MEASURE = """
import sys, time
from ggufrun.errors import GGUFError
from ggufrun.model import Transformer
from ggufrun.reader import GGUFFile

def rss_kib(field):  # VmRSS: now; VmHWM: the peak so far
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

for path in sys.argv[1:]:
    f = GGUFFile(path)
    before = rss_kib("VmRSS")
    t0 = time.perf_counter()
    try:
        Transformer(f, n_ctx=64)
        outcome = "loaded"
    except GGUFError as e:
        outcome = "GGUFError: " + str(e)
    print(f"{time.perf_counter() - t0:.4f} {(rss_kib('VmHWM') - before) // 1024} {outcome}", flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_forged_block_count_fails_fast_and_small(bases, tmp_path):
    """block_count 2^32-1 once allocated 3.5 GB over 23 s (1e8: 1 GB) before any tensor check."""
    counts = [2**32 - 1, 10**8, 513, 3]
    paths = [forged(bases, tmp_path, "llama", {"block_count": Typed(n, T.UINT32)}, f"b{n}.gguf") for n in counts]
    # the first load pays for the imports' lazy parts: a valid model first, measured too
    run = subprocess.run(
        [sys.executable, "-c", LOAD_AND_MEASURE, str(bases["llama"]), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split(" ", 2)[2] == "loaded"
    for n, line in zip(counts, lines[1:]):
        seconds, mib, outcome = line.split(" ", 2)
        assert outcome.startswith("GGUFError") and f"llama.block_count = {n}" in outcome, outcome
        assert float(seconds) < 1.0 and int(mib) < 50, f"block_count {n}: {seconds} s, {mib} MiB peak RSS growth"
    assert "out of range" in lines[1] and "has tensors for 2 blocks" in lines[4]


def test_rope_dimension_count_zero(bases, tmp_path):
    """Was a ZeroDivisionError while building the rope table."""
    refused(forged(bases, tmp_path, "llama", {"rope.dimension_count": Typed(0, T.UINT32)}), "rope.dimension_count", "0")


@pytest.mark.parametrize("factor", [-2.0, 0.5, math.nan])
def test_yarn_factor_out_of_range(bases, tmp_path, factor):
    """A negative YaRN factor was a raw 'math domain error'; below 1 YaRN would divide by 1 + 0.1 ln(factor)."""
    changes = {"rope.scaling.type": "yarn", "rope.scaling.factor": Typed(factor, T.FLOAT32)}
    refused(
        forged(bases, tmp_path, "llama", changes), "llama.rope.scaling.factor", shown(changes["rope.scaling.factor"])
    )


@pytest.mark.parametrize("value", [4.5, 4.0, math.inf])
def test_head_count_not_an_integer(bases, tmp_path, value):
    """inf was an OverflowError; 4.5 was silently read as 4."""
    msg = refused(
        forged(bases, tmp_path, "llama", {"attention.head_count": Typed(value, T.FLOAT32)}),
        "llama.attention.head_count",
        repr(value),
    )
    assert "must be an integer, got float" in msg


def test_sliding_window_beyond_uint32(bases, tmp_path):
    """2^63 loaded, then overflowed int64 inside the attention kernel."""
    path = forged(bases, tmp_path, "gemma3", {"attention.sliding_window": Typed(2**63, T.UINT64)})
    refused(path, "gemma3.attention.sliding_window", str(2**63))


@pytest.mark.parametrize("eps", [math.inf, math.nan, 0.0, -1e-6, 1.0])
def test_rms_eps_out_of_range(bases, tmp_path, eps):
    """inf loaded and produced all-zero logits."""
    eps = Typed(eps, T.FLOAT32)
    path = forged(bases, tmp_path, "llama", {"attention.layer_norm_rms_epsilon": eps})
    refused(path, "llama.attention.layer_norm_rms_epsilon", shown(eps))


# -- every other key: type, range, consistency with the tensors ---------------------------------------------

U32, I32, U64, I64, F32, F64 = T.UINT32, T.INT32, T.UINT64, T.INT64, T.FLOAT32, T.FLOAT64
CASES = [
    # (base, key, value, what the message must say besides key and value)
    ("llama", "block_count", Typed(0, U32), "out of range"),
    ("llama", "block_count", Typed(-1, I32), "out of range"),
    ("llama", "block_count", Typed(True, T.BOOL), "must be an integer, got bool"),
    ("llama", "block_count", Typed(2.0, F32), "must be an integer, got float"),
    ("llama", "block_count", Typed("2", T.STRING), "must be an integer, got str"),
    ("llama", "block_count", Typed([2, 2], T.ARRAY, U32), "must be an integer, got an array"),
    ("llama", "block_count", Typed(1, U32), "tensors for 2 blocks"),
    ("llama", "block_count", None, "is missing"),
    ("llama", "embedding_length", Typed(65, U32), "token_embd.weight has shape (96, 64)"),
    ("llama", "embedding_length", Typed(2**64 - 1, U64), "out of range"),
    ("llama", "feed_forward_length", Typed(64, U32), "ffn_gate.weight' has shape (128, 64), expected (64, 64)"),
    ("llama", "feed_forward_length", Typed([128, 64], T.ARRAY, U32), "varies per block"),
    ("llama", "feed_forward_length", Typed([128], T.ARRAY, U32), "expected one per block (2)"),
    ("llama", "feed_forward_length", Typed([128.0, 128.0], T.ARRAY, F32), "must be integers"),
    ("llama", "feed_forward_length", Typed(["128", "128"], T.ARRAY, T.STRING), "got an array"),
    ("llama", "attention.head_count", Typed(0, U32), "out of range"),
    ("llama", "attention.head_count", Typed(2**63 - 1, I64), "out of range"),
    ("llama", "attention.head_count_kv", Typed(3, U32), "must divide attention.head_count (4)"),
    ("llama", "attention.head_count_kv", Typed(8, U32), "expected 1 .. 4"),
    ("llama", "attention.head_count_kv", Typed(0, U32), "out of range"),
    ("llama", "attention.head_count_kv", Typed([2, 2, 2], T.ARRAY, U32), "3-entry"),
    ("llama", "attention.key_length", Typed(0, U32), "out of range"),
    ("llama", "attention.value_length", Typed(2**40, U64), "out of range"),
    ("llama", "attention.value_length", Typed(8, U32), "attention.value_length 8"),  # a shape names the keys
    ("llama", "context_length", Typed(0, U32), "out of range"),
    ("llama", "context_length", Typed(-5, I64), "out of range"),
    ("llama", "attention.layer_norm_rms_epsilon", Typed(1e-300, F64), "(0, 1)"),  # 0 as float32
    ("llama", "attention.layer_norm_rms_epsilon", Typed("1e-6", T.STRING), "must be a number, got str"),
    ("llama", "attention.layer_norm_rms_epsilon", None, "is missing"),
    ("llama", "rope.dimension_count", Typed(15, U32), "must be even"),
    ("llama", "rope.dimension_count", Typed(18, U32), "expected 2 .. 16"),
    ("llama", "rope.dimension_count", Typed(2**63, U64), "out of range"),
    ("llama", "rope.freq_base", Typed(0.0, F32), "out of range"),
    ("llama", "rope.freq_base", Typed(1.0, F32), "(1, "),
    ("llama", "rope.freq_base", Typed(-10000.0, F32), "out of range"),
    ("llama", "rope.freq_base", Typed(1e300, F64), "out of range"),  # inf as float32
    ("llama", "rope.scaling.type", Typed("longrope", T.STRING), "not supported"),
    ("llama", "rope.scaling.type", Typed(3, U32), "not supported"),
    ("llama", "rope.scaling.factor", Typed(-1.0, F32), "out of range"),
    ("llama", "rope.scaling.factor", Typed(math.inf, F32), "out of range"),
    ("llama", "rope.scale_linear", Typed(math.nan, F32), "out of range"),
    ("llama", "rope.scaling.factor", Typed(1e-30, F32), "must be 0 (unset) or >= 1 with linear rope scaling"),
    ("llama", "rope.scaling.attn_factor", Typed(0.0, F32), "out of range"),
    ("llama", "rope.scaling.attn_factor", Typed(1e30, F32), "out of range"),
    ("llama", "rope.scaling.original_context_length", Typed(0, U32), "out of range"),
    ("llama", "final_logit_softcapping", Typed(-30.0, F32), "out of range"),
    ("llama", "final_logit_softcapping", Typed(math.inf, F32), "out of range"),
    ("gemma3", "rope.freq_base_swa", Typed(0.0, F32), "out of range"),
    ("gemma3", "attention.sliding_window", Typed(-1, I32), "out of range"),
    ("gemma3", "attention.sliding_window", Typed(4.0, F32), "must be an integer"),
    ("gemma3", "attention.sliding_window_pattern", Typed(2.5, F32), "must be an integer"),
    ("gemma3", "attention.sliding_window_pattern", Typed([True] * 5, T.ARRAY, T.BOOL), "one flag"),
    ("gemma3", "attention.sliding_window_pattern", Typed([1, 1, 1, 1, 1, 7], T.ARRAY, U32), "must hold flags"),
]


def shown(value: Typed) -> str:
    """How the message shows (the first entry of) a value: a FLOAT32 as the float32 the file holds."""
    v = value.value[0] if isinstance(value.value, list) else value.value
    if isinstance(v, str):
        return v
    return repr(float(np.float32(v))) if value.vtype == T.FLOAT32 or value.sub_type == T.FLOAT32 else repr(v)


@pytest.mark.parametrize("base,key,value,expect", CASES, ids=[f"{c[1]}={c[2] and c[2].value!r}" for c in CASES])
def test_malformed_key(bases, tmp_path, base, key, value, expect):
    path = forged(bases, tmp_path, base, {key: value})
    msg = refused(path, f"{base}.{key}", "" if value is None else shown(value))
    assert expect in msg, msg


def test_a_derived_default_out_of_range_says_so(bases, tmp_path):
    """Without key_length, head size is embedding_length // head_count: 0 here, named as the default it is."""
    changes = {"attention.head_count": Typed(128, U32), "attention.head_count_kv": None, "attention.key_length": None}
    msg = refused(forged(bases, tmp_path, "llama", changes), "llama.attention.key_length", "= 0")
    assert "the key is absent" in msg


def test_architecture_not_a_string(bases, tmp_path):
    path = forged(bases, tmp_path, "llama", {"general.architecture": Typed(["llama"], T.ARRAY, T.STRING)})
    with pytest.raises(GGUFError, match=r"architecture \['llama'\].* is not supported"):
        load(path)


def test_rope_freqs_must_be_positive(tmp_path):
    freqs = np.ones(8, np.float32)
    freqs[3] = 0.0
    path = write_model(tmp_path / "f.gguf", rope_freqs=True, override={"rope_freqs.weight": (freqs, None)})
    with pytest.raises(GGUFError, match="rope_freqs.weight.*finite positive"):
        load(path)


def test_per_layer_arrays_and_flags_load_as_their_scalars(bases, tmp_path):
    """Arrays of one equal entry per block (llama.cpp get_key_or_arr) and one SWA flag per block are accepted and
    give the same model as the scalars."""
    tokens = [1, 5, 9, 2, 7, 3, 8]
    scalar = load(bases["llama"]).logits(tokens)
    arrays = {
        "attention.head_count": Typed([4, 4], T.ARRAY, U32),
        "attention.head_count_kv": Typed([2, 2], T.ARRAY, I32),
        "feed_forward_length": Typed([128, 128], T.ARRAY, U64),
    }
    np.testing.assert_array_equal(load(forged(bases, tmp_path, "llama", arrays)).logits(tokens), scalar)
    gemma = load(bases["gemma3"])
    flags = [True] * 5 + [False]  # what the default pattern 6 gives
    tf = load(forged(bases, tmp_path, "gemma3", {"attention.sliding_window_pattern": Typed(flags, T.ARRAY, T.BOOL)}))
    assert tf.config.swa_layers == gemma.config.swa_layers == tuple(flags)
    np.testing.assert_array_equal(tf.logits(tokens), gemma.logits(tokens))


def test_inspect_shows_malformed_keys_as_unknown(bases, tmp_path):
    """`ggufrun inspect` reads the same keys for its KV-cache estimate: a forged one is "n/a", not a crash."""
    for changes in (
        {"block_count": Typed(2**32 - 1, U32)},
        {"attention.head_count": Typed("4", T.STRING), "attention.head_count_kv": None},
        {"attention.head_count_kv": Typed([2, 2, 2], T.ARRAY, U32)},
        {"embedding_length": Typed(True, T.BOOL), "attention.key_length": None},
        {"context_length": Typed(-1, I32)},
    ):
        path = forged(bases, tmp_path, "llama", changes)
        t0 = time.perf_counter()
        with GGUFFile(path) as f:
            s = summarize(f, n_ctx=N_CTX if "context_length" not in changes else None)
        assert time.perf_counter() - t0 < 1.0
        if "block_count" in changes:  # a plausible file otherwise: the estimate follows the forged count
            assert s["memory"]["kv_cache_bytes"] == (2**32 - 1) * 2 * N_CTX * (16 + 16) * 2
        else:
            assert s["memory"]["kv_cache_bytes"] is None, changes


# -- fuzzing: one key of a small model set to a hostile value ----------------------------------------------

CONFIG_KEYS = [
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
    "rope.dimension_count", "rope.freq_base", "rope.freq_base_swa", "rope.scaling.type", "rope.scaling.factor",
    "rope.scale_linear", "rope.scaling.attn_factor", "rope.scaling.original_context_length",
    "final_logit_softcapping", "attention.sliding_window", "attention.sliding_window_pattern",
]  # fmt: skip
INT_RANGES = {
    T.UINT8: (0, 2**8 - 1), T.INT8: (-(2**7), 2**7 - 1), T.UINT16: (0, 2**16 - 1), T.INT16: (-(2**15), 2**15 - 1),
    T.UINT32: (0, 2**32 - 1), T.INT32: (-(2**31), 2**31 - 1), T.UINT64: (0, 2**64 - 1), T.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip
EDGE_INTS = [0, 1, 2, 3, 4, 5, 6, 8, 16, 32, 64, 96, 128, 255, 256, 512, 513, 2**31 - 1, 2**31, 2**32 - 1, 2**32]
EDGE_INTS += [2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -1, -2, -(2**31), -(2**63)]
EDGE_FLOATS = [0.0, -0.0, 1e-6, 0.5, 1.0, 2.0, 16.0, 1e4, 1e6, 3.4e38, 1e-45, -1.0, math.nan, math.inf, -math.inf]


def _ints_of(vtype):
    lo, hi = INT_RANGES[vtype]
    return st.one_of(st.sampled_from([v for v in EDGE_INTS if lo <= v <= hi]), st.integers(lo, hi))


def _floats_of(vtype):
    return st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(width=32 if vtype == T.FLOAT32 else 64))


_int_type = st.sampled_from(list(INT_RANGES))
_float_type = st.sampled_from([T.FLOAT32, T.FLOAT64])
hostile_value = st.one_of(
    st.none(),  # the key dropped
    _int_type.flatmap(lambda t: _ints_of(t).map(lambda v: Typed(v, t))),
    _float_type.flatmap(lambda t: _floats_of(t).map(lambda v: Typed(v, t))),
    st.booleans().map(lambda v: Typed(v, T.BOOL)),
    st.sampled_from(["", "yarn", "linear", "none", "2", "nan", "x" * 300]).map(lambda v: Typed(v, T.STRING)),
    st.text(max_size=12).map(lambda v: Typed(v, T.STRING)),
    _int_type.flatmap(lambda t: st.lists(_ints_of(t), min_size=1, max_size=8).map(lambda v: Typed(v, T.ARRAY, t))),
    _float_type.flatmap(lambda t: st.lists(_floats_of(t), min_size=1, max_size=8).map(lambda v: Typed(v, T.ARRAY, t))),
    st.lists(st.booleans(), min_size=1, max_size=8).map(lambda v: Typed(v, T.ARRAY, T.BOOL)),
    st.lists(st.text(max_size=4), min_size=1, max_size=8).map(lambda v: Typed(v, T.ARRAY, T.STRING)),
)
_counter = itertools.count()
LOAD_SECONDS = 2.0  # a tiny model; a forged count that sized an allocation would take far longer
LOAD_PEAK_BYTES = 50 << 20  # traced by tracemalloc while loading (the model itself needs well under 1 MB)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(base=st.sampled_from(list(BASES)), key=st.sampled_from(CONFIG_KEYS), value=hostile_value)
def test_fuzz_one_config_key(bases, tmp_path, base, key, value):
    """A working model or a GGUFError naming the key, within a time and memory bound; nothing else."""
    path = forged(bases, tmp_path, base, {key: value}, f"fuzz{next(_counter)}.gguf")
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        tf = load(path)
    except GGUFError as e:
        tf = None
        # the message names the key, or (a forged shape) a tensor and the key behind it
        assert key in str(e) or re.search(r"tensor '[^']+' (is missing|has shape)", str(e)), str(e)
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        path.unlink()
    assert seconds < LOAD_SECONDS and peak < LOAD_PEAK_BYTES, f"{key}={value}: {seconds:.2f} s, {peak} bytes"
    if tf is not None:  # what loads must compute: finite logits that are not all equal
        logits = tf.logits([1, 2, 3, 4, 5])
        assert np.isfinite(logits).all() and (logits.max(axis=1) > logits.min(axis=1)).all(), f"{key}={value}"
