"""The KV cache and the token ids it holds: the one record of what is cached.

A KVCache owns the keys and values of every layer for `n_ctx` positions and the id of the token at each cached
position. The forward pass (Transformer.forward) is its only writer of K/V rows: it reserves positions
[n_past, n_past + n) (ContextOverflowError if they do not fit, before any kernel runs), writes them, then commits the
ids. Prefix reuse asks `common_prefix(ids)` and keeps that many positions with `truncate(n)`, as llama.cpp's server
does with a slot's cached tokens (tools/server/server.cpp, `get_common_prefix`).

`version` counts every change (append, truncate, reset), so a generation that ran the last step can tell in O(1)
whether anybody else has touched the cache since (ggufrun.generate re-synchronises when somebody has).

Layout (kernels.attend_one / attend_rows read it): keys are head-dimension-major, so a query's scores accumulate one
head dimension at a time over contiguous positions, with KV_PAD spare positions per row that the attention tiles read
and never use; values are position-major. float16 is stored as uint16 bit patterns (Numba has no float16 type); the
kernels convert with F16C. The arrays live in anonymous mmaps: pages cost memory only once written.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from ..errors import ContextOverflowError
from . import kernels
from .config import ModelConfig

KV_DTYPES = {"f16": np.float16, "f32": np.float32}


def _lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zero-filled array in its own anonymous mmap: pages cost memory only once written, 4 KB at a time.

    Not np.empty / np.zeros: NumPy asks the kernel for transparent huge pages on large arrays, and a huge-page
    fault may compact memory first; with the keys' head-dimension-major rows the first token touches every
    2 MB page of the cache, which measured 0.3 s here (SmolLM2, n_ctx 4096) against 0.01 s with 4 KB pages.
    """
    count = math.prod(shape)
    buf = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


class KVCache:
    """Keys and values for n_ctx positions of every layer, and the token ids they belong to.

    >>> cache = KVCache(config, n_ctx=2048)
    >>> cache.n_past, cache.common_prefix([1, 2, 3])  # (0, 0): empty
    """

    def __init__(self, config: ModelConfig, n_ctx: int, kv_dtype=np.float16):
        kv_dtype = np.dtype(kv_dtype)
        if kv_dtype not in (np.float16, np.float32):
            raise ValueError(f"kv_dtype must be np.float16 or np.float32, got {kv_dtype}")
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        c = config
        store = np.uint16 if kv_dtype == np.float16 else np.float32
        self.n_ctx = n_ctx
        self.dtype = kv_dtype
        self.k = _lazy_zeros((c.n_layer, c.n_head_kv, c.head_dim_k, n_ctx + kernels.KV_PAD), store)
        self.v = _lazy_zeros((c.n_layer, c.n_head_kv, n_ctx, c.head_dim_v), store)
        self._ids = np.zeros(n_ctx, np.int64)  # [n_ctx] token id at each position; [0, n_past) are valid
        self.n_past = 0  # positions holding K/V
        self.version = 0  # incremented by every change

    @property
    def tokens(self) -> np.ndarray:
        """The ids of the cached positions, [n_past] (a read-only view)."""
        view = self._ids[: self.n_past]
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def common_prefix(self, ids) -> int:
        """How many leading positions of the cache hold exactly `ids[:n]` (the longest such n)."""
        ids = np.asarray(ids, dtype=np.int64)
        n = min(self.n_past, ids.shape[0])
        if n == 0:
            return 0
        diff = np.flatnonzero(self._ids[:n] != ids[:n])
        return int(diff[0]) if diff.size else n

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
        if not isinstance(src, KVCache) or src.k.shape[:3] != self.k.shape[:3] or src.dtype != self.dtype:
            raise ValueError(f"copy_prefix: src must be a KVCache of the same model and dtype as {self!r}")
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n <= min(src.n_past, self.n_ctx):
            raise ValueError(f"copy_prefix: n must be an integer in [0, {min(src.n_past, self.n_ctx)}], got {n!r}")
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
