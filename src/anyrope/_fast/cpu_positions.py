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
from .numpy_cpu import canonical, storage
from .torch_cpu import host_view

__all__ = ["rotate_at"]

Tables = Callable[[int], "tuple[Any, Any] | None"]


def _hosts(xp: Any, arrays: list[Any]) -> list[Any] | None:
    """The arrays as NumPy arrays sharing their memory, or None where that is not possible or wise.

    16-bit floats come as int16 views of their bits (NumPy has no bfloat16): see :func:`storage`.
    """
    if array_api_compat.is_numpy_namespace(xp):
        return [x.view("int16") if x.dtype == "float16" else x for x in arrays]
    import torch

    if torch.compiler.is_compiling():  # traced: leave it to the generic, traceable code
        return None
    grad = torch.is_grad_enabled()
    hosts = []
    for x in arrays:
        if not x.is_cpu or (grad and x.requires_grad):
            return None
        hosts.append(host_view(x))
    return hosts


def _rows(kind: str, value: Any, seq: int) -> tuple[Any, int]:
    """Positions as a (1 or batch, seq) int64 NumPy array for a length, and the largest of them."""
    import numpy as np

    if kind == "offset":
        return np.arange(value, value + seq, dtype=np.int64)[None], value + seq - 1
    if kind == "rows":
        starts = value.astype(np.int64, copy=False)[:, None]
        rows = starts if seq == 1 else starts + np.arange(seq, dtype=np.int64)
    else:
        rows = value.astype(np.int64, copy=False).reshape(-1 if value.ndim == 2 else 1, seq)
    return rows, int(rows.max()) if rows.size else -1


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
    rows in the compute dtype (float32 for 16-bit arrays), or None. The kernel widens 16-bit
    values to float32 in registers and rounds each result once, as the generic path does.
    """
    numpy_arrays = array_api_compat.is_numpy_namespace(xp)
    if not _kernels.available() or not (numpy_arrays or array_api_compat.is_torch_namespace(xp)):
        return None
    import numpy as np

    kind, value = where
    found_hosts = _hosts(xp, arrays if kind == "offset" else [*arrays, value])
    dtype = arrays[0].dtype
    if found_hosts is None or any(x.dtype != dtype for x in arrays):
        return None
    kind_of_storage = storage(dtype)
    if kind_of_storage is None:
        return None
    hosts = found_hosts[: len(arrays)]
    if kind != "offset":
        value = found_hosts[-1]
    by_length: dict[int, Any] = {}  # q and k usually have one length: compute its positions once
    top = -1
    for x, axis in zip(arrays, axes, strict=True):
        if x.shape[axis] not in by_length:
            by_length[x.shape[axis]], last = _rows(kind, value, x.shape[axis])
            top = max(top, last)
    found = tables(top + 1)
    if found is None:
        return None
    cos, sin = found if numpy_arrays else (found[0].numpy(), found[1].numpy())  # never need grad
    if cos.dtype != (hosts[0].dtype if kind_of_storage == "float" else np.float32):
        return None
    # Every check passes before anything is written: in place, a fallback would rotate twice.
    if inplace and any(not host.flags.c_contiguous for host in hosts):
        return None
    kernel = _kernels.kernel(layout, kind_of_storage)
    results = []
    for x, host, axis in zip(arrays, hosts, axes, strict=True):
        rows = by_length[x.shape[axis]]
        shape5 = canonical(tuple(x.shape), axis, rows.shape[0] > 1)
        source = np.ascontiguousarray(host).reshape(shape5)
        if inplace:
            target, result = source, x
        elif numpy_arrays:
            result = np.empty(x.shape, dtype=x.dtype)
            target = result.view(host.dtype).reshape(shape5)
        else:  # a NumPy buffer wrapped by torch: a third of new_empty's cost on a decode step
            import torch

            buffer = np.empty(x.shape, dtype=host.dtype)
            result = torch.from_numpy(buffer)
            result = result if kind_of_storage == "float" else result.view(x.dtype)
            target = buffer.reshape(shape5)
        kernel(source, cos, sin, rows, target, not inplace)
        results.append(result)
    return results
