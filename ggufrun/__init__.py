"""ggufrun: run GGUF language models on a CPU from pure Python (NumPy + Numba).

Data flow: reader (GGUFFile) -> quants (Numba kernels) -> model (config, weights, run state, forward)
-> sampling -> generation (streaming) -> cli / server.

>>> import ggufrun
>>> model = ggufrun.load("smollm2-135m-instruct")
>>> for chunk in model.chat([{"role": "user", "content": "Hi!"}], max_tokens=32):
...     print(chunk.text, end="", flush=True)
"""

from .errors import ChatTemplateError, ContextOverflowError, GGUFError, GrammarError, PullError, TokenizerError
from .runtime import signals_to_main_thread

with signals_to_main_thread():  # NumPy's BLAS threads start at its import: Ctrl-C stays with the main thread
    from .reader import GGUFFile, TensorInfo

__version__ = "0.1.0"
__all__ = [
    "ChatTemplateError",
    "ContextOverflowError",
    "GGUFError",
    "GrammarError",
    "PullError",
    "TokenizerError",
    "GGUFFile",
    "TensorInfo",
    "load",
    "Model",
    "__version__",
]


def __getattr__(name):
    # The model pulls in Numba; keep `import ggufrun` (and the reader) light.
    if name in ("load", "Model"):
        from . import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'ggufrun' has no attribute {name!r}")
