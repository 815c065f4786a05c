"""Per-pair analyses of RoPE frequencies, in pure Python, for plots and sanity checks.

RoPE splits each head into pairs of features and turns pair ``i`` by ``theta_i`` radians per
position. Two tokens ``d`` positions apart therefore meet, in pair ``i``, at a relative angle of
``d * theta_i``. Everything here is a way of looking at those angles; every function takes the
frequencies either as a :class:`anyrope.RoPE` (its ``inv_freq`` is used) or as a plain sequence of
radians per position, one per pair, and returns Python floats and lists. No array library is
imported, so the results can go straight into any plotting tool.

Wavelength and rotations
    Pair ``i`` comes back to where it started every ``2 * pi / theta_i`` positions: its
    wavelength (:func:`wavelengths`). Fast pairs have wavelengths of a few tokens, slow ones
    longer than any context. :func:`rotations` counts how many full turns each pair makes over a
    context; pairs with less than one turn never see an angle twice, which is what long-context
    scaling methods look at when they decide which pairs to stretch.

Wrap-around
    The relative angle is only meaningful modulo ``2 * pi``. He and Xu ("A Simple Derivation of
    Rotary Position Encoding for Large Language Models", 2023) point out that with
    ``theta = 1`` the angle between tokens 6 apart is 6 rad, while tokens 7 apart are only
    0.7168 rad apart once it is reduced modulo ``2 * pi``
    (:func:`angle_difference`): farther tokens can look closer. What attention sees is the
    cosine of the angle, which already stops growing past ``pi``; :func:`wrap_distance` gives,
    per pair, the first distance whose angle passes a limit (``pi`` by default, ``2 * pi`` for
    He and Xu's wrap), and :func:`monotonic_up_to` the longest distance over which every
    pair's angle is still increasing towards that limit.

Long-term decay
    RoFormer (Su et al., 2021) bounds ``|q^T R_{n-m} k|`` by
    ``max_j |h_{j+1} - h_j| * sum_j |S_j|`` with ``S_j = sum_{k<j} exp(i * m * theta_k)``
    (Abel summation over the pairs), and plots ``(1 / h) * sum_{j=1}^{h} |S_j|`` against the
    relative distance ``m``. :func:`decay_bound` computes that curve. It falls on average as
    the distance grows, but not monotonically: it oscillates on the way down.

:func:`check_requirements` puts these together with numerical checks of the three requirements
He and Xu ask of a position encoding: (c1) a token's inner product with itself does not
depend on its position, (c2) the inner product of two tokens depends only on their relative
position, and (c3) farther tokens influence each other less.
"""

from __future__ import annotations

import cmath
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from ._args import check_int
from ._layout import normalize_layout

__all__ = [
    "Frequencies",
    "HasInvFreq",
    "Requirements",
    "angle_difference",
    "check_requirements",
    "decay_bound",
    "monotonic_up_to",
    "rotations",
    "wavelengths",
    "wrap_distance",
]


class HasInvFreq(Protocol):
    """Anything with an ``inv_freq`` attribute, such as :class:`anyrope.RoPE`."""

    @property
    def inv_freq(self) -> Sequence[float]:
        """Radians per position, one per rotated pair."""
        ...


#: A :class:`anyrope.RoPE` (or anything with ``inv_freq``) or the frequencies themselves.
Frequencies: TypeAlias = HasInvFreq | Sequence[float]


def _thetas(frequencies: Frequencies) -> list[float]:
    """The frequencies as a list of finite, non-negative Python floats."""
    values: object = getattr(frequencies, "inv_freq", frequencies)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(
            "frequencies must be a RoPE (or an object with inv_freq) or a sequence of floats, not "
            f"{type(frequencies).__name__}"
        )
    thetas = [float(t) for t in values]
    for i, t in enumerate(thetas):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"frequency {i} is {t!r}; frequencies must be finite and non-negative")
    return thetas


def _check_limit(limit: float) -> float:
    limit = float(limit)
    if not math.isfinite(limit) or limit < 0:
        raise ValueError(f"limit={limit!r} must be a finite, non-negative angle in radians")
    return limit


def wavelengths(frequencies: Frequencies) -> list[float]:
    """The number of positions each pair takes for one full turn: ``2 * pi / theta``.

    Parameters
    ----------
    frequencies : RoPE or sequence of float
        A :class:`anyrope.RoPE` or the radians per position of each pair.

    Returns
    -------
    list of float
        One wavelength per pair; ``math.inf`` for a pair with frequency 0, which never turns.

    Examples
    --------
    >>> import math
    >>> wavelengths([1.0, 0.0]) == [2 * math.pi, math.inf]
    True
    >>> import anyrope
    >>> [round(w, 2) for w in wavelengths(anyrope.RoPE(8))]
    [6.28, 62.83, 628.32, 6283.19]
    """
    return [math.tau / t if t > 0 else math.inf for t in _thetas(frequencies)]


def rotations(frequencies: Frequencies, context: int) -> list[float]:
    """Full turns each pair makes over ``context`` positions: ``context * theta / (2 * pi)``.

    Parameters
    ----------
    frequencies : RoPE or sequence of float
        A :class:`anyrope.RoPE` or the radians per position of each pair.
    context : int
        The number of positions, non-negative.

    Returns
    -------
    list of float
        One count per pair (fractional); below 1 the pair never completes a turn.

    Examples
    --------
    >>> import math
    >>> rotations([math.pi, 0.0], 10)
    [5.0, 0.0]
    >>> import anyrope
    >>> [round(r, 2) for r in rotations(anyrope.RoPE(8), 4096)]
    [651.9, 65.19, 6.52, 0.65]
    """
    context = check_int(context, "context", low=0)
    return [context * t / math.tau for t in _thetas(frequencies)]


def angle_difference(distance: int, theta: float) -> float:
    """The angle between two tokens ``distance`` apart in one pair: ``(distance * theta) mod 2 pi``.

    Parameters
    ----------
    distance : int
        The relative position of the two tokens (negative values are reduced the same way).
    theta : float
        The pair's radians per position.

    Returns
    -------
    float
        The relative angle, in ``[0, 2 * pi)``.

    Examples
    --------
    He and Xu's example, with ``theta = 1``: 6 positions apart the angle is 6 rad, one
    position more and it has wrapped around to 0.7168 rad.

    >>> angle_difference(6, 1.0)
    6.0
    >>> round(angle_difference(7, 1.0), 4)
    0.7168
    """
    theta = float(theta)
    if not math.isfinite(theta):
        raise ValueError(f"theta={theta!r} must be finite")
    angle = math.fmod(distance * theta, math.tau)  # exact, and keeps the sign of the product
    if angle < 0:
        angle += math.tau
        if angle >= math.tau:  # a tiny negative remainder rounds up to 2 pi
            angle = 0.0
    return angle


def _first_past(theta: float, limit: float) -> float:
    """The smallest integer d >= 1 whose float64 angle ``d * theta`` exceeds ``limit``."""
    if theta == 0:
        return math.inf
    estimate = limit / theta
    if not math.isfinite(estimate):
        return math.inf
    d = max(1, math.floor(estimate) + 1)
    # The division is rounded; settle the boundary on the product, as the tables compute it.
    while d > 1 and (d - 1) * theta > limit:
        d -= 1
    while not d * theta > limit:
        d += 1
    return d


def wrap_distance(frequencies: Frequencies, limit: float = math.pi) -> list[float]:
    """Per pair, the first distance whose angle passes ``limit``.

    That is the smallest integer ``d >= 1`` with ``d * theta > limit``. With the default
    ``limit = pi`` it is where the cosine of the angle, which is what attention sees, stops
    falling and starts rising again; with ``limit = 2 * pi`` it is where the angle itself wraps
    around, as in He and Xu's paper. An angle exactly equal to ``limit`` does not pass it. The
    product is the float64 one, as RoPE's tables form it.

    Parameters
    ----------
    frequencies : RoPE or sequence of float
        A :class:`anyrope.RoPE` or the radians per position of each pair.
    limit : float
        The angle in radians, finite and non-negative.

    Returns
    -------
    list of float
        One distance per pair, an ``int``, or ``math.inf`` for a pair with frequency 0.

    Examples
    --------
    >>> import math
    >>> wrap_distance([1.0, 0.0])
    [4, inf]
    >>> wrap_distance([1.0], limit=2 * math.pi)
    [7]
    >>> wrap_distance([math.pi / 4])  # 4 * theta equals pi exactly: not past it yet
    [5]
    """
    limit = _check_limit(limit)
    return [_first_past(t, limit) for t in _thetas(frequencies)]


def monotonic_up_to(frequencies: Frequencies, limit: float = math.pi) -> int | float:
    """The longest distance over which no pair's angle has passed ``limit``.

    The largest ``D`` with ``d * theta <= limit`` for every pair and every ``d <= D``: the
    smallest :func:`wrap_distance` minus one. Up to ``D`` (with the default ``limit = pi``) every
    pair's angle, and so the cosine attention sees, changes monotonically with distance.

    Parameters
    ----------
    frequencies : RoPE or sequence of float
        A :class:`anyrope.RoPE` or the radians per position of each pair.
    limit : float
        The angle in radians, finite and non-negative.

    Returns
    -------
    int or float
        ``D`` as an ``int``; ``math.inf`` when no pair ever passes ``limit`` (every frequency
        is 0, or there are no pairs).

    Examples
    --------
    >>> monotonic_up_to([1.0, 0.01])
    3
    >>> monotonic_up_to([0.0])
    inf
    >>> import anyrope
    >>> monotonic_up_to(anyrope.RoPE(64))  # the fastest pair turns 1 rad per position
    3
    """
    distances = wrap_distance(frequencies, limit)
    return min(distances, default=math.inf) - 1


def decay_bound(frequencies: Frequencies, distances: Sequence[int]) -> list[float]:
    """RoFormer's long-term decay bound as a function of relative distance.

    For each distance ``m``, with ``h`` pairs and ``S_j = sum_{k=0}^{j-1} exp(i * m * theta_k)``,
    the value is ``(1 / h) * sum_{j=1}^{h} |S_j|``. At ``m = 0`` every term is 1 and the value is
    ``(h + 1) / 2``. The partial sums follow the order of ``frequencies`` (for a RoPE, fastest
    pair first). Each distance costs O(h).

    Parameters
    ----------
    frequencies : RoPE or sequence of float
        A :class:`anyrope.RoPE` or the radians per position of each pair; at least one pair.
    distances : sequence of int
        The relative distances ``m``.

    Returns
    -------
    list of float
        One value per distance. The curve falls on average with distance, but not monotonically.

    Examples
    --------
    >>> decay_bound([1.0, 0.1, 0.01], [0])
    [2.0]
    >>> import anyrope
    >>> values = decay_bound(anyrope.RoPE(64), [0, 16, 256])
    >>> [round(v, 3) for v in values]
    [16.5, 7.65, 3.844]
    """
    thetas = _thetas(frequencies)
    if not thetas:
        raise ValueError("decay_bound needs at least one pair")
    h = len(thetas)
    rect = cmath.rect
    out = []
    for m in distances:
        partial = 0j
        total = 0.0
        for t in thetas:
            partial += rect(1.0, m * t)
            total += abs(partial)
        out.append(total / h)
    return out


@dataclass(frozen=True)
class Requirements:
    """Numerical checks of He and Xu's three requirements; see :func:`check_requirements`.

    Attributes
    ----------
    self_product_error : float
        (c1) The largest ``|<R_m q, R_m q> - expected|`` seen, where ``expected`` is ``<q, q>``
        with the rotated features' part multiplied by ``attention_scaling ** 2``.
    relative_error : float
        (c2) The largest ``|<R_m q, R_n k> - <R_{m+s} q, R_{n+s} k>|`` seen over sampled
        ``(m, n, s)``: shifting both positions leaves the score unchanged.
    decay : list of float
        (c3) :func:`decay_bound` at distances ``0 .. max_distance``.
    decays : bool
        (c3) Whether the bound at ``max_distance`` is below the bound at distance 0. RoPE's bound
        decays on average but not monotonically, so this is the reading checked.
    wraps_at : int or float
        The first distance at which some pair's angle passes ``pi``
        (``monotonic_up_to(rope) + 1``); ``math.inf`` if none ever does.
    """

    self_product_error: float
    relative_error: float
    decay: list[float]
    decays: bool
    wraps_at: int | float


def _rotate(
    x: Sequence[float],
    position: int,
    thetas: Sequence[float],
    pairs: Sequence[tuple[int, int]],
    scale: float,
) -> list[float]:
    """Rotate one head vector to ``position``: each pair (a, b) by ``position * theta``."""
    out = list(x)
    for (a, b), t in zip(pairs, thetas, strict=True):
        angle = position * t
        c, s = scale * math.cos(angle), scale * math.sin(angle)
        out[a] = x[a] * c - x[b] * s
        out[b] = x[a] * s + x[b] * c
    return out


def _dot(x: Sequence[float], y: Sequence[float]) -> float:
    return math.fsum(a * b for a, b in zip(x, y, strict=True))


def _unit_vector(rng: random.Random, size: int) -> list[float]:
    while True:
        v = [rng.gauss(0.0, 1.0) for _ in range(size)]
        norm = math.sqrt(_dot(v, v))
        if norm > 0:
            return [a / norm for a in v]


def check_requirements(
    rope: HasInvFreq, *, max_distance: int = 64, samples: int = 8, seed: int = 0
) -> Requirements:
    """Check He and Xu's requirements (c1), (c2) and (c3) numerically for ``rope``.

    ``samples`` pairs of random unit vectors q and k are drawn from ``random.Random(seed)``,
    each with random positions ``m`` and ``n`` in ``0 .. max_distance`` and a shift ``s`` in
    ``1 .. max_distance``, and rotated in pure Python following ``rope.inv_freq`` and
    ``rope.layout``. Features past ``2 * len(inv_freq)`` are left alone and the rotated ones
    carry ``rope.attention_scaling`` where the object has one. The result is deterministic.

    Parameters
    ----------
    rope : RoPE or RoPE-like
        Needs ``inv_freq``; ``layout`` (default "half"), ``head_dim`` (default
        ``2 * len(inv_freq)``) and ``attention_scaling`` (default 1.0) are used when present.
    max_distance : int
        The largest position and relative distance tried, at least 1.
    samples : int
        The number of random (q, k, m, n, s) draws, at least 1.
    seed : int
        The seed of the random draws.

    Returns
    -------
    Requirements
        Errors for (c1) and (c2) (float64 rounding for RoPE), the decay curve for (c3), and the
        distance where the first pair wraps past ``pi``.

    Examples
    --------
    >>> import anyrope
    >>> result = check_requirements(anyrope.RoPE(64))
    >>> result.self_product_error < 1e-12, result.relative_error < 1e-12
    (True, True)
    >>> result.decay[0], result.decays, result.wraps_at
    (16.5, True, 4)
    """
    max_distance = check_int(max_distance, "max_distance", low=1)
    samples = check_int(samples, "samples", low=1)
    thetas = _thetas(rope)
    if not thetas:
        raise ValueError("rope has no rotated pairs (inv_freq is empty)")
    half = len(thetas)
    rotary_dim = 2 * half
    head_dim = getattr(rope, "head_dim", rotary_dim)
    head_dim = check_int(head_dim, "head_dim", low=rotary_dim, why=" (2 * len(inv_freq))")
    layout = normalize_layout(getattr(rope, "layout", "half"))
    scale = float(getattr(rope, "attention_scaling", 1.0))
    if layout == "half":
        pairs = [(i, i + half) for i in range(half)]
    else:
        pairs = [(2 * i, 2 * i + 1) for i in range(half)]
    rotated = sorted(i for pair in pairs for i in pair)

    def expected_self(x: Sequence[float]) -> float:
        inside = math.fsum(x[i] * x[i] for i in rotated)
        return scale * scale * inside + math.fsum(a * a for a in x[rotary_dim:])

    rng = random.Random(seed)
    self_error = relative_error = 0.0
    for _ in range(samples):
        q, k = _unit_vector(rng, head_dim), _unit_vector(rng, head_dim)
        m, n = rng.randint(0, max_distance), rng.randint(0, max_distance)
        shift = rng.randint(1, max_distance)
        q_m = _rotate(q, m, thetas, pairs, scale)
        k_n = _rotate(k, n, thetas, pairs, scale)
        q_ms = _rotate(q, m + shift, thetas, pairs, scale)
        k_ns = _rotate(k, n + shift, thetas, pairs, scale)
        for x, rotations_of_x in ((q, (q_m, q_ms)), (k, (k_n, k_ns))):
            want = expected_self(x)
            for r in rotations_of_x:
                self_error = max(self_error, abs(_dot(r, r) - want))
        relative_error = max(relative_error, abs(_dot(q_m, k_n) - _dot(q_ms, k_ns)))
    decay = decay_bound(thetas, range(max_distance + 1))
    return Requirements(
        self_product_error=self_error,
        relative_error=relative_error,
        decay=decay,
        decays=decay[-1] < decay[0],
        wraps_at=monotonic_up_to(thetas) + 1,
    )
