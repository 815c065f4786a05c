"""Read a run's pyperf JSON and report: medians with quartiles, ratios, a table and a plot.

    python benchmarks/rope_report.py bench-results

Reads ``DIR/run.json`` (what benchmarks/run.py planned, skipped and saw fail), the pyperf
files under ``DIR/pyperf/``, ``DIR/overhead.json`` (the call-overhead table) and
``DIR/prologue.json`` (the attention prologue's table); writes ``DIR/bench.json`` (the summary the docs plot reads, no
pyperf needed), ``DIR/bench.txt`` and ``DIR/bench.png``. ``python -m pyperf compare_to`` on two
runs' pyperf files compares them benchmark by benchmark.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import bench_prologue

import rope_cases
from bench_overhead import NOTES as OVERHEAD_NOTES
from bench_overhead import ROWS, held, shown, verdict
from rope_cases import COMPILED_REFERENCES, REFERENCES, SHAPES, SPECS, VARIANT_ORDER

SCHEMA = 3  # 3: pyperf runs; quartiles and the ratios' spread; first call as pyperf values
Record = dict[str, Any]
VERSIONS = ("anyrope", "array-api-compat", "numpy", "numba", "torch", "mlx", "jax", "jaxlib",
            "cupy-cuda12x", "transformers", "rotary-embedding-torch", "pyperf", "matplotlib")  # fmt: skip


def _stats(bench: Any) -> Record:
    return {
        "median_s": bench.median(), "p25_s": bench.percentile(25), "p75_s": bench.percentile(75),
        "values": bench.get_nvalue(), "processes": sum(1 for run in bench.get_runs() if run.values),
        "loops": bench.get_loops(),
    }  # fmt: skip


def timed_records(path: Path) -> list[Record]:
    """One record per benchmark of a pyperf file of benchmarks/bench_rope.py."""
    pyperf = __import__("pyperf")
    records = []
    for bench in pyperf.BenchmarkSuite.load(str(path)).get_benchmarks():
        backend, shape, dtype, layout, variant = bench.get_name().split("/")
        meta = bench.get_metadata()
        dims = [int(d) for d in str(meta["rope_dims"]).split("x")]
        records.append({
            "backend": backend, "shape": shape, "dtype": dtype, "layout": layout, "variant": variant,
            "dims": dims, "tensors": int(meta["rope_tensors"]), "status": "ok", **_stats(bench),
        })  # fmt: skip
    return records


def first_call_records(path: Path) -> list[Record]:
    """One record per benchmark of benchmarks/bench_first_call.py (a value per process)."""
    pyperf = __import__("pyperf")
    records = []
    for bench in pyperf.BenchmarkSuite.load(str(path)).get_benchmarks():
        _, backend, variant = bench.get_name().split("/")
        records.append({"backend": backend, "variant": variant, "status": "ok", **_stats(bench)})
    return records


def machine(paths: Iterable[Path]) -> Record:
    """Where the run happened, from pyperf's metadata (no host name) and the installed versions."""
    pyperf = __import__("pyperf")
    meta: Record = {}
    for path in paths:
        meta = pyperf.BenchmarkSuite.load(str(path)).get_benchmarks()[0].get_metadata()
        break
    versions = {}
    for dist in VERSIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    keep = (
        "platform",
        "cpu_model_name",
        "cpu_count",
        "cpu_affinity",
        "python_version",
        "python_implementation",
    )
    return {**{k: meta[k] for k in keep if k in meta}, "versions": versions}


def _per_tensor(record: Record, key: str = "median_s") -> float:
    return float(record[key]) / int(record["tensors"])


def _divide(record: Record, by: Record, name: str) -> None:
    """``record[name]`` and its quartiles ``name_p25``, ``name_p75``: the record's median and
    quartiles per tensor over ``by``'s median per tensor."""
    for suffix, key in (("", "median_s"), ("_p25", "p25_s"), ("_p75", "p75_s")):
        record[name + suffix] = _per_tensor(record, key) / _per_tensor(by)


def _reference(
    ok: dict[tuple[str, ...], Record], record: Record, refs: dict[str, bool]
) -> tuple[str, Record] | None:
    """The first peer of ``refs`` that ran for the record's backend, shape and dtype, named with
    " (half)" where it is of that layout instead of the record's own."""
    for ref_name, same_layout in refs.items():
        layout = record["layout"] if same_layout else "half"
        ref = ok.get((record["backend"], record["shape"], record["dtype"], layout, ref_name))
        if ref is not None:
            return ref_name + ("" if layout == record["layout"] else f" ({layout})"), ref
    return None


def add_ratios(results: Sequence[Record]) -> list[Record]:
    """The records with ``x_copy`` (and its quartiles) and, where a reference peer ran, ``x_ref``;
    compiled rows also with ``x_ccopy`` and ``x_cpeer`` (each with its quartiles).

    Ratios are of time per tensor (a call on q and k counts twice), against the same backend,
    shape and dtype: ``copy`` of the same layout, and the reference of ``REFERENCES``. A compiled
    row's ``x_ccopy`` divides by the backend's compiled copy of the same layout, and ``x_cpeer``
    by the peer of ``COMPILED_REFERENCES``, compiled the same way. The quartiles of a ratio divide
    the record's quartiles by the other's median.
    """
    ok: dict[tuple[str, ...], Record] = {
        (r["backend"], r["shape"], r["dtype"], r["layout"], r["variant"]): r
        for r in results
        if r.get("status") == "ok"
    }
    out = []
    for record in results:
        record = dict(record)
        if record.get("status") == "ok":
            key = (record["backend"], record["shape"], record["dtype"], record["layout"])
            copy = ok.get((*key, "copy"))
            if copy is not None:
                _divide(record, copy, "x_copy")
            found = _reference(ok, record, REFERENCES)
            if found is not None:
                record["ref"], ref = found
                record["x_ref"] = _per_tensor(record) / _per_tensor(ref)
            spec = SPECS.get(record["backend"])
            if spec is not None and spec.is_compiled(record["variant"]):
                ccopy = ok.get((*key, spec.compiled_copy or ""))
                if ccopy is not None:
                    record["ccopy"] = spec.compiled_copy
                    _divide(record, ccopy, "x_ccopy")
                found = _reference(ok, record, COMPILED_REFERENCES)
                if found is not None:
                    record["cpeer"], peer = found
                    _divide(record, peer, "x_cpeer")
        out.append(record)
    return out


def overhead(out: Path) -> Record:
    """``DIR/overhead.json``: bench_overhead.py's record, each row with its target and whether it
    held (None: not measured), or the error or skip that benchmarks/run.py wrote in its place; or a
    record saying that there is none."""
    record = _table_record(out / "overhead.json", "--no-overhead")
    if "rows" in record:
        record["rows"] = [{**r, "target": ROWS[r["id"]].target, "held": held(r)} for r in record["rows"]]
    return record


def prologue(out: Path) -> Record:
    """``DIR/prologue.json``: bench_prologue.py's record, each row with its target and whether it
    held, or what benchmarks/run.py wrote in its place; or a record saying that there is none."""
    record = _table_record(out / "prologue.json", "--no-prologue")
    if "rows" in record:
        targets = bench_prologue.ROWS
        record["rows"] = [
            {**r, "target": targets[r["id"]].target, "held": bench_prologue.held(r)} for r in record["rows"]
        ]
    return record


def _table_record(path: Path, option: str) -> Record:
    if not path.exists():
        return {"status": "skipped", "detail": f"no {path} (benchmarks/run.py writes it unless {option})"}
    return dict(json.loads(path.read_text()))


def summarize(out: Path) -> Record:
    """The summary of the run in ``out``: config, machine, every benchmark's record, first calls."""
    run = json.loads((out / "run.json").read_text())
    rope_files = sorted((out / "pyperf").glob("rope-*.json"))
    first_file = out / "pyperf" / "first-call.json"
    results = [r for path in rope_files for r in timed_records(path)] + run["not_timed"]
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine([*rope_files, first_file]),
        "config": run["config"],
        "results": add_ratios(results),
        "first_call": (first_call_records(first_file) if first_file.exists() else [])
        + run["first_call_failed"],
        "paired": run.get("paired", []),
        "overhead": overhead(out),
        "prologue": prologue(out),
    }


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}" if ms >= 1 else f"{ms:.4f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _spread(r: Record, name: str) -> str:
    """A ratio with its quartiles, "median (q1-q3)", or "" where the record has none."""
    if name not in r:
        return ""
    return f"{r[name]:.2f} ({r[name + '_p25']:.2f}-{r[name + '_p75']:.2f})"


def order(r: Record) -> tuple[int, ...]:
    """Backends, shapes, dtypes, layouts and variants in the plan's order."""

    def at(values: Sequence[str], value: str) -> int:
        return values.index(value) if value in values else len(values)

    return (
        at(list(SPECS), r["backend"]),
        at(SHAPES, r.get("shape", "")),
        at(rope_cases.DTYPE_ORDER, r.get("dtype", "")),
        at(rope_cases.LAYOUTS, r.get("layout", "")),
        at(VARIANT_ORDER, r["variant"]),
    )


COLUMNS = (
    "backend", "shape", "dtype", "layout", "variant", "in", "median ms", "q1-q3 ms", "x copy", "x ref",
    "x ccopy (q1-q3)", "x cpeer (q1-q3)",
)  # fmt: skip


def _row(r: Record) -> list[str]:
    ran = r.get("status") == "ok"
    return [
        r["backend"], r["shape"], r["dtype"], r["layout"], r["variant"], "q,k" if r["tensors"] == 2 else "q",
        _ms(r["median_s"]) if ran else str(r.get("status")),
        f"{_ms(r['p25_s'])}-{_ms(r['p75_s'])}" if ran else "",
        _ratio(r.get("x_copy")), _ratio(r.get("x_ref")), _spread(r, "x_ccopy"), _spread(r, "x_cpeer"),
    ]  # fmt: skip


def columns(
    header: Sequence[str], rows: Sequence[list[str]], numeric: Iterable[str], group: int = 2
) -> list[str]:
    """Aligned lines: the header, a rule, the rows, a blank line where the first ``group`` cells change."""
    cells = [list(header), *rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    right = {header.index(c) for c in numeric}

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [line(cells[0]), "  ".join("-" * w for w in widths)]
    previous: list[str] | None = None
    for row in cells[1:]:
        if previous is not None and row[:group] != previous:
            lines.append("")
        previous = row[:group]
        lines.append(line(row))
    return lines


FIRST_COLUMNS = ("backend", "variant", "first s", "q1-q3 s", "processes")


def _first_row(r: Record) -> list[str]:
    if r.get("status") != "ok":
        return [r["backend"], r["variant"], str(r.get("status")), "", ""]
    spread = f"{r['p25_s']:.3f}-{r['p75_s']:.3f}"
    return [r["backend"], r["variant"], f"{r['median_s']:.3f}", spread, str(r["processes"])]


PAIRED_COLUMNS = (
    "backend",
    "shape",
    "dtype",
    "layout",
    "paired",
    "over",
    "ratio (q1-q3)",
    "blocks",
    "ms",
    "over ms",
)


def _paired_row(r: Record) -> list[str]:
    row = [r["backend"], r["shape"], r["dtype"], r["layout"], r["variant"], r["over"]]
    if r.get("status") != "ok":
        return [*row, str(r.get("status")), "", "", ""]
    ratio = f"{r['ratio']:.3f} ({r['ratio_p25']:.3f}-{r['ratio_p75']:.3f})"
    return [*row, ratio, f"{r['blocks']} x {r['loops']}", _ms(r["median_s"]), _ms(r["over_median_s"])]


OVERHEAD_COLUMNS = ("measure", "backend", "call", "value (q1-q3)", "target", "us", "over us", "per")
PROLOGUE_COLUMNS = ("measure", "backend", "case", "value (q1-q3)", "target", "us", "over us", "path")


def overhead_lines(record: Record) -> list[str]:
    """The "call overhead" table of bench_overhead.py's record, what it means, and what did not run."""
    return _table_lines("call overhead", record, OVERHEAD_COLUMNS, OVERHEAD_NOTES, verdict, digits=2)


def prologue_lines(record: Record) -> list[str]:
    """The "attention prologue" table of bench_prologue.py's record, what it means, what did not run."""

    def said(rows: list[Record]) -> str:
        return verdict(rows, bench_prologue.held)

    return _table_lines("attention prologue", record, PROLOGUE_COLUMNS, bench_prologue.NOTES, said, digits=0)


def _table_lines(
    title: str, record: Record, heads: Sequence[str], notes: Iterable[str], said: Any, *, digits: int
) -> list[str]:
    """A table of rows with targets (``heads``: the columns, the third and last named by the rows'
    fields), its notes and verdict, then each row that did not run and why."""
    lines = [title]
    if record.get("status") != "ok":
        return [*lines, f"{title}: {record.get('status')} ({record.get('detail', '')})"]
    rows, named, last = record["rows"], heads[2], heads[-1]

    def cells(r: Record) -> list[str]:
        mark = {True: " held", False: " missed", None: ""}[r.get("held")]
        timed = (
            [f"{r['us']:.{digits}f}", f"{r['over_us']:.{digits}f}", r[last]] if "us" in r else ["", "", ""]
        )
        return [r["measure"], r["backend"], r[named], shown(r), f"<= {r['target']:g}{mark}", *timed]

    lines += columns(heads, [cells(r) for r in rows], ("value (q1-q3)", "us", "over us"), 1)
    lines += ["", *notes, f"{title}: {record['blocks']} pairs of blocks a ratio; {said(rows)}"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{title} {r['backend']} {r[named]}: {r['status']} ({r.get('detail', '')})")
    return lines


def format_table(summary: Record) -> str:
    """The timed and failed rows (skips are listed below), the first calls, the paired rows, notes,
    and the call-overhead table with its notes."""
    rows = sorted((r for r in summary["results"] if r.get("status") != "skipped"), key=order)
    lines = columns(COLUMNS, [_row(r) for r in rows], COLUMNS[6:])
    first = sorted(summary.get("first_call", []), key=order)
    if first:
        lines += ["", *columns(FIRST_COLUMNS, [_first_row(r) for r in first], FIRST_COLUMNS[2:], 1)]
    paired = sorted(summary.get("paired", []), key=order)
    if paired:
        lines += ["", *columns(PAIRED_COLUMNS, [_paired_row(r) for r in paired], PAIRED_COLUMNS[6:])]
    lines += ["", *notes(summary)]
    if "overhead" in summary:  # summaries written before it have none
        lines += ["", *overhead_lines(summary["overhead"])]
    if "prologue" in summary:  # nor this one
        lines += ["", *prologue_lines(summary["prologue"])]
    return "\n".join(lines)


def notes(summary: Record) -> list[str]:
    """What the columns mean, the cases, the references and copies, the skips and failures."""
    found = [
        "median ms, q1-q3 ms: median and quartiles of pyperf's values (each the mean of a calibrated loop",
        "of calls, in several fresh processes); x copy: time per tensor / the backend's copy per tensor",
        "(same shape, dtype, layout); x ref: time per tensor / the reference peer's ((half) where the",
        "reference has only the half layout). in: q = the call rotates q only; q,k = q and k.",
        "Compiled rows: x ccopy: time per tensor / the backend's compiled copy's (same shape, dtype,",
        "layout); x cpeer: / the compiled peer's (its whole call, under the same compiler; (half) as for",
        "x ref); (q1-q3): the row's quartiles over the other's median.",
    ]
    for name, case in summary.get("config", {}).get("cases", {}).items():
        found.append(f"{name}: (batch, heads, seq, head_dim) = {tuple(case['dims'])}, {case['what']}")
    if summary.get("first_call"):
        found += [
            "first call: one value per fresh process, the library imported and a float32 q made first:",
            "import anyrope + RoPE + rope(q); compiled: the first torch.compile / jax.jit / mx.compile call",
            "of rope(q).",
        ]
    if summary.get("paired"):
        found += [
            "paired: the row timed again with the one it is divided by, both in one process, in blocks of",
            "the same number of calls taking turns (A B, then B A); ratio: the median over the pairs of",
            "blocks of the row's time over the other's, with quartiles; blocks: pairs x calls a block.",
        ]
    timed = {r["backend"] for r in summary["results"] if r.get("status") == "ok"}
    for backend in sorted(timed, key=list(SPECS).index):
        line = f"{backend}: copy = {SPECS[backend].copy}"
        for key, column in (("ref", "x ref"), ("ccopy", "x ccopy"), ("cpeer", "x cpeer")):
            names = {
                r[key].split(" (")[0] for r in summary["results"] if r["backend"] == backend and r.get(key)
            }
            line += f"; {column} against {' / '.join(sorted(names))}" if names else ""
        found.append(line)
    not_run: dict[tuple[str, str, str], list[str]] = {}  # (backend, status, detail) -> variants
    for r in [*summary["results"], *summary.get("first_call", []), *summary.get("paired", [])]:
        if r.get("status") in ("skipped", "error"):
            variants = not_run.setdefault((r["backend"], r["status"], r.get("detail", "")), [])
            name = f"{r['variant']} over {r['over']} paired" if "over" in r else r["variant"]
            variants += [] if name in variants else [name]
    for (backend, status, detail), variants in not_run.items():
        every = {r["variant"] for r in summary["results"] if r["backend"] == backend}
        which = "" if set(variants) == every else " " + ", ".join(variants)
        found.append(f"{backend}{which}: {status} ({detail})")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Report the run in the folder named by ``argv[0]`` (default bench-results)."""
    from rope_plot import plot

    out = Path((argv or sys.argv[1:] or ["bench-results"])[0])
    summary = summarize(out)
    table = format_table(summary)
    print(table)
    (out / "bench.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "bench.txt").write_text(table + "\n")
    why = plot(summary, out / "bench.png")
    print(f"\nwrote {out / 'bench.json'}, {out / 'bench.txt'}" + ("" if why else f", {out / 'bench.png'}"))
    if why:
        print(f"no plot: {why}")
    return 0 if any(r.get("status") == "ok" for r in summary["results"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
