"""The numba kernel for NumPy arrays and CPU torch tensors: one parallel pass over x.

It reads each token's cos/sin row by position from a table: the cached prefix table where the
positions are host-known and inside it (no gathered copy, which is most of a decode step's
cost), else the call's own tables with rows 0, 1, 2, .... torch tensors reach it through
zero-copy NumPy views (:mod:`._numba_run`), inside an ``autograd.Function`` whose backward is
the inverse rotation through the same kernel; while ``torch.compile`` traces them, through a
torch operator (:mod:`._numba_op`).
"""

from __future__ import annotations

from typing import Any

from .._job import Job
from ._numba_run import STORAGE, rows_of, run_kernel

__all__ = ["run"]


def run(job: Job) -> Any:
    x = job.x
    kind = STORAGE.get(job.key.dtype, "float")
    if job.key.tracer:  # torch.compile's, the one tracer it takes: its op, on the call's tables
        from . import _numba_op  # imports torch, which x came from

        rotated = _numba_op.rotate(x, *job.tables(), kind, job.layout, job.inverse, job.seq_axis)
        if job.out is None:
            return rotated
        job.out[...] = rotated
        return job.out
    found = job.source.lookup(x.shape[job.seq_axis], job.compute)
    cos, sin, rows = found if found is not None else rows_of(job.ctx.xp, *job.tables())
    out = job.out  # C-contiguous where given (declared), and tables in the compute dtype
    if job.ctx.grad:
        return _autograd().apply(x, cos, sin, rows, kind, job.layout, job.inverse, job.seq_axis)
    return run_kernel(x, cos, sin, rows, out, kind, job.layout, job.inverse, job.seq_axis)


_Function: Any = None


def _autograd() -> Any:
    global _Function
    if _Function is None:
        import torch

        class Rotate(torch.autograd.Function):
            @staticmethod
            def forward(
                ctx: Any,
                x: Any,
                cos: Any,
                sin: Any,
                rows: Any,
                kind: str,
                layout: str,
                inverse: bool,
                seq_axis: int,
            ) -> Any:
                ctx.save_for_backward(cos, sin)
                ctx.rows, ctx.kind, ctx.layout, ctx.inverse, ctx.seq_axis = (
                    rows,
                    kind,
                    layout,
                    inverse,
                    seq_axis,
                )
                return run_kernel(x.contiguous(), cos, sin, rows, None, kind, layout, inverse, seq_axis)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                cos, sin = ctx.saved_tensors
                # Linear in x: the vector-Jacobian product is the inverse rotation of grad.
                again: Any = Rotate.apply  # untyped in torch's stubs
                back = again(
                    grad.contiguous(), cos, sin, ctx.rows, ctx.kind, ctx.layout, not ctx.inverse, ctx.seq_axis
                )
                return back, None, None, None, None, None, None, None

        _Function = Rotate
    return _Function
