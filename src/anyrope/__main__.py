"""``python -m anyrope`` (also the ``anyrope`` script): list the installed backends and self-check them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import _selfcheck

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m anyrope",
        description=(
            "List the array libraries anyrope finds installed (NumPy, PyTorch, MLX, JAX, CuPy, Dask, "
            "array-api-strict) and self-check RoPE on each of their devices, in every floating dtype "
            "each has (float16, bfloat16, float32, float64), against a plain-Python oracle; then list "
            "the fused kernels and attention prologues and whether they can run. Exits with 0 when every check that ran passed."
        ),
        epilog=(
            "The benchmark is not part of the installed package: in a source checkout, "
            "nox -s bench runs benchmarks/ (pyperf, the peers, matplotlib)."
        ),
    )
    parser.add_argument(
        "-b",
        "--backend",
        action="append",
        choices=[b.name for b in _selfcheck.BACKENDS],
        help="check only this backend (repeatable); default: every installed one",
    )
    parser.set_defaults(handler=lambda args: _selfcheck.run(args.backend))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (``sys.argv[1:]`` by default); returns the exit status."""
    args = _parser().parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
