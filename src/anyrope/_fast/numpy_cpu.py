"""NumPy's fast path: the numba kernel when numba is installed, else the best NumPy trick per layout.

Without numba, "interleaved" is one complex multiply on a complex view of x (pairs are adjacent
floats, i.e. complex numbers); "half" runs the six elementwise steps in cache-sized blocks with
preallocated outputs, so x is read from memory about once.
"""

from __future__ import annotations

import math
from typing import Any

from . import _kernels

__all__ = ["canonical", "lookup", "rotate", "storage"]

_BLOCK_BYTES = 1 << 18  # blocks of about 256 KiB stay in L2 through the six steps


def canonical(shape: tuple[int, ...], seq_axis: int, batched: bool) -> tuple[int, int, int, int, int]:
    """(batch, lead, seq, trail, head_dim) for an x of ``shape`` whose tables are (batched or not)."""
    seq_pos = len(shape) + seq_axis
    before, after = shape[:seq_pos], shape[seq_pos + 1 : -1]
    batch = before[0] if batched else 1
    lead = math.prod(before[1:]) if batched else math.prod(before)
    return batch, lead, shape[seq_pos], math.prod(after), shape[-1]


_storages: dict[Any, str | None] = {}


def storage(dtype: Any) -> str | None:
    """How the kernels take an x of this NumPy or torch dtype: "float" (as is), "float16" or
    "bfloat16" (as int16 bits, with float32 tables); None where no kernel does. Memoised: it is
    asked on every call, decode steps included."""
    found = _storages.get(dtype, "")  # dtypes of NumPy and torch never compare equal
    if found == "":
        name = str(dtype).removeprefix("torch.")
        found = (
            "float" if name in ("float32", "float64") else name if name in ("float16", "bfloat16") else None
        )
        _storages[dtype] = found
    return found


def _tables(np: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    return np.ascontiguousarray(cos), np.ascontiguousarray(sin)


def lookup(np: Any, cos: Any, sin: Any, inverse: bool) -> tuple[Any, Any, Any]:
    """(tb, seq, pairs) tables as the kernels take them: (tb * seq, pairs) rows, and the (tb, seq)
    positions of those rows. The inverse turns by -sin (negating is exact)."""
    batch, seq, pairs = cos.shape
    rows = np.arange(batch * seq, dtype=np.int64).reshape(batch, seq)
    return cos.reshape(batch * seq, pairs), (-sin if inverse else sin).reshape(batch * seq, pairs), rows


def _five(np: Any, x: Any, out: Any, shape5: tuple[int, ...]) -> tuple[Any, Any, Any] | None:
    """x and its destination as (batch, lead, seq, trail, head_dim) views of what the kernel
    reads (int16 bits for float16), and the result to return; None if out won't do."""
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    elif not out.flags.c_contiguous:
        return None
    bits = x.dtype == np.float16
    source = np.ascontiguousarray(x)
    source, target = (source.view(np.int16), out.view(np.int16)) if bits else (source, out)
    return source.reshape(shape5), target.reshape(shape5), out


def rotate(x: Any, cos: Any, sin: Any, *, layout: str, inverse: bool, seq_axis: int, out: Any) -> Any | None:
    import numpy as np

    kind = storage(x.dtype)
    if kind is None or cos.dtype != (x.dtype if kind == "float" else np.float32):
        return None
    if kind != "float" and not _kernels.available():
        return None  # the generic path's float32 round trip is as good as NumPy does it
    batched = cos.ndim == 3 and cos.shape[0] > 1
    views = _five(np, x, out, canonical(tuple(x.shape), seq_axis, batched))
    if views is None:
        return None
    source, target, result = views
    cos3, sin3 = _tables(np, cos, sin)
    separate = not np.shares_memory(source, target)
    if _kernels.available():
        rows_cos, rows_sin, rows = lookup(np, cos3, sin3, inverse)
        _kernels.kernel(layout, kind)(source, rows_cos, rows_sin, rows, target, separate)
    elif layout == "interleaved":
        _complex_multiply(np, source, cos3, sin3, target, inverse, separate)
    else:
        _blocked_half(np, source, cos3, sin3, target, inverse, separate)
    return result


def _aligned(table: Any) -> Any:
    """(tb, seq, pairs) -> (tb, 1, seq, 1, pairs), to broadcast against the 5-axis x."""
    return table[:, None, :, None, :]


def _complex_multiply(np: Any, x: Any, cos: Any, sin: Any, out: Any, inverse: bool, copy_tail: bool) -> None:
    pairs = cos.shape[-1]
    ctype = np.complex64 if x.dtype == np.float32 else np.complex128
    phase = np.empty(cos.shape, dtype=ctype)
    phase.real, phase.imag = cos, -sin if inverse else sin
    xc, oc = x.view(ctype), out.view(ctype)
    np.multiply(xc[..., :pairs], _aligned(phase), out=oc[..., :pairs])
    if copy_tail and 2 * pairs < x.shape[-1]:
        out[..., 2 * pairs :] = x[..., 2 * pairs :]


def _blocked_half(np: Any, x: Any, cos: Any, sin: Any, out: Any, inverse: bool, separate: bool) -> None:
    """Half layout in blocks; ``separate`` says out is not x (so the tail must be copied)."""
    batch, lead, seq, trail, width = x.shape
    pairs = cos.shape[-1]
    per_batch = cos.shape[0] > 1
    row_bytes = trail * width * x.itemsize
    step = max(1, _BLOCK_BYTES // max(1, row_bytes))
    tmp = np.empty((min(step, seq), trail, pairs), dtype=x.dtype)
    keep = np.empty_like(tmp)
    for b in range(batch):
        tb = b if per_batch else 0
        for a in range(lead):
            for start in range(0, seq, step):
                stop = min(seq, start + step)
                n = stop - start
                c = cos[tb, start:stop, None, :]
                s = sin[tb, start:stop, None, :]
                first, second = x[b, a, start:stop, :, :pairs], x[b, a, start:stop, :, pairs : 2 * pairs]
                new_first, new_second = (
                    out[b, a, start:stop, :, :pairs],
                    out[b, a, start:stop, :, pairs : 2 * pairs],
                )
                t = tmp[:n]
                if not separate:  # in place: keep the first half before it is overwritten
                    np.copyto(keep[:n], first)
                    first = keep[:n]
                np.multiply(first, c, out=new_first)
                np.multiply(second, s, out=t)
                (np.add if inverse else np.subtract)(new_first, t, out=new_first)
                np.multiply(first, s, out=t)
                np.multiply(second, c, out=new_second)
                (np.subtract if inverse else np.add)(new_second, t, out=new_second)
                if separate and 2 * pairs < width:
                    out[b, a, start:stop, :, 2 * pairs :] = x[b, a, start:stop, :, 2 * pairs :]
