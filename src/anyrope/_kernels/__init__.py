"""The registered kernels, in the order they are tried (see :mod:`anyrope._registry`), each
declared by everything it takes (see :class:`anyrope._job.Kernel`).

Each module imports its library only when it runs, so importing this imports no backend.
"""

from __future__ import annotations

from typing import TypedDict

from .._fusion import Fusion
from .._job import ANY, SOURCES, Kernel
from . import cupy_cuda, generic, mlx_compiled, numba_cpu, numba_prologue, numpy_cpu, pair_words, triton_cuda

__all__ = ["FUSIONS", "REGISTRY"]

BOTH = frozenset({"half", "interleaved"})
FLOATS = frozenset({"float32", "float64"})


class _Fused(TypedDict):
    """What the fused GPU kernels declare alike (typed, so that ``**FUSED`` is checked)."""

    sources: frozenset[str]
    device_frequencies: bool
    unsigned64: bool
    table_grad: bool
    needs_float64: bool


# They form angles from positions with fixed frequencies, by the float64 scheme on 64-bit
# integers (see anyrope._kernel_angles), or read the caller's tables.
FUSED: _Fused = {
    "sources": frozenset({"offset", "row-offsets", "positions", "multi-axis", "tables"}),
    "device_frequencies": False,
    "unsigned64": False,
    "table_grad": False,
    "needs_float64": True,
}

REGISTRY: tuple[Kernel, ...] = (
    Kernel(
        name="triton",
        summary="one Triton pass over q and k that reads each token's row of the cached prefix table "
        "at an int offset, or forms its angles in the kernel from the positions (float64, exactly "
        "reduced steps), and reads and writes each pair once; a torch Triton op, so torch.compile traces it and launches the kernel from its own "
        "code, CUDA graphs capture it, and its "
        "gradient is the inverse rotation through the same op; torch.export records the generic "
        "code instead, standard operators that every runtime knows",
        libraries=frozenset({"torch"}),
        devices=triton_cuda.DEVICES,
        layouts=BOTH,
        dtypes=FLOATS | {"float16", "bfloat16"},
        inplace=True,
        traceable=True,
        differentiable=True,
        prepare=triton_cuda.prepare,
        prepare_pair=triton_cuda.prepare_pair,
        prepare_traced=triton_cuda.prepare_traced,
        prepare_pair_traced=triton_cuda.prepare_pair_traced,
        requires=("triton",),
        # Not torch.export: an exported program holding anyrope's op loads only where anyrope is
        # imported, ONNX has no such operator, and AOTInductor's package of it crashed at load
        # (torch 2.11, CUDA).
        tracers=frozenset({"torch.compile", "other"}),
        **FUSED,
    ),
    Kernel(
        name="cupy",
        summary="the same pass in CUDA C for CuPy arrays (rope.cu, compiled by NVRTC without fused "
        "multiply-adds): a thread per token and 16 bytes of pairs reads or forms their angles once "
        "and rotates them in a group of heads, 16 bytes per access",
        libraries=frozenset({"cupy"}),
        devices=ANY,
        layouts=BOTH,
        dtypes=FLOATS | {"float16"},
        inplace=True,
        traceable=False,
        differentiable=False,
        prepare=cupy_cuda.prepare,
        prepare_pair=cupy_cuda.prepare_pair,
        **FUSED,
    ),
    Kernel(
        name="numba",
        summary="one parallel numba pass that reads each token's table row (each pair's cos and sin "
        "side by side) by position, q and k of a call in one launch (16-bit floats widened in "
        "registers); torch gradients through an autograd.Function, and under torch.compile, for "
        "calls of more than one token, a torch op of its own that inductor calls between its "
        "kernels, its gradient the inverse rotation through the same op",
        libraries=frozenset({"numpy", "torch"}),
        devices=frozenset({"cpu"}),
        layouts=BOTH,
        dtypes=FLOATS | {"float16", "bfloat16"},
        inplace=True,
        traceable=True,
        # Only dynamo's trace: torch.export programs keep to standard operators, and torch.func
        # transforms would need the op's vmap rule.
        tracers=frozenset({"torch.compile"}),
        # A decode step under torch.compile is little work to rotate: the operator's
        # fixed cost (dispatch, NumPy views, waking numba's threads) took longer than inductor's code.
        traced_one_token=False,
        differentiable=True,
        prepare=numba_cpu.prepare,
        prepare_pair=numba_cpu.prepare_pair,
        prepare_traced=numba_cpu.prepare_traced,
        requires=("numba",),
        strided_out=False,
        table_grad=False,
    ),
    Kernel(
        name="pair-words",
        summary="interleaved pairs read and written as one integer word each (float32 as int64, "
        "bfloat16 as int32: widened by a shift and rounded to nearest even in integers), so that "
        "inductor vectorises the loop its generic code writes as scalars (the same result bit for bit)",
        libraries=frozenset({"torch"}),
        devices=frozenset({"cpu"}),
        layouts=frozenset({"interleaved"}),
        dtypes=frozenset({"float32", "bfloat16"}),
        inplace=True,
        traceable=True,
        # No gradients: a bitcast has none. Only dynamo's trace, so only inductor compiles it:
        # torch.export programs are read by runtimes (ONNX among them) without a bitcast.
        differentiable=False,
        tracers=frozenset({"torch.compile"}),
        eager=False,
        prepare=pair_words.prepare,
        # The caller's tables may be in any dtype, and the generic code rotates in theirs.
        sources=frozenset(SOURCES) - {"tables"},
    ),
    Kernel(
        name="numpy-complex",
        summary="interleaved pairs as complex numbers: one complex multiply",
        libraries=frozenset({"numpy"}),
        devices=frozenset({"cpu"}),
        layouts=frozenset({"interleaved"}),
        dtypes=FLOATS,
        inplace=True,
        traceable=False,
        differentiable=False,
        prepare=numpy_cpu.prepare_complex,
        prepare_pair=numpy_cpu.prepare_pair_complex,
        strided_out=False,
    ),
    Kernel(
        name="numpy-blocked",
        summary="half pairs in cache-sized blocks with preallocated outputs",
        libraries=frozenset({"numpy"}),
        devices=frozenset({"cpu"}),
        layouts=frozenset({"half"}),
        dtypes=FLOATS,
        inplace=True,
        traceable=False,
        differentiable=False,
        prepare=numpy_cpu.prepare_blocked,
        prepare_pair=numpy_cpu.prepare_pair_blocked,
        strided_out=False,
    ),
    Kernel(
        name="mlx-compiled",
        summary="pairs as a length-2 axis read backwards: one elementwise expression under mx.compile",
        libraries=frozenset({"mlx"}),
        devices=ANY,
        layouts=BOTH,
        dtypes=ANY,
        inplace=False,
        traceable=True,
        differentiable=True,
        prepare=mlx_compiled.prepare,
    ),
    Kernel(
        name="generic",
        summary="array-API operations only: every library, device, dtype and transformation",
        libraries=ANY,
        devices=ANY,
        layouts=BOTH,
        dtypes=ANY,
        inplace=True,
        traceable=True,
        differentiable=True,
        prepare=generic.prepare,
    ),
)


#: The fused attention prologues (see :mod:`anyrope._fusion`), in the order they are tried.
FUSIONS: tuple[Fusion, ...] = (
    Fusion(
        name="numba",
        summary="one numba call: a parallel pass normalising each head of q and k (the sum of "
        "squares in the library's own order, in SIMD vectors), rotating it at its table row, "
        "rounded where the steps apart round, then one writing k and v into the cache at each "
        "token's place",
        libraries=frozenset({"numpy", "torch"}),
        devices=frozenset({"cpu"}),
        dtypes=FLOATS | {"float16", "bfloat16"},
        longest_head=numba_prologue.LONGEST_HEAD,
        prepare=numba_prologue.prepare,
        requires=("numba",),
        # a decode step of 32 sequences: 57 us fused, 35 apart (the cache is written from k's
        # output either way: the fusion saves no pass over memory, and the call's Python costs more)
        needs_norm=True,
        refuses=numba_prologue.refuses,
    ),
    Fusion(
        name="triton",
        summary="one Triton launch per call for torch CUDA tensors: each head of q and k read once, "
        "normalised, rotated by the rotation kernel's angles and rounded where the steps apart "
        "round, and k and v written into the cache at places read on the device; it sums a head's "
        "squares in Triton's order, not torch's, so q and k are within a few units in the last "
        "place of each head's largest value, not bit for bit",
        libraries=frozenset({"torch"}),
        devices=triton_cuda.DEVICES,
        dtypes=FLOATS | {"float16", "bfloat16"},
        longest_head=triton_cuda.LONGEST_HEAD,
        prepare=triton_cuda.prepare_prologue,
        requires=("triton",),
        device_places=True,
        exact=False,
    ),
)
