"""Plans: what a call's signature decides, made by its first call and looked up by the others.

A signature is everything the checks and choices of a call read except values: the array types,
shapes, strides, dtypes and devices, whether autograd records the call, the form of its
positions (an int offset, offsets or positions as arrays) with their dtypes and shapes,
``seq_axis``, ``inplace`` and ``inverse`` (each with its type: ``-2`` and ``-2.0`` hash alike),
and the kernel switch. The first call with a signature makes its :class:`Plan`: every check
that reads no value, the facts of its source of angles, each array's job and kernel, and the
kernels' prepared launch. A later call looks the plan up (one dict lookup in its RoPE) and does
only value work: the bounds of host-known offsets, its angles' form, the allocation, the launch.
As einops keeps a recipe per shape, a call with no signature (a traced one: nothing is kept while
a compiler traces, which would guard its graph on it; a library with no signer here, as JAX,
whose eager calls are jitted, and Dask; lists as positions) makes its plan and uses it once.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ._checks import check_input, check_writable, normalize_seq_axis
from ._compat import check_same_device, is_array
from ._context import CallContext, inspect_call, make_context
from ._dask import prepare_chunked
from ._dtypes import compute_dtype
from ._job import Job, key_prefix, make_job
from ._positions import ArrayOffset, GivenIntegers, MultiAxis, Offset, Positions, PositionSpec, position_spec
from ._registry import current_switch, prepare, switch_now
from ._rotary import Rotary
from ._tables import PositionTables, TableFacts, XPosTables

__all__ = ["Plan", "check_arrays", "launch_of", "make_plan", "more_signature", "signature"]


def signature(q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any, inplace: Any, inverse: Any) -> Any:
    """The call's signature as a key, or None where the call keeps no plan: a library without a
    signer here, arguments of another form (lists, other libraries' arrays), a traced call, or
    a switch that is a Kernel object (a test's stand-in, equal to another by its fields)."""
    module = type(q).__module__
    if module == "numpy":
        key = _numpy(q, k, positions, offset)
    elif module in ("torch", "torch.nn.parameter"):
        key = _torch(q, k, positions, offset)
    elif module == "mlx.core":
        key = _mlx(q, k, positions, offset)
    elif module.startswith("cupy"):
        key = _cupy(q, k, positions, offset)
    else:
        return None
    if key is None:  # before the switch: a ContextVar, which dynamo cannot read
        return None
    switch = switch_now()
    if not (switch is True or switch is False or type(switch) is str):
        return None
    return (*key, type(seq_axis), seq_axis, type(inplace), inplace, type(inverse), inverse, switch)


def _numpy(q: Any, k: Any, positions: Any, offset: Any) -> tuple[Any, ...] | None:
    array = type(q)
    head: tuple[Any, ...] = (array, *_numpy_part(q))
    if k is not None:
        if type(k) is not array:
            return None
        head += _numpy_part(k)
    if positions is not None:  # with positions, an offset other than 0 is an error: its value counts
        if type(positions) is not array or type(offset) is not int:
            return None
        return (*head, positions.dtype, positions.shape, offset)
    if type(offset) is int:
        return head
    if type(offset) is not array:
        return None
    return (*head, None, offset.dtype, offset.shape)


def _torch(q: Any, k: Any, positions: Any, offset: Any) -> tuple[Any, ...] | None:
    import torch  # imported already: q is a tensor

    # Asked before any plan is read: dynamo, torch.jit.trace and functorch's transforms trace.
    if torch.compiler.is_dynamo_compiling() or torch._C._is_tracing():
        return None
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return None
    strided = torch.strided
    if q.layout is not strided:  # a sparse tensor has no strides: the first call's check says so
        return None
    head: tuple[Any, ...] = (*_torch_part(q), torch.is_grad_enabled())
    if k is not None:
        if not isinstance(k, torch.Tensor) or k.layout is not strided:
            return None
        head += _torch_part(k)
    if positions is not None:
        if not isinstance(positions, torch.Tensor) or type(offset) is not int:
            return None
        return (*head, type(positions), positions.dtype, positions.shape, positions.device, offset)
    if type(offset) is int:
        return head
    if not isinstance(offset, torch.Tensor):
        return None
    return (*head, None, type(offset), offset.dtype, offset.shape, offset.device)


def _mlx(q: Any, k: Any, positions: Any, offset: Any) -> tuple[Any, ...] | None:
    import mlx.core as mx  # imported already: q is an MLX array

    array = type(q)
    # unified memory: the default device stands in for the arrays' (see _compat.device_of)
    head: tuple[Any, ...] = (array, *_mlx_part(q), str(mx.default_device()))
    if k is not None:
        if type(k) is not array:
            return None
        head += _mlx_part(k)
    if positions is not None:
        if type(positions) is not array or type(offset) is not int:
            return None
        return (*head, positions.dtype, positions.shape, offset)
    if type(offset) is int:
        return head
    if type(offset) is not array:
        return None
    return (*head, None, offset.dtype, offset.shape)


def _cupy(q: Any, k: Any, positions: Any, offset: Any) -> tuple[Any, ...] | None:
    array = type(q)
    head: tuple[Any, ...] = (array, *_cupy_part(q))
    if k is not None:
        if type(k) is not array:
            return None
        head += _cupy_part(k)
    if positions is not None:
        if type(positions) is not array or type(offset) is not int:
            return None
        return (*head, positions.dtype, positions.shape, positions.device.id, offset)
    if type(offset) is int:
        return head
    if type(offset) is not array:
        return None
    return (*head, None, offset.dtype, offset.shape, offset.device.id)


# What one array adds to a signature, per library (its type is checked, or part, beside).
def _numpy_part(x: Any) -> tuple[Any, ...]:
    return (x.dtype, x.shape, x.strides)


def _torch_part(x: Any) -> tuple[Any, ...]:
    return (type(x), x.dtype, x.shape, x.stride(), x.device, x.requires_grad)


def _mlx_part(x: Any) -> tuple[Any, ...]:
    return (x.dtype, x.shape)


def _cupy_part(x: Any) -> tuple[Any, ...]:
    return (x.dtype, x.shape, x.strides, x.device.id)


def more_signature(q: Any, *arrays: Any) -> tuple[Any, ...] | None:
    """What further arrays add to a signature :func:`signature` made for ``q``'s call (which
    found it traced by nothing): each one's part, as :func:`signature` takes k's (None stays
    None); None where one is of another kind."""
    module = type(q).__module__
    if module in ("torch", "torch.nn.parameter"):
        import torch  # imported already: q is a tensor

        tensor, strided = torch.Tensor, torch.strided
        if not all(x is None or (isinstance(x, tensor) and x.layout is strided) for x in arrays):
            return None
        part = _torch_part
    else:
        array = type(q)
        if not all(x is None or type(x) is array for x in arrays):
            return None
        if module == "numpy":
            part = _numpy_part
        elif module == "mlx.core":
            part = _mlx_part
        elif module.startswith("cupy"):
            part = _cupy_part
        else:
            return None
    return tuple(None if x is None else part(x) for x in arrays)


Values = Callable[[Any, Any], PositionSpec]


class Plan:
    """What one call signature decides, and its run. ``values(positions, offset)``: the call's
    position spec from its values alone, bounds checked (types, shapes and devices were checked
    when the plan was made); ``launch``: the registry's prepared launch of the call's jobs."""

    __slots__ = ("ctx", "facts", "inplace", "jobs", "launch", "seq", "two", "values", "xpos")

    def __init__(
        self, ctx: CallContext, jobs: tuple[Job, ...], launch: Any, values: Values | None, facts: TableFacts,
        *, seq: int, xpos: bool, inplace: bool,
    ) -> None:  # fmt: skip
        self.ctx, self.jobs, self.launch, self.values, self.facts = ctx, jobs, launch, values, facts
        self.seq, self.xpos, self.inplace, self.two = seq, xpos, inplace, len(jobs) == 2

    def run(self, rotary: Rotary, q: Any, k: Any, positions: Any, offset: Any) -> Any:
        """The call with these values (a kept plan: ``values`` is set)."""
        source = self.source(rotary, positions, offset)
        if self.inplace:  # read-only flags and shared memory are the arrays' own, checked per call
            check_writable(self.ctx.xp, [("q", q), ("k", k)] if self.two else [("q", q)])
        return self.run_with(source, q, k)

    def source(self, rotary: Rotary, positions: Any, offset: Any) -> PositionTables:
        """The source of a call's angles from its position values (a kept plan: ``values`` is set)."""
        assert self.values is not None
        return PositionTables(rotary, self.ctx, self.values(positions, offset), self.seq, self.facts)

    def run_with(self, source: Any, q: Any, k: Any) -> Any:
        """The call, given its source of angles."""
        inplace = self.inplace
        if not self.two:
            return self.launch(q, q if inplace else None, source)
        if self.xpos:
            return self.launch(q, k, None, None, XPosTables(source, 1.0), XPosTables(source, -1.0))
        return self.launch(q, k, q if inplace else None, k if inplace else None, source, source)


def make_plan(
    rotary: Rotary,
    q: Any,
    k: Any,
    positions: Any,
    offset: Any,
    seq_axis: Any,
    inplace: bool,
    inverse: bool,
    *,
    keep: Any,
) -> tuple[Plan, PositionTables]:
    """The plan of this call, checked in full, and the source of its angles (made from its
    values, which the plan's ``values`` makes for later calls). ``keep``: the call's signature,
    or None where the plan is used once."""
    arrays = [("q", q)] if k is None else [("q", q), ("k", k)]
    given = [(arg, v) for arg, v in (("positions", positions), ("offset", offset)) if _is_given_array(v)]
    ctx, axes = check_arrays(arrays, given, seq_axis=seq_axis, head_dim=rotary.head_dim)
    xp = ctx.xp
    spec = position_spec(
        xp, ctx.env, positions, offset, traced=ctx.traced, streams=rotary.streams, per_axis=rotary.per_axis
    )
    for (arg, x), axis in zip(arrays, axes, strict=True):
        spec.check(x, arg, axis)
    if inplace:
        check_writable(xp, arrays, traced=ctx.traced)
    xpos = rotary.xpos_scale_base is not None
    if xpos and k is None:
        raise ValueError("an xPos RoPE scales q and k oppositely: call rope(q, k) with both")
    seq = max(x.shape[axis] for (_, x), axis in zip(arrays, axes, strict=True))
    source = PositionTables(rotary, ctx, spec, seq)
    facts: Any = XPosTables(source, 1.0) if xpos else source
    # clockwise turns by -angle, as inverse does: both together turn by +angle
    turn_back = rotary.clockwise is not inverse
    jobs = tuple(
        make_job(
            ctx, x, arg=arg, seq_axis=axis, layout=rotary.layout, inverse=turn_back, out=x if inplace else None,
            source=facts, compute=compute_dtype(xp, x.dtype), prefix=key_prefix(ctx, x.dtype, rotary.layout, inplace),
        )
        for (arg, x), axis in zip(arrays, axes, strict=True)
    )  # fmt: skip
    launch = launch_of(jobs, shared=not xpos)
    values = None
    if keep is not None and not ctx.traced:
        checked = _checked_spec(rotary, ctx, arrays, axes)
        values = _values(ctx, spec, seq, checked)
    plan = Plan(ctx, jobs, launch, values, source.facts, seq=seq, xpos=xpos, inplace=inplace)
    if values is not None:
        rotary.plans.keep(keep, plan)
    return plan, source


def launch_of(jobs: tuple[Job, ...], *, shared: bool) -> Any:
    """The prepared launch of a call's jobs (see :func:`anyrope._registry.prepare`), under the
    switch in this context; for Dask arrays, chunk by chunk (:mod:`._dask`)."""
    switch = current_switch(jobs[0].ctx.traced)
    if jobs[0].ctx.env.lazy and switch is not False:
        return prepare_chunked(jobs, switch)
    return prepare(jobs, switch, shared=shared)


def check_arrays(
    arrays: list[tuple[str, Any]], given: list[tuple[str, Any]], *, seq_axis: Any, head_dim: int | None
) -> tuple[CallContext, list[int]]:
    """The context of a call on these arrays (``given``: its position arrays), and each array's
    sequence axis, checked from types, ranks, dtypes, devices and widths."""
    # grad from every array: positions and offsets are integers, which never require grad
    xp, _, traced, grad = inspect_call(arrays[0], (*arrays[1:], *given), None, all_arrays=True)
    for arg, x in arrays:
        check_input(xp, x, arg=arg, head_dim=head_dim)
    ctx = make_context(xp, arrays[0][1], traced, grad)
    check_same_device(xp, ctx.device, "q", **dict(arrays[1:]))
    return ctx, [normalize_seq_axis(seq_axis, x.ndim, arg=arg) for arg, x in arrays]


def _is_given_array(value: Any) -> bool:
    return value is not None and type(value) is not int and is_array(value)


def _checked_spec(rotary: Rotary, ctx: CallContext, arrays: list[tuple[str, Any]], axes: list[int]) -> Values:
    """The first call's checks of a call's positions, for a later call whose values fail a
    plan's bounds: they raise its error."""
    shapes = [(arg, x, axis) for (arg, x), axis in zip(arrays, axes, strict=True)]

    def checked(positions: Any, offset: Any) -> PositionSpec:
        spec = position_spec(
            ctx.xp, ctx.env, positions, offset, streams=rotary.streams, per_axis=rotary.per_axis
        )
        for arg, x, axis in shapes:
            spec.check(x, arg, axis)
        return spec

    return checked


def _values(ctx: CallContext, spec: PositionSpec, seq: int, checked: Values) -> Values:
    """How a later call with this signature makes its position spec from its values: only what
    reads them is done (the bounds of host-known offsets); anything out of bounds goes through
    ``checked``, which raises the first call's error."""
    if isinstance(spec, Offset):
        limit = spec.limit
        assert limit is not None
        low, high = -limit - 1, limit - max(seq, 1) + 1

        def offset_values(positions: Any, offset: Any) -> PositionSpec:
            if low <= offset <= high:
                return Offset(offset, limit)
            return checked(positions, offset)

        return offset_values
    host = _host_reader(ctx)
    if isinstance(spec, ArrayOffset):
        limit = spec.limit
        unsigned64 = spec.unsigned64

        def array_offset_values(positions: Any, offset: Any) -> PositionSpec:
            values = GivenIntegers(offset, host(offset), unsigned64=unsigned64)
            span = values.span()
            if span is not None and limit is not None and span[1] + seq - 1 > limit:
                return checked(positions, offset)
            return ArrayOffset(values, limit)

        return array_offset_values
    kind: Any = MultiAxis if isinstance(spec, MultiAxis) else Positions
    assert isinstance(spec, (Positions, MultiAxis))
    unsigned64 = spec.unsigned64

    def position_values(positions: Any, offset: Any) -> PositionSpec:  # noqa: ARG001 - offset is 0
        made: PositionSpec = kind(GivenIntegers(positions, host(positions), unsigned64=unsigned64))
        return made

    return position_values


def _host_reader(ctx: CallContext) -> Callable[[Any], Any]:
    """How a later call reads its position arrays on the host (see _compat.host_array): the
    array itself (NumPy), a NumPy view (CPU tensors), or not at all (every other array)."""
    if ctx.library == "numpy":
        return _same
    if ctx.library == "torch" and ctx.env.device_type == "cpu":
        return _numpy_view  # a C method caller: no Python frame on the call path
    return _nothing


def _same(value: Any) -> Any:
    return value


_numpy_view = operator.methodcaller("numpy")


def _nothing(value: Any) -> None:  # noqa: ARG001 - read nowhere
    return None
