"""Float64 NumPy versions of each scaling method, written from the published formulas.

Each returns (inv_freq, attention_factor) for a rotary width d and base b; theta_i = b^(-2i/d).
"""

from __future__ import annotations

import math

import numpy as np

from oracle import inv_freq


def plain(d: int, b: float) -> np.ndarray:
    return inv_freq(d, b)


def linear(d: int, b: float, factor: float) -> tuple[np.ndarray, float]:
    return plain(d, b) / factor, 1.0


def ntk(d: int, b: float, factor: float) -> tuple[np.ndarray, float]:
    return plain(d, b * factor ** (d / (d - 2))), 1.0


def dynamic(
    d: int, b: float, factor: float, original: int, seq_len: int, alpha: float | None = None
) -> tuple[np.ndarray, float]:
    weight = factor if alpha is None else alpha
    length = max(seq_len, original)
    scale = weight * length / original + (1 - weight)
    return plain(d, b * scale ** (d / (d - 2))), 1.0


def yarn(
    d: int,
    b: float,
    factor: float,
    original: int,
    beta_fast: float = 32,
    beta_slow: float = 1,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    truncate: bool = True,
) -> tuple[np.ndarray, float]:
    # The pair index at which the wavelength 2 pi / theta_i fits r rotations in the original context.
    def index(r: float) -> float:
        return d * np.log(original / (2 * np.pi * r)) / (2 * np.log(b))

    lo, hi = index(beta_fast), index(beta_slow)
    if truncate:
        lo, hi = np.floor(lo), np.ceil(hi)
    lo, hi = max(lo, 0.0), min(hi, d - 1.0)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0.0, 1.0)  # 1: interpolate fully
    theta = plain(d, b)
    inv = theta * (1 - ramp) + theta / factor * ramp

    def temperature(s: float, m: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    attention = (
        temperature(factor, mscale) / temperature(factor, mscale_all_dim)
        if mscale and mscale_all_dim
        else temperature(factor)
    )
    return inv, attention


def llama3(
    d: int, b: float, factor: float, low: float, high: float, original: int
) -> tuple[np.ndarray, float]:
    theta = plain(d, b)
    wavelength = 2 * np.pi / theta
    smooth = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
    # Long wavelengths: theta / factor (smooth = 0); short: theta (smooth = 1); between: a blend.
    return (1 - smooth) * theta / factor + smooth * theta, 1.0


def longrope(
    d: int,
    b: float,
    short: list[float],
    long: list[float],
    original: int,
    seq_len: int,
    max_position: int,
    mscales: tuple[float, float] | None = None,
) -> tuple[np.ndarray, float]:
    """``mscales``: PhiMoE's (short_mscale, long_mscale), in place of the derived factor."""
    factors = np.asarray(long if seq_len > original else short, dtype=np.float64)
    scale = max_position / original
    attention = 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original))
    if mscales is not None:
        attention = mscales[1] if seq_len > original else mscales[0]
    return plain(d, b) / factors, attention


def proportional(d: int, b: float, fraction: float, factor: float = 1.0) -> tuple[np.ndarray, float]:
    theta = plain(d, b)
    theta[int(fraction * d // 2) :] = 0.0
    return theta / factor, 1.0


def max_length_aware(d: int, b: float, max_position: int) -> tuple[np.ndarray, float]:
    theta = plain(d, b)
    return theta * min(1.0, np.pi / (max_position * theta.max())), 1.0
