"""What the CuPy kernel costs an H100 or H200, read from its compiled code (issue 55, item 4):
every kernel rope.cu is compiled into (``cupy_cuda.NAMES``), compiled by nvcc for sm_90 with
CuPy's options, with its registers per thread, its spills and every global load and store of its
PTX by width and by the array it reads or writes (tests/ptx.py). CuPy compiles the same source
with NVRTC on the GPU; nvcc's ptxas here is the same back end.

Run as a script: ``python tests/cuda_report.py [--json PATH]`` prints a table, one row per kernel.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ptx import accesses, cells, entries, ptxas_figures, widths

from anyrope._kernels import cupy_cuda

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"  # H100, H200
# rope.cu's kernel parameters in order, and the array each pointer is
PARAMS = ["x", "out", "index", "steps", "streams", "cos_table", "sin_table"]
ARRAYS = {"x": "x", "out": "out", "index": "index", "steps": "steps", "streams": "streams"}
ARRAYS |= {"cos_table": "tables", "sin_table": "tables"}
_TYPES = {"6__half": "__half", "f": "float", "d": "double"}  # as the mangled names spell them


def _name(mangled: str) -> str:
    """The :func:`cupy_cuda.kernel_name` of a mangled ``anyrope::rotate<T, V, HALF_PAIRS, ALIGNED>``."""
    found = re.search(r"rotateI(6__half|f|d)Li(\d+)ELb([01])ELb([01])E", mangled)
    assert found, mangled
    dtype = next(d for d, t in cupy_cuda.TYPES.items() if t == _TYPES[found[1]])
    return cupy_cuda.kernel_name(dtype, int(found[2]), found[3] == "1", found[4] == "1")


def compile_all(nvcc: str) -> tuple[str, str]:
    """tests/cuda/host_rope.cu (every kernel of ``cupy_cuda.NAMES``) for the GPU: its PTX and
    ptxas's ``-v`` log."""
    source = ROOT / "tests" / "cuda" / "host_rope.cu"
    common = [nvcc, f"-arch={ARCH}", *cupy_cuda.OPTIONS, "-I", str(ROOT / "src" / "anyrope" / "_kernels")]
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "rope.ptx"
        for extra in (
            ["-ptx", "-o", str(ptx)],
            ["-cubin", "-Xptxas", "-v", "-o", str(Path(tmp) / "rope.cubin")],
        ):
            command = [*common, *extra, str(source)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            assert done.returncode == 0, done.stderr[-4000:]
            if "-cubin" in extra:
                log = done.stdout + done.stderr
        return ptx.read_text(), log


def report(nvcc: str) -> dict[str, Any]:
    """Every kernel's figures, by its name."""
    ptx, log = compile_all(nvcc)
    codes = entries(ptx, r"^\.visible \.entry (\w+)\(")
    logs = entries(log, r"Compiling entry function '(\w+)'")
    assert set(codes) == set(logs), (sorted(codes), sorted(logs))
    kernels = {}
    for mangled, code in codes.items():
        found = accesses(code, PARAMS, ARRAYS)
        kernels[_name(mangled)] = ptxas_figures(logs[mangled]) | {"accesses": found, "widths": widths(found)}
    return {"target": f"cuda {ARCH} (H100, H200), {_version(nvcc)}", "kernels": kernels}


def _version(nvcc: str) -> str:
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    return "nvcc " + re.findall(r"release ([\d.]+)", done.stdout)[0]


def table(found: dict[str, Any]) -> str:
    """One row per kernel: its name, its figures, its accesses by width."""
    out = [f"target: {found['target']}", ""]
    out.append("| kernel | regs | spills (st/ld B) | stack B | global accesses: bits x count |")
    out.append("| --- | --- | --- | --- | --- |")
    out += [f"| {name} | {cells(kernel)} |" for name, kernel in found["kernels"].items()]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the full report here")
    args = parser.parse_args(argv)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        parser.error("nvcc is not installed (the CUDA toolkit's compiler)")
    found = report(nvcc)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, default=str) + "\n")
    print(table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
