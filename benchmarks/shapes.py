"""The sizes people run: ggufrun and llama.cpp on synthetic models with the real shapes of 0.5B-8B models.

    python benchmarks/shapes.py                                   # every shape <= 4B, Q4_K_M/Q8_0/IQ4_XS, pp512 tg128
    python benchmarks/shapes.py --shapes qwen2.5-0.5b,llama3.2-1b --types Q4_K_M --repeat 3 --chart shapes.png
    python benchmarks/shapes.py --shapes llama3.1-8b --types Q4_K_M --pp 128 --tg 32 --repeat 1 --json out.json
    python benchmarks/shapes.py --shapes qwen2.5-1.5b --types Q5_K_M --repeat 2      # a type outside the default three
    python benchmarks/shapes.py --list                            # the shape table and parameter counts
    python benchmarks/shapes.py --merge a.json b.json --chart shapes.png   # one table of several --json runs
    python benchmarks/shapes.py --merge a.json --stat max         # the best run of each instead of the median

Each shape (SHAPES) has the hyper-parameters of a published model: layers, n_embd, n_ff, heads, KV heads, head_dim,
vocabulary, tied output, architecture (Qwen2.5-0.5B/1.5B/7B: config.json of Qwen/Qwen2.5-*; Llama-3.2-1B/3B and
Llama-3.1-8B: meta-llama/*; Gemma3-1B/4B: google/gemma-3-*-it, text model; Qwen3-30B-A3B: Qwen/Qwen3-30B-A3B), and
its parameter count matches the published one within 1% (tests/test_shapes_script.py). The weights are random:
write_shape() writes the F16 file with gguf-py's GGUFWriter one tensor at a time (memory stays at the largest
tensor, ~1.3 GB for Gemma3-4B's embedding; F32 would not fit an 8B model in memory), with no tokenizer
(`tokenizer.ggml.model` "none" and `{arch}.vocab_size`, which llama.cpp loads as dummy tokens: llama-vocab.cpp,
llama_vocab::impl::load), then llama.cpp's `llama-quantize F16 OUT TYPE` (the llama_model_quantize mixtures:
Q4_K_M keeps Q6_K for half the ffn_down/attn_v and the output, as real files do) makes each type. Matrix rows are
slices of one pool of N(0, 1) / sqrt(row length) values at random offsets: the speed of a matmul or of quantizing
does not depend on the values, and the pool makes writing disk-bound. Files are cached in ~/.cache/ggufrun/shapes
(not in the repository); the F16 file of a shape over 2B parameters is deleted once its types are made.

Timing, per shape and type, interleaved (warm-up of each, then ggufrun, llama.cpp, ggufrun, llama.cpp, ...):
prefill of a --pp-token prompt (random ids) and --tg decode steps from an empty context, each the median over
--repeat rounds, the way llama-bench measures pp512 / tg128 (tools/llama-bench/llama-bench.cpp test_prompt,
test_gen). ggufrun: `ggufrun.load(path, n_threads=T, n_batch=--batch)` once (by default load()'s n_batch, 256: each
implementation at its own default; on the Intel Ice Lake VM, pp512 at n_batch 128 / 256 / 512, alternating in one
process, medians of 5: qwen2.5-1.5b Q4_K_M 101.8 / 104.1 / 99.4 tok/s, llama3.2-1b 137.7 / 134.7 / 128.3, while
llama-bench -ub 256 / 512 gave 75.2-76.9 / 77.0-80.5 on the first), then per round `generate(prompt,
max_tokens=1)` (the prefill's prompt tokens/s) and `generate([id], max_tokens=tg + 1)` (tg decode steps after the
first token, greedy sampling included), as benchmarks/bench.py times requests. llama.cpp: one
`llama-bench -m F -t T -p PP -n TG -r 1 -o json` per round (its own warm-up each time) when the binary exists
(--llama-bin, default $LLAMA_CPP_BIN or /work/llama/build/bin), else llama-cpp-python (compare.py's LlamaCpp,
which times a prompt eval and TG one-token evals), else nothing (--no-llama: ggufrun alone).

The bandwidth limit: the read bandwidth of a parallel sum over a 1 GiB buffer (larger than any L3; kernels.py's
read_bandwidth) at T threads, divided by the bytes a decode step reads (decode_bytes: every weight, the output
projection included, but one row of an untied token_embd and n_expert_used / n_expert of each expert tensor; the
KV cache, a few MB at these lengths, is left out), is the decode tokens/s no implementation can beat; the table
gives each implementation's decode as a percentage of it. The bandwidth is measured before every round and a row's
limit takes the median of its rounds' (the table's "read GB/s" gives their range): a shared VM's bandwidth moves from
minute to minute (36-58 GB/s within an hour on the AMD EPYC VM), and one figure from the start of a run made the
later rows' percentages depend on the minute that figure was taken in. Also printed: the CPU, threads,
OPENBLAS_CORETYPE, and the 1-minute load average before each row (the machine may be shared: a load above the thread
count means other work took cores during that row).

The full Qwen3-30B-A3B shape (qwen3moe-30b-a3b) needs its F16 file (61 GB) and a Q4_K_M (18.6 GB) on disk at once,
and its quantization takes hours on 2 cores; the script refuses a shape whose F16 plus its types do not fit in the
free disk space, and says so. qwen3moe-30b-a3b-16e is the same model with 16 experts instead of 128 (8 used per
token, as in the real one): the same attention and expert parameters per token in a 5.2B-parameter file (3.34B
active against 3.35B: only its router is smaller), so its decode reads what the real model's reads.

Measured: README.md, "The sizes people run", holds every run's table with its command and machine. On the Intel
Xeon with AMX, 2 threads, read bandwidth 35.8-36.5 GB/s, llama-bench 0c1e570 alternating:

    python benchmarks/shapes.py --shapes qwen2.5-0.5b,llama3.2-1b,qwen2.5-1.5b,gemma3-1b,llama3.2-3b \
        --types Q4_K_M,Q8_0,IQ4_XS --repeat 2          # 2026-12-02: prefill 1.53-4.43x, decode 1.31-2.89x llama.cpp
    python benchmarks/shapes.py --shapes qwen3moe-30b-a3b-16e --types Q4_K_M --repeat 2
        # 2026-12-03 08:59: prefill 90.0 / 35.7 tok/s (2.52x), decode 11.6 / 8.7 (1.34x), 59% / 44% of the decode limit

On the AMD EPYC Zen 4 VM (no AMX), 2026-12-05, after decode from DRAM went to one stream a thread: Q4_K_M prefill
1.53-2.38x and decode 0.95-1.22x llama.cpp on the five dense shapes; Q8_0 prefill 2.15-2.37x, decode 1.31-1.51x;
IQ4_XS prefill 0.87-1.65x, decode 1.21-1.79x; the MoE shape 2.02x / 1.03x at 53% of the limit. qwen3moe-30b-a3b
(128 experts) does not fit either machine's disk and memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from _common import env_line, environment, log, summarize, write_json

CACHE = Path.home() / ".cache" / "ggufrun" / "shapes"
DEFAULT_LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN", "/work/llama/build/bin")
TYPES = ("Q4_K_M", "Q8_0", "IQ4_XS")
# bits per weight of llama-quantize's output, for the disk-space check before writing (Q4_K_M mixes Q6_K in)
BITS_PER_WEIGHT = {"Q4_K_M": 4.9, "Q5_K_M": 5.7, "Q8_0": 8.5, "IQ4_XS": 4.3, "F16": 16.0}  # --types takes any of these
DELETE_F16_ABOVE = 2e9  # parameters: keep the F16 of the small shapes (quick to requantize), not of the big ones
DISK_MARGIN = 2e9  # bytes left free after a shape's files


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters of one published model (its config.json), as the GGUF keys llama.cpp reads."""

    name: str
    arch: str  # general.architecture: qwen2, llama, gemma3, qwen3moe
    n_layer: int
    n_embd: int
    n_ff: int  # feed_forward_length (the dense FFN width; unused by an MoE block)
    n_head: int
    n_head_kv: int
    head_dim: int  # key_length = value_length
    vocab: int
    tied: bool  # no output.weight: the output projection is token_embd
    params: float  # the published parameter count (the text model's, for Gemma3-4B)
    ctx: int  # context_length (trained)
    rope_base: float
    rms_eps: float = 1e-6
    sliding_window: int = 0  # gemma3: local layers (5 of every 6) attend this far back
    rope_linear: float = 0.0  # gemma3-4b: linear rope scaling factor of the global layers
    rope_freqs: bool = False  # llama3: the rope_freqs.weight tensor of Llama 3.1/3.2 files
    n_expert: int = 0
    n_expert_used: int = 0
    expert_ff: int = 0  # expert_feed_forward_length
    note: str = ""

    def tensors(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(GGUF tensor name, NumPy shape, kind) in file order; kind: "mat" (F16 weights) or "vec" (F32 norms,
        biases, rope factors), as the converters write them (llama.cpp src/llama-model.cpp load_tensors)."""
        d, qd, kd = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        out = [("token_embd.weight", (self.vocab, d), "mat"), ("output_norm.weight", (d,), "vec")]
        if not self.tied:
            out.append(("output.weight", (self.vocab, d), "mat"))
        if self.rope_freqs:
            out.append(("rope_freqs.weight", (self.head_dim // 2,), "vec"))
        for il in range(self.n_layer):
            p = f"blk.{il}."
            out += [(p + "attn_norm.weight", (d,), "vec"), (p + "attn_q.weight", (qd, d), "mat"),
                    (p + "attn_k.weight", (kd, d), "mat"), (p + "attn_v.weight", (kd, d), "mat"),
                    (p + "attn_output.weight", (d, qd), "mat"), (p + "ffn_norm.weight", (d,), "vec")]  # fmt: skip
            if self.arch == "qwen2":
                out += [(p + "attn_q.bias", (qd,), "vec"), (p + "attn_k.bias", (kd,), "vec"),
                        (p + "attn_v.bias", (kd,), "vec")]  # fmt: skip
            if self.arch in ("gemma3", "qwen3moe"):
                out += [(p + "attn_q_norm.weight", (self.head_dim,), "vec"),
                        (p + "attn_k_norm.weight", (self.head_dim,), "vec")]  # fmt: skip
            if self.arch == "gemma3":
                out += [(p + "post_attention_norm.weight", (d,), "vec"), (p + "post_ffw_norm.weight", (d,), "vec")]
            if self.n_expert:
                e, f = self.n_expert, self.expert_ff
                out += [(p + "ffn_gate_inp.weight", (e, d), "vec"), (p + "ffn_gate_exps.weight", (e, f, d), "mat"),
                        (p + "ffn_up_exps.weight", (e, f, d), "mat"),
                        (p + "ffn_down_exps.weight", (e, d, f), "mat")]  # fmt: skip
            else:
                f = self.n_ff
                out += [(p + "ffn_gate.weight", (f, d), "mat"), (p + "ffn_up.weight", (f, d), "mat"),
                        (p + "ffn_down.weight", (d, f), "mat")]  # fmt: skip
        return out

    def n_params(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.tensors())

    def n_active_params(self) -> int:
        """Parameters one token's forward pass multiplies by: n_expert_used / n_expert of each expert tensor."""
        total = 0
        for name, shape, _ in self.tensors():
            n = math.prod(shape)
            total += n * self.n_expert_used // self.n_expert if "_exps" in name else n
        return total

    def scaled(self, head_dim: int = 16, n_layer: int = 2, vocab: int = 512, n_expert: int = 4) -> Shape:
        """A tiny model of the same architecture, head counts, tied output and layout: every width scaled by
        head_dim / self.head_dim (n_embd = n_head * head_dim kept where the real model has it)."""
        s = head_dim / self.head_dim

        def width(n: int) -> int:
            return max(32, round(n * s / 32) * 32)

        exact = self.n_embd == self.n_head * self.head_dim
        return replace(
            self, name=self.name + "-tiny", n_layer=n_layer, head_dim=head_dim, vocab=vocab,
            n_embd=self.n_head * head_dim if exact else width(self.n_embd), n_ff=width(self.n_ff),
            expert_ff=width(self.expert_ff) if self.n_expert else 0, n_expert=min(self.n_expert, n_expert),
            n_expert_used=min(self.n_expert_used, 2), sliding_window=min(self.sliding_window, 8),
            ctx=min(self.ctx, 512),
        )  # fmt: skip


# published figures: config.json of each model (the parameter count is what its model card states, or the sum of
# its tensors' sizes for the exact ones)
# fmt: off
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in [
        Shape("qwen2.5-0.5b", "qwen2", 24, 896, 4864, 14, 2, 64, 151936, True, 0.494e9, 32768, 1e6),
        Shape("llama3.2-1b", "llama", 16, 2048, 8192, 32, 8, 64, 128256, True, 1.236e9, 131072, 5e5, 1e-5,
              rope_freqs=True),
        Shape("qwen2.5-1.5b", "qwen2", 28, 1536, 8960, 12, 2, 128, 151936, True, 1.544e9, 32768, 1e6),
        Shape("gemma3-1b", "gemma3", 26, 1152, 6912, 4, 1, 256, 262144, True, 1.000e9, 32768, 1e6,
              sliding_window=512),
        Shape("llama3.2-3b", "llama", 28, 3072, 8192, 24, 8, 128, 128256, True, 3.213e9, 131072, 5e5, 1e-5,
              rope_freqs=True),
        Shape("gemma3-4b", "gemma3", 34, 2560, 10240, 8, 4, 256, 262208, True, 3.880e9, 131072, 1e6,
              sliding_window=1024, rope_linear=8.0, note="text model of gemma-3-4b-it (4.3B with vision)"),
        Shape("qwen2.5-7b", "qwen2", 28, 3584, 18944, 28, 4, 128, 152064, False, 7.616e9, 32768, 1e6),
        Shape("llama3.1-8b", "llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 8.030e9, 131072, 5e5, 1e-5,
              rope_freqs=True),
        Shape("qwen3moe-30b-a3b-16e", "qwen3moe", 48, 2048, 6144, 32, 4, 128, 151936, False, 5.15e9, 40960, 1e6,
              n_expert=16, n_expert_used=8, expert_ff=768,
              note="Qwen3-30B-A3B with 16 of its 128 experts, 8 used: its active parameters, a smaller router"),
        Shape("qwen3moe-30b-a3b", "qwen3moe", 48, 2048, 6144, 32, 4, 128, 151936, False, 30.53e9, 40960, 1e6,
              n_expert=128, n_expert_used=8, expert_ff=768),
    ]
}
# fmt: on
DEFAULT_SHAPES = ["qwen2.5-0.5b", "llama3.2-1b", "qwen2.5-1.5b", "gemma3-1b", "llama3.2-3b", "gemma3-4b"]


# -- writing and quantizing -------------------------------------------------------------------------------------


def write_shape(shape: Shape, path: Path, seed: int = 0, pool_size: int = 1 << 24) -> Path:
    """Write `shape` as a random-weight F16 GGUF (F32 norms and biases) with no tokenizer, one tensor at a time."""
    import gguf

    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(pool_size, dtype=np.float32)
    scaled_pools: dict[int, np.ndarray] = {}  # row length -> the pool times 1 / sqrt(row length), in F16

    def matrix(shape_: tuple[int, ...]) -> np.ndarray:
        cols = shape_[-1]
        if cols not in scaled_pools:
            scaled_pools[cols] = (pool / np.sqrt(cols)).astype(np.float16)
        src = scaled_pools[cols]
        out = np.empty(shape_, np.float16)
        flat = out.reshape(-1)
        chunk = (len(src) // 2) // cols * cols  # whole rows, from a random offset in the pool's first half
        for start in range(0, flat.size, chunk):
            n = min(chunk, flat.size - start)
            off = int(rng.integers(0, len(src) - n + 1))
            flat[start : start + n] = src[off : off + n]
        return out

    def vector(name: str, n: int) -> np.ndarray:
        if name.endswith(".bias"):
            return (0.3 * rng.standard_normal(n)).astype(np.float32)
        if name.startswith("rope_freqs"):
            return np.ones(n, np.float32)  # Llama 3's long-context factors; speed does not depend on them
        if "ffn_gate_inp" in name:  # the MoE router, kept in F32 by llama-quantize
            return (rng.standard_normal(n) / np.sqrt(shape.n_embd)).astype(np.float32)
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(shape.name)
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_freq_base(shape.rope_base)
    w.add_tokenizer_model("none")
    w.add_vocab_size(shape.vocab)
    if shape.sliding_window:
        w.add_sliding_window(shape.sliding_window)
    if shape.rope_linear:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(shape.rope_linear)
    if shape.n_expert:
        w.add_expert_count(shape.n_expert)
        w.add_expert_used_count(shape.n_expert_used)
        w.add_expert_feed_forward_length(shape.expert_ff)
    tensors = shape.tensors()
    for name, shape_, kind in tensors:
        dtype = np.float16 if kind == "mat" else np.float32
        w.add_tensor_info(name, shape_, np.dtype(dtype), math.prod(shape_) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape_, kind in tensors:
        w.write_tensor_data(matrix(shape_) if kind == "mat" else vector(name, math.prod(shape_)).reshape(shape_))
    w.close()
    return path


def llama_tool(llama_bin: str, name: str) -> str | None:
    exe = Path(llama_bin) / name
    return str(exe) if exe.is_file() and os.access(exe, os.X_OK) else shutil.which(name)


def shape_file(shape: Shape, qtype: str) -> Path:
    return CACHE / f"{shape.name}-{qtype.lower()}.gguf"


def ensure_files(shape: Shape, types: list[str], llama_bin: str, threads: int, keep_f16: bool) -> dict[str, Path]:
    """The quantized files of `shape` (cached), made from its F16 file; {type: path} of those that exist after."""
    CACHE.mkdir(parents=True, exist_ok=True)
    missing = [t for t in types if not shape_file(shape, t).exists()]
    if missing:
        quantize = llama_tool(llama_bin, "llama-quantize")
        if quantize is None:
            raise FileNotFoundError(f"llama-quantize not found in --llama-bin {llama_bin} nor on PATH")
        f16 = shape_file(shape, "F16")
        need = sum(shape.n_params() * BITS_PER_WEIGHT[t] / 8 for t in missing) + DISK_MARGIN
        need += 0 if f16.exists() else shape.n_params() * 2
        free = shutil.disk_usage(CACHE).free
        if need > free:
            raise OSError(
                f"{shape.name}: its F16 file and {', '.join(missing)} need {need / 1e9:.0f} GB of disk "
                f"({shape.n_params() * 2 / 1e9:.0f} GB F16), {free / 1e9:.0f} GB free in {CACHE}"
            )
        if not f16.exists():
            n = shape.n_params()
            log(f"{shape.name}: writing F16 ({n / 1e9:.2f}B parameters, {2 * n / 1e9:.1f} GB)")
            tmp = f16.with_suffix(".tmp")
            write_shape(shape, tmp)
            tmp.rename(f16)
        for t in missing:
            log(f"{shape.name}: llama-quantize -> {t}")
            dst = shape_file(shape, t)
            tmp = dst.with_suffix(".tmp")
            t0 = time.perf_counter()
            r = subprocess.run([quantize, str(f16), str(tmp), t, str(threads)], capture_output=True, text=True)
            if r.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise RuntimeError(f"llama-quantize {shape.name} {t} failed:\n{r.stderr[-2000:]}")
            tmp.rename(dst)
            log(f"{shape.name}: {t} {dst.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s")
        if shape.n_params() > DELETE_F16_ABOVE and not keep_f16:
            f16.unlink()
    return {t: shape_file(shape, t) for t in types}


# -- timing -----------------------------------------------------------------------------------------------------


def decode_bytes(path: Path, n_expert_used: int = 0, n_expert: int = 0) -> int:
    """Bytes of weights one decode step reads: every tensor, but one row of token_embd when the file has its own
    output.weight, and n_expert_used / n_expert of each expert tensor."""
    from ggufrun.reader import GGUFFile

    with GGUFFile(path) as g:
        total = 0
        for name, t in g.tensors.items():
            if name == "token_embd.weight" and "output.weight" in g.tensors:
                total += t.nbytes // t.shape[0]
            elif "_exps" in name and n_expert:
                total += t.nbytes * n_expert_used // n_expert
            else:
                total += t.nbytes
        return total


class Ours:
    """ggufrun on one file: pp = prompt tokens/s of a --pp-token prompt, tg = decode steps/s from an empty context."""

    def __init__(self, path: Path, threads: int, pp: int, tg: int, batch: int, seed: int = 1):
        import ggufrun

        t0 = time.perf_counter()
        self.model = ggufrun.load(str(path), n_threads=threads, n_ctx=max(pp, tg) + 16, n_batch=batch)
        self.load_s = time.perf_counter() - t0
        self.ids = np.random.default_rng(seed).integers(0, self.model.n_vocab, pp).tolist()
        self.tg = tg

    def _stats(self, ids: list[int], max_tokens: int):
        self.model.reset()
        *_, last = self.model.generate(ids, max_tokens=max_tokens, temperature=0)
        assert last.stats.generated_tokens == max_tokens, (last.stats.generated_tokens, max_tokens)
        return last.stats

    def warm_up(self) -> None:
        self._stats(self.ids, 2)

    def run(self) -> dict:
        pp = self._stats(self.ids, 1).prompt_tps
        tg = self._stats(self.ids[:1], self.tg + 1).generation_tps
        return {"pp": pp, "tg": tg}

    def close(self) -> None:
        self.model.close()


class LlamaBench:
    """llama.cpp through its llama-bench binary: one process per round, `-r 1`, with llama-bench's own warm-up."""

    def __init__(self, exe: str, path: Path, threads: int, pp: int, tg: int):
        self.cmd = [exe, "-m", str(path), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", "1", "-o", "json"]
        self.build = None

    def warm_up(self) -> None:
        self.run()

    def run(self) -> dict:
        r = subprocess.run(self.cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(self.cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
        tests = json.loads(r.stdout)
        self.build = f"{tests[0].get('build_commit')} ({tests[0].get('build_number')})"
        out = {}
        for t in tests:
            out["tg" if t["n_gen"] > 0 else "pp"] = float(t["avg_ts"])
        return out

    def close(self) -> None:
        pass


class LlamaCppPython:
    """llama.cpp through llama-cpp-python (when llama-bench is not built): compare.py's prompt eval + TG steps."""

    def __init__(self, path: Path, threads: int, pp: int, tg: int, seed: int = 1):
        from compare import LlamaCpp

        self.impl = LlamaCpp(str(path), threads, max(pp, tg) + 16)
        import llama_cpp

        self.build = f"llama-cpp-python {llama_cpp.__version__}"
        self.ids = np.random.default_rng(seed).integers(0, self.impl.n_vocab, pp).tolist()
        self.tg = tg

    def warm_up(self) -> None:
        self.impl.run(self.ids, 2)

    def run(self) -> dict:
        pp = self.impl.run(self.ids, 1)["prefill_tps"]
        tg = self.impl.run(self.ids[:1], self.tg + 1)["decode_tps"]
        return {"pp": pp, "tg": tg}

    def close(self) -> None:
        self.impl.llm.close()


def llama_cpp_runner(args, path: Path):
    if args.no_llama:
        return None
    exe = llama_tool(args.llama_bin, "llama-bench")
    if exe:
        return LlamaBench(exe, path, args.threads, args.pp, args.tg)
    try:
        return LlamaCppPython(path, args.threads, args.pp, args.tg)
    except ImportError:
        log("neither llama-bench nor llama-cpp-python: ggufrun alone")
        return None


def bench_file(args, shape: Shape, qtype: str, path: Path, measure_bandwidth) -> dict:
    """One shape and type: both implementations' rounds, interleaved, each round after a read-bandwidth measurement
    (measure_bandwidth() -> bytes/s); the decode limit is the median of those rounds' bandwidths over decode_bytes."""
    row = {"shape": shape.name, "type": qtype, "file_gb": path.stat().st_size / 1e9, "load_avg": os.getloadavg()[0],
           "params_b": shape.n_params() / 1e9, "active_params_b": shape.n_active_params() / 1e9}  # fmt: skip
    row["decode_bytes"] = decode_bytes(path, shape.n_expert_used, shape.n_expert)
    runners = {}
    try:
        runners["ggufrun"] = Ours(path, args.threads, args.pp, args.tg, args.batch)
        log(f"{shape.name} {qtype}: ggufrun loaded in {runners['ggufrun'].load_s:.1f} s")
    except Exception as e:  # a shape ggufrun cannot run is a result, not the end of the run
        row["ggufrun_error"] = f"{type(e).__name__}: {e}"
        log(f"{shape.name} {qtype}: ggufrun failed: {row['ggufrun_error']}")
    theirs = llama_cpp_runner(args, path)
    if theirs is not None:
        runners["llama.cpp"] = theirs
    results: dict[str, list[dict]] = {k: [] for k in runners}
    for who, r in list(runners.items()):
        try:
            r.warm_up()
        except Exception as e:
            row[f"{who}_error"] = f"{type(e).__name__}: {e}"
            log(f"{shape.name} {qtype}: {who} failed: {row[f'{who}_error']}")
            runners.pop(who).close()
            results.pop(who)
    bandwidths = []
    for i in range(args.repeat):
        bandwidths.append(measure_bandwidth())
        log(f"{shape.name} {qtype} round {i + 1}/{args.repeat}: read bandwidth {bandwidths[-1] / 1e9:.1f} GB/s")
        for who, r in runners.items():
            results[who].append(r.run())
            x = results[who][-1]
            log(f"{shape.name} {qtype} round {i + 1}/{args.repeat}: {who} pp {x['pp']:.1f} tg {x['tg']:.1f} tok/s")
    row["read_bandwidth_GBps"] = [b / 1e9 for b in bandwidths]
    row["tg_limit"] = statistics.median(bandwidths) / row["decode_bytes"]
    for who, r in runners.items():
        for k in ("pp", "tg"):
            row[f"{who}_{k}"] = summarize([x[k] for x in results[who]])
        if who == "llama.cpp":
            row["llama.cpp_build"] = r.build
        r.close()
    return row


# -- report -----------------------------------------------------------------------------------------------------


def _stat(row: dict, key: str, stat: str = "median") -> float | None:
    """The median, or the best ("max": tokens/s) of one figure's runs; None where it was not measured."""
    return row[key][stat] if key in row else None


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def table(rows: list[dict], stat: str = "median") -> str:
    lines = [
        "| shape | type | params (active) | file GB | pp/tg x runs | pp ggufrun | pp llama.cpp | pp ratio | tg ggufrun "
        "| tg llama.cpp | tg ratio | read GB/s | tg limit | tg % of limit (ggufrun / llama.cpp) | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['type']} | - | - | - | {r['skipped']} | | | | | | | | | |")
            continue
        bw = r.get("read_bandwidth_GBps")  # each round's (older reports: one figure for the whole run, in its header)
        bw = f"{min(bw):.1f}-{max(bw):.1f}" if bw else "-"
        params = f"{r['params_b']:.2f}B" + (
            f" ({r['active_params_b']:.2f}B)" if r["active_params_b"] != r["params_b"] else ""
        )
        pp, tp = _stat(r, "ggufrun_pp", stat), _stat(r, "llama.cpp_pp", stat)
        tg, tt = _stat(r, "ggufrun_tg", stat), _stat(r, "llama.cpp_tg", stat)
        lim = r["tg_limit"]
        pct = " / ".join("-" if x is None else f"{100 * x / lim:.0f}%" for x in (tg, tt))
        ours = "failed" if "ggufrun_error" in r else None
        lines.append(
            f"| {r['shape']} | {r['type']} | {params} | {r['file_gb']:.2f} | {r.get('pp_tg_runs', '')} | "
            f"{ours or _num(pp)} | {_num(tp)} | "
            f"{_ratio(pp, tp)} | {ours or _num(tg)} | {_num(tt)} | {_ratio(tg, tt)} | {bw} | {lim:.1f} | {pct} | "
            f"{r['load_avg']:.2f} |"
        )
    return "\n".join(lines)


def chart(rows: list[dict], png: str, stat: str = "median") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no chart (pip install matplotlib)")
        return
    rows = [r for r in rows if "ggufrun_pp" in r]
    labels = [f"{r['shape']}\n{r['type']}" for r in rows]
    x = np.arange(len(rows))
    fig, (a, b) = plt.subplots(2, 1, figsize=(max(6, 1.1 * len(rows) + 2), 7), sharex=True)
    for i, (key, name) in enumerate((("pp", "prefill"), ("tg", "decode"))):
        ratio = [r[f"ggufrun_{key}"][stat] / r[f"llama.cpp_{key}"][stat] if f"llama.cpp_{key}" in r else 0
                 for r in rows]  # fmt: skip
        a.bar(x + (i - 0.5) * 0.4, ratio, 0.4, label=name)
    a.axhline(1.0, color="k", lw=0.8)
    a.set_ylabel("ggufrun / llama.cpp (tokens/s)")
    a.legend()
    for i, who in enumerate(("ggufrun", "llama.cpp")):
        pct = [100 * r[f"{who}_tg"][stat] / r["tg_limit"] if f"{who}_tg" in r else 0 for r in rows]
        b.bar(x + (i - 0.5) * 0.4, pct, 0.4, label=who)
    b.set_ylabel("decode, % of the bandwidth limit")
    b.legend()
    b.set_xticks(x, labels, fontsize=7)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    log(f"wrote {png}")


def list_shapes() -> None:
    print("| shape | arch | layers | n_embd | n_ff | heads (kv) | head_dim | vocab | tied | params | published |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in SHAPES.values():
        ff = f"{s.n_expert}x{s.expert_ff} ({s.n_expert_used} used)" if s.n_expert else str(s.n_ff)
        heads = f"{s.n_head} ({s.n_head_kv})"
        print(f"| {s.name} | {s.arch} | {s.n_layer} | {s.n_embd} | {ff} | {heads} | {s.head_dim} | {s.vocab} "
              f"| {'yes' if s.tied else 'no'} | {s.n_params() / 1e9:.3f}B | {s.params / 1e9:.3f}B |")  # fmt: skip


def _names(text: str, known, what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or not names:
        raise SystemExit(f"--{what}: unknown {bad or text!r}; known: {', '.join(known)}")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"comma-separated, of: {', '.join(SHAPES)}")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated llama-quantize types")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("--tg", type=int, default=128, help="decode steps (default 128)")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds per shape and type (medians)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None, help="ggufrun n_batch (default: load()'s; llama-bench: 512)")
    ap.add_argument("--llama-bin", default=DEFAULT_LLAMA_BIN, help="folder of llama-bench / llama-quantize")
    ap.add_argument("--no-llama", action="store_true", help="time ggufrun alone")
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 files of the shapes over 2B parameters")
    ap.add_argument("--json", default=None, help="write the rows (rewritten after each one)")
    ap.add_argument("--chart", default=None, metavar="PNG", help="bar chart of the ratios and %% of the limit")
    ap.add_argument("--list", action="store_true", help="print the shape table and exit")
    ap.add_argument("--stat", choices=("median", "max"), default="median",
                    help="the figure of the runs the table shows: median, or max (the best tokens/s)")  # fmt: skip
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="print one table (and --chart) of earlier --json runs")
    args = ap.parse_args(argv)
    if args.list:
        list_shapes()
        return 0
    if args.merge:
        print_report([json.loads(Path(p).read_text()) for p in args.merge], args.chart, args.stat)
        return 0
    shapes = _names(args.shapes, SHAPES, "shapes")
    types = [t.upper() for t in _names(args.types.upper(), BITS_PER_WEIGHT, "types")]
    if args.batch is None:
        import inspect

        import ggufrun

        args.batch = inspect.signature(ggufrun.load).parameters["n_batch"].default
    for name, v in (("pp", args.pp), ("tg", args.tg), ("repeat", args.repeat), ("threads", args.threads),
                    ("batch", args.batch)):  # fmt: skip
        if v < 1:
            raise SystemExit(f"--{name} must be >= 1, got {v}")

    from kernels import read_bandwidth

    from ggufrun.runtime import on_compute_thread

    env = environment(args.threads)

    # on the compute thread, where ggufrun's forward passes run: a parallel sum started from this (main) thread would
    # give the process a second OpenMP pool, whose idle workers then sleep instead of spinning in every pool
    # (ggufrun.runtime's docstring), and SmolLM2's decode measured 118-126 -> 65-74 tok/s after it
    def measure_bandwidth() -> float:
        return 1e9 * on_compute_thread(read_bandwidth, args.threads, 1 << 30)

    bandwidth = statistics.median(measure_bandwidth() for _ in range(3))
    log(f"read bandwidth, {args.threads} threads, 1 GiB: {bandwidth / 1e9:.1f} GB/s")
    report = {"env": env, "args": vars(args), "read_bandwidth_GBps": bandwidth / 1e9, "rows": []}
    for name in shapes:
        shape = SHAPES[name]
        try:
            files = ensure_files(shape, types, args.llama_bin, args.threads, args.keep_f16)
        except (OSError, RuntimeError) as e:
            log(str(e))
            report["rows"] += [{"shape": name, "type": t, "skipped": str(e).splitlines()[0]} for t in types]
            continue
        for t in types:
            report["rows"].append(bench_file(args, shape, t, files[t], measure_bandwidth))
            write_json(args.json, report)
    report["load_avg_end"] = os.getloadavg()
    write_json(args.json, report)
    print_report([report], args.chart, args.stat)
    return 0


def print_report(reports: list[dict], png: str | None = None, stat: str = "median") -> None:
    """The markdown table of one run, or of several (--merge: their rows in order, each with its own pp/tg/runs)."""
    rows = []
    for rep in reports:
        a = rep["args"]
        rows += [{"pp_tg_runs": f"{a['pp']}/{a['tg']} x{a['repeat']}", **r} for r in rep["rows"]]
    builds = {r["llama.cpp_build"] for r in rows if r.get("llama.cpp_build")}
    env, a = reports[0]["env"], reports[0]["args"]
    bw = ", ".join(f"{rep['read_bandwidth_GBps']:.1f}" for rep in reports)
    ends = ", ".join(" / ".join(f"{x:.2f}" for x in rep["load_avg_end"]) for rep in reports if "load_avg_end" in rep)
    what = "medians" if stat == "median" else "the best"
    print(f"\n### ggufrun vs llama.cpp: prefill (pp) and decode (tg) tokens/s, {what} of the runs\n")
    batches = ", ".join(sorted({str(rep["args"].get("batch")) for rep in reports}))
    print(f"{env_line(env)}; llama.cpp {', '.join(sorted(builds)) or 'not run'}; ggufrun n_batch {batches}; read "
          f"bandwidth (1 GiB, {a['threads']} threads) {bw} GB/s; load average (1/5/15 min) at the end of each run: "
          f"{ends}\n")  # fmt: skip
    print(table(rows, stat))
    busy = sorted({r["shape"] for r in rows if r.get("load_avg", 0) > a["threads"] + 0.5})
    if busy:
        print(f"\nA load average above {a['threads']} (the threads used): other processes ran on the cores during "
              f"{', '.join(busy)}. llama.cpp's threads wait at each barrier by spinning (ggml_barrier), and decode "
              "has a barrier per op, so its decode loses more than ggufrun's when the cores are shared: there the "
              "tg ratios likely overstate ggufrun's lead.")  # fmt: skip
    errors = [(r["shape"], r["type"], k, r[k]) for r in rows for k in r if k.endswith("_error")]
    for s, t, k, e in errors:
        print(f"\n{s} {t}: {k.removesuffix('_error')}: {e}")
    if png:
        chart(rows, png, stat)


if __name__ == "__main__":
    sys.exit(main())
