"""MLX: the rotation as one elementwise expression, compiled by ``mx.compile``.

The generic path splits x into its two halves and joins the results with a concatenation (or a
stack), which MLX cannot fuse. Here each pair is an axis of length 2 instead, and the partner
of every element is the same array read backwards along that axis, so the whole rotation is
``x * cos + partner * signed``, signed = (-sin, sin) in the layout's feature order
(:func:`anyrope._tables.signed_sin`): one fused kernel (see docs/performance.md), and bit for
bit the generic result (a - b*s and a + b*(-s) round alike; the inverse subtracts). MLX
differentiates it itself, and it runs inside ``mx.compile`` too. Where cached rows serve the
call, the signed table is cached too: stacked per call, it costs two more passes (a negation
and a concatenation, which MLX does not fuse).

``mx.fast.rope`` is not used: it forms angles in float32, which would break the table
precision this library guarantees (it is off by position * 6e-8 rad).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._job import Job, Launch, offers
from .._pairs import broadcast_table
from .._tables import signed_sin

__all__ = ["prepare"]

_lock = threading.Lock()
_compiled: dict[tuple[Any, ...], Callable[[Any, Any, Any], Any]] = {}  # at most 2 x 2 x a few axes


def _turn(mx: Any, x: Any, cos: Any, signed: Any, layout: str, inverse: bool, seq_axis: int) -> Any:
    pairs = cos.shape[-1]
    cos, signed = broadcast_table(mx, cos, x.ndim, seq_axis), broadcast_table(mx, signed, x.ndim, seq_axis)
    lead = x.shape[:-1]
    rotary = x[..., : 2 * pairs] if 2 * pairs < x.shape[-1] else x
    if layout == "half":  # (..., 2, pairs): feature i pairs with i + pairs
        work = mx.reshape(rotary, (*lead, 2, pairs))
        partner = work[..., ::-1, :]
        cos, signed = mx.expand_dims(cos, -2), mx.reshape(signed, (*signed.shape[:-1], 2, pairs))
    else:  # (..., pairs, 2): feature 2i pairs with 2i + 1
        work = mx.reshape(rotary, (*lead, pairs, 2))
        partner = work[..., ::-1]
        cos, signed = mx.expand_dims(cos, -1), mx.reshape(signed, (*signed.shape[:-1], pairs, 2))
    wide = cos.dtype
    work, partner = work.astype(wide), partner.astype(wide)
    turned = work * cos - partner * signed if inverse else work * cos + partner * signed
    turned = mx.reshape(turned.astype(x.dtype), (*lead, 2 * pairs))
    return turned if rotary is x else mx.concatenate([turned, x[..., 2 * pairs :]], axis=-1)


def prepare(job: Job) -> Launch:
    key = (job.layout, job.inverse, job.seq_axis)
    fn = _compiled.get(key)
    if fn is None:
        import mlx.core as mx

        layout, inverse, seq_axis = key

        def turn(x: Any, cos: Any, signed: Any) -> Any:
            return _turn(mx, x, cos, signed, layout, inverse, seq_axis)

        with _lock:
            fn = _compiled.setdefault(key, mx.compile(turn))
    xp, seq, compute, layout = job.ctx.xp, job.seq, job.compute, job.layout
    if offers(job, "signed"):  # made once for q and k

        def shared(x: Any, out: Any, source: Any) -> Any:  # noqa: ARG001 - MLX writes no array in place
            return fn(x, *source.signed(seq, compute, layout))

        return shared

    def own(x: Any, out: Any, source: Any) -> Any:  # noqa: ARG001 - tables of this array alone
        cos, sin = source.tables(seq, compute)
        return fn(x, cos, signed_sin(xp, sin, layout))

    return own
