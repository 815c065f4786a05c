"""``python -m anyrope`` (also the ``anyrope`` script): list the installed backends and self-check them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from . import _selfcheck

    parser = argparse.ArgumentParser(
        prog="python -m anyrope",
        description=(
            "List the array libraries anyrope finds installed (NumPy, PyTorch, MLX, JAX, CuPy, Dask, "
            "array-api-strict) and self-check RoPE on each of their devices, in every floating dtype "
            "each has (float16, bfloat16, float32, float64), against a plain-Python oracle; then list "
            "the fused kernels and whether they can run. Exits with 0 when every check that ran passed."
        ),
    )
    parser.add_argument(
        "-b",
        "--backend",
        action="append",
        choices=[b.name for b in _selfcheck.BACKENDS],
        help="check only this backend (repeatable); default: every installed one",
    )
    # The bare command is the self-check. Later commands (e.g. "bench") go in as subparsers:
    # parser.add_subparsers(dest="command").add_parser("bench").set_defaults(handler=...);
    # a subparser's set_defaults overrides this one, so the bare command keeps working.
    parser.set_defaults(handler=lambda args: _selfcheck.run(args.backend))
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_bench(commands)
    return parser


def _add_bench(commands: Any) -> None:
    from . import _bench  # the standard library only: the array libraries load in its workers

    bench = commands.add_parser(
        "bench",
        help="time anyrope against a plain copy and other RoPE implementations",
        description=(
            "Benchmark anyrope on every installed backend, one process each: prefill and decode "
            "shapes and a small call timed while another process keeps a core busy, float32 and the "
            "half-precision dtypes, both layouts; the default and generic paths, torch.compile and "
            "jax.jit of the call, a plain copy (the memory roofline) and every installed peer "
            "(transformers, torch.compile, rotary-embedding-torch, mlx.core.fast.rope, the naive "
            "NumPy formula). CPU backends also time their first call in a fresh process. Prints "
            "medians and ratios, writes JSON and, with matplotlib, a plot."
        ),
    )
    _bench.add_arguments(bench)
    bench.set_defaults(handler=_bench.main)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (``sys.argv[1:]`` by default); returns the exit status."""
    args = _parser().parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
