"""The call path: from a public call's arguments to one kernel run per array.

:func:`rope_call` (``rope(q, k, ...)``), :func:`apply` and :func:`cos_sin` build one call
context, check every argument, describe each array as a job with its key and table source,
and hand the jobs to the registry, which chooses every kernel before any runs. Dask arrays go
through :mod:`._dask`, which runs each chunk through this same path for the chunk's library.

Each step reads shapes, dtypes and devices only, except where values live on the host (see
:mod:`._positions`): there they may choose a cached table or the frequencies of a sequence length.
"""

from __future__ import annotations

import weakref
from typing import Any

from . import _dask
from ._checks import check_input, check_out, check_tables, check_writable, normalize_seq_axis
from ._compat import check_same_device, dynamo_hands_on, is_array
from ._context import CallContext, call_context, inspect_call, make_context
from ._dtypes import compute_dtype, isdtype
from ._handle import Handle
from ._job import Job, key_prefix, make_job
from ._layout import normalize_layout
from ._memo import Memo
from ._positions import position_spec
from ._registry import Switch, current_switch, run, use_fast_paths
from ._rotary import Rotary
from ._tables import GivenTables, PositionTables, XPosTables

__all__ = ["apply", "cos_sin", "rope_call"]


class CallPlan:
    """What a call's array types, dtypes, ranks, devices and flags decide, checked once: the
    context and per array its sequence axis, compute dtype and key prefix. Kept per signature
    where working it out is the larger part of a small call (NumPy, torch), never while traced."""

    __slots__ = ("arrays", "ctx")

    def __init__(self, ctx: CallContext, arrays: tuple[tuple[str, int, Any, tuple[Any, ...]], ...]) -> None:
        self.ctx, self.arrays = ctx, arrays  # (arg, axis, compute dtype, key prefix) per array


_plans: Memo[CallPlan] = Memo()


_SIGNED = frozenset({"numpy", "torch"})  # plans for other libraries are made per call


def call_plan(
    arrays: list[tuple[str, Any]],
    extra: list[tuple[str, Any]],
    *,
    seq_axis: Any,
    layout: Any,
    inplace: bool,
    head_dim: int,
) -> CallPlan:
    """The plan for these arrays (``extra``: position arrays, of the same library), from ranks,
    dtypes, devices and widths only. The memo's key holds everything the checks read, the type
    of ``seq_axis`` included, so no call skips a check it would fail."""
    # grad from every array: positions and offsets are integers, which never require grad
    xp, library, traced, grad = inspect_call(arrays[0], (*arrays[1:], *extra), None, all_arrays=True)
    key = None
    if not traced and library in _SIGNED:
        signature: tuple[Any, ...] = (library, type(seq_axis), seq_axis, layout, inplace, grad, head_dim)
        for _, x in arrays:
            if library == "numpy":
                signature += (x.dtype, x.ndim, x.shape[-1])
            else:
                signature += (x.dtype, x.ndim, x.shape[-1], x.device, x.layout)
        key = signature
        found = _plans.find(key)
        if found is not None:
            return found
    for arg, x in arrays:
        check_input(xp, x, arg=arg, head_dim=head_dim)
    ctx = make_context(xp, arrays[0][1], traced, grad)
    check_same_device(xp, ctx.device, "q", **dict(arrays[1:]))
    plan = CallPlan(
        ctx,
        tuple(
            (arg, normalize_seq_axis(seq_axis, x.ndim, arg=arg), compute_dtype(xp, x.dtype),
             key_prefix(ctx, x.dtype, layout, inplace))
            for arg, x in arrays
        ),
    )  # fmt: skip
    return plan if key is None else _plans.keep(key, plan)


def _arrays_given(positions: Any, offset: Any) -> list[tuple[str, Any]]:
    given = []
    if positions is not None and is_array(positions):
        given.append(("positions", positions))
    if type(offset) is not int and is_array(offset):
        given.append(("offset", offset))
    return given


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
    """``rope(q, k, positions=..., offset=..., seq_axis=..., inplace=..., inverse=...)``."""
    if not isinstance(inverse, bool):
        raise TypeError(
            f"inverse must be True (turn by minus the angles, undoing a rotation) or False, not {inverse!r}"
        )
    if inverse and rotary.xpos_scale_base is not None:
        raise ValueError(
            "inverse=True does not combine with xPos: its decay scales q and k, which turning back "
            "does not undo; use a RoPE without xpos_scale_base"
        )
    if type(q).__name__ == "ArrayImpl" and _jax_compiles(q, k, positions, offset, seq_axis, inplace):
        # Offset 0 (the default, and every prefill) stays a Python int, known while traced: the
        # digit tables then cover only the positions of this length. Other ints are traced, so
        # decode steps share one program.
        start = None if positions is not None or (type(offset) is int and offset == 0) else offset
        return _jax_compiled(rotary, seq_axis, inverse)(q, k, positions, start)
    if _torch_hands_on(q, k, positions, offset, seq_axis, inplace):
        from ._torch_ops import hand_on, refused  # imports torch: q came from it

        handed = (() if value is None else value for value in (k, positions))  # no None in a pytree
        # An int offset is 0 here (see _torch_hands_on), passed as the literal: one that dynamo
        # made symbolic after it changed would reach the handed-on call as a SymInt
        start = 0 if type(offset) is int else offset
        out = hand_on(_HANDED_ON, rotary.handle, q, *handed, start, seq_axis, inverse, current_switch(True))
        if not refused():
            return out
    arrays = [("q", q)] if k is None else [("q", q), ("k", k)]
    plan = call_plan(
        arrays, _arrays_given(positions, offset), seq_axis=seq_axis, layout=rotary.layout, inplace=inplace,
        head_dim=rotary.head_dim,
    )  # fmt: skip
    ctx = plan.ctx
    spec = position_spec(
        ctx.xp,
        ctx.env,
        positions,
        offset,
        traced=ctx.traced,
        streams=rotary.streams,
        per_axis=rotary.per_axis,
    )
    for (_, x), (arg, axis, _, _) in zip(arrays, plan.arrays, strict=True):
        spec.check(x, arg, axis)
    if inplace:
        check_writable(ctx.xp, arrays, traced=ctx.traced)
    seq = max(x.shape[axis] for (_, x), (_, axis, _, _) in zip(arrays, plan.arrays, strict=True))
    source = PositionTables(rotary, ctx, spec, seq)
    sources: list[Any] = [source] * len(arrays)
    if rotary.xpos_scale_base is not None:
        if k is None:
            raise ValueError("an xPos RoPE scales q and k oppositely: call rope(q, k) with both")
        sources = [XPosTables(source, 1.0), XPosTables(source, -1.0)]
    # clockwise turns by -angle, as inverse does: both together turn by +angle
    jobs = [
        make_job(
            ctx,
            x,
            arg=arg,
            seq_axis=axis,
            layout=rotary.layout,
            inverse=rotary.clockwise is not inverse,
            out=x if inplace else None,
            source=array_source,
            compute=compute,
            prefix=prefix,
        )
        for (_, x), (arg, axis, compute, prefix), array_source in zip(
            arrays, plan.arrays, sources, strict=True
        )
    ]
    out = _run(jobs)
    return out[0] if k is None else (out[0], out[1])


# An offset this far from 0 leaves room for any sequence within int32: past it, the eager path
# checks that the last position fits.
_SAFE_OFFSET = 2**30


def _torch_hands_on(q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any, inplace: bool) -> bool:
    """Whether dynamo traces this call and can hand it whole to AOTAutograd, to be traced there
    as plain Python (:func:`anyrope._torch_ops.hand_on`): dynamo then guards the call's
    arguments, not every function and constant that anyrope's Python reads (10 us of a 100 us
    compiled decode step on a CPU). Its arrays must be tensors and every other argument a Python
    scalar; lists, NumPy positions, ``inplace`` and a Kernel object as the switch are traced by
    dynamo step by step, as before. So is an int offset other than 0: dynamo makes a changing
    int symbolic, which a handed-on call would fix to each value (a compilation per decode step),
    and dynamo shows a symbolic int as an int (0 itself is handed on as the literal)."""
    if inplace or type(seq_axis) is not int or not dynamo_hands_on(q):
        return False
    if not all(value is None or type(value) is type(q) for value in (k, positions)):
        return False
    if not (type(offset) is type(q) or (type(offset) is int and offset == 0)):
        return False
    return type(current_switch(True)) in (bool, str)


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


def _jax_compiles(q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any, inplace: bool) -> bool:
    """Whether an eager JAX call runs as one jitted call: its arrays are concrete JAX arrays and
    every other argument is either static or an array or int that jax.jit traces. Anything else
    (lists, NumPy positions, ``inplace``, odd types) takes the eager path and its checks."""
    if inplace or type(seq_axis) is not int or not (k is None or type(k) is type(q)):
        return False
    if positions is not None:
        return type(positions) is type(q) and type(offset) is int and offset == 0
    if type(offset) is int:
        return -_SAFE_OFFSET < offset < _SAFE_OFFSET
    return type(offset) is type(q)


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


def _run(jobs: list[Job]) -> list[Any]:
    switch = current_switch(jobs[0].ctx.traced)
    if jobs[0].ctx.library == "dask.array" and switch is not False:
        return [_dask.rotate_chunks(job, switch) for job in jobs]  # chunk by chunk, through this path
    return run(jobs, switch)


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
    """Rotate checked ``x`` by checked tables in its compute dtype ``work``."""
    job = make_job(
        ctx, x, arg=arg, seq_axis=axis, layout=layout, inverse=inverse, out=out,
        source=GivenTables(cos, sin, grad=ctx.grad), compute=work,
    )  # fmt: skip
    return _run([job])[0]


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
