"""The fused CUDA kernel for CuPy arrays: ``rope.cu``, compiled by NVRTC through CuPy on first use.

:func:`arguments` turns a call into the kernel's launch (grid, block and arguments) from shapes,
strides and dtypes only, for any array library with NumPy-style byte strides: CuPy here, and
NumPy in the tests, which run the same source built for the host by nvcc.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any, NamedTuple

from .._angles import SPLIT_BITS
from .._job import NEW, Job, Launch
from .._kernel_angles import POSITIONS, STARTS, TABLES, KernelAngles
from .._pairs import five_axes

__all__ = [
    "BLOCK", "NAMES", "OPTIONS", "TYPES", "KernelLaunch", "arguments", "kernel_name", "packing", "prepare",
    "source",
]  # fmt: skip

INVERSE, SCALED, COPY_TAIL, MULTI = 2, 4, 8, 16  # rope.cu's Flag (the layout is the kernel's own)
BLOCK = 128  # threads per block
GROUP = 8  # heads each thread rotates with the angle it formed
TYPES = {"float16": "__half", "float32": "float", "float64": "double"}  # CuPy has no bfloat16

#: The compiler options: no fused multiply-adds (the generic path's roundings), C++17 (``if
#: constexpr``), the angle split
OPTIONS = ("--fmad=false", "-std=c++17", f"-DANYROPE_SPLIT_BITS={SPLIT_BITS}")


def source() -> str:
    """The kernel's CUDA source."""
    return resources.files(__package__).joinpath("rope.cu").read_text()


def _library(a: Any) -> Any:
    """The array's own module (cupy, or numpy in the tests)."""
    import importlib

    return importlib.import_module(type(a).__module__.split(".")[0])


def _strides(a: Any) -> tuple[int, ...]:
    return tuple(step // a.itemsize for step in a.strides)


class KernelLaunch(NamedTuple):
    """A launch of :func:`kernel_name`'s kernel: grid, threads per block, and its arguments."""

    grid: tuple[int, int]
    block: int
    name: str
    args: tuple[Any, ...]


def _address(a: Any) -> int:
    """Where the array's first element lies (CuPy's device pointer, NumPy's host one)."""
    data = a.data
    return int(data.ptr) if hasattr(data, "ptr") else int(a.ctypes.data)


def packing(x: Any, out: Any, pairs: int, width: int, half: bool) -> tuple[int, bool]:
    """The pairs a thread rotates (rope.cu's V) and whether its packs are aligned words: the
    most pairs whose packs (V elements of each half, or 2V interleaved) fill up to 16 bytes and
    start on their own size in C-contiguous x and out (every row, and the second half); else one
    pair, read as one aligned word where that holds (a half-layout pack of one element always
    does), element by element where it does not."""
    size = x.itemsize
    chosen = 16 // size if half else 8 // size  # pairs in 16 bytes
    while chosen >= 1:
        pack = chosen if half else 2 * chosen
        fits = pairs % chosen == 0 and width % pack == 0
        if fits and _address(x) % (pack * size) == 0 and _address(out) % (pack * size) == 0:
            return chosen, True
        chosen //= 2
    return 1, half


def arguments(job: Job, angles: KernelAngles, x: Any, out: Any) -> KernelLaunch:
    """The launch that rotates C-contiguous ``x`` into C-contiguous ``out`` (which may be x);
    integers as NumPy scalars of the kernel's types."""
    import numpy as np

    xp = job.ctx.xp
    batch, heads, seq, trail, width = five_axes(tuple(x.shape), job.seq_axis)
    dense = (heads * seq * trail * width, seq * trail * width, trail * width, width)
    pairs, mode = angles.pairs, angles.mode
    half = job.layout == "half"
    flags = INVERSE if job.inverse else 0
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
    per_thread, aligned = packing(x, out, pairs, width, half)
    groups = -(-(heads * trail) // GROUP)
    grid = (-(-(batch * seq * (pairs // per_thread)) // BLOCK), groups)
    i64 = np.int64
    numbers = (batch, heads, seq, trail, width, pairs, GROUP, angles.start, *dense, *dense)
    args = (
        x, out, unused if index is None else index, unused if angles.steps is None else angles.steps,
        unused if angles.streams is None else angles.streams, unused if cos is None else cos,
        unused if sin is None else sin,
        *(i64(v) for v in (*numbers, *index_strides, *table_strides)), np.int32(mode), np.int32(flags),
    )  # fmt: skip
    return KernelLaunch(grid, BLOCK, kernel_name(str(x.dtype), per_thread, half, aligned), args)


def kernel_name(dtype_name: str, per_thread: int, half: bool, aligned: bool) -> str:
    """The C++ name of the kernel for x of this dtype rotating ``per_thread`` pairs a thread in
    the half (else interleaved) layout, its packs aligned words or not (see :func:`packing`)."""
    flags = ", ".join("true" if f else "false" for f in (half, aligned))
    return f"anyrope::rotate<{TYPES[dtype_name]}, {per_thread}, {flags}>"


def _names() -> tuple[str, ...]:
    found = []
    for dtype, itemsize in (("float16", 2), ("float32", 4), ("float64", 8)):
        for half in (True, False):
            per_thread = 16 // itemsize if half else 8 // itemsize
            while per_thread >= 1:
                found.append(kernel_name(dtype, per_thread, half, True))
                per_thread //= 2
        found.append(kernel_name(dtype, 1, False, False))  # interleaved pairs off their word
    return tuple(found)


#: Every kernel rope.cu is compiled into (NVRTC's name expressions), as :func:`packing` chooses
NAMES = _names()


_lock = threading.Lock()
_module: Any = None


def _function(name: str) -> Any:
    """The compiled kernel of this :func:`kernel_name` (NVRTC compiles every one of :data:`NAMES`
    once per process; CuPy caches them on disk)."""
    global _module
    if _module is None:
        import cupy

        with _lock:
            if _module is None:
                _module = cupy.RawModule(
                    code=source(),
                    options=OPTIONS,
                    name_expressions=list(NAMES),
                )
    return _module.get_function(name)


def prepare(job: Job) -> Launch:
    """The launch of one job: its compiled function found once, then per call the arguments of
    the call's angles and arrays."""
    import cupy

    compute, new = job.compute, job.writes == NEW
    functions = {name: _function(name) for name in NAMES if TYPES[job.key.dtype] + "," in name}

    def launch(x: Any, target: Any, source: Any) -> Any:
        angles = source.kernel_angles(compute)
        source_x = cupy.ascontiguousarray(x)  # the array itself where it already is
        if new:
            target = cupy.empty_like(source_x)
        out = target if target.flags.c_contiguous else cupy.empty_like(source_x)
        grid, block, name, args = arguments(job, angles, source_x, out)
        functions[name](grid, (block,), args)
        if out is not target:
            target[...] = out
        return target

    return launch
