"""Moving cached keys from one rotation to another.

Keys in a KV cache were rotated when they were computed. If the frequencies change later
(dynamic NTK grows its base with the sequence, LongRoPE switches to its long factors past the
original context, or a cache is reused under a new configuration), those keys carry the old
angles while new queries carry the new ones, and scores drift. Re-rotating by the difference
of the angles (and rescaling by the ratio of attention factors) puts them where the new
configuration would have put them.
"""

from __future__ import annotations

from typing import Any

from ._compat import array_namespace, compute_dtype, device_of
from ._positions import as_index_array, is_array, plain_offset
from ._rope import RoPE
from ._rotate import check_input, normalize_seq_axis, rotate
from ._tables import cos_sin

__all__ = ["rerotate"]


def rerotate(
    k: Any,
    old: RoPE,
    new: RoPE,
    *,
    positions: Any = None,
    offset: int = 0,
    seq_axis: int = -2,
    old_length: int | None = None,
    new_length: int | None = None,
) -> Any:
    """Turn keys rotated by ``old`` into the keys ``new`` would have produced.

    For each pair, the keys turn by ``p * (theta_new - theta_old)`` (one rotation, formed in
    float64) and are rescaled by ``new.attention_scaling / old.attention_scaling``.

    Parameters
    ----------
    k : array
        Rotated keys, ``(..., seq, head_dim)`` or as ``seq_axis`` says.
    old, new : RoPE
        The configurations the keys were rotated with and should be rotated with. They must
        agree on head_dim, rotary_dim and layout.
    positions, offset :
        Where the keys sit, as for :meth:`RoPE.__call__` (``offset`` must be one int here).
    old_length, new_length : int, optional
        The sequence lengths (``max(positions) + 1``) at which each configuration's frequencies
        are taken, for methods whose frequencies depend on it (``DynamicNTK``, ``LongRoPE``).
        By default, the keys' own last position + 1.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> from anyrope.scaling import DynamicNTK
    >>> rope = anyrope.RoPE(8, scaling=DynamicNTK(2.0, original_max_position=4))
    >>> k = np.ones((6, 8))
    >>> cached = rope(k[:4])                      # rotated while the sequence was 4 long
    >>> moved = anyrope.rerotate(cached, rope, rope, old_length=4, new_length=6)
    >>> bool(np.allclose(moved, rope(k)[:4]))      # as if rotated at length 6
    True
    """
    for name, rope in (("old", old), ("new", new)):
        if not isinstance(rope, RoPE):
            raise TypeError(f"{name} must be an anyrope.RoPE, not {type(rope).__name__}")
    for attr in ("head_dim", "rotary_dim", "layout"):
        if getattr(old, attr) != getattr(new, attr):
            raise ValueError(
                f"old and new must share {attr} (got {getattr(old, attr)!r} and {getattr(new, attr)!r}); "
                "convert the layout first with to_layout"
            )
    xp = array_namespace(k=k, positions=positions if is_array(positions) else None)
    check_input(xp, k, arg="k", head_dim=old.head_dim)
    axis = normalize_seq_axis(seq_axis, k.ndim, arg="k")
    device = device_of(xp, k)
    seq = k.shape[axis]
    if positions is None:
        start = plain_offset(offset)
        if start is None:
            raise TypeError("rerotate takes one int offset; give per-row positions with positions=")
        positions = xp.arange(start, start + seq, dtype=xp.int64, device=device)
        last = start + seq
    else:
        positions = as_index_array(xp, positions, device=device, arg="positions", ndims=(1, 2))
        if positions.shape[-1] != seq:
            raise ValueError(f"positions has {positions.shape[-1]} entries per row but k has {seq} positions")
        last = int(xp.max(positions)) + 1 if seq else 0
    before = old._at(old_length if old_length is not None else last)
    after = new._at(new_length if new_length is not None else last)
    delta = tuple(b - a for a, b in zip(before.inv_freq, after.inv_freq, strict=True))
    cos, sin = cos_sin(
        xp,
        positions,
        delta,
        dtype=compute_dtype(xp, k.dtype),
        device=device,
        scale=after.scale / before.scale,
    )
    return rotate(xp, k, cos, sin, layout=new.layout, inverse=False, seq_axis=axis)
