"""Scaling methods against float64 formulas, on every backend; re-rotation; reading configs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

import oracle
import oracle_scaling as osc
from harness import Backend, assert_close, assert_same

SHORT = [1.0 + 0.01 * i for i in range(32)]
LONG = [1.0 + 0.5 * i for i in range(32)]

# (name, RoPE kwargs, seq_len under test, oracle (inv_freq, attention)) on head_dim 64, base 10000.
CASES: list[tuple[str, dict[str, Any], int | None, tuple[np.ndarray, float]]] = [
    ("plain", {}, None, (osc.plain(64, 1e4), 1.0)),
    ("linear", {"scaling": sc.Linear(4.0)}, None, osc.linear(64, 1e4, 4.0)),
    ("ntk", {"scaling": sc.NTKAware(8.0)}, None, osc.ntk(64, 1e4, 8.0)),
    ("dynamic-within", {"scaling": sc.DynamicNTK(2.0, 4096)}, 4000, osc.dynamic(64, 1e4, 2.0, 4096, 4000)),
    (
        "dynamic-beyond",
        {"scaling": sc.DynamicNTK(2.0, 4096)},
        10_000,
        osc.dynamic(64, 1e4, 2.0, 4096, 10_000),
    ),
    (
        "dynamic-mix",
        {"scaling": sc.DynamicNTK(2.0, 4096, alpha=0.5)},
        10_000,
        osc.dynamic(64, 1e4, 2.0, 4096, 10_000, alpha=0.5),
    ),
    ("yarn", {"scaling": sc.YaRN(4.0, 4096)}, None, osc.yarn(64, 1e4, 4.0, 4096)),
    (
        "yarn-no-truncate",
        {"scaling": sc.YaRN(32.0, 4096, truncate=False)},
        None,
        osc.yarn(64, 1e4, 32.0, 4096, truncate=False),
    ),
    (
        "yarn-mscale",
        {"scaling": sc.YaRN(40.0, 4096, mscale=1.0, mscale_all_dim=0.5)},
        None,
        osc.yarn(64, 1e4, 40.0, 4096, mscale=1.0, mscale_all_dim=0.5),
    ),
    (
        "yarn-betas",
        {"scaling": sc.YaRN(8.0, 2048, beta_fast=16.0, beta_slow=2.0)},
        None,
        osc.yarn(64, 1e4, 8.0, 2048, beta_fast=16, beta_slow=2),
    ),
    (
        "llama3",
        {"scaling": sc.Llama3(8.0, 1.0, 4.0, 8192), "base": 5e5},
        None,
        osc.llama3(64, 5e5, 8.0, 1.0, 4.0, 8192),
    ),
    (
        "longrope-short",
        {"scaling": sc.LongRoPE(SHORT, LONG, 4096), "max_position": 131072},
        4096,
        osc.longrope(64, 1e4, SHORT, LONG, 4096, 4096, 131072),
    ),
    (
        "longrope-long",
        {"scaling": sc.LongRoPE(SHORT, LONG, 4096), "max_position": 131072},
        4097,
        osc.longrope(64, 1e4, SHORT, LONG, 4096, 4097, 131072),
    ),
    (
        "longrope-mscales-short",
        {"scaling": sc.LongRoPE(SHORT, LONG, 4096, attention_factor=1.1, long_attention_factor=1.3)},
        4096,
        osc.longrope(64, 1e4, SHORT, LONG, 4096, 4096, 4096, mscales=(1.1, 1.3)),
    ),
    (
        "longrope-mscales-long",
        {"scaling": sc.LongRoPE(SHORT, LONG, 4096, attention_factor=1.1, long_attention_factor=1.3)},
        4097,
        osc.longrope(64, 1e4, SHORT, LONG, 4096, 4097, 4096, mscales=(1.1, 1.3)),
    ),
    ("proportional", {"scaling": sc.Proportional(0.25)}, None, osc.proportional(64, 1e4, 0.25)),
    ("max-length-aware", {"scaling": sc.MaxLengthAware(2048)}, None, osc.max_length_aware(64, 1e4, 2048)),
]
IDS = [case[0] for case in CASES]


def _rope(kwargs: dict[str, Any], **extra: Any) -> anyrope.RoPE:
    return anyrope.RoPE(64, **{"base": 1e4, **kwargs, **extra})


@pytest.mark.parametrize(("name", "kwargs", "seq_len", "expected"), CASES, ids=IDS)
def test_frequencies_match_formula(
    name: str, kwargs: dict[str, Any], seq_len: int | None, expected: Any
) -> None:
    rope = _rope(kwargs)
    inv_freq = rope.inv_freq if seq_len is None else rope.inv_freq_at(seq_len)
    want, attention = expected
    np.testing.assert_allclose(inv_freq, want, rtol=1e-13, atol=0)
    at = rope if seq_len is None else rope.at_length(seq_len)
    assert at.attention_scaling == pytest.approx(attention, rel=1e-14)


def _tolerance(backend: Backend, rope: anyrope.RoPE, dtype: str, top: int, traced: bool) -> float | None:
    """None for the dtype's own tolerance; for DynamicNTK past its original length, with the length
    read on a device without float64, the documented float32 frequencies: |p| * theta * 2**-22."""
    scaling = rope.scaling
    on_device = traced or not backend.host_values
    if scaling is None or not scaling.continuous or "float64" in backend.dtypes or not on_device:
        return None
    return max(1e-6, top * max(rope.inv_freq) * 2.0**-22)


@pytest.mark.dtypes("float32", "float64")
@pytest.mark.parametrize(("name", "kwargs", "seq_len", "expected"), CASES, ids=IDS)
def test_scaled_rotation_matches_oracle(
    backend: Backend,
    mode: str,
    dtype: str,
    name: str,
    kwargs: dict[str, Any],
    seq_len: int | None,
    expected: Any,
) -> None:
    """Positions as a traced input: length-dependent methods choose their frequencies on the device."""
    rope = _rope(kwargs, layout="interleaved")
    want, attention = expected
    top = (seq_len or 300) - 1
    positions = np.array([0, 1, 7, 100, top // 2, top])
    x_np = np.random.default_rng(0).standard_normal((2, 6, 64))
    call = backend.compile(lambda x, p: rope(x, positions=p), mode)
    x = backend.asarray(x_np, dtype)
    out = call(x, backend.asarray(positions))
    expected_out = oracle.rotate(
        backend.to_numpy(x), positions, layout="interleaved", frequencies=want, scale=attention
    )
    tolerance = _tolerance(backend, rope, dtype, top, mode != "eager")
    if tolerance is None:
        assert_close(backend, out, expected_out, dtype)
    else:
        np.testing.assert_allclose(backend.to_numpy(out), expected_out, rtol=0, atol=tolerance * 4)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
@pytest.mark.parametrize("side", ["within", "beyond"])
def test_length_dependent_scaling_traced_equals_host_known(
    backend: Backend, mode: str, kind: str, side: str
) -> None:
    """On both sides of the threshold, the frequencies chosen on the device (traced positions)
    are those the host chooses from Python ints."""
    scaling = sc.DynamicNTK(2.0, 64) if kind == "dynamic" else sc.LongRoPE(SHORT[:8], LONG[:8], 64)
    rope = anyrope.RoPE(16, scaling=scaling, max_position=256)
    seq = 64 if side == "within" else 100
    x = backend.asarray(np.random.default_rng(7).standard_normal((2, 2, seq, 16)), "float32")
    offsets = np.array([0, 0])
    host = rope(x, offset=offsets.tolist())  # Python ints: the length is read on the host
    traced = backend.compile(lambda x, o: rope(x, offset=o), mode)(x, backend.asarray(offsets))
    tolerance = _tolerance(backend, rope, "float32", seq, True)
    if tolerance is None:
        assert_close(backend, traced, backend.to_numpy(host), "float32")
    else:
        np.testing.assert_allclose(
            backend.to_numpy(traced), backend.to_numpy(host), rtol=0, atol=tolerance * 4
        )
    plain = anyrope.RoPE(16, max_position=256)(x)
    changed = not np.allclose(backend.to_numpy(traced), backend.to_numpy(plain), rtol=0, atol=1e-4)
    assert changed == (side == "beyond" or kind == "longrope")  # LongRoPE's short factors differ too


def test_fixed_length_keeps_cached_keys_valid(backend: Backend, mode: str) -> None:
    """``at_length``: one set of frequencies whatever the positions, so keys cached early match."""
    rope = anyrope.RoPE(16, scaling=sc.DynamicNTK(2.0, 32)).at_length(128)
    assert not rope.scaling.length_dependent or rope.fixed_length == 128
    x = backend.asarray(np.random.default_rng(8).standard_normal((1, 1, 100, 16)), "float32")
    call = backend.compile(lambda x, o: rope(x, offset=o), mode)
    full = call(x, backend.asarray(np.array([0])))
    early = rope(x[:, :, :20, :])  # rotated when only 20 tokens existed
    np.testing.assert_allclose(
        backend.to_numpy(full)[:, :, :20, :], backend.to_numpy(early), rtol=0, atol=1e-6
    )
    want = oracle.rotate(backend.to_numpy(x), np.arange(100), frequencies=np.asarray(rope.inv_freq))
    assert_close(backend, full, want, "float32")
    assert repr(rope).endswith(".at_length(128)")


@pytest.mark.parametrize(("name", "kwargs", "seq_len", "expected"), CASES, ids=IDS)
def test_scaled_tables_within_1e6_up_to_two_million(
    backend: Backend, name: str, kwargs: dict[str, Any], seq_len: int | None, expected: Any
) -> None:
    rope = _rope(kwargs)
    positions = np.array([3, 65_537, 999_999, 1_999_999, 2_000_000])
    seq = 2_000_001
    if rope.scaling is not None and rope.scaling.length_dependent:
        expected = {  # the frequencies that hold at this length
            "dynamic-within": osc.dynamic(64, 1e4, 2.0, 4096, seq),
            "dynamic-beyond": osc.dynamic(64, 1e4, 2.0, 4096, seq),
            "dynamic-mix": osc.dynamic(64, 1e4, 2.0, 4096, seq, alpha=0.5),
            "longrope-short": osc.longrope(64, 1e4, SHORT, LONG, 4096, seq, 131072),
            "longrope-long": osc.longrope(64, 1e4, SHORT, LONG, 4096, seq, 131072),
            "longrope-mscales-short": osc.longrope(64, 1e4, SHORT, LONG, 4096, seq, 4096, (1.1, 1.3)),
            "longrope-mscales-long": osc.longrope(64, 1e4, SHORT, LONG, 4096, seq, 4096, (1.1, 1.3)),
        }[name]
    if _tolerance(backend, rope, "float32", seq, False) is not None:
        rope = rope.at_length(seq)  # the documented exact route where float64 is missing
    want, attention = expected
    cos, sin = rope.cos_sin(backend.asarray(positions), like=backend.asarray(np.zeros(1), "float32"))
    want_cos, want_sin = oracle.exact_cos_sin(positions, want)
    assert np.max(np.abs(backend.to_numpy(cos) - attention * want_cos)) <= 1e-6
    assert np.max(np.abs(backend.to_numpy(sin) - attention * want_sin)) <= 1e-6


def test_attention_factor_scales_rotated_norms(backend: Backend) -> None:
    rope = anyrope.RoPE(64, scaling=sc.YaRN(16.0, 4096))
    assert rope.attention_scaling == pytest.approx(0.1 * math.log(16.0) + 1)
    x_np = np.random.default_rng(1).standard_normal((3, 64))
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    x_np = backend.to_numpy(backend.asarray(x_np, dtype))
    out = backend.to_numpy(rope(backend.asarray(x_np, dtype), offset=50))
    np.testing.assert_allclose(
        np.linalg.norm(out, axis=-1), rope.attention_scaling * np.linalg.norm(x_np, axis=-1), rtol=1e-6
    )


def test_dynamic_ntk_only_changes_beyond_the_original_length(backend: Backend) -> None:
    plain = anyrope.RoPE(16)
    dynamic = anyrope.RoPE(16, scaling=sc.DynamicNTK(4.0, 64))
    x = backend.asarray(np.random.default_rng(2).standard_normal((1, 64, 16)), "float32")
    assert_same(backend, dynamic(x), plain(x), "float32")
    longer = backend.asarray(np.random.default_rng(2).standard_normal((1, 100, 16)), "float32")
    assert not np.allclose(backend.to_numpy(dynamic(longer)), backend.to_numpy(plain(longer)))
    # The offset path (cached rows) and explicit positions agree beyond the original length too.
    step = longer[:, 99:, :]
    assert_same(backend, dynamic(step, offset=99), dynamic(step, positions=[99]), "float32")


def test_longrope_switches_factors_past_the_original_length(backend: Backend) -> None:
    rope = anyrope.RoPE(64, scaling=sc.LongRoPE(SHORT, LONG, 32), max_position=128)
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    x = backend.asarray(np.random.default_rng(3).standard_normal((1, 40, 64)), dtype)
    short_out = backend.to_numpy(rope(x[:, :32, :]))
    long_out = backend.to_numpy(rope(x))
    short_f, attention = osc.longrope(64, 1e4, SHORT, LONG, 32, 32, 128)
    long_f, _ = osc.longrope(64, 1e4, SHORT, LONG, 32, 40, 128)
    x_np = backend.to_numpy(x)
    want_short = oracle.rotate(x_np[:, :32], np.arange(32), frequencies=short_f, scale=attention)
    assert_close(backend, rope(x[:, :32, :]), want_short, dtype)
    assert_close(
        backend, rope(x), oracle.rotate(x_np, np.arange(40), frequencies=long_f, scale=attention), dtype
    )
    assert not np.allclose(short_out, long_out[:, :32])


def test_proportional_zero_frequency_pairs_pass_through(backend: Backend) -> None:
    rope = anyrope.RoPE(16, scaling=sc.Proportional(0.5))
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    x_np = backend.to_numpy(backend.asarray(np.random.default_rng(4).standard_normal((5, 16)), dtype))
    out = backend.to_numpy(rope(backend.asarray(x_np, dtype), offset=1000))
    still = [4, 5, 6, 7, 12, 13, 14, 15]  # half layout: pairs (i, i + 8) for i >= 4 do not turn
    np.testing.assert_array_equal(out[:, still], x_np[:, still])
    assert not np.allclose(out[:, :4], x_np[:, :4])


def test_max_length_aware_never_wraps_before_max_position() -> None:
    rope = anyrope.RoPE(128, scaling=sc.MaxLengthAware(2048))
    assert anyrope.analysis.monotonic_up_to(rope) >= 2048
    assert max(rope.inv_freq) * 2048 == pytest.approx(math.pi)
    assert anyrope.analysis.monotonic_up_to(anyrope.RoPE(128)) < 2048  # plain RoPE wraps early
    # Only a common factor: the spectrum's shape is kept.
    ratios = np.array(rope.inv_freq) / np.array(anyrope.RoPE(128).inv_freq)
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)


def test_llama3_bands() -> None:
    rope = anyrope.RoPE(128, base=5e5, scaling=sc.Llama3(8.0, 1.0, 4.0, 8192))
    plain = np.array(anyrope.RoPE(128, base=5e5).inv_freq)
    got = np.array(rope.inv_freq)
    wavelength = 2 * np.pi / plain
    high = wavelength < 8192 / 4
    low = wavelength > 8192 / 1
    np.testing.assert_array_equal(got[high], plain[high])
    np.testing.assert_allclose(got[low], plain[low] / 8.0, rtol=1e-15)
    middle = ~high & ~low
    assert middle.any()
    assert np.all((got[middle] <= plain[middle]) & (got[middle] >= plain[middle] / 8.0))


def test_yarn_truncate_moves_the_ramp() -> None:
    on = np.array(anyrope.RoPE(64, base=150000.0, scaling=sc.YaRN(32.0, 4096)).inv_freq)
    off = np.array(anyrope.RoPE(64, base=150000.0, scaling=sc.YaRN(32.0, 4096, truncate=False)).inv_freq)
    assert not np.allclose(on, off)
    np.testing.assert_allclose(on[:2], off[:2])  # fastest pairs: extrapolated either way


# --- re-rotating cached keys ---------------------------------------------------------------


def test_rerotate_moves_dynamic_ntk_keys(backend: Backend) -> None:
    rope = anyrope.RoPE(32, scaling=sc.DynamicNTK(2.0, 16))
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    k = backend.asarray(np.random.default_rng(5).standard_normal((2, 3, 40, 32)), dtype)
    cached = rope(k[:, :, :20, :])  # rotated when the sequence was 20 long
    fresh = rope(k)[:, :, :20, :]  # what a 40-long sequence rotates them to
    assert not np.allclose(backend.to_numpy(cached), backend.to_numpy(fresh))  # the hazard
    moved = anyrope.rerotate(cached, rope, rope, old_length=20, new_length=40)
    assert_close(backend, moved, backend.to_numpy(fresh), dtype)
    # With the lengths left to the positions, read on the device: the keys' own length (20).
    same = anyrope.rerotate(cached, rope, rope, positions=backend.asarray(np.arange(20)))
    assert_close(backend, same, backend.to_numpy(cached), dtype)


def test_rerotate_between_configurations(backend: Backend) -> None:
    old = anyrope.RoPE(16, layout="meta")
    new = anyrope.RoPE(16, layout="meta", base=500000.0, scaling=sc.YaRN(4.0, 64))
    k_np = np.random.default_rng(6).standard_normal((3, 10, 16))
    k = backend.asarray(k_np, "float32")
    rows = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [90] * 10])
    moved = anyrope.rerotate(old(k, positions=rows.tolist()), old, new, positions=rows.tolist())
    assert_close(backend, moved, backend.to_numpy(new(k, positions=rows.tolist())), "float32")
    same = anyrope.rerotate(old(k, offset=3), old, old, offset=3)
    assert_close(backend, same, backend.to_numpy(old(k, offset=3)), "float32")


def test_rerotate_clockwise(backend: Backend) -> None:
    old = anyrope.RoPE(16, clockwise=True)
    new = anyrope.RoPE(16, base=500000.0, scaling=sc.Linear(2.0), clockwise=True)
    k = backend.asarray(np.random.default_rng(7).standard_normal((2, 5, 16)), "float32")
    moved = anyrope.rerotate(old(k, offset=40), old, new, offset=40)
    assert_close(backend, moved, backend.to_numpy(new(k, offset=40)), "float32")
    with pytest.raises(ValueError, match="old and new must share clockwise"):
        anyrope.rerotate(k, old, anyrope.RoPE(16))


def test_rerotate_rejects_mismatched_ropes(backend: Backend) -> None:
    k = backend.asarray(np.zeros((4, 16)), "float32")
    with pytest.raises(ValueError, match="old and new must share layout"):
        anyrope.rerotate(k, anyrope.RoPE(16), anyrope.RoPE(16, layout="meta"))
    with pytest.raises(ValueError, match="old and new must share rotary_dim"):
        anyrope.rerotate(k, anyrope.RoPE(16), anyrope.RoPE(16, rotary_dim=8))
    with pytest.raises(TypeError, match=r"new must be an anyrope\.RoPE"):
        anyrope.rerotate(k, anyrope.RoPE(16), "rope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per-row offset align with k's first axis"):
        anyrope.rerotate(k, anyrope.RoPE(16), anyrope.RoPE(16), offset=[1, 2])


# --- scaling configs: bad input ------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: sc.Linear(0.0), ValueError, "factor=0.0 must be a positive"),
        (
            lambda: sc.LongRoPE([1.0], [1.0], 16, long_attention_factor=-1.0),
            ValueError,
            "long_attention_factor=-1.0 must be a positive",
        ),
        (lambda: sc.YaRN(4.0, 0), ValueError, "original_max_position=0 must be a positive int"),
        (lambda: sc.YaRN(-1.0, 4096), ValueError, "factor=-1.0"),
        (lambda: sc.Llama3(8.0, 4.0, 1.0, 8192), ValueError, "high_freq_factor=1.0 must exceed"),
        (lambda: sc.LongRoPE([1.0, -2.0], [1.0, 1.0], 4096), ValueError, "short_factor must hold positive"),
        (lambda: sc.Proportional(1.5), ValueError, "fraction=1.5 must lie in"),
        (lambda: sc.DynamicNTK(2.0, 4096, alpha=0.0), ValueError, "alpha=0.0"),
        (
            lambda: anyrope.RoPE(8, scaling=sc.LongRoPE([1.0] * 3, [1.0] * 3, 16)),
            ValueError,
            "short_factor has 3 entries but rotary_dim=8 has 4 pairs",
        ),
        (lambda: anyrope.RoPE(2, scaling=sc.NTKAware(2.0)), ValueError, "NTK scaling needs rotary_dim > 2"),
        (lambda: anyrope.RoPE(8).inv_freq_at(-1), ValueError, "seq_len=-1"),
    ],
)
def test_scaling_rejects(make: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_scaling_configs_are_hashable_and_frozen() -> None:
    method = sc.LongRoPE([1.0, 2.0], [3.0, 4.0], 16)
    assert hash(method) == hash(sc.LongRoPE((1.0, 2.0), (3.0, 4.0), 16))
    with pytest.raises(AttributeError):
        method.original_max_position = 8  # type: ignore[misc]
