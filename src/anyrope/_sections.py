"""Frequency pairs that follow different position streams: M-RoPE and axial N-D RoPE.

Qwen2-VL gives each token three positions (time, height, width) and splits the
``rotary_dim // 2`` frequency pairs into contiguous sections, one per stream (``mrope_section``);
Qwen3-VL interleaves the streams across the pairs instead, so each stream keeps high and low
frequencies. Either way pair ``j`` turns by ``positions[stream(j)] * theta_j``; only the
assignment differs. A token whose streams agree (every text token) turns exactly as in plain RoPE.

Vision transformers rotate image patches by their row and column (and frame): axial RoPE. Each
axis takes an equal, contiguous share of the pairs, with frequencies of its own: "blocks" gives
every axis the spectrum of ``rotary_dim / axes`` features (EVA-02, rotary-embedding-torch's
axial frequencies), which is every ``axes``-th frequency of the whole spectrum; "alternating"
deals the whole spectrum out in turn (Pixtral: rows take the even frequencies, columns the odd).
So pair ``j`` turns by ``positions[stream(j)] * theta_{frequency(j)}``, and nothing else changes.

That map, one stream and one frequency per pair, is the whole specification: M-RoPE and axial
RoPE are named cases of it, and any other assignment (ERNIE 4.5-VL's height and width pairs
alternating before time's, Bailing's, XD-RoPE's four streams) is given as the map itself.
A map that is a named case is built as that case, so both spellings are one rotation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["AXIAL", "Sections", "axial_sections", "check_sections", "check_stream_map"]

#: How axial RoPE shares the spectrum out among the axes.
AXIAL = ("blocks", "alternating")


class Sections:
    """Which stream and which frequency each pair follows, and how per-stream tables are put
    back in pair order. ``kind``: "contiguous" or "interleaved" (M-RoPE), one of ``AXIAL``, or
    "map" (any other assignment); ``sizes``: pairs per stream."""

    __slots__ = (
        "freq_of", "frequency_indices", "kind", "pairs_of", "pieces", "reordered", "sizes", "stream_of",
    )  # fmt: skip

    def __init__(
        self, kind: str, sizes: tuple[int, ...], stream_of: tuple[int, ...], freq_of: tuple[int, ...]
    ) -> None:
        self.kind, self.sizes, self.stream_of, self.freq_of = kind, sizes, stream_of, freq_of
        count = len(sizes)
        self.pairs_of = tuple(tuple(j for j, s in enumerate(stream_of) if s == t) for t in range(count))
        self.frequency_indices = tuple(tuple(freq_of[j] for j in pairs) for pairs in self.pairs_of)
        self.pieces = _pieces(stream_of, count)
        # pairs turn by other frequencies than their own index (axial RoPE): even where every
        # stream has the same positions, tables of the plain spectrum do not apply
        self.reordered = freq_of != tuple(range(len(freq_of)))

    @property
    def streams(self) -> int:
        return len(self.sizes)

    @property
    def interleaved(self) -> bool:
        return self.kind == "interleaved"

    @property
    def axial(self) -> bool:
        return self.kind in AXIAL

    def _key(self) -> tuple[Any, ...]:  # the rotation itself, whichever way it was spelled
        return (len(self.sizes), self.stream_of, self.freq_of)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sections) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def assemble(self, xp: Any, parts: Sequence[Any]) -> Any:
        """Per-stream tables ``(..., len(pairs_of[s]))`` back into one ``(..., pairs)`` table."""
        out = []
        for kind, *where in self.pieces:
            if kind == "round":  # pairs cycling through every stream: stack, then flatten
                rounds = where[0]
                block = xp.stack([part[..., :rounds] for part in parts], axis=-1)
                out.append(xp.reshape(block, (*block.shape[:-2], rounds * len(parts))))
            else:
                stream, start, stop = where
                out.append(parts[stream][..., start:stop])
        return out[0] if len(out) == 1 else xp.concat(out, axis=-1)

    def tables(self, xp: Any, positions: Any, make: Callable[[Any, int], tuple[Any, Any]]) -> tuple[Any, Any]:
        """cos and sin for ``positions`` of shape ``(streams, ...)``: ``make(stream_positions, s)``
        gives the tables of stream s's own pairs."""
        made = [
            make(positions[s, ...], s) if pairs else (None, None) for s, pairs in enumerate(self.pairs_of)
        ]
        return self.assemble(xp, [m[0] for m in made]), self.assemble(xp, [m[1] for m in made])


@functools.lru_cache(maxsize=64)
def sections(sizes: tuple[int, ...], interleaved: bool) -> Sections:
    stream_of = _assignment(sizes, interleaved)
    return Sections(
        "interleaved" if interleaved else "contiguous", sizes, stream_of, tuple(range(len(stream_of)))
    )


@functools.lru_cache(maxsize=64)
def axial_sections(axes: int, kind: str, rotary_dim: int) -> Sections:
    """Axial RoPE over ``axes`` axes (checked: each takes ``rotary_dim / (2 axes)`` pairs)."""
    if isinstance(axes, bool) or not isinstance(axes, int) or axes < 1:
        raise ValueError(f"axial={axes!r} must be a positive int: the number of position axes (2 for images)")
    if kind not in AXIAL:
        raise ValueError(f"axial_frequencies={kind!r} must be one of {', '.join(map(repr, AXIAL))}")
    pairs = rotary_dim // 2
    if pairs % axes:
        raise ValueError(
            f"rotary_dim={rotary_dim} has {pairs} pairs, which {axes} axes cannot share equally; "
            f"axial RoPE needs rotary_dim divisible by {2 * axes}"
        )
    share = pairs // axes
    stream_of = tuple(j // share for j in range(pairs))
    # axis s's i-th pair: frequency i * axes (blocks: the spectrum of rotary_dim / axes features),
    # or i * axes + s (alternating)
    shift = 0 if kind == "blocks" else 1
    freq_of = tuple((j % share) * axes + shift * (j // share) for j in range(pairs))
    return Sections(kind, (share,) * axes, stream_of, freq_of)


def check_sections(value: Any, interleaved: Any, rotary_dim: int) -> Sections | None:
    """``mrope_section`` checked against ``rotary_dim``: one non-negative int per stream that add
    up to ``rotary_dim // 2`` (a count of pairs, not of features, as in transformers' configs)."""
    if not isinstance(interleaved, bool):
        raise TypeError(f"mrope_interleaved must be True or False, not {interleaved!r}")
    if value is None:
        if interleaved:
            raise ValueError("mrope_interleaved=True needs mrope_section (pairs per position stream)")
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"mrope_section must be a sequence of ints (pairs per stream), not {value!r}")
    sizes = []
    for size in value:
        if isinstance(size, bool) or not hasattr(size, "__index__") or int(size) < 0:
            raise ValueError(f"mrope_section={list(value)!r} must hold non-negative ints (pairs per stream)")
        sizes.append(int(size))
    if len(sizes) < 2:
        raise ValueError(f"mrope_section={sizes!r} needs two or more streams (one stream is plain RoPE)")
    pairs = rotary_dim // 2
    if sum(sizes) != pairs:
        raise ValueError(
            f"mrope_section={sizes!r} adds up to {sum(sizes)} pairs but rotary_dim={rotary_dim} has {pairs}; "
            "sections count frequency pairs (rotary_dim // 2), one entry per position stream"
        )
    count = len(sizes)
    for stream, size in enumerate(sizes[1:], start=1):
        if interleaved and not _fits_interleaved(stream, size, count, pairs):
            raise ValueError(
                f"mrope_section={sizes!r}: interleaved, stream {stream} takes pairs {stream}, "
                f"{stream + count}, ... ({size} of them), which runs past the {pairs} pairs; give it fewer"
            )
    return sections(tuple(sizes), interleaved)


def check_stream_map(pair_streams: Any, pair_frequencies: Any, rotary_dim: int) -> Sections:
    """``pair_streams`` (and ``pair_frequencies``) checked against ``rotary_dim``: one entry per
    pair, the position stream it follows (two or more streams; a stream no pair follows is a
    row of the positions that is not read) and the spectrum index of its frequency (default:
    its own). Built as M-RoPE or axial RoPE where it is one of them."""
    pairs = rotary_dim // 2
    stream_of = _per_pair(pair_streams, "pair_streams", pairs, pairs, "a position stream")
    count = max(stream_of) + 1
    if count < 2:
        raise ValueError(
            "pair_streams puts every pair on stream 0, which is plain RoPE; leave pair_streams out, "
            "or name two or more streams"
        )
    freq_of = (
        tuple(range(pairs))
        if pair_frequencies is None
        else _per_pair(pair_frequencies, "pair_frequencies", pairs, pairs, "an index into the spectrum")
    )
    sizes = tuple(stream_of.count(s) for s in range(count))
    for named in _named_cases(sizes, rotary_dim):
        if (named.stream_of, named.freq_of) == (stream_of, freq_of):
            return named
    return Sections("map", sizes, stream_of, freq_of)


def _per_pair(value: Any, name: str, pairs: int, bound: int, what: str) -> tuple[int, ...]:
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of ints, one per frequency pair ({pairs}), not {value!r}")
    items = list(value)
    if len(items) != pairs:
        raise ValueError(
            f"{name} has {len(items)} entries but this RoPE has {pairs} frequency pairs "
            "(rotary_dim // 2); give one per pair"
        )
    out = []
    for item in items:
        if isinstance(item, bool) or not hasattr(item, "__index__") or not 0 <= int(item) < bound:
            raise ValueError(f"{name} must hold ints from 0 to {bound - 1} ({what} per pair), got {item!r}")
        out.append(int(item))
    return tuple(out)


def _named_cases(sizes: tuple[int, ...], rotary_dim: int) -> list[Sections]:
    """The named cases with these pairs per stream: contiguous, interleaved, axial."""
    count, pairs = len(sizes), rotary_dim // 2
    named = [sections(sizes, False)]
    if all(_fits_interleaved(stream, size, count, pairs) for stream, size in enumerate(sizes[1:], start=1)):
        named.append(sections(sizes, True))
    if len(set(sizes)) == 1:
        named += [axial_sections(count, kind, rotary_dim) for kind in AXIAL]
    return named


def _fits_interleaved(stream: int, size: int, count: int, pairs: int) -> bool:
    """Whether interleaved stream ``stream``'s pairs ``stream, stream + count, ...`` (``size`` of
    them) stay within the pairs."""
    return not size or stream + count * (size - 1) < pairs


def _assignment(sizes: tuple[int, ...], interleaved: bool) -> tuple[int, ...]:
    count, pairs = len(sizes), sum(sizes)
    if not interleaved:
        return tuple(s for s, size in enumerate(sizes) for _ in range(size))
    # Qwen3-VL: stream s > 0 takes pairs s, s + count, ... (sizes[s] of them); the rest stay on 0.
    stream_of = [0] * pairs
    for stream, size in enumerate(sizes[1:], start=1):
        for j in range(stream, stream + count * size, count):
            stream_of[j] = stream
    return tuple(stream_of)


def _pieces(stream_of: tuple[int, ...], count: int) -> tuple[tuple[Any, ...], ...]:
    """How per-stream tables make the pair order: first the longest prefix that cycles through
    every stream in order (one stack), then runs of consecutive pairs of one stream (slices)."""
    rounds = 0
    while (rounds + 1) * count <= len(stream_of) and all(
        stream_of[rounds * count + s] == s for s in range(count)
    ):
        rounds += 1
    pieces: list[tuple[Any, ...]] = [("round", rounds)] if rounds > 1 else []
    taken = [rounds if rounds > 1 else 0] * count
    j = rounds * count if rounds > 1 else 0
    while j < len(stream_of):
        stream, stop = stream_of[j], j
        while stop < len(stream_of) and stream_of[stop] == stream:
            stop += 1
        pieces.append(("slice", stream, taken[stream], taken[stream] + stop - j))
        taken[stream] += stop - j
        j = stop
    return tuple(pieces)
