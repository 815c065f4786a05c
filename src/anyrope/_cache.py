"""The process-wide cache of tables on each device, bounded in bytes and safe under threads.

Two kinds of entry: prefix tables (cos and sin of positions ``0 .. n - 1``, the fast route for
positions known on the host) and constant tables (the digit tables of :mod:`._angles`). Nothing
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
from ._compat import is_library, materialize

__all__ = ["TableCache", "table_cache"]


@dataclass
class _Entry:
    tables: tuple[Any, Any]
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
        """Prefix tables and digit tables held, their bytes, and the bound."""
        with self._lock:
            digits = [entry.nbytes for entry in self._entries.values() if entry.length == 0]
            return {
                "tables": len(self._entries) - len(digits),
                "digit_tables": len(digits),
                "nbytes": self._nbytes,
                "digit_nbytes": sum(digits),
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

    def _store(self, key: Hashable, tables: tuple[Any, Any], length: int, nbytes: int) -> tuple[Any, Any]:
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
        build: Callable[[int], tuple[Any, Any]],
        *,
        row_bytes: int,
        hint: int = 0,
    ) -> tuple[Any, Any] | None:
        """Tables covering positions ``0 .. length - 1`` (possibly longer), built by ``build(n)``.

        None when even ``length`` rows would exceed half the bound: the caller builds what it needs.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.length >= length:
                self._entries.move_to_end(key)
                return entry.tables
            previous = entry.length if entry is not None else 0
        size = max(length, hint, self.min_length, 2 * previous)
        size = 1 << (size - 1).bit_length()
        share = self.limit_bytes // 2  # so one table cannot evict all the others
        if size * row_bytes > share:
            size = length
            if size * row_bytes > share:
                return None
        return self._store(key, build(size), size, size * row_bytes)

    def constant(self, key: Hashable) -> tuple[Any, Any] | None:
        """A table stored by :meth:`keep_constant`, or None.

        A plain dict read (no lock): it is also called while dynamo traces, which cannot take locks.
        """
        entry = self._entries.get(key)
        return None if entry is None else entry.tables

    def keep_constant(self, xp: Any, key: Hashable, tables: tuple[Any, Any], nbytes: int) -> tuple[Any, Any]:
        """Keep ``tables`` (finished first: they are shared between threads) and return them."""
        materialize(xp, *tables)
        if nbytes > self.limit_bytes // 2:
            return tables
        return self._store(key, tables, 0, nbytes)


#: The process-wide table cache used by :class:`anyrope.RoPE`.
table_cache = TableCache()


def untracked(xp: Any) -> contextlib.AbstractContextManager[Any]:
    """Where cached tables are built: outside ``torch.inference_mode``, whose tensors later
    autograd calls could not use."""
    if is_library(xp, "torch"):
        import torch  # already imported: the array came from it

        return cast("contextlib.AbstractContextManager[Any]", torch.inference_mode(False))
    return contextlib.nullcontext()
