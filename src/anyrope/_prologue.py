"""The attention prologue: what a layer does to q, k and v between their projections and
attention, in one call: each head of q and k normalised (:class:`anyrope.QKNorm`), both rotated
by the RoPE, then k and v written into the layer's KV cache (:class:`anyrope.KVCache`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _kvcache
from ._call import rope_source
from ._compat import features_innermost, is_traced, namespace_and_library
from ._context import needs_grad
from ._fusion import Fusion, PrologueJob, PrologueLaunch
from ._kvcache import KVCache
from ._memo import Memo
from ._plan import more_signature, signature
from ._qknorm import QKNorm
from ._registry import choose_fusion, current_switch, fusion_libraries
from ._rope import RoPE

__all__ = ["Prologue", "explain_prologue", "prologue"]


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
    past the cache's size are refused where their values are on the host; on a GPU, for JAX and
    MLX and under a compiler nothing reads them there, and they are skipped). The arithmetic is the
    steps' own, in this order, so q and k equal ``rope(norm.q(q), norm.k(k))`` bit for bit on
    every library, eagerly and under ``torch.compile``, ``jax.jit`` and ``mx.compile``, and the
    cache holds those k and v; but for the fused call on CUDA tensors (Triton), which sums each
    head's squares in an order of its own: there q and k are within a few units in the last
    place of each head's largest value (one in 16-bit dtypes). ``anyrope.use_fast_paths(False)``
    runs the steps. A NaN (a head holding inf or NaN) comes out NaN on every path, but its bits
    in bfloat16 are the conversion's: torch's vector loops write 0xFFFF, its scalar code and the
    fused kernels 0x7FC0.
    """
    rotary = rope._rotary if isinstance(rope, RoPE) else None
    key = (
        None if rotary is None else _signature(q, k, v, positions, offset, seq_axis, norm, cache, cache_index)
    )
    kept = None if key is None else rotary.plans.find(key)
    multi = kept is not None and rope.streams > 1
    if isinstance(kept, _Apart):  # the steps apart, checked once for this signature
        places = host = None
        if cache is not None:
            places, host = _kvcache.places(cache, kept.xp, k, seq_axis, cache_index, positions, offset, multi)
        return _apart(rope, q, k, v, positions, offset, seq_axis, norm, cache, kept.xp, places, host)
    if kept is not None:  # a fused call whose signature was checked: only its values' work
        launch, plan, device_places = kept
        where = host = None
        if cache is not None:
            where, host = _kvcache.kept_places(
                cache, plan.ctx.xp, k, seq_axis, cache_index, positions, offset, multi
            )
        if cache is None or host is not None or device_places:
            q, k = launch(q, k, v, norm, cache, where, host, plan.source(rotary, positions, offset))
            return Prologue(q, k, v, cache)
    checked = _checked(rope, q, k, v, positions, offset, seq_axis, norm, cache, cache_index)
    xp, places, host = checked
    fused = _fused(rope, q, k, v, positions, offset, seq_axis, norm, cache, host)
    if fused[0] is not None:
        launch, plan, source, device_places = fused[0]
        if key is not None and plan.values is not None:
            rotary.plans.keep(key, (launch, plan, device_places))
        q, k = launch(q, k, v, norm, cache, places, host, source)
        return Prologue(q, k, v, cache)
    if key is not None and kept is None:
        rotary.plans.keep(key, _Apart(xp))
    return _apart(rope, q, k, v, positions, offset, seq_axis, norm, cache, xp, places, host)


class _Apart(NamedTuple):
    """A signature's kept decision to run the steps apart (no fusion takes its calls), with the
    cache's namespace: a later call checks only its values (the cache places)."""

    xp: Any


def _apart(
    rope: RoPE, q: Any, k: Any, v: Any, positions: Any, offset: Any, seq_axis: int,
    norm: QKNorm | None, cache: KVCache | None, xp: Any, places: Any, host: Any,
) -> Prologue:  # fmt: skip
    """The prologue's steps, one after the other: the norm, the rotation, the cache write."""
    if norm is not None:
        q = norm.q(q, seq_axis=seq_axis)
        k = None if k is None else norm.k(k, seq_axis=seq_axis)
    if k is None:
        return Prologue(rope(q, positions=positions, offset=offset, seq_axis=seq_axis), None, v, None)
    q, k = rope(q, k, positions=positions, offset=offset, seq_axis=seq_axis)
    if cache is not None:
        cache = _kvcache.write(cache, xp, k, v, seq_axis, places, host)
    return Prologue(q, k, v, cache)


def explain_prologue(
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
) -> str:
    """How :func:`prologue` would run with these arguments, and why: the fused kernel that takes
    the call, or the steps apart with each fusion's reason for not taking it. Checks the
    arguments as the call does, and writes nothing.

    Examples
    --------
    >>> import numpy as np, anyrope
    >>> q = np.ones((1, 4, 3, 64), np.float32)
    >>> print(anyrope.explain_prologue(q, rope=anyrope.RoPE(64)))
    steps apart: numba: no calls without k
    """
    _, _, host = _checked(rope, q, k, v, positions, offset, seq_axis, norm, cache, cache_index)
    found, why = _fused(rope, q, k, v, positions, offset, seq_axis, norm, cache, host, explain=True)
    if found is not None:
        return f"fused: {why[-1]}"
    return "steps apart: " + "; ".join(why)


def _checked(
    rope: Any, q: Any, k: Any, v: Any, positions: Any, offset: Any, seq_axis: int,
    norm: Any, cache: Any, cache_index: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The checks of a prologue's arguments that come before any step: the cache's namespace,
    and each token's place in it with its host copy (None where there is no cache)."""
    if not isinstance(rope, RoPE):
        raise TypeError(f"rope must be an anyrope.RoPE, not {type(rope).__name__}")
    if norm is not None and not isinstance(norm, QKNorm):
        raise TypeError(f"norm must be an anyrope.QKNorm or None, not {type(norm).__name__}")
    if v is not None:
        _check_values(q, k, v)
    xp = places = host = None
    if cache is not None:
        xp = _kvcache.check(cache, k, v, seq_axis)
        multi = rope.streams > 1
        places, host = _kvcache.places(cache, xp, k, seq_axis, cache_index, positions, offset, multi)
    elif cache_index is not None:
        raise ValueError("cache_index was given without a cache: pass cache=anyrope.KVCache(...)")
    return xp, places, host


# Each fusion's launch, prepared once per call signature (a PrologueJob).
_launches: Memo[PrologueLaunch] = Memo()


def _fused(
    rope: RoPE, q: Any, k: Any, v: Any, positions: Any, offset: Any, seq_axis: int,
    norm: QKNorm | None, cache: KVCache | None, host: Any, *, explain: bool = False,
) -> tuple[tuple[PrologueLaunch, Any, Any, bool] | None, list[str]]:  # fmt: skip
    """The launch of the fusion that takes this call, the call's rotation plan, its source of
    angles and whether the fusion reads the cache's places on the device, or None; and, with
    ``explain``, why each fusion before it (or every one) did not take it, then what runs."""
    xp, library = namespace_and_library(("q", q))
    traced = is_traced(xp, q, k)
    if traced and not explain:  # a compiler runs the steps apart: nothing here for it to trace
        return None, []
    switch = current_switch(traced)
    if traced or switch is False or library not in fusion_libraries() or k is None:
        if not explain:  # the reasons are only words, for explain_prologue
            return None, []
        return None, choose_fusion(_early(library, traced=traced, has_k=k is not None), switch)[1]
    if norm is not None:
        norm.check(q, k, seq_axis=seq_axis)
    plan, source = rope_source(rope._rotary, q, k, positions, offset, seq_axis)
    job = _job(plan, q, k, v, norm, cache, host, rope.streams)
    fusion, why = choose_fusion(job, switch)
    if fusion is None:
        return None, why
    launch = _launches.get((fusion.name, job), lambda: _prepared(fusion, job))
    return (launch, plan, source, fusion.device_places), [
        *why,
        f"{fusion.name} ({fusion.summary})",
    ] if explain else why


def _prepared(fusion: Fusion, job: PrologueJob) -> PrologueLaunch:
    return fusion.prepare(job)


def _job(plan: Any, q: Any, k: Any, v: Any, norm: QKNorm | None, cache: KVCache | None, host: Any,
         streams: int) -> PrologueJob:  # fmt: skip
    """What the call's signature fixes, as the fusions read it."""
    first, ctx = plan.jobs[0], plan.ctx
    same = q.dtype == k.dtype and (norm is None or norm.q_weight.dtype == q.dtype == norm.k_weight.dtype)
    # gradients of the norm's weights and of v too (the rotation's plan saw only q and k)
    others = (v,) if norm is None else (v, norm.q_weight, norm.k_weight)
    others += () if cache is None else (cache.k, cache.v)  # a cache that carries gradients
    grad = ctx.grad or (ctx.library == "torch" and needs_grad(others))
    return PrologueJob(
        library=ctx.library, device=ctx.env.device_type, dtype=first.key.dtype, traced=ctx.traced,
        grad=grad, layout=first.layout, inverse=first.inverse, compute=first.compute,
        seq_axis=first.seq_axis, shapes=(tuple(q.shape), tuple(k.shape), () if v is None else tuple(v.shape)),
        head_dim=int(q.shape[-1]), rounding=None if norm is None else norm.rounding,
        across_heads=norm is not None and norm.across_heads, one_dtype=same,
        features_innermost=features_innermost(ctx.xp, q) and features_innermost(ctx.xp, k),
        cache=None if cache is None else cache.layout, host_places=host is not None, streams=streams,
        xpos=plan.xpos, has_k=True,
    )  # fmt: skip


def _early(library: str, *, traced: bool, has_k: bool) -> PrologueJob:
    """A job for a call refused before its plan is looked up: only what refuses it is true."""
    return PrologueJob(
        library=library, device="", dtype="", traced=traced, grad=False, layout="", inverse=False,
        compute=None, seq_axis=-2, shapes=((),), head_dim=0, rounding=None, across_heads=False,
        one_dtype=True, features_innermost=True, cache=None, host_places=False, streams=1, xpos=False, has_k=has_k,
    )  # fmt: skip


def _signature(
    q: Any, k: Any, v: Any, positions: Any, offset: Any, seq_axis: Any,
    norm: QKNorm | None, cache: KVCache | None, cache_index: Any,
) -> tuple[Any, ...] | None:  # fmt: skip
    """What a fused prologue call's checks and choices read, as a key among its RoPE's plans (see
    :func:`anyrope._plan.signature`): the rotation's signature, and v's, the norm's weights', the
    cache's arrays' and cache_index's, with the norm's form and the cache's layout; None where a
    part keeps none (a traced call, lists, arrays of a library without a signer)."""
    if (
        k is None
        or not isinstance(norm, (QKNorm, type(None)))
        or not isinstance(cache, (KVCache, type(None)))
    ):
        return None  # the checks name what is wrong
    head = signature(q, k, positions, offset, seq_axis, False, False)
    if head is None or (cache is None and cache_index is not None):
        return None
    weights = (None, None) if norm is None else (norm.q_weight, norm.k_weight)
    stores = (None, None, None) if cache is None else (cache.k, cache.v, cache_index)
    arrays = more_signature(q, v, *weights, *stores)
    if arrays is None:
        return None
    forms = (type(norm), None if norm is None else (norm.rounding, norm.across_heads))
    stored = (None,) if cache is None else (cache.layout, _kvcache.writes_form(cache))
    return ("prologue", head, arrays, *forms, type(cache), *stored)


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
