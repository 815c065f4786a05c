"""Positions of image and video patches for axial RoPE: one row per axis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._args import check_int
from ._context import call_context

__all__ = ["grid_positions"]


def grid_positions(shape: Sequence[int], *, prefix: int = 0, start: int = 0, like: Any = None) -> Any:
    """The positions of a patch grid's tokens for axial RoPE, shape ``(len(shape), prefix +
    prod(shape))``: row ``a`` holds each token's index along axis ``a``.

    Patches come in row-major order (the last axis fastest), as a flattened ``(rows, columns)``
    or ``(frames, rows, columns)`` grid is. ``prefix`` tokens come first (a class token,
    registers) at position 0 on every axis, where every pair turns by 0: they stay exactly as
    they are, as vision transformers that rotate only their patches leave them.

    Parameters
    ----------
    shape : sequence of int
        The grid: ``(rows, columns)``, or ``(frames, rows, columns)``.
    prefix : int
        Tokens before the patches that stay unrotated.
    start : int
        The first patch's position on each axis (Llama 4's vision encoder counts from 1).
    like : array, optional
        An array whose library and device the positions take; NumPy without one.

    Examples
    --------
    >>> import anyrope
    >>> anyrope.grid_positions((2, 3), prefix=1)
    array([[0, 0, 0, 0, 1, 1, 1],
           [0, 0, 1, 2, 0, 1, 2]])
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape:
        raise TypeError(f"shape must be a non-empty sequence of ints (rows, columns, ...), not {shape!r}")
    sizes = [check_int(n, "shape entries", low=1) for n in shape]
    prefix = check_int(prefix, "prefix", low=0, why=" (tokens before the patches)")
    start = check_int(start, "start")
    if like is None:
        import numpy as np

        like = np.zeros(0)
    ctx = call_context(("like", like), grad_of=())
    xp, device, index = ctx.xp, ctx.device, ctx.env.index
    _check_last(start, max(sizes), ctx.env.index_bits)
    count = math.prod(sizes)
    tokens = xp.arange(count, dtype=index, device=device)
    rows = []
    for axis, size in enumerate(sizes):
        stride = math.prod(sizes[axis + 1 :])
        rows.append((tokens // stride) % size + start)
    grid = xp.stack(rows, axis=0)
    if not prefix:
        return grid
    return xp.concat([xp.zeros((len(sizes), prefix), dtype=index, device=device), grid], axis=1)


def _check_last(start: int, longest: int, bits: int) -> None:
    """Positions start .. start + longest - 1 must fit the index dtype: past it they would wrap."""
    bound = 2 ** (bits - 1)
    if not -bound <= start <= bound - longest:
        raise ValueError(
            f"start={start} puts positions past the {bits}-bit integers they are formed in (up to "
            f"start + {longest - 1}); give a start from {-bound} to {bound - longest}"
        )
