"""Run the benchmark (what ``nox -s bench`` runs): every benchmark through pyperf, then the report.

    python benchmarks/run.py --out bench-results                 # full shapes, every installed backend
    python benchmarks/run.py --quick --backend numpy             # smaller shapes, fewer values
    python benchmarks/run.py --quick -- --rigorous               # after --: pyperf's own options
    python benchmarks/run.py --rounds 5                          # five worker processes each

Each benchmark is one pyperf invocation of bench_rope.py per round (``--only NAME --append``,
one worker process): pyperf aborts a whole invocation when a worker fails, and a peer or
compiler that breaks on one case must cost that row only. The benchmarks of one backend, case
and dtype (both layouts: a row is compared with its case's copy and peers, and interleaved rows
with the half layout's peers) take turns, round after round, so that rows compared with each
other are timed through the same swings of a shared machine's speed. pyperf's options after
``--`` apply to each round (``-p 2`` is two processes a round). The pyperf files go to
``OUT/pyperf/``, a log per failure to ``OUT/logs/``, and ``OUT/run.json`` records the plan, the
skips and the failures for report.py.
Then the rows of ``rope_cases.PAIRED`` are timed again, each with the variant it is divided by,
in one process of their own (bench_paired.py, alternating blocks; ``OUT/paired/``): two of
anyrope's own paths can differ by less than a process's spread, which this ratio resolves.
Then bench_overhead.py measures what a call costs beside its arithmetic (Python calls per call,
tiny calls over NumPy's formula, a decode step over transformers'), in one fresh process of its
own: ``OUT/overhead.json``, the report's "call overhead" table (``--no-overhead`` leaves it out);
then bench_prologue.py the attention prologue's rows, fused over its steps apart and over
transformers: ``OUT/prologue.json``, the "attention prologue" table (``--no-prologue``).
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
import bench_paired
import bench_rope
import rope_cases
import rope_report

HERE = Path(__file__).resolve().parent
QUICK = ["--values", "3"]  # before the user's pyperf options, which win
QUICK_BLOCKS = 4  # --quick: enough to see a pair run, not to judge a target by (paired and overhead)
# Worker processes per benchmark, one per round. Three, not pyperf's two: a process can be slow
# for its whole life (a neighbour busy on one of the cores, for one), and all its values with it;
# with two processes such a one moves the pooled median halfway, with three the other two set it.
ROUNDS = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0])
    bench_rope.add_options(parser)
    parser.add_argument("--quick", action="store_true", help="--size quick, one round of 3 values each")
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help=f"worker processes per benchmark, one per round (default: {ROUNDS}; 1 with --quick)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="default: %(default)s")
    parser.add_argument("--no-first-call", action="store_true", help="do not time first calls")
    parser.add_argument(
        "--no-gpu", action="store_true", help="skip bench_gpu.py (run where an NVIDIA GPU is found)"
    )
    parser.add_argument(
        "--paired-blocks",
        type=int,
        metavar="N",
        help=f"pairs of blocks per paired row (default: {bench_paired.BLOCKS}; {QUICK_BLOCKS} with --quick;"
        " 0: none)",
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="do not run bench_overhead.py (the call-overhead table)"
    )
    parser.add_argument(
        "--no-prologue", action="store_true", help="do not run bench_prologue.py (the prologue table)"
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
    return _script(script, name, ["--only", name, *argv], log)


def _script(script: str, name: str, argv: list[str], log: Path) -> str:
    """Run a script of this folder that prints a line starting with ``name`` when it succeeds;
    returns "" or why it failed (the full output goes to ``log``)."""
    cmd = [sys.executable, str(HERE / script), *argv]
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


def schedule(plan: Sequence[rope_cases.Bench], rounds: int) -> list[tuple[int, rope_cases.Bench]]:
    """(round, benchmark) in the order they run: the benchmarks of one backend, case and dtype
    take turns, ``rounds`` times over, before the next such group starts."""
    groups: dict[tuple[str, str, str], list[rope_cases.Bench]] = {}
    for bench in plan:
        groups.setdefault((bench.backend, bench.case.name, bench.dtype), []).append(bench)
    return [(round_, bench) for group in groups.values() for round_ in range(rounds) for bench in group]


def run_paired(plan: Sequence[rope_cases.Bench], size: str, blocks: int, out: Path) -> list[dict[str, Any]]:
    """bench_paired.py once per pair of ``rope_cases.pairs(plan)``, each in a fresh process:
    its record, or an error record whose detail says why."""
    records = []
    for i, (a, b) in enumerate(found := rope_cases.pairs(plan), 1):
        print(f"[paired {i}/{len(found)}] ", end="", flush=True)
        path = out / "paired" / f"{a.name.replace('/', '_')}.json"
        argv = [a.name, b.name, "--size", size, "--blocks", str(blocks), "--out", str(path)]
        why = _script("bench_paired.py", a.name, argv, out / "logs" / f"paired_{path.stem}.log")
        if not why:
            records.append(json.loads(path.read_text()))
            continue
        records.append({**bench_paired.fields(a, b), "status": "error", "detail": why})
    return records


def run_overhead(blocks: int, out: Path) -> dict[str, Any]:
    """bench_overhead.py in a fresh process: its record, or an error record whose detail says why
    (written to ``OUT/overhead.json`` in its place)."""
    return _run_table("bench_overhead.py", "overhead", blocks, out)


def run_prologue(blocks: int, out: Path) -> dict[str, Any]:
    """bench_prologue.py in a fresh process: its record (``OUT/prologue.json``), or an error record
    whose detail says why, written there in its place."""
    return _run_table("bench_prologue.py", "prologue", blocks, out)


def _run_table(script: str, name: str, blocks: int, out: Path) -> dict[str, Any]:
    path = out / f"{name}.json"
    print(f"[{name}] ", end="", flush=True)
    argv = ["--blocks", str(blocks), "--out", str(path)]
    why = _script(script, name, argv, out / "logs" / f"{name}.log")
    if not why:
        return dict(json.loads(path.read_text()))
    record = {"status": "error", "detail": why}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def calibrated_loops(path: Path, name: str) -> int:
    """The loop length pyperf chose for benchmark ``name``'s first round: the later rounds keep it,
    which spares each a calibration process and keeps its values comparable."""
    import pyperf

    runs = pyperf.BenchmarkSuite.load(str(path)).get_benchmark(name).get_runs()
    return int([run for run in runs if run.values][-1].get_loops())


def _config(args: argparse.Namespace, pyperf_args: list[str], rounds: int) -> dict[str, Any]:
    return {
        "size": args.size,
        "rounds": rounds,
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
    rounds = args.rounds if args.rounds is not None else 1 if args.quick else ROUNDS
    if rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {rounds}")
    blocks = args.paired_blocks
    if blocks is None:
        blocks = QUICK_BLOCKS if args.quick else bench_paired.BLOCKS
    if blocks < 0:
        raise SystemExit(f"--paired-blocks must be 0 (none) or more, got {blocks}")
    out: Path = args.out
    (out / "pyperf").mkdir(parents=True, exist_ok=True)
    # --append would mix this run with the last; a paired or overhead file left over would pass
    # for this run's
    tables = [out / "overhead.json", out / "prologue.json"]
    for old in [*(out / "pyperf").glob("*.json"), *(out / "paired").glob("*.json"), *tables]:
        old.unlink(missing_ok=True)
    plan = bench_rope.chosen(args)
    not_timed: list[dict[str, Any]] = []
    failed: set[str] = set()  # a benchmark that fails is not run again
    later: list[dict[str, Any]] = []  # failed after its first round: its row keeps what it has
    loops: dict[str, int] = {}  # calibrated in the first round, kept by the others
    steps = schedule(plan, rounds)
    for i, (round_, bench) in enumerate(steps, 1):
        if bench.name in failed or (bench.skip and round_):
            continue
        print(f"[{i}/{len(steps)}] ", end="", flush=True)
        why = bench.skip
        if why:
            print(f"{bench.name}: skipped ({why})")
        else:
            target = out / "pyperf" / f"rope-{bench.backend}.json"
            kept = ["--loops", str(loops[bench.name])] if bench.name in loops else []
            rope_argv = [
                "--size",
                args.size,
                "--append",
                str(target),
                "--processes",
                "1",
                *kept,
                *pyperf_args,
            ]
            log = out / "logs" / f"{bench.name.replace('/', '_')}.log"
            why = _invoke("bench_rope.py", bench.name, rope_argv, log)
            if not why and round_ == 0 and rounds > 1:
                loops[bench.name] = calibrated_loops(target, bench.name)
        if why and not bench.skip:
            failed.add(bench.name)
        if why and round_:
            later.append({"name": bench.name, "round": round_ + 1, "detail": why})
        elif why:
            not_timed.append({
                "backend": bench.backend, "shape": bench.case.name, "dims": list(bench.case.dims),
                "dtype": bench.dtype, "layout": bench.layout, "variant": bench.variant, "tensors": bench.tensors,
                "status": "skipped" if bench.skip else "error", "detail": why,
            })  # fmt: skip
    paired = run_paired(plan, args.size, blocks, out) if blocks else []
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
    table_blocks = QUICK_BLOCKS if args.quick else bench_paired.BLOCKS
    if args.no_overhead:
        overhead = {"status": "skipped", "detail": "--no-overhead"}
        (out / "overhead.json").write_text(json.dumps(overhead, indent=1) + "\n")
    else:
        overhead = run_overhead(table_blocks, out)
    if args.no_prologue:
        prologue = {"status": "skipped", "detail": "--no-prologue"}
        (out / "prologue.json").write_text(json.dumps(prologue, indent=1) + "\n")
    else:
        prologue = run_prologue(table_blocks, out)
    if rope_cases.has_nvidia_gpu() and not args.no_gpu:  # the GPU table: one process, CUDA events
        gpu = subprocess.run([sys.executable, str(HERE / "bench_gpu.py"), "--out", str(out)], check=False)
        if gpu.returncode:
            first_failed.append({"backend": "gpu", "variant": "bench_gpu.py", "status": "error",
                                 "detail": f"exit status {gpu.returncode}"})  # fmt: skip
    run = {
        "config": _config(args, pyperf_args, rounds),
        "not_timed": not_timed,
        "first_call_failed": first_failed,
        "failed_later_rounds": later,
        "paired": paired,
        "overhead": overhead,
        "prologue": prologue,
    }
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    status = rope_report.main([str(out)])
    table_rows = [overhead, *overhead.get("rows", []), prologue, *prologue.get("rows", [])]
    failures = (
        [r for r in [*not_timed, *paired, *table_rows] if r["status"] == "error"] + first_failed + later
    )
    if failures:
        print(f"{len(failures)} benchmark(s) failed; see the notes above and {out / 'logs'}", file=sys.stderr)
    return status or (1 if failures else 0)


if __name__ == "__main__":
    raise SystemExit(main())
