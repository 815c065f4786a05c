"""The generic kernel: array-API operations only, so it takes every job on every library."""

from __future__ import annotations

from typing import Any

from .._job import Job
from .._pairs import turn_pairs

__all__ = ["run"]


def run(job: Job) -> Any:
    cos, sin = job.tables()
    result = turn_pairs(
        job.ctx.xp, job.x, cos, sin, layout=job.layout, inverse=job.inverse, seq_axis=job.seq_axis
    )
    if job.out is None:
        return result
    job.out[...] = result  # in place: the result is complete before anything is written
    return job.out
