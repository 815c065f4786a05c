"""What the fused GPU kernels (Triton, CuPy) take in place of cos/sin tables.

A kernel forms each token's angles itself, by the core's float64 scheme (see
:mod:`anyrope._angles`, "float64"): a position's magnitude in 21-bit parts, each part times
its level's step (the angle of ``2**(21 j)`` positions, reduced modulo 2 pi exactly on the
host), summed in float64, then the device's float64 cos and sin, one cast to the compute
dtype, and the attention factor. The same operations in the same order as the generic path,
so the tables never exist in memory and the result is the generic one.

This module reads the call's positions as they were given (an int offset, per-row offsets,
explicit or multi-axis positions, or the tables :func:`anyrope.apply` was given) and makes
the small constant arrays the kernels read: per pair, each level's step and the scale, and
the position stream it follows. Shapes, dtypes and devices only: it runs under tracing.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from .._angles import SPLIT_BITS
from .._cache import table_cache, untracked
from .._compat import device_of
from .._dtypes import int_info
from .._exact import turns
from .._frequencies import LengthSwitch
from .._plan import PositionAngles
from .._positions import ArrayOffset, MultiAxis, Offset, Positions
from .._rotate import GivenTables

if TYPE_CHECKING:
    from .._plan import Job

__all__ = ["LEVELS", "OFFSET", "POSITIONS", "STARTS", "TABLES", "Fused", "five", "fused"]

# How the kernels find a token's angle: ``start + s``, ``starts[b] + s``, ``positions[stream,
# b, s]``, or the caller's tables ``cos[b, s]``.
OFFSET, STARTS, POSITIONS, TABLES = 0, 1, 2, 3
LEVELS = 3  # 21-bit parts of a 63-bit magnitude (int64 positions)


class Fused:
    """One array's angles, as a fused kernel takes them.

    ``index``: the starts ``(rows,)`` (STARTS) or positions ``(streams, rows, seq)`` (POSITIONS),
    as given (any integer dtype but 64-bit unsigned); ``rows`` is 1 where the batch shares them.
    ``steps``: float64 ``(LEVELS + 1, pairs)``, rows 0 .. LEVELS - 1 each level's step per pair
    (row 0 the frequencies themselves) and row LEVELS the scale; ``streams``: int32 ``(pairs,)``,
    the stream each pair follows, or None with one stream. TABLES: ``cos`` and ``sin``,
    ``(rows, seq, pairs)`` in the compute dtype.
    """

    __slots__ = ("cos", "index", "mode", "pairs", "rows", "scaled", "sin", "start", "steps", "streams")

    def __init__(
        self,
        mode: int,
        pairs: int,
        rows: int,
        *,
        start: Any = 0,
        index: Any = None,
        steps: Any = None,
        streams: Any = None,
        scaled: bool = False,
        cos: Any = None,
        sin: Any = None,
    ) -> None:
        self.mode, self.pairs, self.rows, self.start, self.index = mode, pairs, rows, start, index
        self.steps, self.streams, self.scaled, self.cos, self.sin = steps, streams, scaled, cos, sin


def five(shape: tuple[int, ...], seq_axis: int) -> tuple[int, int, int, int, int]:
    """How the kernels see x of ``shape``: (batch, heads, seq, trail, head_dim), batch its first
    axis, heads the axes between that and the sequence, trail those between the sequence and the
    features."""
    at = len(shape) + seq_axis
    batch = shape[0] if at >= 1 else 1
    heads = math.prod(shape[1:at]) if at >= 1 else 1
    return batch, heads, shape[at], math.prod(shape[at + 1 : -1]), shape[-1]


def fused(job: Job) -> Fused | None:
    """The angles of ``job`` for a fused kernel, or None where only tables can give them: xPos,
    length-dependent frequencies chosen on the device (DynamicNTK, LongRoPE with positions
    the host cannot see), a device without float64, tables of another dtype than the compute
    dtype or that need gradients, unsigned 64-bit positions (their wrap-around is the generic
    path's), and index arrays on another device than ``x``."""
    angles = job.angles
    if isinstance(angles, GivenTables):
        return _given_tables(job, angles)
    if type(angles) is not PositionAngles or isinstance(angles.freqs, LengthSwitch):
        return None
    env = angles.env
    if not env.float64 or env.index_bits != 64:
        return None
    rope, spec, xp = angles.rope, angles.spec, job.xp
    per_pair = tuple(angles.freqs.inv_freq[j] for j in rope.pair_frequencies)
    pairs, scale = len(per_pair), angles.freqs.scale
    # one position per token (1-D positions, offsets) puts every stream there: no stream lookup
    streams_of = rope.pair_streams if isinstance(spec, MultiAxis) else None
    steps, streams = _constants(job, per_pair, scale, streams_of)
    common = {"steps": steps, "streams": streams, "scaled": scale != 1.0}
    if isinstance(spec, Offset):
        return Fused(OFFSET, pairs, 1, start=spec.start, **common)
    if isinstance(spec, ArrayOffset):
        starts = spec.start.array()
        if not _usable(job, starts):
            return None
        rows = 1 if starts.ndim == 0 else starts.shape[0]
        return Fused(STARTS, pairs, rows, index=xp.reshape(starts, (rows,)), **common)
    if isinstance(spec, (Positions, MultiAxis)):
        values = spec.values.array()
        if not _usable(job, values):
            return None
        streams_first = values if isinstance(spec, MultiAxis) else values[None, ...]
        if streams_first.ndim == 2:  # (streams, seq): shared by the batch
            streams_first = streams_first[:, None, :]
        return Fused(POSITIONS, pairs, streams_first.shape[1], index=streams_first, **common)
    return None


def _given_tables(job: Job, given: GivenTables) -> Fused | None:
    cos, sin = given.cos, given.sin
    if cos.dtype != job.compute or sin.dtype != job.compute:
        return None
    if job.grad and (getattr(cos, "requires_grad", False) or getattr(sin, "requires_grad", False)):
        return None  # gradients for the tables themselves: the generic kernel has them
    if cos.ndim == 2:
        cos, sin = cos[None, ...], sin[None, ...]
    return Fused(TABLES, cos.shape[-1], cos.shape[0], cos=cos, sin=sin)


def _usable(job: Job, index: Any) -> bool:
    bits, signed = int_info(job.xp, index.dtype)
    return (signed or bits < 64) and device_of(job.xp, index) == device_of(job.xp, job.x)


def host_steps(per_pair: tuple[float, ...], scale: float) -> tuple[tuple[float, ...], ...]:
    """Each level's step angle per pair, exactly reduced, then the scale per pair."""
    levels = [per_pair, *(turns(1 << (SPLIT_BITS * j), per_pair) for j in range(1, LEVELS))]
    return (*levels, (scale,) * len(per_pair))


_remembered = functools.lru_cache(maxsize=64)(host_steps)  # not while traced: dynamo warns of it


def _constants(
    job: Job, per_pair: tuple[float, ...], scale: float, streams: tuple[int, ...] | None
) -> tuple[Any, Any]:
    """The steps (and the streams) on the device: made there once and kept (a copy per call
    could not be replayed by a CUDA graph); made afresh while traced, where nothing is kept."""
    xp, device = job.xp, device_of(job.xp, job.x)  # NumPy < 2 arrays have no .device

    def build() -> tuple[Any, Any]:
        rows = (host_steps if job.traced else _remembered)(per_pair, scale)
        steps = xp.asarray(rows, dtype=xp.float64, device=device)
        return steps, None if streams is None else xp.asarray(streams, dtype=xp.int32, device=device)

    if job.traced:
        return build()
    key = ("fused-steps", per_pair, scale, streams, job.env)
    with untracked(xp):  # kept for later calls: not inference tensors, which autograd cannot save
        return table_cache.constant(xp, key, build, nbytes=8 * (LEVELS + 2) * len(per_pair))
