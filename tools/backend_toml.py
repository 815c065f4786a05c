"""The one reader of ``backends/*/backend.toml``, for every tool of the checkout.

The noxfile (run by nox alone, before anything is installed), the tests, the docs extension and
the benchmarks all read the same data, so they read it here. Not in the package: the wheel
carries no ``backends/`` and nothing in ``anyrope`` reads it at run time (the self-check keeps its
own copy, held to this data by tests/test_cli.py). Not in ``backends/`` either: that folder would
then go on ``sys.path``, where its folders (``cupy``, ``jax``, ...) pass for namespace packages of
those names wherever the library is not installed. It imports the standard library only (tomli
before Python 3.11, which nox and the test, bench and docs groups bring), so each of those tools
puts ``tools/`` on ``sys.path`` (pytest: ``pythonpath``) and imports it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

# By name, so that mypy's 3.10 target needs no tomli in the lint environment.
tomllib: Any = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parents[1]  # the checkout


def read(path: Path) -> dict[str, Any]:
    """One TOML file (a backend.toml, or pyproject.toml) as a dictionary."""
    data: dict[str, Any] = tomllib.loads(path.read_text())
    return data


def load(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Every backend of ``root``'s backends/ by its name, in the order of the folders' names."""
    specs = (read(path) for path in sorted((root / "backends").glob("*/backend.toml")))
    return {spec["name"]: spec for spec in specs}
