"""The call plan: from a RoPE call's arguments to one kernel run per array.

Each step reads shapes, dtypes and devices only, except where values live on the host (see
:mod:`._positions`): there they may choose a cached table or the frequencies of a sequence
length. Traced or on an accelerator, the angles are formed on the device (:mod:`._angles`) and
length-dependent scaling is chosen there too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._angles import cos_sin, cos_sin_of_angles
from ._cache import table_cache
from ._compat import (
    Environment,
    check_same_device,
    device_of,
    environment,
    float64_scope,
    is_array,
    is_library,
    is_traced,
    library_name,
    namespace_and_library,
    take_rows,
)
from ._dtypes import compute_dtype, dtype_name
from ._frequencies import Frequencies, LengthSwitch
from ._layout import Layout
from ._positions import MultiAxis, Offset, PositionSpec, position_spec
from ._registry import rotate
from ._rotate import check_head_dim, check_input, check_writable, normalize_seq_axis
from ._xpos import XPosAngles
from .scaling import exponents

if TYPE_CHECKING:
    from ._rope import RoPE

__all__ = ["CallPlan", "Job", "PositionAngles", "call_plan", "kernel_key", "rope_call"]


class Job:
    """One array to rotate, with what kernels need to choose (``key``) and to run."""

    __slots__ = (
        "angles", "arg", "compute", "env", "grad", "inverse", "key", "layout", "out", "seq_axis", "traced", "x", "xp",
    )  # fmt: skip

    def __init__(
        self,
        xp: Any,
        env: Environment,
        x: Any,
        arg: str,
        seq_axis: int,
        layout: Layout,
        inverse: bool,
        out: Any,
        angles: Any,
        traced: bool,
        grad: bool,
        compute: Any,
        key: tuple[Any, ...] | None = None,
    ) -> None:
        self.xp, self.env, self.x, self.arg, self.seq_axis = xp, env, x, arg, seq_axis
        self.layout, self.inverse, self.out, self.angles = layout, inverse, out, angles
        self.traced, self.grad, self.compute = traced, grad, compute
        self.key = key if key is not None else kernel_key(env, x.dtype, layout, out is not None, traced, grad)

    def tables(self) -> tuple[Any, Any]:
        """Compact (cos, sin), shape (seq, h) or (rows, seq, h), in the compute dtype."""
        return self.angles.tables(self.x.shape[self.seq_axis], self.compute)  # type: ignore[no-any-return]

    def lookup(self) -> tuple[Any, Any, Any] | None:
        """(cos table, sin table, host rows (rows, seq) into them), or None; see PositionAngles."""
        return self.angles.lookup(self.x.shape[self.seq_axis], self.compute)  # type: ignore[no-any-return]


def kernel_key(
    env: Environment, dtype: Any, layout: Layout, inplace: bool, traced: bool, grad: bool
) -> tuple[Any, ...]:
    """What the registry chooses a kernel by (see ``Kernel.declares``)."""
    return (env.library, env.device_type, dtype_name(dtype), layout, inplace, traced, grad)


class CallPlan:
    """What a call's array types, dtypes, ranks, devices and flags decide, checked once: the
    namespace, the environment, and per array its sequence axis, compute dtype and kernel key.
    Remembered per signature where computing it is the larger part of a small call (NumPy, torch),
    never while traced."""

    __slots__ = ("arrays", "device", "env", "xp")

    def __init__(self, xp: Any, env: Environment, device: Any, arrays: tuple[tuple[Any, ...], ...]) -> None:
        self.xp, self.env, self.device = xp, env, device
        self.arrays = arrays  # (arg, axis, compute dtype, kernel key) per array


_plans: dict[tuple[Any, ...], CallPlan] = {}
_PLANS_KEPT = 256  # signatures seen by one process are few; a bound keeps a stream of new ones in check


def _signature(library: str, x: Any) -> tuple[Any, ...] | None:
    if library == "numpy":
        return (x.dtype, x.ndim)
    if library == "torch":
        return (x.dtype, x.ndim, x.device, x.layout)
    return None  # plans for other libraries are made per call


def call_plan(
    xp: Any,
    arrays: list[tuple[str, Any]],
    *,
    seq_axis: int,
    layout: Layout,
    inplace: bool,
    traced: bool,
    grad: bool,
) -> CallPlan:
    """The plan for these arrays, from shapes' ranks, dtypes and devices only."""
    key = None
    if not traced:
        library = library_name(xp)
        signatures = tuple(_signature(library, x) for _, x in arrays)
        if None not in signatures:
            key = (library, *signatures, len(arrays), seq_axis, layout, inplace, grad)
            found = _plans.get(key)
            if found is not None:
                return found
    for arg, x in arrays:
        check_input(xp, x, arg=arg)
    device = device_of(xp, arrays[0][1])
    check_same_device(xp, device, "q", **dict(arrays[1:]))
    env = environment(xp, device, traced=traced)
    plans = tuple(
        (arg, normalize_seq_axis(seq_axis, x.ndim, arg=arg), compute_dtype(xp, x.dtype),
         kernel_key(env, x.dtype, layout, inplace, traced, grad))
        for arg, x in arrays
    )  # fmt: skip
    plan = CallPlan(xp, env, device, plans)
    if key is not None:
        if len(_plans) >= _PLANS_KEPT:
            _plans.clear()
        _plans[key] = plan
    return plan


class PositionAngles:
    """The angles of a RoPE call: tables for each sequence length and dtype, made once per call."""

    def __init__(
        self, rope: RoPE, xp: Any, env: Environment, spec: PositionSpec, device: Any, traced: bool, seq: int
    ) -> None:
        self.rope, self.xp, self.env, self.spec, self.device = rope, xp, env, spec, device
        self.traced = traced
        self.host = None if traced else spec.host_range(seq)  # over the longest array
        self.seq = seq
        self.freqs = rope._frequencies_for(None if self.host is None else self.host[1] + 1)
        sections = rope._sections
        # whether the tables are rows of the plain spectrum's table (cached per position)
        self.plain = not isinstance(spec, MultiAxis) and (sections is None or not sections.reordered)
        self._memo: dict[tuple[int, Any], tuple[Any, Any]] = {}
        self._lookups: dict[tuple[str, int, Any], tuple[Any, Any, Any] | None] = {}

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        key = (seq, dtype)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._tables(seq, dtype)
        return found

    def _tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        rope = self.rope
        if not isinstance(self.freqs, LengthSwitch):
            return self._static(self.freqs, seq, dtype)
        # Length-dependent scaling under tracing: both sides of the threshold, chosen on the device.
        threshold, short, long = self.freqs.threshold, self.freqs.short, self.freqs.long
        short_tables = self._static(short, seq, dtype)
        xp = self.xp
        if math.prod(short_tables[0].shape) == 0:  # no positions: no largest one
            return short_tables
        largest = self.spec.largest(xp, self.env, self.seq, self.device)
        if long is None:  # DynamicNTK: frequencies from the length itself
            work = xp.float64 if self.env.float64 else xp.float32
            with float64_scope(xp) if self.env.float64 else contextlib.nullcontext():
                length = xp.astype(largest, work) + 1.0  # in floats: + 1 cannot wrap
                inv_freq = rope._scaling.device_frequencies(
                    xp, length, rope.rotary_dim, rope.base, exponents=self._exponents(work)
                )
            long_tables = self._each_stream(
                seq,
                inv_freq,
                lambda p, pairs: cos_sin_of_angles(xp, self.env, p, pairs, dtype=dtype),
                lambda pairs: take_rows(
                    xp, inv_freq, xp.asarray(pairs, dtype=self.env.index, device=self.device)
                ),
            )
        else:
            long_tables = self._static(long, seq, dtype)
        is_long = largest >= threshold  # max(positions) + 1 > threshold
        return xp.where(is_long, long_tables[0], short_tables[0]), xp.where(
            is_long, long_tables[1], short_tables[1]
        )

    def _exponents(self, dtype: Any) -> Any:
        """-2i / rotary_dim per pair on the device, made there once (a copy per call could not be
        replayed by a CUDA graph)."""
        xp, rotary_dim = self.xp, self.rope.rotary_dim

        def build() -> tuple[Any, Any]:
            values = xp.asarray(exponents(rotary_dim), dtype=dtype, device=self.device)
            return values, values

        if self.traced:
            return build()[0]
        key = ("exponents", rotary_dim, dtype, self.env)
        return table_cache.constant(xp, key, build, nbytes=8 * rotary_dim)[0]

    def _each_stream(
        self,
        seq: int,
        inv_freq: Any,
        tables: Callable[[Any, Any], tuple[Any, Any]],
        pick: Callable[[tuple[int, ...]], Any],
    ) -> tuple[Any, Any]:
        """``tables(positions, inv_freq)``, where positions come per stream (M-RoPE, axial): each
        stream's tables for its own pairs (``pick`` takes their frequencies by index), then put in
        pair order."""
        positions = self.spec.positions(self.xp, self.env, seq, self.device)
        sections = self.rope._sections
        if not isinstance(self.spec, MultiAxis):  # every stream at these positions
            if sections is not None and sections.reordered:
                return tables(positions, pick(sections.freq_of))
            return tables(positions, inv_freq)
        assert sections is not None  # position_spec makes MultiAxis only for M-RoPE and axial RoPE
        return sections.tables(
            self.xp, positions, lambda p, s: tables(p, pick(sections.frequency_indices[s]))
        )

    def _static(self, freqs: Frequencies, seq: int, dtype: Any) -> tuple[Any, Any]:
        xp, spec = self.xp, self.spec
        host = None if self.traced else spec.host_range(seq)
        if not self.plain:
            host = None  # cached tables are per position, not per stream, in the plain spectrum's order
        if host is not None and host[0] >= 0:
            cached = self.rope._prefix(xp, self.env, freqs, host[1] + 1, dtype, self.device)
            if cached is not None:
                if isinstance(spec, Offset):
                    return cached[0][spec.start : spec.start + seq, ...], cached[1][
                        spec.start : spec.start + seq, ...
                    ]
                positions = spec.positions(xp, self.env, seq, self.device)
                flat = xp.reshape(positions, (-1,))
                if flat.dtype != self.env.index:
                    flat = xp.astype(flat, self.env.index)
                shape = (*positions.shape, len(freqs.inv_freq))
                return xp.reshape(take_rows(xp, cached[0], flat), shape), xp.reshape(
                    take_rows(xp, cached[1], flat), shape
                )
        tables = self._each_stream(
            seq,
            freqs.inv_freq,
            lambda p, pairs: cos_sin(
                xp, self.env, p, pairs, dtype=dtype, device=self.device, traced=self.traced
            ),
            lambda pairs: tuple(freqs.inv_freq[j] for j in pairs),
        )
        return scaled(tables, freqs.scale)

    def lookup(self, seq: int, dtype: Any) -> tuple[Any, Any, Any] | None:
        """The cached prefix table and host rows into it, where the positions are host-known and
        inside it: the CPU kernels then read each token's row directly, with no gathered copy."""
        if self.traced or isinstance(self.freqs, LengthSwitch) or not self.plain:
            return None
        key = ("lookup", seq, dtype)  # q and k of one length share it
        if key in self._lookups:
            return self._lookups[key]
        found = None
        rows = self.spec.host(seq)
        host = None if rows is None else self.spec.host_range(seq)
        if host is not None and host[0] >= 0:
            cached = self.rope._prefix(self.xp, self.env, self.freqs, host[1] + 1, dtype, self.device)
            found = None if cached is None else (cached[0], cached[1], rows)
        self._lookups[key] = found
        return found


def scaled(tables: tuple[Any, Any], scale: float) -> tuple[Any, Any]:
    return tables if scale == 1.0 else (tables[0] * scale, tables[1] * scale)


def rope_call(rope: RoPE, q: Any, k: Any, positions: Any, offset: Any, seq_axis: int, inplace: bool) -> Any:
    """``rope(q, k, positions=..., offset=..., seq_axis=..., inplace=...)``."""
    arrays = [("q", q)] if k is None else [("q", q), ("k", k)]
    given = arrays[1:]
    if positions is not None and is_array(positions):
        given.append(("positions", positions))
    if type(offset) is not int and is_array(offset):
        given.append(("offset", offset))
    xp, library = namespace_and_library(arrays[0], *given)
    traced = library in _TRACEABLE and is_traced(xp, q, *(value for _, value in given))
    grad = library == "torch" and _grad(xp, arrays)
    plan = call_plan(
        xp, arrays, seq_axis=seq_axis, layout=rope.layout, inplace=inplace, traced=traced, grad=grad
    )
    for arg, x in arrays:
        check_head_dim(x, arg, rope.head_dim)
    env, device = plan.env, plan.device
    spec = position_spec(xp, env, positions, offset, device, traced=traced, streams=rope.streams)
    for (_, x), (arg, axis, _, _) in zip(arrays, plan.arrays, strict=True):
        spec.check(x, arg, axis)
    if inplace:
        check_writable(xp, arrays, traced=traced)
    axes = [axis for _, axis, _, _ in plan.arrays]
    seq = q.shape[axes[0]] if k is None else max(q.shape[axes[0]], k.shape[axes[1]])
    angles = PositionAngles(rope, xp, env, spec, device, traced, seq)
    per_array: list[Any] = [angles] * len(arrays)
    if rope.xpos_scale_base is not None:
        if k is None:
            raise ValueError("an xPos RoPE scales q and k oppositely: call rope(q, k) with both")
        per_array = [XPosAngles(angles, 1.0), XPosAngles(angles, -1.0)]
    out = [
        rotate(
            Job(
                xp,
                env,
                x,
                arg,
                axis,
                rope.layout,
                rope.clockwise,  # turning by -angle is the inverse rotation
                x if inplace else None,
                array_angles,
                traced,
                grad,
                compute,
                key,
            )
        )
        for (_, x), (arg, axis, compute, key), array_angles in zip(
            arrays, plan.arrays, per_array, strict=True
        )
    ]
    return out[0] if k is None else (out[0], out[1])


_TRACEABLE = frozenset({"torch", "jax.numpy"})  # what is_traced can tell apart (MLX cannot: never read)


def _grad(xp: Any, arrays: list[tuple[str, Any]]) -> bool:
    if not is_library(xp, "torch"):
        return False
    import torch

    return torch.is_grad_enabled() and any(x.requires_grad for _, x in arrays)
