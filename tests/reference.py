"""The NumPy float forward pass the tests compare ggufrun.model against; it lives in ggufrun/reference.py so that
`ggufrun perplexity --reference` can use it too.

>>> from ggufrun.reader import GGUFFile
>>> logits = reference_logits(GGUFFile("small-llama-q8_0.gguf"), [1, 2, 3])  # [3, n_vocab] float64
"""

from ggufrun.reference import ARCHS, ReferenceModel, gelu_tanh, reference_logits, rmsnorm, rope, silu, weight

__all__ = ["ARCHS", "ReferenceModel", "gelu_tanh", "reference_logits", "rmsnorm", "rope", "silu", "weight"]
