"""Shared helpers for the benchmark scripts: prompts of an exact token count, medians, tables, environment."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TEXT = (
    "The history of computing is a story of people who wanted to calculate faster than they could by hand. "
    "Early mechanical calculators gave way to electromechanical machines, then to vacuum tubes, transistors and "
    "integrated circuits. Each step made machines smaller, cheaper and faster, and each step changed what people "
    "expected a computer to do. Today a laptop runs language models that answer questions in plain English. "
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


COMPILE_WAIT_S = 900  # the longest wait for a background compile (Gemma3's batched kernels on 2 busy cores: ~1 min)


def wait_compiled(name: str, compiling) -> float:
    """Wait while `compiling()` says a helper still compiles kernels in the background (Transformer.compiling, or a
    server's /health "compiling"): the first run after an install or a change to the kernels answers before its
    batched kernels are ready and runs its batched steps and prompts row by row until then, which a benchmark must
    not measure (Gemma3's 16-client ratio ~2x instead of ~5x with a fresh Numba cache, AMD EPYC Zen 4 VM,
    2026-12-07). Returns the seconds waited."""
    t0 = time.perf_counter()
    if not compiling():
        return 0.0
    log(f"{name} still compiles its batched kernels in the background (the first run after an install or a kernel "
        "change); waiting for them before measuring")  # fmt: skip
    while compiling():
        if time.perf_counter() - t0 > COMPILE_WAIT_S:
            raise RuntimeError(f"{name} still compiled its kernels after {COMPILE_WAIT_S} s")
        time.sleep(0.5)
    waited = time.perf_counter() - t0
    log(f"{name}: kernels compiled after {waited:.1f} s more")
    return waited


def prompt_ids(tokenize, n: int) -> list[int]:
    """Exactly n token ids of ordinary English text (the text repeated as needed)."""
    ids = tokenize(TEXT)
    while len(ids) < n:
        ids = ids + tokenize(TEXT)
    return ids[:n]


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s: dict, digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def environment(threads: int) -> dict:
    import numpy as np

    try:
        import numba

        numba_version = numba.__version__
    except ImportError:
        numba_version = None
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores_online": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba_version,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def env_line(env: dict) -> str:
    core = env["OPENBLAS_CORETYPE"]
    blas = f"OPENBLAS_CORETYPE={core} (set)" if core else "OPENBLAS_CORETYPE not set"
    return (
        f"{env['cpu']}, {env['threads']} threads, Python {env['python']}, NumPy {env['numpy']}, "
        f"Numba {env['numba']}, {blas}, {env['date']}"
    )


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2))
        log(f"wrote {path}")


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
