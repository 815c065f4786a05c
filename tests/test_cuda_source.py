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


class _HostFunctions:
    """rope.cu's kernels by name, as CuPy's launcher calls them, run on the host: every thread
    of each launch in turn. Each launch's pairs per thread and whether its packs are aligned
    words go to ``launches``; ``pairs`` counts the launches that turned q and k together."""

    def __init__(self, library: Any) -> None:
        self.library, self.launches, self.pairs = library, [], 0

    def __getitem__(self, name: str) -> Any:
        assert name in cupy_cuda.NAMES
        dtype, per_thread, half, aligned = name[len("anyrope::rotate<") : -1].split(", ")
        dtype = {t: d for d, t in cupy_cuda.TYPES.items()}[dtype]

        def run(grid: tuple[int, int], block: tuple[int], args: tuple[Any, ...]) -> None:
            self.launches.append((int(per_thread), aligned == "true"))
            self.pairs += args[0] is not args[30]  # x, then y: another array for k
            failed = getattr(self.library, f"rotate_{dtype}")(
                ctypes.c_longlong(grid[0]),
                ctypes.c_longlong(grid[1]),
                ctypes.c_longlong(block[0]),
                ctypes.c_int(int(per_thread)),
                ctypes.c_bool(half == "true"),
                ctypes.c_bool(aligned == "true"),
                *map(_as_c, args),
            )
            assert failed == 0, f"no {name} on the host"

        return run


def _through_source(library: Any, call: Any, functions: _HostFunctions | None = None) -> Any:
    """``call()`` with the registry's CuPy declaration, taking NumPy arrays, as the only kernel:
    what the declaration says it takes is what the source is run on, through the CuPy kernel's
    own launchers (``functions``: the host's kernels, a new set where not given)."""
    cupy = next(k for k in anyrope.kernels() if k.name == "cupy")
    functions = _HostFunctions(library) if functions is None else functions

    def prepare_pair(q: Any, k: Any) -> Any:
        return cupy_cuda.pair_launcher(q, k, np, functions) if cupy_cuda.pairable(q, k) else None

    stand_in = dataclasses.replace(
        cupy,
        libraries=frozenset({"numpy"}),
        prepare=lambda job: cupy_cuda.launcher(job, np, functions),
        prepare_pair=prepare_pair,
    )
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
    counts (more heads than a thread's group of 8): both in one launch."""
    rope = anyrope.RoPE(32, rotary_dim=24, layout=layout)
    q = RNG.standard_normal((2, 5, 11, 32)).astype(np.float32)
    k = RNG.standard_normal((2, 5, 3, 32)).astype(np.float32)
    positions = RNG.integers(0, 4096, size=(2, 5))
    want_q, want_k = _generic(lambda: rope(q, k, positions=positions, seq_axis=-3))
    got_q, got_k = q.copy(), k.copy()
    host = _HostFunctions(library)
    _through_source(library, lambda: rope(got_q, got_k, positions=positions, seq_axis=-3, inplace=True), host)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_k, want_k)
    assert (len(host.launches), host.pairs) == (1, 1)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_source_turns_q_and_k_in_one_launch(library: Any, dtype: str, layout: str) -> None:
    """q and k of one call, new arrays, share a launch whatever their head counts (k's more than
    q's too, past a group of 8), its packing the narrowest either allows (k one element off a
    16-byte boundary: a pair at a time); where they cannot (sequences of other lengths), two."""
    rope = anyrope.RoPE(64, rotary_dim=48, layout=layout)
    data = RNG.standard_normal(2 * 9 * 6 * 64 + 1).astype(dtype)
    q = RNG.standard_normal((2, 3, 6, 64)).astype(dtype)
    for k in (data[:-1].reshape(2, 9, 6, 64), data[1:].reshape(2, 9, 6, 64)):
        for kwargs in ({"offset": [4, 70]}, {"positions": np.arange(6) * 1000}, {"offset": 3}):
            host = _HostFunctions(library)
            got = _through_source(library, lambda k=k, kwargs=kwargs: rope(q, k, **kwargs), host)
            want = _generic(lambda k=k, kwargs=kwargs: rope(q, k, **kwargs))
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)
            itemsize, half = np.dtype(dtype).itemsize, layout == "half"
            widest = (16 // itemsize if half else 8 // itemsize, True)
            assert host.launches == [widest if k.ctypes.data % 16 == 0 else (1, half)], kwargs
            assert host.pairs == 1, kwargs
    host = _HostFunctions(library)
    got = _through_source(library, lambda: rope(q, q[:, :, :4], offset=2), host)
    for a, b in zip(got, _generic(lambda: rope(q, q[:, :, :4], offset=2)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert (len(host.launches), host.pairs) == (2, 0)


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


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_source_moves_sixteen_bytes_where_aligned(library: Any, dtype: str, layout: str) -> None:
    """A head of 128 features moves 16 bytes per access (the widest pack of its dtype); one that
    starts an element past a 16-byte boundary, or whose rotary pairs no wider pack divides,
    moves a pair at a time (interleaved pairs as one word only where it is aligned); all equal
    the generic path bit for bit."""
    itemsize = np.dtype(dtype).itemsize
    widest = 16 // itemsize if layout == "half" else 8 // itemsize
    half = layout == "half"
    rope, narrow = anyrope.RoPE(128, layout=layout), anyrope.RoPE(128, rotary_dim=126, layout=layout)
    data = RNG.standard_normal(2 * 3 * 5 * 128 + 1).astype(dtype)
    aligned = data[:-1].reshape(2, 3, 5, 128)
    shifted = data[1:].reshape(2, 3, 5, 128)  # one element on: no 16-byte boundary
    assert aligned.ctypes.data % 16 == 0
    cases = ((aligned, rope, (widest, True)), (shifted, rope, (1, half)), (aligned, narrow, (1, True)))
    for x, model, expected in cases:
        host = _HostFunctions(library)
        got = _through_source(library, lambda x=x, model=model: model(x, offset=11), host)
        np.testing.assert_array_equal(got, _generic(lambda x=x, model=model: model(x, offset=11)))
        assert host.launches == [expected], (x.ctypes.data % 16, model.rotary_dim)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_source_forms_offset_angles_as_under_capture(
    library: Any, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under CUDA-graph capture an int offset's angles are formed in the kernel (OFFSET mode, not
    the kept table's rows): the same result, with each thread forming its pack of angles."""
    from anyrope import _tables

    monkeypatch.setattr(_tables, "graph_capturing", lambda *_: True)
    rope = anyrope.RoPE(64, rotary_dim=48, layout=layout)
    x = RNG.standard_normal((2, 3, 7, 64)).astype(np.float16)
    host = _HostFunctions(library)
    got = _through_source(library, lambda: rope(x, offset=2**40 + 3), host)
    np.testing.assert_array_equal(got, _generic(lambda: rope(x, offset=2**40 + 3)))
    assert host.launches == [(8 if layout == "half" else 4, True)]


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


def test_compiled_kernels_for_sm_90() -> None:
    """Issue 55's proof for the CuPy kernel on the CPU machine (tests/cuda_report.py): every
    kernel rope.cu is compiled into, built by nvcc for sm_90 with CuPy's options. None spills;
    the one each dtype and layout runs where x and out are aligned (every CuPy allocation, every
    GPU benchmark row) reads x and writes out in 128-bit accesses only."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit's compiler)")
    import cuda_report

    found = cuda_report.report(nvcc)
    print(cuda_report.table(found))
    assert set(found["kernels"]) == set(cupy_cuda.NAMES)
    for name, kernel in found["kernels"].items():
        assert kernel["spill_stores"] == kernel["spill_loads"] == 0, (name, kernel)
        assert "? load" not in kernel["widths"], kernel  # each access traced to its array
        assert "? store" not in kernel["widths"], kernel
    for dtype, itemsize in (("float16", 2), ("float32", 4), ("float64", 8)):
        for half in (True, False):
            widest = cupy_cuda.kernel_name(dtype, 16 // itemsize if half else 8 // itemsize, half, True)
            for access in ("x load", "out store"):
                assert set(found["kernels"][widest]["widths"][access]) == {128}, (widest, access)
