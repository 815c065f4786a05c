"""The numba kernels themselves; imported only once numba is known to be installed.

Arrays arrive in a canonical five-axis form: x and out are (batch, lead, seq, trail, head_dim),
the table is (length, 2 * pairs), each pair's cos and sin side by side (read as one stream, in
x's pair order: faster than two tables), and positions (1 or batch, seq) rows of it.
Each pair is read before it is written, so out may be x itself. One launch takes two arrays (q
and k), each row turned by one inlined helper, :func:`_turn`, given its indices and the pair
count: a helper that worked them out itself, or a loop that chose between the two arrays per
element, kept LLVM from vectorising the inner loop.

16-bit floats travel as int16 bits (a dtype torch can view them as), are widened to float32 in
registers and rounded to nearest even once on the way out, bit for bit as NumPy's and torch's
casts (NaN payloads aside). Each kernel is built by :func:`rotations` for one storage code and
layout, plain ints its closure captures: numba folds them as constants, and keys its on-disk
cache by them (a captured function would get a new key in every process, and be compiled again
each time).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import binding, ir
from numba.core import types
from numba.extending import intrinsic

__all__ = ["STORAGES", "rotations"]

FLOAT, FLOAT16_HARDWARE, FLOAT16_BITS, BFLOAT16 = 0, 1, 2, 3

# float16 by LLVM's fpext/fptrunc where the CPU converts in one vector instruction (x86 with
# F16C, 64-bit ARM): twice the speed of the bit arithmetic. Elsewhere LLVM would call a runtime
# helper that numba's JIT may not link, so the bit arithmetic runs instead.
_HARDWARE_HALF = platform.machine().lower() in ("arm64", "aarch64") or (
    "+f16c" in binding.get_host_cpu_features().flatten()
)
STORAGES = {
    "float": FLOAT,
    "float16": FLOAT16_HARDWARE if _HARDWARE_HALF else FLOAT16_BITS,
    "float16-bits": FLOAT16_BITS,
    "bfloat16": BFLOAT16,
}

u32, f32 = np.uint32, np.float32
inline = numba.njit(inline="always")


def _conversion(result: Any, argument: Any, emit: Callable[[Any, Any], Any]) -> Any:
    @intrinsic
    def convert(typingctx: Any, value: Any) -> Any:  # noqa: ARG001 - numba's intrinsic protocol
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:  # noqa: ARG001
            return emit(builder, args[0])

        return result(argument), codegen

    return convert


_half_to_float = _conversion(
    types.float32, types.int16, lambda b, h: b.fpext(b.bitcast(h, ir.HalfType()), ir.FloatType())
)
_float_to_half = _conversion(
    types.int16, types.float32, lambda b, v: b.bitcast(b.fptrunc(v, ir.HalfType()), ir.IntType(16))
)


@inline
def _as_float(bits: Any) -> Any:  # pragma: no cover - numba widens uint32 arithmetic to 64 bits
    return u32(bits).view(f32)


# The bit-arithmetic float16 conversions are branch-free (selects), so LLVM can vectorise them.
@inline
def _half_bits_to_float(h: Any) -> Any:  # pragma: no cover
    bits = u32(h) & u32(0xFFFF)  # int16 widens with its sign
    rest = bits & u32(0x7FFF)
    # rest << 13 is the float32 of value * 2**-112, subnormals included: scale it back exactly
    finite = f32(_as_float(rest << u32(13)) * f32(2.0**112)).view(u32)
    special = u32(0x7F800000) | ((rest & u32(0x3FF)) << u32(13))  # inf, NaN
    return _as_float(((bits & u32(0x8000)) << u32(16)) | u32(special if rest >= u32(0x7C00) else finite))


@inline
def _float_to_half_bits(v: Any) -> Any:  # pragma: no cover
    bits = f32(v).view(u32)
    mag = bits & u32(0x7FFFFFFF)
    # normal results: rebias the exponent, round the 13 dropped bits to nearest even
    normal = u32(u32(mag + u32(0xFFF) + ((mag >> u32(13)) & u32(1)) - u32(0x38000000)) >> u32(13))
    # below 2**-14: adding 0.5 makes the FPU round the subnormal's bits into place
    tiny = u32(f32(_as_float(mag) + f32(0.5)).view(u32) - u32(0x3F000000))
    special = u32(0x7E00) if mag > u32(0x7F800000) else u32(0x7C00)  # NaN, or too big: inf
    finite = tiny if mag < u32(0x38800000) else normal
    return np.int16(((bits >> u32(16)) & u32(0x8000)) | (special if mag >= u32(0x47800000) else finite))


@inline
def _bfloat16_to_float(h: Any) -> Any:  # pragma: no cover
    return _as_float(u32(h) << u32(16))  # the sign-extended top half is shifted out


@inline
def _float_to_bfloat16(v: Any) -> Any:  # pragma: no cover
    bits = f32(v).view(u32)
    if (bits & u32(0x7FFFFFFF)) > u32(0x7F800000):
        return np.int16(0x7FC0)
    return np.int16((bits + u32(0x7FFF) + ((bits >> u32(16)) & u32(1))) >> u32(16))


@inline
def load(v: Any, storage: int) -> Any:  # pragma: no cover - storage is a constant: one branch remains
    if storage == FLOAT16_HARDWARE:
        return _half_to_float(v)
    if storage == FLOAT16_BITS:
        return _half_bits_to_float(v)
    if storage == BFLOAT16:
        return _bfloat16_to_float(v)
    return v


@inline
def store(v: Any, storage: int) -> Any:  # pragma: no cover
    if storage == FLOAT16_HARDWARE:
        return _float_to_half(v)
    if storage == FLOAT16_BITS:
        return _float_to_half_bits(v)
    if storage == BFLOAT16:
        return _float_to_bfloat16(v)
    return v


# The kernels' two layouts, as the constant each captures.
HALF, INTERLEAVED = 0, 1


@inline
def _where(row: Any, lead: Any, seq: Any) -> Any:  # pragma: no cover
    """The (batch, lead, seq) indices of a row of a five-axis array."""
    return row // (lead * seq), (row // seq) % lead, row % seq


@inline
def _turn(
    x: Any,
    out: Any,
    copy_tail: bool,
    table: Any,
    sign: Any,
    b: Any,
    a: Any,
    s: Any,
    p: Any,
    pairs: Any,
    storage: int,
    layout: int,
) -> None:  # pragma: no cover
    trail, width = x.shape[3], x.shape[4]
    for t in range(trail):
        for i in range(pairs):
            c = table[p, 2 * i]
            n = table[p, 2 * i + 1] * sign
            if layout == HALF:
                first = load(x[b, a, s, t, i], storage)
                second = load(x[b, a, s, t, i + pairs], storage)
                out[b, a, s, t, i] = store(first * c - second * n, storage)
                out[b, a, s, t, i + pairs] = store(second * c + first * n, storage)
            else:
                first = load(x[b, a, s, t, 2 * i], storage)
                second = load(x[b, a, s, t, 2 * i + 1], storage)
                out[b, a, s, t, 2 * i] = store(first * c - second * n, storage)
                out[b, a, s, t, 2 * i + 1] = store(second * c + first * n, storage)
        if copy_tail:
            for j in range(2 * pairs, width):
                out[b, a, s, t, j] = x[b, a, s, t, j]


def rotations(storage: int) -> dict[str, Callable[..., None]]:
    """The two layouts' kernels for one storage code (compiled, or loaded from numba's cache, on
    first call): ``kernel(x, out, copy_tail, y, out_y, copy_tail_y, table, positions, sign)``
    rotates x and y (q and k: one launch; y may have no rows) at the same (length, 2 * pairs)
    table (see :func:`anyrope._tables.side_by_side`) and (1 or batch, seq) positions;
    ``copy_tail``: whether out is not x, so that the features past the pairs are copied;
    ``sign`` -1.0 turns the other way (sin negated, exactly). Each is compiled parallel only:
    run on one thread (:func:`._numba.on_one_thread`), it is faster than numba's serial
    compilation of the same loop, which LLVM vectorised worse."""
    return {
        name: numba.njit(parallel=True, cache=True, nogil=True)(_rotate(storage, layout, name))
        for name, layout in (("half", HALF), ("interleaved", INTERLEAVED))
    }


def _rotate(storage: int, layout: int, name: str) -> Callable[..., None]:
    # Both arrays read the cached table directly at each token's position: no per-call tables
    # are gathered, which is most of the cost of a decode step.
    def rotate(
        x: Any,
        out: Any,
        copy_tail: bool,
        y: Any,
        out_y: Any,
        copy_tail_y: bool,
        table: Any,
        pos: Any,
        sign: Any,
    ) -> None:  # pragma: no cover
        per_batch, pairs = pos.shape[0] > 1, table.shape[1] // 2
        lead, seq, lead_y, seq_y = x.shape[1], x.shape[2], y.shape[1], y.shape[2]
        rows = x.shape[0] * lead * seq
        for row in numba.prange(rows + y.shape[0] * lead_y * seq_y):
            if row < rows:
                b, a, s = _where(row, lead, seq)
                p = pos[b if per_batch else 0, s]
                _turn(x, out, copy_tail, table, sign, b, a, s, p, pairs, storage, layout)
            else:
                b, a, s = _where(row - rows, lead_y, seq_y)
                p = pos[b if per_batch else 0, s]
                _turn(y, out_y, copy_tail_y, table, sign, b, a, s, p, pairs, storage, layout)

    rotate.__name__ = rotate.__qualname__ = name  # numba names its cache files after it
    return rotate
