"""The fused prologue's numba kernel: each head of q and k normalised and rotated in one parallel
pass over their rows, then k and v written into the KV cache in a second one (k's rows, then
v's); imported only once numba is known installed.

Arrays arrive as the rotation kernels take them (see :mod:`._jit`): q, k and v five-axis
``(batch, lead, seq, trail, head_dim)`` (a head is ``lead * trail + t``), the table of cos and
sin side by side with (1 or batch, seq) rows into it. The norm's weights come as ``(1 or heads,
head_dim)`` in x's storage; the caches as ``(outer, rows, heads, dim)`` views (a batch row and its
row, or a page and its offset), with each token's place given as ``(1 or batch, seq)``: its row,
or in a paged cache (``page`` its page size, else 0) its flat slot; negative: not written.

Every step is the generic composition's own arithmetic, in its order: the sum of squares in
NumPy's pairwise order (``np.mean``'s, so NumPy results are the same bit for bit) or torch's
(its vector lanes), summed in SIMD vectors (:mod:`._jit_sums`), the mean,
``1 / sqrt`` of it plus eps, the weight where the family rounds, each value rounded to x's dtype
where the generic code rounds it, then the rotation of :func:`._jit._turn`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from .._fusion import BEFORE_WEIGHT
from ._jit import FLOAT16_BITS, HALF, INTERLEAVED, _turn, _where, inline, load, store
from ._jit_sums import vertical_sums

__all__ = ["prologues"]

_BLOCK = 128  # NumPy's pairwise summation sums blocks of up to this many elements with 8 accumulators

# The vertical sums of NumPy's blocks (eight accumulators: one vector of eight lanes), and of
# torch's reduction on CPUs whose vectors hold 4, 8 or 16 floats (four vectors at a time).
_NUMPY_LANES = vertical_sums(8, 1)
_TORCH_4, _TORCH_8, _TORCH_16 = (vertical_sums(lanes, 4) for lanes in (4, 8, 16))

# Plain calls, not numba's inlining: that retypes the whole body at each site, and with the
# storage conversions inlined at every load and store one kernel took 40-100 s to compile (about
# 4 s as calls). LLVM inlines them where it pays and folds the constant storage and rounding there.
_helper = numba.njit(cache=True, nogil=True)


def narrow(value: Any, like: Any) -> Any:  # noqa: ARG001  # pragma: no cover - numba's overload replaces it
    """``value`` in ``like``'s float type."""
    return value


@overload(narrow)
def _narrow(value, like):  # type: ignore[no-untyped-def]  # noqa: ARG001 - numba's names

    if like == types.float32:
        return lambda value, like: np.float32(value)  # noqa: ARG005
    return lambda value, like: np.float64(value)  # noqa: ARG005


@_helper
def _load(value: Any, storage: int) -> Any:  # pragma: no cover - typed once, not at each site
    return load(value, storage)


@_helper
def _store(value: Any, storage: int) -> Any:  # pragma: no cover
    return store(value, storage)


@inline
def _square(row: Any, j: Any, storage: int) -> Any:  # pragma: no cover
    value = _load(row[j], storage)
    return value * value


@inline
def _block(row: Any, base: Any, n: Any, storage: int) -> Any:  # pragma: no cover
    """NumPy's sum of up to 128 squares: eight accumulators (one vector of eight lanes), then a
    tree, then the rest."""
    if n < 8:
        res = narrow(0.0, _square(row, 0, storage))
        for i in range(n):
            res += _square(row, base + i, storage)
        return res
    whole = n - n % 8
    if storage == FLOAT16_BITS:
        res = _tree(_scalar_lanes(row, base, whole // 8, 8, 1, storage))
    else:
        res = _tree(_NUMPY_LANES(row, base, whole // 8, storage))
    for i in range(whole, n):
        res += _square(row, base + i, storage)
    return res


@inline
def _tree(r: Any) -> Any:  # pragma: no cover
    return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))


def leaves(n: int) -> list[tuple[int, int]]:
    """NumPy's pairwise summation of n values as the eight leaves of a tree three levels deep,
    each (start, length): a node NumPy does not split keeps its sum in its leftmost leaf, and the
    leaves under it are empty (sums of squares are never -0.0, so adding their +0.0 is exact)."""

    def split(start: int, length: int, depth: int) -> list[tuple[int, int]]:
        if depth == 0 or length <= _BLOCK:
            return [(start, length)] + [(start, 0)] * (2**depth - 1)
        first = length // 2 - (length // 2) % 8
        return split(start, first, depth - 1) + split(start + first, length - first, depth - 1)

    if n > LONGEST:
        raise ValueError(f"NumPy's summation of {n} values needs more than three levels")
    return split(0, n, 3)


@inline
def _sum_squares(row: Any, at: Any, storage: int) -> Any:  # pragma: no cover
    """The sum of a row's squares over the eight leaves ``at`` (see :func:`leaves`), combined
    as NumPy's tree combines them: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))."""
    pair = half = low = total = narrow(0.0, _square(row, 0, storage))
    for leaf in range(8):
        found = _block(row, at[leaf, 0], at[leaf, 1], storage)
        if leaf % 2 == 0:
            pair = found
            continue
        if leaf % 4 == 1:
            half = pair + found
            continue
        low = half + (pair + found)
        if leaf == 3:
            total = low
    return total + low


LONGEST = 8 * _BLOCK


@inline
def _lane_sums(row: Any, lanes: Any, storage: int) -> Any:  # pragma: no cover
    """The sum of a row's squares in torch's order on a CPU whose vectors hold ``lanes`` floats
    (its ``vectorized_inner_sum``): each lane sums its vectors four rows at a time (one
    accumulator per row, then the rows' leftovers into the first, then the four together), the
    elements past the last whole vector first, then each lane's sum in lane order. Written for
    up to 16 rows of four vectors, where torch's cascade adds no level."""
    n = row.shape[0]
    vectors = n // lanes
    total = narrow(0.0, _square(row, 0, storage))
    for j in range(vectors * lanes, n):
        total += _square(row, j, storage)
    if storage == FLOAT16_BITS:
        for value in _scalar_lanes(row, 0, vectors, lanes, 4, storage):
            total += value
    elif lanes == 4:
        for value in _TORCH_4(row, 0, vectors, storage):
            total += value
    elif lanes == 8:
        for value in _TORCH_8(row, 0, vectors, storage):
            total += value
    else:
        for value in _TORCH_16(row, 0, vectors, storage):
            total += value
    return total


@inline
def _scalar_lanes(
    row: Any, base: Any, vectors: Any, lanes: Any, accumulators: Any, storage: int
) -> Any:  # pragma: no cover
    """What :func:`._jit_sums.vertical_sums` computes, one element at a time: for float16 kept
    as bits (no vector conversion for them), and what the tests hold the vectors to."""
    sums = np.zeros((accumulators, lanes), dtype=np.float32)
    whole = vectors - vectors % accumulators
    for m in range(vectors):
        for lane in range(lanes):
            sums[m % accumulators if m < whole else 0, lane] += _square(row, base + m * lanes + lane, storage)
    total = sums[0]
    for r in range(1, accumulators):
        total = total + sums[r]
    return total


@_helper
def inverse_rms(
    rows: Any, at: Any, lanes: Any, eps: Any, wide_mean: bool, storage: int
) -> Any:  # pragma: no cover
    """``1 / sqrt(mean(x * x) + eps)`` of each row as the kernel computes it: for a probe held
    against the library's own norm before a fusion is trusted with it."""
    out = np.empty(rows.shape[0], dtype=np.float64)
    for i in range(rows.shape[0]):
        out[i] = _inverse_rms(rows[i], at, lanes, eps, float(rows.shape[1]), wide_mean, storage)
    return out


@inline
def _inverse_rms(
    row: Any, at: Any, lanes: Any, eps: Any, count: Any, wide_mean: bool, storage: int
) -> Any:  # pragma: no cover
    total = _sum_squares(row, at, storage) if lanes == 0 else _lane_sums(row, lanes, storage)
    # np.mean divides by a NumPy integer: in float64, then rounded (torch divides in x's type)
    mean = narrow(np.float64(total) / count, total) if wide_mean else total / narrow(count, total)
    return narrow(1.0, mean) / np.sqrt(mean + narrow(eps, mean))


@inline
def _normed(
    value: Any, r: Any, weight: Any, offset: Any, storage: int, rounding: int
) -> Any:  # pragma: no cover
    """One feature normalised as the generic QKNorm computes it, before it is rounded to x's dtype."""
    x = _load(value, storage)
    h = x * r
    if rounding == BEFORE_WEIGHT:  # (weight + offset) in its dtype, times h rounded to x's
        scale = _load(weight, storage)
        if offset != 0:
            scale = _load(_store(scale + narrow(offset, x), storage), storage)
        return scale * _load(_store(h, storage), storage)
    return h * (narrow(offset, x) + _load(weight, storage))


@inline
def _normalise(
    x: Any, out: Any, w: Any, b: Any, a: Any, s: Any, eps: Any, count: Any, at: Any, lanes: Any,
    wide_mean: bool, offset: Any, storage: int, rounding: int,
) -> None:  # pragma: no cover  # fmt: skip
    """Each head of x's row (b, a, s) normalised into out, as x's dtype holds it: then turned
    there by the rotation kernel's own loop (two plain loops LLVM vectorises, where one doing both
    per pair stayed scalar)."""
    trail, width = x.shape[3], x.shape[4]
    per_head = w.shape[0] > 1
    for t in range(trail):
        row, dest = x[b, a, s, t], out[b, a, s, t]
        weights = w[a * trail + t if per_head else 0]
        r = _inverse_rms(row, at, lanes, eps, count, wide_mean, storage)
        for j in range(width):
            dest[j] = _store(_normed(row[j], r, weights[j], offset, storage, rounding), storage)


@inline
def _copy(source: Any, dest: Any) -> None:  # pragma: no cover
    """One row into another (a cache's row: a view with strides of its own)."""
    for j in range(source.shape[0]):
        dest[j] = source[j]


def prologues(storage: int, rounding: int) -> dict[str, Callable[..., None]]:
    """The two layouts' fused kernels for one storage code and norm rounding (compiled, or loaded
    from numba's cache, on first call): ``kernel(x, out, wx, y, out_y, wy, v, cache_k, cache_v,
    places, page, table, positions, sign, eps, count, leaves, lanes, wide_mean, offset)``;
    ``lanes`` 0 sums squares in NumPy's order (``leaves``), else in torch's (:func:`_lane_sums`)."""
    return {
        name: numba.njit(parallel=True, cache=True, nogil=True)(_prologue(storage, layout, rounding, name))
        for name, layout in (("half", HALF), ("interleaved", INTERLEAVED))
    }


def _prologue(storage: int, layout: int, rounding: int, name: str) -> Callable[..., None]:
    def prologue(
        x: Any, out: Any, wx: Any, y: Any, out_y: Any, wy: Any, v: Any, cache_k: Any, cache_v: Any,
        places: Any, page: int, table: Any, pos: Any, sign: Any, eps: float, count: float,
        at: Any, lanes: int, wide_mean: bool, offset: float,
    ) -> None:  # pragma: no cover  # fmt: skip
        per_batch = pos.shape[0] > 1
        lead, seq, lead_y, trail_y = x.shape[1], x.shape[2], y.shape[1], y.shape[3]
        many, many_y, pairs = x.shape[0] * lead * seq, y.shape[0] * lead_y * seq, table.shape[1] // 2
        cached = cache_k.shape[0] > 0
        for item in numba.prange(many + many_y):
            # q's rows, then k's, through one call site (one for each doubled the compile time)
            is_q = item < many
            source, dest, weights = (x, out, wx) if is_q else (y, out_y, wy)
            b, a, s = _where(item - (0 if is_q else many), lead if is_q else lead_y, seq)
            p = pos[b if per_batch else 0, s]
            _normalise(source, dest, weights, b, a, s, eps, count, at, lanes, wide_mean, offset, storage,
                       rounding)  # fmt: skip
            _turn(dest, dest, False, table, sign, b, a, s, p, pairs, storage, layout)
        if not cached:
            return
        # k's rows into the cache, then v's: a cache's rows of one place in every head are apart by
        # a power of two, and writing each k row beside its v row took twice as long
        for item in numba.prange(2 * many_y):
            is_v = item >= many_y
            b, a, s = _where(item - (many_y if is_v else 0), lead_y, seq)
            place = places[b if places.shape[0] > 1 else 0, s]
            if place < 0:
                continue
            # a paged cache's flat slot is (page, offset in it); a contiguous one's row is in b's
            outer, row = (place // page, place % page) if page else (b, place)
            values, into = (v, cache_v) if is_v else (out_y, cache_k)
            for t in range(trail_y):
                _copy(values[b, a, s, t], into[outer, row, a * trail_y + t])

    prologue.__name__ = prologue.__qualname__ = f"prologue_{name}_{rounding}"
    return prologue
