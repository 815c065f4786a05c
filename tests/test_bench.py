"""``python -m anyrope bench``: that it runs and reports, never how fast (no timing assertions here)."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anyrope import _bench
from anyrope.__main__ import main

SRC = Path(__file__).resolve().parents[1] / "src"
TINY_PREFILL = (1, 2, 8, 128)
TINY_DECODE = (3, 2, 1, 128)


def _tiny_cases() -> list[_bench.Case]:
    prefill, decode = _bench.plan_cases(quick=True, repeat=2, decode_repeat=2)
    return [
        dataclasses.replace(prefill, dims=TINY_PREFILL),
        dataclasses.replace(decode, dims=TINY_DECODE, sample_s=0.0),
    ]


@pytest.fixture(scope="module")
def numpy_part() -> dict[str, Any]:
    pytest.importorskip("numpy")
    events: list[tuple[str, str]] = []
    part = _bench.run_backend(
        "numpy", _tiny_cases(), dtypes=["float32"], progress=lambda kind, label: events.append((kind, label))
    )
    part["events"] = events
    return part


def test_plan_cases() -> None:
    full = _bench.plan_cases()
    assert [c.name for c in full] == ["prefill", "decode"]
    assert full[0].dims == (1, 32, 4096, 128)
    assert full[0].repeat == 15
    assert full[1].dims == (32, 32, 1, 128)
    assert full[1].repeat == 200
    assert full[1].tensors == 2
    assert full[1].offsets == [1000 + 97 * i for i in range(32)]
    quick = _bench.plan_cases(quick=True, repeat=3)
    assert quick[0].dims == (1, 8, 1024, 128)
    assert quick[0].repeat == 3
    assert quick[0].offsets is None


def test_worker_records(numpy_part: dict[str, Any]) -> None:
    assert numpy_part["backend"] == "numpy"
    assert numpy_part["status"] == "ok"
    assert numpy_part["device"] == "cpu"
    records = numpy_part["results"]
    ran = [r for r in records if r["status"] == "ok"]
    groups = {(r["shape"], r["layout"]) for r in ran}
    assert groups == {(s, layout) for s in ("prefill", "decode") for layout in ("half", "interleaved")}
    for shape, layout in groups:
        variants = {r["variant"] for r in ran if (r["shape"], r["layout"]) == (shape, layout)}
        assert {"copy", "anyrope", "anyrope-generic"} <= variants
    for r in ran:
        assert r["dtype"] == "float32"
        assert r["median_s"] > 0
        assert r["min_s"] > 0
        assert r["samples"] == 2
        assert r["number"] == 1
        assert r["dims"] == list(TINY_PREFILL if r["shape"] == "prefill" else TINY_DECODE)
        assert r["tensors"] == (2 if r["shape"] == "decode" else 1)
    assert not [r for r in records if r["status"] == "error"]
    json.dumps(numpy_part)  # a worker's part must travel as JSON


def test_worker_progress(numpy_part: dict[str, Any]) -> None:
    events = numpy_part["events"]
    assert len(events) == 2 * 2 * 2  # start and done for 2 shapes x 2 layouts
    assert events[0] == ("start", "numpy prefill float32 half")
    assert events[-1] == ("done", "numpy decode float32 interleaved")


def _same(a: Any, b: Any) -> bool:
    np = pytest.importorskip("numpy")
    pairs = zip(a, b, strict=True) if isinstance(a, (tuple, list)) else [(a, b)]
    return all(np.allclose(x, y, atol=1e-6) for x, y in pairs)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_in_place_variants_rotate_like_the_call(layout: str) -> None:
    """anyrope-inplace, either way the API offers it, computes what the plain call does."""
    pytest.importorskip("numpy")
    import anyrope

    rt = _bench.make_runtime("numpy")
    for case in _tiny_cases():
        expected = _bench._anyrope_call(_bench._group(rt, case, "float32", layout))()
        if "out" in inspect.signature(anyrope.apply).parameters:
            variant = _bench._apply_out_variant(_bench._group(rt, case, "float32", layout))
            assert variant.call is not None
            assert _same(variant.call(), expected)
        variant = _bench._inplace_variant(_bench._group(rt, case, "float32", layout))
        if variant.call is not None:
            assert _same(variant.call(), expected)  # the first call: later ones rotate again


def test_measure_reports_failures_and_interleaves() -> None:
    order: list[str] = []

    def ok(name: str) -> Any:
        return lambda: order.append(name)

    def broken() -> None:
        raise RuntimeError("boom")

    results = _bench.measure({"a": ok("a"), "b": ok("b"), "bad": broken}, repeat=3, warmup=1)
    assert isinstance(results["bad"], RuntimeError)
    for name in "ab":
        timing = results[name]
        assert isinstance(timing, _bench.Timing)
        assert timing.samples == 3
        assert timing.median_s >= 0
    # after one calibration call each, the rounds alternate which variant goes first
    assert order[2:] == ["a", "b", "b", "a", "a", "b"]


def _record(variant: str, median_s: float, *, layout: str = "half", tensors: int = 1, **extra: Any) -> Any:
    return {
        "backend": "torch", "device": "cpu", "shape": "prefill", "dims": [1, 2, 8, 128], "dtype": "float32",
        "layout": layout, "variant": variant, "tensors": tensors, "note": "", "status": "ok",
        "median_s": median_s, "min_s": median_s, "samples": 2, "number": 1, **extra,
    }  # fmt: skip


def _report() -> dict[str, Any]:
    parts = [
        {
            "backend": "torch", "status": "ok", "device": "cpu", "copy": "x.clone()",
            "results": [
                _record("copy", 0.001),
                _record("anyrope", 0.003),
                _record("transformers-apply", 0.008, tensors=2),
                _record("copy", 0.002, layout="interleaved"),
                _record("anyrope", 0.005, layout="interleaved"),
                {**_record("anyrope-inplace", 0.0), "status": "skipped", "detail": "no in-place API"},
                {**_record("anyrope-generic", 0.0), "status": "error", "detail": "RuntimeError: boom"},
            ],
        },
        {"backend": "cupy", "status": "skipped", "detail": "CuPy finds no CUDA device"},
    ]  # fmt: skip
    return _bench.merge(parts, machine=_bench.machine_info(), config={"cases": {}})


def test_merge_adds_ratios() -> None:
    report = _report()
    assert report["schema"] == _bench.SCHEMA
    assert set(report["backends"]) == {"torch", "cupy"}
    assert "results" not in report["backends"]["torch"]
    assert report["machine"]["cpu_count"] >= 1
    rows = {(r["variant"], r["layout"]): r for r in report["results"]}
    assert rows["copy", "half"]["x_copy"] == pytest.approx(1.0)
    assert rows["anyrope", "half"]["x_copy"] == pytest.approx(3.0)
    assert rows["transformers-apply", "half"]["x_copy"] == pytest.approx(4.0)  # per tensor: q and k
    assert rows["anyrope", "half"]["x_ref"] == pytest.approx(0.75)
    assert rows["anyrope", "half"]["ref"] == "transformers-apply"
    assert rows["anyrope", "interleaved"]["x_copy"] == pytest.approx(2.5)  # its own layout's copy
    assert rows["anyrope", "interleaved"]["ref"] == "transformers-apply (half)"
    assert "x_copy" not in rows["anyrope-inplace", "half"]
    json.dumps(report)


def test_format_table() -> None:
    table = _bench.format_table(_report())
    lines = table.splitlines()
    header = lines[0].split()
    assert header[:5] == ["backend", "shape", "dtype", "layout", "variant"]
    assert "median" in header
    assert "copy" in header
    anyrope_half = next(line for line in lines if " anyrope " in line and " half " in line)
    assert anyrope_half.split()[-3:] == ["3.00", "3.00", "0.75"]
    assert any("error" in line and "anyrope-generic" in line for line in lines)
    assert "torch anyrope-inplace: skipped (no in-place API)" in table
    assert "cupy: skipped (CuPy finds no CUDA device)" in table
    assert "x ref against transformers-apply" in table


def test_plot_or_reason(tmp_path: Path) -> None:
    path = tmp_path / "bench.png"
    why = _bench.plot(_report(), path)
    assert (why is None) == path.exists()
    if why is not None:
        assert "matplotlib" in why


def test_text_progress_bar() -> None:
    stream = io.StringIO()
    bar = _bench.Progress(4, stream, use_tqdm=False)
    bar.update("numpy prefill float32 half")  # a log gets a line per finished step only
    bar.update("numpy prefill float32 half", 1)
    bar.update("numpy: finished", 3)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "1/4" in lines[0]
    assert "numpy prefill float32 half" in lines[0]
    assert "4/4" in lines[1]


def _fake_worker(code: str) -> Any:
    def argv(name: str, json_out: Path, args: Any) -> list[str]:
        return [sys.executable, "-c", code, str(json_out)]

    return argv


def test_launch_follows_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numpy")  # launch runs only installed backends
    done = _bench.EVENT + json.dumps({"event": "done", "label": "numpy prefill float32 half"})
    part = {"backend": "numpy", "status": "ok", "results": []}
    code = (
        f"import sys, pathlib; print({done!r}); print('chatter'); "
        f"pathlib.Path(sys.argv[1]).write_text({json.dumps(part)!r})"
    )
    monkeypatch.setattr(_bench, "_worker_argv", _fake_worker(code))
    stream = io.StringIO()
    bar = _bench.Progress(3, stream, use_tqdm=False)
    args = _bench_args()
    assert _bench.launch("numpy", args, bar, tmp_path / "worker.log", 3) == part
    assert bar.done == 3
    assert "1/3 " in stream.getvalue()
    assert (tmp_path / "worker.log").read_text() == "chatter\n"  # what is not an event goes to the log

    monkeypatch.setattr(
        _bench, "_worker_argv", _fake_worker("import sys; print('Traceback: boom'); sys.exit(3)")
    )
    crashed = _bench.launch(
        "numpy", args, _bench.Progress(3, io.StringIO(), use_tqdm=False), tmp_path / "w.log", 3
    )
    assert crashed["status"] == "error"
    assert "exited with 3" in crashed["detail"]
    assert "boom" in (tmp_path / "w.log").read_text()


def _bench_args(*argv: str) -> Any:
    from anyrope.__main__ import _parser

    return _parser().parse_args(["bench", *argv])


def test_bench_arguments() -> None:
    args = _bench_args("--quick", "--backend", "numpy", "--backend", "torch", "--repeat", "3")
    assert args.backends == ["numpy", "torch"]
    assert args.quick
    assert args.repeat == 3
    assert args.out == "bench-results"
    assert args.worker is None
    argv = _bench._worker_argv("torch", Path("part.json"), args)
    assert argv[1:6] == ["-m", "anyrope", "bench", "--worker", "torch"]
    assert "--quick" in argv
    assert argv[argv.index("--repeat") + 1] == "3"
    with pytest.raises(SystemExit):
        _bench_args("--repeat", "0")


def test_bench_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m anyrope bench")
    for option in ("--backend", "--quick", "--repeat", "--out"):
        assert option in out


def test_bench_help_runs_as_module() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-m", "anyrope", "bench", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--quick" in result.stdout


def test_bench_imports_no_array_library() -> None:
    code = (
        "import sys, anyrope._bench, anyrope.__main__; "
        "print(sorted({'numpy', 'torch', 'mlx'} & set(sys.modules)))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
