"""The call plan: from a RoPE call's arguments to one kernel run per array.

Each step reads shapes, dtypes and devices only, except where values live on the host (see
:mod:`._positions`): there they may choose a cached table or the frequencies of a sequence
length. Traced or on an accelerator, the angles are formed on the device (:mod:`._angles`) and
length-dependent scaling is chosen there too.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

from ._angles import cos_sin, cos_sin_of_angles
from ._compat import (
    Environment,
    array_namespace,
    compute_dtype,
    device_of,
    dtype_name,
    environment,
    float64_scope,
    is_array,
    is_library,
    is_traced,
    take_rows,
)
from ._frequencies import Frequencies, LengthSwitch
from ._layout import Layout
from ._positions import Offset, PositionSpec, position_spec
from ._registry import rotate
from ._rotate import check_input, check_writable, normalize_seq_axis

if TYPE_CHECKING:
    from ._rope import RoPE

__all__ = ["Job", "PositionAngles", "rope_call"]


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
    ) -> None:
        self.xp, self.env, self.x, self.arg, self.seq_axis = xp, env, x, arg, seq_axis
        self.layout, self.inverse, self.out, self.angles = layout, inverse, out, angles
        self.traced, self.grad, self.compute = traced, grad, compute
        self.key = (
            env.library,
            env.device_type,
            dtype_name(xp, x.dtype),
            layout,
            out is not None,
            traced,
            grad,
        )

    def tables(self) -> tuple[Any, Any]:
        """Compact (cos, sin), shape (seq, h) or (rows, seq, h), in the compute dtype."""
        return self.angles.tables(self.x.shape[self.seq_axis], self.compute)  # type: ignore[no-any-return]

    def lookup(self) -> tuple[Any, Any, Any] | None:
        """(cos table, sin table, host rows (rows, seq) into them), or None; see PositionAngles."""
        return self.angles.lookup(self.x.shape[self.seq_axis], self.compute)  # type: ignore[no-any-return]


class PositionAngles:
    """The angles of a RoPE call: tables for each sequence length and dtype, made once per call."""

    def __init__(
        self, rope: RoPE, xp: Any, env: Environment, spec: PositionSpec, device: Any, traced: bool, seq: int
    ) -> None:
        self.rope, self.xp, self.env, self.spec, self.device = rope, xp, env, spec, device
        self.traced = traced
        self.host = None if traced else spec.host_range(seq)  # over the longest array
        self.seq = seq
        self.freqs = rope._frequencies_for(None if self.host is None else self.host[1] + 1, traced)
        self._memo: dict[tuple[int, Any], tuple[Any, Any]] = {}

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
        length = self.spec.largest(xp, self.env, self.seq, self.device) + 1
        if long is None:  # DynamicNTK: frequencies from the length itself
            work = xp.float64 if self.env.float64 else xp.float32
            with float64_scope(xp) if self.env.float64 else contextlib.nullcontext():
                inv_freq = rope._scaling.device_frequencies(
                    xp, length, rope.rotary_dim, rope.base, dtype=work, device=self.device
                )
            positions = self.spec.positions(xp, self.env, seq, self.device)
            long_tables = cos_sin_of_angles(xp, self.env, positions, inv_freq, dtype=dtype)
        else:
            long_tables = self._static(long, seq, dtype)
        is_long = length > threshold
        return xp.where(is_long, long_tables[0], short_tables[0]), xp.where(
            is_long, long_tables[1], short_tables[1]
        )

    def _static(self, freqs: Frequencies, seq: int, dtype: Any) -> tuple[Any, Any]:
        xp, spec = self.xp, self.spec
        host = None if self.traced else spec.host_range(seq)
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
        positions = spec.positions(xp, self.env, seq, self.device)
        tables = cos_sin(
            xp, self.env, positions, freqs.inv_freq, dtype=dtype, device=self.device, traced=self.traced
        )
        return scaled(tables, freqs.scale)

    def lookup(self, seq: int, dtype: Any) -> tuple[Any, Any, Any] | None:
        """The cached prefix table and host rows into it, where the positions are host-known and
        inside it: the CPU kernels then read each token's row directly, with no gathered copy."""
        if self.traced or isinstance(self.freqs, LengthSwitch):
            return None
        rows = self.spec.host(seq)
        if rows is None:
            return None
        host = self.spec.host_range(seq)
        if host is None or host[0] < 0:
            return None
        cached = self.rope._prefix(self.xp, self.env, self.freqs, host[1] + 1, dtype, self.device)
        return None if cached is None else (cached[0], cached[1], rows)


def scaled(tables: tuple[Any, Any], scale: float) -> tuple[Any, Any]:
    return tables if scale == 1.0 else (tables[0] * scale, tables[1] * scale)


def rope_call(rope: RoPE, q: Any, k: Any, positions: Any, offset: Any, seq_axis: int, inplace: bool) -> Any:
    """``rope(q, k, positions=..., offset=..., seq_axis=..., inplace=...)``."""
    named = {"q": q, "k": k}
    if positions is not None and is_array(positions):
        named["positions"] = positions
    if type(offset) is not int and is_array(offset):
        named["offset"] = offset
    xp = array_namespace(**named)
    arrays = [("q", q)] if k is None else [("q", q), ("k", k)]
    for arg, x in arrays:
        check_input(xp, x, arg=arg, head_dim=rope.head_dim)
    device = device_of(xp, q)
    if k is not None and is_library(xp, "torch") and k.device != q.device:
        raise ValueError(f"q is on {q.device} but k is on {k.device}; move them to one device")
    env = environment(xp, device)
    traced = any(is_traced(xp, v) for v in named.values() if v is not None)
    spec = position_spec(xp, env, positions, offset, device, traced=traced)
    axes = [normalize_seq_axis(seq_axis, x.ndim, arg=arg) for arg, x in arrays]
    for (arg, x), axis in zip(arrays, axes, strict=True):
        spec.check(x, arg, axis)
    if inplace:
        check_writable(xp, arrays, traced=traced)
    seq = max(x.shape[axis] for (_, x), axis in zip(arrays, axes, strict=True))
    angles = PositionAngles(rope, xp, env, spec, device, traced, seq)
    grad = _grad(xp, arrays)
    out = [
        rotate(
            Job(
                xp,
                env,
                x,
                arg,
                axis,
                rope.layout,
                False,
                x if inplace else None,
                angles,
                traced,
                grad,
                compute_dtype(xp, x.dtype),
            )
        )
        for (arg, x), axis in zip(arrays, axes, strict=True)
    ]
    return out[0] if k is None else (out[0], out[1])


def _grad(xp: Any, arrays: list[tuple[str, Any]]) -> bool:
    if not is_library(xp, "torch"):
        return False
    import torch

    return torch.is_grad_enabled() and any(x.requires_grad for _, x in arrays)
