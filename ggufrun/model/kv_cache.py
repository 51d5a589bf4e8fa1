"""The KV cache and the token ids it holds: the one record of what is cached.

A KVCache owns the keys and values of every layer for `n_ctx` positions and the id of the token at each cached
position. The forward pass (Transformer.forward) is its only writer of K/V rows: it reserves positions
[n_past, n_past + n) (ContextOverflowError if they do not fit, before any kernel runs), writes them, then commits the
ids. Prefix reuse asks `common_prefix(ids)` and keeps that many positions with `truncate(n)`, as llama.cpp's server
does with a slot's cached tokens (tools/server/server.cpp, `get_common_prefix`).

`version` counts every change (append, truncate, reset), so a generation that ran the last step can tell in O(1)
whether anybody else has touched the cache since (ggufrun.generate re-synchronises when somebody has).

Storage (`kv_dtype`, as llama.cpp's -ctk/-ctv): "f16" (the default, as llama.cpp's), "f32", or "q8_0" (Q8_0 blocks
of 32 values, int8 codes and an f16 scale: 34 bytes per 32 values against f16's 64, about half the memory; needs
head dimensions that are multiples of 32, as llama.cpp does). Bytes per cached value: KV_BYTES.

Layout (kernels.attend_one / attend_rows read it): keys are head-dimension-major, so a query's scores accumulate one
head dimension at a time over contiguous positions, with KV_PAD spare positions per row that the attention tiles read
and never use; values are position-major. float16 is stored as uint16 bit patterns (Numba has no float16 type); the
kernels convert with F16C. q8_0 (kernels.attend_*_q8_0) keeps llama.cpp's position-major rows for K and V alike:
codes `k`/`v` int8 [n_layer, n_kv, n_ctx, hd] and scales `k_scale`/`v_scale` uint16 [n_layer, n_kv, n_ctx, hd/32].
The arrays live in anonymous mmaps: pages cost memory only once written (a group's keys 2 MB at a time: _kv_arrays;
`prefault_group_keys` faults those in ahead of use, as the server does for its slots at start).
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys

import numpy as np

from ..errors import ContextOverflowError
from . import kernels
from .config import ModelConfig

KV_DTYPES = ("f16", "q8_0", "f32")  # the kv_dtype names, as llama.cpp's -ctk/-ctv
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "f32": 4.0}  # bytes per cached value (q8_0: a 2-byte scale per 32 codes)
QK8_0 = 32


def kv_dtype_name(kv_dtype) -> str:
    """The name ("f16", "q8_0" or "f32") of a kv_dtype given as one or as np.float16 / np.float32; else a ValueError
    naming the accepted values."""
    if isinstance(kv_dtype, str):
        if kv_dtype in KV_DTYPES:
            return kv_dtype
    else:
        try:
            dt = np.dtype(kv_dtype)
        except TypeError:
            dt = None
        if dt == np.float16:
            return "f16"
        if dt == np.float32:
            return "f32"
    raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)} (or np.float16 / np.float32), got {kv_dtype!r}")


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids two id arrays have in common."""
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _lazy_zeros(shape: tuple[int, ...], dtype, huge: bool = False) -> np.ndarray:
    """A zero-filled array in its own anonymous mmap: pages cost memory only once written, 4 KB at a time, or 2 MB
    at a time with `huge` (transparent huge pages asked for with madvise, where the kernel offers them).

    Not np.empty / np.zeros: NumPy asks the kernel for transparent huge pages on every large array, and a huge-page
    fault may compact memory first; with the keys' head-dimension-major rows the first token touches every
    2 MB page of the cache, which measured 0.3 s here (SmolLM2, n_ctx 4096) against 0.01 s with 4 KB pages. Only
    the keys of a group of slots (a batching server's) take huge pages (_kv_arrays).
    """
    count = math.prod(shape)
    size = max(1, count * np.dtype(dtype).itemsize)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (shared memory: no THP)
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: 4 KB pages, as without `huge`
            pass
    else:
        buf = mmap.mmap(-1, size)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def _kv_arrays(c: ModelConfig, n_ctx: int, name: str, slots: tuple[int, ...]):
    """(k, v, k_scale, v_scale) of the layout above, [n_layer, *slots, ...] (scales None unless q8_0).

    A group's f16 / f32 keys (slots given) are on huge pages: a decode step of many slots writes one new position
    into every key row of every slot and reads a few positions of each, each row n_ctx positions from the next
    and so on a 4 KB page of its own: with 4 KB pages each of those writes and reads missed the TLB. SmolLM2, 16
    slots decoding at 64 positions: qkv_rope_store_group 4.8-6.1 -> 3.2-3.3 ms a step, attend_group 3.4 -> 3.0-3.1.
    The price: a slot's keys are resident once used (47.5 MB a slot for SmolLM2 at n_ctx 4096, against the ~24 MB
    of first pages of its rows with 4 KB pages), within the full-cache bound batch.default_slots plans with."""
    lead = (c.n_layer, *slots, c.n_head_kv)
    if name == "q8_0":
        return (
            _lazy_zeros((*lead, n_ctx, c.head_dim_k), np.int8),
            _lazy_zeros((*lead, n_ctx, c.head_dim_v), np.int8),
            _lazy_zeros((*lead, n_ctx, c.head_dim_k // QK8_0), np.uint16),
            _lazy_zeros((*lead, n_ctx, c.head_dim_v // QK8_0), np.uint16),
        )
    store = np.uint16 if name == "f16" else np.float32
    k = _lazy_zeros((*lead, c.head_dim_k, n_ctx + kernels.KV_PAD), store, huge=bool(slots))
    return k, _lazy_zeros((*lead, n_ctx, c.head_dim_v), store), None, None


MADV_POPULATE_WRITE = 23  # Linux 5.14+ (uapi/asm-generic/mman-common.h): fault pages in writable, contents unchanged
_PAGE = mmap.PAGESIZE


def prefault_group_keys(caches: list[KVCache]) -> bool:
    """Fault in the pages of a group's keys (KVCache.group, f16 / f32: 2 MB pages), slot by slot in slot order, each
    slot layer by layer, with madvise(MADV_POPULATE_WRITE): the contents never change, so it may run while the slots
    are in use. Returns False where the kernel lacks it (not Linux, or older than 5.14); True when every page is in.

    Why: a slot's first token writes one position of every key row, so it faults in all of the slot's key pages at
    once, and on a VM a 2 MB page fault measured 4.5 ms (638 MB in 1.45 s, against 0.21 s in 4 KB pages): Gemma3's
    16 slots at n_ctx 4096 made the first step of a fresh server's first 16 requests 0.48 s instead of 0.05 s. The
    price is the group's keys resident from the start (Gemma3 37.7 MB a slot, SmolLM2 47.5 MB), as llama.cpp's
    server holds its whole KV cache from the start. ctypes releases the GIL for each call. Run beside the steps of
    the slots (a thread of its own) the faults stalled the steps' threads: the server runs it before it listens.
    """
    if not sys.platform.startswith("linux") or not caches or caches[0].group_kv is None or caches[0].quantized:
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    keys = caches[0].group_kv[0]  # [n_layer, n_slots, n_kv, hd_k, n_ctx + KV_PAD], one mmap
    for slot in range(keys.shape[1]):
        for layer in range(keys.shape[0]):
            part = keys[layer, slot]  # contiguous
            start = part.ctypes.data - part.ctypes.data % _PAGE
            if madvise(start, part.ctypes.data + part.nbytes - start, MADV_POPULATE_WRITE) != 0:
                return False  # EINVAL: a kernel without it
    return True


class KVCache:
    """Keys and values for n_ctx positions of every layer, and the token ids they belong to.

    >>> cache = KVCache(config, n_ctx=2048)
    >>> cache.n_past, cache.common_prefix([1, 2, 3])  # (0, 0): empty
    """

    def __init__(self, config: ModelConfig, n_ctx: int, kv_dtype="f16", *, _group: tuple | None = None):
        name = kv_dtype_name(kv_dtype)
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        c = config
        if name == "q8_0" and (c.head_dim_k % QK8_0 or c.head_dim_v % QK8_0):
            raise ValueError(
                f"kv_dtype 'q8_0' stores blocks of {QK8_0} values per head, but this model's head dimensions are "
                f"{c.head_dim_k} (K) and {c.head_dim_v} (V); use kv_dtype 'f16' or 'f32'"
            )
        self.n_ctx = n_ctx
        self.dtype = name  # "f16" | "q8_0" | "f32"
        self.quantized = name == "q8_0"
        self.layer_shape = (c.n_layer, c.n_head_kv, c.head_dim_k, c.head_dim_v)  # which model the cache fits
        # a group's caches are slots of shared arrays [n_layer, n_slots, ...] (KVCache.group): one layer of all of
        # them is one array, which attention over many decoding sequences takes in a single kernel call
        self.group_kv: tuple[np.ndarray, np.ndarray] | None = None  # (keys, values) [n_layer, n_slots, ...]
        self.group_scales: tuple[np.ndarray, np.ndarray] | None = None  # q8_0: (key, value) scales, the same way
        self.slot = 0  # this cache's index in the group
        if _group is not None:
            arrays, self.slot = _group
            self.group_kv = arrays[:2]
            self.k, self.v = arrays[0][:, self.slot], arrays[1][:, self.slot]
            self.k_scale = self.v_scale = None
            if self.quantized:
                self.group_scales = arrays[2:4]
                self.k_scale, self.v_scale = arrays[2][:, self.slot], arrays[3][:, self.slot]
        else:
            self.k, self.v, self.k_scale, self.v_scale = _kv_arrays(c, n_ctx, name, ())
        self._ids = np.zeros(n_ctx, np.int64)  # [n_ctx] token id at each position; [0, n_past) are valid
        self.n_past = 0  # positions holding K/V
        self.version = 0  # incremented by every change

    @classmethod
    def group(cls, config: ModelConfig, n_ctx: int, kv_dtype="f16", n: int = 1) -> list[KVCache]:
        """n caches whose K/V are slots of shared arrays (the slots of a batching server): each behaves as a KVCache
        of its own; a decode step of several of them runs attention in one kernel call per layer."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        name = kv_dtype_name(kv_dtype)
        arrays = _kv_arrays(config, n_ctx, name, (n,))
        return [cls(config, n_ctx, name, _group=(arrays, i)) for i in range(n)]

    @property
    def tokens(self) -> np.ndarray:
        """The ids of the cached positions, [n_past] (a read-only view)."""
        view = self._ids[: self.n_past]
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage when every position is written (scales included)."""
        scales = 0 if self.k_scale is None else self.k_scale.nbytes + self.v_scale.nbytes
        return self.k.nbytes + self.v.nbytes + scales

    def common_prefix(self, ids) -> int:
        """How many leading positions of the cache hold exactly `ids[:n]` (the longest such n)."""
        return common_prefix_length(self._ids[: self.n_past], np.asarray(ids, dtype=np.int64))

    def truncate(self, n: int) -> None:
        """Keep only the first n cached positions (0 <= n <= n_past)."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n <= self.n_past:
            raise ValueError(f"truncate: n must be an integer in [0, n_past={self.n_past}], got {n!r}")
        if n != self.n_past:
            self.n_past = int(n)
            self.version += 1

    def reset(self) -> None:
        """Forget every cached position."""
        self.truncate(0)

    def copy_prefix(self, src: KVCache, n: int) -> None:
        """Hold the first n positions of `src` (K/V and ids) instead of what this cache held: a prefix another
        sequence already computed (a shared system prompt) is copied, not recomputed. Both caches must be of
        one model and dtype; K/V of a prefix depend only on its tokens, so the copy equals a recomputation."""
        if not isinstance(src, KVCache) or src.layer_shape != self.layer_shape or src.dtype != self.dtype:
            raise ValueError(f"copy_prefix: src must be a KVCache of the same model and dtype as {self!r}")
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n <= min(src.n_past, self.n_ctx):
            raise ValueError(f"copy_prefix: n must be an integer in [0, {min(src.n_past, self.n_ctx)}], got {n!r}")
        if self.quantized:
            for a, b in ((self.k, src.k), (self.v, src.v), (self.k_scale, src.k_scale), (self.v_scale, src.v_scale)):
                a[:, :, :n] = b[:, :, :n]
        else:
            self.k[..., :n] = src.k[..., :n]
            self.v[:, :, :n] = src.v[:, :, :n]
        self._ids[:n] = src._ids[:n]
        self.n_past = int(n)
        self.version += 1

    def reserve(self, n: int) -> int:
        """Check that n more positions fit; return the first one. Called by the forward pass before it writes."""
        if self.n_past + n > self.n_ctx:
            raise ContextOverflowError(
                f"{self.n_past} cached + {n} new tokens = {self.n_past + n} exceeds the context size n_ctx={self.n_ctx}"
            )
        return self.n_past

    def commit(self, ids: np.ndarray) -> None:
        """Record that the K/V of `ids` now sit at positions [n_past, n_past + len(ids))."""
        m = ids.shape[0]
        self.reserve(m)
        self._ids[self.n_past : self.n_past + m] = ids
        self.n_past += m
        self.version += 1

    def __repr__(self) -> str:
        return f"KVCache(n_past={self.n_past}, n_ctx={self.n_ctx}, dtype={self.dtype}, {self.nbytes / 2**20:.1f} MiB)"
