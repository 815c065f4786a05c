"""A handle through which code that a tracer runs as plain Python reaches an object.

dynamo folds a call of :meth:`Handle.fetch` into a constant (``torch.compiler.assume_constant_result``,
applied in :mod:`anyrope._torch_ops`): it runs the call as plain Python while it traces, and the
tensors returned enter the graph as inputs that each compiled call reads in place. The arguments
of such a call must be constants to every dynamo version, which an object is not (torch 2.11
cannot pass a frozen dataclass, and floats and ints read from objects may be symbolic); the
handle is passed as the method's ``self``, which dynamo leaves as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Handle"]

T = TypeVar("T")
R = TypeVar("R")


class Handle(Generic[T]):
    """Made with its owner (before any trace), kept with it (pickled and copied with it)."""

    __slots__ = ("owner",)

    def __init__(self, owner: T) -> None:
        self.owner = owner

    def fetch(self, make: Callable[..., R], *args: Any) -> R:
        """``make(owner, *args)``; ``make`` a module-level function, ``args`` constants."""
        return make(self.owner, *args)
