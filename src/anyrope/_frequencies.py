"""A RoPE's frequencies: fixed, or chosen by the sequence length on the host or on the device."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

from ._args import shown
from ._memo import Memo
from .scaling import Scaling

__all__ = ["LengthSwitch", "PairFrequencies", "Spectrum", "frequencies"]


class PairFrequencies:
    """One set of per-pair frequencies and the table scale. Made only by :func:`frequencies`,
    which hands out one object per set of values: equal frequencies of two RoPEs share cached
    tables, and a cache key hashes them by identity, in C (a ``__hash__`` of its own would cost
    every call that looks a table up a Python frame)."""

    __slots__ = ("__weakref__", "inv_freq", "scale")

    def __init__(self, inv_freq: tuple[float, ...], scale: float) -> None:
        self.inv_freq, self.scale = inv_freq, scale


_made: weakref.WeakValueDictionary[tuple[tuple[float, ...], float], PairFrequencies] = (
    weakref.WeakValueDictionary()
)


def frequencies(inv_freq: tuple[float, ...], scale: float) -> PairFrequencies:
    """The one :class:`PairFrequencies` of these values (while any is alive)."""
    key = (inv_freq, scale)
    found = _made.get(key)
    return found if found is not None else _made.setdefault(key, PairFrequencies(inv_freq, scale))


@dataclass(frozen=True)
class LengthSwitch:
    """Frequencies chosen on the device: ``short`` while ``max(positions) + 1 <= threshold``, else
    ``long`` (LongRoPE), or frequencies computed from the length itself when ``long`` is None
    (DynamicNTK)."""

    threshold: int
    short: PairFrequencies
    long: PairFrequencies | None


class Spectrum:
    """The frequencies of one RoPE configuration, for every sequence length."""

    __slots__ = (
        "_by_length",
        "base",
        "fixed",
        "frequency_scale",
        "max_position",
        "original",
        "rotary_dim",
        "scaling",
        "static",
        "switch",
    )

    def __init__(
        self,
        scaling: Scaling,
        rotary_dim: int,
        base: float,
        max_position: int | None,
        fixed: int | None,
        frequency_scale: tuple[float, ...] | None = None,
    ) -> None:
        self.scaling, self.rotary_dim, self.base = scaling, rotary_dim, base
        self.max_position, self.fixed = max_position, fixed
        # per frequency index, times the method's frequencies (Mistral Large 4's exp(alpha))
        self.frequency_scale = frequency_scale
        self._by_length: Memo[PairFrequencies] = Memo()  # decoding under DynamicNTK meets every length once
        self.original = self._compute(None)  # the frequencies within the original context
        # Every call's frequencies where they do not depend on the call (fixed with at_length).
        self.static = self.original if fixed is None or not scaling.length_dependent else self._compute(fixed)
        # Where the length is not known on the host: both sides, made now, as a traced call may
        # read no memo (dynamo would guard on it).
        self.switch: LengthSwitch | None = None
        if self.length_dependent:
            threshold = scaling.original_length()
            long = None if scaling.continuous else self._compute(threshold + 1)
            self.switch = LengthSwitch(threshold, self.original, long)

    def name_of(self, freqs: PairFrequencies) -> str | None:
        """Which of the frequencies made with this spectrum ``freqs`` is, by name (a constant
        to a tracer, where the object may not be: see :mod:`._handle`), or None for those of a
        length met during a call."""
        for name in ("static", "original"):
            if freqs is getattr(self, name):
                return name
        return "long" if self.switch is not None and freqs is self.switch.long else None

    def named(self, name: str) -> PairFrequencies:
        """The frequencies :meth:`name_of` names ``name``."""
        found = self.switch.long if name == "long" and self.switch is not None else getattr(self, name)
        assert isinstance(found, PairFrequencies)
        return found

    @property
    def length_dependent(self) -> bool:
        return self.scaling.length_dependent and self.fixed is None

    def _compute(self, seq_len: int | None) -> PairFrequencies:
        try:
            inv_freq, scale = self.scaling.frequencies(
                self.rotary_dim, self.base, seq_len=seq_len, max_position=self.max_position
            )
        except (OverflowError, ZeroDivisionError):  # float ** float past float's range (NTK, huge factors)
            inv_freq, scale = (math.inf,), 1.0
        if self.frequency_scale is not None:  # the one place the scale meets host frequencies
            # (not strict: the overflow above leaves one inf, which the check below reports)
            inv_freq = tuple(float(f) * s for f, s in zip(inv_freq, self.frequency_scale, strict=False))
        freqs = frequencies(tuple(float(f) for f in inv_freq), float(scale))
        # Each value was checked alone; together they may still leave float's range. (Signs are
        # the method's own: the mlx-lm integration's stored frequencies turn inverse= by -theta.)
        if not all(math.isfinite(f) for f in (*freqs.inv_freq, freqs.scale)):
            at = "" if seq_len is None else f" at sequence length {shown(seq_len)}"
            given = "" if self.frequency_scale is None else " and frequency_scale"
            raise ValueError(
                f"base={self.base!r} with scaling={self.scaling!r}{given}{at} gives frequencies or an "
                "attention factor outside float's finite range; choose a smaller factor or base"
            )
        return freqs

    def device_frequencies(self, xp: Any, length: Any, *, exponents: Any, factors: Any) -> Any:
        """The frequencies of a continuous method (DynamicNTK) for ``length``, a 0-d floating device
        array, formed there; ``factors``: :attr:`frequency_scale` as a device array of that dtype
        (None without one), applied as on the host."""
        inv_freq = self.scaling.device_frequencies(
            xp, length, self.rotary_dim, self.base, exponents=exponents
        )
        return inv_freq if factors is None else inv_freq * factors

    def at(self, seq_len: int | None) -> PairFrequencies:
        """The frequencies for a sequence length; the same object for every length that shares them."""
        if seq_len is None or self.fixed is not None or not self.scaling.length_dependent:
            return self.static
        return self._by_length.get(seq_len, lambda: self._at(seq_len))

    def _at(self, seq_len: int) -> PairFrequencies:
        return self._compute(seq_len)  # the original's object where they are equal (see frequencies)

    def for_call(self, length: int | None) -> PairFrequencies | LengthSwitch:
        """For a call whose ``max(positions) + 1`` is ``length`` if known on the host, else None."""
        if self.switch is None:
            return self.static
        if length is not None:
            return self.at(length)
        return self.switch

    def cacheable(self, freqs: PairFrequencies) -> bool:
        """Whether tables of ``freqs`` are worth keeping (not for one DynamicNTK length among many)."""
        return freqs is self.static or not self.scaling.continuous
