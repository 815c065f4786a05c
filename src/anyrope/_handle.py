"""A handle through which code that a tracer runs as plain Python reaches an object.

dynamo folds a call of :meth:`Handle.fetch` into a constant (``torch.compiler.assume_constant_result``,
applied in :mod:`anyrope._torch_ops`): it runs the call as plain Python while it traces, and the
tensors returned enter the graph as inputs that each compiled call reads in place. The arguments
of such a call must be constants to every dynamo version, which an object is not (torch 2.11
cannot pass a frozen dataclass, and floats and ints read from objects may be symbolic); the
handle is passed as the method's ``self``, which dynamo leaves as it is.

:func:`anyrope._torch_ops.hand_on` passes handles the other way: a whole call, handed by dynamo
to AOTAutograd, reaches its function and its rotary through two handles, constants that dynamo
compares by identity.
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

    # Compared by identity, said explicitly: torch's pytree takes a handle as a constant only
    # with an __eq__ of its own (see anyrope._torch_ops.hand_on)
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def fetch(self, make: Callable[..., R], *args: Any) -> R:
        """``make(owner, *args)``; ``make`` a module-level function, ``args`` constants."""
        return make(self.owner, *args)
