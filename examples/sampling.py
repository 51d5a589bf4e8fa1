"""The same prompt under each sampling preset (code, chat, creative, agent), with a fixed seed.

python examples/sampling.py
"""

import ggufrun
from ggufrun.sampling import PRESETS

model = ggufrun.load()
messages = [{"role": "user", "content": "Give me a name for a friendly robot."}]
for name in PRESETS:
    text = "".join(c.text for c in model.chat(messages, max_tokens=40, preset=name, seed=42))
    print(f"--- {name} ({PRESETS[name]})\n{text.strip()}\n")
