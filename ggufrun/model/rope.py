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
    """cos, sin: float32 [n_pos, n_rot/2] for positions 0..n_pos-1.

    Computed in float32 step by step as ggml does (theta *= theta_scale per frequency), not in exact arithmetic:
    attention in these models is sensitive enough that llama.cpp's rounding of the angles is worth keeping.
    """
    f32 = np.float32
    theta_scale = f32(f32(base) ** f32(-2.0 / n_rot))
    low, high = yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow) if ext_factor else (0.0, 0.0)
    mscale = f32(attn_factor)
    if ext_factor:
        mscale = f32(mscale * f32(1.0 + 0.1 * math.log(1.0 / freq_scale)))
    cos = np.empty((n_pos, n_rot // 2), f32)
    sin = np.empty((n_pos, n_rot // 2), f32)
    theta = np.arange(n_pos, dtype=f32)  # theta for frequency i: pos * theta_scale^i
    for i in range(n_rot // 2):
        extrap = theta / f32(freq_factors[i]) if freq_factors is not None else theta
        angle = f32(freq_scale) * extrap
        if ext_factor:
            ramp = 1.0 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
            mix = f32(ramp * ext_factor)
            angle = angle * (f32(1.0) - mix) + extrap * mix
        # float32 angle, cos/sin correctly rounded (as cosf/sinf), then the magnitude
        cos[:, i] = np.cos(angle.astype(np.float64)).astype(f32) * mscale
        sin[:, i] = np.sin(angle.astype(np.float64)).astype(f32) * mscale
        theta = theta * theta_scale
    return cos, sin
