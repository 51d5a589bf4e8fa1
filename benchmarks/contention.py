"""Decode and prefill speed while other processes keep cores busy: ggufrun at its default thread count, at 1
thread, and llama.cpp (llama-cpp-python, if installed) at its default, under the same load.

    python benchmarks/contention.py                        # SmolLM2 and Gemma3, quiet and loaded
    python benchmarks/contention.py smollm2-135m-instruct --repeat 7 --json bench-results/contention.json
    python benchmarks/contention.py --ungoverned           # also ggufrun without its ThreadGovernor (slow)

Load levels: quiet (nothing started here), then 1 of N cores busy, then N-1 of N when N > 2. The load is pure
spin-loop processes started by this script (SPIN), left to the OS scheduler. At each level the
runs are interleaved (every configuration once, then again, --repeat times) so that the machine's other work
hits them alike; each figure is the median (min-max) of the runs. Generation is greedy with end-of-generation
tokens masked, so every run decodes exactly --gen-tokens tokens. The 1-minute load average before each level is
printed: on a shared machine "quiet" only means that this script adds no load.

"ggufrun, no governor" (--ungoverned) is ggufrun at the default count with Transformer.governor disabled: every
parallel region then waits at its barrier for a descheduled thread, the behaviour the governor exists to avoid.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import env_line, environment, fmt, log, prompt_ids, summarize, wait_compiled, write_json
from bench import run_ggufrun

# a pure spin loop; every ~10 ms it checks that this script still runs, so that a killed run leaves no spinner
SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    for _ in range(100_000):\n        pass\n"


def load_levels(n_cores: int) -> list[int]:
    """Busy background processes per level: none, 1 of N, and N-1 of N when N > 2."""
    return [0, 1] + ([n_cores - 1] if n_cores > 2 else [])


def start_spinners(n: int) -> list[subprocess.Popen]:
    argv = [sys.executable, "-c", SPIN, str(os.getpid())]
    return [subprocess.Popen(argv, stdin=subprocess.DEVNULL) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


class Ggufrun:
    """ggufrun on one loaded model at a given thread count, with or without its ThreadGovernor."""

    def __init__(self, model, threads: int, governor: bool = True):
        self.model, self.threads, self.governor = model, threads, governor

    def run(self, ids: list[int], gen: int) -> dict:
        gov = self.model.transformer.governor
        self.model.n_threads = self.threads
        gov.enabled = self.governor
        steps, one, stalls = gov.steps, gov.steps_one, gov.stalls
        try:
            r = run_ggufrun(self.model, ids, gen)
        finally:
            gov.enabled = True
        if gov.steps > steps:
            r["one_thread_share"] = (gov.steps_one - one) / (gov.steps - steps)
            r["stalls"] = gov.stalls - stalls
        return r


def bench_model(name: str, args, n_cores: int) -> dict:
    import ggufrun
    from ggufrun.hub import resolve
    from ggufrun.runtime import physical_cores

    path = str(resolve(name))
    default = physical_cores()
    n_ctx = args.prompt_tokens + args.gen_tokens + 8
    model = ggufrun.load(path, n_ctx=n_ctx, n_threads=default)
    wait_compiled("ggufrun", lambda: model.transformer.compiling)
    ids = prompt_ids(model.tokenize, args.prompt_tokens)
    configs: dict = {
        f"ggufrun, {default} threads (default)": Ggufrun(model, default),
        "ggufrun, 1 thread": Ggufrun(model, 1),
    }
    if args.ungoverned:
        configs[f"ggufrun, {default} threads, no governor"] = Ggufrun(model, default, governor=False)
    try:
        if not args.no_llama:
            from compare import LlamaCpp

            configs[f"llama.cpp, {default} threads (default)"] = LlamaCpp(path, default, n_ctx)
    except ImportError:
        log("llama_cpp is not importable: llama.cpp rows skipped")
    for c in configs.values():  # warm-up (and JIT cache load) outside the timings
        c.run(ids, min(4, args.gen_tokens))

    result: dict = {"model": os.path.basename(path), "levels": []}
    for busy in load_levels(n_cores):
        procs = start_spinners(busy)
        try:
            time.sleep(1.0)  # let the spinners get going
            level = {"busy": busy, "loadavg_1min": os.getloadavg()[0], "configs": {}}
            runs: dict = {k: [] for k in configs}
            for i in range(args.repeat):
                for label, c in configs.items():
                    runs[label].append(c.run(ids, args.gen_tokens))
                    r = runs[label][-1]
                    stalls = f", {r['stalls']} stalls" if "stalls" in r else ""
                    log(f"{result['model']} busy {busy}/{n_cores} run {i + 1}: {label}: prefill "
                        f"{r['prefill_tps']:.1f} tok/s, decode {r['decode_tps']:.1f} tok/s{stalls}")  # fmt: skip
        finally:
            stop(procs)
        for label, rs in runs.items():
            level["configs"][label] = {k: summarize([r[k] for r in rs]) for k in rs[0]}
        result["levels"].append(level)
    return result


def print_table(res: dict, n_cores: int, args) -> None:
    print(f"\n### {res['model']}: {args.prompt_tokens}-token prompt, {args.gen_tokens} generated, "
          f"median (min-max) of {args.repeat}\n")  # fmt: skip
    print("| load | load avg before | configuration | prefill tok/s | decode tok/s | decode / 1-thread decode |")
    print("|---|---|---|---|---|---|")
    for level in res["levels"]:
        busy = level["busy"]
        where = "quiet" if busy == 0 else f"{busy} of {n_cores} cores busy"
        one = next(v for k, v in level["configs"].items() if k.startswith("ggufrun, 1 thread"))
        for label, v in level["configs"].items():
            share = v.get("one_thread_share")
            note = f" ({share['median']:.0%} of steps on 1 thread)" if share and share["median"] > 0.01 else ""
            ratio = v["decode_tps"]["median"] / one["decode_tps"]["median"]
            print(f"| {where} | {level['loadavg_1min']:.1f} | {label}{note} | {fmt(v['prefill_tps'])} | "
                  f"{fmt(v['decode_tps'])} | {ratio:.2f} |")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"], help="paths or names")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ungoverned", action="store_true", help="add ggufrun without its ThreadGovernor (slow)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even when llama_cpp is importable")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from ggufrun.runtime import physical_cores

    n_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env = environment(physical_cores())
    results = {"env": env, "args": vars(args), "cores": n_cores, "models": []}
    for name in args.models:
        results["models"].append(bench_model(name, args, n_cores))
    print(f"\n{env_line(env)}; {n_cores} cores; load: spin-loop processes")
    for res in results["models"]:
        print_table(res, n_cores, args)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
