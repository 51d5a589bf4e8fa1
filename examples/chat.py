"""Interactive multi-turn chat in the terminal: Ctrl-C stops the current answer (or clears the line you are
typing), Ctrl-D quits. `ggufrun chat` is the full version (/reset, /help, sampling options).

    python examples/chat.py [model name or path]

Each turn reuses the KV cache of the conversation so far, so only the new tokens are computed.
"""

import sys

import ggufrun

try:
    import readline  # noqa: F401  (line editing and history for input(), where the platform has it)
except ImportError:
    pass

model = ggufrun.load(sys.argv[1] if len(sys.argv) > 1 else None)
messages = []
while True:
    try:
        user = input("you> ")
    except KeyboardInterrupt:  # clear the line, ask again
        print()
        continue
    except EOFError:
        print()
        break
    if not user.strip():
        continue
    messages.append({"role": "user", "content": user})
    reply = []
    print("bot> ", end="", flush=True)
    chunks = model.chat(messages, max_tokens=256, preset="chat")
    try:
        for chunk in chunks:
            print(chunk.text, end="", flush=True)
            reply.append(chunk.text)
    except KeyboardInterrupt:
        chunks.close()  # stops all work at once; the model stays usable
    print()
    messages.append({"role": "assistant", "content": "".join(reply)})
