"""anyrope.analysis: per-pair wavelengths, wrap-around and decay, checked against direct formulas."""

from __future__ import annotations

import ast
import doctest
import itertools
import math
import random
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest

import anyrope
from anyrope import analysis

from oracle import inv_freq


def numpy_decay(thetas: np.ndarray, m: int) -> float:
    """(1/h) sum_j |S_j| with every S_j summed from scratch: O(h^2)."""
    h = len(thetas)
    terms = np.exp(1j * m * thetas)
    mask = np.tril(np.ones((h, h)))  # row j - 1 keeps k = 0 .. j - 1
    return float(np.abs(mask @ terms).sum() / h)


class RopeLike:
    """The least an object needs to be analysed: inv_freq, optionally layout and the rest."""

    def __init__(
        self,
        inv_freq: tuple[float, ...],
        layout: str = "half",
        head_dim: int | None = None,
        attention_scaling: float | None = None,
    ) -> None:
        self.inv_freq = inv_freq
        self.layout = layout
        if head_dim is not None:
            self.head_dim = head_dim
        if attention_scaling is not None:
            self.attention_scaling = attention_scaling


# -- the seed paper's numbers -------------------------------------------------------------------


def test_seed_paper_angle_differences() -> None:
    assert analysis.angle_difference(6, 1.0) == 6.0
    assert round(analysis.angle_difference(7, 1.0), 4) == 0.7168
    assert analysis.angle_difference(7, 1.0) == pytest.approx(7 - 2 * math.pi, abs=1e-15)


def test_seed_paper_wrap_distances() -> None:
    assert analysis.wrap_distance([1.0]) == [4]
    assert analysis.wrap_distance([1.0], limit=2 * math.pi) == [7]
    # The raw angle grows up to distance 6 and drops at 7, where wrap_distance says it wraps.
    angles = [analysis.angle_difference(d, 1.0) for d in range(1, 8)]
    assert all(a < b for a, b in itertools.pairwise(angles[:-1]))
    assert angles[-1] < angles[-2]


def test_angle_difference_range_and_sign() -> None:
    assert analysis.angle_difference(0, 1.0) == 0.0
    assert analysis.angle_difference(-1, 1.0) == pytest.approx(2 * math.pi - 1)
    assert analysis.angle_difference(100, 0.0) == 0.0
    rng = random.Random(3)
    for _ in range(200):
        d, theta = rng.randint(-(10**6), 10**6), rng.uniform(0, 3)
        angle = analysis.angle_difference(d, theta)
        assert 0.0 <= angle < 2 * math.pi
        assert math.cos(angle) == pytest.approx(math.cos(d * theta), abs=1e-9)
    assert 0.0 <= analysis.angle_difference(-1, 1e-300) < 2 * math.pi  # would round up to 2 pi


# -- wavelengths and rotations ------------------------------------------------------------------


def test_wavelengths_and_rotations_match_numpy() -> None:
    rope = anyrope.RoPE(128)
    thetas = inv_freq(128)
    np.testing.assert_allclose(analysis.wavelengths(rope), 2 * np.pi / thetas, rtol=1e-13)
    np.testing.assert_allclose(analysis.rotations(rope, 4096), 4096 * thetas / (2 * np.pi), rtol=1e-13)
    assert analysis.rotations(rope, 0) == [0.0] * 64
    partial = anyrope.RoPE(128, rotary_dim=32, base=500000.0)
    np.testing.assert_allclose(analysis.wavelengths(partial), 2 * np.pi / inv_freq(32, 500000.0), rtol=1e-13)


@pytest.mark.parametrize("frequencies", [[1.0, 0.5], (1.0, 0.5), np.array([1.0, 0.5]), RopeLike((1.0, 0.5))])
def test_accepts_sequences_and_rope_like_objects(frequencies: object) -> None:
    assert analysis.wavelengths(frequencies) == [2 * math.pi, 4 * math.pi]  # type: ignore[arg-type]
    assert analysis.wrap_distance(frequencies) == [4, 7]  # type: ignore[arg-type]
    assert analysis.monotonic_up_to(frequencies) == 3  # type: ignore[arg-type]


def test_zero_frequency_never_turns() -> None:
    assert analysis.wavelengths([0.0, 1.0]) == [math.inf, 2 * math.pi]
    assert analysis.rotations([0.0], 10**9) == [0.0]
    assert analysis.wrap_distance([0.0], limit=0.0) == [math.inf]
    assert analysis.wrap_distance([0.0, 1.0]) == [math.inf, 4]
    assert analysis.monotonic_up_to([0.0, 0.0]) == math.inf
    assert analysis.monotonic_up_to([]) == math.inf
    assert analysis.decay_bound([0.0, 0.0], [0, 5, 1000]) == [1.5, 1.5, 1.5]


@pytest.mark.parametrize("bad", [[-1.0], [math.nan], [math.inf], "abc", 3.0])
def test_rejects_bad_frequencies(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        analysis.wavelengths(bad)  # type: ignore[arg-type]


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="context"):
        analysis.rotations([1.0], -1)
    with pytest.raises(ValueError, match="limit"):
        analysis.wrap_distance([1.0], limit=math.inf)
    with pytest.raises(ValueError, match="at least one pair"):
        analysis.decay_bound([], [0])
    with pytest.raises(ValueError, match="max_distance"):
        analysis.check_requirements(anyrope.RoPE(8), max_distance=0)
    with pytest.raises(ValueError, match="samples"):
        analysis.check_requirements(anyrope.RoPE(8), samples=0)


# -- wrap distance ------------------------------------------------------------------------------


def test_exact_boundary_does_not_pass() -> None:
    assert 4 * (math.pi / 4) == math.pi
    assert analysis.wrap_distance([math.pi / 4]) == [5]
    assert analysis.wrap_distance([math.pi / 2], limit=2 * math.pi) == [5]
    assert analysis.wrap_distance([0.5], limit=2.0) == [5]
    assert analysis.wrap_distance([1.0, 0.25], limit=0.0) == [1, 1]


def test_wrap_distance_matches_brute_force() -> None:
    rng = random.Random(0)
    thetas = [rng.uniform(0.01, 4.0) for _ in range(300)] + [0.1, 0.3, 0.7, 1 / 3, math.pi / 3]
    for limit in (math.pi, 2 * math.pi, 0.3, 1.0):
        got = analysis.wrap_distance(thetas, limit)
        for theta, d in zip(thetas, got, strict=True):
            expected = next(n for n in range(1, 10**4) if n * theta > limit)
            assert d == expected, (theta, limit)


def test_monotonic_up_to_matches_wrap_distance() -> None:
    for rope in (anyrope.RoPE(128), anyrope.RoPE(64, base=1e6, rotary_dim=16), RopeLike((0.01, 0.002))):
        distance = analysis.monotonic_up_to(rope)
        assert distance == min(analysis.wrap_distance(rope)) - 1
        thetas = np.asarray(rope.inv_freq)
        assert np.all(distance * thetas <= np.pi)
        assert np.any((distance + 1) * thetas > np.pi)
    assert analysis.monotonic_up_to(anyrope.RoPE(64)) == 3
    slow = RopeLike((0.01, 0.002))
    assert analysis.monotonic_up_to(slow) == 314
    assert analysis.monotonic_up_to(slow, limit=2 * math.pi) == 628


def test_wrap_distance_follows_angle_difference() -> None:
    """Below the wrap distance for 2 pi the raw angle keeps growing; at it, it drops."""
    for theta in (1.0, 0.3, 2.5, 0.05):
        d = analysis.wrap_distance([theta], limit=2 * math.pi)[0]
        assert isinstance(d, int)
        angles = [analysis.angle_difference(n, theta) for n in range(d + 1)]
        assert angles == [*sorted(angles[:-1]), angles[-1]]
        assert angles[-1] < angles[-2]


# -- decay bound --------------------------------------------------------------------------------


@pytest.mark.parametrize("rotary_dim", [2, 16, 64, 128])
def test_decay_bound_matches_direct_sum(rotary_dim: int) -> None:
    rope = anyrope.RoPE(128, rotary_dim=rotary_dim)
    distances = [0, 1, 2, 5, 17, 100, 1000, 12345, -3]
    got = analysis.decay_bound(rope, distances)
    thetas = inv_freq(rotary_dim)
    want = [numpy_decay(thetas, m) for m in distances]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("frequencies", "pairs"), [(anyrope.RoPE(128), 64), (anyrope.RoPE(64, rotary_dim=6), 3), ([0.3] * 5, 5)]
)
def test_decay_bound_at_zero(frequencies: analysis.Frequencies, pairs: int) -> None:
    assert analysis.decay_bound(frequencies, [0]) == [(pairs + 1) / 2]


def test_decay_bound_decays_on_average_but_not_monotonically() -> None:
    curve = analysis.decay_bound(anyrope.RoPE(128), range(1025))
    assert curve[0] == 32.5
    means = [sum(curve[a:b]) / (b - a) for a, b in ((1, 64), (64, 256), (256, 512), (512, 1025))]
    assert curve[0] > means[0] > means[1] > means[2] > means[3]
    assert max(curve[512:]) < curve[0] / 2
    assert any(b > a for a, b in itertools.pairwise(curve))


def test_decay_bound_is_fast() -> None:
    import time

    start = time.perf_counter()
    analysis.decay_bound(anyrope.RoPE(128), range(4000))
    assert time.perf_counter() - start < 1.0


# -- the three requirements ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "rope",
    [anyrope.RoPE(64), anyrope.RoPE(64, layout="interleaved", rotary_dim=32)],
    ids=["half", "interleaved-partial"],
)
def test_check_requirements_on_rope(rope: anyrope.RoPE) -> None:
    result = analysis.check_requirements(rope)
    assert result.self_product_error < 1e-9
    assert result.relative_error < 1e-9
    assert result.decays is True
    assert len(result.decay) == 65
    assert result.decay[0] == (len(rope.inv_freq) + 1) / 2
    assert result.wraps_at == 4
    assert result == analysis.check_requirements(rope)  # deterministic
    with pytest.raises(FrozenInstanceError):
        result.decays = False  # type: ignore[misc]


def test_check_requirements_on_rope_like_objects() -> None:
    single = analysis.check_requirements(RopeLike((1.0,)), max_distance=10)
    assert single.self_product_error < 1e-12
    assert single.relative_error < 1e-12
    assert single.decay == [1.0] * 11  # one pair: |S_1| = 1 at every distance
    assert single.decays is False
    assert single.wraps_at == 4
    scaled = RopeLike((1.0, 0.1), layout="gptj", head_dim=6, attention_scaling=0.5)
    result = analysis.check_requirements(scaled, samples=4, seed=7)
    assert result.self_product_error < 1e-12
    assert result.relative_error < 1e-12
    assert analysis.check_requirements(RopeLike((0.0,))).wraps_at == math.inf


@pytest.mark.parametrize(("layout", "rotary_dim"), [("half", None), ("interleaved", None), ("half", 6)])
def test_pure_python_rotation_matches_rope(layout: str, rotary_dim: int | None) -> None:
    """The helper check_requirements rotates with agrees with anyrope.RoPE itself."""
    rope = anyrope.RoPE(10, layout=layout, rotary_dim=rotary_dim)
    x = np.random.default_rng(2).standard_normal((4, 10))
    rotated = rope(x)
    half = len(rope.inv_freq)
    if rope.layout == "half":
        pairs = [(i, i + half) for i in range(half)]
    else:
        pairs = [(2 * i, 2 * i + 1) for i in range(half)]
    for position in range(4):
        mine = analysis._rotate(list(x[position]), position, rope.inv_freq, pairs, 1.0)
        np.testing.assert_allclose(mine, rotated[position], rtol=1e-13, atol=1e-14)


def test_module_imports_no_array_library() -> None:
    tree = ast.parse(Path(analysis.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {
        "__future__",
        "cmath",
        "math",
        "random",
        "collections.abc",
        "dataclasses",
        "typing",
        "_args",
        "_layout",
    }


def test_docstring_examples() -> None:
    result = doctest.testmod(analysis, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
