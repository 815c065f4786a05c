"""``RotaryEmbedding``: a ``torch.nn.Module`` that rotates with :class:`anyrope.RoPE`; and
``AttentionPrologue``, the module of :func:`anyrope.prologue` (QK-norm, RoPE and the KV-cache
write), holding the norm's weights.

It holds the RoPE and nothing torch saves or casts: no parameters, no buffers, so ``state_dict()``
is empty. Its tables are never stored in the module: anyrope forms them for each call (cached
per dtype and device where the positions are known on the host), so ``model.to(torch.bfloat16)``,
``.half()`` and meta-device initialisation followed by ``to_empty`` cannot round or lose them,
and compiled graphs see no table of a fixed length.

While ``torch.onnx.export`` traces it, a call that the standard ONNX ``RotaryEmbedding`` op
expresses becomes that one node (:mod:`anyrope.layers._onnx` says which calls do); the others
export as anyrope's elementwise form.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .._qknorm import NormForm, QKNorm
from .._rope import rotary_of
from ._build import LayerBase, make_rope
from ._onnx import standard_op, unexpressed
from ._prologue_build import PrologueBase

__all__ = ["AttentionPrologue", "RotaryEmbedding"]

_is_exporting = getattr(torch.compiler, "is_exporting", lambda: True)  # older torch: ask torch.onnx alone
_serials = itertools.count()  # each layer's own number, shared by its copies (see _onnx._warned)


class RotaryEmbedding(LayerBase, torch.nn.Module):
    """Rotary position embedding as a ``torch.nn.Module``.

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments in
        ``options`` (``base=``, ``layout=``, ``scaling=``, ``max_position=``, ...).
        ``RotaryEmbedding.from_hf_config(config)`` reads a Hugging Face config.
    onnx_op : bool, optional
        Under ``torch.onnx.export``: None (the default) exports each call as ONNX's
        ``RotaryEmbedding`` op where the op expresses it, and as anyrope's elementwise form
        elsewhere; False always exports the elementwise form; True is None, and raises here
        unless the op expresses this RoPE (it needs ``max_position``, its caches' length, and
        fixed frequencies). Calls the op cannot take whatever the RoPE (float64, other shapes,
        ``inplace=True``) export elementwise. With None, a layer whose RoPE lacks only
        ``max_position`` warns once (a ``UserWarning`` during the export) that it exports
        elementwise and what to pass. Eager and compiled calls ignore it.

    Examples
    --------
    >>> import torch
    >>> from anyrope.layers.torch import RotaryEmbedding
    >>> rotary = RotaryEmbedding(64, base=500000.0, max_position=4096)
    >>> q, k = rotary(torch.ones(2, 8, 5, 64), torch.ones(2, 2, 5, 64), offset=3)
    >>> q.shape, len(rotary.state_dict())
    (torch.Size([2, 8, 5, 64]), 0)
    """

    def __init__(self, rope: Any, *, onnx_op: bool | None = None, **options: Any) -> None:
        super().__init__()
        if onnx_op is not None and not isinstance(onnx_op, bool):
            raise TypeError(f"onnx_op must be None, True or False, not {onnx_op!r}")
        self._rope = make_rope(rope, options, "RotaryEmbedding")
        why = unexpressed(rotary_of(self._rope)) if onnx_op else None
        if why is not None:  # here rather than in torch.onnx.export, which would retry and bury it
            raise ValueError(f"onnx_op=True, but ONNX's RotaryEmbedding op cannot express {why}")
        self.onnx_op = onnx_op
        self._serial = next(_serials)

    def forward(
        self,
        q: Any,
        k: Any = None,
        *,
        positions: Any = None,
        offset: Any = 0,
        seq_axis: int = -2,
        inplace: bool = False,
        inverse: bool = False,
    ) -> Any:
        """``rope(q, k, positions=..., offset=..., seq_axis=..., inplace=..., inverse=...)``: the
        rotated q, or (q, k), with :meth:`anyrope.RoPE.__call__`'s arguments and errors."""
        # torch.export first: eager calls then never load torch.onnx, and dynamo folds both to False
        # (the ONNX op turns one way only: an inverse call exports as the generic code)
        if (
            inverse is False
            and self.onnx_op is not False
            and _is_exporting()
            and torch.onnx.is_in_onnx_export()
        ):
            rotated = standard_op(self._rope, q, k, positions, offset, seq_axis, inplace=inplace, layer=self)
            if rotated is not None:
                return rotated
        return self._rope(
            q, k, positions=positions, offset=offset, seq_axis=seq_axis, inplace=inplace, inverse=inverse
        )

    def extra_repr(self) -> str:
        return repr(self._rope) + ("" if self.onnx_op is None else f", onnx_op={self.onnx_op}")


class AttentionPrologue(PrologueBase, torch.nn.Module):
    """What attention does to q, k and v after their projections, as a ``torch.nn.Module``:
    :func:`anyrope.prologue` with the layer's RoPE and QK-norm (its weights are the module's
    parameters, ``q_weight`` and ``k_weight``).

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments in
        ``options``.
    qk_norm : bool, optional
        Whether each head of q and k is RMS-normalised before the rotation (Qwen3, Gemma 3, OLMo
        2); False: the layer rotates and writes the cache, and holds no parameters.
    eps, rounding, across_heads
        As :class:`anyrope.QKNorm` takes them.
    norm_offset : float, optional
        :class:`anyrope.QKNorm`'s ``offset``: 1.0 for Gemma's ``1 + w`` (its weights then start
        at zero, as Gemma's do; otherwise at one).
    heads, kv_heads : int, optional
        The head counts of q and k, needed with ``across_heads=True`` (OLMo 2), whose weights are
        ``heads * head_dim`` and ``kv_heads * head_dim`` long.

    Examples
    --------
    >>> import torch, anyrope
    >>> from anyrope.layers.torch import AttentionPrologue
    >>> prologue = AttentionPrologue(64, base=1_000_000.0, eps=1e-6)
    >>> cache = anyrope.KVCache(torch.zeros(2, 2, 128, 64), torch.zeros(2, 2, 128, 64))
    >>> q, k, v = torch.ones(2, 8, 5, 64), torch.ones(2, 2, 5, 64), torch.ones(2, 2, 5, 64)
    >>> out = prologue(q, k, v, offset=3, cache=cache)
    >>> out.q.shape, sorted(prologue.state_dict())
    (torch.Size([2, 8, 5, 64]), ['k_weight', 'q_weight'])
    """

    def __init__(
        self,
        rope: Any,
        *,
        qk_norm: bool = True,
        eps: float = 1e-6,
        norm_offset: float = 0.0,
        across_heads: bool = False,
        rounding: str = "before_weight",
        heads: int | None = None,
        kv_heads: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        found = self._set_up(
            rope, options, qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads
        )
        if found is not None:
            q_shape, k_shape, from_zero = found
            fill = torch.zeros if from_zero else torch.ones
            self.q_weight, self.k_weight = (
                torch.nn.Parameter(fill(q_shape)),
                torch.nn.Parameter(fill(k_shape)),
            )
            _ = self.norm  # made here, outside any compiler

    @classmethod
    def from_modules(cls, rope: Any, q_norm: Any, k_norm: Any, **options: Any) -> AttentionPrologue:
        """The prologue of a model's own ``q_norm`` and ``k_norm`` (read as
        :meth:`anyrope.QKNorm.from_modules` reads them, for ``rope``'s head_dim), holding their
        weight parameters themselves: training the layer trains the model's weights."""
        layer = cls(rope, qk_norm=False, **options)
        norm = QKNorm.from_modules(q_norm, k_norm, head_dim=layer.rope.head_dim)
        layer._form = NormForm(norm.eps, norm.offset, norm.across_heads, norm.rounding)
        layer.q_weight, layer.k_weight = q_norm.weight, k_norm.weight
        layer._kept_norm = norm  # of these very weights
        return layer

    def _norm_weights(self) -> tuple[Any, Any]:
        return self.q_weight, self.k_weight

    forward = PrologueBase.call

    def extra_repr(self) -> str:
        return f"{self._rope!r}, {self._form_repr()}"
