"""Numba options for every kernel in ggufrun.quants, in one place.

FAST is for the dot-product kernels: reassociation and FMA contraction let LLVM keep several accumulators
and fuse multiply-adds. It deliberately leaves out `nnan`/`ninf` (callers use -inf masks), so it is an
explicit flag set rather than `fastmath=True`.
EXACT is for dequantization and activation quantization, which must round exactly like gguf-py / llama.cpp:
no contraction (`a*b + c` must round twice, as NumPy does) and no reciprocal tricks (`127/amax`).
"""

FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})

FAST = dict(cache=True, nogil=True, fastmath=set(FASTMATH), error_model="numpy", boundscheck=False)
EXACT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)
FAST_PARALLEL = dict(FAST, parallel=True)
EXACT_PARALLEL = dict(EXACT, parallel=True)
