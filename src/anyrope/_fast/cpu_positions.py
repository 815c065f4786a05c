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
        if x.device.type != "cpu" or (grad and x.requires_grad) or x.dtype in (torch.float16, torch.bfloat16):
            return None  # 16-bit: no NumPy bfloat16, and float16 runs through float32 anyway
        hosts.append(x.detach().numpy())
    return hosts


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
    rows in the arrays' dtype, or None.
    """
    if not _kernels.available() or not (
        array_api_compat.is_numpy_namespace(xp) or array_api_compat.is_torch_namespace(xp)
    ):
        return None
    import numpy as np

    kind, value = where
    found_hosts = _hosts(xp, arrays if kind == "offset" else [*arrays, value])
    if found_hosts is None or any(x.dtype != arrays[0].dtype for x in arrays):
        return None
    hosts = found_hosts[: len(arrays)]
    if hosts[0].dtype not in (np.float32, np.float64):
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
                by_length[seq] = value.astype(np.int64)[:, None] + np.arange(seq, dtype=np.int64)
            else:
                by_length[seq] = value.astype(np.int64).reshape(-1 if value.ndim == 2 else 1, seq)
    positions = [by_length[x.shape[axis]] for x, axis in zip(arrays, axes, strict=True)]
    top = max((int(p.max()) for p in by_length.values() if p.size), default=-1)
    found = tables(top + 1)
    if found is None:
        return None
    cos, sin = (t if array_api_compat.is_numpy_namespace(xp) else t.detach().numpy() for t in found)
    if cos.dtype != hosts[0].dtype:
        return None
    plans = []  # every check passes before anything is written: in place, a fallback would rotate twice
    for host, axis, rows in zip(hosts, axes, positions, strict=True):
        if inplace and not host.flags.c_contiguous:
            return None
        plans.append((canonical(tuple(host.shape), axis, rows.shape[0] > 1), rows))
    results = []
    for x, host, (shape5, rows) in zip(arrays, hosts, plans, strict=True):
        source = np.ascontiguousarray(host).reshape(shape5)
        if inplace:
            target, result = source, x
        elif array_api_compat.is_numpy_namespace(xp):
            result = np.empty(x.shape, dtype=x.dtype)
            target = result.reshape(shape5)
        else:
            result = x.new_empty(x.shape)
            target = result.numpy().reshape(shape5)
        _kernels.kernel(layout + "_at")(source, cos, sin, rows, target, not inplace)
        results.append(result)
    return results
