"""cos and sin of position x frequency, formed on the arrays' own device from integer positions.

Only shapes, dtypes and devices are read, never position values, so this runs under
``torch.compile``, ``jax.jit`` and ``mx.compile``, and never waits on a GPU. Positions are any
integers of any integer dtype, negative ones included. Two methods (chosen per device by
:func:`anyrope._compat.environment`):

"float64"
    the device's float64 cos and sin of the angle formed in float64, one cast at the end. Below
    2**21 the angle is ``p * theta`` as any float64 code forms it; above, ``p`` is split into
    21-bit parts whose angles ``2**21 * theta`` and ``2**42 * theta`` are reduced modulo 2 pi
    exactly on the host, so even 2**63 is within 1e-8 rad (``float(p) * theta`` would be off by
    thousands of radians there).
"digits"
    for devices without float64 (JAX without x64, Apple GPUs, torch MPS) and for MLX, whose
    float64 trigonometry is float32-accurate. A position's magnitude is split into base-256
    digits, ``m = sum_j d_j 256**j``; the cos and sin of ``d * 256**j * theta`` for every digit
    value are host tables reduced modulo 2 pi in exact integer arithmetic (:mod:`._exact`), and
    the device adds the digits' angles with ``cos(a + b) = cos a cos b - sin a sin b``. A digit 0
    contributes exactly (1, 0), so position 2**31 costs three float32 additions (about 3e-7).
    Every table index is a digit, so no input can make one leave its table.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

from ._cache import table_cache
from ._compat import Environment, float64_scope, is_library, take_rows
from ._dtypes import int_info
from ._exact import turns, two_pi

__all__ = [
    "SPLIT_BITS", "cos_sin", "cos_sin_of_angles", "index_positions", "level_steps", "split_levels",
]  # fmt: skip

RADIX_BITS = 8
RADIX = 1 << RADIX_BITS
ROWS = RADIX + 1  # the lowest level also takes digit + 1 (negative positions, below)


def index_positions(xp: Any, env: Environment, positions: Any, wrapped: Any = None) -> tuple[Any, Any]:
    """Positions in the device's widest signed integer dtype, and where the cast wrapped.

    Unsigned integers as wide as that dtype wrap to negatives (2**64 - 1 becomes -1); the second
    value marks them (None if none can), and the angles add ``2**bits * theta`` back. So do
    signed positions that wrapped as they were formed (``wrapped``, given in that dtype).
    """
    dtype = positions.dtype
    if dtype == env.index:
        return positions, wrapped
    bits, signed = int_info(xp, dtype)
    if bits > env.index_bits:
        raise TypeError(
            f"positions of dtype {dtype} are wider than {env.index} on {env.library}; "
            "cast them to int32 (JAX: or enable x64)"
        )
    widened = xp.astype(positions, env.index)
    if signed or bits < env.index_bits:
        return widened, None
    return widened, widened < 0


def cos_sin(
    xp: Any,
    env: Environment,
    positions: Any,
    inv_freq: tuple[float, ...],
    *,
    dtype: Any,
    traced: bool = False,
    wrapped: Any = None,
) -> tuple[Any, Any]:
    """``cos(p * theta)`` and ``sin(p * theta)``, shape ``positions.shape + (len(inv_freq),)``, in dtype
    (float32 or float64; the caller casts further). ``traced``: the call is being traced, so
    nothing made here may be kept; ``wrapped``: where signed positions wrapped past the index
    dtype (see :meth:`anyrope._positions.PositionSpec.wrapped`), or None."""
    signed, wrapped = index_positions(xp, env, positions, wrapped)
    wide = dtype == getattr(xp, "float64", None)
    if env.angles == "float64":
        return _by_float64(xp, env, signed, wrapped, inv_freq, dtype=dtype, traced=traced)
    with float64_scope(xp) if wide else _nothing():
        return _by_digits(xp, env, signed, wrapped, inv_freq, dtype=dtype, traced=traced)


def cos_sin_of_angles(
    xp: Any, env: Environment, positions: Any, inv_freq: Any, *, dtype: Any, wrapped: Any = None
) -> tuple[Any, Any]:
    """cos and sin for frequencies that are themselves device arrays (DynamicNTK under tracing):
    the product in float64 where the device has it, else in float32, as transformers does."""
    signed, wrapped = index_positions(xp, env, positions, wrapped)
    work = xp.float64 if env.float64 else xp.float32
    with float64_scope(xp) if env.float64 else _nothing():
        angles = _as_float(xp, env, signed, wrapped, work)[..., None] * xp.astype(inv_freq, work)
        return xp.astype(xp.cos(angles), dtype), xp.astype(xp.sin(angles), dtype)


def _nothing() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _as_float(xp: Any, env: Environment, signed: Any, wrapped: Any, work: Any) -> Any:
    value = xp.astype(signed, work)
    if wrapped is not None:
        value = value + xp.astype(wrapped, work) * float(2**env.index_bits)
    return value


SPLIT_BITS = 21  # parts below 2**21, so each part's angle is within 2**21 * 2 pi * 2**-53 of exact


def split_levels(bits: int) -> int:
    """How many SPLIT_BITS-bit parts the magnitude of a signed ``bits``-bit integer has."""
    return -(-(bits - 1) // SPLIT_BITS)


def level_steps(inv_freq: tuple[float, ...], levels: int) -> list[tuple[float, ...]]:
    """Per level ``j``, the angle of ``2**(SPLIT_BITS j)`` positions for each frequency, reduced
    modulo 2 pi exactly (level 0: the frequencies themselves)."""
    return [inv_freq, *(turns(1 << (SPLIT_BITS * j), inv_freq) for j in range(1, levels))]


def _by_float64(
    xp: Any,
    env: Environment,
    signed: Any,
    wrapped: Any,
    inv_freq: tuple[float, ...],
    *,
    dtype: Any,
    traced: bool,
) -> tuple[Any, Any]:
    f64 = xp.float64
    levels = split_levels(env.index_bits)

    unsigned = wrapped is not None

    def build() -> tuple[Any, Any]:
        steps = level_steps(inv_freq, levels)
        # Only for unsigned positions that wrapped: 2**64 positions' angle is reduced from a
        # number beyond what a tracer's integer arithmetic keeps exactly.
        back = (
            xp.asarray(turns(1 << env.index_bits, inv_freq), dtype=f64, device=env.device)
            if unsigned
            else None
        )
        return xp.asarray(steps, dtype=f64, device=env.device), back

    # Row j: the angle of 2**(21 j) positions, reduced exactly; back: that of 2**bits positions.
    key = ("float64", inv_freq, unsigned)
    steps, back = _constant(xp, env, key, build, levels + 1, traced)
    freqs = steps[0, :]
    negative = signed < 0
    magnitude = xp.where(negative, -1 - signed, signed)  # ~p for negatives: never overflows
    low = xp.astype(magnitude & ((1 << SPLIT_BITS) - 1), f64)[..., None] * freqs
    high = magnitude >> SPLIT_BITS
    for level in range(1, levels):
        part = (high >> (SPLIT_BITS * (level - 1))) & ((1 << SPLIT_BITS) - 1)
        low = xp.astype(part, f64)[..., None] * steps[level, :] + low  # exactly low where the part is 0
    angles = xp.where(negative[..., None], -(low + freqs), low)  # angle(-1 - m) = -(m + 1) theta
    if wrapped is not None:
        angles = angles + xp.astype(wrapped, f64)[..., None] * back
    return xp.astype(xp.cos(angles), dtype), xp.astype(xp.sin(angles), dtype)


def _constant(
    xp: Any,
    env: Environment,
    key: tuple[Any, ...],
    build: Callable[[], tuple[Any, Any]],
    rows: int,
    traced: bool,
) -> tuple[Any, Any]:
    """Small constant device arrays of ``rows`` float64 rows per frequency, made once per device."""
    return table_cache.constant(xp, env, key, build, nbytes=8 * rows * len(key[1]), traced=traced)


def _by_digits(
    xp: Any,
    env: Environment,
    signed: Any,
    wrapped: Any,
    inv_freq: tuple[float, ...],
    *,
    dtype: Any,
    traced: bool,
) -> tuple[Any, Any]:
    bits = int_info(xp, signed.dtype)[0]
    levels = -(-(bits - 1) // RADIX_BITS)  # magnitudes have bits - 1 bits
    cos_rows, sin_rows = digit_tables(xp, env, inv_freq, levels, dtype, traced)
    shape, pairs = tuple(signed.shape), len(inv_freq)
    count = math.prod(shape)
    flat = xp.reshape(signed, (count,))
    negative = flat < 0
    magnitude = xp.where(negative, -1 - flat, flat)  # ~p for negatives: never overflows
    columns = [(magnitude & (RADIX - 1)) + xp.astype(negative, env.index)]
    columns += [((magnitude >> (RADIX_BITS * j)) & (RADIX - 1)) + j * ROWS for j in range(1, levels)]
    index = xp.reshape(xp.stack(columns, axis=1), (count * levels,))
    cos = xp.reshape(take_rows(xp, cos_rows, index), (count, levels, pairs))
    sin = xp.reshape(take_rows(xp, sin_rows, index), (count, levels, pairs))
    c, s = cos[:, 0, :], sin[:, 0, :]
    for j in range(1, levels):
        c, s = _add(c, s, cos[:, j, :], sin[:, j, :])
    s = xp.where(negative[:, None], -s, s)  # angle(p) = -(m + 1) theta for p = -1 - m
    if wrapped is not None:

        def wrap() -> tuple[Any, Any]:
            cos_sin = _wrap_turn(inv_freq, env.index_bits)
            return xp.asarray(cos_sin[0], dtype=dtype, device=env.device), xp.asarray(
                cos_sin[1], dtype=dtype, device=env.device
            )

        cw, sw = _constant(xp, env, ("wrap", inv_freq, dtype), wrap, 2, traced)
        moved_c, moved_s = _add(c, s, cw, sw)
        back = xp.reshape(wrapped, (count,))[:, None]
        c, s = xp.where(back, moved_c, c), xp.where(back, moved_s, s)
    return xp.reshape(c, (*shape, pairs)), xp.reshape(s, (*shape, pairs))


def _add(c: Any, s: Any, c2: Any, s2: Any) -> tuple[Any, Any]:
    """cos and sin of the sum of two angles from theirs."""
    return c * c2 - s * s2, s * c2 + c * s2


def _wrap_turn(inv_freq: tuple[float, ...], bits: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    angles = turns(1 << bits, inv_freq)
    return tuple(math.cos(a) for a in angles), tuple(math.sin(a) for a in angles)


@functools.lru_cache(maxsize=16)
def host_digit_tables(
    inv_freq: tuple[float, ...], levels: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Rows ``j * ROWS + d``: cos and sin of ``d * RADIX**j * theta`` for each frequency, each angle
    reduced exactly (fixed point with 256 fraction bits) before its one rounding."""
    bits = 256
    modulus = two_pi(bits)
    cos_rows: list[list[float]] = []
    sin_rows: list[list[float]] = []
    for j in range(levels):
        steps = [_fixed(RADIX**j, theta, bits) % modulus for theta in inv_freq]
        for d in range(ROWS):
            angles = [(d * step) % modulus / (1 << bits) for step in steps]
            cos_rows.append([math.cos(a) for a in angles])
            sin_rows.append([math.sin(a) for a in angles])
    return cos_rows, sin_rows


def _fixed(n: int, theta: float, bits: int) -> int:
    numerator, denominator = float(theta).as_integer_ratio()
    shift = denominator.bit_length() - 1
    if shift > bits:  # a frequency below 2**-200: its angles are 0 to any float's precision
        return (n * numerator) >> (shift - bits)
    return (n * numerator) << (bits - shift)


def digit_tables(
    xp: Any, env: Environment, inv_freq: tuple[float, ...], levels: int, dtype: Any, traced: bool
) -> tuple[Any, Any]:
    """The digit tables on the device, cached there (never while tracing: nothing traced is kept,
    and dynamo could not read the cache's keys)."""
    if traced and is_library(xp, "torch"):
        return _traced_torch_tables(inv_freq, levels, dtype, env.device)

    def build() -> tuple[Any, Any]:
        cos_rows, sin_rows = host_digit_tables(inv_freq, levels)
        return xp.asarray(cos_rows, dtype=dtype, device=env.device), xp.asarray(
            sin_rows, dtype=dtype, device=env.device
        )

    return _constant(xp, env, ("digits", inv_freq, levels, dtype), build, levels * ROWS, traced)


def _traced_torch_tables(
    inv_freq: tuple[float, ...], levels: int, dtype: Any, device: Any
) -> tuple[Any, Any]:
    """The tables built inside a torch trace from small constants (dynamo takes minutes over a
    constant of many thousand floats): each level's exact step angle, times every digit, in
    float64 on the CPU (2e-13 rad off, far below float32), then moved to the device."""
    import torch

    steps = [list(turns(RADIX**j, inv_freq)) for j in range(levels)]
    step = torch.tensor(steps, dtype=torch.float64)  # (levels, pairs)
    digits = torch.arange(ROWS, dtype=torch.float64)
    angles = torch.remainder(digits[None, :, None] * step[:, None, :], 2 * math.pi)
    rows = (levels * ROWS, len(inv_freq))
    return (
        torch.cos(angles).reshape(rows).to(device=device, dtype=dtype),
        torch.sin(angles).reshape(rows).to(device=device, dtype=dtype),
    )
