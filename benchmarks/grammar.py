"""Constrained-decoding benchmark: decode ms/token with and without the grammar mask, per model.

    python benchmarks/grammar.py                        # SmolLM2 (49k vocab) and Gemma3 (262k vocab)
    python benchmarks/grammar.py --models smollm2-135m-instruct --tokens 48 --repeats 3 --threads 1

For each model: one greedy generation under a JSON Schema gives a token sequence; that sequence is then replayed
`repeats` times each way, alternating, so both sides do the same forward passes:
    plain  = sampler.sample(logits) + transformer.forward([token])
    masked = sampler.sample(logits, constraint=c) + c.advance(token) + transformer.forward([token])
and the mask's own share (apply + advance) is timed alone. Also: building the engine's view of the vocabulary
(once per tokenizer), compiling the schema, and token_logprobs(top_k=20). Target: masked <= 1.15 x plain.
Other processes on shared cores only add time, so per-step medians are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufrun  # noqa: E402
from _common import env_line, environment, log  # noqa: E402
from ggufrun.grammar import compile_constraint, engine_tokenizer  # noqa: E402
from ggufrun.sampling import Sampler, SamplingParams, token_logprobs  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {"$ref": "#/$defs/address"},
    },
    "required": ["name", "age", "email", "address"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        }
    },
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


def ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


def bench_model(name: str, tokens: int, repeats: int, threads: int) -> dict:
    model = ggufrun.load(name, n_ctx=512, n_threads=threads)
    tok, tf = model.tokenizer, model.transformer
    t0 = time.perf_counter()
    engine_tokenizer(tok)
    vocab_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = compile_constraint(RESPONSE_FORMAT, tok)
    compile_ms = (time.perf_counter() - t0) * 1e3

    prompt = model.tokenize("Here is a person as JSON: ", add_special=True)
    sampler = Sampler(SamplingParams(temperature=0.0), model.n_vocab)
    first = tf.forward(prompt).copy()  # float32 [n_vocab] after the prompt
    seq, logits = [], first
    for _ in range(tokens):  # the constrained greedy sequence both sides replay
        t, _ = sampler.sample(logits, prompt + seq, constraint=c)
        if t in tok.eog_ids:
            break
        c.advance(t)
        seq.append(t)
        if c.is_done:
            break
        logits = tf.forward([t])
    log(f"{name}: {len(seq)} tokens: {tok.detokenize(seq)!r}")

    plain, masked, mask_only, logprobs = [], [], [], []
    for _ in range(repeats):
        for with_mask in (False, True):
            tf.cache.truncate(len(prompt))
            c.reset()
            logits = first
            for t in seq:
                t0 = time.perf_counter()
                if with_mask:
                    sampler.sample(logits, prompt, constraint=c)
                    c.advance(t)
                else:
                    sampler.sample(logits, prompt)
                logits = tf.forward([t])
                (masked if with_mask else plain).append(time.perf_counter() - t0)
        c.reset()
        work = first.copy()
        for t in seq:
            t0 = time.perf_counter()
            c.apply(work)
            c.advance(t)
            mask_only.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            token_logprobs(first, t, top_k=20)
            logprobs.append(time.perf_counter() - t0)
    out = {
        "model": name,
        "n_vocab": model.n_vocab,
        "tokens": len(seq),
        "vocab_view_s": vocab_s,
        "compile_ms": compile_ms,
        "plain_ms": ms(plain),
        "masked_ms": ms(masked),
        "mask_ms": ms(mask_only),
        "logprobs_ms": ms(logprobs),
    }
    out["overhead"] = out["masked_ms"] / out["plain_ms"] - 1
    model.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma3-270m")
    ap.add_argument("--tokens", type=int, default=64, help="at most this many tokens per generation")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(env_line(environment(args.threads)))
    print(
        "| model | n_vocab | tokens | vocab view s | schema compile ms | decode ms/token plain | with mask | "
        "mask alone ms | overhead | token_logprobs(k=20) ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = bench_model(name, args.tokens, args.repeats, args.threads)
        print(
            f"| {r['model']} | {r['n_vocab']} | {r['tokens']} | {r['vocab_view_s']:.2f} | {r['compile_ms']:.1f} | "
            f"{r['plain_ms']:.1f} | {r['masked_ms']:.1f} | {r['mask_ms']:.2f} | {r['overhead']:+.1%} | "
            f"{r['logprobs_ms']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
