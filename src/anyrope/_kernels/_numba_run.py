"""The numba kernel run on NumPy arrays and CPU tensors (zero-copy NumPy views of them): what
the job-level entry (:mod:`.numba_cpu`) and the torch operator (:mod:`._numba_op`) both call.
16-bit floats travel as their int16 bits, widened in registers and rounded once, bit for bit as
the generic path.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from .._pairs import five_axes
from .._tables import side_by_side
from . import _numba

__all__ = ["STORAGE", "host_view", "launcher", "rows_of", "rows_of_table", "run_kernel", "run_kernels"]


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
    same table rows (the torch operator's and the autograd function's entry: an eager call's
    plan keeps its :func:`launcher`)."""
    key = (
        tuple((tuple(x.shape), seq_axis, out is None) for x, out, seq_axis in arrays),
        x_dtype := arrays[0][0].dtype, _is_numpy(arrays[0][0]), kind, layout, inverse, table.dtype,
    )  # fmt: skip
    launch = _launchers.get(key)
    if launch is None:
        if len(_launchers) >= 256:  # prefill lengths vary: keep the memo bounded
            _launchers.clear()
        launch = _launchers[key] = launcher(key[0], key[2], x_dtype, kind, layout, inverse, table.dtype)
    xs, outs = [x for x, _, _ in arrays], [out for _, out, _ in arrays]
    rotated: list[Any] = launch(xs, outs, table, rows)
    return rotated


_launchers: dict[tuple[Any, ...], Any] = {}


def launcher(
    arrays: tuple[tuple[tuple[int, ...], int, bool], ...],
    numpy: bool,
    dtype: Any,
    kind: str,
    layout: str,
    inverse: bool,
    table_dtype: Any,
) -> Any:
    """A launch of the kernel on one or two arrays of ``dtype`` (NumPy's or torch's), each given
    as (shape, seq_axis, new: whether it gets a new array), worked out once: what a call's
    shapes, layout and dtypes decide (the five-axis shapes, the compiled kernel, on one thread or
    all by size, the sign of sin in the tables' type, an array of no rows standing for the second
    array of a call with one), which cost a small call as much as its rotation.
    ``launch(xs, outs, table, rows)`` rotates each x into its out (None: a new array, x: in
    place) at the rows ``rows`` (1 or batch, seq) names of a table of :func:`side_by_side`, and
    returns the outs."""
    import numpy as np

    kernel = _numba.kernel(layout, kind)
    if sum(math.prod(shape) for shape, _, _ in arrays) < _PARALLEL_FROM:
        kernel = _numba.on_one_thread(kernel)
    wide = "64" in str(table_dtype)
    sign = (np.float64 if wide else np.float32)(-1.0 if inverse else 1.0)  # in the tables' type
    bits = kind in STORAGE.values()  # 16-bit floats as int16 bits
    host_dtype = np.int16 if bits else np.float64 if "64" in str(dtype) else np.float32
    # the five-axis shapes with tables shared by the batch (rows of 1), and per batch row
    forms = tuple(
        tuple(five_axes(shape, seq_axis, batched=batched) for shape, seq_axis, _ in arrays)
        for batched in (False, True)
    )
    shapes = [shape for shape, _, _ in arrays]
    nothing = np.empty((0, 1, 1, 1, 0), dtype=host_dtype)
    # How x, out and the table are seen by NumPy, and a new buffer becomes the result: C callables
    # where they can be (no Python frame on a small call's path).
    view: Any = _same if numpy and not bits else host_view if bits else _numpy_of
    table_view: Any = np.ascontiguousarray if numpy else _contiguous_numpy_of
    wrap: Any = (lambda buffer: buffer.view(dtype)) if numpy and bits else _same if numpy else None
    if not numpy:
        import torch

        wrap = torch.from_numpy if not bits else lambda buffer: torch.from_numpy(buffer).view(dtype)
    ascontiguous, empty, shares = np.ascontiguousarray, np.empty, np.shares_memory

    if len(arrays) == 1:
        ((shape, _, _),) = arrays

        def one(xs: Any, outs: Any, table: Any, rows: Any) -> list[Any]:
            (shape5,) = forms[rows.shape[0] > 1]
            out = outs[0]
            source = ascontiguous(view(xs[0])).reshape(shape5)
            if out is None:  # a fresh NumPy buffer (wrapped for torch: a third of new_empty's cost)
                buffer = empty(shape, dtype=host_dtype)
                out, host, copy_tail = wrap(buffer), buffer.reshape(shape5), True
            else:
                host = view(out).reshape(shape5)
                copy_tail = not shares(source, host)
            kernel(source, host, copy_tail, nothing, nothing, False, table_view(table), rows, sign)
            return [out]

        return one

    def two(xs: Any, outs: Any, table: Any, rows: Any) -> list[Any]:
        results: list[Any] = []
        operands: list[Any] = []
        for x, out, shape, shape5 in zip(xs, outs, shapes, forms[rows.shape[0] > 1], strict=True):
            source = ascontiguous(view(x)).reshape(shape5)
            if out is None:
                buffer = empty(shape, dtype=host_dtype)
                out, host, copy_tail = wrap(buffer), buffer.reshape(shape5), True
            else:
                host = view(out).reshape(shape5)
                copy_tail = not shares(source, host)
            results.append(out)
            operands += (source, host, copy_tail)
        kernel(*operands, table_view(table), rows, sign)
        return results

    return two


def _same(x: Any) -> Any:
    return x


_numpy_of = operator.methodcaller("numpy")  # a CPU tensor's memory as a NumPy array


def _contiguous_numpy_of(table: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(table.numpy())


def _int16() -> Any:
    import numpy as np

    return np.int16


def _as_tensor(x: Any, buffer: Any) -> Any:
    """The kernel's NumPy output buffer as a tensor of x's dtype, sharing its memory."""
    import torch

    wrapped = torch.from_numpy(buffer)
    return wrapped if wrapped.dtype == x.dtype else wrapped.view(x.dtype)


# Below this many elements one thread is faster than waking the pool (measured in nox -s bench:
# a parallel launch costs more than a 1x8x16x64 call takes on one thread, the more so on a busy core).
_PARALLEL_FROM = 1 << 16
