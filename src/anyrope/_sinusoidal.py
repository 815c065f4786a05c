"""The absolute sinusoidal encoding of "Attention Is All You Need", RoPE's ancestor."""

from __future__ import annotations

from typing import Any

from ._angles import cos_sin
from ._args import check_int, check_positive
from ._context import call_context
from ._dtypes import compute_dtype, isdtype
from ._positions import position_spec
from .scaling import plain_frequencies

__all__ = ["sinusoidal"]


def sinusoidal(positions: Any, dim: int, *, base: float = 10000.0, dtype: Any = None) -> Any:
    """``PE[p, 2i] = sin(p / base ** (2i / dim))`` and ``PE[p, 2i + 1] = cos(...)``.

    Parameters
    ----------
    positions : array
        Integer positions of any shape and integer dtype, in the library the result should have.
    dim : int
        Encoding width; positive and even.
    base : float
        The frequency base.
    dtype : dtype, optional
        Result dtype; float32 by default. Angles are formed in float64 regardless.

    Returns
    -------
    array
        Shape ``positions.shape + (dim,)``.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> anyrope.sinusoidal(np.arange(2), 4).round(4)
    array([[0.    , 1.    , 0.    , 1.    ],
           [0.8415, 0.5403, 0.01  , 1.    ]], dtype=float32)
    """
    ctx = call_context(("positions", positions), grad_of=())
    xp, env = ctx.xp, ctx.env
    dim = check_int(dim, "dim", low=1, even=True, why=" (sin and cos fill pairs)")
    base = check_positive(base, "base")
    dtype = xp.float32 if dtype is None else dtype
    if not isdtype(xp, dtype, "real floating"):
        raise TypeError(f"dtype must be a real floating dtype, got {dtype}")
    spec = position_spec(xp, env, positions, 0, ndims=None, traced=ctx.traced)
    values = spec.positions(xp, env, 0)
    frequencies = plain_frequencies(dim, float(base))
    work = compute_dtype(xp, dtype)
    cos, sin = cos_sin(xp, env, values, frequencies, dtype=work, traced=ctx.traced)
    pairs = xp.stack([sin, cos], axis=-1)
    return xp.astype(xp.reshape(pairs, (*values.shape, dim)), dtype)
