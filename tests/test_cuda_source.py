"""The CuPy kernel's CUDA source, without a GPU: nvcc compiles it for the GPU (a compile check)
and for the host, where every thread of each launch runs in turn on NumPy arrays, with the
arguments the CuPy wrapper would pass (``cupy_cuda.arguments``). The result is held to the
generic path: bit for bit, since the kernel's arithmetic is the generic path's operation for
operation and both use the host's float64 cos and sin here (glibc's, then NumPy's, agreeing to
the last bit on these angles: a difference would show as a failure, not be absorbed).

Runs in the NumPy session (it needs NumPy only); skips where nvcc is missing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope._kernels import cupy_cuda
from anyrope.scaling import YaRN

from harness import Backend

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "src" / "anyrope" / "_kernels"
pytestmark = pytest.mark.backends("numpy")  # the source runs on the host on NumPy arrays


@pytest.fixture(scope="module")
def library(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Any:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit's compiler)")
    built = tmp_path_factory.mktemp("cuda") / "host_rope.so"
    command = [
        nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-ffp-contract=off",
        "-arch=sm_80", *cupy_cuda.OPTIONS, "-I", str(KERNELS), str(ROOT / "tests" / "cuda" / "host_rope.cu"),
        "-o", str(built),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    assert result.returncode == 0, f"nvcc failed:\n{result.stderr[-4000:]}"
    return ctypes.CDLL(str(built))


def _as_c(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ctypes.c_void_p(value.ctypes.data)
    return ctypes.c_int(int(value)) if value.dtype == np.int32 else ctypes.c_longlong(int(value))


def _host_kernel(library: Any) -> Any:
    """A stand-in for the registry's prepare: the CUDA source's threads on the host."""

    def prepare(job: Any) -> Any:
        return lambda x, out, source: rotate(job, x, out, source)

    def rotate(job: Any, x: Any, out: Any, source: Any) -> Any:
        angles = source.kernel_angles(job.compute)
        x = np.ascontiguousarray(x)
        out = out if out is not None else np.empty_like(x)
        assert out.flags.c_contiguous
        grid, block, args = cupy_cuda.arguments(job, angles, x, out)
        run = getattr(library, f"rotate_{x.dtype.name}")
        run(
            ctypes.c_longlong(grid[0]),
            ctypes.c_longlong(grid[1]),
            ctypes.c_longlong(block),
            *map(_as_c, args),
        )
        return out

    return prepare


def _through_source(library: Any, call: Any) -> Any:
    """``call()`` with the registry's CuPy declaration, taking NumPy arrays, as the only kernel:
    what the declaration says it takes is what the source is run on."""
    cupy = next(k for k in anyrope.kernels() if k.name == "cupy")
    stand_in = dataclasses.replace(cupy, libraries=frozenset({"numpy"}), prepare=_host_kernel(library))
    with anyrope.use_fast_paths(stand_in):
        return call()


def _generic(call: Any) -> Any:
    with anyrope.use_fast_paths(False):
        return call()


RNG = np.random.default_rng(7)
WIDE = RNG.integers(-(2**62), 2**62, size=(2, 9))  # past 2**42: every level of the angle's parts
CALLS = {
    "offset": (lambda: anyrope.RoPE(16), {"offset": 5}),
    "per-row offsets": (lambda: anyrope.RoPE(16), {"offset": [3, 900]}),
    "positions": (lambda: anyrope.RoPE(16, rotary_dim=10), {"positions": np.arange(9) * 1000003}),
    "wide positions": (lambda: anyrope.RoPE(16), {"positions": WIDE}),
    "int16 positions": (lambda: anyrope.RoPE(16), {"positions": np.arange(-4, 5, dtype=np.int16)}),
    "yarn": (
        lambda: anyrope.RoPE(16, scaling=YaRN(4.0, original_max_position=32)),
        {"positions": np.arange(100, 109)},
    ),
    "clockwise": (lambda: anyrope.RoPE(16, clockwise=True), {"offset": 7}),
    "mrope": (
        lambda: anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True),
        {"positions": np.stack([np.arange(9), np.arange(9) // 3, np.arange(9) % 3])},
    ),
    "axial per row": (
        lambda: anyrope.RoPE(16, rotary_dim=12, axial=2, axial_frequencies="alternating"),
        {"positions": RNG.integers(0, 50, size=(2, 2, 9))},
    ),
}


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name", list(CALLS))
def test_source_matches_generic(library: Any, name: str, dtype: str, layout: str) -> None:
    make, kwargs = CALLS[name]
    base = make()
    rope = anyrope.RoPE(
        base.head_dim, rotary_dim=base.rotary_dim, layout=layout, scaling=base.scaling,
        clockwise=base.clockwise, mrope_section=base.mrope_section, mrope_interleaved=base.mrope_interleaved,
        axial=base.axial, axial_frequencies=base.axial_frequencies or "blocks",
    )  # fmt: skip
    x = RNG.standard_normal((2, 3, 9, 16)).astype(dtype)
    want = _generic(lambda: rope(x, **kwargs))
    got = _through_source(library, lambda: rope(x, **kwargs))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_source_in_place_and_other_axes(library: Any, layout: str) -> None:
    """(batch, seq, heads, head_dim) with per-row positions, in place, and q and k of other head
    counts (more heads than a thread's group of 8)."""
    rope = anyrope.RoPE(32, rotary_dim=24, layout=layout)
    q = RNG.standard_normal((2, 5, 11, 32)).astype(np.float32)
    k = RNG.standard_normal((2, 5, 3, 32)).astype(np.float32)
    positions = RNG.integers(0, 4096, size=(2, 5))
    want_q, want_k = _generic(lambda: rope(q, k, positions=positions, seq_axis=-3))
    got_q, got_k = q.copy(), k.copy()
    _through_source(library, lambda: rope(got_q, got_k, positions=positions, seq_axis=-3, inplace=True))
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_k, want_k)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_source_with_given_tables(library: Any, dtype: str) -> None:
    """anyrope.apply with the caller's tables, shared and per batch row, both directions."""
    rope = anyrope.RoPE(16, rotary_dim=12)
    x = RNG.standard_normal((2, 4, 6, 16)).astype(dtype)
    for positions in (np.arange(6), RNG.integers(0, 99, size=(2, 6))):
        cos, sin = rope.cos_sin(positions, like=np.zeros(1, dtype=np.float32))
        for inverse in (False, True):

            def call(inverse: bool = inverse, cos: Any = cos, sin: Any = sin) -> Any:
                return anyrope.apply(x, cos, sin, inverse=inverse)

            np.testing.assert_array_equal(_through_source(library, call), _generic(call))


def test_source_takes_what_the_registry_declares() -> None:
    """The registry's CuPy kernel covers the dtypes the source is instantiated for."""
    declared = next(k for k in anyrope.kernels() if k.name == "cupy")
    assert set(declared.dtypes) == set(cupy_cuda.TYPES)


def test_source_turns_per_row_offsets_past_int64(library: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-row offsets that nothing reads on a GPU, whose last positions pass int64 (issue 57):
    ``starts[b] + s`` wraps in the source as in the generic path, and both give those positions
    ``2**64`` back: the same result, bit for bit."""
    from anyrope import _positions

    monkeypatch.setattr(_positions, "host_array", lambda *_: None)  # as on a GPU: never read
    rope = anyrope.RoPE(16)
    x = RNG.standard_normal((2, 3, 4, 16)).astype(np.float32)
    starts = np.array([2**63 - 2, 0], dtype=np.int64)
    want = _generic(lambda: rope(x, offset=starts))
    got = _through_source(library, lambda: rope(x, offset=starts))
    np.testing.assert_array_equal(got, want)
