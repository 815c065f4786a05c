"""``RoPE(..., frequency_scale=...)``: per-frequency multipliers after the scaling method
(Mistral Large 4's ``exp(alpha)``), on every path that reads the frequencies: cached and formed
tables, traced calls, frequencies chosen on the device, and the exact angles far out."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

import oracle
from harness import Backend, assert_close

LAYOUTS = ["half", "interleaved"]
SCALE = (1.0, 0.5, 2.0, 1.25, 0.75, 3.0, 1.0, 0.1)  # eight pairs: head_dim 16


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


def test_inv_freq_is_the_methods_times_the_scale() -> None:
    """After the method (YaRN here), one float64 product each; reported, shown and kept by
    at_length; with_frequency_scale replaces it and None removes it."""
    yarn = sc.YaRN(4.0, 32)
    plain = anyrope.RoPE(16, scaling=yarn)
    rope = anyrope.RoPE(16, scaling=yarn, frequency_scale=np.asarray(SCALE))
    assert rope.inv_freq == tuple(f * s for f, s in zip(plain.inv_freq, SCALE, strict=True))
    assert rope.attention_scaling == plain.attention_scaling
    assert rope.frequency_scale == SCALE
    assert plain.frequency_scale is None
    assert repr(rope).endswith(f"frequency_scale={list(SCALE)!r})")
    assert rope.at_length(64).inv_freq == rope.inv_freq
    assert plain.with_frequency_scale(list(SCALE)).inv_freq == rope.inv_freq
    assert rope.with_frequency_scale(None).inv_freq == plain.inv_freq


def test_length_dependent_frequencies_carry_the_scale() -> None:
    for method in (
        sc.DynamicNTK(2.0, 8),
        sc.LongRoPE([1.0] * 8, [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], 8),
    ):
        plain = anyrope.RoPE(16, scaling=method)
        rope = anyrope.RoPE(16, scaling=method, frequency_scale=SCALE)
        for length in (4, 8, 9, 100):
            want = tuple(f * s for f, s in zip(plain.inv_freq_at(length), SCALE, strict=True))
            assert rope.inv_freq_at(length) == want


@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_oracle(backend: Backend, mode: str, dtype: str, layout: str) -> None:
    rope = anyrope.RoPE(16, layout=layout, base=500.0, frequency_scale=SCALE)
    data = _x((2, 3, 6, 16), 1)
    positions = np.array([[0, 1, 2, 3, 900, 5], [9, -8, 70_000, 6, 5, 4]])
    out = backend.compile(lambda x, p: rope(x, positions=p), mode)(
        backend.asarray(data, dtype), backend.asarray(positions)
    )
    frequencies = oracle.inv_freq(16, 500.0) * np.asarray(SCALE)
    want = oracle.rotate(_rounded(backend, data, dtype), positions, layout=layout, frequencies=frequencies)
    assert_close(backend, out, want, dtype)
    # host-known offsets read cached prefix rows: the same scaled frequencies
    by_offset = rope(backend.asarray(data, dtype), offset=3)
    want = oracle.rotate(
        _rounded(backend, data, dtype), np.arange(3, 9), layout=layout, frequencies=frequencies
    )
    assert_close(backend, by_offset, want, dtype)


@pytest.mark.parametrize(
    "method",
    [sc.DynamicNTK(2.0, 4), sc.LongRoPE([1.0, 2.0, 2.5, 3.0], [3.0, 4.0, 5.0, 6.0], 4)],
    ids=["dynamic", "longrope"],
)
def test_frequencies_chosen_on_the_device(backend: Backend, mode: str, method: sc.Scaling) -> None:
    """Positions as arrays (compiled: never read): the frequencies of max(positions) + 1, scaled,
    picked on the device, on both sides of the original length."""
    scale = (2.0, 0.5, 1.5, 0.25)
    rope = anyrope.RoPE(8, scaling=method, frequency_scale=scale)
    data = _x((1, 2, 5, 8), 2)
    call = backend.compile(lambda x, p: rope(x, positions=p), mode)
    for positions in (np.array([0, 1, 2, 3, 1]), np.array([0, 1, 2, 3, 40])):
        got = call(backend.asarray(data, "float32"), backend.asarray(positions))
        length = int(positions.max()) + 1
        frequencies = np.asarray(anyrope.RoPE(8, scaling=method).inv_freq_at(length)) * np.asarray(scale)
        want = oracle.rotate(
            _rounded(backend, data, "float32"),
            positions,
            frequencies=frequencies,
            scale=rope.attention_scaling if length <= 4 else _long_factor(rope, length),
        )
        assert_close(backend, got, want, "float32")


def _long_factor(rope: anyrope.RoPE, length: int) -> float:
    from anyrope._rope import rotary_of

    return rotary_of(rope).spectrum.at(length).scale


@pytest.mark.dtypes("float32", "float64")
def test_exact_far_out(backend: Backend, dtype: str) -> None:
    """The promise holds with a scale: tables within 1e-6 of the exact ``p * inv_freq`` (the
    scaled float64 frequencies, reduced in 80-digit arithmetic) up to 2**31."""
    scale = (1.0 + 2.0**-30, 0.3, 7.0, np.exp(0.01))
    rope = anyrope.RoPE(8, frequency_scale=scale)
    positions = np.array([0, 1, 65_537, 2_000_000, 2**31 - 1, -(2**31)])
    cos, sin = rope.cos_sin(
        backend.asarray(positions.astype(backend.index)), like=backend.asarray(np.zeros(1), dtype)
    )
    want_cos, want_sin = oracle.exact_cos_sin(positions, np.asarray(rope.inv_freq))
    error = max(
        np.max(np.abs(backend.to_numpy(cos) - want_cos)), np.max(np.abs(backend.to_numpy(sin) - want_sin))
    )
    assert error <= 1e-6, f"max error {error:.3g}"


def test_indexed_by_frequency_with_axial_rope(backend: Backend) -> None:
    """The scale follows the frequency index: an axial RoPE's pair j turns by the scaled
    inv_freq[pair_frequencies[j]] (here every axis at the same positions)."""
    scale = (1.0, 2.0, 3.0, 4.0)
    rope = anyrope.RoPE(8, axial=2, axial_frequencies="alternating", frequency_scale=scale)
    assert rope.pair_frequencies == (0, 2, 1, 3)
    positions = np.arange(5)
    both = backend.asarray(np.stack([positions, positions]))
    cos, sin = rope.cos_sin(both, like=backend.asarray(np.zeros(1), "float32"))
    theta = oracle.inv_freq(8) * np.asarray(scale)
    angles = positions[:, None] * theta[list(rope.pair_frequencies)]
    np.testing.assert_allclose(backend.to_numpy(cos), np.cos(angles), rtol=0, atol=1e-6)
    np.testing.assert_allclose(backend.to_numpy(sin), np.sin(angles), rtol=0, atol=1e-6)


def test_a_tensor_that_requires_grad() -> None:
    """A learned weight (Mistral Large 4's alpha is a float32 Parameter) is read once, as floats."""
    torch = pytest.importorskip("torch")
    alpha = torch.nn.Parameter(torch.tensor([0.0, 0.5, -0.5, 1.0]))
    rope = anyrope.RoPE(8, frequency_scale=alpha.exp())
    want = tuple(float(v) for v in alpha.detach().exp())
    assert rope.frequency_scale == want


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ([1.0, 2.0], ValueError, r"frequency_scale has 2 entries; it needs 4.*rotary_dim // 2 = 4"),
        ([1.0] * 5, ValueError, r"frequency_scale has 5 entries; it needs 4"),
        (np.ones((2, 2)), ValueError, r"frequency_scale must be 1-D.*shape \(2, 2\)"),
        (
            np.ones(4, dtype=np.int64),
            TypeError,
            r"frequency_scale must have a real floating dtype, not int64",
        ),
        (np.ones(4, dtype=bool), TypeError, r"frequency_scale must have a real floating dtype, not bool"),
        (np.ones(4, dtype=np.complex64), TypeError, r"frequency_scale must have a real floating dtype"),
        (
            [1.0, 0.0, 1.0, 1.0],
            ValueError,
            r"frequency_scale\[1\] is 0.0; frequency_scale must hold positive",
        ),
        ([1.0, 1.0, -2.0, 1.0], ValueError, r"frequency_scale\[2\] is -2.0"),
        ([1.0, 1.0, 1.0, float("nan")], ValueError, r"frequency_scale\[3\] is nan"),
        (np.array([1.0, np.inf, 1.0, 1.0]), ValueError, r"frequency_scale\[1\] is inf"),
        ([1.0, True, 1.0, 1.0], TypeError, r"frequency_scale\[1\] is True"),
        ("1234", TypeError, r"frequency_scale must be a list of numbers"),
        (1.5, TypeError, r"frequency_scale must be a list of numbers"),
    ],
)
def test_bad_frequency_scale(bad: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE(8, frequency_scale=bad)
    with pytest.raises(error, match=match):
        anyrope.RoPE(8).with_frequency_scale(bad)


def test_a_torch_integer_tensor_is_refused() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="frequency_scale must have a real floating dtype, not int64"):
        anyrope.RoPE(8, frequency_scale=torch.ones(4, dtype=torch.int64))


def test_scaled_frequencies_past_float_range() -> None:
    with pytest.raises(ValueError, match="frequency_scale gives frequencies"):
        anyrope.RoPE(4, scaling=sc.Linear(0.5), frequency_scale=[1e308, 1.0])  # 2 rad * 1e308


def test_layer_config_round_trip() -> None:
    """The layers' stored config (Keras's get_config, JSON) keeps the scale."""
    import json

    from anyrope.layers._build import rope_config, rope_from_config

    rope = anyrope.RoPE(16, rotary_dim=8, frequency_scale=SCALE[:4])
    again = rope_from_config(json.loads(json.dumps(rope_config(rope))))
    assert again.frequency_scale == rope.frequency_scale
    assert repr(again) == repr(rope)
