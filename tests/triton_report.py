"""What the Triton kernel costs an H100 or H200, read from its compiled code (issue 55): for
each launch the GPU benchmark makes (benchmarks/bench_gpu.py: its full and step sizes, every
dtype, layout, case and anyrope variant that launches the kernel itself), the kernel compiled
for sm_90 as that launch specialises it, with its registers per thread, its spills and every
global load and store instruction of its PTX, by width and by the array it reads or writes.

A launch is recorded on meta tensors of the benchmark's shapes (tests/triton_aot.py's recorder
in place of ``wrap_triton``), and specialised by Triton's own binder, as ``JITFunction.run``
does on a GPU: the constexprs, integers of 1 as constants, pointers and integers divisible by 16
(a CUDA allocation is). Triton then compiles it to PTX and runs ptxas, whose ``-v`` log gives
the registers and spills (``TRITON_DUMP_PTXAS_LOG``). Each access is counted per
instruction in the PTX, not per execution (a loop's body as often as LLVM unrolled it), and
given the array its address is computed from. Run as a script, without ``TRITON_INTERPRET``:
``python tests/triton_report.py [--json PATH]`` prints a table, one row per kernel compiled,
and writes the full report as JSON where asked.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
from ptx import accesses, cells, ptxas_figures, widths
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature
from triton_aot import _Recorder

from anyrope._kernel_angles import LEVELS, STARTS, TABLES
from anyrope._kernels import _triton

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import bench_gpu  # from the benchmarks folder, put on the path above

TARGET = GPUTarget("cuda", 90, 32)  # H100, H200
SIZES = ("full", "step")  # the GPU runs' sizes (tiny is the CPU smoke run's)
# the benchmark's anyrope rows that launch the kernel themselves: (name, in place, sequence axis)
VARIANTS = (("anyrope", False, -2), ("anyrope-inplace", True, -2), ("anyrope-bshd", False, -3))
MODES = {TABLES: "kept rows", STARTS: "starts"}
# the array each pointer argument is: q's and k's (x and y) alike
ARRAYS = {"x_ptr": "x", "y_ptr": "x", "out_ptr": "out", "y_out_ptr": "out", "index_ptr": "index"}
ARRAYS |= {"steps_ptr": "steps", "streams_ptr": "streams", "cos_ptr": "tables", "sin_ptr": "tables"}


def launches() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each launch of the benchmark's anyrope rows (what it times), and the kernel's arguments
    by name (with ``enable_fp_fusion``), on meta tensors: q and k of one call in one launch."""
    recorder = _Recorder()
    kept, _triton.wrap_triton = _triton.wrap_triton, recorder  # type: ignore[assignment]
    rows = []
    try:
        for size in SIZES:
            for case, (qd, kd) in bench_gpu.SIZES[size].items():
                for dtype in bench_gpu.DTYPES:
                    for layout in bench_gpu.LAYOUTS:
                        for variant, in_place, axis in VARIANTS:
                            _record(qd, kd, case, dtype, layout, in_place, axis)
                            rows.append({
                                "size": size, "case": case, "q": list(qd), "k": list(kd), "dtype": dtype,
                                "layout": layout, "variant": variant,
                            })  # fmt: skip
    finally:
        _triton.wrap_triton = kept
    return list(zip(rows, recorder.launches, strict=True))


def _record(qd: Any, kd: Any, case: str, dtype: str, layout: str, in_place: bool, axis: int) -> None:
    """One benchmark call, ``rope(q, k, offset=...)``, through the kernel's launch."""
    meta = {"dtype": getattr(torch, dtype), "device": "meta"}
    q, k = torch.empty(*qd, **meta), torch.empty(*kd, **meta)  # type: ignore[arg-type]
    if axis == -3:  # the (batch, seq, heads, head_dim) buffers models project into
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    pairs = qd[3] // 2
    steps = torch.empty(LEVELS + 2, pairs, dtype=torch.float64, device="meta")
    flags = _triton.HALF if layout == "half" else 0
    if case == "decode":  # each sequence at its own cache length, in a device array
        starts = torch.empty(qd[0], dtype=torch.int64, device="meta")
        angles = _triton.Angles(starts, 0, steps, None, None, None, STARTS, pairs, flags)
    else:  # from position 0, host-known: an eager call reads the cached prefix table's rows in place
        compute = torch.float64 if dtype == "float64" else torch.float32
        cos, sin = (torch.empty(1, qd[axis], pairs, dtype=compute, device="meta") for _ in range(2))
        angles = _triton.Angles(None, 0, None, None, cos, sin, TABLES, pairs, flags)
    outs = (q, k) if in_place else (torch.empty_like(q), torch.empty_like(k))
    _triton._run([(q, outs[0], axis), (k, outs[1], axis)], angles)


Specialised = tuple[dict[str, str], dict[Any, Any], dict[Any, Any], dict[str, Any]]


def specialise(launch: dict[str, Any]) -> Specialised:
    """The launch's signature, constexprs and attributes, by Triton's binder for the target, and
    its compile options (``num_warps``, ``enable_fp_fusion``)."""
    kernel = _triton._rotate_kernel
    backend = make_backend(TARGET)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    options = {k: v for k, v in launch.items() if k not in kernel.arg_names}
    bound, specialization, parsed = binder(*[launch[n] for n in kernel.arg_names], **options)
    _, signature, constexprs, attrs = kernel._pack_args(backend, options, bound, specialization, parsed)
    return signature, constexprs, attrs, options


def compile_kernel(specialised: Specialised) -> dict[str, Any]:
    """The specialised kernel compiled for the target with the launch's options: its ptxas
    figures and its PTX's accesses."""
    signature, constexprs, attrs, options = specialised
    source = ASTSource(fn=_triton._rotate_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    log = io.StringIO()
    with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.compilation.always_compile = True  # a cached kernel would run no ptxas to log
        knobs.nvidia.dump_ptxas_log = True
        compiled = triton.compile(source, target=TARGET, options=options)
    assert compiled.asm["cubin"], "no cubin"
    params = [name for name, kind in signature.items() if kind != "constexpr"]  # the PTX's, in order
    return ptxas_figures(log.getvalue()) | {"accesses": accesses(compiled.asm["ptx"], params, ARRAYS)}


def report() -> dict[str, Any]:
    """Every launch of the benchmark, and every kernel they compile to, with its figures."""
    kernels: list[dict[str, Any]] = []
    keys: dict[str, int] = {}
    rows = []
    for row, launch in launches():
        specialised = specialise(launch)
        key = repr(specialised)
        if key not in keys:
            keys[key] = len(kernels)
            signature, constexprs, _, options = specialised
            params = list(signature)
            constants = {params[path[0]]: value for path, value in constexprs.items()}
            found = {"dtype": row["dtype"], "constants": constants, "num_warps": options.get("num_warps", 4)}
            kernels.append(found | compile_kernel(specialised))
        rows.append(row | {"kernel": keys[key]})
    for kernel in kernels:
        kernel["widths"] = widths(kernel["accesses"])
    ptxas = get_ptxas(TARGET.arch).version
    target = f"{TARGET.backend} sm_{TARGET.arch} (H100, H200), triton {triton.__version__}, ptxas {ptxas}"
    return {"target": target, "kernels": kernels, "launches": rows}


def table(found: dict[str, Any]) -> str:
    """One row per kernel compiled: what it is, which benchmark launches it serves, its figures."""
    out = [f"target: {found['target']}", ""]
    out.append(
        "| # | dtype | layout | mode | BLOCK_S | HEADS | warps | launches | regs | spills (st/ld B) | stack B | global accesses: bits x count |"
    )
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, kernel in enumerate(found["kernels"]):
        c = kernel["constants"]
        rows = [r for r in found["launches"] if r["kernel"] == i]
        served = [f"{r['size']} {r['case']} {r['q'][1]}/{r['k'][1]} heads {r['variant']}" for r in rows]
        out.append(
            f"| {i} | {kernel['dtype']} | {'half' if c['HALF'] else 'interleaved'} | {MODES[c['MODE']]} | {c['BLOCK_S']} | "
            f"{c['HEADS']} | {kernel['num_warps']} | {'<br>'.join(served)} | {cells(kernel)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the full report here")
    args = parser.parse_args(argv)
    found = report()
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, default=str) + "\n")
    print(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
