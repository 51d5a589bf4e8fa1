"""ggufrun side by side with llama.cpp (through llama-cpp-python) on the same GGUF, threads and prompt tokens.

    python benchmarks/compare.py smollm2-135m-instruct --prompt-tokens 128,512 --gen-tokens 64 --threads 2
    python benchmarks/compare.py gemma3-270m --json bench-results/compare-gemma3.json --png bench-results/gemma3.png

Runs are interleaved (ggufrun, llama.cpp, ggufrun, llama.cpp, ...) so that machine noise hits both alike; each
figure is the median (min-max) over --repeat runs after a warm-up, and the ratio is ggufrun / llama.cpp of the
medians (higher is better for tokens/s, lower for seconds). Generation is greedy with end-of-generation tokens
masked so both decode exactly --gen-tokens tokens. llama.cpp is timed through its Python binding the same way
ggufrun is timed: prompt eval, then one eval + argmax per token.

llama-cpp-python is not a dependency: `pip install llama-cpp-python` builds llama.cpp from source (about 10
minutes on 2 cores). Without it, this script runs ggufrun alone.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from _common import env_line, environment, fmt, log, prompt_ids, summarize, wait_compiled, write_json
from bench import run_ggufrun


class LlamaCpp:
    def __init__(self, path: str, threads: int, n_ctx: int):
        from llama_cpp import Llama

        t = time.perf_counter()
        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.load_s = time.perf_counter() - t
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.n_vocab = self.llm.n_vocab()
        vocab = self.llm._model.vocab
        self.eog = [i for i in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]

    def _argmax(self) -> int:
        # the binding keeps no logits unless logits_all: read the last row straight from the context
        ptr = self.llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        logits[self.eog] = -np.inf
        return int(np.argmax(logits))

    def run(self, ids: list[int], gen: int) -> dict:
        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tok = self._argmax()
        t_first = time.perf_counter()
        for _ in range(gen - 1):
            llm.eval([tok])
            tok = self._argmax()
        t2 = time.perf_counter()
        return {"ttft_s": t_first - t0, "prefill_tps": len(ids) / (t1 - t0), "decode_tps": (gen - 1) / (t2 - t_first)}


class Transformers:
    """transformers + torch on the same GGUF (dequantized to float32 by transformers' GGUF loader), greedy."""

    def __init__(self, path: str, threads: int, eog: list[int]):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        t = time.perf_counter()
        p = os.path.abspath(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(p), gguf_file=os.path.basename(p), dtype=torch.float32
        ).eval()
        self.load_s = time.perf_counter() - t
        self.eog = eog

    def _argmax(self, out) -> int:
        logits = out.logits[0, -1].clone()
        logits[self.eog] = -float("inf")
        return int(logits.argmax())

    def run(self, ids: list[int], gen: int) -> dict:
        torch = self.torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(torch.tensor([ids]), use_cache=True)
            t1 = time.perf_counter()
            tok = self._argmax(out)
            t_first = time.perf_counter()
            for _ in range(gen - 1):
                out = self.model(torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
                tok = self._argmax(out)
            t2 = time.perf_counter()
        return {"ttft_s": t_first - t0, "prefill_tps": len(ids) / (t1 - t0), "decode_tps": (gen - 1) / (t2 - t_first)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="path or known name")
    ap.add_argument("--prompt-tokens", default="128", help="comma-separated prompt lengths (default 128)")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None, help="bar chart of the ratios (needs matplotlib)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers + torch row")
    args = ap.parse_args()
    lengths = [int(x) for x in args.prompt_tokens.split(",")]

    import ggufrun
    import ggufrun.llm  # noqa: F401  the runtime (NumPy, Numba) is imported before timing load(), as llama_cpp is
    from ggufrun.hub import resolve

    path = str(resolve(args.model))
    n_ctx = max(lengths) + args.gen_tokens + 16
    env = environment(args.threads)
    log(f"loading ggufrun ({os.path.basename(path)})")
    t = time.perf_counter()
    ours = ggufrun.load(path, n_threads=args.threads, n_ctx=n_ctx)
    our_load = time.perf_counter() - t
    wait_compiled("ggufrun", lambda: ours.transformer.compiling)
    try:
        theirs = LlamaCpp(path, args.threads, n_ctx)
        log("llama-cpp-python loaded")
    except ImportError:
        theirs = None
        log("llama-cpp-python is not installed (pip install llama-cpp-python builds llama.cpp, ~10 min); "
            "running ggufrun alone")  # fmt: skip

    hf = None
    if not args.no_transformers:
        try:
            log("loading transformers + torch (weights dequantized to float32)")
            hf = Transformers(path, args.threads, sorted(ours.tokenizer.eog_ids))
        except ImportError:
            log("transformers/torch not installed: no transformers row (pip install torch transformers accelerate)")
    rows = []  # (figure, ours summary, theirs summary or None, higher_is_better)
    hf_rows = {}  # figure -> transformers summary
    results: dict = {"model": os.path.basename(path), "env": env, "args": vars(args), "figures": {}}
    cases = [(n, args.gen_tokens) for n in lengths] + [(20, 2)]  # the last one: warm TTFT of a 20-token prompt
    for n, gen in cases:
        ids = prompt_ids(ours.tokenize, n)
        run_ggufrun(ours, ids, gen)  # warm-up
        if theirs:
            theirs.run(ids, gen)
        if hf:
            hf.run(ids, gen)
        a, b, c = [], [], []
        for i in range(args.repeat):
            a.append(run_ggufrun(ours, ids, gen))
            if theirs:
                b.append(theirs.run(ids, gen))
            if hf:
                c.append(hf.run(ids, gen))
            log(f"prompt {n}: run {i + 1}/{args.repeat}")
        figs = ["ttft_s"] if n == 20 else ["prefill_tps", "decode_tps", "ttft_s"]
        for k in figs:
            label = {"ttft_s": f"time to first token, {n}-token prompt (s)",
                     "prefill_tps": f"prefill, {n}-token prompt (tok/s)",
                     "decode_tps": f"decode, {gen} tokens after {n} (tok/s)"}[k]  # fmt: skip
            sa = summarize([r[k] for r in a])
            sb = summarize([r[k] for r in b]) if b else None
            rows.append((label, sa, sb, k != "ttft_s"))
            if c:
                hf_rows[label] = summarize([r[k] for r in c])
            results["figures"][label] = {
                "ggufrun": sa,
                "llama.cpp": sb,
                "ratio": sa["median"] / sb["median"] if sb else None,
            }
    rows.append(("load() to ready (s)", {"median": our_load, "min": our_load, "max": our_load, "n": 1},
                 {"median": theirs.load_s, "min": theirs.load_s, "max": theirs.load_s, "n": 1} if theirs else None,
                 False))  # fmt: skip

    print(f"\n### {results['model']}: ggufrun vs llama.cpp (llama-cpp-python), {args.threads} threads, greedy\n")
    print(f"{env_line(env)}; medians (min-max) of {args.repeat} interleaved runs\n")
    if hf:
        hf_rows["load() to ready (s)"] = {"median": hf.load_s, "min": hf.load_s, "max": hf.load_s, "n": 1}
        results["transformers"] = hf_rows
    extra = " transformers (float32) |" if hf else ""
    print(f"| figure | ggufrun | llama.cpp | ggufrun / llama.cpp |{extra}\n|---|---|---|---|{'---|' if hf else ''}")
    for label, sa, sb, _ in rows:
        digits = 3 if "(s)" in label else 1
        ratio = f"{sa['median'] / sb['median']:.2f}" if sb else "n/a"
        cell = f" {fmt(hf_rows[label], digits)} |" if hf and label in hf_rows else (" n/a |" if hf else "")
        print(f"| {label} | {fmt(sa, digits)} | {fmt(sb, digits) if sb else 'n/a'} | {ratio} |{cell}")
    write_json(args.json, results)
    if args.png and theirs:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log("matplotlib is not installed (pip install 'ggufrun[bench]'); no chart")
        else:
            labels = [r[0] for r in rows]
            ratios = [r[1]["median"] / r[2]["median"] if r[3] else r[2]["median"] / r[1]["median"] for r in rows]
            fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.5))
            ax.barh(labels, ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
            ax.axvline(1.0, color="k", lw=1)
            ax.set_xlabel("ggufrun speed relative to llama.cpp (>1 = ggufrun faster)")
            ax.set_title(f"{results['model']}, {args.threads} threads")
            fig.tight_layout()
            fig.savefig(args.png, dpi=100)
            log(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
