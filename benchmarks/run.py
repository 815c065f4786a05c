"""Run the benchmark (what ``nox -s bench`` runs): every benchmark through pyperf, then the report.

    python benchmarks/run.py --out bench-results                 # full shapes, every installed backend
    python benchmarks/run.py --quick --backend numpy             # smaller shapes, fewer values
    python benchmarks/run.py --quick -- --rigorous               # after --: pyperf's own options

Each benchmark is one pyperf invocation of bench_rope.py (``--only NAME --append``): pyperf
aborts a whole invocation when a worker fails, and a peer or compiler that breaks on one case
must cost that row only. The pyperf files go to ``OUT/pyperf/``, a log per failure to
``OUT/logs/``, and ``OUT/run.json`` records the plan, the skips and the failures for report.py.
Where an NVIDIA GPU is found, bench_gpu.py follows (its own process, CUDA-event timings, the GPU
peers): ``OUT/gpu.md`` and ``OUT/gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_first_call
import bench_rope
import rope_cases
import rope_report

HERE = Path(__file__).resolve().parent
QUICK = ["--processes", "1", "--values", "3"]  # before the user's pyperf options, which win


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0])
    bench_rope.add_options(parser)
    parser.add_argument("--quick", action="store_true", help="--size quick, one process of 3 values each")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="default: %(default)s")
    parser.add_argument("--no-first-call", action="store_true", help="do not time first calls")
    parser.add_argument(
        "--no-gpu", action="store_true", help="skip bench_gpu.py (run where an NVIDIA GPU is found)"
    )
    parser.add_argument(
        "--first-call-processes", type=int, default=5, metavar="N", help="fresh processes per first call"
    )
    return parser


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """This script's options, and pyperf's (those after the first ``--``)."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def _invoke(script: str, name: str, argv: list[str], log: Path) -> str:
    """Run one pyperf benchmark; returns "" or why it failed (the full output goes to ``log``)."""
    cmd = [sys.executable, str(HERE / script), "--only", name, *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(name)]
    print(lines[-1] if lines else name, flush=True)
    if done.returncode == 0 and lines:
        return ""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    # the worker's exception comes first; pyperf's own "worker failed" follows it
    raised = [line for line in done.stderr.splitlines() if re.match(r"[\w.]*(Error|Exception)\b", line)]
    why = raised[0] if raised else f"no result (exit status {done.returncode})"
    return f"{why[:200]} (log: {log})"


def _config(args: argparse.Namespace, pyperf_args: list[str]) -> dict[str, Any]:
    return {
        "size": args.size,
        "cases": {c.name: {"dims": list(c.dims), "what": c.what} for c in rope_cases.cases(args.size)},
        "pyperf_args": pyperf_args,
        "first_call_processes": 0 if args.no_first_call else args.first_call_processes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen benchmarks and report; 0 when something ran and nothing failed."""
    ours, pyperf_args = split_argv(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(ours)
    if args.quick:
        args.size, pyperf_args = "quick", [*QUICK, *pyperf_args]
    out: Path = args.out
    (out / "pyperf").mkdir(parents=True, exist_ok=True)
    for old in (out / "pyperf").glob("*.json"):  # --append would mix this run with the last
        old.unlink()
    plan = bench_rope.chosen(args)
    not_timed = []
    for i, bench in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] ", end="", flush=True)
        why = bench.skip
        if why:
            print(f"{bench.name}: skipped ({why})")
        else:
            target = out / "pyperf" / f"rope-{bench.backend}.json"
            rope_argv = ["--size", args.size, "--append", str(target), *pyperf_args]
            why = _invoke(
                "bench_rope.py", bench.name, rope_argv, out / "logs" / f"{bench.name.replace('/', '_')}.log"
            )
        if why:
            not_timed.append({
                "backend": bench.backend, "shape": bench.case.name, "dims": list(bench.case.dims),
                "dtype": bench.dtype, "layout": bench.layout, "variant": bench.variant, "tensors": bench.tensors,
                "status": "skipped" if bench.skip else "error", "detail": why,
            })  # fmt: skip
    first_failed = []
    if not args.no_first_call:
        first_argv = [
            "--loops",
            "1",
            "--warmups",
            "0",
            "--values",
            "1",
            "--processes",
            str(args.first_call_processes),
        ]
        first_argv += ["--append", str(out / "pyperf" / "first-call.json")]
        for backend, variant in bench_first_call.planned(args.backend):
            name = f"first-call/{backend}/{variant}"
            why = _invoke(
                "bench_first_call.py", name, first_argv, out / "logs" / f"{name.replace('/', '_')}.log"
            )
            if why:
                first_failed.append(
                    {"backend": backend, "variant": variant, "status": "error", "detail": why}
                )
    if rope_cases.has_nvidia_gpu() and not args.no_gpu:  # the GPU table: one process, CUDA events
        gpu = subprocess.run([sys.executable, str(HERE / "bench_gpu.py"), "--out", str(out)], check=False)
        if gpu.returncode:
            first_failed.append({"backend": "gpu", "variant": "bench_gpu.py", "status": "error",
                                 "detail": f"exit status {gpu.returncode}"})  # fmt: skip
    run = {"config": _config(args, pyperf_args), "not_timed": not_timed, "first_call_failed": first_failed}
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    status = rope_report.main([str(out)])
    failed = [r for r in not_timed if r["status"] == "error"] + first_failed
    if failed:
        print(f"{len(failed)} benchmark(s) failed; see the notes above and {out / 'logs'}", file=sys.stderr)
    return status or (1 if failed else 0)


if __name__ == "__main__":
    raise SystemExit(main())
