"""Two variants of one row timed in one process, taking turns: a ratio finer than processes allow.

    python benchmarks/bench_paired.py mlx/prefill/bfloat16/half/anyrope-mx-compile \\
        mlx/prefill/bfloat16/half/anyrope --out paired.json

The pyperf rows time each variant in processes of its own, and on a shared machine a process can
run a few per cent fast or slow for its whole life; two of anyrope's own paths that differ by
less than that (``mx.compile`` and eager MLX run the same fused kernel) cannot be ranked from
them. Here both are built in one process and timed in blocks of the same number of calls, A then
B, then B then A, so that a drift of the machine's speed favours neither; each pair of blocks
gives one value of A's time over B's, and the record keeps their median and quartiles.
``rope_cases.PAIRED`` says which rows benchmarks/run.py times this way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import rope_cases
from bench_rope import busy_cores

Call = Callable[[], Any]

BLOCKS = 20  # pairs of blocks: 10 with A first, 10 with B first
BLOCK_SECONDS = 0.25  # each block at least this long, from the slower variant's warm call
WARM_CALLS = 3  # per variant, before calibration: compiles, caches and first-touch pages


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile), as pyperf and the rest of the report take them."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, statistics.median(values), q3


def fields(a: rope_cases.Bench, b: rope_cases.Bench) -> dict[str, Any]:
    """What names a paired record, timed or not: A's row and variant, and B's variant."""
    return {
        "backend": a.backend, "shape": a.case.name, "dims": list(a.case.dims), "dtype": a.dtype,
        "layout": a.layout, "variant": a.variant, "over": b.variant,
    }  # fmt: skip


def alternate(
    a: Call, b: Call, time_loops: Callable[[Call, int], float], blocks: int, block_s: float
) -> dict[str, Any]:
    """A's time over B's in ``blocks`` pairs of blocks of the same number of calls, A then B, then B
    then A, after ``WARM_CALLS`` each; ``time_loops(call, loops)`` is seconds for that many calls.

    Returns the ratio's median and quartiles over the pairs of blocks, the calls a block (from the
    slower one's warm call), and each one's median time per call (``median_s``, ``over_median_s``).
    """
    if blocks < 1 or block_s <= 0:
        raise ValueError(f"blocks must be >= 1 and block_s > 0, got {blocks} and {block_s}")
    for call in (a, b):
        time_loops(call, WARM_CALLS)
    loops = max(1, math.ceil(block_s / max(time_loops(call, 1) for call in (a, b))))
    per_call: tuple[list[float], list[float]] = ([], [])
    for i in range(blocks):
        for at in (0, 1) if i % 2 == 0 else (1, 0):
            per_call[at].append(time_loops((a, b)[at], loops) / loops)
    p25, median, p75 = quartiles([x / y for x, y in zip(*per_call, strict=True)])
    return {
        "blocks": blocks, "loops": loops, "ratio": median, "ratio_p25": p25, "ratio_p75": p75,
        "median_s": statistics.median(per_call[0]), "over_median_s": statistics.median(per_call[1]),
    }  # fmt: skip


def time_pair(a: rope_cases.Bench, b: rope_cases.Bench, blocks: int, block_s: float) -> dict[str, Any]:
    """A's and B's time per call in ``blocks`` alternating pairs of blocks, in this process."""
    from rope_runtimes import make_runtime
    from rope_variants import build

    if (a.backend, a.case, a.dtype, a.layout) != (b.backend, b.case, b.dtype, b.layout):
        raise ValueError(f"a pair is two variants of one row, got {a.name} and {b.name}")
    rt = make_runtime(a.backend)
    with contextlib.ExitStack() as stack:
        if a.case.busy:
            stack.enter_context(busy_cores(a.case.busy))
        stack.enter_context(rt.scope())
        timed = alternate(
            build(rt, a),
            build(rt, b),
            lambda call, loops: rt.time_loops(call, rt.finish, loops),
            blocks,
            block_s,
        )
    return {**fields(a, b), "status": "ok", **timed}


def _bench(name: str, size: str) -> rope_cases.Bench:
    backend, shape, dtype, layout, variant = name.split("/")
    found = rope_cases.plan(
        size, backends=[backend], shapes=[shape], dtypes=[dtype], layouts=[layout], variants=[variant]
    )
    if not found:
        raise SystemExit(f"no benchmark {name!r} in the {size} plan")
    if found[0].skip:
        raise SystemExit(f"{name} is skipped here: {found[0].skip}")
    return found[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/bench_paired.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="the benchmark whose time is divided (BACKEND/SHAPE/DTYPE/LAYOUT/VARIANT)")
    parser.add_argument("b", help="the benchmark it is divided by (the same row, another variant)")
    parser.add_argument("--size", choices=rope_cases.SIZES, default="full", help="shapes (default: full)")
    parser.add_argument("--blocks", type=int, default=BLOCKS, help="pairs of blocks (default: %(default)s)")
    parser.add_argument(
        "--block-seconds",
        type=float,
        default=BLOCK_SECONDS,
        help="least time a block takes (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the record, as JSON")
    args = parser.parse_args(argv)
    record = time_pair(_bench(args.a, args.size), _bench(args.b, args.size), args.blocks, args.block_seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"{args.a} over {record['over']}: {record['ratio']:.3f} ({record['ratio_p25']:.3f}-{record['ratio_p75']:.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
