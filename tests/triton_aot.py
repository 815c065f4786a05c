"""Compile the Triton kernel ahead of time for NVIDIA GPUs (PTX, then ptxas to cubin), as
``triton.compile`` does on a GPU machine, for each angle mode, dtype and layout it has.

Triton's interpreter runs the kernel's Python on NumPy and misses what only the compiler checks
(types, globals, what the language allows). Run as a script, without ``TRITON_INTERPRET``:
``python tests/triton_aot.py`` prints the number of kernels built.
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from anyrope._angles import SPLIT_BITS
from anyrope._kernel_angles import OFFSET, POSITIONS, STARTS, TABLES
from anyrope._kernels import _triton

POINTERS = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "float64": "*fp64"}
# (dtype, angle mode, multi-axis, half layout): every mode and every dtype at least once
VARIANTS = [
    ("bfloat16", POSITIONS, True, True),
    ("bfloat16", TABLES, False, False),
    ("float16", OFFSET, False, False),
    ("float32", STARTS, False, True),
    ("float32", POSITIONS, False, False),
    ("float64", TABLES, False, True),
    ("float64", OFFSET, False, True),
]
ARCHITECTURES = (80, 90)  # A100, H100


def signature(names: list[str], dtype: str) -> dict[str, str]:
    tables = "*fp64" if dtype == "float64" else "*fp32"
    kinds = {
        "x_ptr": POINTERS[dtype],
        "out_ptr": POINTERS[dtype],
        "y_ptr": POINTERS[dtype],
        "y_out_ptr": POINTERS[dtype],
        "steps_ptr": "*fp64",
        "streams_ptr": "*i32",
    }
    kinds |= {"cos_ptr": tables, "sin_ptr": tables, "index_ptr": "*i64"}
    return {n: kinds.get(n, "constexpr" if n.isupper() else "i64") for n in names}


def main() -> int:
    kernel = _triton._rotate_kernel
    names = kernel.arg_names
    built = 0
    for dtype, mode, multi, half in VARIANTS:
        constants = {
            "PAIRS": 48, "PAIRS_P2": 64, "TAIL_P2": 32, "MODE": mode, "MULTI": multi, "HALF": half,
            "INVERSE": mode == TABLES, "SCALED": mode != TABLES, "COPY_TAIL": True,
            "WIDE": dtype == "float64", "BF16": dtype == "bfloat16", "SPLIT": SPLIT_BITS, "MASK": (1 << SPLIT_BITS) - 1,
            "BLOCK_S": 32, "HEADS": 8, "TWO": mode != TABLES,
        }  # fmt: skip
        source = ASTSource(
            fn=kernel,
            signature=signature(names, dtype),
            constexprs={(names.index(k),): v for k, v in constants.items()},
        )
        for arch in ARCHITECTURES:
            compiled = triton.compile(
                source, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": False}
            )
            assert compiled.asm["cubin"], f"no cubin for {dtype}, mode {mode}, sm_{arch}"
            built += 1
    print(built)
    return 0


if __name__ == "__main__":
    sys.exit(main())
