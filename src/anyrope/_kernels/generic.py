"""The generic kernel: array-API operations only, so it takes every job on every library."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._rotate import rotate_generic

if TYPE_CHECKING:
    from .._plan import Job

__all__ = ["run"]


def run(job: Job) -> Any:
    cos, sin = job.tables()
    result = rotate_generic(
        job.xp, job.x, cos, sin, layout=job.layout, inverse=job.inverse, seq_axis=job.seq_axis
    )
    if job.out is None:
        return result
    job.out[...] = result  # in place: the result is complete before anything is written
    return job.out
