"""Where each token sits: typed position specs, checked from shapes alone.

A spec turns into positions on the device (:meth:`PositionSpec.positions`, traceable), tells
the largest position on the device (for scaling that depends on the sequence length) and, where
its values live on the host (Python ints, NumPy arrays, CPU torch tensors outside tracing), what
they are: that allows cached tables and the CPU kernels' row lookups. Positions of several
streams per token (M-RoPE, axial RoPE) are :class:`MultiAxis`; packed sequences are explicit
positions made on the device (:func:`anyrope.packed_positions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._angles import index_positions
from ._compat import Environment, check_same_device, host_array, is_array
from ._dtypes import index_kind, int_info

__all__ = [
    "ArrayOffset",
    "GivenIntegers",
    "MultiAxis",
    "Offset",
    "PositionSpec",
    "Positions",
    "check_shift",
    "position_spec",
]


class PositionSpec:
    """Base class: positions of a call, for arrays whose sequence axis is known."""

    #: rows of position tables: 1 (one row shared by the batch) or the batch size
    rows: int = 1
    #: the position array's own ndim as the tables see it: 1 for (seq,), 2 for (rows, seq)
    ndim: int = 1

    def check(self, x: Any, arg: str, axis: int) -> None:
        """Raise ValueError if ``x`` (sequence along ``axis``) does not fit these positions."""

    def positions(self, xp: Any, env: Environment, seq: int) -> Any:
        """Integer positions on the device, shape (seq,) or (rows, seq)."""
        raise NotImplementedError

    def largest(self, xp: Any, env: Environment, seq: int) -> Any:
        """The largest position as a 0-d device array in the index dtype (traceable); positions
        past that dtype's range count as its largest value."""
        return _max(xp, _saturated(xp, env, self.positions(xp, env, seq)))

    def host(self, seq: int) -> Any:
        """The positions as a (rows, seq) int64 NumPy array where they are known on the host, else None."""
        return None

    def wrapped(self, xp: Any, env: Environment, positions: Any) -> Any:
        """Where ``positions`` (of :meth:`positions`) wrapped past the index dtype's largest value
        unseen, as a boolean device array, or None where none can."""
        return None

    def given(self) -> Any:
        """The array of positions or offsets the call was given (not one made from Python ints),
        or None."""
        return None

    #: whether the positions were given as 64-bit unsigned integers (their wrap-around is the
    #: generic path's alone)
    unsigned64: bool = False

    def host_range(self, seq: int) -> tuple[int, int] | None:
        """(smallest, largest) position over ``seq`` tokens where known on the host, else None."""
        rows = self.host(seq)
        if rows is None or rows.size == 0:
            return None
        return int(rows.min()), int(rows.max())


class Offset(PositionSpec):
    """Positions ``start, start + 1, ...`` for every row, ``start`` a Python int; ``limit``, the
    largest position the index dtype holds, where ``start`` is known (not a symbol of a trace)."""

    __slots__ = ("limit", "start")

    def __init__(self, start: int, limit: int | None = None) -> None:
        self.start, self.limit = start, limit

    def check(self, x: Any, arg: str, axis: int) -> None:
        if self.limit is not None:
            _check_last(self.start, False, self.limit, arg, x.shape[axis])

    def positions(self, xp: Any, env: Environment, seq: int) -> Any:
        dtype = env.index
        if env.index_bits == 64 and isinstance(self.start, int) and -(2**31) <= self.start <= 2**31 - seq:
            dtype = getattr(xp, "int32", dtype)  # half the digit tables where angles are formed by digits
        if type(self.start) is int and self.start + seq >= 2 ** (env.index_bits - 1):
            # the last position fits but arange's stop, one past it, does not
            start = xp.asarray(self.start, dtype=dtype, device=env.device)
            return xp.arange(seq, dtype=dtype, device=env.device) + start
        return xp.arange(self.start, self.start + seq, dtype=dtype, device=env.device)

    def host(self, seq: int) -> Any:
        import numpy as np

        if self.start + seq < 2**63:  # arange's stop fits int64: one operation
            return np.arange(self.start, self.start + seq, dtype=np.int64)[None]
        return (np.arange(seq, dtype=np.int64) + np.int64(self.start))[None]

    def host_range(self, seq: int) -> tuple[int, int] | None:
        return (self.start, self.start + seq - 1) if seq else None


class GivenIntegers:
    """Integers a call was given: an array of the call's library, or Python ints, which become a
    device array only when one is needed (a CPU kernel reads the host copy directly)."""

    __slots__ = ("_array", "_make", "_range", "known", "ndim", "shape", "unsigned64")

    def __init__(
        self,
        array: Any,
        known: Any,
        *,
        make: Any = None,
        shape: Any = None,
        span: Any = None,
        unsigned64: bool = False,
    ) -> None:
        self._array, self._make, self.known = array, make, known
        self.shape = tuple(array.shape) if array is not None else shape
        self.ndim = len(self.shape)
        self._range: tuple[int, int] | None = span
        self.unsigned64 = unsigned64  # a 64-bit unsigned array (Python ints become signed arrays)

    def given(self) -> Any:
        """The array the call was given, or None for Python ints (an array made from them is new)."""
        return self._array if self._make is None else None

    def array(self) -> Any:
        """The integers as a device array of the call's library."""
        if self._array is None:
            self._array = self._make()
        return self._array

    def span(self) -> tuple[int, int] | None:
        """(smallest, largest) where known on the host and not empty, else None."""
        known = self.known
        if self._range is None and known is not None and known.size:
            # Exact for uint64 too. A few Python ints compare faster than two NumPy reductions.
            values = known.ravel().tolist() if known.size <= 256 else (known.min(), known.max())
            self._range = (int(min(values)), int(max(values)))
        return self._range


class ArrayOffset(PositionSpec):
    """Positions ``start[b], start[b] + 1, ...``: ``start`` 0-d (one offset, perhaps traced) or
    (batch,) (one per row); ``limit``, the largest position the index dtype holds; ``peak``, the
    largest offset where it was read on the host for this bound alone (see :func:`_peak`)."""

    __slots__ = ("limit", "ndim", "peak", "rows", "start", "unsigned64")

    def __init__(self, start: GivenIntegers, limit: int | None = None, peak: int | None = None) -> None:
        self.start, self.limit, self.unsigned64, self.peak = start, limit, start.unsigned64, peak
        self.ndim = 1 if start.ndim == 0 else 2
        self.rows = 1 if start.ndim == 0 else start.shape[0]

    def check(self, x: Any, arg: str, axis: int) -> None:
        if self.start.ndim == 1:
            _check_batch(x, arg, axis, self.start.shape[0], "offset")
        span = self.start.span()  # host-known offsets only: device values are never read
        top = span[1] if span is not None else self.peak
        if top is not None and self.limit is not None:
            _check_last(top, True, self.limit, arg, x.shape[axis])

    def positions(self, xp: Any, env: Environment, seq: int) -> Any:
        given = self.start.array()
        if env.lazy and self.limit is not None and self.start.known is None:
            given = _checked_lazily(given, seq, self.limit)
        start, unsigned = _widened(xp, env, given)
        steps = xp.arange(seq, dtype=env.index, device=env.device)
        positions = start[..., None] + steps if given.ndim else start + steps
        # Unsigned offsets as wide as the index dtype were added in it, wrapping: cast back, so
        # the angles read the values as unsigned again (see _angles.index_positions).
        return xp.astype(positions, given.dtype) if unsigned else positions

    def given(self) -> Any:
        return self.start.given()

    def wrapped(self, xp: Any, env: Environment, positions: Any) -> Any:
        """Signed offsets in the index dtype that nothing read on the host (MLX, JAX, devices)
        may put a position past its largest value, which ``start + seq`` wraps to a negative one:
        those are the positions below their row's offset (the steps are not negative). The
        angles add ``2**bits`` positions back there (as for wide unsigned positions), so the
        result is right where it cannot be refused."""
        given = self.start.array()
        if env.lazy or given.dtype != env.index or self.start.span() is not None or self.peak is not None:
            return None
        return positions < (given[..., None] if given.ndim else given)

    def largest(self, xp: Any, env: Environment, seq: int) -> Any:
        start = _max(xp, _saturated(xp, env, self.start.array()))
        bound = xp.full((), 2 ** (env.index_bits - 1) - seq, dtype=env.index, device=env.device)
        return xp.minimum(start, bound) + (seq - 1)  # saturated: adding seq - 1 cannot wrap

    def host(self, seq: int) -> Any:
        known = self.start.known
        if known is None:
            return None
        import numpy as np

        starts = np.reshape(known, (-1, 1)).astype(np.int64)
        return starts if seq == 1 else starts + np.arange(seq, dtype=np.int64)

    def host_range(self, seq: int) -> tuple[int, int] | None:
        span = self.start.span()
        return None if span is None or seq == 0 else (span[0], span[1] + seq - 1)


class Positions(PositionSpec):
    """Explicit positions, shape (seq,) or (batch, seq) (any shape for :meth:`RoPE.cos_sin`)."""

    __slots__ = ("ndim", "rows", "unsigned64", "values")

    def __init__(self, values: GivenIntegers) -> None:
        self.values, self.unsigned64 = values, values.unsigned64
        self.ndim = values.ndim
        self.rows = values.shape[0] if values.ndim == 2 else 1

    def check(self, x: Any, arg: str, axis: int) -> None:
        _check_positions(self.values.shape, x, arg, axis)

    def positions(self, xp: Any, env: Environment, seq: int) -> Any:
        return self.values.array()

    def given(self) -> Any:
        return self.values.given()

    def host(self, seq: int) -> Any:
        known = self.values.known
        if known is None:
            return None
        return known.reshape(-1, seq) if known.ndim <= 2 and seq else None

    def host_range(self, seq: int) -> tuple[int, int] | None:
        return self.values.span()


class MultiAxis(PositionSpec):
    """Positions in several streams (M-RoPE's time, height and width): shape (streams, seq) or
    (streams, batch, seq), or (streams, ...) for :meth:`RoPE.cos_sin`. Tables come per stream
    (:mod:`._sections`); the host view serves the choice of frequencies only, never a row lookup."""

    __slots__ = ("ndim", "rows", "unsigned64", "values")

    def __init__(self, values: GivenIntegers) -> None:
        self.values, self.unsigned64 = values, values.unsigned64
        self.ndim = values.ndim - 1
        self.rows = values.shape[1] if values.ndim == 3 else 1

    def check(self, x: Any, arg: str, axis: int) -> None:
        _check_positions(self.values.shape[1:], x, arg, axis)

    def positions(self, xp: Any, env: Environment, seq: int) -> Any:
        return self.values.array()

    def given(self) -> Any:
        return self.values.given()

    def host_range(self, seq: int) -> tuple[int, int] | None:
        return self.values.span()


def _widened(xp: Any, env: Environment, start: Any) -> tuple[Any, bool]:
    """Offsets in the index dtype, where ``start + seq`` is formed, and whether they are unsigned
    as wide as it (cast with wrap-around; torch has no arithmetic on its wide unsigned types)."""
    if start.dtype == env.index:
        return start, False
    bits, signed = int_info(xp, start.dtype)
    return xp.astype(start, env.index), not signed and bits >= env.index_bits


def _max(xp: Any, values: Any) -> Any:
    """The largest of ``values``, its axes named: torch.onnx.export translates torch's max over
    all axes (``amax`` without ``dim``) to no ONNX function (onnxscript 0.7)."""
    return xp.max(values, axis=tuple(range(values.ndim)))


def _saturated(xp: Any, env: Environment, values: Any) -> Any:
    """Integer values in the index dtype for comparisons; unsigned values past its range (which
    wrap when cast) become its largest value."""
    signed, wrapped = index_positions(xp, env, values)
    if wrapped is None:
        return signed
    return xp.where(wrapped, xp.full_like(signed, 2 ** (env.index_bits - 1) - 1), signed)


def _check_last(start: int, of_several: bool, limit: int, arg: str, seq: int) -> None:
    """Positions ``start .. start + seq - 1`` must fit the index dtype (largest ``limit``): past it
    they would wrap. The message is formatted only when raised: this runs on every call."""
    last = start + seq - 1
    if last > limit:
        offset = f"offset {start} (the largest)" if of_several else f"offset={start}"
        raise ValueError(
            f"{offset} puts the last of {arg}'s {seq} positions at {last}, past {limit}, the largest "
            f"position its integers hold (it would wrap around): give offsets of at most {limit - seq + 1}"
        )


def _checked_lazily(start: Any, seq: int, limit: int) -> Any:
    """Dask offsets that refuse, as each block of them is computed, a last position past ``limit``
    (as :func:`_check_last` refuses host-known ones): nothing is computed during the call, and
    no wrapped position is ever formed. Blocks on a GPU (CuPy) are not read."""
    checked: Any = start.map_blocks(_checked_block, seq=seq, limit=limit, dtype=start.dtype, meta=start._meta)
    return checked


def _checked_block(block: Any, *, seq: int, limit: int) -> Any:
    if type(block).__module__ == "numpy" and block.size:
        _check_last(int(block.max()), True, limit, "the call", seq)
    return block


def check_shift(spec: PositionSpec, seq: int, shift: int, env: Environment) -> None:
    """Host-known positions moved by an int ``shift`` must stay within the index dtype."""
    span = spec.host_range(seq)
    bound = 2 ** (env.index_bits - 1)
    if span is not None and not -bound <= span[0] + shift <= span[1] + shift < bound:
        raise ValueError(
            f"shift={shift} moves positions {span[0]}..{span[1]} to {span[0] + shift}..{span[1] + shift}, "
            f"past the {env.index_bits}-bit integers positions are formed in (they would wrap around): "
            "give a smaller shift"
        )


def _check_positions(shape: tuple[int, ...], x: Any, arg: str, axis: int) -> None:
    seq = x.shape[axis]
    if shape[-1] != seq:
        raise ValueError(
            f"positions has {shape[-1]} entries per row but {arg} has {seq} "
            f"positions along its sequence axis ({axis})"
        )
    if len(shape) == 2:
        _check_batch(x, arg, axis, shape[0], "positions")


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
    *,
    ndims: Sequence[int] | None = (1, 2),
    traced: bool = False,
    streams: int = 1,
    per_axis: bool = False,
) -> PositionSpec:
    """The spec that ``positions=`` or ``offset=`` describe, checked from types and shapes.

    With ``streams`` > 1 (M-RoPE), positions of more than one axis have the streams first; 1-D
    positions and offsets give every stream the same positions. Python ints are checked to fit
    the index dtype, except while tracing (dynamo makes them symbolic, and a comparison would
    add a guard). ``per_axis``: pairs turn by frequencies of their own axis (axial RoPE), so
    positions alike on every axis are no rotation a model makes, and only ``(streams, ...)`` is taken."""
    if per_axis and (positions is None or _ndim(positions) < 2):
        raise ValueError(_one_row_for_every_axis(positions, streams))
    if positions is None and ndims is None:  # tables for explicit positions (cos_sin), with none given
        raise TypeError("positions must be an integer array or a sequence of ints, not None")
    if positions is not None:
        if not (type(offset) is int and offset == 0):
            raise ValueError("pass positions or offset, not both (positions already say where each token is)")
        values = _given_integers(xp, env, positions, "positions", traced)
        if streams > 1 and values.ndim > 1:
            return _multi_axis(values, streams, ndims)
        if ndims is not None and values.ndim not in ndims:
            wanted = " or ".join(f"{n}-d" for n in ndims)
            raise ValueError(f"positions must be {wanted}, got shape {values.shape}")
        return Positions(values)
    limit = 2 ** (env.index_bits - 1) - 1
    if type(offset) is int:  # the common case, first (a SymInt while dynamo traces)
        return Offset(offset, None) if traced else Offset(_fits(offset, env, "offset"), limit)
    if not is_array(offset) and not (isinstance(offset, Sequence) and not isinstance(offset, (str, bytes))):
        if isinstance(offset, bool) or not hasattr(offset, "__index__"):
            raise TypeError(
                f"offset must be an int, an integer array or a sequence of ints (one per batch row), "
                f"not {type(offset).__name__}"
            )
        return Offset(_fits(int(offset), env, "offset"), limit)
    values = _given_integers(xp, env, offset, "offset", traced)
    if values.ndim > 1:
        raise ValueError(
            f"offset must be one int, or 1-d with one int per batch row; got shape {values.shape}"
        )
    return ArrayOffset(values, _largest(values, env), None if traced else _peak(env, values))


def _ndim(positions: Any) -> int:
    shape = getattr(positions, "shape", None)
    if shape is not None:
        return len(shape)
    if isinstance(positions, Sequence) and not isinstance(positions, (str, bytes)):
        return 1 + (_ndim(positions[0]) if len(positions) else 0)
    return 0


def _one_row_for_every_axis(positions: Any, streams: int) -> str:
    given = "offset= (or no positions)" if positions is None else f"positions of shape {_shape(positions)}"
    return (
        f"{given} put every axis at the same position, but this RoPE's pairs turn by frequencies of "
        f"their own axis (axial RoPE, {streams} axes), so that is not a rotation a model makes: give "
        f"positions of shape ({streams}, seq) or ({streams}, batch, seq), one row per axis "
        "(anyrope.grid_positions makes them for a grid of patches)"
    )


def _shape(positions: Any) -> tuple[int, ...]:
    shape = getattr(positions, "shape", None)
    return tuple(shape) if shape is not None else (len(positions),) if hasattr(positions, "__len__") else ()


def _multi_axis(values: GivenIntegers, streams: int, ndims: Sequence[int] | None) -> MultiAxis:
    shape = values.shape
    wanted = f"({streams}, seq) or ({streams}, batch, seq)" if ndims is not None else f"({streams}, ...)"
    if shape[0] != streams or (ndims is not None and len(shape) - 1 not in ndims):
        raise ValueError(
            f"positions of shape {shape} do not fit this RoPE's {streams} position streams (M-RoPE or "
            f"axial): give shape {wanted}, streams first; where every stream is alike (text tokens) "
            "give shape (seq,) or use offset="
        )
    return MultiAxis(values)


def _largest(values: GivenIntegers, env: Environment) -> int:
    """The largest position offsets of this dtype reach without wrapping: unsigned ones as wide as
    the index dtype are read as unsigned again (see ArrayOffset.positions). From the dtype: the
    bound holds for offsets read on the host or in a Dask graph alike."""
    if values.unsigned64 and env.index_bits == 64:
        return (1 << 64) - 1
    return (1 << (env.index_bits - 1)) - 1


# Libraries whose arrays are NumPy arrays behind another interface, on the host and never traced:
# their offsets are read for the bound on the last position alone (no cached rows, no kernels).
_HOST_BEHIND = frozenset({"array_api_strict"})


def _peak(env: Environment, values: GivenIntegers) -> int | None:
    """The largest of offsets that are not host-known but live on the host all the same
    (array-api-strict), read for the bound on the last position; None elsewhere (devices, MLX,
    JAX, Dask: never read; host-known ones have their span)."""
    if values.known is not None or env.library not in _HOST_BEHIND or 0 in values.shape:
        return None
    import numpy as np  # array-api-strict is built on it

    return int(np.from_dlpack(values.array()).max())


def _fits(value: int, env: Environment, arg: str) -> int:
    bound = 2 ** (env.index_bits - 1)
    if not -bound <= value < bound:
        raise ValueError(
            f"{arg}={value} does not fit in {env.index_bits}-bit integers ({env.library} positions)"
        )
    return value


def _given_integers(xp: Any, env: Environment, value: Any, arg: str, traced: bool) -> GivenIntegers:
    """``value`` (an integer array, or nested Python ints) checked, with its host view where there is one."""
    if is_array(value):
        check_same_device(xp, env.device, "the call's arrays", **{arg: value})
        integral, unsigned64 = index_kind(xp, value.dtype)
        if not integral:
            raise TypeError(
                f"{arg} must be an integer array, got dtype {value.dtype}; positions count tokens, "
                "so cast them to an integer dtype (fractional positions come from scaling=, not from here)"
            )
        return GivenIntegers(value, host_array(xp, value, traced), unsigned64=unsigned64)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{arg} must be an integer array or a sequence of ints, not {type(value).__name__}")
    if not traced and all(type(v) is int for v in value):  # one int per row: the common case, quickly
        flat: list[Any] = list(value)
    else:
        if _has_non_int(value):
            raise TypeError(f"{arg} must hold integers, got {value!r}")
        if len({len(row) if _nested(row) else -1 for row in value}) > 1:
            raise ValueError(f"{arg} must be rectangular: every row needs the same length")
        flat = [] if traced else [int(v) for v in _flatten(value)]
    span = (min(flat), max(flat)) if flat else None
    for number in span or ():
        _fits(number, env, arg)

    def make() -> Any:
        return xp.asarray(value, dtype=env.index, device=env.device)

    try:
        known = None if traced else _numpy_of(value)
    except ValueError:  # ragged below the first axis
        raise ValueError(f"{arg} must be rectangular: every row needs the same length") from None
    if known is None:  # while tracing (or without NumPy) there is no host copy: the array now
        return GivenIntegers(make(), None)
    return GivenIntegers(None, known, make=make, shape=known.shape, span=span)


def _numpy_of(value: Any) -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - the host view is an optimisation only
        return None
    return np.asarray(value, dtype=np.int64)


def _nested(value: Any) -> bool:
    """A sequence to look into: a string is one too, of itself, forever."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _flatten(value: Any) -> Any:
    for item in value:
        if _nested(item):
            yield from _flatten(item)
        else:
            yield item


def _has_non_int(value: Any) -> bool:
    if _nested(value):
        return any(_has_non_int(v) for v in value)
    if isinstance(value, bool):
        return True
    return not isinstance(value, int) and not hasattr(value, "__index__")  # int first: SymInts too
