"""What every framework's ``AttentionPrologue`` shares, framework-free: the norm's form, checked
when the layer is made, the shapes and first values of its weights, and the call."""

from __future__ import annotations

from typing import Any

from .._args import check_bool, shown
from .._prologue import Prologue, prologue
from .._qknorm import NormForm, QKNorm
from .._qknorm import norm_form as _form
from ._build import LayerBase, make_rope

__all__ = ["PrologueBase", "norm_form"]


def norm_form(
    qk_norm: Any, eps: Any, norm_offset: Any, across_heads: Any, rounding: Any, heads: Any, kv_heads: Any,
    head_dim: int,
) -> tuple[NormForm, tuple[tuple[int], tuple[int]]] | None:  # fmt: skip
    """The norm's form and its two weights' shapes, checked; None with ``qk_norm=False``.
    Weights are ``(head_dim,)`` each, or across heads (OLMo 2) ``(heads * head_dim,)`` and
    ``(kv_heads * head_dim,)``."""
    if not check_bool(qk_norm, "qk_norm"):
        return None
    form = _form(eps, norm_offset, across_heads, rounding, offset_arg="norm_offset")
    if not form.across_heads:
        return form, ((head_dim,), (head_dim,))
    counts = []
    for arg, count in (("heads", heads), ("kv_heads", kv_heads)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(
                f"across_heads=True normalises each token's whole projection, so its weights need the head "
                f"counts: pass heads= and kv_heads= (positive ints), not {arg}={shown(count)}"
            )
        counts.append(count * head_dim)
    return form, ((counts[0],), (counts[1],))


class PrologueBase(LayerBase):
    """The part of each ``AttentionPrologue`` that is the same in every framework: its RoPE, its
    norm of the current weights, and its call of :func:`anyrope.prologue`. A mixin: the
    framework's class holds the weights and says where (:meth:`_norm_weights`)."""

    _form: NormForm | None
    _kept_norm: QKNorm | None
    _keeps_norm = True  # False where a framework traces modules apart (NNX): a norm made once would hold a trace's arrays

    def _set_up(
        self, rope: Any, options: dict[str, Any], qk_norm: Any, eps: Any, norm_offset: Any, across_heads: Any,
        rounding: Any, heads: Any, kv_heads: Any,
    ) -> tuple[tuple[int], tuple[int], bool] | None:  # fmt: skip
        """The layer's RoPE and norm form, checked; then its two weights' shapes, and whether
        they start at zero (Gemma's ``1 + w``) rather than one; None without a norm."""
        self._rope = make_rope(rope, options, "AttentionPrologue")
        found = norm_form(
            qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads, self._rope.head_dim
        )
        self._form, self._kept_norm = None if found is None else found[0], None
        if found is None:
            return None
        form, (q_shape, k_shape) = found
        return q_shape, k_shape, bool(form.offset)

    def _norm_weights(self) -> tuple[Any, Any]:  # pragma: no cover - each framework's class has its own
        raise NotImplementedError

    @property
    def norm(self) -> QKNorm | None:
        """The layer's norm as an :class:`anyrope.QKNorm` of its weights (None for a layer made
        with ``qk_norm=False``). Made once per pair of weight objects, whose values and dtype may
        change (training, casts, loading): the checks of its construction would otherwise run at
        every call, where compilers cannot trace them."""
        if self._form is None:
            return None
        q_weight, k_weight = self._norm_weights()
        if not self._keeps_norm:
            return QKNorm(q_weight, k_weight, **self._form._asdict())
        kept = self._kept_norm
        if kept is None or kept.q_weight is not q_weight or kept.k_weight is not k_weight:
            kept = QKNorm(q_weight, k_weight, **self._form._asdict())
            self._kept_norm = kept
        return kept

    def call(
        self,
        q: Any,
        k: Any = None,
        v: Any = None,
        *,
        positions: Any = None,
        offset: Any = 0,
        seq_axis: int = -2,
        cache: Any = None,
        cache_index: Any = None,
    ) -> Prologue:
        """``anyrope.prologue(q, k, v, rope=..., norm=..., positions=..., offset=..., seq_axis=...,
        cache=..., cache_index=...)`` with the layer's RoPE and norm: ``(q, k, v, cache)``. Each
        framework's layer calls it as it calls a module (torch's ``forward``, MLX's ``__call__``)."""
        return prologue(
            q, k, v, rope=self._rope, positions=positions, offset=offset, seq_axis=seq_axis, norm=self.norm,
            cache=cache, cache_index=cache_index,
        )  # fmt: skip

    def _form_repr(self) -> str:
        if self._form is None:
            return "qk_norm=False"
        form = self._form
        return f"eps={form.eps}, norm_offset={form.offset}, across_heads={form.across_heads}, rounding={form.rounding!r}"
