"""pyperf script: time anyrope, a copy and the peers, one pyperf benchmark per variant.

    python benchmarks/bench_rope.py --backend numpy --size quick -o numpy.json
    python benchmarks/bench_rope.py --only numpy/prefill/float32/half/anyrope --append out.json

pyperf runs this script again in each worker process and picks the benchmark by registration
order, so registration is the static plan of rope_cases (nothing imported but pyperf); a
worker builds its one benchmark's inputs and callable on the first call of the timed function,
outside the clock. ``benchmarks/run.py`` runs it once per benchmark, so that one failure (a
compile that breaks, say) costs one row and not the run.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import rope_cases
from rope_cases import Bench

# The worker's state lives until it exits: the one benchmark it runs, ready to call, and the
# contexts it runs in (the library's scope, the spinning helper of the small case).
_OPEN = contextlib.ExitStack()
atexit.register(_OPEN.close)

# Pure Python spinning; it checks every few milliseconds that its parent lives, so that a worker
# killed outright does not leave it spinning.
SPIN = """\
import os
parent = os.getppid()
print("spinning", flush=True)
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


@contextlib.contextmanager
def busy_cores(count: int = 1) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` helper processes, each spinning on a core (each has said so) until the block ends."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


@dataclass
class Ready:
    """A worker's benchmark, built: what it times, and the helpers spinning meanwhile."""

    call: Callable[[], Any]
    time_loops: Callable[[int], float]
    helpers: list[subprocess.Popen[str]]


_READY: dict[str, Ready] = {}


def _prepare(bench: Bench) -> Ready:
    from rope_runtimes import make_runtime
    from rope_variants import build

    rt = make_runtime(bench.backend)
    helpers = _OPEN.enter_context(busy_cores(bench.case.busy)) if bench.case.busy else []
    _OPEN.enter_context(rt.scope())
    call = build(rt, bench)
    return Ready(call, lambda loops: rt.time_loops(call, rt.finish, loops), helpers)


def timed(loops: int, bench: Bench) -> float:
    """pyperf's time function: seconds for ``loops`` calls (the first call builds, untimed)."""
    ready = _READY.get(bench.name)
    if ready is None:
        ready = _READY[bench.name] = _prepare(bench)
    return ready.time_loops(loops)


FILTERS = ("backend", "shape", "dtype", "layout", "variant")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options that choose benchmarks (shared with benchmarks/run.py)."""
    parser.add_argument("--size", choices=rope_cases.SIZES, default="full", help="shapes (default: full)")
    for name in FILTERS:
        parser.add_argument(f"--{name}", action="append", metavar=name.upper(), help=f"only this {name}")


def chosen(args: argparse.Namespace) -> list[Bench]:
    """The plan that the options choose (skipped benchmarks included)."""
    return rope_cases.plan(args.size, **{f"{name}s": getattr(args, name) for name in FILTERS})


def _forward(cmd: list[str], args: argparse.Namespace) -> None:
    """pyperf's add_cmdline_args: the worker must choose the same benchmarks."""
    cmd += ["--size", args.size]
    for name in FILTERS:
        for value in getattr(args, name) or []:
            cmd += [f"--{name}", value]
    if args.only:
        cmd += ["--only", args.only]


def main() -> None:
    import pyperf

    # Few processes and values: a full run has hundreds of benchmarks on CPUs with two cores;
    # pass -p/-n/--rigorous after -- for more.
    runner = pyperf.Runner(processes=2, values=5, warmups=1, min_time=0.05, add_cmdline_args=_forward)
    add_options(runner.argparser)
    runner.argparser.add_argument("--only", metavar="NAME", help="only the benchmark of this name")
    args = runner.parse_args()
    for bench in chosen(args):
        if bench.skip or (args.only and bench.name != args.only):
            continue
        dims = "x".join(map(str, bench.case.dims))
        runner.bench_time_func(
            bench.name, timed, bench, metadata={"rope_tensors": bench.tensors, "rope_dims": dims}
        )


if __name__ == "__main__":
    main()
