"""The fused prologue's numba kernel: each head of q and k normalised, rotated, and k and v
written into the KV cache, in one parallel pass; imported only once numba is known installed.

Arrays arrive as the rotation kernels take them (see :mod:`._jit`): q, k and v five-axis
``(batch, lead, seq, trail, head_dim)`` (a head is ``lead * trail + t``), the table of cos and
sin side by side with (1 or batch, seq) rows into it. The norm's weights come as ``(1 or heads,
head_dim)`` in x's storage; the caches as ``(outer, rows, heads, dim)`` views (a batch row and its
row, or a page and its offset), with each token's (outer, row) given, outer -1 for "skip".

Every step is the generic composition's own arithmetic, in its order: the sum of squares in
NumPy's pairwise order (``np.mean``'s, so NumPy results are the same bit for bit), the mean,
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

from .._fusion import BEFORE_WEIGHT, NO_NORM
from ._jit import HALF, INTERLEAVED, _where, inline, load, store

__all__ = ["prologues"]

_BLOCK = 128  # NumPy's pairwise summation sums blocks of up to this many elements with 8 accumulators

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
    """NumPy's sum of up to 128 squares: eight accumulators, then a tree, then the rest (a plain
    call: inlined at each leaf, it made the kernel too large for numba to compile)."""
    if n < 8:
        res = narrow(0.0, _square(row, 0, storage))
        for i in range(n):
            res += _square(row, base + i, storage)
        return res
    r0, r1 = _square(row, base, storage), _square(row, base + 1, storage)
    r2, r3 = _square(row, base + 2, storage), _square(row, base + 3, storage)
    r4, r5 = _square(row, base + 4, storage), _square(row, base + 5, storage)
    r6, r7 = _square(row, base + 6, storage), _square(row, base + 7, storage)
    i, whole = 8, n - n % 8
    while i < whole:
        r0 += _square(row, base + i, storage)
        r1 += _square(row, base + i + 1, storage)
        r2 += _square(row, base + i + 2, storage)
        r3 += _square(row, base + i + 3, storage)
        r4 += _square(row, base + i + 4, storage)
        r5 += _square(row, base + i + 5, storage)
        r6 += _square(row, base + i + 6, storage)
        r7 += _square(row, base + i + 7, storage)
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += _square(row, base + i, storage)
        i += 1
    return res


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
    whole = vectors - vectors % 4
    total = narrow(0.0, _square(row, 0, storage))
    for j in range(vectors * lanes, n):
        total += _square(row, j, storage)
    for lane in range(lanes):
        a0 = a1 = a2 = a3 = narrow(0.0, total)
        for m in range(0, whole, 4):
            a0 += _square(row, m * lanes + lane, storage)
            a1 += _square(row, (m + 1) * lanes + lane, storage)
            a2 += _square(row, (m + 2) * lanes + lane, storage)
            a3 += _square(row, (m + 3) * lanes + lane, storage)
        for m in range(whole, vectors):
            a0 += _square(row, m * lanes + lane, storage)
        total += ((a0 + a1) + a2) + a3
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
    """One feature normalised as the generic QKNorm computes it, rounded to x's dtype and widened
    again, as the rotation then reads it."""
    x = _load(value, storage)
    if rounding == NO_NORM:
        return x
    h = x * r
    if rounding == BEFORE_WEIGHT:  # (weight + offset) in its dtype, times h rounded to x's
        scale = _load(weight, storage)
        if offset != 0:
            scale = _load(_store(scale + narrow(offset, x), storage), storage)
        return _load(_store(scale * _load(_store(h, storage), storage), storage), storage)
    return _load(_store(h * (narrow(offset, x) + _load(weight, storage)), storage), storage)


@_helper
def _rotate_row(
    x: Any, out: Any, w: Any, b: Any, a: Any, s: Any, p: Any, table: Any, sign: Any,
    eps: Any, count: Any, at: Any, lanes: Any, wide_mean: bool, offset: Any, storage: int, layout: int,
    rounding: int,
) -> None:  # pragma: no cover  # fmt: skip
    trail, width, pairs = x.shape[3], x.shape[4], table.shape[1] // 2
    per_head = w.shape[0] > 1
    for t in range(trail):
        row, dest = x[b, a, s, t], out[b, a, s, t]
        weights = w[a * trail + t if per_head else 0]
        r = narrow(1.0, table[p, 0])
        if rounding != NO_NORM:
            r = _inverse_rms(row, at, lanes, eps, count, wide_mean, storage)
        for i in range(pairs):
            c = table[p, 2 * i]
            n = table[p, 2 * i + 1] * sign
            j, k = (i, i + pairs) if layout == HALF else (2 * i, 2 * i + 1)
            first = _normed(row[j], r, weights[j], offset, storage, rounding)
            second = _normed(row[k], r, weights[k], offset, storage, rounding)
            dest[j] = _store(first * c - second * n, storage)
            dest[k] = _store(second * c + first * n, storage)
        for j in range(2 * pairs, width):
            dest[j] = _store(_normed(row[j], r, weights[j], offset, storage, rounding), storage)


def prologues(storage: int, rounding: int) -> dict[str, Callable[..., None]]:
    """The two layouts' fused kernels for one storage code and norm rounding (compiled, or loaded
    from numba's cache, on first call): ``kernel(x, out, wx, y, out_y, wy, v, cache_k, cache_v,
    outer, rows, table, positions, sign, eps, count, leaves, lanes, wide_mean, offset)``;
    ``lanes`` 0 sums squares in NumPy's order (``leaves``), else in torch's (:func:`_lane_sums`)."""
    return {
        name: numba.njit(parallel=True, cache=True, nogil=True)(_prologue(storage, layout, rounding, name))
        for name, layout in (("half", HALF), ("interleaved", INTERLEAVED))
    }


def _prologue(storage: int, layout: int, rounding: int, name: str) -> Callable[..., None]:
    def prologue(
        x: Any, out: Any, wx: Any, y: Any, out_y: Any, wy: Any, v: Any, cache_k: Any, cache_v: Any,
        outer: Any, rows: Any, table: Any, pos: Any, sign: Any, eps: float, count: float,
        at: Any, lanes: int, wide_mean: bool, offset: float,
    ) -> None:  # pragma: no cover  # fmt: skip
        per_batch = pos.shape[0] > 1
        lead, seq, lead_y, trail_y = x.shape[1], x.shape[2], y.shape[1], y.shape[3]
        many = x.shape[0] * lead * seq
        cached = cache_k.shape[0] > 0
        for item in numba.prange(many + y.shape[0] * lead_y * seq):
            if item < many:
                b, a, s = _where(item, lead, seq)
                p = pos[b if per_batch else 0, s]
                _rotate_row(x, out, wx, b, a, s, p, table, sign, eps, count, at, lanes, wide_mean, offset,
                            storage, layout, rounding)  # fmt: skip
                continue
            b, a, s = _where(item - many, lead_y, seq)
            p = pos[b if per_batch else 0, s]
            _rotate_row(y, out_y, wy, b, a, s, p, table, sign, eps, count, at, lanes, wide_mean, offset,
                        storage, layout, rounding)  # fmt: skip
            place = outer[b, s]
            if cached and place >= 0:
                row = rows[b, s]
                for t in range(trail_y):
                    head = a * trail_y + t
                    for j in range(out_y.shape[4]):
                        cache_k[place, row, head, j] = out_y[b, a, s, t, j]
                    for j in range(v.shape[4]):
                        cache_v[place, row, head, j] = v[b, a, s, t, j]

    prologue.__name__ = prologue.__qualname__ = f"prologue_{name}_{rounding}"
    return prologue
