"""pyperf script: the first call in a fresh process, one value per process.

    python benchmarks/bench_first_call.py --loops 1 --warmups 0 --values 1 -p 5 -o first.json

Each worker imports the backend's library and makes a float32 q before the clock starts; the
value is then ``import anyrope``, ``RoPE(head_dim)`` and the first ``rope(q)``, or (for
"anyrope-compiled", "anyrope-jit" and "anyrope-mx-compile", after one eager call) the compile and
first call of ``rope(q)`` through torch.compile, jax.jit or mx.compile. A first call happens
once per process, so the run needs ``--loops 1 --warmups 0 --values 1`` (benchmarks/run.py
passes them) and its spread comes from the processes.
"""

from __future__ import annotations

import importlib
import time

import rope_cases

DIMS = rope_cases.DIMS["quick"]["prefill"]
CPU_BACKENDS = [spec for spec in rope_cases.BACKENDS if not spec.gpu]


def first_call(loops: int, backend: str, variant: str) -> float:
    """pyperf's time function: seconds of the process's first call of ``variant``."""
    if loops != 1:
        raise ValueError(f"a first call happens once per process: run with --loops 1, not {loops}")
    from rope_runtimes import make_runtime

    rt = make_runtime(backend)
    with rt.scope():
        q = rt.make(DIMS, "float32", 0)
        rt.finish(q)
        start = time.perf_counter()
        anyrope = importlib.import_module("anyrope")
        rope = anyrope.RoPE(DIMS[3], base=rope_cases.BASE)
        rt.finish(rope(q))
        if variant == "anyrope":
            return time.perf_counter() - start
        assert rt.compile is not None
        start = time.perf_counter()
        rt.finish(rt.compile(lambda x: rope(x))(q))
        return time.perf_counter() - start


def planned(backends: list[str] | None = None) -> list[tuple[str, str]]:
    """(backend, variant) of each first call: the installed CPU backends (or those named)."""
    found = []
    for spec in CPU_BACKENDS:
        if not rope_cases.backend_skip(spec.name) and (backends is None or spec.name in backends):
            found += [
                (spec.name, variant) for variant in ["anyrope", *([spec.compiler] if spec.compiler else [])]
            ]
    return found


def main() -> None:
    import pyperf

    runner = pyperf.Runner(processes=5, values=1, warmups=0, loops=1, add_cmdline_args=_forward)
    runner.argparser.add_argument("--backend", action="append", metavar="BACKEND", help="only this backend")
    runner.argparser.add_argument("--only", metavar="NAME", help="only the benchmark of this name")
    args = runner.parse_args()
    for backend, variant in planned(args.backend):
        name = f"first-call/{backend}/{variant}"
        if not args.only or args.only == name:
            runner.bench_time_func(name, first_call, backend, variant)


def _forward(cmd: list[str], args: object) -> None:
    for backend in getattr(args, "backend", None) or []:
        cmd += ["--backend", backend]
    only = getattr(args, "only", None)
    if only:
        cmd += ["--only", only]


if __name__ == "__main__":
    main()
