"""Dask arrays, block by block: each chunk of x, with the positions of its own tokens, through
the kernels of the chunk's library (numba on NumPy chunks, where installed).

RoPE is elementwise per token and feature pair, so a chunk rotates on its own once it has its
tokens' positions: the call's positions become a dask array chunked like x along the batch and
sequence axes (an offset becomes ``arange``, per-row offsets add one), and ``blockwise`` hands
each block of x its block of positions. No communication, and nothing computed during the call.

A pair spans the feature axis, so that axis must be one chunk: a split one is joined along that
axis alone, and the result split back, so the output has x's chunks. Length-dependent scaling
(DynamicNTK, LongRoPE) takes its frequencies from ``max(positions) + 1`` over every block: the
maximum is a lazy reduction handed to each block (or known on the host).

A front end, not a kernel: a call's plan takes its launch from here for dask arrays, and each
block runs later (perhaps in another thread or process) through a launch prepared for the
block, under the kernel switch of the call.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from ._context import call_context
from ._dtypes import compute_dtype
from ._job import Job, make_job
from ._positions import MultiAxis, position_spec
from ._registry import Switch, choose, prepare
from ._rotary import Rotary
from ._tables import GivenTables, PositionTables, XPosTables

__all__ = ["prepare_chunked", "rotate_chunks"]


def prepare_chunked(jobs: tuple[Job, ...], switch: Switch) -> Any:
    """The launch of a call's dask jobs (as :func:`anyrope._registry.prepare` gives it: one
    array's, or q and k's), each array rotated lazily, chunk by chunk."""
    if len(jobs) == 1:
        (job,) = jobs
        return lambda x, out, source: rotate_chunks(job, x, source, switch)  # noqa: ARG005 - no out=
    q, k = jobs

    def both(x: Any, y: Any, out_x: Any, out_y: Any, source_x: Any, source_y: Any) -> tuple[Any, Any]:  # noqa: ARG001
        return rotate_chunks(q, x, source_x, switch), rotate_chunks(k, y, source_y, switch)

    return both


def rotate_chunks(job: Job, x: Any, source: Any, switch: Switch) -> Any:
    """Dask array ``x`` of ``job`` rotated lazily, chunk by chunk, by ``source``; a kernel the
    switch names must take the chunks, which is asked now, before the graph is built."""
    if switch is not True:
        choose(_chunk_job(job, x, source), switch)
    seq_axis = job.seq_axis
    unknown = [axis for axis, sizes in enumerate(x.chunks) if any(math.isnan(size) for size in sizes)]
    if unknown:
        raise ValueError(
            f"{job.arg} has chunks of unknown size along axes {unknown}; call "
            f"{job.arg}.compute_chunk_sizes() first (RoPE pairs each token with its position)"
        )
    work = x.rechunk({x.ndim - 1: -1}) if len(x.chunks[-1]) > 1 else x  # a pair spans the features
    at = x.ndim + seq_axis
    axes = tuple(range(x.ndim))
    if source.kind == "tables":  # the caller's (anyrope._tables.GivenTables)
        out = _with_tables(job, work, at, axes, source, switch)
    elif source.kind == "xpos":  # the call's positions, scaled (anyrope._tables.XPosTables)
        out = _with_positions(job, work, at, axes, source.positions, source.sign, switch)
    else:
        out = _with_positions(job, work, at, axes, source, None, switch)
    return out if work is x else out.rechunk(x.chunks)


def _chunk_job(job: Job, x: Any, source: Any) -> Job:
    """A job like each chunk's: x's meta array (an empty array of the chunks' library) with the
    positions a block gets, explicit ones at fixed frequencies, or the caller's tables."""
    meta = x._meta
    ctx = call_context(("x", meta))
    if source.kind not in ("tables", "xpos"):
        kind = "multi-axis" if source.kind == "multi-axis" else "positions"
        source = _ChunkPositions(kind, source.unsigned64)
    return make_job(
        ctx, meta, arg=job.arg, seq_axis=job.seq_axis, layout=job.layout, inverse=job.inverse, out=None,
        source=source, compute=compute_dtype(ctx.xp, meta.dtype),
    )  # fmt: skip


class _ChunkPositions:
    """What a block's positions are, for its kernel key: explicit, at frequencies fixed for the
    whole call (a length-dependent scaling's length is taken over every block first)."""

    device_frequencies = False
    table_grad = False

    def __init__(self, kind: str, unsigned64: bool) -> None:
        self.kind, self.unsigned64 = kind, unsigned64


def _aligned(work: Any, table: Any, at: int, rows: int, axes: tuple[int, ...]) -> tuple[Any, Any]:
    """``table`` shaped (rows, seq, ...) or (seq, ...) chunked like x's batch and sequence axes,
    with its blockwise indices (trailing axes get indices x does not have: whole in every block)."""
    tail = table.ndim - (2 if rows > 1 else 1)
    if rows > 1:
        chunks: dict[int, Any] = {0: work.chunks[0], 1: work.chunks[at]}
        index: tuple[int, ...] = (axes[0], axes[at])
    else:
        chunks, index = {0: work.chunks[at]}, (axes[at],)
    chunks |= {len(index) + i: -1 for i in range(tail)}
    return table.rechunk(chunks), (*index, *range(len(axes), len(axes) + tail))


def _dask() -> Any:
    return importlib.import_module("dask.array")  # typed as Any: the lint environment lacks dask


def _with_tables(
    job: Job, work: Any, at: int, axes: tuple[int, ...], given: GivenTables, switch: Switch
) -> Any:
    cos, sin = given.cos, given.sin
    rows = cos.shape[0] if cos.ndim == 3 else 1
    if cos.ndim == 3 and rows == 1:
        cos, sin = cos[0], sin[0]
    cos, index = _aligned(work, cos, at, rows, axes)
    sin, _ = _aligned(work, sin, at, rows, axes)
    return _dask().blockwise(
        _apply_block, axes, work, axes, cos, index, sin, index, dtype=work.dtype, meta=work._meta,
        concatenate=True, layout=job.layout, inverse=job.inverse, seq_axis=job.seq_axis, switch=switch,
    )  # fmt: skip


def _with_positions(
    job: Job,
    work: Any,
    at: int,
    axes: tuple[int, ...],
    source: PositionTables,
    sign: float | None,
    switch: Switch,
) -> Any:
    da = _dask()
    rotary, spec, ctx = source.rotary, source.spec, source.ctx
    seq = work.shape[at]
    positions = spec.positions(ctx.xp, ctx.env, seq)
    streams = 1
    if isinstance(spec, MultiAxis):
        streams = positions.shape[0]
        positions = positions.rechunk({0: -1})
    rows = positions.shape[-2] if positions.ndim - (streams > 1) == 2 else 1
    if rows == 1 and positions.ndim - (streams > 1) == 2:  # one row shared by the batch
        positions = positions[:, 0] if streams > 1 else positions[0]
    if streams > 1:  # the streams axis first, whole in every block: blockwise contracts it
        moved = da.moveaxis(positions, 0, -1)
        positions, index = _aligned(work, moved, at, rows, axes)
        positions, index = da.moveaxis(positions, -1, 0), (index[-1], *index[:-1])
    else:
        positions, index = _aligned(work, positions, at, rows, axes)
    extra: list[Any] = []
    if rotary.spectrum.length_dependent:  # one length for every block: max(positions) + 1
        if source.host is not None:
            rotary = rotary.at_length(max(1, source.host[1] + 1))
        else:
            extra = [spec.largest(ctx.xp, ctx.env, seq), ()]
    return da.blockwise(
        _rotate_block, axes, work, axes, positions, index, *extra, dtype=work.dtype, meta=work._meta,
        concatenate=True, rotary=rotary, layout=job.layout, inverse=job.inverse, seq_axis=job.seq_axis,
        sign=sign, multi=isinstance(spec, MultiAxis), switch=switch,
    )  # fmt: skip


def _rotate_block(
    block: Any,
    positions: Any,
    *largest: Any,
    rotary: Rotary,
    layout: Any,
    inverse: bool,
    seq_axis: int,
    sign: float | None,
    multi: bool,
    switch: Switch,
) -> Any:
    """One chunk of x rotated by its tokens' positions."""
    ctx = call_context(("x", block))
    xp = ctx.xp
    if largest:
        rotary = rotary.at_length(max(1, int(largest[0]) + 1))
    if type(positions).__module__.split(".")[0] != type(block).__module__.split(".")[0]:
        positions = xp.asarray(positions, device=ctx.device)  # CuPy chunks: their positions on the GPU
    if rotary.streams > 1 and not multi and positions.ndim == 2:  # per-row offsets: every stream alike
        positions = xp.stack([positions] * rotary.streams)
    spec = position_spec(xp, ctx.env, positions, 0, streams=rotary.streams)
    source: Any = PositionTables(rotary, ctx, spec, block.shape[seq_axis])
    if sign is not None:
        source = XPosTables(source, sign)
    job = make_job(
        ctx, block, arg="x", seq_axis=seq_axis, layout=layout, inverse=inverse, out=None, source=source,
        compute=compute_dtype(xp, block.dtype),
    )  # fmt: skip
    return prepare((job,), switch, shared=False)(block, None, source)


def _apply_block(
    block: Any, cos: Any, sin: Any, *, layout: Any, inverse: bool, seq_axis: int, switch: Switch
) -> Any:
    """One chunk of x rotated by its rows of the caller's tables."""
    ctx = call_context(("x", block))
    xp = ctx.xp
    compute = compute_dtype(xp, block.dtype)
    cos, sin = xp.astype(cos, compute, copy=False), xp.astype(sin, compute, copy=False)
    source = GivenTables(cos, sin, grad=False)
    job = make_job(
        ctx, block, arg="x", seq_axis=seq_axis, layout=layout, inverse=inverse, out=None, source=source,
        compute=compute,
    )  # fmt: skip
    return prepare((job,), switch, shared=False)(block, None, source)
