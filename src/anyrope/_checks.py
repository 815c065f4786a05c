"""The checks every entry point shares: input arrays, sequence axes, tables, in-place writes."""

from __future__ import annotations

from typing import Any

from ._args import check_int
from ._compat import check_writeable, is_library, is_mlx_namespace, library_name
from ._dtypes import input_kind, isdtype

__all__ = [
    "check_head_dim",
    "check_input",
    "check_out",
    "check_tables",
    "check_writable",
    "normalize_seq_axis",
]


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
    if 0 in tuple(a.shape) or 0 in tuple(b.shape):  # no elements, nothing shared (torch: both at address 0)
        return False
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
