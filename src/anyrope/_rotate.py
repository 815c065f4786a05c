"""The rotation itself, in the O(d) elementwise form, for compact cos/sin tables.

Pair i of a head, (a, b), becomes (a cos - b sin, b cos + a sin); which features form pair i
is the layout. Tables hold one value per pair, shape (seq, r/2) or (batch, seq, r/2).
"""

from __future__ import annotations

from typing import Any

from ._compat import array_namespace, compute_dtype, isdtype
from ._fast import rotate_fast
from ._layout import Layout, normalize_layout

__all__ = ["apply", "check_input", "check_out", "normalize_seq_axis", "rotate", "rotate_generic"]


def check_input(xp: Any, x: Any, *, arg: str, head_dim: int | None = None) -> None:
    """x must be a floating array with at least (seq, head_dim) axes."""
    if not isdtype(xp, x.dtype, "real floating"):
        raise TypeError(
            f"{arg} must be a real floating-point array (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}; cast it first, e.g. with astype"
        )
    if x.ndim < 2:
        raise ValueError(
            f"{arg} must have at least two axes (..., seq, head_dim), got shape {tuple(x.shape)}"
        )
    if head_dim is not None and x.shape[-1] != head_dim:
        raise ValueError(
            f"{arg}.shape[-1]={x.shape[-1]} does not match head_dim={head_dim}; the last axis must "
            "hold one head's features (reshape (..., hidden) to (..., heads, head_dim) first)"
        )


def normalize_seq_axis(seq_axis: int, ndim: int, *, arg: str = "x") -> int:
    """``seq_axis`` as a negative index, checked against an array of ``ndim`` axes."""
    if isinstance(seq_axis, bool) or not isinstance(seq_axis, int):
        raise TypeError(f"seq_axis must be an int, not {type(seq_axis).__name__}")
    axis = seq_axis - ndim if seq_axis >= 0 else seq_axis
    if not -ndim <= axis <= -2:
        raise ValueError(
            f"seq_axis={seq_axis} is not a sequence axis of {arg} with {ndim} axes; use -2 for "
            "(..., seq, head_dim) or -3 for (batch, seq, heads, head_dim)"
        )
    return axis


def _align(xp: Any, table: Any, ndim: int, seq_axis: int) -> Any:
    """Reshape a (seq, h) or (batch, seq, h) table to broadcast against an ndim-axis x."""
    trailing = (1,) * (-seq_axis - 2)
    seq, half = table.shape[-2], table.shape[-1]
    if table.ndim == 2:
        shape: tuple[int, ...] = (seq, *trailing, half)
    else:
        shape = (table.shape[0], *(1,) * (ndim + seq_axis - 1), seq, *trailing, half)
    return table if shape == tuple(table.shape) else xp.reshape(table, shape)


def rotate(
    xp: Any, x: Any, cos: Any, sin: Any, *, layout: Layout, inverse: bool, seq_axis: int, out: Any = None
) -> Any:
    """Rotate the first 2 * cos.shape[-1] features of x (into ``out`` if given); the rest pass through.

    cos and sin are already checked, in the compute dtype, and shaped (seq, h) or (batch, seq, h).
    The backend's fused path runs where it has one; the generic code is the reference.
    """
    result = rotate_fast(xp, x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis, out=out)
    if result is not None:
        return result
    result = rotate_generic(xp, x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis)
    if out is None:
        return result
    out[...] = result
    return out


def check_out(xp: Any, x: Any, out: Any, *, arg: str = "out") -> None:
    """``out`` must be a writable array of x's library, shape and dtype."""
    from ._compat import is_mlx_namespace, library_name

    if is_mlx_namespace(xp) or getattr(xp, "__name__", "").startswith("jax"):
        raise TypeError(
            f"{arg}= and inplace= need mutable arrays (NumPy, PyTorch, CuPy); {library_name(xp)} arrays "
            "are immutable, so use the returned array"
        )
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        raise ValueError(
            f"{arg} must have the input's shape {tuple(x.shape)} and dtype {x.dtype}, got "
            f"{tuple(out.shape)} and {out.dtype}"
        )
    if getattr(out, "requires_grad", False) and getattr(xp, "is_grad_enabled", lambda: False)():
        raise ValueError(f"{arg} requires grad: rotating in place would break autograd; drop inplace/out")


def rotate_generic(
    xp: Any, x: Any, cos: Any, sin: Any, *, layout: Layout, inverse: bool, seq_axis: int
) -> Any:
    """The reference rotation in array-API operations only."""
    dtype = x.dtype
    cos = _align(xp, cos, x.ndim, seq_axis)
    sin = _align(xp, sin, x.ndim, seq_axis)
    half = cos.shape[-1]
    rotary_dim = 2 * half
    work = xp.astype(x, cos.dtype, copy=False)
    if layout == "half":
        a, b = work[..., :half], work[..., half:rotary_dim]
    else:
        a, b = work[..., 0:rotary_dim:2], work[..., 1:rotary_dim:2]
    if inverse:
        new_a, new_b = a * cos + b * sin, b * cos - a * sin
    else:
        new_a, new_b = a * cos - b * sin, b * cos + a * sin
    if layout == "half":
        rotated = xp.concat([new_a, new_b], axis=-1)
    else:
        rotated = xp.reshape(xp.stack([new_a, new_b], axis=-1), (*new_a.shape[:-1], rotary_dim))
    rotated = xp.astype(rotated, dtype, copy=False)
    if rotary_dim == x.shape[-1]:
        return rotated
    return xp.concat([rotated, x[..., rotary_dim:]], axis=-1)


def check_tables(xp: Any, x: Any, cos: Any, sin: Any, seq_axis: int) -> None:
    for arg, table in (("cos", cos), ("sin", sin)):
        if not isdtype(xp, table.dtype, "real floating"):
            raise TypeError(f"{arg} must be a real floating-point array, got dtype {table.dtype}")
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    seq, head_dim = x.shape[seq_axis], x.shape[-1]
    if cos.ndim not in (2, 3):
        raise ValueError(
            f"cos and sin must have shape (seq, rotary_dim // 2) or (batch, seq, rotary_dim // 2), "
            f"got {tuple(cos.shape)}"
        )
    if 2 * cos.shape[-1] > head_dim or cos.shape[-1] == 0:
        raise ValueError(
            f"cos.shape[-1]={cos.shape[-1]} needs 1 <= 2 * cos.shape[-1] <= head_dim={head_dim}: tables "
            "are compact, one value per pair; from duplicated (seq, rotary_dim) Hugging Face tables "
            "pass cos[..., : rotary_dim // 2]"
        )
    if cos.shape[-2] != seq:
        raise ValueError(
            f"cos.shape[-2]={cos.shape[-2]} does not match the sequence length {seq} of x along "
            f"seq_axis={seq_axis}; build the tables for these positions"
        )
    if cos.ndim == 3:
        if x.ndim + seq_axis < 1:
            raise ValueError(
                f"batched cos/sin of shape {tuple(cos.shape)} align with x's first axis, but x's "
                f"sequence axis is its first; give x a batch axis"
            )
        if cos.shape[0] not in (1, x.shape[0]):
            raise ValueError(
                f"cos.shape[0]={cos.shape[0]} does not match x's batch size {x.shape[0]} (axis 0)"
            )


def apply(
    x: Any,
    cos: Any,
    sin: Any,
    *,
    layout: str = "half",
    inverse: bool = False,
    seq_axis: int = -2,
    out: Any = None,
) -> Any:
    """Rotate ``x`` by the angles whose cosines and sines are ``cos`` and ``sin``.

    Parameters
    ----------
    x : array
        Shape ``(..., seq, head_dim)`` (``seq_axis=-2``) or ``(batch, seq, heads, head_dim)``
        (``seq_axis=-3``), floating point.
    cos, sin : array
        Compact tables, one value per rotated pair: shape ``(seq, r/2)``, broadcast over every
        other axis, or ``(batch, seq, r/2)``, aligned with ``x``'s first axis. The first ``r``
        features of each head are rotated and the rest pass through unchanged.
    layout : str
        "half" (pairs i, i + r/2) or "interleaved" (pairs 2i, 2i + 1), or an alias.
    inverse : bool
        Rotate by the negated angles: undoes a rotation, and is the backward pass of one.
    seq_axis : int
        Which axis of ``x`` is the sequence.
    out : array, optional
        Write the result here (``out=x`` rotates in place) instead of a new array; for libraries
        with mutable arrays (NumPy, PyTorch, CuPy). Saves the allocation, which on CPUs costs
        page faults comparable to the rotation itself.

    Returns
    -------
    array
        Same library, device, shape and dtype as ``x`` (``out`` when given). float16 and
        bfloat16 are rotated in float32 and rounded once.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> x = np.array([[1.0, 0.0]])               # one position, one pair
    >>> c, s = np.array([[0.0]]), np.array([[1.0]])  # a quarter turn
    >>> anyrope.apply(x, c, s)
    array([[0., 1.]])
    >>> anyrope.apply(anyrope.apply(x, c, s), c, s, inverse=True)
    array([[1., 0.]])
    """
    xp = array_namespace(x=x, cos=cos, sin=sin, out=out)
    check_input(xp, x, arg="x")
    axis = normalize_seq_axis(seq_axis, x.ndim)
    check_tables(xp, x, cos, sin, axis)
    if out is not None:
        check_out(xp, x, out)
    work = compute_dtype(xp, x.dtype)
    cos, sin = xp.astype(cos, work, copy=False), xp.astype(sin, work, copy=False)
    layout_ = normalize_layout(layout)
    return rotate(xp, x, cos, sin, layout=layout_, inverse=bool(inverse), seq_axis=axis, out=out)
