"""The Triton kernel for PyTorch CUDA tensors (see :mod:`._triton`, imported on first use).

Under Triton's interpreter (``TRITON_INTERPRET=1``) it takes CPU tensors too: that is how the
test suite holds it to the generic path on a machine without a GPU.
"""

from __future__ import annotations

import os

from .._fusion import PrologueJob, PrologueLaunch
from .._job import Job, Launch, PairLaunch, turn_alike

__all__ = [
    "DEVICES",
    "LONGEST_HEAD",
    "prepare",
    "prepare_pair",
    "prepare_pair_traced",
    "prepare_prologue",
    "prepare_traced",
]

#: CUDA (and ROCm, which torch also calls "cuda"); the CPU as well under Triton's interpreter
DEVICES = frozenset({"cuda", "cpu"} if os.environ.get("TRITON_INTERPRET") == "1" else {"cuda"})

#: The most features a head may have where the fused prologue normalises it: a program holds
#: its rows of them in registers.
LONGEST_HEAD = 1024


def prepare(job: Job) -> Launch:
    from . import _triton  # imports triton, an optional library: on first use

    launch: Launch = _triton.prepare(job)
    return launch


def prepare_traced(job: Job) -> Launch:
    from . import _triton

    launch: Launch = _triton.prepare_traced(job)
    return launch


def prepare_pair(q: Job, k: Job) -> PairLaunch | None:
    """q and k in one launch where they turn alike (:func:`turn_alike`); None (one launch each)
    otherwise."""
    if not turn_alike(q, k):
        return None
    from . import _triton

    launch: PairLaunch = _triton.prepare_pair(q, k)
    return launch


def prepare_pair_traced(q: Job, k: Job) -> PairLaunch | None:
    """As :func:`prepare_pair`, through the ops (see :func:`._triton.prepare_pair_traced`)."""
    if not turn_alike(q, k):
        return None
    from . import _triton

    launch: PairLaunch = _triton.prepare_pair_traced(q, k)
    return launch


def prepare_prologue(job: PrologueJob) -> PrologueLaunch:
    """The fused attention prologue's launch (see :mod:`._triton_prologue`)."""
    from . import _triton_prologue

    launch: PrologueLaunch = _triton_prologue.prepare(job)
    return launch
