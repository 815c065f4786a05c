"""The attention prologue: what a layer does to q, k and v between their projections and
attention, in one call. Today: each head of q and k normalised (:class:`anyrope.QKNorm`), then
both rotated by the RoPE, v handed back as it came.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._compat import namespace_and_library
from ._qknorm import QKNorm
from ._rope import RoPE

__all__ = ["Prologue", "prologue"]


class Prologue(NamedTuple):
    """What :func:`prologue` returns: q and k normalised and rotated (k None where not given), v,
    and the KV cache (None: no cache was given)."""

    q: Any
    k: Any
    v: Any
    cache: Any


def prologue(
    q: Any,
    k: Any = None,
    v: Any = None,
    *,
    rope: RoPE,
    positions: Any = None,
    offset: Any = 0,
    seq_axis: int = -2,
    norm: QKNorm | None = None,
) -> Prologue:
    """q and k as attention takes them: each head normalised by ``norm``, then rotated by ``rope``.

    Parameters
    ----------
    q, k : array
        As :meth:`RoPE.__call__` takes them: ``(..., heads, seq, head_dim)`` with
        ``seq_axis=-2``, or ``(batch, seq, heads, head_dim)`` with ``seq_axis=-3``; k may have
        another head count (grouped-query attention).
    v : array, optional
        k's values: k's shape but for the last axis. Handed back as given.
    rope : RoPE
        The rotation: its layout, partial rotary, scaling, M-RoPE sections.
    positions, offset, seq_axis
        As :meth:`RoPE.__call__` takes them.
    norm : QKNorm, optional
        The RMS norm of each head of q and k before the rotation (Qwen3, Gemma 3, OLMo 2, ...).

    Returns
    -------
    Prologue
        ``(q, k, v, cache)``: q and k in their own dtypes (k None where not given), v, and
        ``cache`` None.

    Notes
    -----
    The inputs are never written. The arithmetic is the two steps' own, in this order, so the
    result equals ``rope(norm.q(q), norm.k(k))`` bit for bit on every library, eagerly and under
    ``torch.compile``, ``jax.jit`` and ``mx.compile``.
    """
    if not isinstance(rope, RoPE):
        raise TypeError(f"rope must be an anyrope.RoPE, not {type(rope).__name__}")
    if norm is not None and not isinstance(norm, QKNorm):
        raise TypeError(f"norm must be an anyrope.QKNorm or None, not {type(norm).__name__}")
    if v is not None:
        _check_values(q, k, v)
    if norm is not None:
        q = norm.q(q, seq_axis=seq_axis)
        k = None if k is None else norm.k(k, seq_axis=seq_axis)
    if k is None:
        return Prologue(rope(q, positions=positions, offset=offset, seq_axis=seq_axis), None, v, None)
    q, k = rope(q, k, positions=positions, offset=offset, seq_axis=seq_axis)
    return Prologue(q, k, v, None)


def _check_values(q: Any, k: Any, v: Any) -> None:
    """v comes with k, in q's library, with k's shape but for its last axis."""
    if k is None:
        raise ValueError("v was given without k: pass k, the keys v belongs to")
    namespace_and_library(("q", q), ("k", k), ("v", v))
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ValueError(
            f"v has shape {tuple(v.shape)} but k has {tuple(k.shape)}: v needs k's shape but for "
            "its last axis (one value vector per key)"
        )
