"""What a RoPE is, as one frozen value: its widths, layout, direction, position streams,
scaling with the frequencies it gives, and xPos. :class:`anyrope.RoPE` checks its arguments and
holds one; everything below the public API reads this instead of the RoPE object."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ._frequencies import Spectrum
from ._layout import Layout
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
    #: positions per token
    streams: int = field(init=False)
    #: whether pair ``j`` turns by frequency ``j`` (all but axial RoPE): rows of the plain
    #: spectrum's tables then serve every position whose streams agree
    plain_order: bool = field(init=False)

    def __post_init__(self) -> None:  # read on every call: worked out once
        sections = self.sections
        object.__setattr__(self, "streams", 1 if sections is None else sections.streams)
        object.__setattr__(self, "plain_order", sections is None or not sections.reordered)

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
        spectrum = Spectrum(self.scaling, self.rotary_dim, self.base, self.max_position, seq_len)
        return replace(self, spectrum=spectrum)
