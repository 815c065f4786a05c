"""Compile the Triton kernel ahead of time for NVIDIA GPUs (PTX, then ptxas to cubin), as
``triton.compile`` does on a GPU machine, for each angle mode, dtype and layout it has; then
read its launches as inductor does to learn which tensors they write, and check that the
interleaved layout reads and writes x with the half layout's vector instructions.

Triton's interpreter runs the kernel's Python on NumPy and misses what only the compiler checks
(types, globals, what the language allows). Inductor, launching the kernel from a compiled
graph, clones each tensor the kernel writes and takes the clone as the result: a tensor passed
as two written pointers would be cloned twice and one clone returned unwritten (a lone array
passes its arguments as the second array's too). Run as a script, without ``TRITON_INTERPRET``:
``python tests/triton_aot.py`` prints the number of kernels built, the launches read and the
dtypes whose memory accesses were compared.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections import Counter
from typing import Any

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


def build(dtype: str, arch: int, aligned: bool = False, **constants: object) -> Any:
    """The kernel compiled for ``sm_{arch}``; ``aligned``: its pointers and strides divisible by
    16, as a launch on contiguous rows of 128 features specialises them."""
    names = _triton._rotate_kernel.arg_names
    constants = {
        "INVERSE": False, "SCALED": False, "MULTI": False, "WIDE": dtype == "float64",
        "BF16": dtype == "bfloat16", "SPLIT": SPLIT_BITS, "MASK": (1 << SPLIT_BITS) - 1, "HEADS": 8,
    } | constants  # fmt: skip
    strides = [n for n in names if n.endswith("_ptr") or re.fullmatch(r"s[xyoc]\w*|si_row", n)]
    source = ASTSource(
        fn=_triton._rotate_kernel,
        signature=signature(names, dtype),
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in strides} if aligned else {},
    )
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": False})


def main() -> int:
    built = 0
    for dtype, mode, multi, half in VARIANTS:
        for arch in ARCHITECTURES:
            compiled = build(
                dtype, arch, PAIRS=48, PAIRS_P2=64, TAIL_P2=32, MODE=mode, MULTI=multi, HALF=half,
                INVERSE=mode == TABLES, SCALED=mode != TABLES, COPY_TAIL=True, BLOCK_S=32, TWO=mode != TABLES,
            )  # fmt: skip
            assert compiled.asm["cubin"], f"no cubin for {dtype}, mode {mode}, sm_{arch}"
            built += 1
    print(built, written_once(), vector_accesses(), prologue_kernels())
    return 0


# The fused prologue's launches (dtype, angle mode, multi-axis, half layout, norm rounding, places,
# paged, tokens, heads, features, rotated pairs): every dtype, mode, rounding and kind of places at
# least once, decode steps and prefills, and MLA's 576 features (64 rotated).
PROLOGUES = [
    ("bfloat16", POSITIONS, True, True, 1, 2, True, 1, 32, 128, 64),
    ("float32", OFFSET, False, False, 2, 1, False, 2048, 32, 128, 64),
    ("float64", TABLES, False, True, 0, 2, False, 7, 8, 64, 32),
    ("float16", STARTS, False, False, 1, 2, True, 64, 32, 80, 24),
    ("bfloat16", POSITIONS, False, False, 1, 2, True, 2048, 16, 576, 32),
    ("bfloat16", OFFSET, False, True, 2, 1, False, 1, 32, 576, 32),
]


def prologue_kernels() -> int:
    """The fused prologue's kernel (anyrope._kernels._triton_prologue) through Triton's compiler
    and ptxas for an H100, each launch tiled as the prologue tiles it (``tiles``): none spills
    registers. How many were built."""
    from ptx import ptxas_figures
    from triton import knobs

    from anyrope._kernels import _triton_prologue

    kernel = _triton_prologue._prologue_kernel
    names = kernel.arg_names
    built = 0
    for dtype, mode, multi, half, rounding, places, paged, seq, heads, width, pairs in PROLOGUES:
        tail = width - 2 * pairs
        tail_p2 = triton.next_power_of_2(tail) if tail else 0
        block_s, group, warps = _triton_prologue.tiles(
            seq, heads, 2 * triton.next_power_of_2(pairs) + tail_p2
        )
        constants = {
            "WIDTH": width, "V_WIDTH": width, "PAIRS": pairs, "PAIRS_P2": triton.next_power_of_2(pairs),
            "TAIL_P2": tail_p2, "V_P2": triton.next_power_of_2(width),
            "MODE": mode, "MULTI": multi, "HALF": half, "INVERSE": False, "SCALED": mode != TABLES,
            "WIDE": dtype == "float64", "BF16": dtype == "bfloat16", "NARROW": dtype in ("bfloat16", "float16"),
            "SPLIT": SPLIT_BITS, "MASK": (1 << SPLIT_BITS) - 1, "ROUNDING": rounding, "SHIFTED": rounding == 2,
            "PLACES": places, "PAGED": paged, "BLOCK_S": block_s, "HEADS": group,
        }  # fmt: skip
        arrays = ("q_ptr", "q_out_ptr", "wq_ptr", "k_ptr", "k_out_ptr", "wk_ptr", "v_ptr", "ck_ptr", "cv_ptr")
        kinds = signature(names, dtype) | dict.fromkeys(arrays, POINTERS[dtype])
        kinds |= {"place_ptr": "*i64", "numbers_ptr": "*fp64" if dtype == "float64" else "*fp32"}
        source = ASTSource(
            fn=kernel, signature=kinds, constexprs={(names.index(k),): v for k, v in constants.items()}
        )
        log = io.StringIO()
        with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
            knobs.compilation.always_compile = True  # a cached kernel would run no ptxas to log
            knobs.nvidia.dump_ptxas_log = True
            options = {"enable_fp_fusion": False, "num_warps": warps}
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        assert compiled.asm["cubin"], f"no cubin for the prologue in {dtype}"
        figures = ptxas_figures(log.getvalue())
        assert figures["spill_stores"] == 0, (dtype, seq, width, block_s, warps, figures)
        built += 1
    return built


def vector_accesses() -> int:
    """The interleaved layout's global loads and stores of x are the half layout's: vector
    instructions, none of one element (stride-2 accesses, which the kernel had, are not
    vectorised: 32 16-bit loads and 32 stores per head and block of tokens in bfloat16, and a
    prefill 5 to 6.7 times a copy on an H200). Compiled as a launch specialises them: strides and
    pointers divisible by 16."""
    checked = 0
    for dtype, scalar in (("bfloat16", "b16"), ("float32", "b32")):
        found = {}
        for half in (True, False):
            ptx = build(
                dtype, 90, aligned=True, PAIRS=64, PAIRS_P2=64, TAIL_P2=1, MODE=STARTS, HALF=half,
                COPY_TAIL=False, BLOCK_S=16, TWO=True,
            ).asm["ptx"]  # fmt: skip
            found[half] = Counter(re.findall(r"\b(?:ld|st)\.(?:global|shared)[.\w]*", ptx))
        stores = {k: v for k, v in found[False].items() if k.startswith("st.global")}
        assert stores == {k: v for k, v in found[True].items() if k.startswith("st.global")}, found
        one_element = rf"(?:ld|st)\.global(?:\.nc)?\.{scalar}|.*shared.*"  # or through shared memory
        assert not [k for k in found[False] if re.fullmatch(one_element, k)], found[False]
        checked += 1
    return checked


class _Target:
    """Triton's active driver where there is no GPU: enough for torch to compile the kernel to
    Triton IR for an H100 and read its stores."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0


def written_once() -> int:
    """Which tensors a launch writes, as inductor reads them (torch's own analysis of the
    kernel's Triton IR), for one array, one in place and two: each written tensor once."""
    import torch
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    recorder = _Recorder()
    _triton.wrap_triton = recorder  # type: ignore[assignment]
    steps = torch.zeros(4, 12, dtype=torch.float64, device="meta")
    angles = _triton.Angles(None, 3, steps, None, None, None, OFFSET, 12, _triton.HALF)
    q, k = torch.empty(2, 4, 5, 32, device="meta"), torch.empty(2, 2, 5, 32, device="meta")
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _triton._run([(q, q_out, -2)], angles)
    _triton._run([(q, q, -2)], angles)
    _triton._run([(q, q_out, -2), (k, k_out, -2)], angles)
    triton.runtime.driver.set_active(_Target())
    wanted = [{"out_ptr"}, {"out_ptr"}, {"out_ptr", "y_out_ptr"}]
    for launch, names in zip(recorder.launches, wanted, strict=True):
        kernel = wrap.kernel_side_table.add_kernel(_triton._rotate_kernel)
        constants = wrap.kernel_side_table.add_constant_args({})
        written = wrap.get_mutated_tensors(kernel, constants, launch, {})
        assert set(written) == names, (written, names)
        assert len({id(launch[name]) for name in written}) == len(written), written
    return len(recorder.launches)


class _Recorder:
    """Stands in for torch's ``wrap_triton``: ``kernel[grid](...)`` keeps the launch's arguments by name."""

    def __init__(self) -> None:
        self.launches: list[dict[str, object]] = []

    def __call__(self, kernel: object) -> _Recorder:
        return self

    def __getitem__(self, grid: object) -> object:
        return self.record

    def record(self, *args: object, **kwargs: object) -> None:
        self.launches.append(dict(zip(_triton._rotate_kernel.arg_names, args, strict=False)) | kwargs)


if __name__ == "__main__":
    sys.exit(main())
