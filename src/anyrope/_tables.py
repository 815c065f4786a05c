"""cos/sin tables: angles formed in float64, a float32-exact fallback, and a bounded cache.

An angle m * theta at m = 1,000,000 loses about 0.03 rad when formed in float32, which is why
these tables are built in float64 wherever the device supports it and only the final cos and
sin are cast. Devices without float64 use angle addition over float64 host tables instead.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import array_api_compat

from ._compat import float64_scope, library_name

__all__ = ["TableCache", "cos_sin", "default_inv_freq", "table_cache"]


def default_inv_freq(rotary_dim: int, base: float) -> tuple[float, ...]:
    """theta_i = base ** (-2i / rotary_dim), i = 0 .. rotary_dim/2 - 1, as Python floats."""
    return tuple(base ** (-(2 * i) / rotary_dim) for i in range(rotary_dim // 2))


def _table_scope(xp: Any) -> contextlib.AbstractContextManager[Any]:
    # Tables built under torch.inference_mode would be unusable by later autograd calls.
    if array_api_compat.is_torch_namespace(xp):
        import torch  # already imported: the array came from it

        return cast("contextlib.AbstractContextManager[Any]", torch.inference_mode(False))
    return contextlib.nullcontext()


def cos_sin(
    xp: Any,
    positions: Any,
    inv_freq: Sequence[float],
    *,
    dtype: Any,
    device: Any,
    scale: float = 1.0,
) -> tuple[Any, Any]:
    """``scale * cos(p * theta)`` and ``scale * sin(p * theta)``, shape ``positions.shape + (len(inv_freq),)``."""
    with _table_scope(xp):
        scope = float64_scope(xp, device)
        build = _cos_sin_float64
        if scope is None:
            scope, build = contextlib.nullcontext(), _cos_sin_by_angle_addition
        with scope:
            cos, sin = build(xp, positions, inv_freq, device=device)
            if scale != 1.0:
                cos, sin = cos * scale, sin * scale
            return xp.astype(cos, dtype), xp.astype(sin, dtype)


def _cos_sin_float64(xp: Any, positions: Any, inv_freq: Sequence[float], *, device: Any) -> tuple[Any, Any]:
    freqs = xp.asarray(inv_freq, dtype=xp.float64, device=device)
    angles = xp.astype(positions, xp.float64)[..., None] * freqs
    return xp.cos(angles), xp.sin(angles)


def _cos_sin_by_angle_addition(
    xp: Any, positions: Any, inv_freq: Sequence[float], *, device: Any
) -> tuple[Any, Any]:
    """float32 tables accurate to a few ulp without float64 on the device.

    p = hi * B + lo with B about sqrt(max p); the angles hi * B * theta and lo * theta are
    reduced and evaluated in Python's float64 on the host, then combined with
    cos(a + b) = cos a cos b - sin a sin b in float32 on the device.
    """
    count = math.prod(positions.shape)
    largest = int(xp.max(positions)) if count else 0
    block = max(1, math.isqrt(largest) + 1)
    n_hi = largest // block + 1

    def host_table(step: int, rows: int) -> tuple[Any, Any]:
        angles = [[math.fmod(r * step * f, 2 * math.pi) for f in inv_freq] for r in range(rows)]
        cos = xp.asarray([[math.cos(a) for a in row] for row in angles], dtype=xp.float32, device=device)
        sin = xp.asarray([[math.sin(a) for a in row] for row in angles], dtype=xp.float32, device=device)
        return cos, sin

    cos_hi, sin_hi = host_table(block, n_hi)
    cos_lo, sin_lo = host_table(1, block)
    flat = xp.reshape(positions, (count,))
    hi, lo = flat // block, flat % block
    c_hi, s_hi = xp.take(cos_hi, hi, axis=0), xp.take(sin_hi, hi, axis=0)
    c_lo, s_lo = xp.take(cos_lo, lo, axis=0), xp.take(sin_lo, lo, axis=0)
    shape = (*positions.shape, len(inv_freq))
    cos = xp.reshape(c_hi * c_lo - s_hi * s_lo, shape)
    sin = xp.reshape(s_hi * c_lo + c_hi * s_lo, shape)
    return cos, sin


@dataclass
class _Entry:
    cos: Any
    sin: Any
    length: int
    nbytes: int


class TableCache:
    """A least-recently-used store of position tables, bounded in bytes and safe under threads.

    Keys name the frequencies, the array library, the device and the dtype. A table covers
    positions ``0 .. length - 1`` and grows by doubling, so decoding token by token rebuilds it
    only a logarithmic number of times. A table that would take more than half the bound is
    not kept: the caller builds just the rows it needs.
    """

    def __init__(self, limit_bytes: int = 256 * 2**20, min_length: int = 256) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._nbytes = 0
        self.limit_bytes = limit_bytes
        self.min_length = min_length

    def info(self) -> dict[str, int]:
        """Number of tables and bytes held, and the bound."""
        with self._lock:
            return {"tables": len(self._entries), "nbytes": self._nbytes, "limit_bytes": self.limit_bytes}

    def clear(self) -> None:
        """Drop every table."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def set_limit(self, limit_bytes: int) -> None:
        """Change the bound; tables beyond it are dropped, oldest first."""
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"limit_bytes={limit_bytes!r} must be a non-negative int")
        with self._lock:
            self.limit_bytes = limit_bytes
            self._evict()

    def _evict(self) -> None:
        while self._nbytes > self.limit_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self._nbytes -= old.nbytes

    def prefix(
        self,
        key: Hashable,
        length: int,
        build: Callable[[int], tuple[Any, Any]],
        *,
        row_bytes: int,
        hint: int = 0,
    ) -> tuple[Any, Any] | None:
        """Tables covering positions ``0 .. length - 1`` (possibly longer), built by ``build(n)``.

        None when even ``length`` rows would exceed the bound: the caller builds what it needs.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.length >= length:
                self._entries.move_to_end(key)
                return entry.cos, entry.sin
            previous = entry.length if entry is not None else 0
        size = max(length, hint, self.min_length, 2 * previous)
        size = 1 << (size - 1).bit_length()
        share = self.limit_bytes // 2  # so one table cannot evict all the others
        if size * row_bytes > share:
            size = length
            if size * row_bytes > share:
                return None
        cos, sin = build(size)
        with self._lock:
            current = self._entries.pop(key, None)
            if current is not None:
                self._nbytes -= current.nbytes
                if current.length >= size:  # another thread got there first
                    cos, sin, size = current.cos, current.sin, current.length
            self._entries[key] = _Entry(cos, sin, size, size * row_bytes)
            self._nbytes += size * row_bytes
            self._evict()
        return cos, sin


#: The process-wide table cache used by :class:`anyrope.RoPE`.
table_cache = TableCache()


def cache_key(xp: Any, device: Any, dtype: Any, frequencies: Hashable) -> Hashable:
    """Which table: frequencies, library, device, dtype (as themselves where hashable: str() of
    each would cost more than the rest of a decode step's lookup)."""
    return (frequencies, library_name(xp), _hashable(device), _hashable(dtype))


def _hashable(value: Any) -> Hashable:
    try:
        hash(value)
    except TypeError:
        return str(value)
    return value  # type: ignore[no-any-return]
