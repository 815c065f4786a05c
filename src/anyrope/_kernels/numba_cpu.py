"""The numba kernel for NumPy arrays and CPU torch tensors: one parallel pass over x.

It reads each token's row by position from one table of cos and sin side by side
(:func:`anyrope._tables.side_by_side`): the cached prefix table where the positions are
host-known and inside it (no gathered copy, which is most of a decode step's cost), else the
call's own tables put side by side, with rows 0, 1, 2, .... torch tensors reach it through
zero-copy NumPy views (:mod:`._numba_run`), inside an ``autograd.Function`` whose backward is
the inverse rotation through the same kernel; while ``torch.compile`` traces them, through a
torch operator (:mod:`._numba_op`), which at an int offset reads the same cached table's rows
as inputs of the graph.
"""

from __future__ import annotations

from typing import Any

from .._job import Job, turn_alike
from .._tables import side_by_side
from ._numba_run import STORAGE, rows_of, run_kernel, run_kernels

__all__ = ["run", "run_pair"]


def run(job: Job) -> Any:
    x = job.x
    kind = STORAGE.get(job.key.dtype, "float")
    if job.key.tracer:  # torch.compile's, the one tracer it takes: its op, on the call's tables
        from . import _numba_op  # imports torch, which x came from

        table = job.traced_side_by_side()  # one for q and k: kept rows, or stacked in the graph
        if table is None:
            table = side_by_side(job.ctx.xp, *job.tables())
        rotated = _numba_op.rotate(x, table, kind, job.layout, job.inverse, job.seq_axis)
        if job.out is None:
            return rotated
        job.out[...] = rotated
        return job.out
    table, rows = _rows(job)
    out = job.out  # C-contiguous where given (declared), and the table in the compute dtype
    if job.ctx.grad:
        return _autograd().apply(x, table, rows, kind, job.layout, job.inverse, job.seq_axis)
    return run_kernel(x, table, rows, out, kind, job.layout, job.inverse, job.seq_axis)


def run_pair(q: Job, k: Job) -> tuple[Any, Any]:
    """q and k in one launch where they turn alike (:func:`turn_alike`) over sequences of one
    length; otherwise, and while traced or recording gradients, one launch each."""
    x, y = q.x, k.x
    together = (
        not q.key.tracer
        and not q.ctx.grad
        and x.shape[q.seq_axis] == y.shape[k.seq_axis]
        and turn_alike(q, k)
    )
    if not together:
        return run(q), run(k)
    table, rows = _rows(q)
    arrays = ((x, q.out, q.seq_axis), (y, k.out, k.seq_axis))
    kind = STORAGE.get(q.key.dtype, "float")
    rotated_q, rotated_k = run_kernels(arrays, table, rows, kind, q.layout, q.inverse)
    return rotated_q, rotated_k


def _rows(job: Job) -> tuple[Any, Any]:
    """The table and each (batch row, token)'s row in it: the cached prefix table where the
    positions are host-known and inside it, else the call's own tables side by side."""
    found = job.source.lookup(job.x.shape[job.seq_axis], job.compute)
    return found if found is not None else rows_of(job.ctx.xp, *job.tables())


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
                table: Any,
                rows: Any,
                kind: str,
                layout: str,
                inverse: bool,
                seq_axis: int,
            ) -> Any:
                ctx.save_for_backward(table)
                ctx.rows, ctx.kind, ctx.layout, ctx.inverse, ctx.seq_axis = (
                    rows,
                    kind,
                    layout,
                    inverse,
                    seq_axis,
                )
                return run_kernel(x.contiguous(), table, rows, None, kind, layout, inverse, seq_axis)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                (table,) = ctx.saved_tensors
                # Linear in x: the vector-Jacobian product is the inverse rotation of grad.
                again: Any = Rotate.apply  # untyped in torch's stubs
                back = again(
                    grad.contiguous(), table, ctx.rows, ctx.kind, ctx.layout, not ctx.inverse, ctx.seq_axis
                )
                return back, None, None, None, None, None, None

        _Function = Rotate
    return _Function
