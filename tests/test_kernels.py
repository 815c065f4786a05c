"""Every registered kernel is held to the generic array-API result, on every backend it declares.

Tests run each kernel by name (``anyrope.use_fast_paths(name)``, which fails if the kernel does
not take the call), so a kernel that silently fell back would fail here; the declarations in the
registry decide which backends, layouts and dtypes each is tested on.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import anyrope
from anyrope._job import SOURCES, KernelKey
from anyrope._policy import TRACERS

from harness import Backend, assert_close, assert_same

KERNELS = {k.name: k for k in anyrope.kernels()}
# (x shape, seq_axis, rotary_dim, per-row positions?)
SHAPES = [
    ((2, 4, 9, 16), -2, 16, False),
    ((2, 4, 9, 16), -2, 10, True),
    ((2, 9, 3, 16), -3, 16, True),
    ((9, 16), -2, 6, False),
    ((3, 1, 1, 32), -2, 32, True),  # a decode step
]


def _needs_numba() -> None:
    if not KERNELS["numba"].available:
        pytest.skip("numba is not installed")


@pytest.fixture
def kernel(request: pytest.FixtureRequest, backend: Backend) -> anyrope.Kernel:
    """Each kernel, with the backends, dtypes and layouts its declaration takes (conftest makes
    the combinations from the declarations); it skips only where a library it needs is missing."""
    found = KERNELS[request.param]
    if not found.available:
        pytest.skip(f"{found.name} needs {', '.join(found.requires)}")
    return found


def _generic() -> contextlib.AbstractContextManager[None]:
    return anyrope.use_fast_paths(False)


def _positions(backend: Backend, shape: tuple[int, ...], seq_axis: int, per_row: bool) -> Any:
    seq = shape[seq_axis]
    if per_row:
        return backend.asarray(np.array([[5 * b + s for s in range(seq)] for b in range(shape[0])]))
    return backend.asarray(np.arange(100, 100 + seq))


@pytest.mark.parametrize(("shape", "seq_axis", "rotary_dim", "per_row"), SHAPES)
def test_kernel_matches_generic(
    backend: Backend,
    kernel: anyrope.Kernel,
    dtype: str,
    layout: str,
    shape: tuple[int, ...],
    seq_axis: int,
    rotary_dim: int,
    per_row: bool,
) -> None:
    rope = anyrope.RoPE(shape[-1], rotary_dim=rotary_dim, layout=layout)
    positions = _positions(backend, shape, seq_axis, per_row)
    x = backend.asarray(np.random.default_rng(0).standard_normal(shape), dtype)
    like = backend.asarray(np.zeros(1), "float64" if dtype == "float64" else "float32")
    cos, sin = rope.cos_sin(positions, like=like)
    for inverse in (False, True):
        with anyrope.use_fast_paths(kernel.name):
            fast = anyrope.apply(x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis)
        with _generic():
            generic = anyrope.apply(x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis)
        assert fast.dtype == x.dtype
        assert_close(backend, fast, backend.to_numpy(generic), dtype)
        np.testing.assert_array_equal(
            backend.to_numpy(fast)[..., rotary_dim:], backend.to_numpy(x)[..., rotary_dim:]
        )
    with anyrope.use_fast_paths(kernel.name):
        called = rope(x, positions=positions, seq_axis=seq_axis)
    with _generic():
        assert_close(
            backend, called, backend.to_numpy(rope(x, positions=positions, seq_axis=seq_axis)), dtype
        )


def test_kernel_inverse_call_with_frequency_scale(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    """``rope(..., inverse=True)`` of a RoPE with a frequency scale, clockwise or not, through
    the kernel equals the generic code; in place too where the kernel writes in place."""
    for clockwise in (False, True):
        rope = anyrope.RoPE(
            16, rotary_dim=12, layout=layout, clockwise=clockwise, frequency_scale=[1.5, 0.5] * 3
        )
        data = np.random.default_rng(5).standard_normal((2, 3, 7, 16))
        positions = _positions(backend, (2, 3, 7, 16), -2, True)
        with anyrope.use_fast_paths(kernel.name):
            fast = rope(backend.asarray(data, dtype), positions=positions, inverse=True)
            if kernel.inplace and "inplace" not in backend.deviations:
                x = backend.asarray(data, dtype)
                assert rope(x, positions=positions, inverse=True, inplace=True) is x
                assert_same(backend, x, fast, dtype)
        with _generic():
            generic = rope(backend.asarray(data, dtype), positions=positions, inverse=True)
        assert_close(backend, fast, backend.to_numpy(generic), dtype)


def test_kernel_decoding_reproduces_the_full_call(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    rope = anyrope.RoPE(32, layout=layout, rotary_dim=24)
    x = backend.asarray(np.random.default_rng(1).standard_normal((2, 3, 40, 32)), dtype)
    with anyrope.use_fast_paths(kernel.name):
        full = rope(x)
        for step in (0, 1, 17, 39):
            got = rope(x[:, :, step : step + 1, :], offset=[step, step])
            assert_same(backend, got, full[:, :, step : step + 1, :], dtype)


@pytest.mark.feature("inplace")
@pytest.mark.kernel_takes("inplace")
def test_kernel_inplace_equals_out_of_place(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    data = np.random.default_rng(2).standard_normal((2, 3, 7, 16))
    q, k = backend.asarray(data, dtype), backend.asarray(-data, dtype)
    with anyrope.use_fast_paths(kernel.name):
        expected_q, expected_k = rope(
            backend.asarray(data, dtype), backend.asarray(-data, dtype), offset=[3, 9]
        )
        got_q, got_k = rope(q, k, offset=[3, 9], inplace=True)
    assert got_q is q
    assert got_k is k
    np.testing.assert_array_equal(backend.to_numpy(q), backend.to_numpy(expected_q))
    np.testing.assert_array_equal(backend.to_numpy(k), backend.to_numpy(expected_k))


@pytest.mark.feature("inplace")
@pytest.mark.kernel_takes("inplace")
@pytest.mark.dtypes("float32")
def test_kernel_apply_into_out(backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str) -> None:
    rope = anyrope.RoPE(8, layout=layout)
    x = backend.asarray(np.random.default_rng(3).standard_normal((4, 5, 8)), dtype)
    cos, sin = rope.cos_sin(backend.asarray(np.arange(5)), like=x)
    out = backend.asarray(np.zeros((4, 5, 8)), dtype)
    with anyrope.use_fast_paths(kernel.name):
        result = anyrope.apply(x, cos, sin, out=out, layout=layout)
        assert result is out
        expected = anyrope.apply(x, cos, sin, layout=layout)
        np.testing.assert_array_equal(backend.to_numpy(out), backend.to_numpy(expected))


@pytest.mark.feature("inplace")
@pytest.mark.kernel_takes("inplace")
@pytest.mark.dtypes("float32")
def test_kernel_apply_into_a_view_of_x(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    """``out=`` a view of x (another object, the same memory) is written as x in place is: a
    kernel that reads x after writing part of out would turn some pairs from turned values."""
    rope = anyrope.RoPE(8, layout=layout, rotary_dim=6)
    data = np.random.default_rng(4).standard_normal((4, 5, 8))
    x = backend.asarray(data, dtype)
    cos, sin = rope.cos_sin(backend.asarray(np.arange(5)), like=x)
    with anyrope.use_fast_paths(kernel.name):
        expected = anyrope.apply(backend.asarray(data, dtype), cos, sin, layout=layout)
        anyrope.apply(x, cos, sin, out=x[...], layout=layout)
    np.testing.assert_array_equal(backend.to_numpy(x), backend.to_numpy(expected))


def test_kernel_leaves_the_cached_tables_as_they_were(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    """A kernel that reads rows of the cached prefix table (and negates or conjugates them for an
    inverse turn) works on its own copy: a later call reads the table as it was."""
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    data = np.random.default_rng(6).standard_normal((2, 3, 7, 16))
    positions = _positions(backend, data.shape, -2, False)
    with _generic():
        before = rope(backend.asarray(data, dtype), positions=positions)
    with anyrope.use_fast_paths(kernel.name):
        rope(backend.asarray(data, dtype), backend.asarray(-data, dtype), positions=positions, inverse=True)
        rope(backend.asarray(data, dtype), offset=100, inverse=True)
    with _generic():
        assert_same(backend, rope(backend.asarray(data, dtype), positions=positions), before, dtype)


@pytest.mark.kernel_takes("gradients")
def test_kernel_gradients_match_generic(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    rng = np.random.default_rng(4)
    x = backend.asarray(rng.standard_normal((2, 3, 6, 16)), dtype)
    upstream = backend.asarray(rng.standard_normal((2, 3, 6, 16)), dtype)
    with anyrope.use_fast_paths(kernel.name):
        fast = backend.vjp(lambda t: rope(t, offset=[1, 50]), x, upstream)
    with _generic():
        generic = backend.vjp(lambda t: rope(t, offset=[1, 50]), x, upstream)
    assert_close(backend, fast, backend.to_numpy(generic), dtype)


@pytest.mark.kernel_takes("tracing")
@pytest.mark.dtypes("float32", "bfloat16")  # compiling is slow: a 16-bit type and a wider one
def test_kernel_compiled_equals_eager(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str, mode: str
) -> None:
    """Under each of the backend's compilers whose trace the kernel takes, the kernel itself
    runs (by name: no silent fallback) and equals its eager call: a prefill at an offset, q and k
    at traced per-row offsets, and in place where it writes in place."""
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    rng = np.random.default_rng(6)
    q, k = (backend.asarray(rng.standard_normal(shape), dtype) for shape in ((2, 3, 7, 16), (2, 1, 7, 16)))
    offsets = backend.asarray(np.array([1, 50]))

    def calls(q: Any, k: Any, offsets: Any) -> tuple[Any, ...]:
        return (rope(q, offset=3), *rope(q, k, offset=offsets))

    inplace = kernel.inplace and "inplace" not in backend.deviations

    def in_place(q: Any) -> Any:
        return rope(q, offset=3, inplace=True)

    # a kernel written for the compiler alone is held to the generic code's eager result
    with anyrope.use_fast_paths(kernel.name if kernel.eager else False):
        eager = calls(q, k, offsets)
    with anyrope.use_fast_paths(kernel.name):
        for got, want in zip(backend.compile(calls, mode)(q, k, offsets), eager, strict=True):
            assert_same(backend, got, want, dtype, compiled=mode != "eager")
        if inplace:
            target = backend.asarray(backend.to_numpy(q), dtype)
            backend.compile(in_place, mode)(target)
            assert_same(backend, target, eager[0], dtype, compiled=mode != "eager")


# dask computes in worker threads, where np.errstate (thread-local) does not reach
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.dtypes("float16", "bfloat16")
def test_sixteen_bit_kernels_are_bit_exact(
    backend: Backend, kernel: anyrope.Kernel, dtype: str, layout: str
) -> None:
    """16-bit values are widened in registers and rounded once: exactly the generic result, for
    infinities, NaNs, subnormals and values at the edge of the range too."""
    data = np.random.default_rng(5).standard_normal((2, 3, 11, 16)) * 4
    data.flat[:8] = [np.inf, -np.inf, np.nan, 65504.0, -65504.0, 6e-8, -3e-5, 1e-6]
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    x = backend.asarray(data, dtype)
    for call in ({}, {"offset": [4, 900]}):
        with np.errstate(invalid="ignore"):  # NumPy warns of inf * 0 in the generic code
            with anyrope.use_fast_paths(kernel.name):
                fast = rope(x, **call)
            with _generic():
                generic = rope(x, **call)
            assert fast.dtype == x.dtype
            fast, generic = backend.to_numpy(fast), backend.to_numpy(generic)  # lazy arrays: here
        np.testing.assert_array_equal(fast, generic)


def _codec_loops(storage: str) -> tuple[Any, Any]:
    """Loops that widen int16 bits to float32 and round float32 back, as a kernel does."""
    import numba

    from anyrope._kernels import _jit

    code = _jit.STORAGES[storage]

    @numba.njit
    def widen(bits: Any, out: Any) -> None:  # pragma: no cover - compiled
        for i in range(bits.size):
            out[i] = _jit.load(bits[i], code)

    @numba.njit
    def narrow(values: Any, out: Any) -> None:  # pragma: no cover - compiled
        for i in range(values.size):
            out[i] = _jit.store(values[i], code)

    return widen, narrow


def _floats_to_round() -> Any:
    """Random float32 bit patterns, plus every float16 and bfloat16 value nudged to just below,
    onto and just above the halfway point to its successor (where rounding decides)."""
    every = np.arange(1 << 16, dtype=np.uint32)
    as_float16 = every.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    edges = [as_float16 + step for step in (0xFFF, 0x1000, 0x1001)]
    edges += [(every << 16) + step for step in (0x7FFF, 0x8000, 0x8001)]
    random = np.random.default_rng(6).integers(0, 1 << 32, size=1 << 20, dtype=np.uint64)
    return np.concatenate([random.astype(np.uint32), *edges]).view(np.float32)


def _same_bits_or_both_nan(got: Any, want: Any, as_float: Any) -> None:
    differs = (got != want) & ~(np.isnan(as_float(got)) & np.isnan(as_float(want)))
    assert not differs.any(), f"{int(differs.sum())} values differ, the first at bits {want[differs][:4]}"


@pytest.mark.parametrize("storage", ["float16", "float16-bits"])
def test_float16_conversions_match_numpy(storage: str) -> None:
    """Both ways of converting (the CPU's instructions where it has them, and bit arithmetic)."""
    _needs_numba()
    widen, narrow = _codec_loops(storage)
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
    wide = np.empty(bits.size, dtype=np.float32)
    widen(bits, wide)
    expected = bits.view(np.float16).astype(np.float32)
    _same_bits_or_both_nan(wide.view(np.uint32), expected.view(np.uint32), lambda b: b.view(np.float32))
    values = _floats_to_round()
    rounded = np.empty(values.size, dtype=np.int16)
    narrow(values, rounded)
    with np.errstate(over="ignore", invalid="ignore"):
        expected_bits = values.astype(np.float16).view(np.int16)
    _same_bits_or_both_nan(rounded, expected_bits, lambda b: b.view(np.float16))


def test_bfloat16_conversions_match_torch() -> None:
    _needs_numba()
    torch = pytest.importorskip("torch")
    widen, narrow = _codec_loops("bfloat16")

    def as_float(b: Any) -> Any:
        return torch.from_numpy(b).view(torch.bfloat16).float().numpy()

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
    wide = np.empty(bits.size, dtype=np.float32)
    widen(bits, wide)
    _same_bits_or_both_nan(wide.view(np.uint32), as_float(bits).view(np.uint32), lambda b: b.view(np.float32))
    values = _floats_to_round()
    rounded = np.empty(values.size, dtype=np.int16)
    narrow(values, rounded)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    _same_bits_or_both_nan(rounded, expected, as_float)


def test_use_fast_paths_is_scoped() -> None:
    from anyrope._registry import fast_paths_enabled

    assert fast_paths_enabled() is True
    with anyrope.use_fast_paths(False):
        assert fast_paths_enabled() is False
        with anyrope.use_fast_paths("generic"):
            assert fast_paths_enabled() == "generic"
        assert fast_paths_enabled() is False
    assert fast_paths_enabled() is True


def test_use_fast_paths_rejects_unknown_names() -> None:
    with (
        pytest.raises(ValueError, match=r"no kernel named 'fastest'; the registry has .*numba.*generic"),
        anyrope.use_fast_paths("fastest"),
    ):
        pass
    with (
        pytest.raises(TypeError, match="enabled must be a bool, a kernel name or a Kernel"),
        anyrope.use_fast_paths(1),
    ):  # type: ignore[arg-type]
        pass


def test_a_forced_kernel_says_why_it_cannot_run(backend: Backend) -> None:
    x = backend.asarray(np.zeros((2, 3, 8)), "float32")
    outside = "mlx-compiled" if backend.name != "mlx" else "numpy-complex"
    with (
        pytest.raises(ValueError, match=rf"kernel '{outside}' cannot rotate q here: library"),
        anyrope.use_fast_paths(outside),
    ):
        anyrope.RoPE(8, layout="interleaved")(x)


KEYS = st.builds(
    KernelKey,
    library=st.sampled_from(["numpy", "torch", "jax.numpy", "mlx", "cupy", "dask.array", "array_api_strict"]),
    device=st.sampled_from(["cpu", "cuda", "gpu", "mps"]),
    dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64"]),
    layout=st.sampled_from(["half", "interleaved"]),
    inplace=st.booleans(),
    traced=st.booleans(),
    grad=st.booleans(),
    source=st.sampled_from(SOURCES),
    device_frequencies=st.booleans(),
    float64=st.booleans(),
    unsigned64=st.booleans(),
    strided_out=st.booleans(),
    table_grad=st.booleans(),
    tracer=st.sampled_from(("", *TRACERS)),
    one_token=st.booleans(),
)


@given(key=KEYS)
def test_selection_always_finds_a_kernel_and_says_why_others_refuse(key: KernelKey) -> None:
    """The generic kernel takes every key; every other kernel takes a key exactly when it gives
    no reason not to, and the reason names a field of the key it does not take."""
    every = anyrope.kernels()
    assert every[-1].name == "generic"
    assert every[-1].takes(key)
    for k in every[:-1]:
        why = k.why_not(key)
        assert k.takes(key) == (why is None)
        if why is not None:
            assert why.startswith(
                ("library", "device", "dtype", "layout", "positions from", "no ", "it needs", "needs")
            )


@pytest.mark.backends("numpy", "torch")
def test_a_forced_kernel_refuses_before_any_work(backend: Backend) -> None:
    """use_fast_paths(name) chooses every array's kernel first: a k it cannot take (a strided
    destination, here) raises before q, which it could take, is written."""
    _needs_numba()
    if backend.device_kind not in KERNELS["numba"].devices:  # torch-cuda
        pytest.skip(f"numba takes no {backend.device_kind} arrays")
    q = backend.asarray(np.ones((2, 4, 8)), "float32")
    k = backend.asarray(np.ones((2, 8, 4)), "float32")
    k = backend.xp.permute_dims(k, (0, 2, 1))  # strided: (2, 4, 8)
    before = backend.to_numpy(q).copy()
    with (
        pytest.raises(ValueError, match="kernel 'numba' cannot rotate k here: no strided destination"),
        anyrope.use_fast_paths("numba"),
    ):
        anyrope.RoPE(8)(q, k, offset=5, inplace=True)
    np.testing.assert_array_equal(backend.to_numpy(q), before)


@pytest.mark.backends("numpy", "torch")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_numba_keeps_one_table_of_cos_and_sin_side_by_side(backend: Backend, dtype: str) -> None:
    """The numba kernel reads each token's row of one cached table, each pair's cos and sin side
    by side (one stream in x's pair order): one entry the size of cos and sin together, with no
    separate cos and sin tables kept beside it; decoding on past the table grows it."""
    _needs_numba()
    if dtype not in backend.dtypes:
        pytest.skip(f"{backend.id} has no {dtype}")
    rope = anyrope.RoPE(16, rotary_dim=12, base=4711.0)
    data = np.random.default_rng(8).standard_normal((2, 3, 40, 16))
    anyrope.table_cache.clear()
    try:
        with anyrope.use_fast_paths("numba"):
            fast = rope(backend.asarray(data, dtype), offset=7)
            info = anyrope.table_cache.info()
            assert info["tables"] == 1
            # 47 positions -> 256 rows (the cache's least length) of 6 pairs' cos and sin, float32
            assert info["nbytes"] - info["constant_nbytes"] == 256 * 12 * 4
            step = rope(backend.asarray(data[:, :, :1], dtype), offset=300)
            assert anyrope.table_cache.info()["tables"] == 1
            assert anyrope.table_cache.info()["nbytes"] - info["constant_nbytes"] == 512 * 12 * 4
        (kept,) = [entry.tables for entry in anyrope.table_cache._entries.values() if entry.length]
        cos, sin = rope.cos_sin(backend.asarray(np.arange(512)), like=backend.asarray(np.zeros(1), "float32"))
        side_by_side = np.stack([backend.to_numpy(cos), backend.to_numpy(sin)], axis=-1).reshape(512, 12)
        np.testing.assert_array_equal(backend.to_numpy(kept[0]), side_by_side)
        with _generic():
            generic = rope(backend.asarray(data, dtype), offset=7)
            generic_step = rope(backend.asarray(data[:, :, :1], dtype), offset=300)
    finally:
        anyrope.table_cache.clear()
    assert_close(backend, fast, backend.to_numpy(generic), dtype)
    assert_close(backend, step, backend.to_numpy(generic_step), dtype)


@pytest.mark.backends("mlx")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mlx_keeps_cos_and_the_signed_sin_of_its_layout(
    backend: Backend, dtype: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLX kernel reads the rows of one cached entry, cos and the sin signed as each
    partner's factor (-s, s) in the layout's feature order, so a call at host-known positions
    stacks nothing (stacked per call: a negation and a concatenation MLX cannot fuse). A call's
    own tables are stacked once for q and k (MLX array positions, never read on the host), or
    once per array where each has its own (xPos, given tables); every form equals the generic
    code bit for bit, forward and inverse."""
    from anyrope import _tables
    from anyrope._kernels import mlx_compiled

    stacked: list[tuple[int, ...]] = []  # the leading shape of each sin table stacked
    signed_sin = _tables.signed_sin

    def spy(xp: Any, sin: Any, layout: str) -> Any:
        stacked.append(tuple(sin.shape[:-1]))
        return signed_sin(xp, sin, layout)

    monkeypatch.setattr(mlx_compiled, "signed_sin", spy)
    monkeypatch.setattr(_tables, "signed_sin", spy)
    rope = anyrope.RoPE(16, rotary_dim=12, base=4711.0, layout=layout)
    data = np.random.default_rng(9).standard_normal((2, 3, 40, 16))
    like = backend.asarray(np.zeros(1), "float32")
    positions = backend.asarray(np.arange(40) * 3)
    calls = {
        "offset": lambda x, **kw: rope(x, offset=7, **kw),
        "positions": lambda x, **kw: rope(x, positions=[3, 900] * 20, **kw),
        "decode": lambda x, **kw: rope(x[:, :, :1], offset=[5, 300], **kw),
    }
    anyrope.table_cache.clear()
    try:
        with anyrope.use_fast_paths("mlx-compiled"):
            fast = {name: call(backend.asarray(data, dtype)) for name, call in calls.items()}
            info = anyrope.table_cache.info()
            assert stacked == [(256,), (1024,)]  # the cache entry, made and grown: nothing per call
            assert info["tables"] == 1
            # 901 positions -> 1024 rows of 6 pairs' cos and their sin twice, float32
            assert info["nbytes"] - info["constant_nbytes"] == 1024 * 18 * 4
            inverse = {name: call(backend.asarray(data, dtype), inverse=True) for name, call in calls.items()}
            assert len(stacked) == 2
            (kept,) = [entry.tables for entry in anyrope.table_cache._entries.values() if entry.length]
            own = {
                "xPos": lambda x: anyrope.RoPE(16, layout=layout, xpos_scale_base=64)(x, x, offset=7)[1],
                "given": lambda x: anyrope.apply(x, *rope.cos_sin(backend.asarray(np.arange(40)), like=like),
                                                 layout=layout),
            }  # fmt: skip
            fast.update({name: call(backend.asarray(data, dtype)) for name, call in own.items()})
            assert len(stacked) == 5  # and xPos's q and k, the given tables
            stacked.clear()
            both = rope(backend.asarray(data, dtype), backend.asarray(data, dtype), positions=positions)
            assert len(stacked) == 1
        cos, sin = (backend.to_numpy(t) for t in rope.cos_sin(backend.asarray(np.arange(1024)), like=like))
        signed = np.stack([-sin, sin], axis=-2 if layout == "half" else -1).reshape(1024, 12)
        np.testing.assert_array_equal(backend.to_numpy(kept[0]), cos)
        np.testing.assert_array_equal(backend.to_numpy(kept[1]), signed)
        with _generic():
            for name, call in {**calls, **own}.items():
                assert_same(backend, fast[name], call(backend.asarray(data, dtype)), dtype)
            for name, call in calls.items():
                assert_same(backend, inverse[name], call(backend.asarray(data, dtype), inverse=True), dtype)
            for got in both:
                assert_same(backend, got, rope(backend.asarray(data, dtype), positions=positions), dtype)
    finally:
        anyrope.table_cache.clear()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_numba_turns_q_and_k_in_one_launch(
    backend: Backend, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q and k of one call share one numba launch (its fixed cost is most of an eager decode
    step): heads, sequence axes and widths of their own, per-row offsets, in place, partial
    rotary; bit for bit each array's own launch. One launch each where they cannot share one:
    dtypes or lengths that differ, xPos (two sources)."""
    _needs_numba()
    numba = KERNELS["numba"]
    if backend.name not in numba.libraries or backend.device_kind not in numba.devices:
        pytest.skip(f"numba takes no {backend.id} arrays itself (Dask's: chunk by chunk, later)")
    if dtype not in backend.dtypes:
        pytest.skip(f"{backend.id} has no {dtype}")
    from anyrope._kernels import _numba_run, numba_cpu

    launches: list[int] = []  # the arrays of each launch
    launcher = _numba_run.launcher

    def spy(*prepared: Any) -> Any:
        launch = launcher(*prepared)

        def counted(xs: Any, *rest: Any) -> Any:
            launches.append(len(xs))
            return launch(xs, *rest)

        return counted

    monkeypatch.setattr(numba_cpu, "launcher", spy)
    rng = np.random.default_rng(3)
    rope = anyrope.RoPE(32, rotary_dim=24)

    def array(*shape: int) -> Any:
        return backend.asarray(rng.standard_normal(shape), dtype)

    q, k = array(3, 5, 9, 32), array(3, 2, 9, 32)
    by_offsets = lambda q, k, **kw: rope(q, k, offset=[4, 0, 900], **kw)
    calls = {  # name: (call, q, k)
        "offsets": (by_offsets, q, k),
        "positions": (lambda q, k: rope(q, k, positions=backend.asarray(np.arange(9) * 7)), q, k),
        "seq axes": (lambda q, k: rope(q, k, offset=3, seq_axis=-3), array(3, 9, 5, 32), array(3, 9, 2, 32)),
        "in place": (lambda q, k: by_offsets(q, k, inplace=True), q, k),
        "decode": (by_offsets, array(3, 5, 1, 32), array(3, 2, 1, 32)),
    }
    with anyrope.use_fast_paths("numba"):
        for name, (call, x, y) in calls.items():
            launches.clear()
            together = call(_copy(backend, x), _copy(backend, y))
            assert launches == [2], name
            alone = (call(_copy(backend, x), None), call(_copy(backend, y), None))
            for got, want in zip(together, alone, strict=True):
                np.testing.assert_array_equal(backend.to_numpy(got), backend.to_numpy(want), err_msg=name)
        apart = {
            "dtypes": lambda: rope(
                q, backend.asarray(rng.standard_normal((3, 2, 9, 32)), "float64"), offset=2
            ),
            "lengths": lambda: rope(q, k[:, :, :4], offset=2),
            "xPos": lambda: anyrope.RoPE(32, xpos_scale_base=512)(q, k, offset=2),
        }
        for name, call in apart.items():
            launches.clear()
            call()
            assert launches == [1, 1], name


def _copy(backend: Backend, x: Any) -> Any:
    return backend.asarray(backend.to_numpy(x), str(x.dtype).rsplit(".", 1)[-1])


def test_threads_under_numbas_workqueue_layer() -> None:
    """numba's fallback threading layer aborts on concurrent launches; calls must be serialised."""
    _needs_numba()
    import os
    import subprocess
    import sys

    script = (
        "import threading, numpy as np, anyrope\n"
        "from anyrope._kernels import _numba\n"
        "rope = anyrope.RoPE(64)\n"
        "x = np.random.default_rng(0).standard_normal((2, 4, 128, 64)).astype(np.float32)\n"
        "want = rope(x)\n"
        "bad = []\n"
        "def work():\n"
        "    for _ in range(30):\n"
        "        bad.extend([1] if not np.array_equal(rope(x), want) else [])\n"
        "threads = [threading.Thread(target=work) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(_numba._serial, len(bad))\n"
    )
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "0"]
