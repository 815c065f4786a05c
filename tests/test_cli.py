"""``python -m anyrope``: the backend self-check and its exit status."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anyrope import _selfcheck, _selfcheck_checks
from anyrope.__main__ import main
from anyrope._arrays import is_installed

SRC = Path(__file__).resolve().parents[1] / "src"


def _numpy_backend() -> _selfcheck.Backend:
    pytest.importorskip("numpy")
    return next(b for b in _selfcheck.BACKENDS if b.name == "numpy")


def test_self_check_passes(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numpy")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "anyrope " in out
    assert "numpy" in out
    assert " ok" in out
    assert "FAIL" not in out
    assert " 0 failed" in out


def test_self_check_covers_jax(capsys: pytest.CaptureFixture[str]) -> None:
    jax = pytest.importorskip("jax")
    assert main(["-b", "jax"]) == 0
    out = capsys.readouterr().out
    assert "jax " in out
    assert "FAIL" not in out
    if not jax.config.read("jax_enable_x64"):
        assert "x64 only" in out  # float64 is reported as skipped, with the reason


def test_wrong_oracle_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _numpy_backend()
    right = _selfcheck_checks.rope_oracle

    def one_position_late(x: Any, **kwargs: Any) -> Any:
        return right(x, **{**kwargs, "offset": kwargs.get("offset", 0) + 1})

    monkeypatch.setattr(_selfcheck_checks, "rope_oracle", one_position_late)
    assert main(["--backend", "numpy"]) == 1
    out = capsys.readouterr().out
    assert "FAIL (max error" in out
    equivalence = [line for line in out.splitlines() if "layout equivalence" in line]
    assert equivalence
    assert all(line.endswith(" ok") for line in equivalence)  # no oracle involved there


def test_broken_backend_is_a_failed_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    numpy_backend = _numpy_backend()

    def broken() -> list[_selfcheck.Target]:
        raise ImportError("libfoo.so: cannot open shared object file")

    fake = dataclasses.replace(numpy_backend, name="broken", probe=broken)
    monkeypatch.setattr(_selfcheck, "BACKENDS", (numpy_backend, fake))
    assert _selfcheck.run() == 1
    out = capsys.readouterr().out
    assert "import" in out
    assert "FAIL (ImportError: libfoo.so: cannot open shared object file)" in out
    assert "numpy" in out  # the healthy backend is still checked
    assert " ok" in out


def test_backend_without_device_is_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    numpy_backend = _numpy_backend()

    def no_gpu() -> list[_selfcheck.Target]:
        raise _selfcheck.Skip("no CUDA device")

    fake = dataclasses.replace(numpy_backend, name="gpuonly", probe=no_gpu)
    monkeypatch.setattr(_selfcheck, "BACKENDS", (numpy_backend, fake))
    assert _selfcheck.run() == 0
    assert "skipped (no CUDA device)" in capsys.readouterr().out
    # With nothing else to run, nothing was checked: that is not a pass.
    monkeypatch.setattr(_selfcheck, "BACKENDS", (fake,))
    assert _selfcheck.run() == 1
    assert "nothing could be checked" in capsys.readouterr().out


def test_no_backend_installed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_selfcheck, "is_installed", lambda module: False)
    assert main([]) == 1
    assert 'pip install "anyrope[numpy]"' in capsys.readouterr().out


def test_oracle_by_hand() -> None:
    x = [[[[1.0, 0.0, 0.5, 2.0]] * 2]]  # (1, 1, 2, 4): positions 0 and 1
    out = _selfcheck.rope_oracle(x, rotary_dim=2, layout="interleaved", base=10.0)
    assert out[0][0][0] == [1.0, 0.0, 0.5, 2.0]  # position 0 and the pass-through tail
    assert out[0][0][1] == [math.cos(1.0), math.sin(1.0), 0.5, 2.0]
    out = _selfcheck.rope_oracle(x, rotary_dim=4, layout="half", offset=1, base=1.0)
    assert out[0][0][0][1] == pytest.approx(0.0 * math.cos(1.0) - 2.0 * math.sin(1.0))


def test_help_runs_as_module() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-m", "anyrope", "--help"], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m anyrope")
    assert "self-check" in result.stdout


def test_backend_names_are_the_ones_nox_and_pytest_use() -> None:
    """One spelling everywhere: the self-check's backends are backends/ names."""
    from harness import SPECS

    assert {b.name for b in _selfcheck.BACKENDS} <= set(SPECS)


def test_self_check_agrees_with_backends_data() -> None:
    """The wheel carries no backends/ (nothing there is read at run time), so the self-check keeps
    its own copy of what it needs; this holds that copy to backends/*/backend.toml and the extras."""
    from backend_toml import ROOT, read
    from harness import SPECS

    extras = read(ROOT / "pyproject.toml")["project"]["optional-dependencies"]
    for backend in _selfcheck.BACKENDS:
        spec = SPECS[backend.name]
        # mlx: the self-check finds the package and imports mlx.core in its probe
        assert spec["module"].partition(".")[0] == backend.module.partition(".")[0], backend.name
        extra = re.fullmatch(r'pip install "anyrope\[(\w+)\]"', backend.install)
        if extra is None:  # not an extra of ours: the same command as backends/ gives
            assert spec["user-install"].startswith(backend.install), backend.name
        else:
            assert extra.group(1) in extras, backend.install
            assert f"anyrope[{extra.group(1)}" in spec["user-install"].replace("'", '"'), backend.name


def test_self_check_covers_sixteen_bit_floats(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numpy")
    assert main(["-b", "numpy"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert any(" float16 " in r and r.endswith(" ok") for r in rows)
    assert any(" bfloat16 " in r and "skipped (no bfloat16" in r for r in rows)  # NumPy has none


def test_self_check_lists_the_fused_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numpy")
    main(["-b", "numpy"])
    out = capsys.readouterr().out
    numba = next(line for line in out.splitlines() if line.strip().startswith("numba "))
    found = is_installed("numba")
    assert numba.endswith("available") if found else numba.endswith('pip install "anyrope[numba]"')
    assert "mlx-compiled" not in out  # only kernels for the libraries checked


def test_self_check_lists_the_fused_prologues(capsys: pytest.CaptureFixture[str]) -> None:
    """Each fused attention prologue for the libraries checked, and what it needs."""
    pytest.importorskip("torch")
    main(["-b", "torch"])
    out = capsys.readouterr().out
    assert "fused attention prologues" in out
    lines = out.split("fused attention prologues")[1].splitlines()
    triton = next(line for line in lines if line.strip().startswith("triton "))
    assert "torch on " in triton
    assert "cuda" in triton  # (and cpu under Triton's interpreter)
    assert triton.endswith("available") if is_installed("triton") else triton.endswith("pip install triton")
