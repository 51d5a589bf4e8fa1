"""Numba options for every kernel in ggufrun.quants, in one place.

DOT is for the dot-product kernels (ggufrun.quants.dot): their vector arithmetic is spelled out with explicit
FMAs, and strict IEEE semantics everywhere else keep LLVM from reordering it differently in the 1-row and 4-row
kernels, so a row's result does not depend on how many rows are computed together.
EXACT is for dequantization and activation quantization, which must round exactly like gguf-py / llama.cpp:
no contraction (`a*b + c` must round twice, as NumPy does) and no reciprocal tricks (`127/amax`).
FAST (reassociation and FMA contraction, without `nnan`/`ninf`) is for experiments in dev/ that let LLVM
vectorise reductions its own way.
"""

import os

from numba.core import config

# Threading layer: OpenMP first. Measured on SmolLM2 decode (2 threads): omp 10.1 ms per token, tbb 10.8 ms,
# workqueue 36.5 ms (Numba's own default order is tbb, omp, workqueue). Only when the user has not chosen.
if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
    config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]

FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})

DOT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)
DOT_PARALLEL = dict(DOT, parallel=True)
EXACT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)
FAST = dict(cache=True, nogil=True, fastmath=set(FASTMATH), error_model="numpy", boundscheck=False)
