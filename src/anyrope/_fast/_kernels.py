"""Fused CPU kernels compiled by numba (an optional dependency): one pass over x, in parallel.

Arrays arrive in a canonical five-axis form: x and out are (batch, lead, seq, trail, head_dim)
and the tables (table_batch, seq, pairs), where table_batch is 1 or batch. Each pair is read
before it is written, so out may be x itself. The two layouts are written out separately, with
plain five-axis indexing: variants that shared a row helper, or chose between two arrays in the
loop, kept LLVM from vectorising the inner loop and ran 1.5 to 2 times slower.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["available", "kernel"]

_lock = threading.Lock()
_compiled: dict[str, Callable[..., None]] = {}


@functools.cache
def available() -> bool:
    """Whether numba can be imported (without importing it); asked once per process."""
    return importlib.util.find_spec("numba") is not None


def _build() -> dict[str, Callable[..., None]]:
    import numba

    @numba.njit(parallel=True, cache=True, nogil=True)
    def half(x: Any, cos: Any, sin: Any, out: Any, sign: float, copy_tail: bool) -> None:  # pragma: no cover
        batch, lead, seq, trail, width = x.shape
        pairs = cos.shape[2]
        per_batch = cos.shape[0] > 1
        for row in numba.prange(batch * lead * seq):
            b = row // (lead * seq)
            a = (row // seq) % lead
            s = row % seq
            tb = b if per_batch else 0
            for t in range(trail):
                for i in range(pairs):
                    c = cos[tb, s, i]
                    n = sign * sin[tb, s, i]
                    first = x[b, a, s, t, i]
                    second = x[b, a, s, t, i + pairs]
                    out[b, a, s, t, i] = first * c - second * n
                    out[b, a, s, t, i + pairs] = second * c + first * n
                if copy_tail:
                    for j in range(2 * pairs, width):
                        out[b, a, s, t, j] = x[b, a, s, t, j]

    @numba.njit(parallel=True, cache=True, nogil=True)
    def interleaved(
        x: Any, cos: Any, sin: Any, out: Any, sign: float, copy_tail: bool
    ) -> None:  # pragma: no cover
        batch, lead, seq, trail, width = x.shape
        pairs = cos.shape[2]
        per_batch = cos.shape[0] > 1
        for row in numba.prange(batch * lead * seq):
            b = row // (lead * seq)
            a = (row // seq) % lead
            s = row % seq
            tb = b if per_batch else 0
            for t in range(trail):
                for i in range(pairs):
                    c = cos[tb, s, i]
                    n = sign * sin[tb, s, i]
                    first = x[b, a, s, t, 2 * i]
                    second = x[b, a, s, t, 2 * i + 1]
                    out[b, a, s, t, 2 * i] = first * c - second * n
                    out[b, a, s, t, 2 * i + 1] = second * c + first * n
                if copy_tail:
                    for j in range(2 * pairs, width):
                        out[b, a, s, t, j] = x[b, a, s, t, j]

    # The same rotations reading the cached tables directly at each token's position: no
    # per-call tables are gathered, which is most of the cost of a decode step.
    @numba.njit(parallel=True, cache=True, nogil=True)
    def half_at(x: Any, cos: Any, sin: Any, pos: Any, out: Any, copy_tail: bool) -> None:  # pragma: no cover
        batch, lead, seq, trail, width = x.shape
        pairs = cos.shape[1]
        per_batch = pos.shape[0] > 1
        for row in numba.prange(batch * lead * seq):
            b = row // (lead * seq)
            a = (row // seq) % lead
            s = row % seq
            p = pos[b if per_batch else 0, s]
            for t in range(trail):
                for i in range(pairs):
                    c = cos[p, i]
                    n = sin[p, i]
                    first = x[b, a, s, t, i]
                    second = x[b, a, s, t, i + pairs]
                    out[b, a, s, t, i] = first * c - second * n
                    out[b, a, s, t, i + pairs] = second * c + first * n
                if copy_tail:
                    for j in range(2 * pairs, width):
                        out[b, a, s, t, j] = x[b, a, s, t, j]

    @numba.njit(parallel=True, cache=True, nogil=True)
    def interleaved_at(
        x: Any, cos: Any, sin: Any, pos: Any, out: Any, copy_tail: bool
    ) -> None:  # pragma: no cover
        batch, lead, seq, trail, width = x.shape
        pairs = cos.shape[1]
        per_batch = pos.shape[0] > 1
        for row in numba.prange(batch * lead * seq):
            b = row // (lead * seq)
            a = (row // seq) % lead
            s = row % seq
            p = pos[b if per_batch else 0, s]
            for t in range(trail):
                for i in range(pairs):
                    c = cos[p, i]
                    n = sin[p, i]
                    first = x[b, a, s, t, 2 * i]
                    second = x[b, a, s, t, 2 * i + 1]
                    out[b, a, s, t, 2 * i] = first * c - second * n
                    out[b, a, s, t, 2 * i + 1] = second * c + first * n
                if copy_tail:
                    for j in range(2 * pairs, width):
                        out[b, a, s, t, j] = x[b, a, s, t, j]

    return {"half": half, "interleaved": interleaved, "half_at": half_at, "interleaved_at": interleaved_at}


_serial: bool | None = None  # whether calls must be serialised (numba's workqueue layer)


def _probe(compiled: dict[str, Callable[..., None]]) -> bool:
    """Start numba's thread pool once, under the lock, and ask which threading layer it chose.

    The "workqueue" layer (numba's fallback without OpenMP or TBB) aborts the process when two
    threads launch parallel kernels at once, so calls are then taken one at a time.
    """
    import numba
    import numpy as np

    tiny = np.zeros((1, 1, 1, 1, 2), dtype=np.float32)
    table = np.zeros((1, 1, 1), dtype=np.float32)
    compiled["half"](tiny, table, table, tiny, 1.0, False)
    layer: Any = getattr(numba, "threading_layer")  # noqa: B009 - not in numba's typed exports
    return bool(layer() == "workqueue")


def kernel(layout: str) -> Callable[..., None]:
    """The compiled kernel for a layout, numba-compiled (or loaded from its cache) on first use.

    ``kernel(layout)(x, cos, sin, out, sign, copy_tail)`` takes (table_batch, seq, pairs)
    tables; ``kernel(layout + "_at")(x, cos, sin, positions, out, copy_tail)`` takes whole
    (length, pairs) tables and (1 or batch, seq) positions, and looks rows up itself.
    """
    global _serial
    if not _compiled:
        with _lock:
            if not _compiled:
                built = _build()
                _serial = _probe(built)
                _compiled.update(built if not _serial else {k: _serialised(f) for k, f in built.items()})
    return _compiled[layout]


def _serialised(fn: Callable[..., None]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        with _lock:
            fn(*args)

    return call
