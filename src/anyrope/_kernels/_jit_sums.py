"""Sums of a row's squares in SIMD vectors, for the fused prologue's norm (:mod:`._jit_prologue`).

NumPy and torch sum a row lane by lane: NumPy's pairwise sum keeps eight accumulators, torch's
vectorised reduction four vectors of as many lanes as the CPU's registers hold. A vector add is
each lane's own IEEE add, so the same vertical sums done in LLVM vector types are those libraries'
own sums bit for bit, where the scalar loop that spells out their order (which LLVM does not
vectorise: its adds may not be reordered) took five times as long. Only the vertical part is
here; the caller adds the lanes together in its library's order.

Written as a numba intrinsic (LLVM IR): numba has no vector type, and its loops over arrays
carry index checks that keep LLVM's vectoriser from packing the loads.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._jit import _HARDWARE_HALF, BFLOAT16

__all__ = ["vertical_sums"]


def vertical_sums(lanes: int, accumulators: int) -> Any:
    """An intrinsic ``sums(row, start, vectors, storage)``: the squares of ``vectors`` vectors of
    ``lanes`` values of a contiguous 1-D ``row`` from ``start``, added lane by lane into
    ``accumulators`` vector sums in turn (the vectors past the last whole group into the first),
    then those added in order, ``((a0 + a1) + a2) + a3``; returned as a tuple of ``lanes`` floats.
    Float32 and float64 rows are squared as they are, 16-bit floats (int16 bits, ``storage`` a
    :mod:`._jit` code saying which) after widening to float32. Not for float16 kept as bits where
    the CPU has no conversion instruction: the caller sums those with scalar code."""

    @intrinsic
    def sums(typingctx: Any, row: Any, start: Any, vectors: Any, storage: Any) -> Any:  # noqa: ARG001
        if not (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C"):
            return None
        wide = row.dtype == types.float64
        found = types.UniTuple(types.float64 if wide else types.float32, lanes)  # type: ignore[no-untyped-call,unused-ignore]
        signature = found(row, types.intp, types.intp, types.intp)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            row_value, first, count, code = args
            data = context.make_array(sig.args[0])(context, builder, row_value).data
            stored = context.get_value_type(sig.args[0].dtype)
            vector = ir.VectorType(ir.DoubleType() if wide else ir.FloatType(), lanes)
            loaded_type = ir.VectorType(stored, lanes).as_pointer()
            alignment = sig.args[0].dtype.bitwidth // 8
            intp = first.type

            def square(index: Any) -> Any:
                pointer = builder.bitcast(builder.gep(data, [index]), loaded_type)
                value = _widened(builder, builder.load(pointer, align=alignment), vector, code)
                return builder.fmul(value, value)

            zero = ir.Constant(vector, [0.0] * lanes)
            sums = [cgutils.alloca_once_value(builder, zero) for _ in range(accumulators)]  # type: ignore[no-untyped-call,unused-ignore]
            group = ir.Constant(intp, accumulators)
            whole = builder.sub(count, builder.srem(count, group))

            def add(into: Any, vector_index: Any) -> None:
                at = builder.add(first, builder.mul(vector_index, ir.Constant(intp, lanes)))
                builder.store(builder.fadd(builder.load(into), square(at)), into)

            with cgutils.for_range_slice(builder, ir.Constant(intp, 0), whole, group) as (m, _):
                for r, into in enumerate(sums):
                    add(into, builder.add(m, ir.Constant(intp, r)))
            with cgutils.for_range_slice(builder, whole, count, ir.Constant(intp, 1)) as (m, _):
                add(sums[0], m)
            total = builder.load(sums[0])
            for into in sums[1:]:
                total = builder.fadd(total, builder.load(into))
            lane_values = [
                builder.extract_element(total, ir.Constant(ir.IntType(32), i)) for i in range(lanes)
            ]
            return context.make_tuple(builder, sig.return_type, lane_values)

        return signature, codegen

    return sums


def _widened(builder: Any, loaded: Any, vector: Any, code: Any) -> Any:
    """Loaded values as floats: float32/float64 as they are; int16 bits as bfloat16's or (where
    the CPU converts them) float16's, chosen by ``code`` (a constant LLVM folds)."""
    if not isinstance(loaded.type.element, ir.IntType):
        return loaded
    words = ir.VectorType(ir.IntType(32), vector.count)
    shifted = builder.shl(builder.zext(loaded, words), ir.Constant(words, [16] * vector.count))
    brain = builder.bitcast(shifted, vector)
    if not _HARDWARE_HALF:
        return brain
    half = builder.fpext(builder.bitcast(loaded, ir.VectorType(ir.HalfType(), vector.count)), vector)
    return builder.select(builder.icmp_signed("==", code, ir.Constant(code.type, BFLOAT16)), brain, half)
