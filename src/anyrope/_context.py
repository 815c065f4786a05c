"""One call's context: the namespace, the environment of the device, whether the call is traced
(and the compiler policy that holds then), and whether it needs gradients. Built once at each public entry point and passed down as one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._compat import (
    Environment,
    check_same_device,
    device_of,
    environment,
    is_array,
    is_traced,
    namespace_and_library,
)
from ._policy import Tracing, tracing

__all__ = ["TRACEABLE", "CallContext", "call_context", "inspect_call", "make_context", "needs_grad"]

# The libraries is_traced can tell apart; MLX cannot, so its arrays are never read on the host.
TRACEABLE = frozenset({"torch", "jax.numpy"})


@dataclass(frozen=True, eq=False)
class CallContext:
    """``xp``: the array-API namespace; ``env``: what the device offers; ``traced``: a compiler
    is tracing (nothing may read a value or a memo); ``grad``: autograd records the call;
    ``library`` and ``device``: the environment's, kept as fields (read on every call);
    ``tracing``: how the call differs from an eager one (:mod:`anyrope._policy`)."""

    xp: Any
    env: Environment
    traced: bool
    grad: bool
    library: str
    device: Any
    tracing: Tracing


def call_context(
    anchor: tuple[str, Any], *others: tuple[str, Any], grad_of: tuple[Any, ...] | None = None
) -> CallContext:
    """The context of a call on ``anchor``'s array (its device is the call's) and the other named
    values, of which arrays must be of the same library (the others are skipped). ``grad_of``:
    the arrays whose gradients the call must carry (default: every array named)."""
    xp, _, traced, grad = inspect_call(anchor, others, grad_of)
    ctx = make_context(xp, anchor[1], traced, grad)
    check_same_device(xp, ctx.device, anchor[0], **{arg: value for arg, value in others if is_array(value)})
    return ctx


def inspect_call(
    anchor: tuple[str, Any],
    others: tuple[tuple[str, Any], ...],
    grad_of: tuple[Any, ...] | None,
    *,
    all_arrays: bool = False,
) -> tuple[Any, str, bool, bool]:
    """(namespace, library name, traced, grad) of a call: what comes before any memo.
    ``all_arrays``: the others are known to be arrays (not None, ints or lists)."""
    arrays = (
        others if all_arrays else tuple(item for item in others if item[1] is not None and is_array(item[1]))
    )
    xp, library = namespace_and_library(anchor, *arrays)
    if library not in TRACEABLE:  # the common NumPy case, in a few steps
        return xp, library, False, False
    values = (anchor[1], *(value for _, value in arrays))
    traced = is_traced(xp, *values)
    grad = library == "torch" and needs_grad(values if grad_of is None else grad_of)
    return xp, library, traced, grad


def make_context(xp: Any, anchor: Any, traced: bool, grad: bool) -> CallContext:
    """The context of a call whose device is ``anchor``'s."""
    env = environment(xp, device_of(xp, anchor), traced=traced)
    return CallContext(xp, env, traced, grad, env.library, env.device, tracing(xp, traced))


def needs_grad(arrays: tuple[Any, ...]) -> bool:
    """Whether autograd records an operation on these torch tensors."""
    import torch

    return torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in arrays)
