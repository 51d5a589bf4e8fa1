"""Perplexity over a text, and KL divergence against saved base logits: how much a quantization (or the runtime)
costs in quality, as llama.cpp's `llama-perplexity` measures it (tools/perplexity/perplexity.cpp).

Perplexity (perplexity.cpp `perplexity`): the text is tokenized once with the model's special tokens (BOS when the
vocabulary adds one) and cut into n_chunk = n_tokens // n_ctx non-overlapping windows of n_ctx tokens; fewer than
2 * n_ctx tokens is an error. Each window is evaluated in a fresh context with its first token replaced by BOS
(when the vocabulary adds BOS); only its second half is scored: the logits at positions first = n_ctx // 2 ..
n_ctx - 2 predict the tokens at first + 1 .. n_ctx - 1, so every scored token sees at least n_ctx / 2 tokens of
context. PPL = exp(mean NLL) over all scored tokens, with the same uncertainty estimate:
PPL * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)).

KL divergence (perplexity.cpp `kl_divergence`): a base run saves, for every scored position, what the comparison
needs; a later run over the same tokens compares its own distribution Q with the base's P position by position:
mean / max / percentiles of KL(P || Q), how often the top token agrees ("same top p"), RMS of the change in the
probability of the correct token ("RMS dp") and ln(PPL(Q) / PPL(base)). llama.cpp saves every log-probability
of every position (16 bits each); that is 0.5 MB a position for a 262k vocabulary, so ggufrun keeps the top_k
logits of each position instead (ids, float32 logits and the float64 log-sum-exp of the full row) and folds the
rest of the vocabulary into one "tail" outcome:

    KL ~= sum_{i in top_k(P)} p_i (ln p_i - ln q_i) + p_tail (ln p_tail - ln q_tail)

which is KL between the two distributions coarsened to top_k + 1 outcomes: never more than the full KL (the data
processing inequality), equal to it when the tail carries no mass, and exactly 0 for identical logits. Measured
on SmolLM2 (ggufrun against the float reference, 2 windows of 512): top 64 gives 85 % of the exact KLD, 256
93.5 %, 1024 (the default, 6 kB a position) 97.8 %; top_k >= n_vocab gives the exact value. The base also keeps the
raw logits, so `max |dlogit|` (over the base's top_k ids) compares logits directly.

Base file (.npz, written with numpy.savez_compressed, read without pickle): format "ggufrun-kl-base/1", tokens
(int32, the whole tokenized text), n_ctx, n_chunks, bos_id (-1: none), n_vocab, top_k, and per scored position
top_ids [P, top_k] int32 (sorted by logit, ties by id: top_ids[:, 0] is the argmax), top_logits [P, top_k]
float32, lse [P] float64, target_logprob [P] float64 (log-probability of the correct next token); model (text).

>>> import ggufrun
>>> from ggufrun.perplexity import perplexity
>>> model = ggufrun.load("smollm2-135m-instruct", n_ctx=512)
>>> r = perplexity(model, open("corpus.txt").read(), n_ctx=512, kl_save="base.npz")
>>> print(r.table())
>>> r2 = perplexity(other_quant, kl_base="base.npz")  # tokens and n_ctx come from the base
>>> r2.kl.mean, r2.kl.top1
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

BASE_FORMAT = "ggufrun-kl-base/1"
DEFAULT_CTX = 512  # llama-perplexity's default context for this measurement
DEFAULT_TOP_K = 1024  # SmolLM2, 2 x 512 tokens: top 64 + tail gives 85 % of the exact KLD, 256: 93.5 %, 1024: 97.8 %
MIN_CTX = 3  # the smallest window that scores a token: first = 1, scored = n_ctx - first - 1 >= 1


def windows(n_tokens: int, n_ctx: int, n_chunks: int | None = None) -> list[tuple[int, int]]:
    """[start, end) of each window llama-perplexity evaluates: n_tokens // n_ctx (at most n_chunks) windows of
    n_ctx tokens, back to back from token 0; the remainder is not used. ValueError below 2 * n_ctx tokens."""
    _check_int("n_ctx", n_ctx, MIN_CTX)
    if n_chunks is not None:
        _check_int("n_chunks", n_chunks, 1)
    if n_tokens < 2 * n_ctx:
        raise ValueError(
            f"the text tokenizes to {n_tokens} tokens; perplexity with n_ctx {n_ctx} needs at least {2 * n_ctx} "
            "(2 * n_ctx, as llama-perplexity): use a longer text or a smaller n_ctx"
        )
    count = n_tokens // n_ctx if n_chunks is None else min(n_chunks, n_tokens // n_ctx)
    return [(i * n_ctx, (i + 1) * n_ctx) for i in range(count)]


def scored_rows(n_ctx: int) -> tuple[int, int]:
    """[first, last) rows of a window's logits that are scored: row r predicts the window's token r + 1."""
    return n_ctx // 2, n_ctx - 1


@dataclass
class KLStats:
    """The comparison of a run (Q) with its base (P) over the same scored positions."""

    n_positions: int
    mean: float  # mean KL(P || Q) in nats (top_k + tail, see the module docstring)
    mean_err: float  # its standard error
    median: float
    p99: float  # 99th percentile
    max: float
    top1: float  # fraction of positions whose argmax agrees with the base's
    rms_dp: float  # RMS over positions of q(correct token) - p(correct token)
    max_abs_dlogit: float  # max over positions and the base's top_k ids of |logit_Q - logit_P|
    base_ppl: float
    ln_ppl_ratio: float  # ln(PPL(Q) / PPL(base)) = mean NLL_Q - mean NLL_P
    top_k: int


@dataclass
class PerplexityResult:
    ppl: float
    ppl_err: float  # the uncertainty llama-perplexity prints after "+/-"
    mean_nll: float
    n_scored: int  # tokens scored
    n_chunks: int
    n_ctx: int
    n_tokens: int  # tokens in the text
    seconds: float
    chunk_ppl: list[float] = field(default_factory=list)  # running PPL after each window ("[1]12.34,[2]...")
    kl: KLStats | None = None
    label: str = ""
    # KL(P || Q) of every scored position, in order (with kl): for paired comparisons of two runs against one base
    kl_positions: np.ndarray | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        """The result as plain data (kl_positions left out: an array as long as the scored tokens)."""
        return {name: value for name, value in asdict(self).items() if name != "kl_positions"}

    def table(self) -> str:
        """A two-column summary (what llama-perplexity prints at the end, in one place)."""
        rows = []
        if self.label:
            rows.append(("model", self.label))
        rows += [
            ("windows", f"{self.n_chunks} x {self.n_ctx} tokens ({self.n_scored} scored of {self.n_tokens})"),
            ("PPL", f"{self.ppl:.4f} +/- {self.ppl_err:.4f}"),
        ]
        k = self.kl
        if k is not None:
            rows += [
                ("base PPL", f"{k.base_ppl:.4f}"),
                ("ln(PPL/base PPL)", f"{k.ln_ppl_ratio:+.6f}"),
                (f"mean KLD (top {k.top_k} + tail)", f"{k.mean:.6f} +/- {k.mean_err:.6f}"),
                ("median / 99% / max KLD", f"{k.median:.6f} / {k.p99:.6f} / {k.max:.6f}"),
                ("same top token", f"{100 * k.top1:.3f} %"),
                ("RMS dp (correct token)", f"{100 * k.rms_dp:.4f} %"),
                ("max |dlogit|", f"{k.max_abs_dlogit:.5f}"),
            ]
        rows.append(
            ("time", f"{self.seconds:.1f} s ({self.n_chunks * self.n_ctx / max(self.seconds, 1e-9):.0f} tok/s)")
        )
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@dataclass
class KLBase:
    """Base logits read from (or about to be written to) a base file; see the module docstring for the fields."""

    tokens: np.ndarray
    n_ctx: int
    n_chunks: int
    bos_id: int | None
    n_vocab: int
    top_k: int
    top_ids: np.ndarray
    top_logits: np.ndarray
    lse: np.ndarray
    target_logprob: np.ndarray
    model: str = ""

    def save(self, path: str | Path) -> None:
        with open(path, "wb") as fh:  # a file object: numpy would append ".npz" to a path without it
            np.savez_compressed(
                fh,
                format=np.array(BASE_FORMAT),
                tokens=self.tokens.astype(np.int32),
                n_ctx=np.int64(self.n_ctx),
                n_chunks=np.int64(self.n_chunks),
                bos_id=np.int64(-1 if self.bos_id is None else self.bos_id),
                n_vocab=np.int64(self.n_vocab),
                top_k=np.int64(self.top_k),
                top_ids=self.top_ids.astype(np.int32),
                top_logits=self.top_logits.astype(np.float32),
                lse=self.lse.astype(np.float64),
                target_logprob=self.target_logprob.astype(np.float64),
                model=np.array(self.model),
            )

    @classmethod
    def load(cls, path: str | Path) -> KLBase:
        """Read and check a base file; ValueError names the file and the field that is wrong."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"KL base file {str(path)!r} does not exist")
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {name: z[name] for name in z.files}
        except (OSError, ValueError, EOFError) as e:
            raise ValueError(f"{path}: not a KL base file (.npz written by --kl-save): {e}") from None
        where = f"{path}: KL base file"
        if str(data.get("format", "")) != BASE_FORMAT:
            raise ValueError(f"{where}: field 'format' is {str(data.get('format'))!r}, expected {BASE_FORMAT!r}")
        missing = [k for k in cls.__dataclass_fields__ if k not in data]
        if missing:
            raise ValueError(f"{where}: field {missing[0]!r} is missing")
        ints = {}
        for name in ("n_ctx", "n_chunks", "bos_id", "n_vocab", "top_k"):
            value = data[name]
            if value.shape != () or value.dtype.kind not in "iu":
                raise ValueError(f"{where}: field {name!r} must be one integer, got {value.dtype} {value.shape}")
            ints[name] = int(value)
        tokens = data["tokens"]
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"{where}: field 'tokens' must be a 1-D integer array")
        spans = windows(len(tokens), ints["n_ctx"], ints["n_chunks"])
        first, last = scored_rows(ints["n_ctx"])
        n_pos, k = len(spans) * (last - first), ints["top_k"]
        if len(spans) != ints["n_chunks"]:
            raise ValueError(f"{where}: field 'n_chunks' = {ints['n_chunks']} but the tokens make {len(spans)}")
        shapes = {"top_ids": (n_pos, k), "top_logits": (n_pos, k), "lse": (n_pos,), "target_logprob": (n_pos,)}
        for name, shape in shapes.items():
            if data[name].shape != shape:
                raise ValueError(f"{where}: field {name!r} has shape {data[name].shape}, expected {shape}")
        top_ids = data["top_ids"]
        if top_ids.size and (top_ids.min() < 0 or top_ids.max() >= ints["n_vocab"]):
            raise ValueError(f"{where}: field 'top_ids' holds ids outside [0, n_vocab = {ints['n_vocab']})")
        bos = ints["bos_id"]
        return cls(
            tokens=tokens.astype(np.int64),
            n_ctx=ints["n_ctx"],
            n_chunks=ints["n_chunks"],
            bos_id=None if bos < 0 else bos,
            n_vocab=ints["n_vocab"],
            top_k=k,
            top_ids=top_ids.astype(np.int64),
            top_logits=data["top_logits"].astype(np.float32),
            lse=data["lse"].astype(np.float64),
            target_logprob=data["target_logprob"].astype(np.float64),
            model=str(data["model"]),
        )


def _check_int(name: str, value, lo: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


def _log_sum_exp(rows: np.ndarray) -> np.ndarray:
    """float64 log(sum(exp(row))) of each row."""
    top = rows.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(rows - top).sum(axis=1, keepdims=True)))[:, 0]


def _top_k(rows: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries of each row, by value descending then id ascending (column 0 = argmax)."""
    if k < rows.shape[1]:
        part = np.argpartition(-rows, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(rows.shape[1]), rows.shape)
    vals = np.take_along_axis(rows, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)  # last key first: by value descending, then by id
    return np.take_along_axis(part, order, axis=1)


def _tail(log_top: np.ndarray) -> np.ndarray:
    """Probability outside the given ids: 1 - sum(exp(log_top)), from the row's log-probabilities, >= 0."""
    return np.maximum(-np.expm1(np.minimum(_log_sum_exp(log_top), 0.0)), 0.0)


def kl_rows(base_logp: np.ndarray, run_logp: np.ndarray) -> np.ndarray:
    """KL(P || Q) per row, over top_k outcomes plus the tail (see the module docstring). base_logp, run_logp:
    [P, k] log-probabilities of the same ids under the base and the run."""
    p = np.exp(base_logp)
    kl = (p * (base_logp - run_logp)).sum(axis=1)
    p_tail, q_tail = _tail(base_logp), _tail(run_logp)
    tiny = np.finfo(np.float64).tiny
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_tail > 0, p_tail * (np.log(np.maximum(p_tail, tiny)) - np.log(np.maximum(q_tail, tiny))), 0)
    return np.maximum(kl + tail, 0.0)  # rounding can leave -1e-17 where the distributions agree


def perplexity(
    model,
    text: str | None = None,
    *,
    tokens: Sequence[int] | None = None,
    tokenizer=None,
    n_ctx: int | None = None,
    n_chunks: int | None = None,
    kl_base: str | Path | KLBase | None = None,
    kl_save: str | Path | None = None,
    top_k: int = DEFAULT_TOP_K,
    progress: Callable[[int, int, float], None] | None = None,
    label: str = "",
) -> PerplexityResult:
    """Perplexity of `model` over `text` (or `tokens`), windowed as llama-perplexity does; with kl_base, also the
    KL divergence from the base's saved logits (the tokens and n_ctx then come from the base); with kl_save, this
    run's top_k logits are saved as a base.

    model: anything with `logits(ids) -> [len(ids), n_vocab]` (ggufrun.Model, ggufrun.reference.ReferenceModel)
    or such a callable. tokenizer: tokenizes `text` and says whether windows start with BOS (default
    model.tokenizer). n_ctx: window length (default 512, or the base's). progress(done, n_chunks, running_ppl) is
    called after each window.
    """
    score = model.logits if hasattr(model, "logits") else model
    if not callable(score):
        raise TypeError(f"model must have a logits(ids) method or be callable, got {type(model).__name__}")
    if kl_base is not None and kl_save is not None:
        raise ValueError("kl_base and kl_save exclude each other: compare with a base, or save one")
    _check_int("top_k", top_k, 1)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    base = None
    if kl_base is not None:
        base = kl_base if isinstance(kl_base, KLBase) else KLBase.load(kl_base)
        if n_ctx is not None and n_ctx != base.n_ctx:
            raise ValueError(f"n_ctx {n_ctx} differs from the KL base's ({base.n_ctx}); omit it to use the base's")
        n_ctx = base.n_ctx
    n_ctx = DEFAULT_CTX if n_ctx is None else n_ctx
    _check_int("n_ctx", n_ctx, MIN_CTX)

    ids = _tokens(text, tokens, tokenizer, base)
    bos_id = base.bos_id if base is not None else _bos(tokenizer)
    if base is not None:
        n_chunks = base.n_chunks if n_chunks is None else min(n_chunks, base.n_chunks)
    spans = windows(len(ids), n_ctx, n_chunks)
    model_ctx = getattr(model, "n_ctx", None)
    if isinstance(model_ctx, int) and model_ctx < n_ctx:
        raise ValueError(f"the model's context holds {model_ctx} tokens, fewer than n_ctx {n_ctx}: load it with more")
    first, last = scored_rows(n_ctx)
    per_chunk = last - first

    nll_sum = nll2_sum = 0.0
    count = 0
    chunk_ppl: list[float] = []
    save_parts: dict[str, list[np.ndarray]] = {"top_ids": [], "top_logits": [], "lse": [], "target_logprob": []}
    kld_parts, top1_parts, dp_parts, target_lp_parts = [], [], [], []
    max_dlogit = 0.0
    n_vocab = None
    t0 = time.perf_counter()
    for ci, (start, end) in enumerate(spans):
        window = ids[start:end].copy()
        if bos_id is not None:
            window[0] = bos_id  # llama-perplexity: "add BOS token for the first batch of each chunk"
        out = np.asarray(score(window))
        if out.ndim != 2 or out.shape[0] != n_ctx:
            raise ValueError(f"model.logits returned shape {out.shape}, expected ({n_ctx}, n_vocab)")
        n_vocab = out.shape[1]
        rows = out[first:last].astype(np.float64)
        targets = ids[start + first + 1 : end]
        lse = _log_sum_exp(rows)
        target_lp = rows[np.arange(per_chunk), targets] - lse
        nll_sum += float(-target_lp.sum())
        nll2_sum += float((target_lp * target_lp).sum())
        count += per_chunk
        chunk_ppl.append(math.exp(nll_sum / count))
        target_lp_parts.append(target_lp)

        if kl_save is not None:
            k = min(top_k, n_vocab)
            top = _top_k(rows, k)
            save_parts["top_ids"].append(top)
            save_parts["top_logits"].append(np.take_along_axis(out[first:last], top, axis=1))
            save_parts["lse"].append(lse)
            save_parts["target_logprob"].append(target_lp)
        if base is not None:
            if n_vocab != base.n_vocab:
                raise ValueError(
                    f"the model has {n_vocab} logits per token, the KL base {base.n_vocab}: another vocabulary"
                )
            sl = slice(ci * per_chunk, (ci + 1) * per_chunk)
            top, base_logits = base.top_ids[sl], base.top_logits[sl].astype(np.float64)
            run_logits = np.take_along_axis(rows, top, axis=1)
            kld_parts.append(kl_rows(base_logits - base.lse[sl, None], run_logits - lse[:, None]))
            top1_parts.append(rows.argmax(axis=1) == top[:, 0])
            dp_parts.append(np.exp(target_lp) - np.exp(base.target_logprob[sl]))
            max_dlogit = max(max_dlogit, float(np.abs(run_logits - base_logits).max()))
        if progress is not None:
            progress(ci + 1, len(spans), chunk_ppl[-1])
    seconds = time.perf_counter() - t0

    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    ppl_err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0

    kl = None
    if base is not None:
        kld = np.concatenate(kld_parts)
        base_lp = base.target_logprob[:count]
        kl = KLStats(
            n_positions=int(kld.size),
            mean=float(kld.mean()),
            mean_err=float(kld.std() / math.sqrt(kld.size - 1)) if kld.size > 1 else 0.0,
            median=float(np.median(kld)),
            p99=float(np.percentile(kld, 99)),
            max=float(kld.max()),
            top1=float(np.concatenate(top1_parts).mean()),
            rms_dp=float(np.sqrt(np.mean(np.concatenate(dp_parts) ** 2))),
            max_abs_dlogit=max_dlogit,
            base_ppl=math.exp(-float(base_lp.mean())),
            ln_ppl_ratio=mean + float(base_lp.mean()),
            top_k=base.top_k,
        )
    if kl_save is not None:
        KLBase(
            tokens=np.asarray(ids, np.int64),
            n_ctx=n_ctx,
            n_chunks=len(spans),
            bos_id=bos_id,
            n_vocab=int(n_vocab),
            top_k=min(top_k, int(n_vocab)),
            model=label,
            **{name: np.concatenate(parts) for name, parts in save_parts.items()},
        ).save(kl_save)
    return PerplexityResult(
        ppl=ppl,
        ppl_err=ppl_err,
        mean_nll=mean,
        n_scored=count,
        n_chunks=len(spans),
        n_ctx=n_ctx,
        n_tokens=len(ids),
        seconds=seconds,
        chunk_ppl=chunk_ppl,
        kl=kl,
        label=label,
        kl_positions=np.concatenate(kld_parts) if base is not None else None,
    )


def _bos(tokenizer) -> int | None:
    """The BOS id each window starts with: the vocabulary's BOS when it adds one (llama_vocab_get_add_bos)."""
    if tokenizer is None or not getattr(tokenizer, "add_bos", False):
        return None
    return getattr(tokenizer, "bos_id", None)


def _tokens(text, tokens, tokenizer, base: KLBase | None) -> np.ndarray:
    """The token ids to score: from the base, or the text tokenized as llama-perplexity does (add_special,
    no parsing of special-token text), or `tokens` as given. Text or tokens given along with a base must match it."""
    if text is not None and tokens is not None:
        raise ValueError("give text or tokens, not both")
    if text is not None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        if tokenizer is None:
            raise ValueError("text needs a tokenizer: the model has none; pass tokenizer= or tokens=")
        tokens = tokenizer.tokenize(text, add_special=True, parse_special=False)
    if tokens is not None:
        ids = np.asarray(tokens)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"tokens must be a 1-D sequence of token ids, got shape {ids.shape} {ids.dtype}")
        ids = ids.astype(np.int64)
        if base is not None and not np.array_equal(ids, base.tokens):
            raise ValueError(
                f"the text tokenizes to {len(ids)} tokens that differ from the KL base's {len(base.tokens)}: "
                "the base was made from another text or tokenizer (omit the text to use the base's tokens)"
            )
        return ids
    if base is None:
        raise ValueError("nothing to score: give text, tokens or a KL base")
    return base.tokens
