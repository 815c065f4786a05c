"""The generic kernel: array-API operations only, so it takes every job on every library."""

from __future__ import annotations

from typing import Any

from .._job import NEW, Job, Launch
from .._pairs import turn_pairs

__all__ = ["prepare"]


def prepare(job: Job) -> Launch:
    xp, seq, compute, layout, inverse, axis = (
        job.ctx.xp,
        job.seq,
        job.compute,
        job.layout,
        job.inverse,
        job.seq_axis,
    )
    new = job.writes == NEW

    def launch(x: Any, out: Any, source: Any) -> Any:
        cos, sin = source.tables(seq, compute)
        result = turn_pairs(xp, x, cos, sin, layout=layout, inverse=inverse, seq_axis=axis)
        if new:
            return result
        out[...] = result  # in place: the result is complete before anything is written
        return out

    return launch
