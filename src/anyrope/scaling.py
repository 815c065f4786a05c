"""Long-context scaling: small frozen configurations that turn a base into per-pair frequencies.

Each method follows Hugging Face transformers' ``modeling_rope_utils`` exactly (formulas, defaults,
optional keys), but evaluates in float64 with Python's ``math`` rather than in float32, so its
frequencies are the exact values that transformers' float32 buffers round. Pass one as
``RoPE(..., scaling=...)``; ``RoPE.from_hf_config`` builds them from a model's config.

Every method answers :meth:`Scaling.frequencies` for a rotary width, a base, and (for the two
methods that change with the sequence) the current length ``max(positions) + 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ._args import check_bool, check_int, check_number, check_numbers, check_positive

__all__ = [
    "DynamicNTK",
    "Linear",
    "Llama3",
    "LongRoPE",
    "MaxLengthAware",
    "NTKAware",
    "Proportional",
    "Scaling",
    "YaRN",
]


def exponents(rotary_dim: int) -> tuple[float, ...]:
    """-2i / rotary_dim for each of the rotary_dim / 2 pairs: theta_i = base ** exponents[i]."""
    return tuple(-(2 * i) / rotary_dim for i in range(rotary_dim // 2))


def plain_frequencies(rotary_dim: int, base: float) -> tuple[float, ...]:
    """theta_i = base ** (-2i / rotary_dim) for each of the rotary_dim / 2 pairs: the one place
    the inverse-frequency formula is written."""
    return tuple(base**e for e in exponents(rotary_dim))


def _keep(method: Any, name: str, checked: Any) -> None:
    """Store a checked value where it differs in type from the one given (a NumPy scalar becomes a
    float or an int), so that equal methods compare, hash and print alike."""
    given = getattr(method, name)
    if type(given) is not type(checked) and not (type(given) is int and type(checked) is float):
        object.__setattr__(method, name, checked)


def _positive(method: Any, *names: str, optional: bool = False) -> None:
    """Check (and keep) positive finite numbers; ``optional``: None passes."""
    for name in names:
        if not (optional and getattr(method, name) is None):
            _keep(method, name, check_positive(getattr(method, name), name))


def _positions(method: Any, name: str) -> None:
    _keep(method, name, check_int(getattr(method, name), name, low=1, why=" (a number of positions)"))


@dataclass(frozen=True)
class Scaling:
    """Base class: plain RoPE frequencies and no attention factor.

    Subclasses override :meth:`frequencies`. ``length_dependent`` says whether the frequencies
    change with the sequence length; ``continuous`` whether they change at every length (so
    tables built for one length are not worth caching).
    """

    #: transformers' ``rope_type`` for this method, or None where transformers has none.
    hf_type: ClassVar[str | None] = "default"
    length_dependent: ClassVar[bool] = False
    continuous: ClassVar[bool] = False

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        """Per-pair radians per position, and the factor the cos/sin tables carry.

        Parameters
        ----------
        rotary_dim : int
            Rotated features per head (two per pair).
        base : float
            The frequency base.
        seq_len : int, optional
            The current sequence length, ``max(positions) + 1``; only length-dependent methods
            read it. None means "within the original context".
        max_position : int, optional
            The model's ``max_position_embeddings``, for defaults derived from it.
        """
        return plain_frequencies(rotary_dim, base), 1.0

    def original_length(self) -> int:
        """For length-dependent methods: the longest sequence that keeps the original frequencies."""
        raise TypeError(f"{type(self).__name__} does not depend on the sequence length")

    def device_frequencies(
        self, xp: Any, length: Any, rotary_dim: int, base: float, *, exponents: Any
    ) -> Any:
        """For methods whose frequencies change at every length (``continuous``): the frequencies
        for ``length`` (``max(positions) + 1``, a 0-d floating device array), computed there."""
        raise TypeError(f"{type(self).__name__} has no frequencies that change at every length")


@dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation: positions divided by ``factor`` (transformers' "linear")."""

    factor: float
    hf_type: ClassVar[str | None] = "linear"

    def __post_init__(self) -> None:
        _positive(self, "factor")

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        return tuple(t / self.factor for t in plain_frequencies(rotary_dim, base)), 1.0


def _ntk_base(base: float, scale: float, rotary_dim: int) -> float:
    if rotary_dim <= 2:
        raise ValueError(f"NTK scaling needs rotary_dim > 2 (its exponent is d / (d - 2)), got {rotary_dim}")
    return float(base * scale ** (rotary_dim / (rotary_dim - 2)))


@dataclass(frozen=True)
class NTKAware(Scaling):
    """NTK-aware scaling: a fixed larger base, ``base * factor ** (d / (d - 2))``."""

    factor: float
    hf_type: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        _positive(self, "factor")

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        return plain_frequencies(rotary_dim, _ntk_base(base, self.factor, rotary_dim)), 1.0


@dataclass(frozen=True)
class DynamicNTK(Scaling):
    """NTK scaling whose base grows with the sequence (transformers' "dynamic").

    For a sequence of length ``L' = max(max(positions) + 1, L)`` with ``L = original_max_position``,
    the base becomes ``base * s ** (d / (d - 2))`` with ``s = alpha * L' / L + (1 - alpha)``.
    transformers takes ``alpha = factor`` (its ``factor * L' / L - (factor - 1)``), which is the
    default here; the seed note's blend uses a weight ``0 < alpha <= 1`` instead.

    Keys rotated earlier, at a shorter length, were rotated with a smaller base: see
    :func:`anyrope.rerotate`.
    """

    factor: float
    original_max_position: int
    alpha: float | None = None
    hf_type: ClassVar[str | None] = "dynamic"
    length_dependent: ClassVar[bool] = True
    continuous: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _positive(self, "factor")
        _positions(self, "original_max_position")
        _positive(self, "alpha", optional=True)

    def original_length(self) -> int:
        return self.original_max_position

    def _base_at(self, base: Any, length: Any, rotary_dim: int) -> Any:
        """The grown base for a length >= original_max_position: a float, or a device array."""
        weight = self.factor if self.alpha is None else self.alpha
        scale = weight * length / self.original_max_position - (weight - 1)
        return base * scale ** (rotary_dim / (rotary_dim - 2))

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        _ntk_base(base, 1.0, rotary_dim)  # rejects rotary_dim <= 2
        length = max(
            seq_len if seq_len is not None else self.original_max_position, self.original_max_position
        )
        return plain_frequencies(rotary_dim, float(self._base_at(base, length, rotary_dim))), 1.0

    def device_frequencies(
        self, xp: Any, length: Any, rotary_dim: int, base: float, *, exponents: Any
    ) -> Any:
        """The frequencies for ``length`` (``max(positions) + 1``, a 0-d floating device array)
        given ``exponents(rotary_dim)`` as a device array of that dtype: the same formula, on the device,
        for calls whose length is not known on the host."""
        original = self.original_max_position
        longer = length - original
        longest = original + longer * xp.astype(longer > 0, length.dtype)  # max(length, original), exactly
        return self._base_at(base, longest, rotary_dim) ** exponents


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: ``0.1 * mscale * ln(scale) + 1`` (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YaRN(Scaling):
    """YaRN: interpolate low frequencies, keep high ones, ramp between, and scale attention.

    Pairs that turn fewer than ``beta_slow`` times over the original context are interpolated by
    ``factor``; pairs that turn more than ``beta_fast`` times keep their frequency; a linear ramp
    over the pair index joins the two. ``truncate`` rounds the ramp's ends to whole pairs, as
    transformers does by default; gpt-oss sets it False. The attention factor is
    ``attention_factor``, else ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both
    are given (DeepSeek), else ``0.1 * ln(factor) + 1``.
    """

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    hf_type: ClassVar[str | None] = "yarn"

    def __post_init__(self) -> None:
        # As from_hf_config reads them: mscale 0 (or None) means unset, as transformers tests truthiness.
        _positive(self, "factor", "beta_fast", "beta_slow")
        _positions(self, "original_max_position")
        _positive(self, "attention_factor", optional=True)
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                _keep(
                    self,
                    name,
                    check_number(getattr(self, name), name, strict=False, why=" (0 or None: unset)"),
                )
        _keep(self, "truncate", check_bool(self.truncate, "truncate"))

    def attention(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:  # transformers tests truthiness: 0 means unset
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def ramp(self, rotary_dim: int, base: float) -> tuple[float, ...]:
        """Per pair, 0 where the frequency is kept and 1 where it is divided by ``factor``."""

        def correction_dim(rotations: float) -> float:
            # The pair index whose wavelength fits ``rotations`` turns into the original context.
            turns = self.original_max_position / (rotations * 2 * math.pi)
            if 0 < turns < math.inf:  # transformers' formula, kept for its rounding
                return rotary_dim * math.log(turns) / (2 * math.log(base))
            # a ratio past float64's range (beta near 1e308 or 1e-308): the same as a difference of logs
            log_turns = math.log(self.original_max_position) - math.log(rotations) - math.log(2 * math.pi)
            return rotary_dim * log_turns / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001  # as transformers: avoids dividing by zero
        return tuple(min(max((i - low) / (high - low), 0.0), 1.0) for i in range(rotary_dim // 2))

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        if not base > 1:
            raise ValueError(f"base={base!r} must be above 1 for YaRN, whose ramp divides by log(base)")
        plain = plain_frequencies(rotary_dim, base)
        ramp = self.ramp(rotary_dim, base)
        inv_freq = tuple(t / self.factor * r + t * (1 - r) for t, r in zip(plain, ramp, strict=True))
        return inv_freq, self.attention()


@dataclass(frozen=True)
class Llama3(Scaling):
    """Llama 3.1's banded scaling.

    Wavelengths longer than ``original_max_position / low_freq_factor`` are divided by ``factor``,
    those shorter than ``original_max_position / high_freq_factor`` are kept, and the band
    between is blended smoothly.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int
    hf_type: ClassVar[str | None] = "llama3"

    def __post_init__(self) -> None:
        _positive(self, "factor", "low_freq_factor", "high_freq_factor")
        _positions(self, "original_max_position")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor={self.high_freq_factor} must exceed low_freq_factor={self.low_freq_factor}"
            )

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        original, low, high = self.original_max_position, self.low_freq_factor, self.high_freq_factor
        low_wavelen, high_wavelen = original / low, original / high
        out = []
        for theta in plain_frequencies(rotary_dim, base):
            wavelen = 2 * math.pi / theta
            if wavelen < high_wavelen:
                out.append(theta)
            elif wavelen > low_wavelen:
                out.append(theta / self.factor)
            else:
                smooth = (original / wavelen - low) / (high - low)
                out.append((1 - smooth) * theta / self.factor + smooth * theta)
        return tuple(out), 1.0


def longrope_attention(factor: float, original_max_position: float) -> float:
    """LongRoPE's attention factor: ``sqrt(1 + ln(factor) / ln(original_max_position))`` (1 for
    factor <= 1)."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_position))


@dataclass(frozen=True)
class LongRoPE(Scaling):
    """LongRoPE (Phi-3): one rescale factor per pair, short ones within the original context.

    Pair i's frequency is divided by ``short_factor[i]`` while ``max(positions) + 1`` is at most
    ``original_max_position`` and by ``long_factor[i]`` beyond it. The attention factor is
    ``attention_factor``, else ``sqrt(1 + ln(f) / ln(original_max_position))`` with
    ``f = factor`` or, when that is None, the RoPE's ``max_position / original_max_position``.
    ``long_attention_factor``, where given, replaces it beyond the original context (PhiMoE's
    ``long_mscale``; its ``short_mscale`` is then ``attention_factor``).
    """

    short_factor: Sequence[float]
    long_factor: Sequence[float]
    original_max_position: int
    factor: float | None = None
    attention_factor: float | None = None
    long_attention_factor: float | None = None
    hf_type: ClassVar[str | None] = "longrope"
    length_dependent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # Tuples keep the config hashable (tables are cached by frequencies).
        for name in ("short_factor", "long_factor"):
            object.__setattr__(self, name, check_numbers(getattr(self, name), name, why=" (one per pair)"))
        _positions(self, "original_max_position")
        _positive(self, "factor", "attention_factor", "long_attention_factor", optional=True)

    def original_length(self) -> int:
        return self.original_max_position

    def attention(self, max_position: int | None) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        factor = self.factor
        if factor is None:
            factor = max_position / self.original_max_position if max_position else 1.0
        if factor > 1.0 and self.original_max_position == 1:
            raise ValueError(
                "original_max_position=1 leaves LongRoPE's attention factor undefined (it divides by "
                "log(original_max_position)); give attention_factor, or the original context length"
            )
        return longrope_attention(factor, self.original_max_position)

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        for name in ("short_factor", "long_factor"):
            if len(getattr(self, name)) != rotary_dim // 2:
                raise ValueError(
                    f"{name} has {len(getattr(self, name))} entries but rotary_dim={rotary_dim} has "
                    f"{rotary_dim // 2} pairs; give one factor per pair"
                )
        long = seq_len is not None and seq_len > self.original_max_position
        factors = self.long_factor if long else self.short_factor
        plain = plain_frequencies(rotary_dim, base)
        attention = self.attention(max_position)
        if long and self.long_attention_factor is not None:
            attention = float(self.long_attention_factor)
        return tuple(t / f for t, f in zip(plain, factors, strict=True)), attention


@dataclass(frozen=True)
class Proportional(Scaling):
    """Proportional RoPE (transformers' "proportional", Gemma-style partial frequencies).

    Only the first ``fraction`` of the pairs turn, with the frequencies they would have in the
    full head (exponents over ``rotary_dim``, not over the rotated part); the remaining pairs get
    frequency 0 and pass through. Use it with ``rotary_dim = head_dim``. Frequencies are then
    divided by ``factor``.
    """

    fraction: float = 1.0
    factor: float = 1.0
    hf_type: ClassVar[str | None] = "proportional"

    def __post_init__(self) -> None:
        fraction = check_number(
            self.fraction, "fraction", strict=False, why=" (the share of pairs that turn)"
        )
        if fraction > 1:
            raise ValueError(f"fraction={self.fraction!r} must lie in [0, 1] (the share of pairs that turn)")
        _keep(self, "fraction", fraction)
        _positive(self, "factor")

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        turning = int(self.fraction * rotary_dim // 2)
        plain = plain_frequencies(rotary_dim, base)
        return tuple(t / self.factor if i < turning else 0.0 for i, t in enumerate(plain)), 1.0


@dataclass(frozen=True)
class MaxLengthAware(Scaling):
    """He and Xu's proposal (2023): fold the maximum length into the frequencies.

    With theta_0 = 1, two tokens 7 apart differ by 7 rad, which wraps to 0.7168 rad: closer, to
    the rotation, than tokens 6 apart (6 rad). They ask that angle differences grow
    monotonically with distance up to the maximum sequence length. We read that as: scale every
    frequency by one common factor ``c = pi / (max_position * max(theta))`` (when that is below 1),
    so that at every distance up to ``max_position`` every pair's angle difference stays within
    [0, pi], where the rotation's effect on a score, cos(angle), falls monotonically. The ratios
    between pairs, and so the spectrum's shape, are kept; it is position interpolation by
    ``1 / c``. See ``anyrope.analysis`` for the wrap distances it removes.
    """

    max_position: int
    hf_type: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        _positions(self, "max_position")

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        plain = plain_frequencies(rotary_dim, base)
        shrink = min(1.0, math.pi / (self.max_position * max(plain)))
        return tuple(t * shrink for t in plain), 1.0
