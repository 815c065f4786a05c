"""The Triton kernel for PyTorch CUDA tensors (see :mod:`._triton`, imported on first use).

Under Triton's interpreter (``TRITON_INTERPRET=1``) it takes CPU tensors too: that is how the
test suite holds it to the generic path on a machine without a GPU.
"""

from __future__ import annotations

import os
from typing import Any

from .._job import Job, turn_alike

__all__ = ["DEVICES", "run", "run_pair"]

#: CUDA (and ROCm, which torch also calls "cuda"); the CPU as well under Triton's interpreter
DEVICES = frozenset({"cuda", "cpu"} if os.environ.get("TRITON_INTERPRET") == "1" else {"cuda"})


def run(job: Job) -> Any:
    from . import _triton  # imports triton, an optional library: on first use

    return _triton.call_ops(job, job.source.kernel_angles(job.x, job.seq_axis))


def run_pair(q: Job, k: Job) -> tuple[Any, Any]:
    """q and k in one launch where they turn alike (:func:`turn_alike`); otherwise one launch
    each."""
    from . import _triton

    together = turn_alike(q, k)
    if not together:
        return run(q), run(k)
    return _triton.call_pair_ops(q, k, q.source.kernel_angles(q.x, q.seq_axis))
