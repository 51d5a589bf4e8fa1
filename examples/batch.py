"""Several chats at once on the default model: one forward pass per step advances all of them (continuous batching),
their replies printed as they grow, then each whole.

python examples/batch.py ["question" ...]
"""

import sys

import ggufrun

questions = sys.argv[1:] or ["Name three colors.", "Say hello in French.", "Write a haiku about rain."]
model = ggufrun.load()  # default model; a path or another known name works too
chats = [[{"role": "user", "content": q}] for q in questions]
replies = [""] * len(chats)
for i, chunk in model.batch_stream(chats, max_tokens=64, temperature=0):
    replies[i] += chunk.text
    if chunk.finish_reason is not None:
        print(f"[{i} done: {chunk.finish_reason}, {chunk.stats.generated_tokens} tokens]", file=sys.stderr)
for question, reply in zip(questions, replies):
    print(f"> {question}\n{reply.strip()}\n")
