"""The rotation itself in the O(d) elementwise form, in array-API operations only.

Pair i of a head, (a, b), becomes (a cos - b sin, b cos + a sin); which features form pair i
is the layout. Tables hold one value per pair, shape (seq, r/2) or (batch, seq, r/2). This is
the generic kernel's arithmetic and the reference every other kernel is held to.
"""

from __future__ import annotations

import math
from typing import Any

from ._layout import Layout

__all__ = ["broadcast_table", "five_axes", "turn_pairs"]


def five_axes(
    shape: tuple[int, ...], seq_axis: int, *, batched: bool = True
) -> tuple[int, int, int, int, int]:
    """How the fused kernels see x of ``shape``: (batch, heads, seq, trail, head_dim). With
    ``batched`` (tables per batch row) batch is x's first axis and heads the axes between it and
    the sequence; else batch is 1 and heads every axis before the sequence. trail: the axes
    between the sequence and the features."""
    at = len(shape) + seq_axis
    if batched and at >= 1:
        batch, heads = shape[0], math.prod(shape[1:at])
    else:
        batch, heads = 1, math.prod(shape[:at])
    return batch, heads, shape[at], math.prod(shape[at + 1 : -1]), shape[-1]


def broadcast_table(xp: Any, table: Any, ndim: int, seq_axis: int) -> Any:
    """Reshape a (seq, h) or (batch, seq, h) table to broadcast against an ndim-axis x."""
    trailing = (1,) * (-seq_axis - 2)
    seq, half = table.shape[-2], table.shape[-1]
    if table.ndim == 2:
        shape: tuple[int, ...] = (seq, *trailing, half)
    else:
        shape = (table.shape[0], *(1,) * (ndim + seq_axis - 1), seq, *trailing, half)
    return table if shape == tuple(table.shape) else xp.reshape(table, shape)


def turn_pairs(xp: Any, x: Any, cos: Any, sin: Any, *, layout: Layout, inverse: bool, seq_axis: int) -> Any:
    """The reference rotation in array-API operations only."""
    dtype = x.dtype
    cos = broadcast_table(xp, cos, x.ndim, seq_axis)
    sin = broadcast_table(xp, sin, x.ndim, seq_axis)
    half = cos.shape[-1]
    rotary_dim = 2 * half
    work = xp.astype(x, cos.dtype, copy=False)
    # Each pair on an axis of two, (2, half) for "half" and (half, 2) for "interleaved", where the
    # turned pairs are stacked back: XLA fuses that stack into its one pass over x, and leaves a
    # concatenate of the two turned halves to a pass of its own.
    axis = -2 if layout == "half" else -1
    split = (2, half) if layout == "half" else (half, 2)
    pairs = xp.reshape(work[..., :rotary_dim], (*x.shape[:-1], *split))
    a, b = (pairs[..., 0, :], pairs[..., 1, :]) if layout == "half" else (pairs[..., 0], pairs[..., 1])
    if inverse:
        new_a, new_b = a * cos + b * sin, b * cos - a * sin
    else:
        new_a, new_b = a * cos - b * sin, b * cos + a * sin
    # Each half rounded to x's dtype before the stack, not after: inductor writes a stack as
    # views of one buffer, which it cannot fuse with a cast, so a 16-bit x otherwise took a
    # float32 buffer and a pass more.
    turned = [xp.astype(new_a, dtype, copy=False), xp.astype(new_b, dtype, copy=False)]
    rotated = xp.reshape(xp.stack(turned, axis=axis), (*new_a.shape[:-1], rotary_dim))
    if rotary_dim < x.shape[-1]:
        rotated = xp.concat([rotated, x[..., rotary_dim:]], axis=-1)
    # NumPy 2's stack and concat make a big-endian dtype native: x's comes back
    return rotated if rotated.dtype == dtype else xp.astype(rotated, dtype)
