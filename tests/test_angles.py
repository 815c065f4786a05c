"""Angles on the device: both methods, every integer dtype, any integer, compiled or not.

The oracle reduces ``p * theta`` modulo 2 pi in 80-digit decimal arithmetic, so it is exact for
positions where float64 is not (2**63 * theta loses thousands of radians in float64).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import _angles, _compat
from anyrope._dtypes import int_info

import oracle
from harness import Backend

FREQS = anyrope.RoPE(64).inv_freq  # Python floats, as the library holds them
THETA = np.asarray(FREQS)
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _environment(backend: Backend, method: str) -> _compat.Environment:
    env = _compat.environment(backend.xp, backend.device)
    if method == "float64" and not env.float64:
        pytest.skip(f"{backend.id} has no float64")
    return dataclasses.replace(env, angles=method)


def _dtypes(backend: Backend) -> list[str]:
    found = []
    for name in INT_DTYPES:
        dtype = getattr(backend.xp, name, None)
        if dtype is None or int_info(backend.xp, dtype)[0] > (64 if backend.index == "int64" else 32):
            continue
        found.append(name)
    return found


def _check(
    backend: Backend, positions: np.ndarray, cos: Any, sin: Any, tolerance: float, theta: np.ndarray = THETA
) -> None:
    want_cos, want_sin = oracle.exact_cos_sin(positions, theta)
    got_cos, got_sin = backend.to_numpy(cos), backend.to_numpy(sin)
    assert got_cos.shape == want_cos.shape
    error = max(np.max(np.abs(got_cos - want_cos), initial=0), np.max(np.abs(got_sin - want_sin), initial=0))
    assert error <= tolerance, f"max error {error:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("method", ["float64", "digits"])
@pytest.mark.parametrize("table", ["float32", "float64"])
def test_within_1e6_of_exact_up_to_two_to_the_31(backend: Backend, method: str, table: str) -> None:
    if table not in backend.dtypes:
        pytest.skip(f"{backend.id} has no {table}")
    env = _environment(backend, method)
    rng = np.random.default_rng(0)
    edges = [0, 1, -1, 4095, 65_537, -65_537, 2_000_000, 2**31 - 1, -(2**31)]
    positions = np.concatenate([edges, rng.integers(-(2**31), 2**31, size=55)]).reshape(8, 8)
    values = backend.asarray(positions.astype(backend.index))
    cos, sin = _angles.cos_sin(backend.xp, env, values, FREQS, dtype=backend.dtype(table))
    assert cos.dtype == backend.dtype(table)
    # float32 tables: a few roundings of float32; float64 by digits: exact to float64; float64 by
    # the float64 method: p * theta rounds like any float64 code (2**31 * 2**-53 rad at 2**31).
    tolerance = 1e-6 if table == "float32" or method == "float64" else 1e-13
    _check(backend, positions, cos, sin, tolerance)


@pytest.mark.parametrize("method", ["float64", "digits"])
def test_every_integer_dtype_to_its_extremes(backend: Backend, method: str) -> None:
    """Any integer of any dtype, the dtype's smallest and largest included: unsigned 64-bit
    positions past 2**63 too, which wrap when widened to int64 and are turned back."""
    env = _environment(backend, method)
    table = "float64" if "float64" in backend.dtypes else "float32"
    for name in _dtypes(backend):
        info = np.iinfo(name)
        wanted = [
            int(info.min),
            int(info.min) + 1,
            -3,
            0,
            5,
            int(info.max) // 3,
            int(info.max) - 1,
            int(info.max),
        ]
        positions = np.array([v for v in wanted if info.min <= v <= info.max], dtype=name)
        values = backend.asarray(positions)
        cos, sin = _angles.cos_sin(backend.xp, env, values, FREQS, dtype=backend.dtype(table))
        _check(backend, positions, cos, sin, 1e-6)


@pytest.mark.parametrize("method", ["float64", "digits"])
def test_any_bit_pattern_stays_inside_its_tables(backend: Backend, method: str) -> None:
    """Memory safety by construction: every index is a digit; random 64-bit patterns, all of them
    rotated within 1e-6 of exact."""
    if backend.index != "int64":
        pytest.skip("64-bit integers need JAX's x64")
    env = _environment(backend, method)
    bits = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, size=200, dtype=np.int64, endpoint=True)
    positions = np.concatenate([bits, [-(2**63), 2**63 - 1]])
    cos, sin = _angles.cos_sin(backend.xp, env, backend.asarray(positions), FREQS, dtype=backend.xp.float32)
    _check(backend, positions, cos, sin, 1e-6)


def test_host_digit_tables_are_exact() -> None:
    cos_rows, sin_rows = _angles.host_digit_tables(FREQS[:8], 8)
    for level, digit in itertools.product(range(8), (0, 1, 77, 255, 256)):
        row = level * _angles.ROWS + digit
        want_cos, want_sin = oracle.exact_cos_sin(np.array([digit * 256**level]), THETA[:8])
        np.testing.assert_allclose(cos_rows[row], want_cos[0], rtol=0, atol=2e-16)
        np.testing.assert_allclose(sin_rows[row], want_sin[0], rtol=0, atol=2e-16)


@pytest.mark.parametrize("method", ["float64", "digits"])
def test_traced_angles_equal_eager(backend: Backend, mode: str, method: str) -> None:
    env = _environment(backend, method)
    positions = backend.asarray(
        np.array([[-(2**31), -1, 0, 1], [3, 2**20, 2**31 - 1, 12345]]).astype(backend.index)
    )

    def tables(p: Any) -> Any:
        return _angles.cos_sin(backend.xp, env, p, FREQS, dtype=backend.xp.float32, traced=mode != "eager")

    eager = tables(positions)
    compiled = backend.compile(tables, mode)(positions)
    for got, want in zip(compiled, eager, strict=True):
        np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=0, atol=2.5e-7)


@pytest.mark.dtypes("float32", "float64")
def test_public_tables_follow_the_device(backend: Backend, dtype: str) -> None:
    """``cos_sin`` takes the device's own method; within 1e-6 of exact in float32, in float64 to
    the float64 oracle's own rounding."""
    rope = anyrope.RoPE(128)
    positions = np.array([0, 1, 4095, 65_537, 999_999, 2_000_000, 2**31 - 1])
    cos, sin = rope.cos_sin(backend.asarray(positions), like=backend.asarray(np.zeros(1), dtype))
    assert cos.dtype == backend.dtype(dtype)
    _check(backend, positions, cos, sin, 1e-6, np.asarray(rope.inv_freq))
    assert math.isclose(float(backend.to_numpy(cos)[0, 0]), 1.0)


def test_mlx_float64_exp_is_accurate() -> None:
    """MLX's own float64 exp is float32-accurate; the namespace's, used for xPos, is not."""
    mx = pytest.importorskip("mlx.core")
    from anyrope._mlx import mlx_namespace

    x = np.concatenate([np.linspace(-700.0, 700.0, 4001), [0.0, -1e-10, 0.5, 1.0]])
    got = np.asarray(mlx_namespace(mx).exp(mx.array(x, dtype=mx.float64)))
    np.testing.assert_allclose(got, np.exp(x), rtol=4 * 2.0**-53, atol=0)
