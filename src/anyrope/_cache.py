"""The process-wide cache of tables on each device, bounded in bytes and safe under threads.

Two kinds of entry: prefix tables (cos and sin of positions ``0 .. n - 1``, the fast route for
positions known on the host) and constant tables (the digit tables and exact angle steps of
:mod:`._angles`). Nothing
built while tracing is kept: a traced value is not an array.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, cast

from ._args import check_int
from ._compat import Environment, is_library, materialize

__all__ = ["TableCache", "table_cache"]


@dataclass
class _Entry:
    tables: tuple[Any, ...]
    length: int
    nbytes: int


class TableCache:
    """A least-recently-used store of cos/sin tables, bounded in bytes and safe under threads.

    Keys name the frequencies, the array library, the device and the dtype. A prefix table
    covers positions ``0 .. length - 1`` and grows by doubling, so decoding token by token
    rebuilds it only a logarithmic number of times. A table that would take more than half the
    bound is not kept: the caller builds just the rows it needs.
    """

    def __init__(self, limit_bytes: int = 256 * 2**20, min_length: int = 256) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._nbytes = 0
        self.limit_bytes = limit_bytes
        self.min_length = min_length

    def info(self) -> dict[str, int]:
        """Prefix tables and constant tables (digit tables, exact angle steps) held, their bytes,
        and the bound."""
        with self._lock:
            constants = [entry.nbytes for entry in self._entries.values() if entry.length == 0]
            return {
                "tables": len(self._entries) - len(constants),
                "constant_tables": len(constants),
                "nbytes": self._nbytes,
                "constant_nbytes": sum(constants),
                "limit_bytes": self.limit_bytes,
            }

    def clear(self) -> None:
        """Drop every table."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def set_limit(self, limit_bytes: int) -> None:
        """Change the bound; tables beyond it are dropped, oldest first."""
        limit_bytes = check_int(limit_bytes, "limit_bytes", low=0)
        with self._lock:
            self.limit_bytes = limit_bytes
            self._evict()

    def _evict(self) -> None:
        while self._nbytes > self.limit_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self._nbytes -= old.nbytes

    def _store(self, key: Hashable, tables: tuple[Any, ...], length: int, nbytes: int) -> tuple[Any, ...]:
        with self._lock:
            current = self._entries.pop(key, None)
            if current is not None:
                self._nbytes -= current.nbytes
                if current.length >= length:  # another thread got there first
                    tables, length, nbytes = current.tables, current.length, current.nbytes
            self._entries[key] = _Entry(tables, length, nbytes)
            self._nbytes += nbytes
            self._evict()
        return tables

    def prefix(
        self,
        key: Hashable,
        length: int,
        build: Callable[[int], tuple[Any, ...]],
        *,
        row_bytes: int,
        hint: int = 0,
    ) -> tuple[Any, ...] | None:
        """Tables covering positions ``0 .. length - 1`` (possibly longer), built by ``build(n)``.

        None when even ``length`` rows would exceed half the bound: the caller builds what it needs.
        """
        found = self.covering(key, length)
        if found is not None:
            return found
        with self._lock:
            entry = self._entries.get(key)
            previous = entry.length if entry is not None else 0
        size = max(length, hint, self.min_length, 2 * previous)
        size = 1 << (size - 1).bit_length()
        share = self.limit_bytes // 2  # so one table cannot evict all the others
        if size * row_bytes > share:
            size = length
            if size * row_bytes > share:
                return None
        return self._store(key, build(size), size, size * row_bytes)

    def covering(self, key: Hashable, length: int) -> tuple[Any, ...] | None:
        """The prefix tables under ``key`` if they cover ``length`` positions (marked as just used), else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.length < length:
                return None
            self._entries.move_to_end(key)
            return entry.tables

    def constant(
        self,
        xp: Any,
        env: Environment,
        key: Hashable,
        build: Callable[[], tuple[Any, Any]],
        *,
        nbytes: int,
        traced: bool,
    ) -> tuple[Any, Any]:
        """A pair of constant device arrays (digit tables, exact angle steps) for ``env``'s device,
        built once by ``build()``. Made on the device once rather than copied there on every call:
        a copy per call would cost a host-to-device transfer, which a captured CUDA graph cannot
        replay. While ``traced``, built afresh and not kept: nothing traced may be kept."""
        if traced:
            return build()
        cache_key = (key, env)
        entry = self._entries.get(cache_key)  # a plain dict read: no lock needed
        if entry is not None:
            return entry.tables
        with untracked(xp):  # kept for later calls: not inference tensors, which autograd cannot save
            tables = build()
        materialize(xp, *tables)  # finished first: they are shared between threads
        if nbytes > self.limit_bytes // 2:
            return tables
        return self._store(cache_key, tables, 0, nbytes)


#: The process-wide table cache used by :class:`anyrope.RoPE`.
table_cache = TableCache()


def untracked(xp: Any) -> contextlib.AbstractContextManager[Any]:
    """Where cached tables are built: outside ``torch.inference_mode``, whose tensors later
    autograd calls could not use."""
    if is_library(xp, "torch"):
        import torch  # already imported: the array came from it

        return cast("contextlib.AbstractContextManager[Any]", torch.inference_mode(False))
    return contextlib.nullcontext()
