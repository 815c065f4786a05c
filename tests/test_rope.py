"""RoPE against the float64 oracle, and the properties that define it, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import anyrope

import oracle
from harness import Backend, assert_close

LAYOUTS = ["half", "interleaved"]


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    """What the backend holds after casting ``a`` to ``dtype``: the oracle's input."""
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_matches_oracle_every_dtype(backend: Backend, layout: str, rotary_dim: int | None) -> None:
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=rotary_dim)
    for dtype in backend.dtypes:
        x = backend.asarray(_x((2, 3, 7, 16)), dtype)
        out = rope(x)
        expected = oracle.rotate(
            _rounded(backend, _x((2, 3, 7, 16)), dtype), np.arange(7), layout=layout, rotary_dim=rotary_dim
        )
        assert out.dtype == x.dtype
        assert_close(backend, out, expected, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_q_and_k_with_grouped_heads(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(8, base=500.0, layout=layout)
    q_np, k_np = _x((2, 4, 5, 8), 1), _x((2, 2, 5, 8), 2)
    q, k = rope(backend.asarray(q_np, "float32"), backend.asarray(k_np, "float32"))
    pos = np.arange(5)
    assert_close(
        backend,
        q,
        oracle.rotate(_rounded(backend, q_np, "float32"), pos, layout=layout, base=500.0),
        "float32",
    )
    assert_close(
        backend,
        k,
        oracle.rotate(_rounded(backend, k_np, "float32"), pos, layout=layout, base=500.0),
        "float32",
    )


def test_seq_axis_minus_three(backend: Backend) -> None:
    rope = anyrope.RoPE(8, layout="interleaved")
    x_np = _x((2, 6, 3, 8))  # (batch, seq, heads, head_dim)
    out = rope(backend.asarray(x_np, "float64"), seq_axis=-3, offset=4)
    expected = oracle.rotate(x_np, np.arange(4, 10), layout="interleaved", seq_axis=-3)
    assert_close(backend, out, expected, "float64")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_explicit_and_per_batch_positions(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(8, layout=layout)
    x_np = _x((3, 2, 4, 8))
    x = backend.asarray(x_np, "float64")
    flat = np.array([5, 0, 9, 3])
    assert_close(
        backend, rope(x, positions=backend.asarray(flat)), oracle.rotate(x_np, flat, layout=layout), "float64"
    )
    rows = np.array([[0, 1, 2, 3], [7, 8, 9, 10], [100, 2, 50, 0]])
    out = rope(x, positions=backend.asarray(rows))
    assert_close(backend, out, oracle.rotate(x_np, rows, layout=layout), "float64")
    # Python sequences are accepted too.
    assert_close(
        backend, rope(x, positions=rows.tolist()), oracle.rotate(x_np, rows, layout=layout), "float64"
    )


def test_per_row_offsets(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    x_np = _x((3, 2, 4, 8))
    x = backend.asarray(x_np, "float64")
    offsets = np.array([0, 10, 3])
    expected = oracle.rotate(x_np, offsets[:, None] + np.arange(4))
    assert_close(backend, rope(x, offset=backend.asarray(offsets)), expected, "float64")
    assert_close(backend, rope(x, offset=offsets.tolist()), expected, "float64")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decoding_token_by_token_equals_full_call(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12)
    for dtype in backend.dtypes:
        x = backend.asarray(_x((2, 3, 9, 16)), dtype)
        full = backend.to_numpy(rope(x))
        for step in range(9):
            token = x[:, :, step : step + 1, :]
            got = backend.to_numpy(rope(token, offset=step))
            np.testing.assert_array_equal(got, full[:, :, step : step + 1, :], err_msg=f"{dtype} step {step}")
        # A prefill of 4 then decoding continues from there.
        np.testing.assert_array_equal(backend.to_numpy(rope(x[:, :, 4:, :], offset=4)), full[:, :, 4:, :])


def test_partial_rotary_tail_is_bit_identical(backend: Backend) -> None:
    rope = anyrope.RoPE(16, rotary_dim=6)
    for dtype in backend.dtypes:
        x = backend.asarray(_x((2, 5, 16)), dtype)
        out = rope(x, offset=3)
        np.testing.assert_array_equal(backend.to_numpy(out[..., 6:]), backend.to_numpy(x[..., 6:]))


def test_position_zero_is_identity(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    for dtype in backend.dtypes:
        x = backend.asarray(_x((3, 1, 8)), dtype)
        np.testing.assert_array_equal(backend.to_numpy(rope(x)), backend.to_numpy(x))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inverse_undoes(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(8, layout=layout)
    x_np = _x((2, 6, 8))
    x = backend.asarray(x_np, "float64")
    cos, sin = rope.cos_sin(backend.asarray(np.arange(100, 106)), like=x)
    turned = anyrope.apply(x, cos, sin, layout=layout)
    assert_close(backend, anyrope.apply(turned, cos, sin, layout=layout, inverse=True), x_np, "float64")
    expected = oracle.rotate(x_np, np.arange(100, 106), layout=layout, inverse=True)
    assert_close(backend, anyrope.apply(x, cos, sin, layout=layout, inverse=True), expected, "float64")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_norms_preserved(backend: Backend, layout: str) -> None:
    rope = anyrope.RoPE(32, layout=layout)
    x_np = _x((4, 50, 32))
    out = backend.to_numpy(rope(backend.asarray(x_np, "float64"), offset=1000))
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x_np, axis=-1), rtol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@given(m=st.integers(0, 5000), n=st.integers(0, 5000), shift=st.integers(0, 5000))
def test_scores_depend_only_on_relative_position(
    backend: Backend, layout: str, m: int, n: int, shift: int
) -> None:
    rope = anyrope.RoPE(16, layout=layout)
    q = backend.asarray(_x((1, 16), 3), "float64")
    k = backend.asarray(_x((1, 16), 4), "float64")

    def score(i: int, j: int) -> float:
        qi = backend.to_numpy(rope(q, positions=[i]))
        kj = backend.to_numpy(rope(k, positions=[j]))
        return float(np.sum(qi * kj))

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), rel=1e-9, abs=1e-9)


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


def test_tables_within_1e6_of_float64_up_to_two_million(backend: Backend) -> None:
    rope = anyrope.RoPE(128)
    positions = np.array([0, 1, 4095, 65_537, 999_999, 1_000_000, 1_999_999, 2_000_000])
    for dtype in ("float32", "float64"):
        if dtype not in backend.dtypes:
            continue
        like = backend.asarray(np.zeros(1), dtype)
        cos, sin = rope.cos_sin(backend.asarray(positions), like=like)
        want_cos, want_sin = oracle.cos_sin(positions, 128)
        assert cos.dtype == like.dtype
        assert tuple(cos.shape) == (8, 64)
        assert np.max(np.abs(backend.to_numpy(cos) - want_cos)) <= 1e-6
        assert np.max(np.abs(backend.to_numpy(sin) - want_sin)) <= 1e-6


def test_tables_without_float64_fall_back_exactly(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices without float64 (Apple GPUs, JAX without x64) use float32 angle addition."""
    import anyrope._tables

    monkeypatch.setattr(anyrope._tables, "float64_scope", lambda xp, device: None)
    rope = anyrope.RoPE(64, base=500_000.0)
    positions = np.array([[0, 3, 131_071], [1_000_000, 1_999_999, 2_000_000]])
    like = backend.asarray(np.zeros(1), "float32")
    cos, sin = rope.cos_sin(backend.asarray(positions), like=like)
    want_cos, want_sin = oracle.cos_sin(positions, 64, base=500_000.0)
    assert np.max(np.abs(backend.to_numpy(cos) - want_cos)) <= 1e-6
    assert np.max(np.abs(backend.to_numpy(sin) - want_sin)) <= 1e-6


def test_offset_tables_match_explicit_positions(backend: Backend) -> None:
    rope = anyrope.RoPE(16, max_position=64)
    x = backend.asarray(_x((1, 300, 16)), "float32")
    by_offset = backend.to_numpy(rope(x, offset=1000))
    by_position = backend.to_numpy(rope(x, positions=list(range(1000, 1300))))
    np.testing.assert_array_equal(by_offset, by_position)


def test_output_library_device_and_dtype(backend: Backend) -> None:
    import array_api_compat

    rope = anyrope.RoPE(8, rotary_dim=4)
    for dtype in backend.dtypes:
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


def test_sinusoidal(backend: Backend) -> None:
    positions = np.array([[0, 1, 2], [10, 500, 20_000]])
    out = anyrope.sinusoidal(backend.asarray(positions), 12)
    assert out.dtype == backend.dtype("float32")
    assert_close(backend, out, oracle.sinusoidal(positions, 12), "float32")
    out64 = anyrope.sinusoidal(backend.asarray(positions), 12, base=100.0, dtype=backend.dtype("float64"))
    assert_close(backend, out64, oracle.sinusoidal(positions, 12, base=100.0), "float64")
