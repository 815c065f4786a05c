"""The rotation in the O(d) elementwise form, the checks every front end shares, and :func:`apply`.

Pair i of a head, (a, b), becomes (a cos - b sin, b cos + a sin); which features form pair i
is the layout. Tables hold one value per pair, shape (seq, r/2) or (batch, seq, r/2).
"""

from __future__ import annotations

from typing import Any

from ._args import check_int
from ._compat import (
    array_namespace,
    check_same_device,
    check_writeable,
    device_of,
    environment,
    is_library,
    is_mlx_namespace,
    is_traced,
    library_name,
)
from ._dtypes import compute_dtype, input_kind, isdtype
from ._layout import Layout, normalize_layout

__all__ = ["apply", "check_head_dim", "check_input", "check_writable", "normalize_seq_axis", "rotate_generic"]


def check_input(xp: Any, x: Any, *, arg: str, head_dim: int | None = None) -> None:
    """x must be a dense floating array of at most 64-bit floats with at least (seq, head_dim) axes."""
    floating, bits = input_kind(xp, x.dtype)
    if not floating:
        raise TypeError(
            f"{arg} must be a real floating-point array (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}; cast it first, e.g. with astype"
        )
    if bits > 64:
        raise TypeError(
            f"{arg} has dtype {x.dtype} (extended precision); anyrope rotates in float64 at most, "
            f"so cast {arg} to float64 first rather than lose precision silently"
        )
    if is_library(xp, "torch") and x.layout is not _strided():
        raise TypeError(
            f"{arg} is a {x.layout} tensor; RoPE rotates dense (strided) tensors: pass {arg}.to_dense()"
        )
    if x.ndim < 2:
        raise ValueError(
            f"{arg} must have at least two axes (..., seq, head_dim), got shape {tuple(x.shape)}"
        )
    if head_dim is not None:
        check_head_dim(x, arg, head_dim)


def check_head_dim(x: Any, arg: str, head_dim: int) -> None:
    if x.shape[-1] != head_dim:
        raise ValueError(
            f"{arg}.shape[-1]={x.shape[-1]} does not match head_dim={head_dim}; the last axis must "
            "hold one head's features (reshape (..., hidden) to (..., heads, head_dim) first)"
        )


def _strided() -> Any:
    import torch

    return torch.strided


def normalize_seq_axis(seq_axis: int, ndim: int, *, arg: str = "x") -> int:
    """``seq_axis`` as a negative index, checked against an array of ``ndim`` axes."""
    seq_axis = check_int(seq_axis, "seq_axis")
    axis = seq_axis - ndim if seq_axis >= 0 else seq_axis
    if not -ndim <= axis <= -2:
        raise ValueError(
            f"seq_axis={seq_axis} is not a sequence axis of {arg} with {ndim} axes; use -2 for "
            "(..., seq, head_dim) or -3 for (batch, seq, heads, head_dim)"
        )
    return axis


def check_writable(
    xp: Any, named: list[tuple[str, Any]], *, how: str = "inplace=", traced: bool = False
) -> None:
    """Everything in-place writing needs, checked for every array before any is written."""
    if is_mlx_namespace(xp) or is_library(xp, "jax.numpy") or is_library(xp, "dask.array"):
        kind = "lazy" if is_library(xp, "dask.array") else "immutable"
        raise TypeError(
            f"{how} needs mutable arrays (NumPy, PyTorch, CuPy); {library_name(xp)} arrays "
            f"are {kind}, so use the returned array"
        )
    for arg, x in named:
        check_writeable(xp, x, arg, how, traced)
        if getattr(x, "requires_grad", False) and getattr(xp, "is_grad_enabled", lambda: False)():
            raise ValueError(
                f"{arg} requires grad: rotating in place would break autograd; drop {how.rstrip('=')}"
            )
    for i, (first, a) in enumerate(named):
        for second, b in named[i + 1 :]:
            if a is b or (not traced and _overlap(xp, a, b)):
                raise ValueError(
                    f"{first} and {second} share memory: in place, it would be rotated twice; "
                    f"rotate it once (pass it as {first} only) or pass a copy"
                )


def _overlap(xp: Any, a: Any, b: Any) -> bool:
    if is_library(xp, "numpy"):
        import numpy as np

        if not np.may_share_memory(a, b):
            return False
        try:
            work: Any = 100_000  # the stubs allow only the two special values
            return bool(np.shares_memory(a, b, max_work=work))
        except np.exceptions.TooHardError:  # too costly to tell: assume they do
            return True
    if is_library(xp, "torch"):  # views of one fused qkv buffer are fine: compare exactly
        return bool(a.data_ptr() == b.data_ptr() and a.stride() == b.stride())
    return False


def check_out(xp: Any, x: Any, out: Any) -> None:
    """``out`` must be a writable array of x's library, shape and dtype."""
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        raise ValueError(
            f"out must have the input's shape {tuple(x.shape)} and dtype {x.dtype}, got "
            f"{tuple(out.shape)} and {out.dtype}"
        )
    check_writable(xp, [("out", out)], how="out=")


def _align(xp: Any, table: Any, ndim: int, seq_axis: int) -> Any:
    """Reshape a (seq, h) or (batch, seq, h) table to broadcast against an ndim-axis x."""
    trailing = (1,) * (-seq_axis - 2)
    seq, half = table.shape[-2], table.shape[-1]
    if table.ndim == 2:
        shape: tuple[int, ...] = (seq, *trailing, half)
    else:
        shape = (table.shape[0], *(1,) * (ndim + seq_axis - 1), seq, *trailing, half)
    return table if shape == tuple(table.shape) else xp.reshape(table, shape)


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
        if cos.shape[0] != 1 and cos.shape[0] != x.shape[0]:
            raise ValueError(
                f"cos.shape[0]={cos.shape[0]} does not match x's batch size {x.shape[0]} (axis 0)"
            )


class GivenTables:
    """The angles of an :func:`apply` call: tables the caller made."""

    __slots__ = ("cos", "sin")

    def __init__(self, cos: Any, sin: Any) -> None:
        self.cos, self.sin = cos, sin

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:  # noqa: ARG002 - one pair for every array
        return self.cos, self.sin

    def lookup(self, seq: int, dtype: Any) -> None:  # noqa: ARG002
        return None


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
    from ._plan import Job
    from ._registry import rotate

    xp = array_namespace(x=x, cos=cos, sin=sin, out=out)
    check_input(xp, x, arg="x")
    axis = normalize_seq_axis(seq_axis, x.ndim)
    check_tables(xp, x, cos, sin, axis)
    if out is not None:
        check_out(xp, x, out)
    work = compute_dtype(xp, x.dtype)
    cos, sin = xp.astype(cos, work, copy=False), xp.astype(sin, work, copy=False)
    device = device_of(xp, x)
    check_same_device(xp, device, "x", cos=cos, sin=sin, out=out)
    traced = is_traced(xp, x, cos, sin)
    job = Job(
        xp, environment(xp, device, traced=traced), x, "x", axis, normalize_layout(layout), bool(inverse), out,
        GivenTables(cos, sin), traced, _needs_grad(xp, x, cos, sin), work,
    )  # fmt: skip
    return rotate(job)


def _needs_grad(xp: Any, *arrays: Any) -> bool:
    if not is_library(xp, "torch"):
        return False
    import torch

    return torch.is_grad_enabled() and any(a.requires_grad for a in arrays)
