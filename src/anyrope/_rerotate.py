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

from ._args import check_int
from ._call import rotate_by_tables
from ._checks import check_input, normalize_seq_axis
from ._compat import Environment, is_array
from ._context import call_context
from ._dtypes import compute_dtype, isdtype
from ._positions import MultiAxis, PositionSpec, check_shift, position_spec
from ._rope import RoPE, rotary_of
from ._tables import PositionTables
from ._xpos import xpos_scale

__all__ = ["rerotate"]


def rerotate(
    k: Any,
    old: RoPE,
    new: RoPE,
    *,
    positions: Any = None,
    offset: Any = 0,
    seq_axis: int = -2,
    old_length: int | None = None,
    new_length: int | None = None,
    shift: Any = 0,
) -> Any:
    """Turn keys rotated by ``old`` into the keys ``new`` would have produced, optionally
    ``shift`` positions further on.

    For each pair, the keys turn back by ``old``'s angle and on by ``new``'s (one rotation, by
    the difference, whose cos and sin come from both tables) and are rescaled by
    ``new.attention_scaling / old.attention_scaling``. Traceable like a call: under tracing or on
    an accelerator, lengths that depend on the positions are taken on the device. xPos keys
    (``xpos_scale_base``) are rescaled from ``old``'s decay to ``new``'s.

    Parameters
    ----------
    k : array
        Rotated keys, ``(..., seq, head_dim)`` or as ``seq_axis`` says.
    old, new : RoPE
        The configurations the keys were rotated with and should be rotated with. They must
        agree on head_dim, rotary_dim, layout, clockwise, and M-RoPE's sections or the axes of
        axial RoPE (which stream each pair follows).
    positions, offset :
        Where the keys sit, as for :meth:`RoPE.__call__`.
    old_length, new_length : int, optional
        The sequence lengths (``max(positions) + 1``) at which each configuration's frequencies
        are taken, for methods whose frequencies depend on it (``DynamicNTK``, ``LongRoPE``).
        By default, the keys' own last position + 1 (after the shift, for ``new``).
    shift : int or integer array
        Move the keys this many positions: keys ``old`` rotated at position ``p`` come out as
        ``new`` rotates them at ``p + shift``, without recomputing them (llama.cpp's context
        shift: dropping ``n`` tokens from the front of a cache is ``shift=-n`` for the keys kept).
        One int or 0-d array (traced under a compiler, say), or one per batch row, ``(batch,)``.
        For M-RoPE, an array with axes has the streams first: ``(streams,)`` or
        ``(streams, batch)``; an int or 0-d array moves every stream alike.

    Notes
    -----
    Shifting keys is exact only where the frequencies do not depend on the length: with
    ``DynamicNTK`` or ``LongRoPE``, keys moved to shorter positions keep frequencies of the length
    given as ``new_length`` (by default their own new last position + 1), and queries rotated at
    another length see other angles. Fix one length for both with :meth:`RoPE.at_length` (or
    pass ``new_length``) where a cache is shifted.

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
    >>> plain = anyrope.RoPE(8)
    >>> shifted = anyrope.rerotate(plain(k, offset=10), plain, plain, offset=10, shift=-7)
    >>> bool(np.allclose(shifted, plain(k, offset=3)))  # keys at 10.. now at 3..
    True
    """
    for name, rope in (("old", old), ("new", new)):
        if not isinstance(rope, RoPE):
            raise TypeError(f"{name} must be an anyrope.RoPE, not {type(rope).__name__}")
    for attr in (
        "head_dim",
        "rotary_dim",
        "layout",
        "clockwise",
        "mrope_section",
        "mrope_interleaved",
        "axial",
        "pair_streams",
    ):
        if getattr(old, attr) != getattr(new, attr):
            hint = "; convert the layout first with to_layout" if attr == "layout" else ""
            raise ValueError(
                f"old and new must share {attr} (got {getattr(old, attr)!r} and {getattr(new, attr)!r}){hint}"
            )
    lengths = [_length(old_length, "old_length"), _length(new_length, "new_length")]
    others = [(arg, value) for arg, value in (("positions", positions), ("offset", offset), ("shift", shift))]
    ctx = call_context(("k", k), *others, grad_of=(k,))
    xp, env, traced = ctx.xp, ctx.env, ctx.traced
    check_input(xp, k, arg="k", head_dim=old.head_dim)
    axis = normalize_seq_axis(seq_axis, k.ndim, arg="k")
    spec = position_spec(
        xp, env, positions, offset, traced=traced, streams=old.streams, per_axis=rotary_of(old).per_axis
    )
    spec.check(k, "k", axis)
    seq, compute = k.shape[axis], compute_dtype(xp, k.dtype)
    moved = spec if _no_shift(shift) else _shifted(xp, env, spec, seq, shift, old.streams, traced)
    moved.check(k, "k", axis)
    work = xp.float64 if env.float64 else compute  # the difference of two rotations, formed wide
    tables = []
    for rope, length, where in zip((old, new), lengths, (spec, moved), strict=True):
        fixed = rope if length is None else rope.at_length(length)
        tables.append(PositionTables(rotary_of(fixed), ctx, where, seq).tables(seq, work))
    (c_old, s_old), (c_new, s_new) = tables
    rescale = 1.0 / old.attention_scaling**2  # the product carries both scales; keep new / old
    cos, sin = (c_new * c_old + s_new * s_old) * rescale, (s_new * c_old - c_new * s_old) * rescale
    for rope, where, sign in ((new, moved, -1.0), (old, spec, 1.0)):  # xPos keys: new scale / old scale
        if rope.xpos_scale_base is not None:
            factor = xpos_scale(ctx, where, seq, rotary_of(rope), sign, work)
            cos, sin = cos * factor, sin * factor
    cos, sin = xp.astype(cos, compute), xp.astype(sin, compute)
    # clockwise: the difference turns the other way too
    return rotate_by_tables(ctx, k, "k", axis, new.layout, new.clockwise, None, cos, sin, compute)


def _length(length: Any, arg: str) -> int | None:
    """A sequence length to fix frequencies at, checked under its own name (not at_length's)."""
    return None if length is None else check_int(length, arg, low=1, why=" (max(positions) + 1) or None")


def _no_shift(shift: Any) -> bool:
    return type(shift) is int and shift == 0


def _shifted(
    xp: Any,
    env: Environment,
    spec: PositionSpec,
    seq: int,
    shift: Any,
    streams: int,
    traced: bool,
) -> PositionSpec:
    """The positions of ``spec`` moved by ``shift``, formed on the device (see :func:`rerotate`)."""
    delta = shift
    if type(shift) is int:  # first: a SymInt while dynamo traces, which must not be compared
        delta = shift if traced else check_int(shift, "shift")
    elif is_array(shift):
        if not isdtype(xp, shift.dtype, "integral"):
            raise TypeError(f"shift must be an int or an integer array, got dtype {shift.dtype}")
        delta = shift if shift.dtype == env.index else xp.astype(shift, env.index)
    elif isinstance(shift, bool) or not hasattr(shift, "__index__"):
        raise TypeError(f"shift must be an int or an integer array, not {type(shift).__name__}")
    else:
        delta = check_int(shift, "shift")  # NumPy integers
    if not traced and type(delta) is int:
        check_shift(spec, seq, delta, env)
    positions = spec.positions(xp, env, seq)
    if positions.dtype != env.index:
        positions = xp.astype(positions, env.index)  # (an Offset's may be int32: the shift could overflow it)
    rank = delta.ndim if is_array(delta) else 0
    multi = isinstance(spec, MultiAxis)
    if rank == 0:
        return position_spec(xp, env, positions + delta, 0, traced=traced, streams=streams)
    shape = tuple(delta.shape)
    if streams == 1 and rank == 1:  # one shift per batch row
        moved = positions + delta[:, None]
    elif streams > 1 and rank in (1, 2) and shape[0] == streams:
        if not multi:  # every stream at the same positions until now
            positions = positions[None, ...]
        if rank == 2 and positions.ndim == 2:  # (streams, seq) and one shift per row: add the batch axis
            positions = positions[:, None, :]
        moved = positions + xp.reshape(delta, (*shape, *([1] * (positions.ndim - rank))))
    else:
        wanted = f"(streams={streams},) or ({streams}, batch)" if streams > 1 else "(batch,)"
        raise ValueError(f"shift of shape {shape} does not fit; give one int, a 0-d array, or shape {wanted}")
    return position_spec(xp, env, moved, 0, traced=traced, streams=streams)
