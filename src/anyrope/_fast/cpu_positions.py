"""NumPy's and PyTorch's CPU path for RoPE calls: one kernel that looks table rows up by position.

A call by offset or by positions needs, per token, a row of the cached cos/sin table. Gathering
those rows into new tables costs more than rotating a decode step, so the kernel reads the
cached table at each token's position instead. Positions are handled in NumPy (small host
arrays), which is also how PyTorch CPU tensors are reached, through zero-copy views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import array_api_compat

from . import _kernels
from .numpy_cpu import canonical

__all__ = ["rotate_at"]

Tables = Callable[[int], "tuple[Any, Any] | None"]


def _hosts(xp: Any, arrays: list[Any]) -> list[Any] | None:
    """The arrays as NumPy arrays sharing their memory, or None where that is not possible or wise."""
    if array_api_compat.is_numpy_namespace(xp):
        return arrays
    import torch

    if torch.compiler.is_compiling():  # traced: leave it to the generic, traceable code
        return None
    grad = torch.is_grad_enabled()
    hosts = []
    for x in arrays:
        if x.device.type != "cpu" or (grad and x.requires_grad):
            return None
        hosts.append(x.detach().numpy() if x.dtype != torch.bfloat16 else None)
    return hosts


def _widened(xp: Any, x: Any) -> Any:
    """A float32 copy of a 16-bit x, as NumPy: the kernel rotates it in place. (NumPy's own
    float16 casts run at a sixth of copy speed, which bounds NumPy float16 here.)"""
    if array_api_compat.is_numpy_namespace(xp):
        return x.astype("float32")
    return x.float().numpy()  # torch converts bfloat16, which NumPy lacks


def _narrowed(xp: Any, x: Any, work: Any, inplace: bool) -> Any:
    """Round the float32 result once into x's dtype (into x itself when in place)."""
    if array_api_compat.is_numpy_namespace(xp):
        if inplace:
            x[...] = work
            return x
        return work.astype(x.dtype)
    import torch

    result = torch.from_numpy(work)
    if inplace:
        return x.copy_(result)
    return result.to(x.dtype)


def rotate_at(
    xp: Any,
    arrays: list[Any],
    axes: list[int],
    where: tuple[str, Any],
    tables: Tables,
    *,
    layout: str,
    inplace: bool,
) -> list[Any] | None:
    """Rotate each of ``arrays`` at the positions ``where`` describes; None to fall back.

    ``where`` is ("offset", int), ("rows", per-row offsets) or ("positions", (seq,) or (batch,
    seq)), already checked; ``tables(length)`` returns cached (cos, sin) of at least ``length``
    rows in the compute dtype (float32 for 16-bit arrays), or None. 16-bit arrays are rotated
    in a float32 copy and rounded once, as the generic path does.
    """
    if not _kernels.available() or not (
        array_api_compat.is_numpy_namespace(xp) or array_api_compat.is_torch_namespace(xp)
    ):
        return None
    import numpy as np

    if array_api_compat.is_torch_namespace(xp):
        import torch
    kind, value = where
    found_hosts = _hosts(xp, arrays if kind == "offset" else [*arrays, value])
    if found_hosts is None or any(x.dtype != arrays[0].dtype for x in arrays):
        return None
    hosts = found_hosts[: len(arrays)]
    narrow = hosts[0] is None or hosts[0].dtype == np.float16
    if not narrow and hosts[0].dtype not in (np.float32, np.float64):
        return None
    if kind != "offset":
        value = found_hosts[-1]
    by_length: dict[int, Any] = {}  # q and k usually have one length: compute its positions once
    for x, axis in zip(arrays, axes, strict=True):
        seq = x.shape[axis]
        if seq not in by_length:
            if kind == "offset":
                by_length[seq] = np.arange(value, value + seq, dtype=np.int64)[None]
            elif kind == "rows":
                starts = value.astype(np.int64, copy=False)[:, None]
                by_length[seq] = starts if seq == 1 else starts + np.arange(seq, dtype=np.int64)
            else:
                by_length[seq] = value.astype(np.int64).reshape(-1 if value.ndim == 2 else 1, seq)
    positions = [by_length[x.shape[axis]] for x, axis in zip(arrays, axes, strict=True)]
    top = max((int(p.max()) for p in by_length.values() if p.size), default=-1)
    found = tables(top + 1)
    if found is None:
        return None
    cos, sin = (t if array_api_compat.is_numpy_namespace(xp) else t.detach().numpy() for t in found)
    if cos.dtype != (np.float32 if narrow else hosts[0].dtype):
        return None
    # Every check passes before anything is written: in place, a fallback would rotate twice.
    if inplace and not narrow and any(not host.flags.c_contiguous for host in hosts):
        return None
    results = []
    for x, host, axis, rows in zip(arrays, hosts, axes, positions, strict=True):
        shape5 = canonical(tuple(x.shape), axis, rows.shape[0] > 1)
        kernel = _kernels.kernel(layout + "_at")
        if narrow:
            work = _widened(xp, x)
            kernel(work.reshape(shape5), cos, sin, rows, work.reshape(shape5), False)
            results.append(_narrowed(xp, x, work, inplace))
            continue
        source = np.ascontiguousarray(host).reshape(shape5)
        if inplace:
            target, result = source, x
        elif array_api_compat.is_numpy_namespace(xp):
            result = np.empty(x.shape, dtype=x.dtype)
            target = result.reshape(shape5)
        else:  # a NumPy buffer wrapped by torch: a third of new_empty's cost on a decode step
            buffer = np.empty(x.shape, dtype=host.dtype)
            result, target = torch.from_numpy(buffer), buffer.reshape(shape5)
        kernel(source, cos, sin, rows, target, not inplace)
        results.append(result)
    return results
