"""anyrope on MLX arrays against MLX's fused kernel, ``mlx.core.fast.rope``.

``mx.fast.rope(x, dims, traditional=..., base=..., scale=..., offset=...)`` rotates the first
``dims`` features of ``(..., seq, dim)`` arrays at positions ``scale * (offset + arange(seq))``;
``traditional=True`` pairs consecutive features (anyrope's "interleaved"), False pairs i with
i + dims / 2 (anyrope's "half"). ``scale`` multiplies positions, so ``scale = 1 / f`` is position
interpolation by f: anyrope's ``scaling.Linear(f)``. ``freqs=`` replaces ``base`` with per-pair
periods, ``1 / inv_freq`` (how mlx-lm runs Llama 3.1's scaled RoPE). MLX forms angles in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling

mx = pytest.importorskip("mlx.core")

F32_ULP = 2.0**-24
F16_ULP = 2.0**-11  # half an ulp of 1.0 in float16

LAYOUTS = [pytest.param(True, "interleaved", id="traditional"), pytest.param(False, "half", id="half")]
DIMS = [
    pytest.param(64, 64, id="full64"),
    pytest.param(128, 128, id="full128"),
    pytest.param(64, 32, id="partial"),
]
OFFSETS = [0, 17, 1000, 100_000]
SEQ = 32


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _np(a: Any) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def _tolerance(x: np.ndarray, positions: np.ndarray, rounding: float) -> np.ndarray:
    """Per position: MLX's float32 angle at position m is off by about m * theta * 2 * 2**-24 rad
    (theta <= 1), so its output by that times |x|; we allow twice that, plus ``rounding`` * |x| for
    rounding the result (a few float32 ulp, or an ulp or two of float16)."""
    largest = float(np.max(np.abs(x)))
    return (rounding + 4 * positions.astype(np.float64) * F32_ULP) * largest


def _assert_within(ours: Any, theirs: Any, tol: np.ndarray) -> None:
    diff = np.abs(_np(ours) - _np(theirs))
    excess = diff / tol[:, None]
    worst = np.unravel_index(excess.argmax(), excess.shape)
    assert excess.max() <= 1, (
        f"|anyrope - mx.fast.rope| = {diff[worst]:.3g} at {worst}, allowed {tol[worst[-2]]:.3g}"
    )


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize(("head_dim", "dims"), DIMS)
@pytest.mark.parametrize(("traditional", "layout"), LAYOUTS)
@pytest.mark.parametrize("base", [10000.0, 1000000.0])
def test_float32(base: float, traditional: bool, layout: str, head_dim: int, dims: int, offset: int) -> None:
    x_np = _x((2, 3, SEQ, head_dim))
    x = mx.array(x_np)
    rope = anyrope.RoPE(head_dim, base=base, rotary_dim=dims, layout=layout)
    ours = rope(x, offset=offset)
    theirs = mx.fast.rope(x, dims, traditional=traditional, base=base, scale=1.0, offset=offset)
    assert ours.dtype == theirs.dtype == mx.float32
    _assert_within(ours, theirs, _tolerance(x_np, offset + np.arange(SEQ), 2e-6))
    if dims < head_dim:  # the features past dims pass through bit-identical in both
        assert np.array_equal(np.array(ours[..., dims:]), x_np[..., dims:])
        assert np.array_equal(np.array(theirs[..., dims:]), x_np[..., dims:])


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize(("head_dim", "dims"), DIMS)
@pytest.mark.parametrize(("traditional", "layout"), LAYOUTS)
def test_float16(traditional: bool, layout: str, head_dim: int, dims: int, offset: int) -> None:
    x = mx.array(_x((2, 3, SEQ, head_dim))).astype(mx.float16)
    x_np = _np(x)
    rope = anyrope.RoPE(head_dim, rotary_dim=dims, layout=layout)
    ours = rope(x, offset=offset)
    theirs = mx.fast.rope(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=offset)
    assert ours.dtype == theirs.dtype == mx.float16
    # Both round a float32 result to float16: they may land an ulp apart (2 * F16_ULP * |x|).
    _assert_within(ours, theirs, _tolerance(x_np, offset + np.arange(SEQ), 4 * F16_ULP))


@pytest.mark.parametrize("scale", [0.25, 0.5])
@pytest.mark.parametrize(("traditional", "layout"), LAYOUTS)
def test_scale_is_position_interpolation(traditional: bool, layout: str, scale: float) -> None:
    """mx.fast.rope's scale multiplies positions: scale = 0.25 is anyrope's Linear(factor=4)."""
    x_np = _x((1, 2, SEQ, 64), seed=1)
    x = mx.array(x_np)
    rope = anyrope.RoPE(64, layout=layout, scaling=scaling.Linear(1 / scale))
    offset = 5000
    theirs = mx.fast.rope(x, 64, traditional=traditional, base=10000.0, scale=scale, offset=offset)
    _assert_within(rope(x, offset=offset), theirs, _tolerance(x_np, offset + np.arange(SEQ), 2e-6))


@pytest.mark.parametrize(("traditional", "layout"), LAYOUTS)
def test_offset_per_batch_row(traditional: bool, layout: str) -> None:
    """An array of offsets, one per batch row (a batch of sequences at different cache lengths)."""
    x_np = _x((3, 2, SEQ, 64), seed=2)
    x = mx.array(x_np)
    offsets = [0, 17, 3000]
    theirs = mx.fast.rope(x, 64, traditional=traditional, base=10000.0, scale=1.0, offset=mx.array(offsets))
    ours = anyrope.RoPE(64, layout=layout)(x, offset=offsets)
    tol = _tolerance(x_np, max(offsets) + np.arange(SEQ), 2e-6)
    _assert_within(ours, theirs, tol)


@pytest.mark.parametrize(("traditional", "layout"), LAYOUTS)
def test_llama3_frequencies(traditional: bool, layout: str) -> None:
    """Llama 3.1's scaled frequencies, passed to MLX as periods (freqs = 1 / inv_freq), as mlx-lm does."""
    rope = anyrope.RoPE(128, base=500000.0, layout=layout, scaling=scaling.Llama3(8.0, 1.0, 4.0, 8192))
    periods = mx.array(1 / np.asarray(rope.inv_freq), dtype=mx.float32)
    x_np = _x((1, 2, SEQ, 128), seed=3)
    x = mx.array(x_np)
    offset = 100_000
    theirs = mx.fast.rope(x, 128, traditional=traditional, base=None, scale=1.0, offset=offset, freqs=periods)
    _assert_within(rope(x, offset=offset), theirs, _tolerance(x_np, offset + np.arange(SEQ), 2e-6))
