"""The numba kernel for NumPy arrays and CPU torch tensors: one parallel pass over x.

It reads each token's cos/sin row by position from a table: the cached prefix table where the
positions are host-known and inside it (no gathered copy, which is most of a decode step's
cost), else the call's own tables with rows 0, 1, 2, .... torch tensors reach it through
zero-copy NumPy views, inside an ``autograd.Function`` whose backward is the inverse rotation
through the same kernel. 16-bit floats travel as their int16 bits, widened in registers and
rounded once, bit for bit as the generic path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import _numba

if TYPE_CHECKING:
    from .._plan import Job

__all__ = ["canonical", "run", "storage"]


def canonical(shape: tuple[int, ...], seq_axis: int, batched: bool) -> tuple[int, int, int, int, int]:
    """(batch, lead, seq, trail, head_dim) for an x of ``shape`` whose tables are (batched or not)."""
    seq_pos = len(shape) + seq_axis
    before, after = shape[:seq_pos], shape[seq_pos + 1 : -1]
    batch = before[0] if batched else 1
    lead = math.prod(before[1:]) if batched else math.prod(before)
    return batch, lead, shape[seq_pos], math.prod(after), shape[-1]


def storage(name: str) -> str:
    """How the kernel takes x of a declared dtype: "float" as is, or 16-bit types as int16 bits."""
    return name if name in ("float16", "bfloat16") else "float"


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy"


def host_view(x: Any) -> Any:
    """A NumPy array or CPU tensor as a NumPy array sharing its memory; 16-bit floats as int16 bits."""
    if _is_numpy(x):
        return x.view("int16") if x.dtype == "float16" else x
    import torch

    x = x.detach()
    return x.view(torch.int16).numpy() if x.dtype in (torch.float16, torch.bfloat16) else x.numpy()


def _rows_of(xp: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
    """Compact (seq, h) or (tb, seq, h) tables as (tb * seq, h) rows, and the (tb, seq) rows' indices."""
    import numpy as np

    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    tb, seq, pairs = cos.shape
    rows = np.arange(tb * seq, dtype=np.int64).reshape(tb, seq)
    return xp.reshape(cos, (tb * seq, pairs)), xp.reshape(sin, (tb * seq, pairs)), rows


def run(job: Job) -> Any:
    x, xp = job.x, job.xp
    found = job.lookup()
    cos, sin, rows = found if found is not None else _rows_of(xp, *job.tables())
    if cos.dtype != job.compute:  # tables of another precision (apply with float64 tables for float32 x)
        return None
    out = job.out
    if out is not None and not _contiguous(out):
        return None  # decline before writing: the generic kernel writes through any strides
    if job.grad and (getattr(cos, "requires_grad", False) or getattr(sin, "requires_grad", False)):
        return None  # gradients for the tables themselves: the generic kernel has them
    if job.grad:
        return _autograd().apply(x, cos, sin, rows, job.layout, job.inverse, job.seq_axis)
    return _rotate(x, cos, sin, rows, out, job.layout, job.inverse, job.seq_axis)


def _contiguous(a: Any) -> bool:
    return bool(a.flags.c_contiguous) if _is_numpy(a) else bool(a.is_contiguous())


def _rotate(
    x: Any, cos: Any, sin: Any, rows: Any, out: Any, layout: str, inverse: bool, seq_axis: int
) -> Any:
    import numpy as np

    name = str(x.dtype).removeprefix("torch.")
    numpy_x = _is_numpy(x)
    shape5 = canonical(tuple(x.shape), seq_axis, rows.shape[0] > 1)
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype) if numpy_x else _torch_empty(x)
    source = np.ascontiguousarray(host_view(x)).reshape(shape5)
    target = host_view(out).reshape(shape5)
    table_cos = np.ascontiguousarray(host_view(cos))
    table_sin = np.ascontiguousarray(host_view(sin))
    sign = table_sin.dtype.type(-1.0 if inverse else 1.0)
    separate = not np.shares_memory(source, target)
    _numba.kernel(layout, storage(name))(source, table_cos, table_sin, rows, target, separate, sign)
    return out


def _torch_empty(x: Any) -> Any:
    """A torch tensor over a NumPy buffer: a third of ``new_empty``'s cost on a decode step."""
    import numpy as np
    import torch

    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.from_numpy(np.empty(x.shape, dtype=np.int16)).view(x.dtype)
    return torch.from_numpy(np.empty(x.shape, dtype=str(x.dtype).removeprefix("torch.")))


_Function: Any = None


def _autograd() -> Any:
    global _Function
    if _Function is None:
        import torch

        class Rotate(torch.autograd.Function):
            @staticmethod
            def forward(
                ctx: Any, x: Any, cos: Any, sin: Any, rows: Any, layout: str, inverse: bool, seq_axis: int
            ) -> Any:
                ctx.save_for_backward(cos, sin)
                ctx.rows, ctx.layout, ctx.inverse, ctx.seq_axis = rows, layout, inverse, seq_axis
                return _rotate(x.contiguous(), cos, sin, rows, None, layout, inverse, seq_axis)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                cos, sin = ctx.saved_tensors
                # Linear in x: the vector-Jacobian product is the inverse rotation of grad.
                again: Any = Rotate.apply  # untyped in torch's stubs
                back = again(grad.contiguous(), cos, sin, ctx.rows, ctx.layout, not ctx.inverse, ctx.seq_axis)
                return back, None, None, None, None, None, None

        _Function = Rotate
    return _Function
