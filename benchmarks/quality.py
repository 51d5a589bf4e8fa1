"""Quality you can prove: perplexity and KL divergence of ggufrun (and of llama.cpp, when llama-cpp-python is
installed) against the float reference pass of the same GGUF weights, on the corpus in benchmarks/data.

    python benchmarks/quality.py                                   # SmolLM2 and Gemma3, windows of 512 tokens
    python benchmarks/quality.py gemma3-270m --ctx 256 --chunks 4 --json bench-results/quality.json

Per model: the reference (ggufrun.reference: weights dequantized to float32, no activation quantization, no float16
KV cache) scores the corpus first and its top-k logits are saved as the base (--bases DIR, reused when present);
then each engine scores the same windows (llama-perplexity's rule, ggufrun.perplexity) and is compared with the
base: PPL, ln(PPL / base PPL), mean / 99 % / max KLD, top-1 agreement, RMS dp of the correct token, max |dlogit|.
The same numbers come from the command line:

    ggufrun perplexity MODEL -f benchmarks/data/corpus.txt --reference --kl-save base.npz
    ggufrun perplexity MODEL -f benchmarks/data/corpus.txt --kl-base base.npz

llama-cpp-python is not a dependency (`pip install llama-cpp-python` builds llama.cpp from source, about 10
minutes on 2 cores); without it the llama.cpp rows are left out and the script says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from _common import ROOT, log, write_json

CORPUS = ROOT / "benchmarks" / "data" / "corpus.txt"
MODELS = ["smollm2-135m-instruct", "gemma3-270m"]


class LlamaCppLogits:
    """llama.cpp through llama-cpp-python: logits of every position of a window, in a fresh context."""

    def __init__(self, path: Path, n_ctx: int, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=True,
            verbose=False,
        )
        self.n_ctx = n_ctx

    def logits(self, ids) -> np.ndarray:
        self.llm.reset()
        self.llm.eval([int(i) for i in ids])
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

    def close(self) -> None:
        self.llm.close()


def row(model: str, engine: str, r) -> dict:
    k = r.kl
    return {
        "model": model,
        "engine": engine,
        "ppl": r.ppl,
        "ppl_err": r.ppl_err,
        "ln_ppl_ratio": k.ln_ppl_ratio if k else 0.0,
        "mean_kld": k.mean if k else None,
        "p99_kld": k.p99 if k else None,
        "max_kld": k.max if k else None,
        "top1": k.top1 if k else None,
        "rms_dp": k.rms_dp if k else None,
        "max_abs_dlogit": k.max_abs_dlogit if k else None,
        "seconds": r.seconds,
        "windows": f"{r.n_chunks}x{r.n_ctx}",
    }


def table(rows: list[dict]) -> str:
    head = (
        "| model | engine | windows | PPL | ln(PPL/ref) | mean KLD | 99% KLD | max KLD | top-1 | RMS dp "
        "| max abs dlogit | s |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        if r["mean_kld"] is None:
            kl = "(base) | - | - | - | - | - | -"
        else:
            kl = (
                f"{r['ln_ppl_ratio']:+.5f} | {r['mean_kld']:.6f} | {r['p99_kld']:.5f} | {r['max_kld']:.5f} | "
                f"{100 * r['top1']:.2f} % | {100 * r['rms_dp']:.3f} % | {r['max_abs_dlogit']:.4f}"
            )
        lines.append(
            f"| {r['model']} | {r['engine']} | {r['windows']} | {r['ppl']:.4f} +/- {r['ppl_err']:.4f} | {kl} | "
            f"{r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--file", default=str(CORPUS))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bases", default="bench-results/kl-bases", help="where reference bases are kept")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import ggufrun
    from ggufrun.hub import resolve
    from ggufrun.perplexity import perplexity
    from ggufrun.reader import GGUFFile
    from ggufrun.reference import ReferenceModel
    from ggufrun.tokenizer import load_tokenizer

    text = Path(args.file).read_text(encoding="utf-8")
    bases = Path(args.bases)
    bases.mkdir(parents=True, exist_ok=True)
    try:
        import llama_cpp  # noqa: F401

        have_llama_cpp = True
    except ImportError:
        have_llama_cpp = False
        log("llama-cpp-python is not installed: llama.cpp rows left out")

    rows = []
    for name in args.models:
        path = resolve(name)
        base = bases / f"{path.stem}-ctx{args.ctx}-{args.chunks or 'all'}.npz"
        with GGUFFile(path) as f:
            tokenizer = load_tokenizer(f.metadata)
            if not base.is_file():
                log(f"{name}: float reference -> {base}")
                r = perplexity(ReferenceModel(f, np.float32), text, tokenizer=tokenizer, n_ctx=args.ctx,
                               n_chunks=args.chunks, kl_save=base, label=name)  # fmt: skip
                rows.append(row(name, "float reference", r))
        log(f"{name}: ggufrun")
        with ggufrun.load(path, n_ctx=args.ctx, n_threads=args.threads) as model:
            rows.append(row(name, "ggufrun", perplexity(model, text, kl_base=base)))
        if have_llama_cpp:
            log(f"{name}: llama.cpp")
            lc = LlamaCppLogits(path, args.ctx, args.threads)
            try:
                rows.append(row(name, "llama.cpp", perplexity(lc, text, tokenizer=tokenizer, kl_base=base)))
            finally:
                lc.close()
    print(table(rows))
    write_json(args.json, {"corpus": args.file, "ctx": args.ctx, "rows": rows})


if __name__ == "__main__":
    main()
