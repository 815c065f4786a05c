"""What torch's tracers need of anyrope: the operator that keeps a call's tables while
torch.compile compiles it, :class:`anyrope._handle.Handle`'s fetch of kept constants as plain
Python, and :func:`hand_on`, which hands a whole call to AOTAutograd; imported on first use (it
imports torch).

Inductor fuses elementwise work into its consumers: left alone, the float64 angles and their cos
and sin go into the loop over every head, formed once per head instead of once per call. An
operator it cannot see into makes it form them once, into a buffer, before the rotation reads
them. The operator only copies, so results are unchanged.
"""

import contextlib
import threading
from typing import Any, cast

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _python_dispatch, _pytree

from ._handle import Handle

__all__ = [
    "as_traced", "dynamo_static_by_default", "dynamo_traces", "hand_on", "handed_on", "hands_on",
    "keep_tables", "real_tensors", "refuse", "refused", "scatter_tables", "strict_exports",
]  # fmt: skip

# Per thread: how many handed-on calls AOTAutograd is tracing here (depth), and the error, if
# any, that dynamo's fake run of the last one met (refused)
_handed = threading.local()


def dynamo_traces() -> bool:
    """Whether torch.compile traces this code: dynamo itself (not for torch.export's strict mode,
    see :func:`strict_exports`), or AOTAutograd inside a call that :func:`hand_on` handed on (the
    same choices hold there: the same compiler gets the graph)."""
    return (bool(torch.compiler.is_dynamo_compiling()) and not strict_exports()) or handed_on()


# Under dynamo, torch 2.11 and older answer is_exporting() True for torch.compile as well
# (pytorch/pytorch#176347, fixed for 2.12)
_EXPORTING_TOLD = torch.__version__ >= "2.12"


def strict_exports() -> bool:
    """Whether dynamo traces this code for ``torch.export(strict=True)``: its programs then take
    what a default (non-strict) export records, standard operators only. Where torch cannot tell
    it from torch.compile (2.11 and older), False: strict exports take torch.compile's choices."""
    return _EXPORTING_TOLD and bool(torch.compiler.is_dynamo_compiling()) and torch.compiler.is_exporting()


def handed_on() -> bool:
    """Whether AOTAutograd traces a call that :func:`hand_on` handed on, here on this thread."""
    return getattr(_handed, "depth", 0) > 0


def hands_on() -> bool:
    """Whether a call that dynamo traces (asked first, by :func:`anyrope._compat.dynamo_hands_on`)
    should go through :func:`hand_on`: this torch can (``torch._dynamo.nonstrict_trace``, torch
    2.7) and dynamo traces for torch.compile, not for torch.export's strict mode, which cannot
    export the opaque call. Where torch cannot tell the two apart (:data:`_EXPORTING_TOLD`),
    compiled calls are traced step by step."""
    return _handed_on is not None and _EXPORTING_TOLD and not strict_exports()


def hand_on(entry: Handle[Any], owner: Handle[Any], *args: Any) -> Any:
    """``entry.owner(owner.owner, *args)`` as one opaque call in dynamo's graph, which
    AOTAutograd traces as plain Python (``torch._dynamo.nonstrict_trace``).

    dynamo guards every global, function and attribute that the code it traces reads: about
    350 guards for a call of anyrope, checked before every compiled call (several times
    transformers' rotary's). A handed-on call costs guards on its arguments and on torch's pytree
    registry, which dynamo reads as it flattens them: about 200. ``args`` must be tensors,
    Python scalars and tuples of them (no None); dynamo specialises the scalars, a symbolic int
    included. What the call reads beside them must not change: a frozen owner, module constants.
    AOTAutograd's cache passes over such graphs (nonstrict_trace is not cacheable), so a new
    process traces them again."""
    assert _handed_on is not None, "hand_on needs torch._dynamo.nonstrict_trace: ask hands_on() first"
    return _handed_on(entry, owner, *args)


def as_traced(*kept: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Kept tensors that :meth:`Handle.fetch` returned, as the graph being traced takes them: as
    they are while dynamo traces (it makes them inputs), lifted to constants of the graph while
    AOTAutograd traces a handed-on call, as ``torch.tensor`` lifts its data (a real tensor met
    there as it is fails inductor's checks, an operator's arguments above all)."""
    if not handed_on():
        return kept
    return tuple(
        None if x is None else cast("torch.Tensor", torch.ops.aten.lift_fresh.default(x)) for x in kept
    )


def refuse(error: Exception) -> bool:
    """Whether a handed-on call that raised ``error`` is being run by dynamo on fake tensors, to
    learn its outputs: then ``error`` is kept (see :func:`refused`) and the call should return
    stand-ins, since dynamo would report any error there as an unsupported output. Elsewhere
    (AOTAutograd's trace, an eager backend) it should raise as it is."""
    from torch._subclasses.fake_tensor import fake_tensor_tls

    in_dynamo = getattr(fake_tensor_tls, "allow_non_fake_inputs_override", None) is True  # nonstrict_trace's
    key = getattr(torch._C, "_TorchDispatchModeKey", None)
    if not in_dynamo or key is None or torch._C._get_dispatch_mode(key.PROXY) is not None:  # AOTAutograd's
        return False
    _handed.refused = error
    return True


def refused() -> bool:
    """Whether the call just handed on raised while dynamo ran it (see :func:`refuse`): the caller
    then traces it step by step, and meets the error where dynamo reports it as its own."""
    return getattr(_handed, "refused", None) is not None


def _run_handed_on(entry: Handle[Any], owner: Handle[Any], *args: Any) -> Any:
    _handed.refused = None
    _handed.depth = getattr(_handed, "depth", 0) + 1
    try:
        return entry.owner(owner.owner, *args)
    finally:
        _handed.depth -= 1


def _handing_on() -> Any:
    nonstrict = getattr(torch._dynamo, "nonstrict_trace", None)
    register = getattr(_pytree, "register_constant", None)
    if nonstrict is None or register is None:  # torch < 2.7
        return None
    register(Handle)  # a constant to dynamo, compared by identity (Handle.__eq__)
    return nonstrict(_run_handed_on)


_handed_on = _handing_on()


def dynamo_static_by_default() -> bool:
    """False under ``torch.compile(dynamic=True)``, which gives even a fetched constant symbolic
    sizes, and dynamo (torch 2.13) then cannot read its shape."""
    return bool(torch._dynamo.config.assume_static_by_default)


# dynamo runs a Handle's fetch as plain Python and takes its result as a constant (see ._handle)
torch.compiler.assume_constant_result(Handle.fetch)  # type: ignore[no-untyped-call,unused-ignore]


def real_tensors() -> contextlib.AbstractContextManager[Any]:
    """Where tensors made while torch.compile traces are real, to be kept: outside any fake mode,
    and outside AOTAutograd's functionalisation and proxy modes where it traces a handed-on call."""
    disable = getattr(_python_dispatch, "_disable_current_modes", None)
    return cast(
        "contextlib.AbstractContextManager[Any]", unset_fake_temporarily() if disable is None else disable()
    )


# A torch.library operator, not a custom_op: a custom_op's Python wrapper and autograd kernel
# cost more on every compiled call. No gradient is registered: :func:`anyrope._policy.keep_tables`
# passes tables that need one around it.
_LIBRARY = torch.library.Library("anyrope", "FRAGMENT")
_LIBRARY.define("keep_tables(Tensor tables) -> Tensor")
_LIBRARY.impl("keep_tables", lambda tables: tables.clone(), "CompositeExplicitAutograd")
torch.library.register_fake("anyrope::keep_tables", lib=_LIBRARY)(lambda tables: torch.empty_like(tables))


def keep_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, formed into one buffer and copied by one operator call."""
    kept = torch.ops.anyrope.keep_tables.default(torch.stack([cos, sin]))
    return kept[0], kept[1]


def scatter_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, scattered into a buffer of their own: for programs torch.export records, which
    keep to standard operators. Inductor (AOTInductor's too) writes a scatter's result to memory
    before anything reads it, so the rotation reads the tables instead of forming their angles
    for every head: 1.8 to 3.5 times a compiled copy of q and k became 1.1 to 2.1 in prefill, and
    a decode step's 5.8 to 22 times became 1.0 to 4.9 (CPU, torch 2.13). The values are copied
    exactly."""
    both = torch.stack([cos, sin])
    flat = both.reshape(-1)
    every = torch.arange(flat.shape[0], device=flat.device)
    kept = torch.zeros_like(flat).index_put((every,), flat).reshape(both.shape)
    return kept[0], kept[1]
