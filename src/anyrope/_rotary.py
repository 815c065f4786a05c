"""What a RoPE is, as one frozen value: its widths, layout, direction, position streams,
scaling with the frequencies it gives, and xPos. :class:`anyrope.RoPE` checks its arguments and
holds one; everything below the public API reads this instead of the RoPE object."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ._frequencies import Spectrum
from ._handle import Handle
from ._layout import Layout
from ._memo import Memo
from ._sections import Sections
from .scaling import Scaling

__all__ = ["Rotary"]


@dataclass(frozen=True, eq=False)
class Rotary:
    """``sections``: which stream and frequency each pair follows (M-RoPE, axial RoPE), or None;
    ``spectrum``: the frequencies for every sequence length; ``xpos_scale_base``: None without xPos."""

    head_dim: int
    rotary_dim: int
    base: float
    layout: Layout
    clockwise: bool
    scaling: Scaling
    max_position: int | None
    sections: Sections | None
    xpos_scale_base: float | None
    spectrum: Spectrum

    handle: Handle[Rotary] = field(init=False, repr=False)
    #: the plans of its calls, one per call signature (see anyrope._plan): made by a call, read by
    #: the later ones; never pickled or copied (they hold prepared launches)
    plans: Memo[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # what code run as plain Python under a tracer reaches this rotary by (see ._handle)
        object.__setattr__(self, "handle", Handle(self))
        object.__setattr__(self, "plans", Memo(64))

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "plans"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "plans", Memo(64))

    # Worked out from the sections, not kept as int fields: dynamo makes an int attribute that
    # differs between compiled calls symbolic, and these choose shapes and error messages.
    @property
    def streams(self) -> int:
        """Positions per token."""
        return 1 if self.sections is None else self.sections.streams

    @property
    def plain_order(self) -> bool:
        """Whether pair ``j`` turns by frequency ``j`` (all but axial RoPE): rows of the plain
        spectrum's tables then serve every position whose streams agree."""
        return self.sections is None or not self.sections.reordered

    @property
    def per_axis(self) -> bool:
        """Whether calls need positions per stream: with pairs on frequencies of their axis
        (axial RoPE), streams alike are no rotation a model makes, unlike M-RoPE's text tokens."""
        return not self.plain_order

    @property
    def pair_streams(self) -> tuple[int, ...]:
        """The position stream each pair follows."""
        return (0,) * (self.rotary_dim // 2) if self.sections is None else self.sections.stream_of

    @property
    def pair_frequencies(self) -> tuple[int, ...]:
        """The index into the spectrum of the frequency each pair turns by."""
        return tuple(range(self.rotary_dim // 2)) if self.sections is None else self.sections.freq_of

    def at_length(self, seq_len: int) -> Rotary:
        """The same rotation with the frequencies of ``seq_len`` fixed."""
        spectrum = Spectrum(
            self.scaling,
            self.rotary_dim,
            self.base,
            self.max_position,
            seq_len,
            self.spectrum.frequency_scale,
        )
        return replace(self, spectrum=spectrum)

    def with_frequency_scale(self, frequency_scale: tuple[float, ...] | None) -> Rotary:
        """The same rotation with its frequencies times ``frequency_scale`` (checked), or without."""
        s = self.spectrum
        spectrum = Spectrum(
            self.scaling, self.rotary_dim, self.base, self.max_position, s.fixed, frequency_scale
        )
        return replace(self, spectrum=spectrum)
