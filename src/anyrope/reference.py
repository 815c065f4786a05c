"""Slow, exact forms of RoPE, for tests and for teaching.

Both spell out the definitions that the fast elementwise form must agree with:

* the block-diagonal rotation matrix ``R_m``, one 2x2 rotation per feature pair, applied as a
  dense ``(head_dim, head_dim)`` matrix product (O(d^2) per vector);
* the complex form, each pair read as a complex number ``a + ib`` multiplied by ``e^{i m theta}``.

They work on any array-API library and compute in float64 (complex128) where it has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._compat import array_namespace, device_of, environment
from ._layout import normalize_layout

__all__ = ["apply_complex", "apply_matrix", "pair_indices", "rotation_matrix"]


def pair_indices(rotary_dim: int, layout: str) -> list[tuple[int, int]]:
    """The feature indices ``(a, b)`` of each rotated pair, in frequency order.

    >>> pair_indices(6, "half")
    [(0, 3), (1, 4), (2, 5)]
    >>> pair_indices(6, "interleaved")
    [(0, 1), (2, 3), (4, 5)]
    """
    half = rotary_dim // 2
    if normalize_layout(layout) == "half":
        return [(i, i + half) for i in range(half)]
    return [(2 * i, 2 * i + 1) for i in range(half)]


def _work_dtype(xp: Any, device: Any) -> Any:
    return xp.float64 if environment(xp, device).float64 else xp.float32


def rotation_matrix(
    position: int, inv_freq: Sequence[float], *, head_dim: int, layout: str = "half", like: Any
) -> Any:
    """``R_m``: the ``(head_dim, head_dim)`` matrix that rotates a head at ``position``.

    Pair ``(a, b)`` with frequency ``theta`` gets the block ``[[cos, -sin], [sin, cos]]`` of angle
    ``position * theta``; features past ``2 * len(inv_freq)`` keep the identity.
    """
    import math

    xp = array_namespace(like=like)
    device = device_of(xp, like)
    rows = [[0.0] * head_dim for _ in range(head_dim)]
    for i in range(head_dim):
        rows[i][i] = 1.0
    for (a, b), theta in zip(pair_indices(2 * len(inv_freq), layout), inv_freq, strict=False):
        c, s = math.cos(position * theta), math.sin(position * theta)
        rows[a][a], rows[a][b], rows[b][a], rows[b][b] = c, -s, s, c
    return xp.asarray(rows, dtype=_work_dtype(xp, device), device=device)


def apply_matrix(x: Any, positions: Sequence[int], inv_freq: Sequence[float], *, layout: str = "half") -> Any:
    """Rotate ``x`` of shape ``(..., seq, head_dim)`` by dense matrices, one per position."""
    xp = array_namespace(x=x)
    head_dim = x.shape[-1]
    out = []
    for index, position in enumerate(positions):
        rot = rotation_matrix(position, inv_freq, head_dim=head_dim, layout=layout, like=x)
        row = xp.astype(x[..., index, :], rot.dtype)
        # the product as a sum of elementwise products: a matmul may run at reduced precision
        # (TF32 by default for float32 in JAX on NVIDIA GPUs), which a reference must not
        out.append(xp.sum(row[..., None, :] * rot, axis=-1))
    return xp.astype(xp.stack(out, axis=-2), x.dtype)


def apply_complex(
    x: Any, positions: Sequence[int], inv_freq: Sequence[float], *, layout: str = "half"
) -> Any:
    """Rotate ``x`` of shape ``(..., seq, head_dim)`` as complex pairs times ``e^{i m theta}``."""
    import cmath

    xp = array_namespace(x=x)
    device = device_of(xp, x)
    wide = _work_dtype(xp, device) == xp.float64 and hasattr(xp, "complex128")  # MLX: complex64 only
    ctype, rtype = (xp.complex128, xp.float64) if wide else (xp.complex64, xp.float32)
    pairs = pair_indices(2 * len(inv_freq), layout)
    first = [a for a, _ in pairs]
    second = [b for _, b in pairs]
    index = environment(xp, device).index
    index_a = xp.asarray(first, dtype=index, device=device)
    index_b = xp.asarray(second, dtype=index, device=device)
    real = xp.astype(xp.take(x, index_a, axis=-1), rtype)
    imag = xp.astype(xp.take(x, index_b, axis=-1), rtype)
    unit = xp.asarray(1j, dtype=ctype, device=device)
    z = xp.astype(real, ctype) + xp.astype(imag, ctype) * unit
    phase = [[cmath.exp(1j * m * theta) for theta in inv_freq] for m in positions]
    z = z * xp.asarray(phase, dtype=ctype, device=device)
    rotated = {a: xp.real(z)[..., i] for i, a in enumerate(first)}
    rotated |= {b: xp.imag(z)[..., i] for i, b in enumerate(second)}
    columns = [rotated[f] if f in rotated else xp.astype(x[..., f], rtype) for f in range(x.shape[-1])]
    return xp.astype(xp.stack(columns, axis=-1), x.dtype)
