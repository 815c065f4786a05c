"""``python -m anyrope``: find the installed array libraries and check RoPE on each of their devices.

This module runs the check and prints its table; the checks and their plain-Python oracle are in
``_selfcheck_checks``, each library's probe in ``_selfcheck_probes``, and what is installed is
asked of ``_arrays`` (found, not imported, so a broken install shows up as one failed row).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from ._arrays import is_installed
from ._registry import fusions, kernels
from ._selfcheck_checks import CHECKS, Row, Target, check_target, error_text, rope_oracle
from ._selfcheck_probes import BACKENDS, Backend, Skip, distribution_version
from ._version import __version__

__all__ = ["BACKENDS", "Backend", "Row", "Skip", "Target", "is_installed", "rope_oracle", "run"]


def check_backend(backend: Backend) -> Iterator[Row]:
    """Import ``backend``, list its devices and check each; import errors become a FAIL row."""
    version = distribution_version(backend.distributions)
    try:
        targets = backend.probe()
    except Skip as reason:
        yield Row(backend.name, version, "-", "-", "devices", "skipped", str(reason))
        return
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever a broken install raises
        yield Row(backend.name, version, "-", "-", "import", "FAIL", error_text(exc))
        return
    for target in targets:
        yield from check_target(backend.name, version, target)


HEADER = ("backend", "version", "device", "dtype", "check", "result")


class _Table:
    """Rows printed as they come (a crash mid-way still leaves what was checked), in fixed columns."""

    def __init__(self, out: TextIO, backends: Sequence[Backend]) -> None:
        self._out = out
        versions = [distribution_version(b.distributions) for b in backends]
        self._widths = (
            max([len(HEADER[0]), *(len(b.name) for b in backends)]),
            max([len(HEADER[1]), *(len(v) for v in versions)]),
            len("CPU_DEVICE"),
            len("bfloat16"),
            max(len(c) for c in CHECKS),
        )

    def _line(self, cells: Sequence[str]) -> None:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], self._widths, strict=True)]
        print("  ".join([*padded, cells[-1]]).rstrip(), file=self._out, flush=True)

    def header(self) -> None:
        self._line(HEADER)
        self._line(["-" * w for w in self._widths] + ["-" * len(HEADER[-1])])

    def row(self, row: Row) -> None:
        self._line((row.backend, row.version, row.device, row.dtype, row.check, row.result))


_HINTS = {"numba": 'pip install "anyrope[numba]"', "triton": "pip install triton"}


def fast_paths(installed: Sequence[Backend]) -> list[str]:
    """One line per fused kernel for the installed libraries: where it runs, and whether it can
    (what to install where it cannot)."""
    return _where_each_runs(kernels()[:-1], installed)  # the generic kernel, last, runs wherever none does


def fused_prologues(installed: Sequence[Backend]) -> list[str]:
    """As :func:`fast_paths`, for the fused attention prologues (``anyrope.prologue``)."""
    return _where_each_runs(fusions(), installed)


def _where_each_runs(declared: Sequence[Any], installed: Sequence[Backend]) -> list[str]:
    modules = {backend.namespace for backend in installed}
    lines = []
    for item in declared:
        libraries = item.libraries & modules
        if not libraries:
            continue
        where = ", ".join(sorted(libraries)) + (
            f" on {', '.join(sorted(item.devices))}" if item.devices else ""
        )
        missing = [module for module in item.requires if not is_installed(module)]
        state = (
            "available" if not missing else "not available: " + "; ".join(_HINTS.get(m, m) for m in missing)
        )
        lines.append(f"  {item.name:<14} {where:<26} {state}")
    return lines


def run(backends: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Check every installed backend (or those named) and print a table of results.

    Parameters
    ----------
    backends : sequence of str, optional
        Names from :data:`BACKENDS` to check; all of them by default.
    out : text stream, optional
        Where the report goes; ``sys.stdout`` by default.

    Returns
    -------
    int
        The exit status: 0 when every check that ran passed, 1 when one failed or none could run.
    """
    out = sys.stdout if out is None else out
    chosen = [b for b in BACKENDS if backends is None or b.name in backends]
    installed = [b for b in chosen if is_installed(b.module)]
    missing = [b for b in chosen if b not in installed]
    print(f"anyrope {__version__}, Python {platform.python_version()} on {sys.platform}", file=out)
    if not installed:
        which = "No array library" if backends is None else "None of the chosen array libraries"
        print(f"{which} is installed, so there is nothing to check. Install one:", file=out)
        for backend in missing:
            print(f"    {backend.install:<32}  # {backend.name}", file=out)
        return 1
    print(file=out)
    table = _Table(out, installed)
    table.header()
    counts = dict.fromkeys(("ok", "FAIL", "skipped"), 0)
    for backend in installed:
        for row in check_backend(backend):
            table.row(row)
            counts[row.status] += 1
    print(file=out)
    for title, lines in (
        ("fused kernels (the generic array-API code runs wherever none applies)", fast_paths(installed)),
        ("fused attention prologues (anyrope.prologue runs its steps apart wherever none applies)",
         fused_prologues(installed)),
    ):  # fmt: skip
        if lines:
            print(f"{title}:", *lines, "", sep="\n", file=out)
    for backend in missing:
        print(f"not installed: {backend.name} ({backend.install})", file=out)
    print(f"{counts['ok']} checks passed, {counts['FAIL']} failed, {counts['skipped']} skipped", file=out)
    if counts["ok"] == 0 and counts["FAIL"] == 0:
        print("nothing could be checked: no installed library has a usable device", file=out)
        return 1
    return 1 if counts["FAIL"] else 0
