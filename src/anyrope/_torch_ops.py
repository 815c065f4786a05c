"""What torch's tracers need of anyrope: the operator that keeps a call's tables while
torch.compile compiles it, and :class:`anyrope._handle.Handle`'s fetch of kept constants as plain
Python; imported on first use (it imports torch).

Inductor fuses elementwise work into its consumers: left alone, the float64 angles and their cos
and sin go into the loop over every head, formed once per head instead of once per call. An
operator it cannot see into makes it form them once, into a buffer, before the rotation reads
them. The operator only copies, so results are unchanged.
"""

import contextlib
from typing import Any, cast

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ._handle import Handle

__all__ = ["dynamo_static_by_default", "dynamo_traces", "keep_tables", "real_tensors"]


def dynamo_traces() -> bool:
    return bool(torch.compiler.is_dynamo_compiling())


def dynamo_static_by_default() -> bool:
    """False under ``torch.compile(dynamic=True)``, which gives even a fetched constant symbolic
    sizes, and dynamo (torch 2.13) then cannot read its shape."""
    return bool(torch._dynamo.config.assume_static_by_default)


# dynamo runs a Handle's fetch as plain Python and takes its result as a constant (see ._handle)
torch.compiler.assume_constant_result(Handle.fetch)  # type: ignore[no-untyped-call,unused-ignore]


def real_tensors() -> contextlib.AbstractContextManager[Any]:
    """Where tensors made while dynamo traces are real, to be kept: outside any fake mode."""
    return cast("contextlib.AbstractContextManager[Any]", unset_fake_temporarily())


# A torch.library operator, not a custom_op: a custom_op's Python wrapper and autograd kernel
# cost about 7 us more on every compiled call, a twentieth of a decode step. No gradient is
# registered: :func:`anyrope._compat.keep_tables` passes tables that need one around it.
_LIBRARY = torch.library.Library("anyrope", "FRAGMENT")
_LIBRARY.define("keep_tables(Tensor tables) -> Tensor")
_LIBRARY.impl("keep_tables", lambda tables: tables.clone(), "CompositeExplicitAutograd")
torch.library.register_fake("anyrope::keep_tables", lib=_LIBRARY)(lambda tables: torch.empty_like(tables))


def keep_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, formed into one buffer and copied by one operator call."""
    kept = torch.ops.anyrope.keep_tables.default(torch.stack([cos, sin]))
    return kept[0], kept[1]
