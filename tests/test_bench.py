"""``python -m anyrope bench``: that it runs and reports, never how fast (no timing assertions here)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anyrope import _bench
from anyrope.__main__ import main

SRC = Path(__file__).resolve().parents[1] / "src"
TINY_PREFILL = (1, 2, 8, 128)
TINY_DECODE = (3, 2, 1, 128)
TINY_SMALL = (1, 2, 4, 64)
TINY = {"prefill": TINY_PREFILL, "decode": TINY_DECODE, "small": TINY_SMALL}


def _tiny_cases() -> list[_bench.Case]:
    prefill, decode, small = _bench.plan_cases(quick=True, repeat=2, decode_repeat=2)
    return [
        dataclasses.replace(prefill, dims=TINY_PREFILL),
        dataclasses.replace(decode, dims=TINY_DECODE, sample_s=0.0),
        dataclasses.replace(small, dims=TINY_SMALL, sample_s=0.0),
    ]


def _tiny(name: str) -> _bench.Case:
    return next(case for case in _tiny_cases() if case.name == name)


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
    assert [c.name for c in full] == ["prefill", "decode", "small"]
    assert full[0].dims == (1, 32, 4096, 128)
    assert full[0].repeat == 15
    assert full[1].dims == (32, 32, 1, 128)
    assert full[1].repeat == 200
    assert full[1].tensors == 2
    assert full[1].offsets == [1000 + 97 * i for i in range(32)]
    assert full[1].busy == 0
    small = full[2]
    assert small.dims == (1, 8, 16, 64)
    assert small.head_dim == 64
    assert (small.offset, small.busy, small.tensors, small.offsets) == (5, 1, 1, None)
    assert small.repeat == 200
    assert small.sample_s > 0  # a call that small is looped within a sample
    assert "position 5" in small.what
    assert "busy" in small.what
    quick = _bench.plan_cases(quick=True, repeat=3, decode_repeat=7)
    assert quick[0].dims == (1, 8, 1024, 128)
    assert quick[0].repeat == 3
    assert quick[0].offsets is None
    assert quick[2].dims == (1, 8, 16, 64)
    assert quick[2].repeat == 7


def test_worker_records(numpy_part: dict[str, Any]) -> None:
    assert numpy_part["backend"] == "numpy"
    assert numpy_part["status"] == "ok"
    assert numpy_part["device"] == "cpu"
    records = numpy_part["results"]
    ran = [r for r in records if r["status"] == "ok"]
    groups = {(r["shape"], r["layout"]) for r in ran}
    assert groups == {(s, layout) for s in TINY for layout in ("half", "interleaved")}
    for shape, layout in groups:
        variants = {r["variant"] for r in ran if (r["shape"], r["layout"]) == (shape, layout)}
        assert {"copy", "anyrope", "anyrope-generic"} <= variants
        assert ("numpy-formula" in variants) == (shape == "small")  # the small case's reference
        assert not variants & {"anyrope-compiled", "anyrope-jit"}  # NumPy has no compiler
    for r in ran:
        assert r["dtype"] == "float32"
        assert r["median_s"] > 0
        assert r["min_s"] > 0
        assert r["samples"] == 2
        assert r["number"] == 1
        assert r["dims"] == list(TINY[r["shape"]])
        assert r["tensors"] == (2 if r["shape"] == "decode" else 1)
        assert r["busy_cores"] == (1 if r["shape"] == "small" else 0)
    assert not [r for r in records if r["status"] == "error"]
    assert "first_call" not in numpy_part  # only when asked for
    json.dumps(numpy_part)  # a worker's part must travel as JSON
    small = [r for r in _bench.add_ratios(records) if r["shape"] == "small" and r["variant"] == "anyrope"]
    assert {r["ref"] for r in small} == {"numpy-formula"}  # of the row's own layout
    assert all(r["x_ref"] > 0 for r in small)


def test_worker_progress(numpy_part: dict[str, Any]) -> None:
    events = numpy_part["events"]
    assert len(events) == 2 * 3 * 2  # start and done for 3 shapes x 2 layouts
    assert events[0] == ("start", "numpy prefill float32 half")
    assert events[-1] == ("done", "numpy small float32 interleaved")


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


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_naive_formula_rotates_like_anyrope(layout: str, dtype: str) -> None:
    """numpy-formula, the small case's reference, computes RoPE (in the input's dtype)."""
    np = pytest.importorskip("numpy")
    import anyrope

    g = _bench._group(_bench.make_runtime("numpy"), _tiny("small"), dtype, layout)
    (variant,) = _bench.numpy_formula_variant(g)
    assert variant.call is not None
    result = variant.call()
    assert result.dtype == np.dtype(dtype)
    expected = anyrope.RoPE(64, layout=layout)(g.q.astype(np.float64), offset=5)
    assert np.allclose(result, expected, atol=1e-5 if dtype == "float32" else 1e-2)


def _gone(proc: subprocess.Popen[str]) -> bool:
    """The process has exited and was reaped: its pid no longer names it."""
    if proc.poll() is None:
        return False
    try:
        os.kill(proc.pid, 0)
    except ProcessLookupError:
        return True
    return False  # pragma: no cover - only if the pid was reused at once


def test_busy_cores_spin_and_always_stop() -> None:
    with _bench.busy_cores(2) as procs:
        assert len(procs) == 2
        assert all(proc.poll() is None for proc in procs)  # each said it is spinning
    assert all(_gone(proc) for proc in procs)
    procs = []

    def spin_then_fail() -> None:
        with _bench.busy_cores() as started:
            procs.extend(started)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        spin_then_fail()
    assert len(procs) == 1
    assert _gone(procs[0])


@dataclasses.dataclass
class Spinners:
    started: list[subprocess.Popen[str]] = dataclasses.field(default_factory=list)
    alive_when_timed: list[int] = dataclasses.field(default_factory=list)  # per call of measure


@pytest.fixture
def spinners(monkeypatch: pytest.MonkeyPatch) -> Spinners:
    """The helpers bench_group starts, and how many of them spin whenever its timing begins."""
    seen = Spinners()
    real_busy, real_measure = _bench.busy_cores, _bench.measure

    @contextlib.contextmanager
    def busy(count: int = 1) -> Iterator[list[subprocess.Popen[str]]]:
        with real_busy(count) as procs:
            seen.started.extend(procs)
            yield procs

    def measure(*args: Any, **kwargs: Any) -> Any:
        seen.alive_when_timed.append(sum(proc.poll() is None for proc in seen.started))
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(_bench, "busy_cores", busy)
    monkeypatch.setattr(_bench, "measure", measure)
    return seen


def test_small_case_runs_with_a_busy_core(spinners: Spinners) -> None:
    pytest.importorskip("numpy")
    rt = _bench.make_runtime("numpy")
    records = _bench.bench_group(rt, _tiny("small"), "float32", "half")
    assert {r["status"] for r in records} == {"ok"}
    assert len(spinners.started) == 1
    assert spinners.alive_when_timed == [1]  # spinning while the rounds were timed
    assert _gone(spinners.started[0])
    _bench.bench_group(rt, _tiny("prefill"), "float32", "half")
    assert len(spinners.started) == 1  # no helper for the other cases
    assert spinners.alive_when_timed == [1, 0]


def test_busy_core_stops_when_the_group_fails(spinners: Spinners, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numpy")

    def broken(*args: Any) -> Any:
        raise RuntimeError("no inputs")

    monkeypatch.setattr(_bench, "_group", broken)
    with pytest.raises(RuntimeError, match="no inputs"):
        _bench.bench_group(_bench.make_runtime("numpy"), _tiny("small"), "float32", "half")
    assert len(spinners.started) == 1
    assert _gone(spinners.started[0])


def test_first_call_in_a_fresh_process() -> None:
    pytest.importorskip("numpy")
    records = _bench.first_call("numpy", dims=(1, 2, 8, 64), warm=2)
    assert [r["variant"] for r in records] == ["anyrope"]  # NumPy has no compiler
    (r,) = records
    assert r["status"] == "ok", r
    assert (r["backend"], r["dtype"], r["dims"], r["warm_calls"]) == ("numpy", "float32", [1, 2, 8, 64], 2)
    assert r["first_s"] > 0
    assert r["warm_s"] > 0
    assert r["second_s"] > 0
    assert r["first_over_warm"] == pytest.approx(r["first_s"] / r["warm_s"])
    json.dumps(records)
    (failed,) = _bench.first_call("no-such-backend", dims=(1, 2, 8, 64), warm=2)
    assert failed["status"] == "error"
    assert "KeyError" in failed["detail"]


def test_jax_runtime_and_jit_variant() -> None:
    pytest.importorskip("jax")
    np = pytest.importorskip("numpy")
    assert "jax" in _bench.default_backends()
    cases = [_tiny("decode"), _tiny("small")]  # prefill is small's code path from position 0
    part = _bench.run_backend("jax", cases, dtypes=["float32"], layouts=["half"])
    assert part["status"] == "ok"
    assert part["device"] == "cpu"
    for shape in ("decode", "small"):
        rows = {r["variant"]: r for r in part["results"] if r["shape"] == shape}
        for variant in ("copy", "anyrope", "anyrope-jit", "anyrope-generic"):
            assert rows[variant]["status"] == "ok", rows[variant]
        assert rows["anyrope-inplace"]["status"] == "skipped"
        assert "immutable" in rows["anyrope-inplace"]["detail"]
    rt = _bench.make_runtime("jax")
    with rt.scope():
        g = _bench._group(rt, _tiny("decode"), "float32", "half")
        assert str(g.offsets.dtype) == "int32"
        (jit,) = _bench.compiled_anyrope_variant(g)
        assert jit.name == "anyrope-jit"
        assert jit.call is not None
        assert "traced" in jit.note
        assert _same(jit.call(), _bench._anyrope_call(g)())
        copied = rt.copy(g.q)  # a copy that moves the bytes: a buffer of its own
        assert copied.unsafe_buffer_pointer() != g.q.unsafe_buffer_pointer()
        assert np.array_equal(np.asarray(copied), np.asarray(g.q))


def test_torch_compiled_variant_makes_a_record(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    builders = (_bench.copy_variant, _bench.compiled_anyrope_variant)
    monkeypatch.setattr(_bench, "BUILDERS", builders)  # one compile, no peers
    rt = _bench.make_runtime("torch")
    records = _bench.bench_group(rt, _tiny("decode"), "float32", "half")
    (r,) = [r for r in records if r["variant"] == "anyrope-compiled"]
    assert r["status"] in ("ok", "skipped")
    if r["status"] == "ok":
        assert r["median_s"] > 0
        assert "offsets traced" in r["note"]
    else:
        assert "torch.compile(fullgraph=True) failed" in r["detail"]


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


def _small(variant: str, median_s: float, *, layout: str = "half") -> Any:
    return _record(variant, median_s, layout=layout, backend="numpy", shape="small", dims=[1, 8, 16, 64])


FIRST_CALL = [
    {"backend": "torch", "dims": [1, 8, 1024, 128], "dtype": "float32", "variant": "anyrope", "status": "ok",
     "note": "", "first_s": 0.5, "second_s": 0.01, "warm_s": 0.01, "warm_calls": 10, "first_over_warm": 50.0},
    {"backend": "torch", "dims": [1, 8, 1024, 128], "dtype": "float32", "variant": "anyrope-compiled",
     "status": "skipped", "detail": "torch.compile(fullgraph=True) failed: no compiler"},
]  # fmt: skip


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
            "first_call": FIRST_CALL,
        },
        {
            "backend": "numpy", "status": "ok", "device": "cpu", "copy": "x.copy()",
            "results": [
                _small("copy", 1e-6), _small("anyrope", 8e-6), _small("numpy-formula", 1e-5),
                _small("copy", 1e-6, layout="interleaved"), _small("anyrope", 3e-5, layout="interleaved"),
                _small("numpy-formula", 2e-5, layout="interleaved"),
            ],
        },
        {"backend": "cupy", "status": "skipped", "detail": "CuPy finds no CUDA device"},
    ]  # fmt: skip
    cases = {
        c.name: {"dims": list(c.dims), "what": c.what, "busy_cores": c.busy} for c in _bench.plan_cases()
    }
    return _bench.merge(parts, machine=_bench.machine_info(), config={"cases": cases})


def test_merge_adds_ratios() -> None:
    report = _report()
    assert report["schema"] == _bench.SCHEMA
    assert set(report["backends"]) == {"torch", "numpy", "cupy"}
    assert "results" not in report["backends"]["torch"]
    assert "first_call" not in report["backends"]["torch"]
    assert report["first_call"] == FIRST_CALL
    assert report["machine"]["cpu_count"] >= 1
    small = {r["layout"]: r for r in report["results"] if r["shape"] == "small" and r["variant"] == "anyrope"}
    assert small["half"]["x_ref"] == pytest.approx(0.8)
    assert small["half"]["ref"] == "numpy-formula"
    assert small["interleaved"]["x_ref"] == pytest.approx(1.5)  # its own layout's formula
    assert small["interleaved"]["x_copy"] == pytest.approx(30.0)
    rows = {(r["variant"], r["layout"]): r for r in report["results"] if r["backend"] == "torch"}
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
    anyrope_half = next(
        line for line in lines if line.startswith("torch ") and " anyrope " in line and " half " in line
    )
    assert anyrope_half.split()[-3:] == ["3.00", "3.00", "0.75"]
    assert any("error" in line and "anyrope-generic" in line for line in lines)
    assert "torch anyrope-inplace: skipped (no in-place API)" in table
    assert "cupy: skipped (CuPy finds no CUDA device)" in table
    assert "x ref against transformers-apply" in table
    assert "x ref against numpy-formula" in table
    rows = [line.split() for line in lines if line.startswith("numpy ")]
    assert [(r[1], r[3], r[4]) for r in rows[:3]] == [
        ("small", "half", v) for v in ("copy", "anyrope", "numpy-formula")
    ]
    assert "small: timed with 1 core(s) busy" in table
    target = next(line for line in lines if line.startswith("target, numpy small: anyrope <= numpy-formula"))
    assert target.endswith("float32 half 0.80, float32 interleaved 1.50: not met")
    first = lines.index(next(line for line in lines if line.startswith("backend  variant")))
    assert lines[first].split() == ["backend", "variant", "first", "s", "warm", "ms", "first/warm"]
    assert lines[first + 2].split() == ["torch", "anyrope", "0.500", "10.00", "50"]
    assert lines[first + 3].split() == ["torch", "anyrope-compiled", "skipped"]
    assert (
        "torch anyrope-compiled first call: skipped (torch.compile(fullgraph=True) failed: no compiler)"
        in table
    )


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
    assert "--no-first-call" not in argv
    args = _bench_args("--backend", "jax", "--no-first-call")
    assert args.backends == ["jax"]
    assert "--no-first-call" in _bench._worker_argv("jax", Path("part.json"), args)
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
