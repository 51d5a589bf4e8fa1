"""Speculative-decoding benchmark: greedy decode tokens/s with and without speculation, per model and prompt.

    python benchmarks/speculative.py                            # SmolLM2 and Gemma3, n-gram drafts
    python benchmarks/speculative.py --models smollm2-135m-instruct --repeats 3 --threads 2
    python benchmarks/speculative.py --prompts chat --repeats 9
    python benchmarks/speculative.py --draft PATH               # also a draft model (same vocabulary as the target)
    python benchmarks/speculative.py --draft-layers 8           # also a draft made of the target's first 8 blocks

Prompts (chat-formatted; a model without a chat template, such as the Gemma3 270M base model, completes a plain-text
version of each instead):
    rewrite      "rewrite this code with one change", the code (~300 tokens) in the prompt: the answer copies most of
                 it, the case prompt lookup is made for (target: n-gram >= 1.8x plain); two stack and queue classes
    rewrite-csv  the same request on a CSV report module: SmolLM2-135M answers it with other code of its own (about
                 half of its tokens are found in the prompt), so it shows what lookup gains when the copy is partial
    chat         an open-ended request whose answer is new text (target: n-gram >= 0.95x plain, by the adaptive k)
Each (model, prompt) runs plain and speculative alternately (ABBA), `repeats` times each, after one warm-up; the speedup
is the median of the per-pair ratios of decode tokens/s (stats.generation_tps: first to last token; the prompt is
cached after the warm-up, so prefill is the same both ways). Greedy outputs are checked equal. The load average is
printed: other processes on shared cores slow both sides, and the interleaving spreads that over both.

Draft models: any GGUF with the target's vocabulary (--draft), or, where no such pair can be downloaded,
--draft-layers N: a copy of the target keeping its first N blocks and its output head (the self-speculative
early-exit draft of LayerSkip, arXiv:2404.16710, without its training), written next to the target by gguf-py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufrun  # noqa: E402
from _common import env_line, environment, log  # noqa: E402
from ggufrun.speculative import DEFAULT_DRAFT_TOKENS, Speculation  # noqa: E402

CODE = '''import csv
from dataclasses import dataclass


@dataclass
class Order:
    customer: str
    item: str
    quantity: int
    unit_price: float


def read_orders(path):
    """Read orders from a CSV file with columns customer, item, quantity, unit_price."""
    orders = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            orders.append(Order(row["customer"], row["item"], int(row["quantity"]), float(row["unit_price"])))
    return orders


def totals_by_customer(orders):
    """The amount each customer spent, largest first."""
    totals = {}
    for order in orders:
        amount = order.quantity * order.unit_price
        totals[order.customer] = totals.get(order.customer, 0.0) + amount
    return sorted(totals.items(), key=lambda kv: kv[1], reverse=True)


def print_report(orders):
    for customer, total in totals_by_customer(orders):
        print(f"{customer:20s} {total:10.2f}")
'''

STACKS = '''class Stack:
    """A last-in, first-out stack."""

    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if self.is_empty():
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def peek(self):
        if self.is_empty():
            raise IndexError("peek from empty stack")
        return self.items[-1]

    def is_empty(self):
        return len(self.items) == 0

    def size(self):
        return len(self.items)


class Queue:
    """A first-in, first-out queue."""

    def __init__(self):
        self.items = []

    def enqueue(self, item):
        self.items.insert(0, item)

    def dequeue(self):
        if self.is_empty():
            raise IndexError("dequeue from empty queue")
        return self.items.pop()

    def is_empty(self):
        return len(self.items) == 0

    def size(self):
        return len(self.items)
'''

PROMPTS = {
    "rewrite": "Here is my code:\n\n```python\n" + STACKS + "```\n\nPlease rename the method size to length and show "
    "me the full updated code.",
    "rewrite-csv": "Rewrite this code with one change: rename the function totals_by_customer to spend_by_customer. "
    "Reply with the complete code only.\n\n" + CODE,
    "chat": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
COMPLETIONS = {  # the same tasks for base models
    "rewrite": "Here is a Python module:\n\n```python\n" + STACKS + "```\n\nHere is the same module with one change, "
    "the method size renamed to length:\n\n```python\n",
    "rewrite-csv": "Here is a Python module:\n\n```python\n" + CODE + "```\n\nHere is the same module with one change, "
    "the function totals_by_customer renamed to spend_by_customer:\n\n```python\n",
    "chat": "The lighthouse keeper found a message in a bottle one stormy morning.",
}


def truncated_copy(src: str, n_layers: int) -> str:
    """A copy of the GGUF file `src` with only its first n_layers blocks (block_count set to n_layers), cached
    next to it as <stem>.first<N>.gguf: a draft model that shares the target's vocabulary."""
    import gguf

    dst = Path(src).with_suffix(f".first{n_layers}.gguf")
    if dst.exists():
        return str(dst)
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    n_total = reader.fields[f"{arch}.block_count"].contents()
    if not 1 <= n_layers < n_total:
        raise SystemExit(f"--draft-layers must be in 1..{n_total - 1} for {src} ({n_total} blocks)")
    tmp = dst.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = n_layers if field.name == f"{arch}.block_count" else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    keep = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < n_layers]
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    tmp.rename(dst)
    return str(dst)


def run_once(model, prompt, max_tokens, speculative):
    if model.chat_template is None:
        chunks = list(model.generate(prompt, max_tokens=max_tokens, temperature=0, speculative=speculative))
    else:
        chunks = list(model.chat(prompt, max_tokens=max_tokens, temperature=0, speculative=speculative))
    return [c.token for c in chunks], chunks[-1].stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=list(PROMPTS))
    ap.add_argument("--draft", default=None, help="also measure this draft model (must share the target's vocabulary)")
    ap.add_argument("--draft-layers", type=int, default=None,
                    help="also measure a draft made of the target's first N blocks and its output head")  # fmt: skip
    ap.add_argument("--tokens", type=int, default=200, help="max tokens per answer (default 200)")
    ap.add_argument("--repeats", type=int, default=2, help="plain/speculative pairs per prompt (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="threads (default 1: the cores are shared)")
    ap.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS)
    args = ap.parse_args()

    print(env_line(environment(args.threads)))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    for name in args.models:
        model = ggufrun.load(name, n_ctx=1024, n_threads=args.threads, quiet=True)
        kinds = {"ngram": Speculation("ngram", draft_tokens=args.draft_tokens)}
        if args.draft:
            draft = ggufrun.load(args.draft, n_ctx=1024, n_threads=args.threads, quiet=True)
            kinds["draft"] = Speculation(draft, draft_tokens=args.draft_tokens)
        if args.draft_layers:
            path = truncated_copy(str(model.path), args.draft_layers)
            draft = ggufrun.load(path, n_ctx=1024, n_threads=args.threads, quiet=True)
            kinds[f"first {args.draft_layers} blocks"] = Speculation(draft, draft_tokens=args.draft_tokens)
        for prompt_name in args.prompts:
            text = PROMPTS[prompt_name]
            if model.chat_template is None:
                messages = COMPLETIONS[prompt_name]
            else:
                messages = [{"role": "user", "content": text}]
            run_once(model, messages, 8, None)  # warm-up: kernels compiled, prompt cached
            for kind, spec in kinds.items():
                plain_tps, spec_tps, ratios, drafted, accepted = [], [], [], [], []
                for r in range(args.repeats):
                    if r % 2 == 0:  # plain first, then speculative first: a drift in the machine's speed
                        base, s0 = run_once(model, messages, args.tokens, None)  # weighs on both sides alike
                        out, s1 = run_once(model, messages, args.tokens, spec)
                    else:
                        out, s1 = run_once(model, messages, args.tokens, spec)
                        base, s0 = run_once(model, messages, args.tokens, None)
                    if out != base:
                        raise SystemExit(f"{name} {prompt_name} {kind}: speculative output differs from plain")
                    plain_tps.append(s0.generation_tps)
                    spec_tps.append(s1.generation_tps)
                    if len(base) < 8:
                        raise SystemExit(f"{name} {prompt_name}: only {len(base)} tokens generated, nothing to time")
                    ratios.append(s1.generation_tps / s0.generation_tps)
                    drafted.append(s1.drafted_tokens)
                    accepted.append(s1.accepted_tokens)
                    log(f"{name} {prompt_name} {kind} #{r}: plain {s0.generation_tps:.1f} tok/s, speculative "
                        f"{s1.generation_tps:.1f} tok/s, {len(out)} tokens, drafted {s1.drafted_tokens} "
                        f"accepted {s1.accepted_tokens}")  # fmt: skip
                rows.append((name, prompt_name, kind, len(base), statistics.median(plain_tps),
                             statistics.median(spec_tps), statistics.median(ratios), statistics.median(drafted),
                             statistics.median(accepted)))  # fmt: skip
        model.close()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| model | prompt | drafts | tokens | plain tok/s | speculative tok/s | speedup | drafted | accepted |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name, p, kind, n, a, b, ratio, d, acc in rows:
        print(f"| {name} | {p} | {kind} | {n} | {a:.1f} | {b:.1f} | {ratio:.2f}x | {d:.0f} | {acc:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
