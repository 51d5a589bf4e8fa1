"""ggufrun on one model: load time (cold and warm JIT cache), TTFT, prefill and decode tokens/s, peak RSS.

Targets checked (issue 15): the first run ever (import + load + first token with an empty JIT cache, which
compiles every kernel) within FIRST_RUN_TARGET_S, and the peak RSS of a fresh process (one load, one request)
within model file + KV cache + RSS_MARGIN_MB. The first run also reports the CPU seconds of this process and of
its compile helper processes: on a shared machine, wall time depends on what else runs.

    python benchmarks/bench.py smollm2-135m-instruct --prompt-tokens 128 --gen-tokens 64 --threads 2 --repeat 5
    python benchmarks/bench.py path/to/model.gguf --json bench-results/bench.json

Each figure is the median (min-max) over --repeat runs after one warm-up run. Generation is greedy with the
end-of-generation tokens masked, so every run decodes exactly --gen-tokens tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import (
    ROOT,
    env_line,
    environment,
    fmt,
    log,
    peak_rss_mb,
    prompt_ids,
    summarize,
    wait_compiled,
    write_json,
)

FIRST_RUN_TARGET_S = 10.0
RSS_MARGIN_MB = 100.0

_PROBE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import ggufrun
import ggufrun.llm  # the runtime (NumPy, Numba): `import ggufrun` alone defers it
t1 = time.perf_counter()
m = ggufrun.load(sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=512)
t2 = time.perf_counter()
next(iter(m.generate("Hello", max_tokens=1, temperature=0)))
t3 = time.perf_counter()
cpu = lambda who: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(who))  # noqa: E731
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_token_s": t3 - t2, "total_s": t3 - t0,
                  "cpu_s": cpu(resource.RUSAGE_SELF), "helpers_cpu_s": cpu(resource.RUSAGE_CHILDREN)}))
"""


_RSS_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[5])
import ggufrun
from _common import prompt_ids
n_prompt, n_gen = int(sys.argv[3]), int(sys.argv[4])
m = ggufrun.load(sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=n_prompt + n_gen + 8)
bias = {t: float("-inf") for t in m.tokenizer.eog_ids}
*_, last = m.generate(prompt_ids(m.tokenize, n_prompt), max_tokens=n_gen, temperature=0, logit_bias=bias)
assert last.stats.generated_tokens == n_gen
rss = {}  # resident MB (10^6 bytes) by mapping: the model file, LLVM (llvmlite), the KV cache, everything else
with open("/proc/self/smaps") as f:
    name = None
    for line in f:
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else "[anon]"
        elif head[0] == "Rss:":
            key = ("model file" if name.endswith(".gguf") else "llvmlite" if "llvmlite" in name
                   else "KV cache" if name == "/dev/zero" else "other")
            rss[key] = rss.get(key, 0) + int(head[1]) * 1024 / 1e6
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent (here, a process holding several
# loaded models), while VmHWM belongs to this process's own memory
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) * 1024 / 1e6 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"peak_rss_mb": hwm,
                  "kv_cache_mb": m.cache.nbytes / 1e6, "rss_by_mapping_mb": rss}))
"""


def rss_in_subprocess(path: str, threads: int, n_prompt: int, n_gen: int) -> dict:
    """Peak RSS of a fresh process that loads the model once and runs one n_prompt + n_gen request."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [path, str(threads), str(n_prompt), str(n_gen), os.path.dirname(os.path.abspath(__file__))]
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, *args], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def load_in_subprocess(path: str, threads: int, cold: bool) -> dict:
    """Import + load + first token in a fresh process; cold = an empty Numba cache directory."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as cache:
        if cold:
            env["NUMBA_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _PROBE, path, str(threads)], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        elapsed = time.perf_counter() - t0
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = elapsed  # start to exit: on the first run, the exit waits for the background compile
    return result


def run_ggufrun(model, ids: list[int], gen: int) -> dict:
    """One greedy request of exactly `gen` tokens from a fresh context; figures from the final chunk."""
    bias = {t: float("-inf") for t in model.tokenizer.eog_ids}
    model.reset()
    *_, last = model.generate(ids, max_tokens=gen, temperature=0, logit_bias=bias)
    s = last.stats
    assert s.generated_tokens == gen, (s.generated_tokens, gen)
    return {"ttft_s": s.ttft_s, "prefill_tps": s.prompt_tps, "decode_tps": s.generation_tps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="path or known name")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-JIT-cache load measurement (slow)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import ggufrun
    from ggufrun.hub import resolve

    path = str(resolve(args.model))
    env = environment(args.threads)
    results: dict = {"model": os.path.basename(path), "env": env, "args": vars(args)}

    if not args.no_cold:
        log("load with an empty JIT cache (compiles every kernel)")
        results["cold"] = load_in_subprocess(path, args.threads, cold=True)
    log("load with a warm JIT cache (fresh process)")
    results["warm_process"] = load_in_subprocess(path, args.threads, cold=False)

    loads = []
    for _ in range(3):
        t = __import__("time").perf_counter()
        model = ggufrun.load(path, n_threads=args.threads, n_ctx=max(512, args.prompt_tokens + args.gen_tokens + 8))
        loads.append(__import__("time").perf_counter() - t)
    results["load_s"] = summarize(loads)
    results["compile_wait_s"] = wait_compiled("ggufrun", lambda: model.transformer.compiling)  # (--no-cold)
    ids = prompt_ids(model.tokenize, args.prompt_tokens)
    log("warm-up run")
    run_ggufrun(model, ids, args.gen_tokens)
    runs = []
    for i in range(args.repeat):
        runs.append(run_ggufrun(model, ids, args.gen_tokens))
        r = runs[-1]
        log(f"run {i + 1}/{args.repeat}: prefill {r['prefill_tps']:.1f} tok/s, decode {r['decode_tps']:.1f} tok/s")
    for k in ("ttft_s", "prefill_tps", "decode_tps"):
        results[k] = summarize([r[k] for r in runs])
    results["peak_rss_mb_this_process"] = peak_rss_mb()  # after several loads and runs
    results["file_mb"] = os.path.getsize(path) / 1e6
    log("peak RSS of one load + one request (fresh process)")
    results["rss"] = rss_in_subprocess(path, args.threads, args.prompt_tokens, args.gen_tokens)

    print(f"\n### ggufrun: {results['model']}, {args.prompt_tokens}-token prompt, {args.gen_tokens} generated\n")
    print(f"{env_line(env)}\n")
    print("| figure | value (median, min-max) |\n|---|---|")
    if "cold" in results:
        c = results["cold"]
        verdict = "meets" if c["total_s"] <= FIRST_RUN_TARGET_S else "misses"
        print(f"| first run ever: import + load + first token (empty JIT cache) | {c['total_s']:.2f} s ({verdict} "
              f"the {FIRST_RUN_TARGET_S:.0f} s target; CPU: {c['cpu_s']:.1f} s here + {c['helpers_cpu_s']:.1f} s "
              f"in compile helpers; the process exits at {c['process_s']:.1f} s, once the kernels still compiling "
              "are saved) |")  # fmt: skip
    w = results["warm_process"]
    print(f"| fresh process, warm JIT cache: import / load / first token | {w['import_s']:.2f} / {w['load_s']:.2f} / "
          f"{w['first_token_s']:.2f} s |")  # fmt: skip
    print(f"| load() to ready, warm, in process | {fmt(results['load_s'], 3)} s |")
    print(f"| time to first token | {fmt(results['ttft_s'], 3)} s |")
    print(f"| prefill | {fmt(results['prefill_tps'])} tok/s |")
    print(f"| decode | {fmt(results['decode_tps'])} tok/s |")
    r = results["rss"]
    parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["rss_by_mapping_mb"].items()))
    print(f"| peak RSS, fresh process, one load + one request (file {results['file_mb']:.0f} MB, KV cache "
          f"{r['kv_cache_mb']:.0f} MB) | {r['peak_rss_mb']:.0f} MB (at exit: {parts} MB) |")  # fmt: skip
    over = r["peak_rss_mb"] - results["file_mb"] - r["kv_cache_mb"]
    results["rss_over_file_and_kv_mb"] = over
    verdict = "meets" if over <= RSS_MARGIN_MB else "misses"
    print(f"| peak RSS over file + KV cache | {over:+.0f} MB ({verdict} the +{RSS_MARGIN_MB:.0f} MB target) |")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
