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
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import triton
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
_INSTRUCTION = re.compile(r"(?:@!?%\w+\s+)?([a-z][\w.:]*)\s*(.*)")
_NO_RESULT = ("st.", "bra", "ret", "bar.", "call", "red.", "prefetch")


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
    return ptxas_figures(log.getvalue()) | {"accesses": accesses(compiled.asm["ptx"], signature)}


def ptxas_figures(log: str) -> dict[str, Any]:
    """Registers per thread of the entry function, and the spills and stack frames of all its
    functions (libdevice's slow path of cos and sin is one of its own), from ptxas's ``-v`` log."""
    used = re.findall(r"Used (\d+) registers", log)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert used, log
    assert frames, log
    return {
        "registers": int(used[0]),
        "spill_stores": sum(int(f[1]) for f in frames),
        "spill_loads": sum(int(f[2]) for f in frames),
        "stack_bytes": sum(int(f[0]) for f in frames),
    }


def accesses(ptx: str, signature: dict[str, str]) -> dict[str, dict[str, int]]:
    """Each global load and store instruction of the PTX, counted by the array it reads or
    writes and by instruction: ``{"x load": {"ld.global.v4.b32": 4}, ...}``. The array is the
    pointer argument its address is computed from, traced back through the registers that
    define it (PTX's line info, ``.loc``, names the wrong lines once LLVM has moved code), or
    the global symbol (libdevice's tables for cos and sin)."""
    params = [name for name, kind in signature.items() if kind != "constexpr"]  # the PTX's, in order
    symbols = set(re.findall(r"^\.global\s.*?(\w+)\[", ptx, flags=re.MULTILINE))
    found: dict[str, Counter[str]] = {}
    defs: dict[str, set[str]] = {}  # register -> the registers, params and symbols it is made of
    for line in ptx.splitlines():
        text = line.split("//")[0].strip().rstrip(";").strip()
        if re.search(r"\.(entry|func)\s", text):
            defs = {}  # a function's registers are its own
        instruction = _INSTRUCTION.fullmatch(text)
        if text.startswith((".", "{", "}", "$")) or not instruction:
            continue
        op, operands = instruction[1], instruction[2]
        address = re.search(r"\[([^\]]*)\]", operands)
        if re.match(r"(ld|st)\.global\.", op) and address:
            roots = _roots(address[1], defs, symbols)
            arrays = {
                ARRAYS.get(params[int(r)], "") if r.isdigit() and int(r) < len(params) else r for r in roots
            }
            kind = "+".join(sorted(a for a in arrays if a)) or "?"
            found.setdefault(f"{kind} {'load' if op.startswith('ld') else 'store'}", Counter())[op] += 1
        if op.startswith(_NO_RESULT):
            continue
        result, _, rest = operands.partition("}") if operands.startswith("{") else operands.partition(",")
        if op.startswith("ld.param"):  # a kernel's argument (a function's, libdevice's, is a value)
            param = re.search(r"_rotate_kernel_param_(\d+)", rest)
            sources = {f"param:{param[1]}"} if param else set()
        elif op.startswith("ld."):  # read from memory: not traced further
            sources = set()
        else:
            sources = set(re.findall(r"%\w+", rest)) | {
                f"symbol:{t}" for t in re.findall(r"\w+", rest) if t in symbols
            }
        for register in re.findall(r"%\w+", result):
            defs.setdefault(register, set()).update(sources)
    return {kind: dict(sorted(counts.items())) for kind, counts in sorted(found.items())}


def _roots(address: str, defs: dict[str, set[str]], symbols: set[str]) -> set[str]:
    """The kernel's params (their indices) and the global symbols an address is made of."""
    roots = {t for t in re.findall(r"\w+", address) if t in symbols}
    todo, seen = re.findall(r"%\w+", address), set()
    while todo:
        register = todo.pop()
        if register not in seen:
            seen.add(register)
            for source in defs.get(register, ()):
                if ":" in source:  # a param or a symbol
                    roots.add(source.split(":", 1)[1])
                else:
                    todo.append(source)
    return roots


def bits(instruction: str) -> int:
    """The width of one access in bits: ``ld.global.v4.b32`` 128, ``ld.global.nc.b16`` 16."""
    parts = instruction.split(".")
    vector = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d+", p)), 1)
    size = next(int(p[1:]) for p in reversed(parts) if re.fullmatch(r"[bsuf]\d+", p))
    return vector * size


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
        widths: dict[str, Counter[int]] = {}
        for kind, counts in kernel["accesses"].items():
            for instruction, n in counts.items():
                widths.setdefault(kind, Counter())[bits(instruction)] += n
        kernel["widths"] = {kind: dict(sorted(c.items())) for kind, c in widths.items()}
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
        widths = "; ".join(
            f"{kind} " + ", ".join(f"{b}x{n}" for b, n in counts.items())
            for kind, counts in kernel["widths"].items()
        )
        out.append(
            f"| {i} | {kernel['dtype']} | {'half' if c['HALF'] else 'interleaved'} | {MODES[c['MODE']]} | {c['BLOCK_S']} | "
            f"{c['HEADS']} | {kernel['num_warps']} | "
            f"{'<br>'.join(served)} | {kernel['registers']} | {kernel['spill_stores']}/{kernel['spill_loads']} | "
            f"{kernel['stack_bytes']} | {widths} |"
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
