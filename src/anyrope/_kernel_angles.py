"""What the fused GPU kernels (Triton, CuPy) take in place of cos/sin tables.

A kernel forms each token's angles itself, by the core's float64 scheme (see
:mod:`anyrope._angles`, "float64"): a position's magnitude in 21-bit parts, each part times
its level's step (the angle of ``2**(21 j)`` positions, reduced modulo 2 pi exactly on the
host), summed in float64, then the device's float64 cos and sin, one cast to the compute
dtype, and the attention factor. The same operations in the same order as the generic path,
so the tables never exist in memory and the result is the generic one.

Each table source gives its own :class:`KernelAngles` (see :mod:`anyrope._tables`); this module
holds the form and the small constant arrays the kernels read: per pair, each level's step and
the scale, and the position stream it follows. Shapes, dtypes and devices only: it runs under
tracing.
"""

from __future__ import annotations

from typing import Any

from ._angles import level_steps, split_levels
from ._cache import table_cache, untracked
from ._context import CallContext
from ._memo import Memo

__all__ = ["LEVELS", "OFFSET", "POSITIONS", "STARTS", "TABLES", "KernelAngles", "device_steps"]

# How the kernels find a token's angle: ``start + s``, ``starts[b] + s``, ``positions[stream,
# b, s]``, or the caller's tables ``cos[b, s]``.
OFFSET, STARTS, POSITIONS, TABLES = 0, 1, 2, 3
LEVELS = split_levels(64)  # the kernels take 64-bit positions (their declarations need float64)


class KernelAngles:
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


def host_steps(per_pair: tuple[float, ...], scale: float) -> tuple[tuple[float, ...], ...]:
    """Each level's step angle per pair, exactly reduced, then the scale per pair."""
    return (*level_steps(per_pair, LEVELS), (scale,) * len(per_pair))


_host_steps: Memo[tuple[tuple[float, ...], ...]] = Memo(64)


def device_steps(
    ctx: CallContext, per_pair: tuple[float, ...], scale: float, streams: tuple[int, ...] | None
) -> tuple[Any, Any]:
    """The steps (and the streams) on the device: made there once and kept (a copy per call
    could not be replayed by a CUDA graph); made afresh while traced, where nothing is kept."""
    xp, device = ctx.xp, ctx.device

    def build() -> tuple[Any, Any]:
        rows = _host_steps.get((per_pair, scale), lambda: host_steps(per_pair, scale), traced=ctx.traced)
        steps = xp.asarray(rows, dtype=xp.float64, device=device)
        return steps, None if streams is None else xp.asarray(streams, dtype=xp.int32, device=device)

    if ctx.traced:
        return build()
    key = ("fused-steps", per_pair, scale, streams, ctx.env)
    with untracked(xp):  # kept for later calls: not inference tensors, which autograd cannot save
        return table_cache.constant(xp, key, build, nbytes=8 * (LEVELS + 2) * len(per_pair), traced=False)
