"""NumPy without numba: the best pure-NumPy form per layout, each one pass over memory.

"interleaved" is one complex multiply on a complex view of x (pairs are adjacent floats, i.e.
complex numbers); "half" runs the six elementwise steps in cache-sized blocks with preallocated
outputs, so x is read from memory about once.
"""

from __future__ import annotations

from typing import Any

from .._job import Job, Launch
from .._pairs import five_axes

__all__ = ["prepare_blocked", "prepare_complex"]

_BLOCK_BYTES = 1 << 18  # blocks of about 256 KiB stay in L2 through the six steps


def _views(job: Job, x: Any, out: Any, source: Any) -> tuple[Any, Any, Any, Any, Any]:
    """x and its destination as (batch, lead, seq, trail, head_dim) views, (tb, seq, pairs) tables,
    and the array to return. Declared: float32 or float64 x, so the tables are in x's dtype, and
    a C-contiguous destination."""
    import numpy as np

    cos, sin = source.tables(job.seq, job.compute)
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    shape5 = five_axes(tuple(x.shape), job.seq_axis, batched=cos.shape[0] > 1)
    source = np.ascontiguousarray(x).reshape(shape5)
    return source, out.reshape(shape5), np.ascontiguousarray(cos), np.ascontiguousarray(sin), out


def prepare_complex(job: Job) -> Launch:
    return lambda x, out, source: _complex(job, x, out, source)


def prepare_blocked(job: Job) -> Launch:
    return lambda x, out, source: _blocked(job, x, out, source)


def _complex(job: Job, x: Any, out: Any, source: Any) -> Any:
    import numpy as np

    x, target, cos, sin, result = _views(job, x, out, source)
    pairs = cos.shape[-1]
    ctype = np.complex64 if x.dtype == np.float32 else np.complex128
    phase = np.empty(cos.shape, dtype=ctype)
    phase.real, phase.imag = cos, -sin if job.inverse else sin
    np.multiply(x.view(ctype)[..., :pairs], phase[:, None, :, None, :], out=target.view(ctype)[..., :pairs])
    if not np.shares_memory(x, target) and 2 * pairs < x.shape[-1]:
        target[..., 2 * pairs :] = x[..., 2 * pairs :]
    return result


def _blocked(job: Job, x: Any, out: Any, source: Any) -> Any:
    """Half layout in blocks; in place, each block's first half is kept aside before it is overwritten."""
    import numpy as np

    x, out, cos, sin, result = _views(job, x, out, source)
    inverse, separate = job.inverse, not np.shares_memory(x, out)
    batch, lead, seq, trail, width = x.shape
    pairs = cos.shape[-1]
    per_batch = cos.shape[0] > 1
    step = max(1, _BLOCK_BYTES // max(1, trail * width * x.itemsize))
    tmp = np.empty((min(step, seq), trail, pairs), dtype=x.dtype)
    keep = np.empty_like(tmp)
    for b in range(batch):
        tb = b if per_batch else 0
        for a in range(lead):
            for start in range(0, seq, step):
                stop = min(seq, start + step)
                n = stop - start
                c, s = cos[tb, start:stop, None, :], sin[tb, start:stop, None, :]
                first, second = x[b, a, start:stop, :, :pairs], x[b, a, start:stop, :, pairs : 2 * pairs]
                new_first = out[b, a, start:stop, :, :pairs]
                new_second = out[b, a, start:stop, :, pairs : 2 * pairs]
                t = tmp[:n]
                if not separate:
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
    return result
