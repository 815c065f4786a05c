"""The call path: from a public call's arguments to one kernel run per array.

:func:`rope_call` (``rope(q, k, ...)``), :func:`apply` and :func:`cos_sin` build one call
context, check every argument, describe each array as a job with its key and table source,
and hand the jobs to the registry, which chooses every kernel and prepares their launch before any
runs: a call's plan (:mod:`._plan`), kept per signature for ``rope(...)``. Dask arrays go
through :mod:`._dask`, which runs each chunk through a launch prepared for the chunk's library.

Each step reads shapes, dtypes and devices only, except where values live on the host (see
:mod:`._positions`): there they may choose a cached table or the frequencies of a sequence length.
"""

from __future__ import annotations

import weakref
from typing import Any

from ._checks import check_input, check_out, check_tables, normalize_seq_axis
from ._context import CallContext, call_context
from ._dtypes import compute_dtype, isdtype
from ._handle import Handle
from ._job import make_job
from ._layout import normalize_layout
from ._plan import Plan, launch_of, make_plan, signature
from ._policy import HAND_ON, JAX_JIT, call_form
from ._positions import position_spec
from ._registry import Switch, current_switch, use_fast_paths
from ._rotary import Rotary
from ._tables import GivenTables, PositionTables

__all__ = ["apply", "cos_sin", "rope_call", "rope_source"]


def rope_call(
    rotary: Rotary,
    q: Any,
    k: Any,
    positions: Any,
    offset: Any,
    seq_axis: Any,
    inplace: bool,
    inverse: bool = False,
) -> Any:
    """``rope(q, k, positions=..., offset=..., seq_axis=..., inplace=..., inverse=...)``: a lookup
    of the plan of the call's signature and its run, or where there is none, the checks of every
    argument and a new plan (see :mod:`._plan`)."""
    key = signature(q, k, positions, offset, seq_axis, inplace, inverse)
    if key is not None:
        plan = rotary.plans.find(key)
        if plan is not None:
            return plan.run(rotary, q, k, positions, offset)
    if not isinstance(inverse, bool):
        raise TypeError(
            f"inverse must be True (turn by minus the angles, undoing a rotation) or False, not {inverse!r}"
        )
    if inverse and rotary.xpos_scale_base is not None:
        raise ValueError(
            "inverse=True does not combine with xPos: its decay scales q and k, which turning back "
            "does not undo; use a RoPE without xpos_scale_base"
        )
    form = call_form(q, k, positions, offset, seq_axis, inplace, lambda: current_switch(True))
    if form == JAX_JIT:
        # Offset 0 (the default, and every prefill) stays a Python int, known while traced: the
        # digit tables then cover only the positions of this length. Other ints are traced, so
        # decode steps share one program.
        start = None if positions is not None or (type(offset) is int and offset == 0) else offset
        return _jax_compiled(rotary, seq_axis, inverse)(q, k, positions, start)
    if form == HAND_ON:
        from ._torch_ops import hand_on, refused  # imports torch: q came from it

        handed = (() if value is None else value for value in (k, positions))  # no None in a pytree
        # An int offset is 0 here (see call_form), passed as the literal: one that dynamo
        # made symbolic after it changed would reach the handed-on call as a SymInt
        start = 0 if type(offset) is int else offset
        out = hand_on(_HANDED_ON, rotary.handle, q, *handed, start, seq_axis, inverse, current_switch(True))
        if not refused():
            return out
    plan, source = make_plan(rotary, q, k, positions, offset, seq_axis, inplace, inverse, keep=key)
    return plan.run_with(source, q, k)


def rope_source(
    rotary: Rotary, q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any
) -> tuple[Plan, PositionTables]:
    """The plan of ``rope(q, k, positions=..., offset=..., seq_axis=...)`` (looked up by its
    signature, else made with every check) and the source of its angles, without running it:
    for a fused kernel that rotates as part of more (the attention prologue's)."""
    key = signature(q, k, positions, offset, seq_axis, False, False)
    plan = None if key is None else rotary.plans.find(key)
    if plan is not None and plan.values is not None:
        return plan, plan.source(rotary, positions, offset)
    return make_plan(rotary, q, k, positions, offset, seq_axis, False, False, keep=key)


def _rope_handed_on(
    rotary: Rotary, q: Any, k: Any, positions: Any, offset: Any, seq_axis: int, inverse: bool, switch: Switch
) -> Any:
    """A call that dynamo handed on, as AOTAutograd traces it: the checks and choices of an
    eager call, under the switch that held where dynamo met it."""
    k, positions = (None if type(value) is tuple else value for value in (k, positions))
    try:
        with use_fast_paths(switch):
            return rope_call(rotary, q, k, positions, offset, seq_axis, False, inverse)
    except Exception as error:
        from ._torch_ops import refuse

        if not refuse(error):
            raise
        return q if k is None else (q, k)  # stand-ins: rope_call is traced again, and raises there


# What hand_on calls: made before any trace, as dynamo takes a constant argument (see ._handle)
_HANDED_ON = Handle(_rope_handed_on)


# Per RoPE, its jitted calls: weakly keyed, and each holds only a weak reference back, so a RoPE
# keeps no function that pickling or deep-copying it would meet.
_jax_calls: weakref.WeakKeyDictionary[Rotary, dict[tuple[int, bool], Any]] = weakref.WeakKeyDictionary()


def _jax_compiled(rotary: Rotary, seq_axis: int, inverse: bool) -> Any:
    """``rope_call`` with these static arguments as one ``jax.jit`` function, made once.

    Eager JAX dispatches each operation on its own: a decode step cost ten times the jitted call.
    jax.jit keys its own cache by shapes and dtypes, and traces ints, so each decode step's
    offset reuses one executable."""
    calls = _jax_calls.get(rotary)
    if calls is None:
        calls = _jax_calls.setdefault(rotary, {})
    found = calls.get((seq_axis, inverse))
    if found is None:
        import jax

        held = weakref.ref(rotary)

        def call(q: Any, k: Any, positions: Any, offset: Any) -> Any:
            start = 0 if offset is None else offset
            return rope_call(held(), q, k, positions, start, seq_axis, False, inverse)  # type: ignore[arg-type]

        found = calls[seq_axis, inverse] = jax.jit(call)
    return found


def apply(
    x: Any,
    cos: Any,
    sin: Any,
    *,
    layout: str = "half",
    inverse: bool = False,
    seq_axis: int = -2,
    out: Any = None,
) -> Any:
    """Rotate ``x`` by the angles whose cosines and sines are ``cos`` and ``sin``.

    Parameters
    ----------
    x : array
        Shape ``(..., seq, head_dim)`` (``seq_axis=-2``) or ``(batch, seq, heads, head_dim)``
        (``seq_axis=-3``), floating point.
    cos, sin : array
        Compact tables, one value per rotated pair: shape ``(seq, r/2)``, broadcast over every
        other axis, or ``(batch, seq, r/2)``, aligned with ``x``'s first axis. The first ``r``
        features of each head are rotated and the rest pass through unchanged.
    layout : str
        "half" (pairs i, i + r/2) or "interleaved" (pairs 2i, 2i + 1), or an alias.
    inverse : bool
        Rotate by the negated angles: undoes a rotation, and is the backward pass of one.
    seq_axis : int
        Which axis of ``x`` is the sequence.
    out : array, optional
        Write the result here (``out=x`` rotates in place) instead of a new array; for libraries
        with mutable arrays (NumPy, PyTorch, CuPy). Saves the allocation, which on CPUs costs
        page faults comparable to the rotation itself.

    Returns
    -------
    array
        Same library, device, shape and dtype as ``x`` (``out`` when given). float16 and
        bfloat16 are rotated in float32 and rounded once.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> x = np.array([[1.0, 0.0]])               # one position, one pair
    >>> c, s = np.array([[0.0]]), np.array([[1.0]])  # a quarter turn
    >>> anyrope.apply(x, c, s)
    array([[0., 1.]])
    >>> anyrope.apply(anyrope.apply(x, c, s), c, s, inverse=True)
    array([[1., 0.]])
    """
    ctx = call_context(("x", x), ("cos", cos), ("sin", sin), ("out", out), grad_of=(x, cos, sin))
    xp = ctx.xp
    check_input(xp, x, arg="x")
    axis = normalize_seq_axis(seq_axis, x.ndim)
    check_tables(xp, x, cos, sin, axis)
    if out is not None:
        check_out(xp, x, out)
    work = compute_dtype(xp, x.dtype)
    cos, sin = xp.astype(cos, work, copy=False), xp.astype(sin, work, copy=False)
    return rotate_by_tables(ctx, x, "x", axis, normalize_layout(layout), bool(inverse), out, cos, sin, work)


def rotate_by_tables(
    ctx: CallContext,
    x: Any,
    arg: str,
    axis: int,
    layout: Any,
    inverse: bool,
    out: Any,
    cos: Any,
    sin: Any,
    work: Any,
) -> Any:
    """Rotate checked ``x`` by checked tables in its compute dtype ``work`` (a plan used once)."""
    source = GivenTables(cos, sin, grad=ctx.grad)
    job = make_job(
        ctx, x, arg=arg, seq_axis=axis, layout=layout, inverse=inverse, out=out, source=source, compute=work
    )
    return launch_of((job,), shared=False)(x, out, source)


def cos_sin(rotary: Rotary, positions: Any, like: Any) -> tuple[Any, Any]:
    """:meth:`anyrope.RoPE.cos_sin`: compact tables for ``positions`` in ``like``'s library,
    device and dtype (sin negated for a clockwise RoPE)."""
    if rotary.xpos_scale_base is not None:
        raise ValueError(
            "an xPos RoPE scales q and k by different tables, which one pair of cos and sin cannot "
            "give: call rope(q, k)"
        )
    ctx = call_context(("like", like), ("positions", positions), grad_of=())
    xp = ctx.xp
    if not isdtype(xp, like.dtype, "real floating"):
        raise TypeError(f"like must be a real floating-point array, got dtype {like.dtype}")
    spec = position_spec(
        xp,
        ctx.env,
        positions,
        0,
        ndims=None,
        traced=ctx.traced,
        streams=rotary.streams,
        per_axis=rotary.per_axis,
    )
    source = PositionTables(rotary, ctx, spec, 0)  # explicit positions: no sequence length
    cos, sin = source.tables(0, compute_dtype(xp, like.dtype))
    if rotary.clockwise:
        sin = -sin
    return xp.astype(cos, like.dtype, copy=False), xp.astype(sin, like.dtype, copy=False)
