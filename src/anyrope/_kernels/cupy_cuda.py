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
from .._job import NEW, Job, Launch, PairLaunch, turn_alike
from .._kernel_angles import POSITIONS, STARTS, TABLES, KernelAngles
from .._pairs import five_axes

__all__ = [
    "BLOCK",
    "NAMES",
    "OPTIONS",
    "TYPES",
    "KernelLaunch",
    "arguments",
    "kernel_name",
    "launcher",
    "packing",
    "pair_launcher",
    "pairable",
    "prepare",
    "prepare_pair",
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


def packing(arrays: tuple[Any, ...], pairs: int, width: int, half: bool) -> tuple[int, bool]:
    """The pairs a thread rotates (rope.cu's V) and whether its packs are aligned words: the
    most pairs whose packs (V elements of each half, or 2V interleaved) fill up to 16 bytes and
    start on their own size in every one of the C-contiguous ``arrays`` (x and out, and k's:
    every row, and the second half); else one pair, read as one aligned word where that holds
    (a half-layout pack of one element always does), element by element where it does not."""
    size = arrays[0].itemsize
    chosen = _widest(size, half)
    while chosen >= 1:
        pack = chosen if half else 2 * chosen
        fits = pairs % chosen == 0 and width % pack == 0
        if fits and all(_address(a) % (pack * size) == 0 for a in arrays):
            return chosen, True
        chosen //= 2
    return 1, half


def arguments(
    job: Job, angles: KernelAngles, x: Any, out: Any, y: Any = None, y_out: Any = None, y_job: Any = None
) -> KernelLaunch:
    """The launch that rotates C-contiguous ``x`` into C-contiguous ``out`` (which may be x), and
    with ``y_job`` k of the same call, ``y`` into ``y_out``, in the same launch (one batch,
    sequence, dtype, layout and direction: their head counts may differ); integers as NumPy
    scalars of the kernel's types."""
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
    second: tuple[Any, ...] = (x, out, heads, trail, *dense, *dense)  # x again where it is alone
    if y_job is not None:
        _, y_heads, _, y_trail, _ = five_axes(tuple(y.shape), y_job.seq_axis)
        y_dense = (y_heads * seq * y_trail * width, seq * y_trail * width, y_trail * width, width)
        second = (y, y_out, y_heads, y_trail, *y_dense, *y_dense)
    per_thread, aligned = packing((x, out, *second[:2]), pairs, width, half)
    blocks = -(-(batch * seq * (pairs // per_thread)) // BLOCK)
    lanes = max(heads * trail, second[2] * second[3])
    grid = (blocks * (2 if y_job is not None else 1), -(-lanes // GROUP))
    unused = x  # any array: the kernel does not read it in this mode
    i64 = np.int64
    numbers = (batch, heads, seq, trail, width, pairs, GROUP, angles.start, *dense, *dense)
    args = (
        x, out, unused if index is None else index, unused if angles.steps is None else angles.steps,
        unused if angles.streams is None else angles.streams, unused if cos is None else cos,
        unused if sin is None else sin,
        *(i64(v) for v in (*numbers, *index_strides, *table_strides)), np.int32(mode), np.int32(flags),
        *second[:2], *(i64(v) for v in (*second[2:], blocks)),
    )  # fmt: skip
    return KernelLaunch(grid, BLOCK, kernel_name(str(x.dtype), per_thread, half, aligned), args)


def kernel_name(dtype_name: str, per_thread: int, half: bool, aligned: bool) -> str:
    """The C++ name of the kernel for x of this dtype rotating ``per_thread`` pairs a thread in
    the half (else interleaved) layout, its packs aligned words or not (see :func:`packing`)."""
    flags = ", ".join("true" if f else "false" for f in (half, aligned))
    return f"anyrope::rotate<{TYPES[dtype_name]}, {per_thread}, {flags}>"


def _widest(itemsize: int, half: bool) -> int:
    """The most pairs a thread rotates: 16 bytes of each half, or of interleaved pairs."""
    return 16 // itemsize if half else 8 // itemsize


def _names_of(dtype: str, half: bool) -> list[str]:
    """The kernels :func:`packing` may choose for x of this dtype and layout."""
    widest = _widest({"float16": 2, "float32": 4, "float64": 8}[dtype], half)
    found = [kernel_name(dtype, 1 << i, half, True) for i in range(widest.bit_length())]
    return found if half else [*found, kernel_name(dtype, 1, False, False)]  # pairs off their word


#: Every kernel rope.cu is compiled into (NVRTC's name expressions), as :func:`packing` chooses
NAMES = tuple(name for dtype in TYPES for half in (True, False) for name in _names_of(dtype, half))


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


def _functions(job: Job) -> dict[str, Any]:
    """The compiled kernels a job of this dtype and layout may launch, by name."""
    return {name: _function(name) for name in _names_of(job.key.dtype, job.layout == "half")}


def _dense(library: Any, x: Any, target: Any, new: bool) -> tuple[Any, Any, Any]:
    """x as a C-contiguous array (itself where it is one), the array to return (a new one, or
    ``target``), and where the kernel writes (the array to return, or a C-contiguous stand-in
    copied into it after the launch)."""
    dense = library.ascontiguousarray(x)
    if new:
        target = library.empty_like(dense)
    return dense, target, target if target.flags.c_contiguous else library.empty_like(dense)


def prepare(job: Job) -> Launch:
    """The launch of one job: its compiled functions found once, then per call the arguments of
    the call's angles and arrays."""
    import cupy

    return launcher(job, cupy, _functions(job))


def prepare_pair(q: Job, k: Job) -> PairLaunch | None:
    """q and k in one launch where :func:`pairable`; None (one launch each) otherwise."""
    if not pairable(q, k):
        return None
    import cupy

    return pair_launcher(q, k, cupy, _functions(q))


def pairable(q: Job, k: Job) -> bool:
    """Whether one launch turns q and k: they turn alike (:func:`turn_alike`) over sequences of
    one length, in arrays of one rank, sequence axis and batch (k's head counts and strides are
    its own)."""
    same = q.seq == k.seq and q.seq_axis == k.seq_axis and len(q.shape) == len(k.shape)
    return same and q.shape[0] == k.shape[0] and turn_alike(q, k)


def launcher(job: Job, library: Any, functions: Any) -> Launch:
    """``prepare``'s launch, its arrays made with ``library`` (cupy; numpy in the tests) and its
    kernels ``functions[name](grid, block, args)``."""
    compute, new = job.compute, job.writes == NEW

    def launch(x: Any, target: Any, source: Any) -> Any:
        angles = source.kernel_angles(compute)
        x, target, out = _dense(library, x, target, new)
        grid, block, name, args = arguments(job, angles, x, out)
        functions[name](grid, (block,), args)
        if out is not target:
            target[...] = out
        return target

    return launch


def pair_launcher(q: Job, k: Job, library: Any, functions: Any) -> PairLaunch:
    """``prepare_pair``'s launch, as :func:`launcher` makes ``prepare``'s."""
    compute, new = q.compute, q.writes == NEW

    def launch(x: Any, y: Any, x_target: Any, y_target: Any, source: Any, _: Any) -> tuple[Any, Any]:
        angles = source.kernel_angles(compute)
        x, x_target, x_out = _dense(library, x, x_target, new)
        y, y_target, y_out = _dense(library, y, y_target, new)
        grid, block, name, args = arguments(q, angles, x, x_out, y, y_out, k)
        functions[name](grid, (block,), args)
        for out, target in ((x_out, x_target), (y_out, y_target)):
            if out is not target:
                target[...] = out
        return x_target, y_target

    return launch
