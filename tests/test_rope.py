"""RoPE against the float64 oracle, and the properties that define it, on every backend.

Tests taking ``mode`` run eagerly and under each compiler the backend has (torch.compile with
fullgraph=True, static and with dynamic shapes; jax.jit; mx.compile), with positions and
offsets as traced inputs, and the compiled result must equal the eager one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import anyrope

import oracle
from harness import Backend, assert_close, assert_same

LAYOUTS = ["half", "interleaved"]


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    """What the backend holds after casting ``a`` to ``dtype``: the oracle's input."""
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


def _same(backend: Backend, compiled: Any, eager: Any, dtype: str) -> None:
    """Compiled equals eager: bit for bit where the same kernels run, else within the rounding a
    compiler's own fusion and trigonometry may change (a few ulps of the dtype, never more)."""
    got, want = backend.to_numpy(compiled), backend.to_numpy(eager)
    ulp = {"float64": 2e-15, "float32": 4e-7, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    np.testing.assert_allclose(got, want, rtol=0, atol=ulp * max(1.0, float(np.max(np.abs(want), initial=0))))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_matches_oracle(backend: Backend, mode: str, dtype: str, layout: str, rotary_dim: int | None) -> None:
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=rotary_dim)
    x = backend.asarray(_x((2, 3, 7, 16)), dtype)
    out = backend.compile(lambda q: rope(q), mode)(x)
    expected = oracle.rotate(
        _rounded(backend, _x((2, 3, 7, 16)), dtype), np.arange(7), layout=layout, rotary_dim=rotary_dim
    )
    assert out.dtype == x.dtype
    assert_close(backend, out, expected, dtype)
    if mode != "eager":
        _same(backend, out, rope(x), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_clockwise_matches_oracle(backend: Backend, mode: str, dtype: str, layout: str) -> None:
    """clockwise=True turns every pair by -position * theta (NanoChat); its tables, given to
    anyrope.apply, rotate the same way."""
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12, clockwise=True)
    x = backend.asarray(_x((2, 3, 7, 16)), dtype)
    positions = backend.asarray(np.array([[0, 1, 2, 3, 900, 5, 6], [9, 8, 7, -6, 5, 4, 3]]))
    out = backend.compile(lambda q, p: rope(q, positions=p), mode)(x, positions)
    want = oracle.rotate(
        _rounded(backend, _x((2, 3, 7, 16)), dtype),
        backend.to_numpy(positions),
        layout=layout,
        rotary_dim=12,
        inverse=True,
    )
    assert_close(backend, out, want, dtype)
    if mode == "eager":
        cos, sin = rope.cos_sin(positions, like=x)
        assert_close(backend, anyrope.apply(x, cos, sin, layout=layout), want, dtype)
        assert repr(rope).endswith("clockwise=True)")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_q_and_k_with_grouped_heads(backend: Backend, mode: str, layout: str) -> None:
    rope = anyrope.RoPE(8, base=500.0, layout=layout)
    q_np, k_np = _x((2, 4, 5, 8), 1), _x((2, 2, 5, 8), 2)
    call = backend.compile(lambda q, k: rope(q, k, offset=3), mode)
    q, k = call(backend.asarray(q_np, "float32"), backend.asarray(k_np, "float32"))
    pos = np.arange(3, 8)
    for got, data in ((q, q_np), (k, k_np)):
        expected = oracle.rotate(_rounded(backend, data, "float32"), pos, layout=layout, base=500.0)
        assert_close(backend, got, expected, "float32")


def test_seq_axis_minus_three(backend: Backend, mode: str) -> None:
    rope = anyrope.RoPE(8, layout="interleaved")
    x_np = _x((2, 6, 3, 8))  # (batch, seq, heads, head_dim)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    out = backend.compile(lambda x: rope(x, seq_axis=-3, offset=4), mode)(backend.asarray(x_np, dtype))
    expected = oracle.rotate(
        _rounded(backend, x_np, dtype), np.arange(4, 10), layout="interleaved", seq_axis=-3
    )
    assert_close(backend, out, expected, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_explicit_and_per_batch_positions(backend: Backend, mode: str, layout: str) -> None:
    """1-D and 2-D positions as traced inputs, negative ones and large ones included."""
    rope = anyrope.RoPE(8, layout=layout)
    x_np = _x((3, 2, 4, 8))
    x = backend.asarray(x_np, "float32")
    call = backend.compile(lambda x, p: rope(x, positions=p), mode)
    for positions in (np.array([5, 0, 9, 3]), np.array([[0, 1, 2, 3], [7, 8, 9, 10], [100, -2, 70_000, 0]])):
        out = call(x, backend.asarray(positions))
        assert_close(
            backend,
            out,
            oracle.rotate(_rounded(backend, x_np, "float32"), positions, layout=layout),
            "float32",
        )
        if mode != "eager":
            _same(backend, out, rope(x, positions=backend.asarray(positions)), "float32")
    # Python sequences are accepted too (eagerly: they are constants to a compiler).
    rows = [[0, 1, 2, 3], [7, 8, 9, 10], [100, 2, 50, 0]]
    assert_close(
        backend,
        rope(x, positions=rows),
        oracle.rotate(_rounded(backend, x_np, "float32"), np.array(rows), layout=layout),
        "float32",
    )


def test_per_row_offsets_left_padding_included(backend: Backend, mode: str) -> None:
    """One offset per row as a traced array, negative for left-padded rows (mlx-lm's batched
    KV cache), and a 0-d traced offset."""
    rope = anyrope.RoPE(8)
    x_np = _x((3, 2, 4, 8))
    x = backend.asarray(x_np, "float32")
    offsets = np.array([0, 10, -3])
    expected = oracle.rotate(_rounded(backend, x_np, "float32"), offsets[:, None] + np.arange(4))
    call = backend.compile(lambda x, o: rope(x, offset=o), mode)
    assert_close(backend, call(x, backend.asarray(offsets)), expected, "float32")
    assert_close(backend, rope(x, offset=offsets.tolist()), expected, "float32")
    scalar = backend.xp.asarray(7, dtype=backend.dtype(backend.index), device=backend.device)
    want = oracle.rotate(_rounded(backend, x_np, "float32"), np.arange(7, 11))
    assert_close(backend, call(x, scalar), want, "float32")


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("int_dtype", INT_DTYPES)
def test_positions_and_offsets_of_every_integer_dtype(backend: Backend, mode: str, int_dtype: str) -> None:
    """Positions and offsets of any integer dtype the library has, traced too: the same angles
    as int64 (torch has no arithmetic on its unsigned 32- and 64-bit types, JAX without x64 no
    64-bit integers at all)."""
    dtype = getattr(backend.xp, int_dtype, None)
    if dtype is None or np.iinfo(int_dtype).bits > np.iinfo(backend.index).bits:
        pytest.skip(f"{backend.id} has no {int_dtype} arrays")
    rope = anyrope.RoPE(8, scaling=anyrope.scaling.DynamicNTK(2.0, 8))  # reads the largest position
    x_np = _x((2, 2, 4, 8))
    x = backend.asarray(x_np, "float32")
    top = min(int(np.iinfo(int_dtype).max) - 4, 100_000)
    by_positions = backend.compile(lambda x, p: rope(x, positions=p), mode)
    by_offset = backend.compile(lambda x, o: rope(x, offset=o), mode)
    for positions, offsets in (
        (np.array([[0, 1, 2, 3], [top, top + 1, top + 2, top + 3]]), np.array([0, top])),
        (np.array([[5, 6, 7, 8], [9, 10, 11, 12]]), np.array([5, 9])),  # within DynamicNTK's length
    ):
        want = rope(x, positions=backend.asarray(positions.astype(backend.index)))
        got = by_positions(x, backend.asarray(positions.astype(int_dtype)))
        _same(backend, got, want, "float32")
        _same(backend, by_offset(x, backend.asarray(offsets.astype(int_dtype))), want, "float32")
    scalar = backend.xp.asarray(3, dtype=dtype, device=backend.device)
    _same(backend, by_offset(x, scalar), rope(x, offset=3), "float32")


def test_positions_past_two_to_the_63(backend: Backend, mode: str) -> None:
    """uint64 positions past 2**63 (which wrap when read as int64) take every path safely, the
    host-known one that reads cached tables included, and rotate by their exact angles."""
    if getattr(backend.xp, "uint64", None) is None or backend.index != "int64":
        pytest.skip(f"{backend.id} has no 64-bit unsigned positions")
    rope = anyrope.RoPE(8)
    positions = np.array([2**63, 2**64 - 1, 5, 2**63 + 12345], dtype=np.uint64)
    x_np = _x((2, 4, 8))
    x = backend.asarray(x_np, "float32")
    out = backend.compile(lambda x, p: rope(x, positions=p), mode)(x, backend.asarray(positions))
    cos, sin = oracle.exact_cos_sin(positions, np.asarray(rope.inv_freq))
    a, b = _rounded(backend, x_np, "float32")[..., :4], _rounded(backend, x_np, "float32")[..., 4:]
    assert_close(backend, out, np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1), "float32")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decoding_token_by_token_equals_full_call(backend: Backend, dtype: str, layout: str) -> None:
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    x = backend.asarray(_x((2, 3, 9, 16)), dtype)
    full = backend.to_numpy(rope(x))
    for step in range(9):
        token = x[:, :, step : step + 1, :]
        got = backend.to_numpy(rope(token, offset=step))
        np.testing.assert_array_equal(got, full[:, :, step : step + 1, :], err_msg=f"step {step}")
    # A prefill of 4 then decoding continues from there.
    np.testing.assert_array_equal(backend.to_numpy(rope(x[:, :, 4:, :], offset=4)), full[:, :, 4:, :])


def test_partial_rotary_tail_is_bit_identical(backend: Backend, mode: str, dtype: str) -> None:
    rope = anyrope.RoPE(16, rotary_dim=6)
    x = backend.asarray(_x((2, 5, 16)), dtype)
    out = backend.compile(lambda x: rope(x, offset=3), mode)(x)
    np.testing.assert_array_equal(backend.to_numpy(out[..., 6:]), backend.to_numpy(x[..., 6:]))


def test_position_zero_is_identity(backend: Backend, dtype: str) -> None:
    x = backend.asarray(_x((3, 1, 8)), dtype)
    np.testing.assert_array_equal(backend.to_numpy(anyrope.RoPE(8)(x)), backend.to_numpy(x))


def test_negative_positions_turn_back(backend: Backend) -> None:
    """Position -p undoes position p: the inverse rotation."""
    rope = anyrope.RoPE(8, layout="interleaved")
    x = backend.asarray(_x((2, 3, 8)), "float32")
    there = rope(x, positions=[5, 900, 123_456])
    back = rope(there, positions=[-5, -900, -123_456])
    assert_close(backend, back, _rounded(backend, _x((2, 3, 8)), "float32"), "float32")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inverse_undoes(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(8, layout=layout)
    x_np = _x((2, 6, 8))
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    x = backend.asarray(x_np, dtype)
    x_np = _rounded(backend, x_np, dtype)
    cos, sin = rope.cos_sin(backend.asarray(np.arange(100, 106)), like=x)
    turned = anyrope.apply(x, cos, sin, layout=layout)
    assert_close(backend, anyrope.apply(turned, cos, sin, layout=layout, inverse=True), x_np, dtype)
    expected = oracle.rotate(x_np, np.arange(100, 106), layout=layout, inverse=True)
    assert_close(backend, anyrope.apply(x, cos, sin, layout=layout, inverse=True), expected, dtype)


def _pair_norms(x: Any, layout: str, rotary_dim: int) -> Any:
    half = rotary_dim // 2
    if layout == "half":
        a, b = x[..., :half], x[..., half:rotary_dim]
    else:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    return np.hypot(a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
@given(offset=st.integers(-(2**31), 2**31 - 16), rotary_dim=st.sampled_from([2, 12, 32]))  # int32 too (JAX)
def test_every_pair_keeps_its_norm(backend: Backend, layout: str, offset: int, rotary_dim: int) -> None:
    """A rotation turns each pair in its plane: every pair's norm is kept (not just the head's,
    which a swap of features would keep too), at any position, and the features past
    rotary_dim pass through bit for bit."""
    rope = anyrope.RoPE(32, layout=layout, rotary_dim=rotary_dim)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    x_np = _rounded(backend, _x((4, 5, 32)), dtype)
    out = backend.to_numpy(rope(backend.asarray(x_np, dtype), offset=offset))
    # float32: one rounding of each of the two products and the sum, relative to the pair's norm
    rtol = 1e-12 if dtype == "float64" else 2e-6
    np.testing.assert_allclose(
        _pair_norms(out, layout, rotary_dim), _pair_norms(x_np, layout, rotary_dim), rtol=rtol
    )
    np.testing.assert_array_equal(out[..., rotary_dim:], x_np[..., rotary_dim:])


@pytest.mark.parametrize("layout", LAYOUTS)
@given(m=st.integers(-5000, 5000), n=st.integers(-5000, 5000), shift=st.integers(-5000, 5000))
def test_scores_depend_only_on_relative_position(
    backend: Backend, layout: str, m: int, n: int, shift: int
) -> None:
    rope = anyrope.RoPE(16, layout=layout)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    q = backend.asarray(_x((1, 16), 3), dtype)
    k = backend.asarray(_x((1, 16), 4), dtype)

    def score(i: int, j: int) -> float:
        qi = backend.to_numpy(rope(q, positions=[i]))
        kj = backend.to_numpy(rope(k, positions=[j]))
        return float(np.sum(qi * kj))

    tolerance = 1e-9 if dtype == "float64" else 1e-5
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), rel=tolerance, abs=tolerance)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_agrees_with_matrix_and_complex_forms(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(12, layout=layout, rotary_dim=8, base=100.0)
    x = backend.asarray(_x((2, 5, 12)), "float32")
    positions = [0, 3, 17, 250, 4096]
    fast = rope(x, positions=positions)
    dense = anyrope.reference.apply_matrix(x, positions, rope.inv_freq, layout=layout)
    complex_form = anyrope.reference.apply_complex(x, positions, rope.inv_freq, layout=layout)
    expected = backend.to_numpy(fast).astype(np.float64)
    assert_close(backend, dense, expected, "float32")
    assert_close(backend, complex_form, expected, "float32")


def test_reference_rotation_matrix_is_block_diagonal(backend: Backend) -> None:
    like = backend.asarray(np.zeros(1), "float32")
    theta = oracle.inv_freq(4)
    for layout in LAYOUTS:
        matrix = backend.to_numpy(
            anyrope.reference.rotation_matrix(7, theta, head_dim=6, layout=layout, like=like)
        )
        np.testing.assert_allclose(matrix @ matrix.T, np.eye(6), atol=1e-6)
        np.testing.assert_array_equal(matrix[4:, 4:], np.eye(2))
        a, b = oracle.pairs(4, layout)
        np.testing.assert_allclose(matrix[a[1], b[1]], -np.sin(7 * theta[1]), atol=1e-7)


def test_offset_tables_match_explicit_positions(backend: Backend) -> None:
    """Cached prefix tables, gathered rows and tables formed from positions agree exactly."""
    rope = anyrope.RoPE(16, max_position=64)
    x = backend.asarray(_x((1, 300, 16)), "float32")
    by_offset = rope(x, offset=1000)
    assert_same(backend, rope(x, positions=list(range(1000, 1300))), by_offset, "float32")
    assert_same(backend, rope(x, positions=backend.asarray(np.arange(1000, 1300))), by_offset, "float32")


def test_output_library_device_and_dtype(backend: Backend, dtype: str) -> None:
    import array_api_compat

    rope = anyrope.RoPE(8, rotary_dim=4)
    x = backend.asarray(_x((2, 3, 8)), dtype)
    for out in (rope(x), *rope(x, x), rope(x, positions=[1, 2, 3]), rope(x, offset=[1, 2])):
        assert type(out) is type(x)
        assert out.dtype == x.dtype
        assert tuple(out.shape) == tuple(x.shape)
        if backend.name != "mlx":  # MLX arrays have no device: unified memory
            assert array_api_compat.device(out) == array_api_compat.device(x)
    cos, sin = rope.cos_sin(backend.asarray(np.arange(3)), like=x)
    assert type(cos) is type(x)
    assert cos.dtype == x.dtype
    assert tuple(sin.shape) == (3, 2)


def test_sinusoidal(backend: Backend, mode: str) -> None:
    positions = np.array([[0, 1, 2], [10, 500, 20_000]])
    out = backend.compile(lambda p: anyrope.sinusoidal(p, 12), mode)(backend.asarray(positions))
    assert out.dtype == backend.dtype("float32")
    assert_close(backend, out, oracle.sinusoidal(positions, 12), "float32")
    if "float64" in backend.dtypes:
        out64 = anyrope.sinusoidal(backend.asarray(positions), 12, base=100.0, dtype=backend.dtype("float64"))
        assert_close(backend, out64, oracle.sinusoidal(positions, 12, base=100.0), "float64")
