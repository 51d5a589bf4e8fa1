"""The model: config from GGUF metadata, weights as views into the file, run state and the forward pass.

>>> from ggufrun.reader import GGUFFile
>>> from ggufrun.model import Transformer
>>> tf = Transformer(GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf"))
>>> next_id = int(tf.forward([504, 3458, 282]).argmax())
"""

from ..errors import ContextOverflowError
from .config import SUPPORTED_ARCHITECTURES, ArchSpec, ModelConfig
from .kv_cache import KVCache
from .transformer import RunState, Transformer

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ArchSpec",
    "ContextOverflowError",
    "KVCache",
    "ModelConfig",
    "RunState",
    "Transformer",
]
