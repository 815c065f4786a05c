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

from ._compat import array_namespace, device_of, environment, is_array, is_traced
from ._dtypes import compute_dtype
from ._plan import Job, PositionAngles, _grad
from ._positions import position_spec
from ._registry import rotate
from ._rope import RoPE
from ._rotate import GivenTables, check_input, normalize_seq_axis

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
) -> Any:
    """Turn keys rotated by ``old`` into the keys ``new`` would have produced.

    For each pair, the keys turn back by ``old``'s angle and on by ``new``'s (one rotation, by
    the difference, whose cos and sin come from both tables) and are rescaled by
    ``new.attention_scaling / old.attention_scaling``. Traceable like a call: under tracing or on
    an accelerator, lengths that depend on the positions are taken on the device.

    Parameters
    ----------
    k : array
        Rotated keys, ``(..., seq, head_dim)`` or as ``seq_axis`` says.
    old, new : RoPE
        The configurations the keys were rotated with and should be rotated with. They must
        agree on head_dim, rotary_dim, layout and clockwise.
    positions, offset :
        Where the keys sit, as for :meth:`RoPE.__call__`.
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
    for attr in ("head_dim", "rotary_dim", "layout", "clockwise"):
        if getattr(old, attr) != getattr(new, attr):
            hint = "; convert the layout first with to_layout" if attr == "layout" else ""
            raise ValueError(
                f"old and new must share {attr} (got {getattr(old, attr)!r} and {getattr(new, attr)!r}){hint}"
            )
    named = {"k": k}
    for arg, value in (("positions", positions), ("offset", offset)):
        if type(value) is not int and value is not None and is_array(value):
            named[arg] = value
    xp = array_namespace(**named)
    check_input(xp, k, arg="k", head_dim=old.head_dim)
    axis = normalize_seq_axis(seq_axis, k.ndim, arg="k")
    device = device_of(xp, k)
    traced = is_traced(xp, *named.values())
    env = environment(xp, device, traced=traced)
    spec = position_spec(xp, env, positions, offset, device, traced=traced)
    spec.check(k, "k", axis)
    seq, compute = k.shape[axis], compute_dtype(xp, k.dtype)
    work = xp.float64 if env.float64 else compute  # the difference of two rotations, formed wide
    tables = []
    for rope, length in ((old, old_length), (new, new_length)):
        fixed = rope if length is None else rope.at_length(length)
        tables.append(PositionAngles(fixed, xp, env, spec, device, traced, seq).tables(seq, work))
    (c_old, s_old), (c_new, s_new) = tables
    rescale = 1.0 / old.attention_scaling**2  # the product carries both scales; keep new / old
    cos = xp.astype((c_new * c_old + s_new * s_old) * rescale, compute)
    sin = xp.astype((s_new * c_old - c_new * s_old) * rescale, compute)
    job = Job(
        xp,
        env,
        k,
        "k",
        axis,
        new.layout,
        new.clockwise,  # the difference turns the other way too
        None,
        GivenTables(cos, sin),
        traced,
        _grad(xp, [("k", k)]),
        compute,
    )
    return rotate(job)
