"""Load-time benchmark: GGUF reader open time next to gguf-py's, tokenizer build time, model-ready time.

    python benchmarks/load.py                          # both known models
    python benchmarks/load.py gemma3-270m --repeat 9 --json bench-results/load.json
    python benchmarks/load.py path/to/model.gguf --no-gguf-py

Open time = GGUFFile(path): header parsed, metadata dict and tensor table ready (no tensor bytes read),
median (min) over --repeat runs in this process after one warm-up (the file is in the page cache).
Targets on the reference machine: Gemma3-270M <= 0.3 s, SmolLM2-135M <= 0.1 s.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

from _common import env_line, environment, log, write_json
from ggufrun import load
from ggufrun.hub import KNOWN_MODELS, resolve
from ggufrun.reader import GGUFFile
from ggufrun.tokenizer import load_tokenizer

TARGETS_S = {"gemma3-270m": 0.3, "smollm2-135m-instruct": 0.1}


def timed(fn, repeat: int, warmup: int = 1) -> dict:
    """Median/min/max seconds of fn() over `repeat` runs; what fn returns is freed outside the timing."""
    times = []
    for i in range(warmup + repeat):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        close = getattr(out, "close", None)
        if close:
            close()
        del out
        gc.collect()
        if i >= warmup:
            times.append(dt)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "n": len(times)}


def bench_model(name: str, repeat: int, gguf_py: bool, model_repeat: int) -> dict:
    path = resolve(name)
    out = {"model": name, "path": str(path), "target_s": TARGETS_S.get(name)}
    log(f"{name}: GGUFFile open x{repeat}")
    out["ggufrun_open"] = timed(lambda: GGUFFile(path), repeat)

    if gguf_py:
        import gguf

        log(f"{name}: gguf.GGUFReader open x1 (slow)")
        out["gguf_py_open"] = timed(lambda: gguf.GGUFReader(path), 1, warmup=0)

    log(f"{name}: load_tokenizer x{repeat}")
    with GGUFFile(path) as f:
        out["tokenizer_build"] = timed(lambda: load_tokenizer(f.metadata), repeat)

    # The first load in a process JIT-compiles (or loads the Numba cache); time it apart.
    log(f"{name}: ggufrun.load x{model_repeat + 1}")
    out["model_ready_first"] = timed(lambda: load(str(path), quiet=True), 1, warmup=0)
    out["model_ready"] = timed(lambda: load(str(path), quiet=True), model_repeat, warmup=0)
    return out


def _fmt(t: dict | None) -> str:
    if t is None:  # gguf-py skipped
        return "n/a"
    return f"{t['median_s']:.3f} s (min {t['min_s']:.3f})" if t["n"] > 1 else f"{t['median_s']:.3f} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", default=list(KNOWN_MODELS), help="known model names or GGUF paths")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per figure (median reported)")
    p.add_argument("--model-repeat", type=int, default=2, help="timed ggufrun.load() runs after the first")
    p.add_argument("--no-gguf-py", action="store_true", help="skip gguf.GGUFReader (8-9 s on Gemma 3)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    env = environment(threads=os.cpu_count())
    results = [bench_model(m, args.repeat, not args.no_gguf_py, args.model_repeat) for m in args.models]

    print(env_line(env))
    header = f"{'model':24s} {'GGUFFile open':>24s} {'target':>8s} {'gguf.GGUFReader':>16s} "
    header += f"{'tokenizer build':>24s} {'ggufrun.load (first)':>22s} {'ggufrun.load':>24s}"
    print(header)
    for r in results:
        target = r["target_s"]
        verdict = ""
        if target is not None:
            verdict = f"{'ok' if r['ggufrun_open']['median_s'] <= target else 'SLOW'} {target:.1f}s"
        print(
            f"{r['model']:24s} {_fmt(r['ggufrun_open']):>24s} {verdict:>8s} {_fmt(r.get('gguf_py_open')):>16s} "
            f"{_fmt(r['tokenizer_build']):>24s} {_fmt(r.get('model_ready_first')):>22s} "
            f"{_fmt(r['model_ready']):>24s}"
        )
    write_json(args.json, {"environment": env, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
