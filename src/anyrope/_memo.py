"""The one memo: a bounded map from a hashable key to what a pure function of it returned.

Every process-wide memo of a call's decisions (environments, call plans, kernel choices, the
frequencies of a sequence length, exact angle steps) is one of these, so two rules hold for all
of them: a key holds everything the memoised checks read, so no call skips a check it would
fail; and nothing is read or kept while a call is traced, since a compiler would guard its graph
on the memo's contents and recompile when a later entry, for another library or dtype, arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Memo"]

V = TypeVar("V")


class Memo(Generic[V]):
    """At most ``limit`` entries; a full memo starts afresh (callers meet few distinct keys, so a
    least-recently-used order would cost more than it saves). Safe under threads: a lost race
    builds a value twice and every caller gets the first one kept."""

    __slots__ = ("_values", "find", "limit")

    def __init__(self, limit: int = 256) -> None:
        self._values: dict[Any, V] = {}
        self.limit = limit
        #: ``find(key)``: the value kept for ``key``, or None. The dict's own ``get`` (the dict is
        #: only ever cleared, never replaced): a lookup on the decode path costs no Python call.
        self.find: Callable[[Any], V | None] = self._values.get

    def keep(self, key: Any, value: V) -> V:
        """Keep ``value`` for ``key`` and return it."""
        if len(self._values) >= self.limit:
            self._values.clear()
        return self._values.setdefault(key, value)  # a lost race returns the winner's value

    def get(self, key: Any, build: Callable[[], V], *, traced: bool = False) -> V:
        """The value for ``key``, built (and kept) if missing; built afresh, never kept, while traced."""
        if traced:
            return build()
        found = self.find(key)
        return self.keep(key, build()) if found is None else found

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)
