"""Build-time content for the docs: every figure, drawn by anyrope itself, and the backend matrix.

Runs when the builder starts and writes into docs/_generated/ (ignored by git): the figures of
:mod:`anyrope.plots`, the benchmark plot from the committed results in docs/data/, and
backends.md, the support matrix read from backends/*/backend.toml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the docs build runs on 3.11+, this keeps 3.10 importing
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ["frequencies", "yarn_ramp", "llama3_bands", "decay", "wrap_around", "layouts"]


def _figures(out: Path) -> None:
    import matplotlib.pyplot as plt

    from anyrope import plots

    for name in FIGURES:
        figure = getattr(plots, name)()
        figure.savefig(out / f"{name}.png", dpi=110)
        plt.close(figure)


def _benchmark(out: Path) -> None:
    from anyrope import _bench

    for path in sorted((ROOT / "docs" / "data").glob("bench-*.json")):
        report = json.loads(path.read_text())
        why_not = _bench.plot(report, out / f"{path.stem}.png")
        if why_not:
            raise RuntimeError(f"could not plot {path}: {why_not}")


def _cell(values: list[str] | None) -> str:
    return ", ".join(values) if values else "-"


def backend_matrix(root: Path = ROOT) -> str:
    """The support matrix and each backend's notes and deviations, as MyST Markdown."""
    specs = [tomllib.loads(p.read_text()) for p in sorted(root.glob("backends/*/backend.toml"))]
    lines = [
        "| backend | module | devices | dtypes | compiled | autograd | install |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for spec in specs:
        install = spec.get("user-install", "").split("(")[0].strip().rstrip(",")
        lines.append(
            f"| {spec['name']} | `{spec['module']}` | {_cell(spec.get('devices'))} | "
            f"{_cell(spec.get('dtypes'))} | {_cell(spec.get('compilers'))} | "
            f"{'yes' if spec.get('autograd') else 'no'} | {install} |"
        )
    lines += ["", "## Kernels", "", kernel_table()]
    for spec in specs:
        lines += ["", f"### {spec['name']}", "", spec.get("user-install", ""), ""]
        for key, note in spec.get("notes", {}).items():
            lines.append(f"- **{key}**: {note}")
        deviations: dict[str, dict[str, Any]] = spec.get("deviations", {})
        if deviations:
            lines += [
                "",
                "Known deviations (tests marked with the feature are skipped or expected to fail):",
                "",
            ]
            lines += [f"- `{feature}` ({d['mode']}): {d['reason']}" for feature, d in deviations.items()]
        else:
            lines += ["", "No known deviations: the whole conformance suite passes."]
    return "\n".join(lines) + "\n"


def kernel_table() -> str:
    """The kernel registry as a table: its declarations are what selection and the tests read."""
    import anyrope

    lines = [
        (
            "Kernels are tried in this order; each takes the calls its declaration covers, and the "
            "generic one takes every call. `anyrope.use_fast_paths(False)` keeps to the generic one, "
            '`use_fast_paths("name")` to one by name.'
        ),
        "",
        "| kernel | libraries | devices | layouts | dtypes | in place | traceable | gradients | needs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in anyrope.kernels():
        cells = [
            f"`{k.name}`",
            ", ".join(sorted(k.libraries)) or "any",
            ", ".join(sorted(k.devices)) or "any",
            ", ".join(sorted(k.layouts)),
            ", ".join(sorted(k.dtypes)) or "any",
            *("yes" if flag else "no" for flag in (k.inplace, k.traceable, k.differentiable)),
            ", ".join(k.requires) or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- `{k.name}`: {k.summary}" for k in anyrope.kernels())]
    return "\n".join(lines)


def _generate(app: Any) -> None:
    out = Path(app.srcdir) / "_generated"
    out.mkdir(exist_ok=True)
    _figures(out)
    _benchmark(out)
    (out / "backends.md").write_text(backend_matrix())


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _generate)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
