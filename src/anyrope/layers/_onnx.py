"""Calls of :class:`anyrope.layers.torch.RotaryEmbedding` as the standard ONNX ``RotaryEmbedding``
op (opset 23, ``torch.onnx.ops.rotary_embedding``) while ``torch.onnx.export`` traces them.

ONNX Runtime and TensorRT run that op as one fused kernel, where anyrope's own form exports as
a few dozen elementwise nodes. The op turns pair ``i`` of the token at position ``p`` by row
``p`` of a cos and a sin cache, so it expresses every rotation whose angles are ``p * inv_freq``
with frequencies fixed ahead of the call: plain RoPE, statically scaled frequencies (``Linear``,
``NTKAware``, ``YaRN``, ``Llama3``, ``Proportional``, ``MaxLengthAware``, and ``DynamicNTK`` or
``LongRoPE`` fixed by ``at_length``), both layouts, partial rotary, ``clockwise`` (sin negated),
offsets and positions. The caches hold positions ``0 .. max_position - 1``, formed by anyrope's
exact angle code in float64 on the host and rounded once to float32; q and k of 16 bits are
rotated in float32 and rounded once, as anyrope rotates them. ONNX Runtime refuses position ids
outside the caches, naming the value. torch releases without ``torch.onnx.ops`` export the
elementwise form.

Not expressible, so exported as anyrope's elementwise form: xPos (q and k scaled apart), M-RoPE
and axial RoPE (several positions per token), frequencies chosen by the sequence length
(``DynamicNTK``, ``LongRoPE``), a RoPE without ``max_position`` (the caches' length), float64
arrays (the op takes float16, bfloat16 and float32), arrays other than ``(batch, heads, seq,
head_dim)``, ``(batch, seq, heads, head_dim)`` and ``(batch, seq, head_dim)``, and in-place calls.
Of these, a layer whose RoPE lacks only ``max_position`` warns once while exporting: the user can
pass it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .._call import cos_sin
from .._compat import is_array
from .._memo import Memo
from .._plan import check_arrays
from .._positions import position_spec
from .._rope import RoPE, rotary_of
from .._rotary import Rotary

__all__ = ["standard_op", "unexpressed"]

# The caches as torch tensors, one pair per rotation: every layer that rotates alike hands the
# exporter the same tensor objects, which it stores once (fresh ones would be one copy a layer).
_caches: Memo[tuple[torch.Tensor, torch.Tensor]] = Memo(limit=16)


def unexpressed(rotary: Rotary) -> str | None:
    """Why the op cannot express any call of this RoPE, or None."""
    if rotary.xpos_scale_base is not None:
        return "xPos (it scales q and k apart)"
    if rotary.sections is not None:
        return "M-RoPE, axial RoPE or another stream map (several positions per token)"
    if rotary.spectrum.length_dependent:
        return (
            f"{type(rotary.scaling).__name__}, whose frequencies follow the sequence length (fix them "
            "with rope.at_length(n))"
        )
    if rotary.max_position is None:
        return _NO_LENGTH
    return None


_NO_LENGTH = "a RoPE without max_position, the length of the op's cos and sin caches"

# The layers already warned that they export elementwise for want of max_position, by their
# serial number: the exporter traces copies of a model, which are the same layers to its user.
_warned: set[int] = set()


def _warn_elementwise(layer: Any) -> None:
    """Tell the exporting user, once per layer, that ``layer`` exports elementwise only for want of
    ``max_position``, and what to pass instead."""
    serial = getattr(layer, "_serial", id(layer))  # a layer pickled before layers had one: its own id
    if serial in _warned:
        return
    _warned.add(serial)
    warnings.warn(
        f"torch.onnx.export: {layer!r} exports as anyrope's elementwise form (dozens of elementwise "
        "nodes) instead of ONNX's standard RotaryEmbedding operator, because its RoPE has no "
        "max_position, the length of the operator's cos and sin caches. Pass max_position= to the "
        "RoPE (e.g. RotaryEmbedding(head_dim, max_position=4096), or the model's "
        "max_position_embeddings) to export the standard operator; onnx_op=False keeps the "
        "elementwise form without this warning",
        UserWarning,
        stacklevel=3,
    )


# (ndim, sequence axis) of the arrays the op takes: (batch, heads, seq, d) as they are,
# (batch, seq, heads, d) and (batch, seq, d) through its 3-D form
_SHAPES = ((4, -2), (4, -3), (3, -2))


def _takes(x: Any, axis: int) -> bool:
    """Whether the op takes ``x``, its sequence on ``axis`` (negative)."""
    return x.dtype in (torch.float32, torch.float16, torch.bfloat16) and (x.ndim, axis) in _SHAPES


def _tables(rotary: Rotary, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin of positions ``0 .. length - 1``, shape (length, rotary_dim / 2)."""
    import numpy as np  # onnx needs NumPy, so it is there whenever torch.onnx.export runs

    rows = np.arange(length, dtype=np.int64)
    cos, sin = cos_sin(rotary, rows, np.zeros((), dtype=np.float32))  # float64 angles, rounded once
    # Real tensors, made outside the exporter's fake mode: a fake one cannot outlive its export
    with unset_fake_temporarily():
        return torch.from_numpy(cos), torch.from_numpy(sin)


def _rotated(x: Any, axis: int, ids: Any, caches: tuple[Any, Any], rotary: Rotary) -> Any:
    """``x`` rotated by the op: (batch, heads, seq, d) as it is; (batch, seq, heads, d) and
    (batch, seq, d) as the op's 3-D form (``num_heads`` heads side by side)."""
    heads = 0 if x.ndim == 4 and axis == -2 else (x.shape[2] if x.ndim == 4 else 1)
    form = x if heads == 0 else x.reshape(x.shape[0], x.shape[1], -1)
    ids = ids.to(torch.int64).expand(x.shape[0], x.shape[axis])  # (seq,) or (1 or batch, seq)
    out = torch.onnx.ops.rotary_embedding(
        form.to(torch.float32), *caches, ids, interleaved=rotary.layout == "interleaved",
        num_heads=heads, rotary_embedding_dim=0 if rotary.rotary_dim == rotary.head_dim else rotary.rotary_dim,
    )  # fmt: skip
    return out.to(x.dtype).reshape(x.shape)


def _checked(
    rotary: Rotary, arrays: list[tuple[str, Any]], positions: Any, offset: Any, seq_axis: Any
) -> Any:
    """(context, position spec, sequence axes) of a call, checked as ``rope(...)`` checks it,
    raising its errors."""
    given = [(arg, v) for arg, v in (("positions", positions), ("offset", offset)) if is_array(v)]
    ctx, axes = check_arrays(arrays, given, seq_axis=seq_axis, head_dim=rotary.head_dim)
    spec = position_spec(ctx.xp, ctx.env, positions, offset, traced=ctx.traced, streams=rotary.streams)
    for (arg, x), axis in zip(arrays, axes, strict=True):
        spec.check(x, arg, axis)
    return ctx, spec, axes


def standard_op(
    rope: RoPE, q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any, *, inplace: bool, layer: Any
) -> Any:
    """``rope(q, k, ...)`` through the standard op, or None where the op cannot express the call.

    Its arguments are checked as ``rope(...)`` checks them, raising its errors. A call the op
    would express but for the RoPE's ``max_position`` warns, once per ``layer``, saying so."""
    rotary = rotary_of(rope)
    arrays = [("q", q)] if k is None else [("q", q), ("k", k)]
    length = rotary.max_position  # the caches' rows
    # older torch releases lack the op: they export the elementwise form
    has_op = hasattr(torch.onnx, "ops") and hasattr(torch.onnx.ops, "rotary_embedding")
    why = unexpressed(rotary)
    if inplace or (why is not None and why is not _NO_LENGTH) or not has_op:
        return None
    ctx, spec, axes = _checked(rotary, arrays, positions, offset, seq_axis)
    if not all(_takes(x, axis) for (_, x), axis in zip(arrays, axes, strict=True)):
        return None
    if length is None:  # the op would take this call, given the caches' length
        _warn_elementwise(layer)
        return None
    # Kept while tracing, unlike every other memo: the exporter traces without dynamo, so no
    # guard reads it, and the tables are constants of the exported graph.
    key = (rotary.spectrum.static, rotary.clockwise, length)
    caches = _caches.get(key, lambda: _tables(rotary, length))
    out = [
        _rotated(x, axis, spec.positions(ctx.xp, ctx.env, x.shape[axis]), caches, rotary)
        for (_, x), axis in zip(arrays, axes, strict=True)
    ]
    return out[0] if k is None else (out[0], out[1])
