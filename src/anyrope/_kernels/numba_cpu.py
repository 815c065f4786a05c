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

from .._job import NEW, Job, Launch, PairLaunch, offers, turn_alike
from .._tables import side_by_side
from ._numba_run import STORAGE, launcher, rows_of, run_kernel

__all__ = ["prepare", "prepare_pair", "prepare_traced"]


def prepare(job: Job) -> Launch:
    xp, seq, compute, layout, inverse, axis = (
        job.ctx.xp,
        job.seq,
        job.compute,
        job.layout,
        job.inverse,
        job.seq_axis,
    )
    kind = STORAGE.get(job.key.dtype, "float")
    lookup = offers(job, "lookup")
    if job.ctx.grad:

        def recorded(x: Any, out: Any, source: Any) -> Any:  # noqa: ARG001 - grad: never in place
            table, rows = _rows(xp, source, seq, compute, lookup)
            return _autograd().apply(x, table, rows, kind, layout, inverse, axis)

        return recorded
    # the destination is C-contiguous where given (declared), and the table in the compute dtype
    run = launcher(((job.shape, axis, job.writes == NEW),), *_dtype(job), kind, layout, inverse, compute)

    def launch(x: Any, out: Any, source: Any) -> Any:
        found = source.lookup(seq, compute) if lookup else None
        table, rows = found if found is not None else rows_of(xp, *source.tables(seq, compute))
        return run((x,), (out,), table, rows)[0]

    return launch


def prepare_traced(job: Job) -> Launch:
    """A traced call's launch (torch.compile's, the one tracer it takes): its op, on the call's
    one side-by-side table where the source offers it (kept rows, or its tables stacked once for
    q and k), else on this array's own tables."""
    from . import _numba_op  # imports torch, which x came from

    xp, seq, compute, layout, inverse, axis = (
        job.ctx.xp, job.seq, job.compute, job.layout, job.inverse, job.seq_axis,
    )  # fmt: skip
    kind, shared = STORAGE.get(job.key.dtype, "float"), offers(job, "side_by_side")

    def traced(x: Any, out: Any, source: Any) -> Any:
        table = (
            source.side_by_side(seq, compute) if shared else side_by_side(xp, *source.tables(seq, compute))
        )
        rotated = _numba_op.rotate(x, table, kind, layout, inverse, axis)
        if job.writes == NEW:
            return rotated
        out[...] = rotated
        return out

    return traced


def prepare_pair(q: Job, k: Job) -> PairLaunch | None:
    """q and k in one launch where they turn alike (:func:`turn_alike`) over sequences of one
    length; None (one launch each) otherwise, and while recording gradients."""
    if q.ctx.grad or q.seq != k.seq or not turn_alike(q, k):
        return None
    xp, seq, compute, lookup = q.ctx.xp, q.seq, q.compute, offers(q, "lookup")
    arrays = ((q.shape, q.seq_axis, q.writes == NEW), (k.shape, k.seq_axis, k.writes == NEW))
    run = launcher(arrays, *_dtype(q), STORAGE.get(q.key.dtype, "float"), q.layout, q.inverse, compute)

    def launch(x: Any, y: Any, out_x: Any, out_y: Any, source: Any, _: Any) -> tuple[Any, Any]:
        found = source.lookup(seq, compute) if lookup else None  # as _rows, without its frame
        table, rows = found if found is not None else rows_of(xp, *source.tables(seq, compute))
        rotated_x, rotated_y = run((x, y), (out_x, out_y), table, rows)
        return rotated_x, rotated_y

    return launch


def _dtype(job: Job) -> tuple[bool, Any]:
    """Whether the job's arrays are NumPy's (else torch's), and its dtype as their library names
    it (the launcher makes outputs of it)."""
    if job.key.library == "numpy":
        import numpy as np

        return True, np.dtype(job.key.dtype)
    return False, getattr(job.ctx.xp, job.key.dtype)


def _rows(xp: Any, source: Any, seq: int, compute: Any, lookup: bool) -> tuple[Any, Any]:
    """The table and each (batch row, token)'s row in it: the cached prefix table where the
    source offers it (``lookup``) and the positions are host-known and inside it, else the call's
    own tables side by side."""
    found = source.lookup(seq, compute) if lookup else None
    return found if found is not None else rows_of(xp, *source.tables(seq, compute))


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
