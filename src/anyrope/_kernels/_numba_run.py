"""The numba kernel run on NumPy arrays and CPU tensors (zero-copy NumPy views of them): what
the job-level entry (:mod:`.numba_cpu`) and the torch operator (:mod:`._numba_op`) both call.
16-bit floats travel as their int16 bits, widened in registers and rounded once, bit for bit as
the generic path.
"""

from __future__ import annotations

import math
from typing import Any, TypeAlias

from .._pairs import five_axes
from .._tables import side_by_side
from . import _numba

__all__ = ["STORAGE", "host_view", "rows_of", "rows_of_table", "run_kernel", "run_kernels"]


# How the kernel takes x of a declared dtype: 16-bit types as int16 bits, the others ("float") as is.
STORAGE = {"float16": "float16", "bfloat16": "bfloat16"}


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy"


def host_view(x: Any) -> Any:
    """A NumPy array or CPU tensor as a NumPy array sharing its memory; 16-bit floats as int16 bits."""
    if _is_numpy(x):
        return x.view(_int16()) if x.dtype.itemsize == 2 else x  # float16: NumPy's only 16-bit float
    import torch

    if x.requires_grad:
        x = x.detach()
    return x.view(torch.int16).numpy() if x.dtype in (torch.float16, torch.bfloat16) else x.numpy()


def rows_of(xp: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    """Compact (seq, pairs) or (tb, seq, pairs) tables as one (tb * seq, 2 * pairs) table of
    :func:`side_by_side` rows, and the (tb, seq) rows' indices."""
    return rows_of_table(side_by_side(xp, cos, sin))


def rows_of_table(table: Any) -> tuple[Any, Any]:
    """A (seq, 2 * pairs) or (tb, seq, 2 * pairs) table of :func:`side_by_side` as (tb * seq,
    2 * pairs) rows, and the (tb, seq) rows' indices."""
    import numpy as np

    tb, seq = (1, table.shape[0]) if table.ndim == 2 else table.shape[:2]
    rows = np.arange(tb * seq, dtype=np.int64).reshape(tb, seq)
    return table.reshape(tb * seq, table.shape[-1]), rows


def run_kernel(
    x: Any, table: Any, rows: Any, out: Any, kind: str, layout: str, inverse: bool, seq_axis: int
) -> Any:
    """x rotated into ``out`` (None: a new array) at the rows ``rows`` names of a table of
    :func:`side_by_side`."""
    return run_kernels(((x, out, seq_axis),), table, rows, kind, layout, inverse)[0]


def run_kernels(
    arrays: tuple[tuple[Any, Any, int], ...],
    table: Any,
    rows: Any,
    kind: str,
    layout: str,
    inverse: bool,
) -> list[Any]:
    """One or two arrays (q and k), each given as (x, out, seq_axis), rotated in one launch at the
    same table rows: the kernel's fixed cost (the launch, waking its threads) is paid once."""
    import numpy as np

    numpy = _is_numpy(arrays[0][0])  # else CPU torch tensors, and so are the tables
    host_table = _table_view(table)
    hosts = [host_view(x) for x, _, _ in arrays]
    key = (
        tuple((x.shape, seq_axis) for x, _, seq_axis in arrays),
        rows.shape[0] > 1, host_table.dtype, hosts[0].dtype, kind, layout, inverse,
    )  # fmt: skip
    launch = _launches.get(key)
    if launch is None:
        launch = _launch(key)
    shapes5, kernel, sign, nothing = launch
    operands: list[Any] = []
    outs = []
    for (x, out, _), host, shape5 in zip(arrays, hosts, shapes5, strict=True):
        source = np.ascontiguousarray(host).reshape(shape5)
        if out is None:  # a fresh NumPy buffer (wrapped for torch: a third of new_empty's cost)
            buffer = np.empty(x.shape, dtype=source.dtype)
            out = (
                (buffer if buffer.dtype == x.dtype else buffer.view(x.dtype))
                if numpy
                else _as_tensor(x, buffer)
            )
            operands += (source, buffer.reshape(shape5), True)
        else:
            target = host_view(out).reshape(shape5)
            operands += (source, target, not np.shares_memory(source, target))
        outs.append(out)
    if len(arrays) == 1:
        operands += (nothing, nothing, False)
    kernel(*operands, host_table, rows, sign)
    return outs


# What a call's shapes, layout and dtypes decide, kept per key: the five-axis shapes, the compiled
# kernel (on one thread or all, by size), the sign of sin in the tables' type, and an array of no
# rows that stands for the second array of a call with one. Working it out costs a small call as
# much as its rotation.
_Launch: TypeAlias = "tuple[tuple[tuple[int, ...], ...], Any, Any, Any]"
_launches: dict[tuple[Any, ...], _Launch] = {}


def _launch(key: tuple[Any, ...]) -> _Launch:
    import numpy as np

    arrays, batched, table_dtype, dtype, kind, layout, inverse = key
    shapes5 = tuple(five_axes(tuple(shape), seq_axis, batched=batched) for shape, seq_axis in arrays)
    kernel = _numba.kernel(layout, kind)
    if sum(math.prod(shape5) for shape5 in shapes5) < _PARALLEL_FROM:
        kernel = _numba.on_one_thread(kernel)
    sign = table_dtype.type(-1.0 if inverse else 1.0)  # the kernel multiplies in the tables' type
    if len(_launches) >= 256:  # prefill lengths vary: keep the memo bounded
        _launches.clear()
    nothing = np.empty((0, 1, 1, 1, 0), dtype=dtype)
    launch = _launches[key] = (shapes5, kernel, sign, nothing)
    return launch


def _int16() -> Any:
    import numpy as np

    return np.int16


def _as_tensor(x: Any, buffer: Any) -> Any:
    """The kernel's NumPy output buffer as a tensor of x's dtype, sharing its memory."""
    import torch

    wrapped = torch.from_numpy(buffer)
    return wrapped if wrapped.dtype == x.dtype else wrapped.view(x.dtype)


# Below this many elements one thread is faster than waking the pool (measured in nox -s bench:
# 1x8x16x64 takes 5 us on one thread, and a parallel launch costs 10 to 20 us with a busy core).
_PARALLEL_FROM = 1 << 16


def _table_view(table: Any) -> Any:
    """A table as a contiguous NumPy array (of a torch table: a view of its memory)."""
    import numpy as np

    return np.ascontiguousarray(table if _is_numpy(table) else host_view(table))
