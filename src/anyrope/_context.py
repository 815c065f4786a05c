"""One call's context: the namespace, the environment of the device, whether the call is traced,
and whether it needs gradients. Built once at each public entry point and passed down as one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._compat import Environment, device_of, environment, is_array, is_traced, namespace_and_library

__all__ = ["TRACEABLE", "CallContext", "call_context", "inspect_call", "make_context", "needs_grad"]

# The libraries is_traced can tell apart; MLX cannot, so its arrays are never read on the host.
TRACEABLE = frozenset({"torch", "jax.numpy"})


@dataclass(frozen=True, eq=False)
class CallContext:
    """``xp``: the array-API namespace; ``env``: what the device offers (its ``device`` is the
    call's device); ``traced``: a compiler is tracing (nothing may read a value or a memo);
    ``grad``: autograd records the call."""

    xp: Any
    env: Environment
    traced: bool
    grad: bool

    @property
    def library(self) -> str:
        return self.env.library

    @property
    def device(self) -> Any:
        return self.env.device


def call_context(
    anchor: tuple[str, Any], *others: tuple[str, Any], grad_of: tuple[Any, ...] | None = None
) -> CallContext:
    """The context of a call on ``anchor``'s array (its device is the call's) and the other named
    values, of which arrays must be of the same library (the others are skipped). ``grad_of``:
    the arrays whose gradients the call must carry (default: every array named)."""
    xp, _, traced, grad = inspect_call(anchor, others, grad_of)
    return make_context(xp, anchor[1], traced, grad)


def inspect_call(
    anchor: tuple[str, Any], others: tuple[tuple[str, Any], ...], grad_of: tuple[Any, ...] | None
) -> tuple[Any, str, bool, bool]:
    """(namespace, library name, traced, grad) of a call: what comes before any memo."""
    arrays = [(arg, value) for arg, value in others if value is not None and is_array(value)]
    xp, library = namespace_and_library(anchor, *arrays)
    values = (anchor[1], *(value for _, value in arrays))
    traced = library in TRACEABLE and is_traced(xp, *values)
    grad = library == "torch" and needs_grad(values if grad_of is None else grad_of)
    return xp, library, traced, grad


def make_context(xp: Any, anchor: Any, traced: bool, grad: bool) -> CallContext:
    """The context of a call whose device is ``anchor``'s."""
    return CallContext(xp, environment(xp, device_of(xp, anchor), traced=traced), traced, grad)


def needs_grad(arrays: tuple[Any, ...]) -> bool:
    """Whether autograd records an operation on these torch tensors."""
    import torch

    return torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in arrays)
