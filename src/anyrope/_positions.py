"""Where each token sits: typed position specs, checked from shapes alone.

A spec turns into positions on the device (:meth:`PositionSpec.positions`, traceable), tells
the largest position on the device (for scaling that depends on the sequence length) and, where
its values live on the host (Python ints, NumPy arrays, CPU torch tensors outside tracing), what
they are: that allows cached tables and the CPU kernels' row lookups. Packed sequences and
multi-axis positions are further subclasses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._compat import Environment, host_array, int_info, is_array, isdtype

__all__ = ["ArrayOffset", "Offset", "PositionSpec", "Positions", "position_spec"]


class PositionSpec:
    """Base class: positions of a call, for arrays whose sequence axis is known."""

    #: rows of position tables: 1 (one row shared by the batch) or the batch size
    rows: int = 1
    #: the position array's own ndim as the tables see it: 1 for (seq,), 2 for (rows, seq)
    ndim: int = 1

    def check(self, x: Any, arg: str, axis: int) -> None:
        """Raise ValueError if ``x`` (sequence along ``axis``) does not fit these positions."""

    def positions(self, xp: Any, env: Environment, seq: int, device: Any) -> Any:
        """Integer positions on the device, shape (seq,) or (rows, seq)."""
        raise NotImplementedError

    def largest(self, xp: Any, env: Environment, seq: int, device: Any) -> Any:
        """The largest position as a 0-d device array (traceable)."""
        return xp.max(self.positions(xp, env, seq, device))

    def host(self, seq: int) -> Any:
        """The positions as a (rows, seq) int64 NumPy array where they are known on the host, else None."""
        return None

    def host_range(self, seq: int) -> tuple[int, int] | None:
        """(smallest, largest) position over ``seq`` tokens where known on the host, else None."""
        rows = self.host(seq)
        if rows is None or rows.size == 0:
            return None
        return int(rows.min()), int(rows.max())


@dataclass(frozen=True)
class Offset(PositionSpec):
    """Positions ``start, start + 1, ...`` for every row, ``start`` a Python int."""

    start: int

    def positions(self, xp: Any, env: Environment, seq: int, device: Any) -> Any:
        dtype = env.index
        if env.index_bits == 64 and isinstance(self.start, int) and -(2**31) <= self.start <= 2**31 - seq:
            dtype = getattr(xp, "int32", dtype)  # half the digit tables where angles are formed by digits
        return xp.arange(self.start, self.start + seq, dtype=dtype, device=device)

    def host(self, seq: int) -> Any:
        import numpy as np

        return np.arange(self.start, self.start + seq, dtype=np.int64)[None]

    def host_range(self, seq: int) -> tuple[int, int] | None:
        return (self.start, self.start + seq - 1) if seq else None


@dataclass(frozen=True)
class ArrayOffset(PositionSpec):
    """Positions ``start[b], start[b] + 1, ...``: ``start`` a 0-d array (one offset, perhaps traced)
    or a (batch,) array (one per row)."""

    start: Any
    known: Any = field(default=None, compare=False)  # the host view, where there is one

    def __post_init__(self) -> None:
        object.__setattr__(self, "ndim", 1 if self.start.ndim == 0 else 2)
        object.__setattr__(self, "rows", 1 if self.start.ndim == 0 else self.start.shape[0])

    def check(self, x: Any, arg: str, axis: int) -> None:
        if self.start.ndim == 1:
            _check_batch(x, arg, axis, self.start.shape[0], "offset")

    def positions(self, xp: Any, env: Environment, seq: int, device: Any) -> Any:
        start = _widened(xp, env, self.start, "offset")
        steps = xp.arange(seq, dtype=start.dtype, device=device)
        return start[..., None] + steps if self.start.ndim else start + steps

    def largest(self, xp: Any, env: Environment, seq: int, device: Any) -> Any:
        return xp.max(_widened(xp, env, self.start, "offset")) + (seq - 1)

    def host(self, seq: int) -> Any:
        if self.known is None:
            return None
        import numpy as np

        return np.reshape(self.known, (-1, 1)).astype(np.int64) + np.arange(seq, dtype=np.int64)


@dataclass(frozen=True)
class Positions(PositionSpec):
    """Explicit positions, shape (seq,) or (batch, seq) (any shape for :meth:`RoPE.cos_sin`)."""

    values: Any
    known: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ndim", self.values.ndim)
        object.__setattr__(self, "rows", self.values.shape[0] if self.values.ndim == 2 else 1)

    def check(self, x: Any, arg: str, axis: int) -> None:
        seq = x.shape[axis]
        if self.values.shape[-1] != seq:
            raise ValueError(
                f"positions has {self.values.shape[-1]} entries per row but {arg} has {seq} "
                f"positions along its sequence axis ({axis})"
            )
        if self.values.ndim == 2:
            _check_batch(x, arg, axis, self.values.shape[0], "positions")

    def positions(self, xp: Any, env: Environment, seq: int, device: Any) -> Any:
        return self.values

    def host(self, seq: int) -> Any:
        if self.known is None:
            return None
        return self.known.reshape(-1, seq) if self.known.ndim <= 2 and seq else None

    def host_range(self, seq: int) -> tuple[int, int] | None:
        if self.known is None or self.known.size == 0:
            return None
        return int(self.known.min()), int(self.known.max())  # NumPy compares uint64 exactly


def _widened(xp: Any, env: Environment, start: Any, arg: str) -> Any:
    """Offsets in a dtype that holds ``start + seq``: narrow integers widen to the index dtype."""
    bits, signed = int_info(xp, start.dtype)
    if bits < env.index_bits:
        return xp.astype(start, env.index)
    if not signed and env.library == "torch":  # torch has no arithmetic on uint32 and wider
        raise TypeError(f"{arg} of dtype {start.dtype}: torch cannot add to it; pass int64 offsets")
    return start


def _check_batch(x: Any, arg: str, axis: int, batch: int, source: str) -> None:
    if x.ndim + axis < 1:
        raise ValueError(
            f"per-row {source} align with {arg}'s first axis, but {arg} of shape {tuple(x.shape)} has "
            "no batch axis before its sequence axis"
        )
    if batch != 1 and batch != x.shape[0]:  # not `in`: dynamo cannot compare symbolic sizes in a tuple
        raise ValueError(
            f"{source} has {batch} rows but {arg} has batch size {x.shape[0]} (axis 0); give one row "
            "per batch entry"
        )


def position_spec(
    xp: Any,
    env: Environment,
    positions: Any,
    offset: Any,
    device: Any,
    *,
    ndims: Sequence[int] | None = (1, 2),
    traced: bool = False,
) -> PositionSpec:
    """The spec that ``positions=`` or ``offset=`` describe, checked from types and shapes.

    Python ints are checked to fit the index dtype, except while tracing (dynamo makes them
    symbolic, and a comparison would add a guard)."""
    if positions is not None:
        if not (type(offset) is int and offset == 0):
            raise ValueError("pass positions or offset, not both (positions already say where each token is)")
        values, known = _index_array(xp, env, positions, device, "positions", traced)
        if ndims is not None and values.ndim not in ndims:
            wanted = " or ".join(f"{n}-d" for n in ndims)
            raise ValueError(f"positions must be {wanted}, got shape {tuple(values.shape)}")
        return Positions(values, known)
    if type(offset) is int:  # the common case, first (a SymInt while dynamo traces)
        return Offset(offset if traced else _fits(offset, env, "offset"))
    if not is_array(offset) and not (isinstance(offset, Sequence) and not isinstance(offset, (str, bytes))):
        if isinstance(offset, bool) or not hasattr(offset, "__index__"):
            raise TypeError(
                f"offset must be an int, an integer array or a sequence of ints (one per batch row), "
                f"not {type(offset).__name__}"
            )
        return Offset(_fits(int(offset), env, "offset"))
    values, known = _index_array(xp, env, offset, device, "offset", traced)
    if values.ndim > 1:
        raise ValueError(
            f"offset must be one int, or 1-d with one int per batch row; got shape {tuple(values.shape)}"
        )
    return ArrayOffset(values, known)


def _fits(value: int, env: Environment, arg: str) -> int:
    bound = 2 ** (env.index_bits - 1)
    if not -bound <= value < bound:
        raise ValueError(
            f"{arg}={value} does not fit in {env.index_bits}-bit integers ({env.library} positions)"
        )
    return value


def _index_array(
    xp: Any, env: Environment, value: Any, device: Any, arg: str, traced: bool
) -> tuple[Any, Any]:
    """``value`` (an integer array, or nested Python ints) as a device array, and its host view or None."""
    if is_array(value):
        if not isdtype(xp, value.dtype, "integral"):
            raise TypeError(
                f"{arg} must be an integer array, got dtype {value.dtype}; positions count tokens, "
                "so cast them to an integer dtype (fractional positions come from scaling=, not from here)"
            )
        host = host_array(xp, value)
        return value, host
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{arg} must be an integer array or a sequence of ints, not {type(value).__name__}")
    if _has_non_int(value):
        raise TypeError(f"{arg} must hold integers, got {value!r}")
    if len({len(row) if isinstance(row, Sequence) else -1 for row in value}) > 1:
        raise ValueError(f"{arg} must be rectangular: every row needs the same length")
    if not traced:
        flat = list(_flatten(value))
        for number in (min(flat), max(flat)) if flat else ():
            _fits(int(number), env, arg)
    array = xp.asarray(value, dtype=env.index, device=device)
    return array, None if traced else _numpy_of(value)


def _numpy_of(value: Any) -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - the host view is an optimisation only
        return None
    return np.asarray(value, dtype=np.int64)


def _flatten(value: Any) -> Any:
    for item in value:
        if isinstance(item, Sequence):
            yield from _flatten(item)
        else:
            yield item


def _has_non_int(value: Any) -> bool:
    if isinstance(value, Sequence):
        return any(_has_non_int(v) for v in value)
    if isinstance(value, bool):
        return True
    return not isinstance(value, int) and not hasattr(value, "__index__")  # int first: SymInts too


def count(shape: Sequence[int]) -> int:
    return math.prod(shape)
