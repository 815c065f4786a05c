"""The benchmark plot, from a run's summary (``bench.json``): matplotlib only, no pyperf.

The docs build draws it from docs/data/ with nothing but the docs environment.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rope_cases import LAYOUTS, SHAPES, SPECS, VARIANT_ORDER

COLORS = {"half": "tab:blue", "interleaved": "tab:orange"}


def plot(summary: dict[str, Any], path: Path) -> str | None:
    """Bars of "x copy" per variant with quartile whiskers, float32: a row per case, a column per backend.

    Every panel has the same logarithmic y axis, so bars compare across panels. Returns None
    when written, else why not (matplotlib missing, nothing to draw).
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    ticker = importlib.import_module("matplotlib.ticker")
    rows = [
        r
        for r in summary["results"]
        if r.get("status") == "ok" and r["dtype"] == "float32" and r.get("x_copy") and r["variant"] != "copy"
    ]
    backends = [b for b in SPECS if any(r["backend"] == b for r in rows)]
    shapes = [s for s in SHAPES if any(r["shape"] == s for r in rows)]
    if not backends or not shapes:
        return "no float32 results to plot"
    fig, axes = plt.subplots(
        len(shapes), len(backends), figsize=(4.6 * len(backends) + 1, 3.8 * len(shapes)),
        squeeze=False, sharey=True,
    )  # fmt: skip
    for i, shape in enumerate(shapes):
        for j, backend in enumerate(backends):
            _panel(
                axes[i][j],
                [r for r in rows if r["shape"] == shape and r["backend"] == backend],
                shape,
                backend,
            )
    ax = axes[0][0]
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
    for row in axes:
        row[0].set_ylabel("time / copy (lower is better)", fontsize=8)
        row[0].tick_params(axis="y", which="minor", labelsize=6)
    handles = [matplotlib.patches.Patch(color=c, label=layout) for layout, c in COLORS.items()]
    fig.legend(handles=handles, loc="upper right", fontsize=8, title="layout")
    fig.suptitle(_title(summary), fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.94, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def _panel(ax: Any, rows: list[dict[str, Any]], shape: str, backend: str) -> None:
    """One backend's bars: a pair per variant (half, interleaved), with whiskers from q1 to q3."""
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    if not rows:  # a backend that timed nothing of this case, e.g. after an error
        ax.set_title(f"{backend}, {shape}: no float32 results", fontsize=9)
        return
    # in the plan's order; a variant it no longer has (older data) goes last rather than unseen
    variants = sorted({r["variant"] for r in rows}, key=lambda v: (_at(v), v))
    width = 0.8 / len(LAYOUTS)
    for x, variant in enumerate(variants):
        found = [r for layout in LAYOUTS for r in rows if r["variant"] == variant and r["layout"] == layout]
        for i, r in enumerate(found):
            middle = r["x_copy"]
            spread = [[middle - r.get("x_copy_p25", middle)], [r.get("x_copy_p75", middle) - middle]]
            bars = ax.bar(
                x + (i - (len(found) - 1) / 2) * width, middle, width, color=COLORS[r["layout"]],
                yerr=spread, error_kw={"elinewidth": 0.8, "capsize": 2},
            )  # fmt: skip
            ax.bar_label(bars, fmt="{:.3g}", fontsize=6, padding=2)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
    busy = ", another core busy" if shape == "small" else ""
    ax.set_title(f"{backend}, {shape}{busy}", fontsize=9)


def _at(variant: str) -> int:
    return VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)


def _title(summary: dict[str, Any]) -> str:
    machine = summary.get("machine", {})
    cases = summary.get("config", {}).get("cases", {})
    dims = ", ".join(f"{n} {tuple(c['dims'])}" for n, c in cases.items())
    version = machine.get("versions", {}).get("anyrope", "")
    where = f"{machine.get('cpu_model_name', '')}, {machine.get('cpu_count', '?')} CPUs"
    return (
        f"anyrope {version}: float32 time per tensor / copy (median, whiskers q1-q3); {dims}\n"
        f"{where}, {machine.get('platform', '')}"
    )
