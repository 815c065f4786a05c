"""The drop-in module, :class:`AnyRoPE`, and the frequencies it keeps where mlx-lm keeps only float32 ones."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ... import scaling as sc
from ..._args import check_bool
from ..._rope import RoPE
from ._libs import nn


@dataclass(frozen=True)
class StoredFrequencies(sc.Scaling):
    """Frequencies given pair by pair, as an mlx-lm module stores them.

    mlx-lm's ``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE`` and ``ProportionalRoPE`` keep only
    the periods their config gave (``_freqs``, float32), not the config itself;
    :func:`from_mlx_lm` turns those into ``inv_freq = 1 / period`` (exactly, in float64), so
    anyrope rotates by the very frequencies mlx-lm does. The RoPE's ``base`` is not used.

    Parameters
    ----------
    inv_freq : tuple of float
        Radians per position of each pair (``rotary_dim // 2`` of them); 0 leaves a pair alone.
    attention : float
        The factor the rotated features carry (YaRN's ``mscale``, LongRoPE's scale).
    source : str
        Where the frequencies came from, for the repr.
    """

    inv_freq: tuple[float, ...] = field(repr=False, default=())
    attention: float = 1.0
    source: str = ""
    hf_type: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inv_freq", tuple(float(f) for f in self.inv_freq))
        if not all(math.isfinite(f) for f in self.inv_freq):
            raise ValueError(f"inv_freq must hold finite numbers, got {self.inv_freq}")
        if not (math.isfinite(self.attention) and self.attention > 0):
            raise ValueError(f"attention must be a positive finite number, got {self.attention!r}")

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        del base, seq_len, max_position  # the signature every Scaling implements; none is needed
        if len(self.inv_freq) != rotary_dim // 2:
            raise ValueError(
                f"{len(self.inv_freq)} stored frequencies but rotary_dim={rotary_dim} has "
                f"{rotary_dim // 2} pairs"
            )
        return self.inv_freq, self.attention


class _State:
    """What an :class:`AnyRoPE` keeps besides its RoPE: the RoPEs it derives for other head
    widths, scales and inverses, and the mlx-lm module it replaced. A plain object, not a dict
    or a module: ``mlx.nn.Module`` would take those for children, and walk into them."""

    __slots__ = ("_lock", "original", "variants")

    def __init__(self) -> None:
        self.variants: dict[tuple[int, float, bool], RoPE] = {}
        self.original: Any = None
        self._lock = threading.Lock()

    def variant(self, key: tuple[int, float, bool], make: Any) -> RoPE:
        found = self.variants.get(key)
        if found is None:
            made = make()
            with self._lock:
                found = self.variants.setdefault(key, made)
        return found


class AnyRoPE(nn.Module):  # type: ignore[misc]  # nn is Any
    """An ``mlx.nn.Module`` that rotates like an mlx-lm rope module, with :class:`anyrope.RoPE`.

    Parameters
    ----------
    rope : anyrope.RoPE
        The rotation. Its ``rotary_dim`` is the module's ``dims``: inputs may be wider (partial
        rotary), and their remaining features pass through unchanged, as with ``mx.fast.rope``.

    Notes
    -----
    The module holds no arrays, so ``model.parameters()``, ``load_weights`` and quantization
    see no change. Construct it with :func:`initialize_rope` or :func:`from_mlx_lm`, or let
    :func:`patch_model` do it.

    Examples
    --------
    >>> import mlx.core as mx  # doctest: +SKIP
    >>> import anyrope  # doctest: +SKIP
    >>> from anyrope.integrations.mlx_lm import AnyRoPE  # doctest: +SKIP
    >>> rope = AnyRoPE(anyrope.RoPE(64, base=500000.0))  # doctest: +SKIP
    >>> q = mx.ones((2, 4, 3, 64))                      # (batch, heads, seq, head_dim)  # doctest: +SKIP
    >>> rope(q, offset=mx.array([5, -2])).shape         # per-row offsets, as BatchKVCache's  # doctest: +SKIP
    (2, 4, 3, 64)
    """

    def __init__(self, rope: RoPE) -> None:
        super().__init__()
        if not isinstance(rope, RoPE):
            raise TypeError(f"rope must be an anyrope.RoPE, not {type(rope).__name__}")
        self._rope = rope
        self._state = _State()

    @property
    def rope(self) -> RoPE:
        """The :class:`anyrope.RoPE` this module rotates with (head width ``dims``)."""
        return self._rope

    @property
    def original(self) -> Any:
        """The mlx-lm module this one was converted from by :func:`from_mlx_lm`, or None."""
        return self._state.original

    @property
    def dims(self) -> int:
        """The rotated features per head, as mlx-lm's ``dims``."""
        return int(self._rope.rotary_dim)

    @property
    def traditional(self) -> bool:
        """Whether consecutive features pair up (mlx-lm's ``traditional``, anyrope's "interleaved")."""
        return bool(self._rope.layout == "interleaved")

    def _extra_repr(self) -> str:
        return repr(self._rope)

    def __call__(self, x: Any, offset: Any = 0, scale: float = 1.0, inverse: bool = False) -> Any:
        """Rotate ``x`` at positions ``offset, offset + 1, ...`` along its second-to-last axis.

        Parameters
        ----------
        x : mx.array
            ``(..., seq, width)``, ``width >= dims``; mlx-lm passes ``(batch, heads, seq, head_dim)``.
        offset : int or mx.array
            The number of tokens before ``x``: an int, a 0-d integer array, or one per batch row
            (shape ``(batch,)``, negative for left-padded rows). Arrays may be traced
            (``mx.compile``); their values are never read on the host.
        scale : float
            Multiplies the positions, as ``YarnRoPE``'s and ``mx.fast.rope``'s ``scale``.
        inverse : bool
            Undo the rotation (``YarnRoPE``'s ``inverse``): turn by the negative angles and
            divide by the multiplier instead of multiplying.

        Returns
        -------
        mx.array
            The rotated ``x``, same shape and dtype.
        """
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) < 2:
            raise ValueError(
                f"x must be an array of shape (..., seq, head_dim), got {type(x).__name__} of shape {shape}"
            )
        width = int(shape[-1])
        if width < self.dims:
            raise ValueError(f"x has {width} features per head, fewer than the {self.dims} this rope rotates")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise TypeError(f"scale must be a finite Python number, not {scale!r}")
        inverse = check_bool(inverse, "inverse")
        rope = self._rope
        if width != rope.head_dim or scale != 1 or inverse:
            key = (width, float(scale), bool(inverse))
            rope = self._state.variant(key, lambda: _derive(self._rope, *key))
        return rope(x, offset=offset)


def _derive(rope: RoPE, width: int, scale: float, inverse: bool) -> RoPE:
    """``rope`` for inputs ``width`` wide, at positions times ``scale``, or undone."""
    scaling: sc.Scaling | None = rope.scaling
    fixed = rope.fixed_length
    if scale != 1 or inverse:
        if scaling is not None and scaling.length_dependent and fixed is None:
            raise ValueError(
                f"scale= and inverse= need frequencies that do not change with the sequence "
                f"length; {type(scaling).__name__} does (fix them with RoPE.at_length)"
            )
        sign = -1.0 if inverse else 1.0
        attention = rope.attention_scaling
        scaling = StoredFrequencies(
            tuple(sign * scale * f for f in rope.inv_freq),
            1.0 / attention if inverse else attention,
            source=f"{rope!r} at scale={scale}{', inverse' if inverse else ''}",
        )
        fixed = None
    derived = RoPE(
        width,
        base=rope.base,
        rotary_dim=rope.rotary_dim,
        layout=rope.layout,
        scaling=scaling,
        max_position=rope.max_position,
    )
    return derived if fixed is None else derived.at_length(fixed)
