"""The absolute sinusoidal encoding of "Attention Is All You Need", RoPE's ancestor."""

from __future__ import annotations

from typing import Any

from ._compat import array_namespace, device_of, isdtype
from ._positions import as_index_array
from ._tables import cos_sin, default_inv_freq

__all__ = ["sinusoidal"]


def sinusoidal(positions: Any, dim: int, *, base: float = 10000.0, dtype: Any = None) -> Any:
    """``PE[p, 2i] = sin(p / base ** (2i / dim))`` and ``PE[p, 2i + 1] = cos(...)``.

    Parameters
    ----------
    positions : array
        Non-negative integer positions of any shape, in the library the result should have.
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
    xp = array_namespace(positions=positions)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
        raise ValueError(f"dim={dim!r} must be a positive even int (sin and cos fill pairs)")
    if not base > 0:
        raise ValueError(f"base={base!r} must be positive")
    dtype = xp.float32 if dtype is None else dtype
    if not isdtype(xp, dtype, "real floating"):
        raise TypeError(f"dtype must be a real floating dtype, got {dtype}")
    device = device_of(xp, positions)
    positions = as_index_array(xp, positions, device=device, arg="positions", ndims=None)
    cos, sin = cos_sin(xp, positions, default_inv_freq(dim, float(base)), dtype=dtype, device=device)
    pairs = xp.stack([sin, cos], axis=-1)
    return xp.reshape(pairs, (*positions.shape, dim))
