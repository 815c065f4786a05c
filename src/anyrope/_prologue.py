"""The attention prologue: what a layer does to q, k and v between their projections and
attention, in one call: each head of q and k normalised (:class:`anyrope.QKNorm`), both rotated
by the RoPE, then k and v written into the layer's KV cache (:class:`anyrope.KVCache`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _kvcache
from ._compat import namespace_and_library
from ._kvcache import KVCache
from ._qknorm import QKNorm
from ._rope import RoPE

__all__ = ["Prologue", "prologue"]


class Prologue(NamedTuple):
    """What :func:`prologue` returns: q and k normalised and rotated (k None where not given), v,
    and the KV cache written (None where none was given): the one given, or for JAX's immutable
    arrays a new one."""

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
    cache: KVCache | None = None,
    cache_index: Any = None,
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
    cache : KVCache, optional
        Where each token's rotated k and its v are written (k and v needed, 4-D): in place, or
        for JAX into new arrays.
    cache_index : array or sequence of int, optional
        Each token's place in the cache, shape ``(seq,)`` or ``(batch, seq)``: its row in a
        contiguous cache (by default its position, or ``offset + i``), its flat slot
        ``page * page_size + offset`` in a paged one (needed there); negative: not written
        (padding). Two tokens at one place leave either's values.

    Returns
    -------
    Prologue
        ``(q, k, v, cache)``: q and k in their own dtypes (k None where not given), v, and
        the cache written (None where none was given).

    Notes
    -----
    q, k and v are never written, and the cache only once every argument is checked (places
    past the cache's size are refused where their values are on the host; on a GPU or under a
    compiler nothing reads them). The arithmetic is the steps' own, in this order, so q and k
    equal ``rope(norm.q(q), norm.k(k))`` bit for bit on every library, eagerly and under
    ``torch.compile``, ``jax.jit`` and ``mx.compile``, and the cache holds those k and v.
    """
    if not isinstance(rope, RoPE):
        raise TypeError(f"rope must be an anyrope.RoPE, not {type(rope).__name__}")
    if norm is not None and not isinstance(norm, QKNorm):
        raise TypeError(f"norm must be an anyrope.QKNorm or None, not {type(norm).__name__}")
    if v is not None:
        _check_values(q, k, v)
    places = host = None
    if cache is not None:
        xp = _kvcache.check(cache, k, v, seq_axis)
        multi = rope.streams > 1
        places, host = _kvcache.places(cache, xp, k, seq_axis, cache_index, positions, offset, multi)
    elif cache_index is not None:
        raise ValueError("cache_index was given without a cache: pass cache=anyrope.KVCache(...)")
    if norm is not None:
        q = norm.q(q, seq_axis=seq_axis)
        k = None if k is None else norm.k(k, seq_axis=seq_axis)
    if k is None:
        return Prologue(rope(q, positions=positions, offset=offset, seq_axis=seq_axis), None, v, None)
    q, k = rope(q, k, positions=positions, offset=offset, seq_axis=seq_axis)
    if cache is not None:
        cache = _kvcache.write(cache, xp, k, v, seq_axis, places, host)
    return Prologue(q, k, v, cache)


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
