"""Quality you can prove: perplexity and KL divergence of ggufrun and of llama.cpp (when llama-cpp-python is
installed) against the float reference pass of the same GGUF weights.

    python benchmarks/quality.py                          # SmolLM2, Gemma3 (corpus) and every tests/data/golden model
    python benchmarks/quality.py gemma3-270m --ctx 256 --chunks 4 --json bench-results/quality.json
    python benchmarks/quality.py --golden-only            # the small golden models only (3 minutes: 64 windows each)
    python benchmarks/quality.py --golden-only --golden "*moe*" --golden-chunks 16   # some of them, fewer windows
    python benchmarks/quality.py gemma3-270m --flash-attn # also llama.cpp with flash attention: its own float order
    python benchmarks/quality.py gemma3-270m --agreement 1100   # teacher-forced agreement on one 1,100-token prompt

Real models score benchmarks/data/corpus.txt (tokenized with the model's vocabulary, BOS first) in windows of --ctx
tokens; the small golden models (tests/data/golden/small-*.gguf, random weights, no tokenizer) score random token ids
(numpy seed --seed) in windows of --golden-ctx tokens. Per model, the reference (ggufrun.reference: weights
dequantized to float32, float64 for the small models; no activation quantization, no float16 KV cache) scores the
windows first and its top-k logits are saved as the base (--bases DIR, reused when present); then each engine scores
the same windows (llama-perplexity's rule, ggufrun.perplexity) and is compared with the base.

llama.cpp runs through llama-cpp-python's low-level API (`llama_decode` on a llama_batch that asks for the logits of
every position), as llama-perplexity evaluates a window: a fresh KV cache per window (llama_memory_clear), the
whole window in one batch (n_batch = n_ubatch = window), F16 K and V, flash attention off. llama-cpp-python is not a
dependency: without it the llama.cpp columns are left out and the script says so. The same numbers for ggufrun come
from the command line:

    ggufrun perplexity MODEL -f benchmarks/data/corpus.txt --reference --kl-save base.npz
    ggufrun perplexity MODEL -f benchmarks/data/corpus.txt --kl-base base.npz

Output: a summary table (model | PPL of each engine and of the float reference | mean KLD | top-1 agreement with
the float reference, and whether ggufrun's KLD <= llama.cpp's and its PPL is within 0.5 % of llama.cpp's), then
the detailed table (99 % / max KLD, RMS dp of the correct token, max |dlogit|, seconds).
"""

from __future__ import annotations

import argparse
import ctypes
import math
from pathlib import Path

import numpy as np

from _common import ROOT, log, write_json

CORPUS = ROOT / "benchmarks" / "data" / "corpus.txt"
GOLDEN = ROOT / "tests" / "data" / "golden"
MODELS = ["smollm2-135m-instruct", "gemma3-270m"]
PPL_TOLERANCE = 0.005  # the bound: ggufrun's perplexity within 0.5 % of llama.cpp's


class LlamaCppLogits:
    """llama.cpp through llama-cpp-python's low-level API: logits of every position of a window, in a fresh context.

    n_batch tokens go to one llama_decode (n_ubatch = n_batch: one graph evaluation, as ggufrun's prefill of a
    window); K and V are F16; flash_attn selects LLAMA_FLASH_ATTN_TYPE_ENABLED instead of DISABLED. repack=False
    keeps the weights in their GGUF layout (use_extra_bufts off): on AVX2, Q4_0 / IQ4_NL / Q4_K matrices are then
    multiplied by ggml_vec_dot_* instead of the interleaved ggml_gemm_*_8x8 kernels, the same integers summed in
    another float order."""

    def __init__(
        self,
        path: Path,
        n_ctx: int,
        threads: int,
        n_batch: int | None = None,
        flash_attn: bool = False,
        repack: bool = True,
    ):
        import llama_cpp as lc

        self.lc = lc
        self._quiet = lc.llama_log_callback(lambda level, text, user_data: None)  # kept: C holds the pointer
        lc.llama_log_set(self._quiet, None)
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = repack
        self.model = lc.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_ctx = n_ctx
        self.n_batch = n_batch or n_ctx
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, self.n_batch, self.n_batch, 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = lc.GGML_TYPE_F16
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise RuntimeError(f"llama.cpp could not make a context for {path}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(self.n_batch, 0, 1)

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), n_vocab]: row i after ids[0..i], positions 0.. of a fresh context."""
        lc, b = self.lc, self.batch
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        ids = [int(i) for i in ids]
        out = np.empty((len(ids), self.n_vocab), np.float32)
        for start in range(0, len(ids), self.n_batch):
            m = min(self.n_batch, len(ids) - start)
            for i in range(m):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = ids[start + i], start + i, 1, 1
                b.seq_id[i][0] = 0
            b.n_tokens = m
            rc = lc.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            ptr = ctypes.cast(lc.llama_get_logits(self.ctx), ctypes.POINTER(ctypes.c_float))
            out[start : start + m] = np.ctypeslib.as_array(ptr, shape=(m, self.n_vocab))
        return out

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def row(model: str, engine: str, r) -> dict:
    k = r.kl
    return {
        "model": model,
        "engine": engine,
        "ppl": r.ppl,
        "ppl_err": r.ppl_err,
        "ln_ppl_ratio": k.ln_ppl_ratio if k else 0.0,
        "mean_kld": k.mean if k else None,
        "mean_kld_err": k.mean_err if k else None,
        "p99_kld": k.p99 if k else None,
        "max_kld": k.max if k else None,
        "top1": k.top1 if k else None,
        "rms_dp": k.rms_dp if k else None,
        "max_abs_dlogit": k.max_abs_dlogit if k else None,
        "seconds": r.seconds,
        "windows": f"{r.n_chunks}x{r.n_ctx}",
        "_kl_positions": r.kl_positions,  # in memory only: the paired comparison in summary()
    }


def table(rows: list[dict]) -> str:
    """Every row: the detailed numbers of each engine against the float reference."""
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
            f"| {r['model']} | {r['engine']} | {r['windows']} | {_fmt_ppl(r['ppl'])} +/- {_fmt_ppl(r['ppl_err'])} | "
            f"{kl} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def _fmt_ppl(v: float) -> str:
    return f"{v:.4f}" if v < 1e6 else f"{v:.4e}"  # the tied golden models' random weights give PPL ~ 1e82


def paired(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """mean(a - b) over the same positions and its standard error."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return float(d.mean()), float(d.std() / math.sqrt(max(d.size - 1, 1)))


def summary(rows: list[dict]) -> tuple[str, list[dict]]:
    """One line per model: PPL of ggufrun / llama.cpp / float reference, KLD and top-1 of ggufrun and llama.cpp
    against the float reference, the paired difference of the two KLDs over the same positions (+/- its standard
    error) and the issue's checks: KLD <= llama.cpp's (or above it by less than 2 standard errors: "noise"),
    PPL within 0.5 % of llama.cpp's."""
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["engine"]] = r
    lines = [
        "| model | ppl ggufrun | ppl llama.cpp | ppl float | KLD ggufrun | KLD llama.cpp | KLD ggufrun - llama.cpp "
        "| top-1 ggufrun | top-1 llama.cpp | KLD <= llama.cpp | ppl within 0.5 % |",
        "|" + "---|" * 11,
    ]
    checks = []
    for model, engines in by_model.items():
        g, lc, ref = engines.get("ggufrun"), engines.get("llama.cpp"), engines.get("float reference")
        if g is None:
            continue
        ref_ppl = ref["ppl"] if ref else math.exp(math.log(g["ppl"]) - g["ln_ppl_ratio"])
        check = {"model": model, "kld_diff": None, "kld_diff_err": None, "kld_le": None, "ppl_ok": None}
        cells = ["-"] * 5
        if lc is not None:
            diff, err = paired(g["_kl_positions"], lc["_kl_positions"])
            ppl_ok = abs(g["ppl"] / lc["ppl"] - 1) <= PPL_TOLERANCE
            kld_le = "yes" if diff <= 0 else ("noise" if diff <= 2 * err else "no")
            check.update(kld_diff=diff, kld_diff_err=err, kld_le=kld_le, ppl_ok=ppl_ok)
            cells = [
                _fmt_ppl(lc["ppl"]),
                f"{lc['mean_kld']:.6f}",
                f"{diff:+.6f} +/- {err:.6f}",
                f"{100 * lc['top1']:.2f} %",
                kld_le if kld_le != "no" else "**no**",
            ]
        checks.append(check)
        lines.append(
            f"| {model} | {_fmt_ppl(g['ppl'])} | {cells[0]} | {_fmt_ppl(ref_ppl)} | {g['mean_kld']:.6f} | {cells[1]} | "
            f"{cells[2]} | {100 * g['top1']:.2f} % | {cells[3]} | {cells[4]} | "
            f"{'-' if check['ppl_ok'] is None else ('yes' if check['ppl_ok'] else '**no**')} |"
        )
    return "\n".join(lines), checks


def score_model(name: str, path: Path, args, tokens=None, text=None, golden: bool = False) -> list[dict]:
    """The reference base (made once), then ggufrun and llama.cpp against it; one row per engine."""
    import ggufrun
    from ggufrun.model import Transformer
    from ggufrun.perplexity import perplexity
    from ggufrun.reader import GGUFFile
    from ggufrun.reference import ReferenceModel
    from ggufrun.tokenizer import load_tokenizer

    ctx, chunks = (args.golden_ctx, args.golden_chunks) if golden else (args.ctx, args.chunks)
    seed = f"-seed{args.seed}" if golden else ""
    base = Path(args.bases) / f"{path.stem}-ctx{ctx}-{chunks or 'all'}{seed}.npz"
    rows = []
    with GGUFFile(path) as f:
        tokenizer = None if golden else load_tokenizer(f.metadata)
        if not base.is_file():
            log(f"{name}: float reference -> {base}")
            ref = ReferenceModel(f, np.float64 if golden else np.float32, n_ctx=ctx)
            r = perplexity(ref, text, tokens=tokens, tokenizer=tokenizer, n_ctx=ctx, n_chunks=chunks, kl_save=base,
                           label=name)  # fmt: skip
            rows.append(row(name, "float reference", r))
            del ref
        if golden and "ggufrun" in args.engines:
            log(f"{name}: ggufrun")
            model = Transformer(f, n_ctx=ctx, n_batch=ctx)
            rows.append(row(name, "ggufrun", perplexity(model, kl_base=base)))
            del model
    if not golden and "ggufrun" in args.engines:
        log(f"{name}: ggufrun")
        with ggufrun.load(path, n_ctx=ctx, n_threads=args.threads) as model:
            rows.append(row(name, "ggufrun", perplexity(model, kl_base=base)))
    if args.have_llama_cpp and "llama.cpp" in args.engines:
        for engine, fa in [("llama.cpp", False)] + ([("llama.cpp flash-attn", True)] if args.flash_attn else []):
            log(f"{name}: {engine}")
            lc = LlamaCppLogits(path, ctx, args.threads, flash_attn=fa)
            try:
                rows.append(row(name, engine, perplexity(lc, kl_base=base)))
            finally:
                lc.close()
    return rows


class RowDigest:
    """What agreement() keeps of one engine's logits [N, n_vocab]: the argmax, the float64 log-sum-exp and the
    logits at the float reference's top_k ids of each row (4.5 MB for 1,100 rows, instead of 1.1 GB)."""

    def __init__(self, logits: np.ndarray, ref_ids: np.ndarray):
        from ggufrun.perplexity import _log_sum_exp

        rows = np.asarray(logits, np.float32)
        self.top1 = rows.argmax(axis=1)
        self.lse = _log_sum_exp(rows.astype(np.float64))
        self.at_ref = np.take_along_axis(rows, ref_ids, axis=1).astype(np.float64)


def agreement(name: str, path: Path, text: str, n_tokens: int, args) -> tuple[str, list[dict]]:
    """Teacher-forced agreement on one long prompt (the first n_tokens of the text, one batch, positions 0..):
    every engine's KLD and top-1 agreement against the float reference, and its top-1 agreement with llama.cpp and
    mean / max |logit difference| at llama.cpp's top token. The llama.cpp variants (weights not repacked, flash
    attention) change only the float order of llama.cpp's own computation: their distance to llama.cpp is the
    size of float-order noise."""
    import ggufrun
    from ggufrun.perplexity import _top_k, kl_rows
    from ggufrun.reader import GGUFFile
    from ggufrun.reference import ReferenceModel
    from ggufrun.tokenizer import load_tokenizer

    with GGUFFile(path) as f:
        ids = load_tokenizer(f.metadata).tokenize(text, add_special=True, parse_special=False)[:n_tokens]
        if len(ids) < n_tokens:
            raise SystemExit(f"the text tokenizes to {len(ids)} tokens, fewer than --agreement {n_tokens}")
        log(f"{name}: float reference, {len(ids)} tokens")
        ref_logits = ReferenceModel(f, np.float32, n_ctx=n_tokens).logits(ids)
        ref_ids = _top_k(ref_logits.astype(np.float64), min(1024, ref_logits.shape[1]))
        ref = RowDigest(ref_logits, ref_ids)
        del ref_logits
    engines: dict[str, RowDigest] = {}
    log(f"{name}: ggufrun")
    with ggufrun.load(path, n_ctx=n_tokens, n_threads=args.threads) as model:
        engines["ggufrun"] = RowDigest(model.logits(ids), ref_ids)
    if args.have_llama_cpp:
        variants = {
            "llama.cpp": {},
            "llama.cpp, weights not repacked": {"repack": False},
            "llama.cpp, flash attention": {"flash_attn": True},
        }
        for engine, options in variants.items():
            log(f"{name}: {engine}")
            lc = LlamaCppLogits(path, n_tokens, args.threads, **options)
            try:
                engines[engine] = RowDigest(lc.logits(ids), ref_ids)
            finally:
                lc.close()
    anchor = engines.get("llama.cpp")
    rows = []
    lines = [
        f"{name}, {n_tokens} tokens of {Path(args.file).name}, teacher-forced, one batch:",
        "",
        "| engine | KLD vs float | top-1 vs float | top-1 vs llama.cpp | mean abs dlogit at llama.cpp's top "
        "| max abs dlogit |",
        "|---|---|---|---|---|---|",
    ]
    base_lp = ref.at_ref - ref.lse[:, None]
    for engine, e in engines.items():
        kld = kl_rows(base_lp, e.at_ref - e.lse[:, None])
        r = {"model": name, "engine": engine, "n_tokens": n_tokens, "kld": float(kld.mean()),
             "top1_float": float(np.mean(e.top1 == ref.top1))}  # fmt: skip
        cells = ["-", "-", "-"]
        if anchor is not None:
            # llama.cpp's top token is among the reference's top 1024 on (nearly) every row: compare there
            pos = np.argmax(ref_ids == anchor.top1[:, None], axis=1)
            found = (ref_ids == anchor.top1[:, None]).any(axis=1)
            rr = np.arange(len(pos))[found]
            d = np.abs(e.at_ref[rr, pos[found]] - anchor.at_ref[rr, pos[found]])
            r.update(top1_llama_cpp=float(np.mean(e.top1 == anchor.top1)), mean_dlogit=float(d.mean()),
                     max_dlogit=float(d.max()))  # fmt: skip
            cells = [f"{100 * r['top1_llama_cpp']:.2f} %", f"{r['mean_dlogit']:.4f}", f"{r['max_dlogit']:.3f}"]
        rows.append(r)
        lines.append(f"| {engine} | {r['kld']:.6f} | {100 * r['top1_float']:.2f} % | {' | '.join(cells)} |")
    return "\n".join(lines), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=None, help=f"real models (default {', '.join(MODELS)})")
    ap.add_argument("--file", default=str(CORPUS))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--golden-ctx", type=int, default=256, help="window of the small golden models")
    ap.add_argument("--golden-chunks", type=int, default=64, help="windows of random tokens per golden model")
    ap.add_argument("--golden-only", action="store_true", help="only the small golden models")
    ap.add_argument("--golden", default="small-*", help="which golden models (a glob on the file name's stem)")
    ap.add_argument("--no-golden", action="store_true", help="leave the small golden models out")
    ap.add_argument("--flash-attn", action="store_true", help="also run llama.cpp with flash attention")
    ap.add_argument("--seed", type=int, default=0, help="seed of the golden models' random token windows")
    ap.add_argument(
        "--agreement",
        type=int,
        default=None,
        metavar="N",
        help="instead: teacher-forced agreement of every engine on the first N tokens of --file",
    )
    ap.add_argument(
        "--engines",
        default="ggufrun,llama.cpp",
        type=lambda v: v.split(","),
        help="engines to compare with the reference (comma-separated; default ggufrun,llama.cpp)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bases", default="bench-results/kl-bases", help="where reference bases are kept")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from ggufrun.hub import resolve
    from ggufrun.reader import GGUFFile

    Path(args.bases).mkdir(parents=True, exist_ok=True)
    try:
        import llama_cpp  # noqa: F401

        args.have_llama_cpp = True
    except ImportError:
        args.have_llama_cpp = False
        log("llama-cpp-python is not installed: llama.cpp columns left out")

    if args.agreement:
        text = Path(args.file).read_text(encoding="utf-8")
        out, rows = [], []
        for name in args.models or MODELS:
            lines, r = agreement(name, resolve(name), text, args.agreement, args)
            out.append(lines)
            rows += r
        print("\n\n".join(out))
        write_json(args.json, {"corpus": args.file, "agreement": rows})
        return
    rows = []
    if not args.golden_only:
        text = Path(args.file).read_text(encoding="utf-8")
        for name in args.models or MODELS:
            rows += score_model(name, resolve(name), args, text=text)
    if not args.no_golden and not args.models:
        for path in sorted(GOLDEN.glob(f"{args.golden}.gguf")):
            with GGUFFile(path) as f:
                arch = f.metadata["general.architecture"]
                n_vocab = int(f.metadata.get(f"{arch}.vocab_size", f.tensors["token_embd.weight"].shape[0]))
            rng = np.random.default_rng(args.seed)
            tokens = rng.integers(0, n_vocab, args.golden_ctx * args.golden_chunks)
            rows += score_model(path.stem, path, args, tokens=tokens, golden=True)

    text_summary, checks = summary(rows)
    print(text_summary)
    print()
    print(table(rows))
    write_json(
        args.json,
        {
            "corpus": args.file,
            "ctx": args.ctx,
            "golden_ctx": args.golden_ctx,
            "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
            "checks": checks,
        },
    )


if __name__ == "__main__":
    main()
