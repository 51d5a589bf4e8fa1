"""Rotary position embedding tables: cos/sin for every position and frequency, computed once at load.

Rope scaling (linear, llama3-style `rope_freqs` factors, YaRN) only changes the angles and the magnitude, so it
lives here and the forward pass just reads the tables. Formulas follow ggml's CPU rope
(ggml/src/ggml-cpu/ops.cpp `rope_yarn`, `ggml_rope_cache_init`; ggml/src/ggml.c `ggml_rope_yarn_corr_dims`).
"""

from __future__ import annotations

import math

import numpy as np


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """The range of rotary dims where YaRN ramps from interpolated to extrapolated angles (ggml.c)."""

    def corr_dim(n_rotations: float) -> float:
        return n_rot * math.log(n_ctx_orig / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return max(0.0, start), min(n_rot - 1.0, end)


def rope_table(
    n_pos: int,
    n_rot: int,
    base: float,
    freq_scale: float = 1.0,
    freq_factors: np.ndarray | None = None,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    n_ctx_orig: int = 0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: float32 [n_pos, n_rot/2] for positions 0..n_pos-1 (angles in float64, then rounded)."""
    i = np.arange(n_rot // 2, dtype=np.float64)  # frequency index; dims (2i, 2i+1) or (i, i + n_rot/2)
    theta_extrap = base ** (-2.0 * i / n_rot)  # [n_rot/2]
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.astype(np.float64)
    theta_interp = freq_scale * theta_extrap
    theta, mscale = theta_interp, attn_factor
    if ext_factor != 0.0:
        low, high = yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow)
        ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)  # 1 for the fast (low) dims
        mix = ramp * ext_factor
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    angles = np.arange(n_pos, dtype=np.float64)[:, None] * theta[None, :]  # [n_pos, n_rot/2]
    cos = (np.cos(angles) * mscale).astype(np.float32)
    sin = (np.sin(angles) * mscale).astype(np.float32)
    return cos, sin
