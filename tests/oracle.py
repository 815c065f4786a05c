"""An independent float64 NumPy oracle, written from the formula rather than from the library.

For pair i with frequency theta_i = base ** (-2i / r) and position m, the pair (a, b) becomes
(a cos(m theta_i) - b sin(m theta_i), b cos(m theta_i) + a sin(m theta_i)). The layout says which
features (a, b) are: (i, i + r/2) for "half", (2i, 2i + 1) for "interleaved".
"""

from __future__ import annotations

import numpy as np

EPS = {
    "float64": float(np.finfo(np.float64).eps),
    "float32": float(np.finfo(np.float32).eps),
    "float16": float(np.finfo(np.float16).eps),
    "bfloat16": 2.0**-7,
}

# Error allowed, relative to the largest |value| involved, per dtype of the array under test.
# 16-bit types: rounding the float32 result once costs half an ulp; float32: about 3 ulp of
# products and sums plus the table's rounding; float64: angles m * theta differ by a few ulp of
# m when theta comes from another pow, hence 1e-12 rather than a few eps.
TOLERANCE = {"float64": 1e-12, "float32": 1e-6, "float16": 4e-3, "bfloat16": 3e-2}


def inv_freq(rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """theta_i = base ** (-2i / r), each by the C library's pow on Python floats. Not np.power,
    whose vectorised loop is an ulp or more off on some CPUs (SVML on AVX-512, NumPy 1.24 to
    1.26): at position 20,000 one ulp of theta moves cos and sin by 1.8e-12."""
    exponents = -np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    return np.array([float(base) ** float(e) for e in exponents])


def pairs(rotary_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    half = rotary_dim // 2
    if layout in ("half", "neox", "hf"):
        return np.arange(half), np.arange(half) + half
    return np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2)


def rotate(
    x: np.ndarray,
    positions: np.ndarray,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    base: float = 10000.0,
    inverse: bool = False,
    seq_axis: int = -2,
    frequencies: np.ndarray | None = None,
    scale: float = 1.0,
) -> np.ndarray:
    """Rotate x (any shape with sequence axis ``seq_axis``) in float64.

    ``positions`` is (seq,) or (batch, seq), aligned with x's first axis. ``frequencies`` replace
    the plain ones (scaling methods), and ``scale`` multiplies cos and sin.
    """
    x = np.moveaxis(np.asarray(x, dtype=np.float64), seq_axis, -2)
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    theta = inv_freq(r, base) if frequencies is None else np.asarray(frequencies, dtype=np.float64)
    angles = np.asarray(positions, dtype=np.float64)[..., None] * theta
    if angles.ndim == 3:  # (batch, seq, r/2) -> (batch, 1..., seq, r/2)
        angles = angles.reshape(angles.shape[0], *([1] * (x.ndim - 3)), *angles.shape[1:])
    sign = -1.0 if inverse else 1.0
    cos, sin = scale * np.cos(angles), scale * sign * np.sin(angles)
    a_idx, b_idx = pairs(r, layout)
    a, b = x[..., a_idx], x[..., b_idx]
    out = np.broadcast_to(x, np.broadcast_shapes(x.shape, (*cos.shape[:-1], x.shape[-1]))).copy()
    out[..., a_idx] = a * cos - b * sin
    out[..., b_idx] = b * cos + a * sin
    return np.moveaxis(out, -2, seq_axis)


def mrope_streams(section: list[int], interleaved: bool) -> np.ndarray:
    """The stream each pair follows: contiguous blocks (Qwen2-VL's ``cos.split(mrope_section)``)
    or, interleaved (Qwen3-VL's ``apply_interleaved_mrope``), stream s over the slice
    ``s : len(section) * section[s] : len(section)`` and stream 0 elsewhere."""
    if not interleaved:
        return np.repeat(np.arange(len(section)), section)
    streams = np.zeros(sum(section), dtype=np.int64)
    for s in range(1, len(section)):
        streams[s : len(section) * section[s] : len(section)] = s
    return streams


def mrope_rotate(x: np.ndarray, positions: np.ndarray, streams: np.ndarray, **kwargs: object) -> np.ndarray:
    """M-RoPE: ``positions`` (streams, seq) or (streams, batch, seq); pair j turns by
    ``positions[streams[j]] * theta_j``. Rotates each pair group of one stream with its positions."""
    x = np.asarray(x, dtype=np.float64)
    layout = str(kwargs.get("layout", "half"))
    r = int(kwargs.get("rotary_dim") or x.shape[-1])  # type: ignore[call-overload]
    out = rotate(x, positions[0], **kwargs)  # type: ignore[arg-type]
    a_idx, b_idx = pairs(r, layout)
    for s in range(1, positions.shape[0]):
        moved = rotate(x, positions[s], **kwargs)  # type: ignore[arg-type]
        mine = np.concatenate([a_idx[streams == s], b_idx[streams == s]])
        out[..., mine] = moved[..., mine]
    return out


def stream_map_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    streams: np.ndarray,
    frequencies: np.ndarray,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    base: float = 10000.0,
) -> np.ndarray:
    """Any stream map: pair j turns by ``positions[streams[j]] * theta[frequencies[j]]``, theta
    the plain spectrum of ``rotary_dim``. Rotates each stream's pairs with that stream's positions."""
    x = np.asarray(x, dtype=np.float64)
    r = rotary_dim or x.shape[-1]
    theta = inv_freq(r, base)[np.asarray(frequencies)]
    out = np.array(rotate(x, positions[0], layout=layout, rotary_dim=r, frequencies=theta))
    a_idx, b_idx = pairs(r, layout)
    for s in range(1, positions.shape[0]):
        moved = rotate(x, positions[s], layout=layout, rotary_dim=r, frequencies=theta)
        mine = np.concatenate([a_idx[streams == s], b_idx[streams == s]])
        out[..., mine] = moved[..., mine]
    return out


def axial_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    kind: str,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    base: float = 10000.0,
) -> np.ndarray:
    """Axial RoPE: ``positions`` (axes, seq) or (axes, batch, seq); axis s rotates the s-th
    contiguous share of the pairs. "blocks": with the frequencies of a RoPE over ``rotary_dim /
    axes`` features (EVA-02); "alternating": with every axes-th frequency of the whole spectrum,
    starting at the s-th (Pixtral: rows the even ones, columns the odd)."""
    x = np.asarray(x, dtype=np.float64)
    r = rotary_dim or x.shape[-1]
    axes = positions.shape[0]
    share = r // 2 // axes
    whole = inv_freq(r, base)
    out = np.array(rotate(x, positions[0], layout=layout, rotary_dim=r, base=base))
    a_idx, b_idx = pairs(r, layout)
    for s in range(axes):
        own = inv_freq(r // axes, base) if kind == "blocks" else whole[s::axes]
        frequencies = np.ones(r // 2)
        frequencies[s * share : (s + 1) * share] = own
        moved = rotate(x, positions[s], layout=layout, rotary_dim=r, frequencies=frequencies)
        mine = np.concatenate([a_idx[s * share : (s + 1) * share], b_idx[s * share : (s + 1) * share]])
        out[..., mine] = moved[..., mine]
    return out


def xpos(
    x: np.ndarray, positions: np.ndarray, scale_base: float, sign: float, *, layout: str = "half"
) -> np.ndarray:
    """xPos's decay on a rotated x (batch, heads, seq, head_dim): pair i of the token at position
    p times zeta_i ** (sign * p / scale_base), zeta_i = (2i / r + 0.4) / 1.4 (Sun et al., 2022)."""
    r = x.shape[-1]
    zeta = (np.arange(0, r, 2) / r + 0.4) / 1.4
    power = sign * np.asarray(positions, dtype=np.float64)[..., None] / scale_base  # (..., seq, 1)
    factor = zeta**power  # (seq, r/2) or (batch, seq, r/2)
    if factor.ndim == 3:
        factor = factor[:, None]
    out = np.array(x, dtype=np.float64)
    for idx in pairs(r, layout):
        out[..., idx] *= factor
    return out


def cos_sin(positions: np.ndarray, rotary_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq(rotary_dim, base)
    return np.cos(angles), np.sin(angles)


def sinusoidal(positions: np.ndarray, dim: int, base: float = 10000.0) -> np.ndarray:
    """PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim))."""
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq(dim, base)
    out = np.empty((*angles.shape[:-1], dim))
    out[..., 0::2], out[..., 1::2] = np.sin(angles), np.cos(angles)
    return out


# pi to 100 digits: the exact oracle reduces angles in decimal arithmetic with it.
_PI = "3.1415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679"


def exact_cos_sin(positions: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``p * theta`` for integer p of any size, the product and its reduction
    modulo 2 pi done in 80-digit decimal arithmetic (theta taken as the exact float it is)."""
    from decimal import Decimal, localcontext
    from fractions import Fraction

    with localcontext() as ctx:
        ctx.prec = 80
        two_pi = 2 * Decimal(_PI)
        thetas = [Fraction(float(t)) for t in np.asarray(theta, dtype=np.float64)]
        flat = [int(p) for p in np.asarray(positions).reshape(-1)]
        angles = [
            [float((Decimal(p * t.numerator) / Decimal(t.denominator)) % two_pi) for t in thetas]
            for p in flat
        ]
    shape = (*np.asarray(positions).shape, len(thetas))
    a = np.asarray(angles, dtype=np.float64).reshape(shape)
    return np.cos(a), np.sin(a)
