"""The fused CUDA kernel for CuPy arrays: ``rope.cu``, compiled by NVRTC through CuPy on first use.

:func:`arguments` turns a call into the kernel's launch (grid, block and arguments) from shapes,
strides and dtypes only, for any array library with NumPy-style byte strides: CuPy here, and
NumPy in the tests, which run the same source built for the host by nvcc.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any

from .._angles import SPLIT_BITS
from .._job import NEW, Job, Launch
from .._kernel_angles import POSITIONS, STARTS, TABLES, KernelAngles
from .._pairs import five_axes

__all__ = ["BLOCK", "OPTIONS", "TYPES", "arguments", "prepare", "source"]

HALF, INVERSE, SCALED, COPY_TAIL, MULTI = 1, 2, 4, 8, 16  # rope.cu's Flag
BLOCK = 128  # threads per block
GROUP = 8  # heads each thread rotates with the angle it formed
TYPES = {"float16": "__half", "float32": "float", "float64": "double"}  # CuPy has no bfloat16
#: The compiler options: no fused multiply-adds (the generic path's roundings), the angle split
OPTIONS = ("--fmad=false", f"-DANYROPE_SPLIT_BITS={SPLIT_BITS}")


def source() -> str:
    """The kernel's CUDA source."""
    return resources.files(__package__).joinpath("rope.cu").read_text()


def _library(a: Any) -> Any:
    """The array's own module (cupy, or numpy in the tests)."""
    import importlib

    return importlib.import_module(type(a).__module__.split(".")[0])


def _strides(a: Any) -> tuple[int, ...]:
    return tuple(step // a.itemsize for step in a.strides)


def arguments(
    job: Job, angles: KernelAngles, x: Any, out: Any
) -> tuple[tuple[int, int], int, tuple[Any, ...]]:
    """(grid, block, arguments) that rotate C-contiguous ``x`` into C-contiguous ``out`` (which
    may be x); integers as NumPy scalars of the kernel's types."""
    import numpy as np

    xp = job.ctx.xp
    batch, heads, seq, trail, width = five_axes(tuple(x.shape), job.seq_axis)
    dense = (heads * seq * trail * width, seq * trail * width, trail * width, width)
    pairs, mode = angles.pairs, angles.mode
    flags = (HALF if job.layout == "half" else 0) | (INVERSE if job.inverse else 0)
    flags |= (SCALED if angles.scaled else 0) | (MULTI if angles.streams is not None else 0)
    if width > 2 * pairs and out is not x:
        flags |= COPY_TAIL
    index, index_strides = angles.index, (0, 0, 0)
    if mode in (STARTS, POSITIONS):
        if index.dtype != xp.int64:
            index = xp.astype(index, xp.int64)  # on the device: widening never changes a value
        shared = _strides(index)
        if mode == STARTS:
            index_strides = (0, shared[0] if angles.rows > 1 else 0, 0)
        else:
            index_strides = (shared[0], shared[1] if angles.rows > 1 else 0, shared[2])
    cos, sin, table_strides = angles.cos, angles.sin, (0, 0)
    if mode == TABLES:
        if not (cos.flags.c_contiguous and sin.flags.c_contiguous):
            cos, sin = _library(x).ascontiguousarray(cos), _library(x).ascontiguousarray(sin)
        table_strides = (cos.shape[-2] * pairs if angles.rows > 1 else 0, pairs)
    unused = x  # any array: the kernel does not read it in this mode
    groups = -(-(heads * trail) // GROUP)
    grid = (-(-(batch * seq * pairs) // BLOCK), groups)
    i64 = np.int64
    numbers = (batch, heads, seq, trail, width, pairs, GROUP, angles.start, *dense, *dense)
    args = (
        x, out, unused if index is None else index, unused if angles.steps is None else angles.steps,
        unused if angles.streams is None else angles.streams, unused if cos is None else cos,
        unused if sin is None else sin,
        *(i64(v) for v in (*numbers, *index_strides, *table_strides)), np.int32(mode), np.int32(flags),
    )  # fmt: skip
    return grid, BLOCK, args


_lock = threading.Lock()
_module: Any = None


def _function(dtype_name: str) -> Any:
    """The compiled kernel for x of this dtype (NVRTC, once per process; CuPy caches it on disk)."""
    global _module
    if _module is None:
        import cupy

        with _lock:
            if _module is None:
                _module = cupy.RawModule(
                    code=source(),
                    options=OPTIONS,
                    name_expressions=[f"anyrope::rotate<{t}>" for t in TYPES.values()],
                )
    return _module.get_function(f"anyrope::rotate<{TYPES[dtype_name]}>")


def prepare(job: Job) -> Launch:
    """The launch of one job: its compiled function found once, then per call the arguments of
    the call's angles and arrays."""
    import cupy

    function, compute, new = _function(job.key.dtype), job.compute, job.writes == NEW

    def launch(x: Any, target: Any, source: Any) -> Any:
        angles = source.kernel_angles(compute)
        source_x = cupy.ascontiguousarray(x)  # the array itself where it already is
        if new:
            target = cupy.empty_like(source_x)
        out = target if target.flags.c_contiguous else cupy.empty_like(source_x)
        grid, block, args = arguments(job, angles, source_x, out)
        function(grid, (block,), args)
        if out is not target:
            target[...] = out
        return target

    return launch
