"""``rope(x, ..., inverse=True)``: the turn by minus the angles at the given positions, on every
backend, eagerly and compiled, against the float64 oracle (DeepSeek-V4 turns its attention
outputs back this way)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope

import oracle
from harness import Backend, assert_close, assert_same

LAYOUTS = ["half", "interleaved"]


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 10])
def test_inverse_matches_oracle(
    backend: Backend, mode: str, dtype: str, layout: str, rotary_dim: int | None
) -> None:
    """q and k turned back by their positions (negative and far ones included, per batch row)."""
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=rotary_dim)
    q_np, k_np = _x((2, 3, 7, 16), 1), _x((2, 1, 7, 16), 2)
    positions = np.array([[0, 1, 2, 3, 900, 5, 6], [9, 8, 7, -6, 5, 70_000, 3]])
    q, k, p = backend.asarray(q_np, dtype), backend.asarray(k_np, dtype), backend.asarray(positions)
    call = backend.compile(lambda q, k, p: rope(q, k, positions=p, inverse=True), mode)
    got_q, got_k = call(q, k, p)
    for got, data in ((got_q, q_np), (got_k, k_np)):
        want = oracle.rotate(
            _rounded(backend, data, dtype), positions, layout=layout, rotary_dim=rotary_dim, inverse=True
        )
        assert got.dtype == q.dtype
        assert_close(backend, got, want, dtype)
    if mode != "eager":
        eager_q, _ = rope(q, k, positions=p, inverse=True)
        assert_close(backend, got_q, backend.to_numpy(eager_q), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inverse_undoes_the_rotation(backend: Backend, mode: str, dtype: str, layout: str) -> None:
    """inverse(forward(x)) is x, to two roundings of the dtype, in every offset form."""
    rope = anyrope.RoPE(16, layout=layout, rotary_dim=12, base=500.0)
    data = _x((2, 3, 5, 16), 3)
    x = backend.asarray(data, dtype)
    start = backend.asarray(np.array(40_000))
    rows = backend.asarray(np.array([7, -2]))
    forms = {
        "int offset": lambda x, s, r: rope(rope(x, offset=11), offset=11, inverse=True),
        "0-d offset": lambda x, s, r: rope(rope(x, offset=s), offset=s, inverse=True),
        "per-row offsets": lambda x, s, r: rope(rope(x, offset=r), offset=r, inverse=True),
    }
    for name, form in forms.items():
        back = backend.compile(form, mode)(x, start, rows)
        try:
            assert_close(backend, back, _rounded(backend, data, dtype), dtype)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        assert backend.to_numpy(back)[..., 12:].tolist() == _rounded(backend, data, dtype)[..., 12:].tolist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_clockwise_inverse_turns_counterclockwise(backend: Backend, dtype: str, layout: str) -> None:
    """Both directions compose: a clockwise RoPE turned back is the plain RoPE's forward turn,
    bit for bit (the same job), and the plain one's inverse is the clockwise forward turn."""
    plain = anyrope.RoPE(8, layout=layout)
    clockwise = anyrope.RoPE(8, layout=layout, clockwise=True)
    x = backend.asarray(_x((2, 2, 6, 8), 4), dtype)
    assert_same(backend, clockwise(x, offset=3, inverse=True), plain(x, offset=3), dtype)
    assert_same(backend, plain(x, offset=3, inverse=True), clockwise(x, offset=3), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inverse_mrope_positions(backend: Backend, mode: str, layout: str) -> None:
    """M-RoPE: each pair turned back by its own stream's position."""
    section = [2, 1, 1]
    rope = anyrope.RoPE(8, layout=layout, mrope_section=section)
    positions = np.array(
        [
            [[0, 1, 2, 2, 9], [5, 6, 7, 7, 3]],
            [[0, 1, 2, 3, 9], [5, 6, 8, 8, 3]],
            [[0, 1, 3, 2, 9], [5, 6, 8, 9, 3]],
        ]
    )  # (streams, batch, seq)
    data = _x((2, 2, 5, 8), 5)
    got = backend.compile(lambda x, p: rope(x, positions=p, inverse=True), mode)(
        backend.asarray(data, "float32"), backend.asarray(positions)
    )
    streams = oracle.mrope_streams(section, False)
    want = oracle.mrope_rotate(
        _rounded(backend, data, "float32"), positions, streams, layout=layout, inverse=True
    )
    assert_close(backend, got, want, "float32")


def test_inverse_with_cos_sin_and_apply(backend: Backend) -> None:
    """The call's inverse is apply(..., inverse=True) with the RoPE's own tables."""
    rope = anyrope.RoPE(8, rotary_dim=6)
    x = backend.asarray(_x((1, 2, 4, 8), 6), "float32")
    p = backend.asarray(np.array([3, 1, 4, 1]))
    cos, sin = rope.cos_sin(p, like=x)
    assert_close(
        backend,
        rope(x, positions=p, inverse=True),
        backend.to_numpy(anyrope.apply(x, cos, sin, inverse=True)),
        "float32",
    )


@pytest.mark.parametrize("bad", [1, 0, "yes", None, np.bool_(True)])
def test_inverse_not_a_bool(bad: Any) -> None:
    """Only True and False: a truthy string or an int is a mistake, named before any work."""
    x = np.ones((1, 2, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="inverse must be True"):
        anyrope.RoPE(8)(x, inverse=bad)


def test_inverse_refused_with_xpos() -> None:
    x = np.ones((1, 2, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="inverse=True does not combine with xPos"):
        anyrope.RoPE(8, xpos_scale_base=512.0)(x, x, inverse=True)


@pytest.mark.parametrize(
    ("module", "library"),
    [("torch", "torch"), ("mlx", "mlx.core"), ("flax", "jax.numpy"), ("keras", "keras")],
)
def test_layers_take_inverse(module: str, library: str) -> None:
    """Each framework's RotaryEmbedding passes inverse= on to its RoPE."""
    pytest.importorskip(library)
    if module == "flax":
        pytest.importorskip("flax.nnx")
    import importlib

    layer_module = importlib.import_module(f"anyrope.layers.{module}")
    rope = anyrope.RoPE(8, rotary_dim=6)
    layer = layer_module.RotaryEmbedding(rope)
    data = _x((1, 2, 5, 8), 7).astype(np.float32)
    lib = importlib.import_module(library)
    x = lib.ops.convert_to_tensor(data) if module == "keras" else lib.asarray(data)
    turned = np.asarray(layer(x, offset=4, inverse=True))
    want = oracle.rotate(data.astype(np.float64), np.arange(4, 9), rotary_dim=6, inverse=True)
    size = max(1.0, float(np.max(np.abs(want))))  # the oracle's float32 tolerance, relative to |x|
    np.testing.assert_allclose(turned, want, rtol=0, atol=oracle.TOLERANCE["float32"] * size)
    with pytest.raises(TypeError, match="inverse must be True"):
        layer(x, offset=4, inverse="yes")
