"""benchmarks/: that the benchmark plans, runs and reports, never how fast (no timing assertions here).

benchmarks/ is on pytest's pythonpath; its scripts run in subprocesses with this checkout's src/
first on PYTHONPATH, so that they time this tree's anyrope.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bench_first_call
import bench_overhead
import bench_paired
import bench_rope
import rope_cases
import rope_plot
import rope_report
import rope_variants
import run
from rope_runtimes import make_runtime

ROOT = Path(__file__).resolve().parents[1]
SMALL = "numpy/small/float32/half/"


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def test_every_worker_registers_the_same_plan() -> None:
    """pyperf's workers each register the plan: it must come out the same every time, with
    unique names, and every size must describe a prefill, a decode step with one offset per row
    of q and k, and a small call timed with a busy core."""
    full = rope_cases.plan()
    assert full == rope_cases.plan()
    assert len({b.name for b in full}) == len(full)
    for size in ("full", "quick", "tiny"):
        prefill, decode, small = rope_cases.cases(size)
        assert prefill.dims[2] > decode.dims[2] == 1
        assert decode.offsets is not None
        assert len(decode.offsets) == decode.dims[0]
        assert decode.tensors == 2
        assert small.busy
        assert math.prod(small.dims) < math.prod(prefill.dims)
    with pytest.raises(ValueError, match="size must be one of full, quick, tiny"):
        rope_cases.cases("huge")


def test_registration_imports_no_array_library() -> None:
    """Every pyperf worker registers the whole plan: it must import neither anyrope nor a library."""
    code = (
        "import sys; import bench_rope, bench_first_call, rope_cases; rope_cases.plan(); "
        "bench_first_call.planned(); "
        "print(sorted({'anyrope', 'numpy', 'torch', 'mlx', 'jax', 'pyperf'} & set(sys.modules)))"
    )
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), _env()["PYTHONPATH"]])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_backends_come_from_backend_toml() -> None:
    specs = rope_cases.SPECS
    assert list(specs) == ["numpy", "torch", "mlx", "jax", "torch-cuda", "cupy"]
    assert specs["numpy"].dtypes == ("float32", "float16")  # backends/numpy: no bfloat16; float64 left out
    assert specs["torch-cuda"].gpu
    assert specs["cupy"].gpu
    assert not specs["torch"].gpu


def _variants(backend: str, shape: str, layout: str) -> dict[str, str]:
    found = rope_cases.plan(backends=[backend], shapes=[shape], dtypes=["float32"], layouts=[layout])
    return {b.variant: b.skip for b in found}


def test_variants_of_each_backend() -> None:
    numpy_small = _variants("numpy", "small", "half")
    assert list(numpy_small) == ["copy", "anyrope", "anyrope-generic", "anyrope-inplace", "numpy-formula"]
    assert "numpy-formula" not in _variants("numpy", "prefill", "half")  # the small case's reference
    decode = rope_cases.cases()[1]
    jax = {v: why for v, _, why in rope_cases.variants_of(rope_cases.SPECS["jax"], decode, "half")}
    assert jax["anyrope-inplace"] == "JAX arrays are immutable"  # whether or not JAX is installed
    assert "anyrope-jit" in _variants("jax", "decode", "half")
    assert "mx.fast.rope" in _variants("mlx", "prefill", "interleaved")
    torch_half, torch_interleaved = (
        _variants("torch", "prefill", "half"),
        _variants("torch", "prefill", "interleaved"),
    )
    assert {"anyrope-compiled", "transformers-apply", "transformers-full"} <= set(torch_half)
    assert "rotary-embedding-torch" in torch_interleaved
    assert "transformers-apply" not in torch_interleaved  # it has the half layout only
    # compiled anyrope beside the compiled copy and the compiled peer of its library
    assert "copy-compiled" in torch_half
    if not torch_half["transformers-apply"]:  # transformers installed (else not planned)
        assert {"transformers-apply-compiled", "transformers-full-compiled"} <= set(torch_half)
    assert {"copy-compiled", "anyrope-mx-compile", "mx.fast.rope-compiled"} <= set(
        _variants("mlx", "decode", "interleaved")
    )
    assert "naive-jit" in jax
    assert "copy-compiled" not in jax  # its copy is jitted already: the compiled rows' roofline
    assert rope_cases.SPECS["jax"].compiled_copy == "copy"
    assert rope_cases.SPECS["torch-cuda"].compiled_copy == "copy-compiled"


def test_every_variant_has_a_builder_and_a_place() -> None:
    """What the plan names, rope_variants builds, the report orders and (if compiled) marks so."""
    planned = {b.variant for b in rope_cases.plan()}
    assert planned <= set(rope_cases.VARIANT_ORDER) == set(rope_variants.BUILDERS)
    assert rope_cases.COMPILED.issubset(rope_cases.VARIANT_ORDER)
    assert set(rope_cases.COMPILED_REFERENCES) <= rope_cases.COMPILED
    for spec in rope_cases.BACKENDS:
        assert (spec.compiler is None) == (spec.compiled_copy is None), spec
        if spec.compiler:
            assert spec.is_compiled(spec.compiler)
            assert spec.is_compiled(spec.compiled_copy or "")
        assert not spec.is_compiled("anyrope")
    if not rope_cases.has_nvidia_gpu():  # skipped, saying why: a missing library or the GPU
        assert _variants("torch-cuda", "prefill", "half")["copy"] in (
            "torch is not installed",
            rope_cases.NO_GPU,
        )
        assert _variants("cupy", "prefill", "half")["copy"] in ("cupy is not installed", rope_cases.NO_GPU)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_numpy_variants_rotate_like_the_call(layout: str) -> None:
    """anyrope-generic, anyrope-inplace (first call) and numpy-formula compute what the call does."""
    np = pytest.importorskip("numpy")
    rt = make_runtime("numpy")
    for case in rope_cases.cases("tiny"):
        expected = rope_variants.anyrope_call(rope_variants.make_group(rt, case, "float32", layout))()
        for variant in ("anyrope-generic", "anyrope-inplace", "copy"):
            got = rope_variants.BUILDERS[variant](rope_variants.make_group(rt, case, "float32", layout))()
            if variant == "copy":
                assert not np.allclose(got, expected, atol=1e-6)  # the copy does not rotate
            else:
                assert np.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_naive_formula_rotates_like_anyrope(layout: str, dtype: str) -> None:
    """numpy-formula, the small case's reference, computes RoPE (in the input's dtype)."""
    np = pytest.importorskip("numpy")
    import anyrope

    g = rope_variants.make_group(make_runtime("numpy"), rope_cases.cases("tiny")[2], dtype, layout)
    result = rope_variants.BUILDERS["numpy-formula"](g)()
    assert result.dtype == np.dtype(dtype)
    expected = anyrope.RoPE(64, layout=layout)(g.q.astype(np.float64), offset=5)
    assert np.allclose(result, expected, atol=1e-5 if dtype == "float32" else 1e-2)


def _host(backend: str, result: Any) -> list[Any]:
    """The result's arrays (one, or q and k) as float32 NumPy arrays."""
    np = pytest.importorskip("numpy")
    arrays = result if isinstance(result, tuple) else (result,)
    if backend == "torch":
        return [x.float().numpy() for x in arrays]
    return [np.asarray(x, dtype=np.float32) for x in arrays]


# What each compiled variant must compute, within a tolerance: the eager anyrope call (or, for
# the copy, q and k themselves); the peers' tables are float32, off by 1e-4 at decode positions.
COMPILED_AGREE = {"copy-compiled": 0.0, "copy": 0.0, "anyrope-compiled": 1e-6, "anyrope-aoti": 1e-6, "anyrope-jit": 1e-6,
                  "anyrope-mx-compile": 1e-6, "naive-jit": 1e-3, "mx.fast.rope-compiled": 1e-3,
                  "transformers-apply-compiled": 1e-3, "transformers-full-compiled": 1e-3}  # fmt: skip


@pytest.mark.parametrize("name", ["torch", "jax", "mlx"])
def test_compiled_variants_rotate_like_the_call(name: str) -> None:
    """Every compiled variant builds (compiled, warmed up) and computes what it stands for, in the
    decode case (offsets traced) and the small one (a Python offset)."""
    pytest.importorskip(rope_cases.SPECS[name].module)
    rt = make_runtime(name)
    spec, checked = rope_cases.SPECS[name], set()
    with rt.scope():
        for case in rope_cases.cases("tiny")[1:]:
            for layout in rope_cases.LAYOUTS:
                g = rope_variants.make_group(rt, case, "float32", layout)
                expected = _host(name, rope_variants.anyrope_call(g)())
                for variant, tensors, why in rope_cases.variants_of(spec, case, layout):
                    if why or not spec.is_compiled(variant):
                        continue
                    bench = rope_cases.Bench(name, case, "float32", layout, variant, tensors)
                    got = _host(name, rope_variants.build(rt, bench)())
                    want = _host(name, (g.q, g.k)[:tensors]) if variant.startswith("copy") else expected
                    assert len(got) >= len(want), variant  # transformers' peers rotate q and k
                    for mine, theirs in zip(got[: len(want)], want, strict=True):
                        assert abs(mine - theirs).max() <= COMPILED_AGREE[variant], (variant, case, layout)
                    checked.add(variant)
    assert {spec.compiled_copy, spec.compiler} <= checked


def test_onnx_runtime_variants_rotate_like_the_call() -> None:
    """Both ONNX Runtime variants export, load and compute the eager call, decode (offsets an
    input of the model) and small (a Python offset), in both layouts."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    rt, spec = make_runtime("torch"), rope_cases.SPECS["torch"]
    with rt.scope():
        for case in rope_cases.cases("tiny")[1:]:
            for layout in rope_cases.LAYOUTS:
                g = rope_variants.make_group(rt, case, "float32", layout)
                expected = _host("torch", rope_variants.anyrope_call(g)())
                for variant in rope_cases.ONNX_VARIANTS:
                    assert (variant, case.tensors, "") in rope_cases.variants_of(spec, case, layout)
                    bench = rope_cases.Bench("torch", case, "float32", layout, variant, case.tensors)
                    got = rope_variants.build(rt, bench)()
                    for mine, theirs in zip(got, expected, strict=True):
                        # float32 tables of the same exact angles, values of size ~4: a few ulp
                        assert abs(mine - theirs).max() <= 1e-5, (variant, case, layout)
    bf16 = [
        b for b in rope_cases.plan("tiny", variants=list(rope_cases.ONNX_VARIANTS)) if b.dtype == "bfloat16"
    ]
    assert bf16, "the torch backend plans bfloat16"
    assert all(b.skip for b in bf16)


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
    with bench_rope.busy_cores(2) as procs:
        assert len(procs) == 2
        assert all(proc.poll() is None for proc in procs)  # each said it is spinning
    assert all(_gone(proc) for proc in procs)
    started: list[subprocess.Popen[str]] = []

    def spin_then_fail() -> None:
        with bench_rope.busy_cores() as procs:
            started.extend(procs)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        spin_then_fail()
    assert len(started) == 1
    assert _gone(started[0])


def test_small_case_is_timed_with_a_busy_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timed function builds on its first call and keeps a helper spinning while it times."""
    pytest.importorskip("numpy")
    monkeypatch.setattr(bench_rope, "_READY", {})
    small, prefill = (
        next(b for b in rope_cases.plan("tiny", backends=["numpy"]) if b.name == name)
        for name in (SMALL + "anyrope", "numpy/prefill/float32/half/anyrope")
    )
    try:
        assert bench_rope.timed(3, small) > 0
        (helper,) = bench_rope._READY[small.name].helpers
        assert helper.poll() is None  # spinning while this worker times
        ready = bench_rope._READY[small.name]
        assert bench_rope.timed(2, small) > 0
        assert bench_rope._READY[small.name] is ready  # built once
        assert bench_rope.timed(1, prefill) > 0
        assert bench_rope._READY[prefill.name].helpers == []  # the other cases run without one
    finally:
        bench_rope._OPEN.close()
    assert _gone(helper)


def test_first_call_runs_once_per_process() -> None:
    with pytest.raises(ValueError, match="--loops 1"):
        bench_first_call.first_call(2, "numpy", "anyrope")
    assert ("numpy", "anyrope") in bench_first_call.planned(["numpy"])
    if not rope_cases.backend_skip("mlx"):
        assert ("mlx", "anyrope-mx-compile") in bench_first_call.planned(["mlx"])
    assert bench_first_call.planned(["no-such-backend"]) == []


def test_split_argv() -> None:
    assert run.split_argv(["--quick", "--", "--rigorous", "-p", "4"]) == (
        ["--quick"],
        ["--rigorous", "-p", "4"],
    )
    assert run.split_argv(["--quick"]) == (["--quick"], [])


def test_rounds_take_turns_within_a_backend_case_and_dtype() -> None:
    """Every benchmark runs once per round; the benchmarks of one backend, case and dtype (both
    layouts) take turns, so that rows compared with each other are timed close together."""
    plan = rope_cases.plan("tiny", backends=["numpy"], shapes=["small", "decode"], dtypes=["float32"])
    steps = run.schedule(plan, 2)
    assert len(steps) == 2 * len(plan)
    assert sorted((r, b.name) for r, b in steps) == sorted((r, b.name) for r in (0, 1) for b in plan)
    groups = [(b.backend, b.case.name, b.dtype) for _, b in steps]
    assert [g for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]] == [
        ("numpy", "decode", "float32"), ("numpy", "small", "float32"),
    ]  # fmt: skip
    first = [b for r, b in steps if r == 0 and b.case.name == "decode"]
    again = [b for r, b in steps if r == 1 and b.case.name == "decode"]
    assert first == again == [b for b in plan if b.case.name == "decode"]
    assert {b.layout for b in first} == set(rope_cases.LAYOUTS)
    assert run.schedule(plan, 1) == [(0, b) for b in plan]


def _unskipped(benches: list[rope_cases.Bench]) -> list[rope_cases.Bench]:
    """The plan as a machine with every backend would have it (the variants' own skips kept)."""
    return [
        dataclasses.replace(b, skip="")
        if b.skip == rope_cases.backend_skip(b.backend) or b.skip == rope_cases.NO_GPU
        else b
        for b in benches
    ]


def test_pairs_are_two_variants_of_one_row() -> None:
    """Each row of PAIRED is paired, in every case, dtype and layout, with the variant it is
    divided by, and with nothing else; a skipped row or partner leaves the pair out."""
    plan = _unskipped(rope_cases.plan(backends=["mlx", "jax", "numpy"]))
    found = rope_cases.pairs(plan)
    for a, b in found:
        assert (a.backend, a.case, a.dtype, a.layout) == (b.backend, b.case, b.dtype, b.layout)
        assert rope_cases.PAIRED[a.backend, a.variant] == b.variant
    expected = {
        (b.backend, b.case.name, b.dtype, b.layout, b.variant)
        for b in plan
        if (b.backend, b.variant) in rope_cases.PAIRED
    }
    assert {(a.backend, a.case.name, a.dtype, a.layout, a.variant) for a, _ in found} == expected
    assert {a.backend for a, _ in found} == {"mlx", "jax"}  # numpy has no pair
    skipped = [dataclasses.replace(b, skip="x") if b.variant == "anyrope-jit" else b for b in plan]
    assert {a.backend for a, _ in rope_cases.pairs(skipped)} == {"mlx"}


def test_paired_times_two_variants_in_one_process() -> None:
    pytest.importorskip("numpy")
    small = {b.variant: b for b in rope_cases.plan("tiny", backends=["numpy"], shapes=["small"],
                                                    dtypes=["float32"], layouts=["half"])}  # fmt: skip
    record = bench_paired.time_pair(small["anyrope"], small["copy"], blocks=3, block_s=1e-4)
    assert (record["variant"], record["over"], record["status"], record["blocks"]) == (
        "anyrope",
        "copy",
        "ok",
        3,
    )
    assert (record["backend"], record["shape"], record["layout"], record["dims"]) == (
        "numpy",
        "small",
        "half",
        [1, 2, 4, 64],
    )
    assert record["loops"] >= 1
    assert 0 < record["ratio_p25"] <= record["ratio"] <= record["ratio_p75"]
    assert record["median_s"] > 0
    assert record["over_median_s"] > 0
    decode = rope_cases.plan(
        "tiny", backends=["numpy"], shapes=["decode"], dtypes=["float32"], layouts=["half"]
    )
    with pytest.raises(ValueError, match="a pair is two variants of one row"):
        bench_paired.time_pair(small["anyrope"], decode[0], blocks=3, block_s=1e-4)
    with pytest.raises(ValueError, match="blocks must be >= 1"):
        bench_paired.time_pair(small["anyrope"], small["copy"], blocks=0, block_s=1e-4)
    assert bench_paired.quartiles([2.0]) == (2.0, 2.0, 2.0)
    assert bench_paired.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)


def test_run_paired_records_each_pair_or_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pair runs in a process of its own; one that fails costs its record only."""
    pytest.importorskip("numpy")
    plan = rope_cases.plan("tiny", backends=["numpy"], shapes=["small"], dtypes=["float32"], layouts=["half"])
    broken = dataclasses.replace(plan[0], variant="no-such-variant")
    pairs = {("numpy", "anyrope"): "copy", ("numpy", "no-such-variant"): "copy"}
    monkeypatch.setattr(rope_cases, "PAIRED", pairs)
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    ok, failed = run.run_paired([*plan, broken], "tiny", 2, tmp_path)
    assert (ok["variant"], ok["over"], ok["status"], ok["blocks"]) == ("anyrope", "copy", "ok", 2)
    assert (tmp_path / "paired" / "numpy_small_float32_half_anyrope.json").exists()
    assert (failed["variant"], failed["status"]) == ("no-such-variant", "error")
    assert "no-such-variant" in failed["detail"]
    assert "log:" in failed["detail"]
    summary = {**_summary(), "paired": [ok, failed]}
    table = rope_report.format_table(summary)
    row = next(line for line in table.splitlines() if line.startswith("numpy ") and " anyrope " in line)
    assert row.split()[4:6] == ["anyrope", "copy"]
    assert row.split()[7].startswith("(")  # ratio (q1-q3)
    assert row.split()[8:10] == ["2", "x"]  # blocks: 2 x calls a block
    assert "numpy no-such-variant over copy paired: error (" in table
    assert "paired: the row timed again with the one it is divided by" in table


def test_alternate_takes_turns_and_divides_per_pair() -> None:
    """bench_paired.alternate on a fake clock: A takes twice B's time, the blocks go A B, B A, ...,
    each of the calls the slower one's warm call fills a block with."""
    ran: list[tuple[str, int]] = []
    cost = {"a": 2e-3, "b": 1e-3}

    def time_loops(call: Any, loops: int) -> float:
        ran.append((call(), loops))
        return cost[ran[-1][0]] * loops

    timed = bench_paired.alternate(lambda: "a", lambda: "b", time_loops, blocks=4, block_s=0.01)
    assert timed["loops"] == 5  # 0.01 s of A's 2 ms calls
    blocks = [name for name, loops in ran if loops == 5]
    assert blocks == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert ran[:2] == [("a", bench_paired.WARM_CALLS), ("b", bench_paired.WARM_CALLS)]
    assert (timed["ratio_p25"], timed["ratio"], timed["ratio_p75"]) == pytest.approx((2.0, 2.0, 2.0))
    assert (timed["median_s"], timed["over_median_s"]) == pytest.approx((2e-3, 1e-3))
    with pytest.raises(ValueError, match="blocks must be >= 1 and block_s > 0"):
        bench_paired.alternate(lambda: "a", lambda: "b", time_loops, blocks=2, block_s=0)


def _count_of(rows: list[dict[str, Any]], backend: str) -> list[int]:
    """The calls counted on ``backend``, each row checked for its fields first."""
    assert [r["id"] for r in rows] == [f"calls/{backend}/q", f"calls/{backend}/q,k"]
    for r in rows:
        assert r["status"] == "ok", r
        assert (r["measure"], r["backend"]) == ("python calls", backend)
        assert r["call"] == bench_overhead.ROWS[r["id"]].call
        assert isinstance(r["calls"], int)
        assert r["calls"] > 0
    return [r["calls"] for r in rows]


def test_overhead_counts_the_python_calls_of_a_call() -> None:
    """python_calls counts every Python function a call runs, the call itself included, once warm."""
    pytest.importorskip("numpy")

    def leaf() -> None:
        pass

    def two_leaves(x: Any, *, twice: bool) -> None:
        leaf()
        if twice:
            leaf()

    assert bench_overhead.python_calls(two_leaves, (1,), {"twice": True}) == 3
    assert bench_overhead.python_calls(two_leaves, (1,), {"twice": False}) == 2
    assert min(_count_of(bench_overhead.count_rows("numpy"), "numpy")) > 1  # RoPE.__call__ and more
    assert min(_count_of(bench_overhead.count_rows("numpy-blocked"), "numpy-blocked")) > 1
    pytest.importorskip("torch")
    assert min(_count_of(bench_overhead.count_rows("torch"), "torch")) > 1


def test_overhead_counts_the_triton_path_up_to_its_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton rows count in a process of their own under Triton's interpreter, the launch a stub."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    _count_of(bench_overhead.triton_rows(), "triton")
    if os.environ.get("TRITON_INTERPRET") == "1":  # nox -s tests-torch-triton: in this process too
        _count_of(bench_overhead.count_rows("triton"), "triton")
    else:  # which is why the rows count in a child process
        with pytest.raises(ValueError, match="kernel 'triton' cannot rotate q here: device cpu"):
            bench_overhead.count_rows("triton")


def _timed_fields(row: dict[str, Any], per: str) -> None:
    assert row["status"] == "ok", row
    assert (row["blocks"], row["per"]) == (2, per)
    assert row["loops"] >= 1
    assert 0 < row["ratio_p25"] <= row["ratio"] <= row["ratio_p75"]
    layers = bench_overhead.LAYERS if per == "layer" else 1
    assert row["us"] == pytest.approx(row["median_s"] / layers * 1e6)
    assert row["over_us"] == pytest.approx(row["over_median_s"] / layers * 1e6)
    assert row["us"] > 0


def test_overhead_times_tiny_calls_over_the_numpy_formula() -> None:
    pytest.importorskip("numpy")
    numpy, torch = bench_overhead.tiny_rows(blocks=2, block_s=1e-3)
    assert (numpy["id"], numpy["measure"], torch["id"]) == ("tiny/numpy", "x numpy formula", "tiny/torch")
    _timed_fields(numpy, "call")
    if rope_cases.installed("torch"):
        _timed_fields(torch, "call")
    else:
        assert (torch["status"], torch["detail"]) == ("skipped", "torch is not installed")


def test_overhead_times_a_decode_step_over_transformers() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    row = bench_overhead.decode_row(blocks=2, block_s=1e-3)
    assert (row["id"], row["measure"], row["backend"]) == ("decode/torch", "x transformers", "torch")
    _timed_fields(row, "layer")


def test_overhead_failure_costs_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of ROWS comes back, in order: measured, skipped or an error saying why."""
    pytest.importorskip("numpy")

    def boom() -> list[dict[str, Any]]:
        raise RuntimeError("boom")

    monkeypatch.setattr(bench_overhead, "triton_rows", boom)
    monkeypatch.setattr(bench_overhead, "tiny_rows", lambda blocks, block_s: boom())
    monkeypatch.setattr(bench_overhead, "decode_row", lambda blocks, block_s: {
        **bench_overhead._row("decode/torch"), "status": "skipped", "detail": "not here"})  # fmt: skip
    record = bench_overhead.measure(blocks=2, block_s=1e-3)
    assert (record["status"], record["blocks"]) == ("ok", 2)
    assert [r["id"] for r in record["rows"]] == list(bench_overhead.ROWS)
    status = {r["id"]: (r["status"], r.get("detail")) for r in record["rows"]}
    for name in ("calls/triton/q", "calls/triton/q,k", "tiny/numpy", "tiny/torch"):
        assert status[name] == ("error", "RuntimeError: boom")
    assert status["calls/numpy/q"] == ("ok", None)
    with pytest.raises(ValueError, match="blocks must be >= 1"):
        bench_overhead.measure(blocks=0)


def _overhead_record() -> dict[str, Any]:
    """A recorded overhead.json: every row measured but the Triton ones, tiny/torch over its target."""
    rows = []
    for name in bench_overhead.ROWS:
        if name.startswith("calls/triton/"):
            rows.append(
                {**bench_overhead._row(name), "status": "skipped", "detail": "triton is not installed"}
            )
        elif name.startswith("calls/"):
            rows.append({**bench_overhead._row(name), "status": "ok", "calls": 21})
        else:
            ratio, per = {
                "tiny/numpy": (0.5, "call"),
                "tiny/torch": (0.9, "call"),
                "decode/torch": (0.75, "layer"),
            }[name]
            rows.append({**bench_overhead._row(name), "status": "ok", "blocks": 2, "loops": 10, "ratio": ratio,
                         "ratio_p25": ratio - 0.01, "ratio_p75": ratio + 0.02, "median_s": 8e-6, "over_median_s": 1e-5,
                         "per": per, "us": 8.0, "over_us": 10.0})  # fmt: skip
    return {"status": "ok", "blocks": 2, "block_s": 0.25, "rows": rows}


def test_report_has_the_call_overhead_table(tmp_path: Path) -> None:
    (tmp_path / "overhead.json").write_text(json.dumps(_overhead_record()))
    record = rope_report.overhead(tmp_path)
    rows = {r["id"]: r for r in record["rows"]}
    assert (rows["calls/numpy/q"]["target"], rows["calls/numpy/q"]["held"]) == (30, True)
    assert (rows["tiny/torch"]["target"], rows["tiny/torch"]["held"]) == (0.8, False)
    assert rows["calls/triton/q"]["held"] is None
    lines = rope_report.format_table({**_summary(), "overhead": record}).splitlines()
    at = lines.index("call overhead")
    assert lines[at + 1].split()[:4] == ["measure", "backend", "call", "value"]
    table = "\n".join(lines[at:])
    row = next(line for line in lines[at:] if line.startswith("python calls") and "rope(q, offset=5)" in line)
    assert row.split()[-4:] == ["21", "<=", "30", "held"]
    tiny = next(line for line in lines[at:] if line.startswith("x numpy formula  torch"))
    assert tiny.split()[-8:] == ["0.90", "(0.89-0.92)", "<=", "0.8", "missed", "8.00", "10.00", "call"]
    decode = next(line for line in lines[at:] if line.startswith("x transformers"))
    assert decode.split()[-7:-3] == ["(0.74-0.77)", "<=", "1", "held"]
    assert decode.split()[-1] == "layer"
    ran = len(bench_overhead.ROWS) - 2  # all but the two Triton rows
    held = f"{ran - 1} of {ran} measured rows held their targets; missed: tiny/torch"
    assert f"call overhead: 2 pairs of blocks a ratio; {held}" in table
    assert "call overhead triton rope(q, offset=5): skipped (triton is not installed)" in table
    assert lines[-1].startswith("call overhead")  # the last section


def test_report_says_why_there_is_no_call_overhead_table(tmp_path: Path) -> None:
    missing = rope_report.overhead(tmp_path)
    assert missing["status"] == "skipped"
    assert rope_report.overhead_lines(missing) == [
        "call overhead",
        f"call overhead: skipped (no {tmp_path / 'overhead.json'} (benchmarks/run.py writes it unless --no-overhead))",
    ]
    (tmp_path / "overhead.json").write_text(
        json.dumps({"status": "error", "detail": "RuntimeError: boom (log: x)"})
    )
    table = rope_report.format_table({**_summary(), "overhead": rope_report.overhead(tmp_path)})
    assert table.endswith("call overhead\ncall overhead: error (RuntimeError: boom (log: x))")
    assert "call overhead" not in rope_report.format_table(_summary())  # a summary from before the table


def test_run_overhead_records_why_it_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_overhead.py runs in a process of its own; when it fails, overhead.json holds why."""
    pytest.importorskip("numpy")
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    record = run.run_overhead(0, tmp_path)
    assert record["status"] == "error"
    assert record["detail"].startswith(
        "ValueError: blocks must be >= 1 and block_s > 0, got 0 and 0.25 (log: "
    )
    assert json.loads((tmp_path / "overhead.json").read_text()) == record
    assert (tmp_path / "logs" / "overhead.log").exists()


def _prologue_record() -> dict[str, Any]:
    timed = {"ratio_p25": 0.2, "ratio": 0.21, "ratio_p75": 0.23, "us": 106.0, "over_us": 500.0}
    rows = [
        {"id": "prologue/numpy/decode", "status": "ok", "measure": "x steps apart", "backend": "numpy",
         "case": "decode", "path": "fused: numba", **timed},
        {"id": "prologue/torch/decode", "status": "ok", "measure": "x steps apart", "backend": "torch",
         "case": "decode", "path": "fused: numba", **timed, "ratio": 0.7, "ratio_p75": 0.72},
        {"id": "prologue-hf/torch/decode", "status": "skipped", "measure": "x transformers",
         "backend": "torch", "case": "decode", "detail": "transformers is not installed"},
    ]  # fmt: skip
    return {"status": "ok", "blocks": 2, "block_s": 0.25, "rows": rows}


def test_report_has_the_prologue_table(tmp_path: Path) -> None:
    """The prologue's rows with their targets (bench_prologue.ROWS), held or missed, and the verdict."""
    (tmp_path / "prologue.json").write_text(json.dumps(_prologue_record()))
    record = rope_report.prologue(tmp_path)
    rows = {r["id"]: r for r in record["rows"]}
    assert (rows["prologue/numpy/decode"]["target"], rows["prologue/numpy/decode"]["held"]) == (0.6, True)
    assert rows["prologue/torch/decode"]["held"] is False
    assert rows["prologue-hf/torch/decode"]["held"] is None
    lines = rope_report.format_table({**_summary(), "prologue": record}).splitlines()
    at = lines.index("attention prologue")
    assert lines[at + 1].split()[:4] == ["measure", "backend", "case", "value"]
    numpy_row = next(line for line in lines[at:] if line.split()[3:5] == ["numpy", "decode"])
    assert numpy_row.split()[-9:] == [
        "0.21",
        "(0.20-0.23)",
        "<=",
        "0.6",
        "held",
        "106",
        "500",
        "fused:",
        "numba",
    ]
    table = "\n".join(lines[at:])
    said = "1 of 2 measured rows held their targets; missed: prologue/torch/decode"
    assert f"attention prologue: 2 pairs of blocks a ratio; {said}" in table
    assert "attention prologue torch decode: skipped (transformers is not installed)" in table
    missing = rope_report.prologue(tmp_path / "none")
    assert rope_report.prologue_lines(missing)[-1].endswith(
        "(benchmarks/run.py writes it unless --no-prologue))"
    )


def test_run_prologue_records_why_it_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_prologue.py runs in a process of its own; when it fails, prologue.json holds why."""
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    record = run.run_prologue(0, tmp_path)
    assert record["status"] == "error"
    assert record["detail"].startswith("ValueError: --blocks must be at least 1, got 0 (log: ")
    assert json.loads((tmp_path / "prologue.json").read_text()) == record
    assert (tmp_path / "logs" / "prologue.log").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--rounds", "--rounds must be at least 1, got 0"),
        ("--paired-blocks", "--paired-blocks must be 0 (none) or more, got -1"),
    ],
)
def test_bad_counts_stop_before_the_last_run_is_deleted(tmp_path: Path, option: str, message: str) -> None:
    kept = tmp_path / "pyperf" / "rope-numpy.json"
    kept.parent.mkdir()
    kept.write_text("{}")
    with pytest.raises(SystemExit, match=re.escape(message)):
        run.main(["--out", str(tmp_path), option, "0" if option == "--rounds" else "-1"])
    assert kept.exists()


@pytest.fixture(scope="module")
def numpy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run in the smallest mode: tiny numpy shapes, one value each, one first call."""
    pytest.importorskip("numpy")
    out = tmp_path_factory.mktemp("bench")
    argv = [
        sys.executable, str(ROOT / "benchmarks" / "run.py"), "--out", str(out), "--size", "tiny",
        "--backend", "numpy", "--shape", "small", "--dtype", "float32", "--first-call-processes", "1",
        "--no-overhead", "--no-prologue", "--", "--debug-single-value",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(), check=False, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_run_writes_pyperf_files_and_the_summary(numpy_run: Path) -> None:
    pyperf = pytest.importorskip("pyperf")
    suite = pyperf.BenchmarkSuite.load(str(numpy_run / "pyperf" / "rope-numpy.json"))
    names = set(suite.get_benchmark_names())
    variants = ("copy", "anyrope", "anyrope-generic", "anyrope-inplace", "numpy-formula")
    assert names == {f"numpy/small/float32/{layout}/{v}" for layout in rope_cases.LAYOUTS for v in variants}
    summary = json.loads((numpy_run / "bench.json").read_text())
    assert summary["schema"] == rope_report.SCHEMA
    assert summary["config"]["size"] == "tiny"
    assert summary["config"]["pyperf_args"] == ["--debug-single-value"]
    assert summary["config"]["rounds"] == run.ROUNDS
    assert summary["machine"]["versions"]["pyperf"]
    assert summary["paired"] == []  # numpy has no pair
    assert summary["overhead"] == {"status": "skipped", "detail": "--no-overhead"}
    assert json.loads((numpy_run / "run.json").read_text())["overhead"] == summary["overhead"]
    assert summary["prologue"] == {"status": "skipped", "detail": "--no-prologue"}
    assert "hostname" not in summary["machine"]
    rows = {(r["layout"], r["variant"]): r for r in summary["results"]}
    assert len(rows) == len(names)
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["processes"] == run.ROUNDS  # one worker process per round
        assert r["dims"] == [1, 2, 4, 64]
        assert 0 < r["p25_s"] <= r["median_s"] <= r["p75_s"]
        assert r["x_copy_p25"] <= r["x_copy"] <= r["x_copy_p75"]
    assert rows["half", "copy"]["x_copy"] == pytest.approx(1.0)
    assert rows["interleaved", "anyrope"]["ref"] == "numpy-formula"  # of the row's own layout
    (first,) = summary["first_call"]
    assert (first["backend"], first["variant"], first["status"], first["processes"]) == (
        "numpy",
        "anyrope",
        "ok",
        1,
    )
    assert first["median_s"] > 0


def test_run_prints_the_table(numpy_run: Path) -> None:
    table = (numpy_run / "bench.txt").read_text()
    header = table.splitlines()[0].split()
    assert header[:5] == ["backend", "shape", "dtype", "layout", "variant"]
    assert "q1-q3" in header
    assert "numpy: copy = x.copy(); x ref against numpy-formula" in table
    assert "small: (batch, heads, seq, head_dim) = (1, 2, 4, 64)" in table
    assert any(line.split()[:2] == ["numpy", "anyrope"] for line in table.splitlines())  # first calls
    assert table.endswith(
        "call overhead\ncall overhead: skipped (--no-overhead)\n\n"
        "attention prologue\nattention prologue: skipped (--no-prologue)\n"
    )


def test_failure_costs_one_row(tmp_path: Path) -> None:
    """A benchmark that fails or gives no result comes back as a reason, its output in a log."""
    log = tmp_path / "logs" / "x.log"
    argv = ["--size", "tiny", "--append", str(tmp_path / "x.json"), "--debug-single-value"]
    why = run._invoke("bench_rope.py", "numpy/small/float32/half/no-such-variant", argv, log)
    assert why == f"no result (exit status 0) (log: {log})"
    assert log.exists()
    # a worker that raises: the first call's script refuses more than one loop per process
    argv = [
        "--loops",
        "2",
        "--warmups",
        "0",
        "--values",
        "1",
        "-p",
        "1",
        "--append",
        str(tmp_path / "y.json"),
    ]
    why = run._invoke("bench_first_call.py", "first-call/numpy/anyrope", argv, log)
    assert why.startswith("ValueError: a first call happens once per process: run with --loops 1, not 2")


def _record(variant: str, median_s: float, *, layout: str = "half", tensors: int = 1, **extra: Any) -> Any:
    return {
        "backend": "torch", "shape": "prefill", "dims": [1, 2, 8, 128], "dtype": "float32", "layout": layout,
        "variant": variant, "tensors": tensors, "status": "ok", "median_s": median_s,
        "p25_s": 0.9 * median_s, "p75_s": 1.2 * median_s, "values": 5, "processes": 2, "loops": 4, **extra,
    }  # fmt: skip


def _summary() -> dict[str, Any]:
    results = [
        _record("copy", 0.001),
        _record("anyrope", 0.003),
        _record("transformers-apply", 0.008, tensors=2),
        _record("copy", 0.002, layout="interleaved"),
        _record("anyrope", 0.005, layout="interleaved"),
        {**_record("anyrope-inplace", 0.0), "status": "error", "detail": "RuntimeError: boom (log: x.log)"},
        {**_record("rotary-embedding-torch", 0.0, layout="interleaved"), "status": "skipped",
         "detail": "rotary_embedding_torch is not installed"},
        _record("copy-compiled", 0.002),
        _record("anyrope-compiled", 0.004),
        _record("transformers-full-compiled", 0.016, tensors=2),
        _record("copy-compiled", 0.003, layout="interleaved"),
        _record("anyrope-compiled", 0.006, layout="interleaved"),
    ]  # fmt: skip
    cases = {c.name: {"dims": list(c.dims), "what": c.what} for c in rope_cases.cases()}
    return {
        "machine": {"cpu_count": 2, "versions": {"anyrope": "0"}},
        "config": {"cases": cases},
        "results": rope_report.add_ratios(results),
        "first_call": [{"backend": "torch", "variant": "anyrope", "status": "ok", "median_s": 0.5, "p25_s": 0.4,
                        "p75_s": 0.6, "processes": 5}],
    }  # fmt: skip


def test_ratios() -> None:
    rows = {(r["variant"], r["layout"]): r for r in _summary()["results"]}
    assert rows["copy", "half"]["x_copy"] == pytest.approx(1.0)
    assert rows["anyrope", "half"]["x_copy"] == pytest.approx(3.0)
    assert rows["anyrope", "half"]["x_copy_p25"] == pytest.approx(2.7)  # its quartiles over the copy's median
    assert rows["anyrope", "half"]["x_copy_p75"] == pytest.approx(3.6)
    assert rows["transformers-apply", "half"]["x_copy"] == pytest.approx(4.0)  # per tensor: q and k
    assert rows["anyrope", "half"]["x_ref"] == pytest.approx(0.75)
    assert rows["anyrope", "interleaved"]["x_copy"] == pytest.approx(2.5)  # its own layout's copy
    assert rows["anyrope", "interleaved"]["ref"] == "transformers-apply (half)"
    assert "x_copy" not in rows["anyrope-inplace", "half"]
    assert "x_ccopy" not in rows["anyrope", "half"]  # eager rows: no compiled ratios
    assert "x_cpeer" not in rows["transformers-apply", "half"]
    compiled = rows["anyrope-compiled", "half"]
    assert compiled["x_copy"] == pytest.approx(4.0)  # x copy keeps its meaning
    assert compiled["x_ref"] == pytest.approx(1.0)
    assert (compiled["ccopy"], compiled["cpeer"]) == ("copy-compiled", "transformers-full-compiled")
    assert compiled["x_ccopy"] == pytest.approx(2.0)
    assert (compiled["x_ccopy_p25"], compiled["x_ccopy_p75"]) == (pytest.approx(1.8), pytest.approx(2.4))
    assert compiled["x_cpeer"] == pytest.approx(0.5)  # per tensor: the peer rotates q and k
    assert (compiled["x_cpeer_p25"], compiled["x_cpeer_p75"]) == (pytest.approx(0.45), pytest.approx(0.6))
    assert rows["copy-compiled", "half"]["x_ccopy"] == pytest.approx(1.0)
    assert rows["transformers-full-compiled", "half"]["x_cpeer"] == pytest.approx(1.0)
    interleaved = rows["anyrope-compiled", "interleaved"]
    assert interleaved["x_ccopy"] == pytest.approx(2.0)  # its own layout's compiled copy
    assert interleaved["cpeer"] == "transformers-full-compiled (half)"
    assert interleaved["x_cpeer"] == pytest.approx(0.75)


def test_jax_compiled_rows_divide_by_its_jitted_copy() -> None:
    results = [
        {**_record(variant, median_s), "backend": "jax"}
        for variant, median_s in (
            ("copy", 0.001),
            ("anyrope", 0.005),
            ("anyrope-jit", 0.003),
            ("naive-jit", 0.006),
        )
    ]
    rows = {r["variant"]: r for r in rope_report.add_ratios(results)}
    assert rows["anyrope-jit"]["ccopy"] == "copy"
    assert rows["anyrope-jit"]["x_ccopy"] == pytest.approx(3.0) == rows["anyrope-jit"]["x_copy"]
    assert rows["anyrope-jit"]["x_cpeer"] == pytest.approx(0.5)
    assert rows["copy"]["x_ccopy"] == pytest.approx(1.0)  # the copy is the compiled one
    assert "x_ccopy" not in rows["anyrope"]


def test_format_table() -> None:
    table = rope_report.format_table(_summary())
    lines = table.splitlines()
    anyrope_half = next(
        line for line in lines if line.startswith("torch ") and " anyrope " in line and " half " in line
    )
    assert anyrope_half.split()[-4:] == ["3.00", "2.70-3.60", "3.00", "0.75"]
    compiled_half = next(line for line in lines if " anyrope-compiled " in line and " half " in line)
    assert compiled_half.split()[-8:] == ["4.00", "3.60-4.80", "4.00", "1.00", "2.00", "(1.80-2.40)", "0.50",
                                          "(0.45-0.60)"]  # fmt: skip
    assert lines[0].split()[-6:] == ["x", "ccopy", "(q1-q3)", "x", "cpeer", "(q1-q3)"]
    assert any("error" in line and "anyrope-inplace" in line for line in lines)
    assert "torch rotary-embedding-torch: skipped (rotary_embedding_torch is not installed)" in table
    assert (
        "torch: copy = x.clone(); x ref against transformers-apply; x ccopy against copy-compiled; "
        "x cpeer against transformers-full-compiled"
    ) in table
    first = next(line for line in lines if line.startswith("backend  variant"))
    assert first.split() == ["backend", "variant", "first", "s", "q1-q3", "s", "processes"]
    assert lines[lines.index(first) + 2].split() == ["torch", "anyrope", "0.500", "0.400-0.600", "5"]


def test_plot_or_reason(tmp_path: Path) -> None:
    path = tmp_path / "bench.png"
    why = rope_plot.plot(_summary(), path)
    assert (why is None) == path.exists()
    if why is not None:
        assert "matplotlib" in why
    assert rope_plot.plot({"results": []}, tmp_path / "empty.png") in (
        "no float32 results to plot",
        "matplotlib is not installed (pip install matplotlib)",
    )


def test_the_package_points_to_the_benchmark() -> None:
    """``python -m anyrope`` is the self-check; its help says where the benchmark went."""
    from anyrope.__main__ import _parser

    assert "nox -s bench runs benchmarks/" in " ".join(_parser().format_help().split())
    with pytest.raises(SystemExit):
        _parser().parse_args(["bench"])


def test_committed_docs_data_is_a_summary() -> None:
    """docs/data/ holds what rope_report writes, which the docs build plots without pyperf."""
    for path in (ROOT / "docs" / "data").glob("bench-*.json"):
        summary = json.loads(path.read_text())
        assert summary["schema"] == rope_report.SCHEMA
        ran = [r for r in summary["results"] if r["status"] == "ok"]
        assert ran
        assert all(r["p25_s"] <= r["median_s"] <= r["p75_s"] for r in ran)


def test_gpu_benchmark_runs_and_checks_each_result(tmp_path: Path) -> None:
    """bench_gpu's logic on CPU tensors at its tiny size (the GPU rows need a GPU): every variant
    is timed or says why not, and every result held to anyrope's agrees with it."""
    pytest.importorskip("torch")
    import bench_gpu

    assert bench_gpu.main(["--size", "tiny", "--device", "cpu", "--rounds", "1", "--target", "0.001",
                           "--dtype", "float32", "--out", str(tmp_path)]) == 0  # fmt: skip
    rows = json.loads((tmp_path / "gpu.json").read_text())
    cases = {(r["case"], r["layout"]) for r in rows}
    assert cases == {(c, layout) for c in bench_gpu.SIZES["tiny"] for layout in bench_gpu.LAYOUTS}
    for row in rows:
        assert row["seconds"] or "failed" in row["note"], row
        assert not row["note"].startswith("failed"), row
        if row["diff"] is not None and row["backend"] == "torch-cpu" and row["variant"].startswith("anyrope"):
            assert row["diff"] == 0, row  # anyrope's own variants: the same result, bit for bit
    assert "| float32 | half | anyrope |" in (tmp_path / "gpu.md").read_text()


def test_the_gpu_session_script_names_what_exists() -> None:
    """benchmarks/gpu_session.sh, the one prepared call on a lent GPU: valid bash, and every test
    file and script it runs exists (a renamed one would cost a session's device time to find)."""
    script = ROOT / "benchmarks" / "gpu_session.sh"
    for bash in (script, ROOT / "benchmarks" / "gpu_wheels.sh"):  # the session and its wheels
        assert subprocess.run(["bash", "-n", str(bash)], check=False).returncode == 0, bash
    named = set(
        re.findall(r"\b((?:tests|benchmarks)/[\w/]+\.(?:py|sh))\b", script.read_text(encoding="utf-8"))
    )
    assert {"tests/test_triton.py", "benchmarks/bench_gpu.py", "tests/triton_report.py"} <= named
    assert "benchmarks/gpu_wheels.sh" in named
    assert all((ROOT / path).is_file() for path in named), sorted(
        p for p in named if not (ROOT / p).is_file()
    )
