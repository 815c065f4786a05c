"""xPos against the float64 oracle on every backend, eagerly and compiled, and the property it
exists for: scores decay with distance but depend on relative position only."""

from __future__ import annotations

import numpy as np
import pytest

import anyrope

import oracle
from harness import Backend, assert_close

LAYOUTS = ["half", "interleaved"]


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_oracle(backend: Backend, dtype: str, layout: str) -> None:
    _check_oracle(backend, "eager", dtype, layout)


def test_compiled_matches_oracle(backend: Backend, mode: str) -> None:
    _check_oracle(backend, mode, "float32", "half")


def _check_oracle(backend: Backend, mode: str, dtype: str, layout: str) -> None:
    rope = anyrope.RoPE(16, layout=layout, xpos_scale_base=64.0)
    positions = np.array([[0, 1, 2, 3, 40, 5, 6], [9, 8, 7, -6, 5, 4, 3]])
    q_np, k_np = _x((2, 3, 7, 16), 0), _x((2, 1, 7, 16), 1)
    call = backend.compile(lambda q, k, p: rope(q, k, positions=p), mode)
    q, k = call(backend.asarray(q_np, dtype), backend.asarray(k_np, dtype), backend.asarray(positions))
    for got, data, sign in ((q, q_np, 1.0), (k, k_np, -1.0)):
        rotated = oracle.rotate(_rounded(backend, data, dtype), positions, layout=layout)
        want = oracle.xpos(rotated, positions, 64.0, sign, layout=layout)
        assert got.dtype == backend.dtype(dtype)
        assert_close(backend, got, want, dtype)


def test_offsets_and_partial_rotary(backend: Backend, mode: str) -> None:
    rope = anyrope.RoPE(16, rotary_dim=8, xpos_scale_base=32.0)
    q_np, k_np = _x((2, 2, 5, 16), 2), _x((2, 2, 5, 16), 3)
    call = backend.compile(lambda q, k: rope(q, k, offset=[3, 11]), mode)
    q, k = call(backend.asarray(q_np, "float32"), backend.asarray(k_np, "float32"))
    positions = np.array([np.arange(3, 8), np.arange(11, 16)])
    for got, data, sign in ((q, q_np, 1.0), (k, k_np, -1.0)):
        x = _rounded(backend, data, "float32")
        rotated = oracle.rotate(x, positions, rotary_dim=8)
        rotated[..., :8] = oracle.xpos(rotated[..., :8], positions, 32.0, sign)
        assert_close(backend, got, rotated, "float32")
        assert bool(backend.xp.all(got[..., 8:] == backend.asarray(data, "float32")[..., 8:]))


def test_scores_depend_on_relative_position_and_decay() -> None:
    rope = anyrope.RoPE(32, xpos_scale_base=16.0)
    q, k = _x((1, 1, 1, 32), 4), _x((1, 1, 1, 32), 5)
    scores = {}
    for m, n in ((10, 4), (110, 104), (1010, 1004)):
        q_rot, _ = rope(q, q, offset=m)
        _, k_rot = rope(k, k, offset=n)
        scores[m] = float((q_rot * k_rot).sum())
    assert scores[110] == pytest.approx(scores[10], rel=1e-12)
    assert scores[1010] == pytest.approx(scores[10], rel=1e-10)
    # All-ones q and k: pair i adds 2 cos(d theta_i) zeta_i ** (d / scale_base) at distance d.
    ones = np.ones((1, 1, 1, 32))
    theta, zeta = oracle.inv_freq(32), (np.arange(0, 32, 2) / 32 + 0.4) / 1.4
    for distance in (0, 3, 50, 400):
        q_rot, _ = rope(ones, ones, offset=distance + 7)
        _, k_rot = rope(ones, ones, offset=7)
        want = float(np.sum(2 * np.cos(distance * theta) * zeta ** (distance / 16.0)))
        assert float((q_rot * k_rot).sum()) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_shifted_xpos_keys(backend: Backend) -> None:
    """rerotate moves xPos keys' decay with their angles (and to or from a RoPE without xPos)."""
    rope, plain = anyrope.RoPE(16, xpos_scale_base=32.0), anyrope.RoPE(16)
    k_np = _x((2, 2, 5, 16), 6)
    k = backend.asarray(k_np, "float32")
    _, cached = rope(k, k, offset=12)
    moved = anyrope.rerotate(cached, rope, rope, offset=12, shift=-9)
    assert_close(backend, moved, rope(k_np, k_np, offset=3)[1], "float32")
    assert_close(backend, anyrope.rerotate(cached, rope, plain, offset=12), plain(k_np, offset=12), "float32")


def test_refusals() -> None:
    rope = anyrope.RoPE(16, xpos_scale_base=512.0)
    x = np.ones((1, 1, 2, 16))
    assert rope.xpos_scale_base == 512.0
    assert repr(rope).endswith("xpos_scale_base=512.0)")
    with pytest.raises(ValueError, match=r"scales q and k oppositely: call rope\(q, k\)"):
        rope(x)
    with pytest.raises(ValueError, match="one pair of cos and sin cannot give"):
        rope.cos_sin(np.arange(2), like=x)
    with pytest.raises(ValueError, match="xpos_scale_base=0 must be a positive finite number"):
        anyrope.RoPE(16, xpos_scale_base=0)
    with pytest.raises(ValueError, match="does not combine with mrope_section, axial or pair_streams"):
        anyrope.RoPE(16, xpos_scale_base=512.0, mrope_section=[4, 2, 2])
