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
from ._cache import table_cache
from ._compat import Environment, environment
from ._context import CallContext
from ._exact import turns
from ._frequencies import PairFrequencies
from ._memo import Memo
from ._rotary import Rotary

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
    """Each level's step angle per pair, exactly reduced, then the scale per pair, then the
    angle of ``2**64`` positions: what a position that wrapped past int64 as ``starts[b] + s``
    formed it gets back (as the core's, see anyrope._positions.ArrayOffset.wrapped)."""
    return (*level_steps(per_pair, LEVELS), (scale,) * len(per_pair), turns(1 << 64, per_pair))


_host_steps: Memo[tuple[tuple[float, ...], ...]] = Memo(64)


def device_steps(ctx: CallContext, rotary: Rotary, freqs: PairFrequencies, *, multi: bool) -> tuple[Any, Any]:
    """The steps (and, for several position streams, the stream of each pair) on the device:
    made there once and kept (a copy per call could not be replayed by a CUDA graph).

    Where the call's policy fetches kept constants (:attr:`anyrope._policy.Tracing.fetches`),
    fetched as plain Python from that same cache through the rotary's handle (see
    :mod:`._handle`): a tensor made inside the trace would be a constant that the compiled graph
    copies on every call (on a GPU a launch of its own beside the rotation's), while one that
    exists is an input read in place. Other tracers build them in the graph."""
    xp, device = ctx.xp, ctx.device
    which = rotary.spectrum.name_of(freqs) if ctx.tracing.fetches else None
    if which is not None:
        from ._torch_ops import as_traced  # imports torch: only dynamo fetches

        steps, streams = as_traced(*rotary.handle.fetch(_kept_steps, device, which, multi))
        return steps, streams
    return _device_steps(xp, ctx.env, rotary, freqs, multi, ctx.traced)


def _kept_steps(rotary: Rotary, device: Any, which: str, multi: bool) -> tuple[Any, Any]:
    """A traced call's steps, as an eager call keeps them (the same cache entry)."""
    from array_api_compat import torch as xp

    from ._torch_ops import real_tensors

    with real_tensors():
        return _device_steps(xp, environment(xp, device), rotary, rotary.spectrum.named(which), multi, False)


def _device_steps(
    xp: Any, env: Environment, rotary: Rotary, freqs: PairFrequencies, multi: bool, traced: bool
) -> tuple[Any, Any]:
    per_pair = tuple(freqs.inv_freq[j] for j in rotary.pair_frequencies)
    scale, device = freqs.scale, env.device
    streams = rotary.pair_streams if multi else None

    def build() -> tuple[Any, Any]:
        rows = _host_steps.get((per_pair, scale), lambda: host_steps(per_pair, scale), traced=traced)
        steps = xp.asarray(rows, dtype=xp.float64, device=device)
        return steps, None if streams is None else xp.asarray(streams, dtype=xp.int32, device=device)

    key = ("fused-steps", per_pair, scale, streams)
    return table_cache.constant(xp, env, key, build, nbytes=8 * (LEVELS + 2) * len(per_pair), traced=traced)
