"""QK-norm: the RMS norm of each head of q and k that Qwen3, Gemma 3, OLMo 2 and others apply
before RoPE, rounded where each family rounds.

The arithmetic is the families' own, step for step, in the array API: x in float32 (float64
stays float64), the mean of its squares over a head's features (over every head's, for OLMo 2's
``across_heads``), times the reciprocal square root of that plus ``eps`` (by the library's own
``rsqrt`` where it has one, as the models call it), then the weight: after rounding to x's dtype
(``rounding="before_weight"``: Llama-style, Qwen3) or in float32 before it (``"after_weight"``:
Gemma, OLMo 2), ``offset`` added to the weight first (Gemma's ``1 + w``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._args import check_bool, check_int, check_number, shown
from ._compat import namespace_and_library, rsqrt
from ._dtypes import compute_dtype

__all__ = ["ROUNDINGS", "NormForm", "QKNorm", "norm_form"]

#: Where the weight meets the normalised features: after they are rounded to x's dtype, or in
#: float32 before they are.
ROUNDINGS = ("before_weight", "after_weight")


class NormForm(NamedTuple):
    """A :class:`QKNorm`'s arguments but its weights."""

    eps: float
    offset: float
    across_heads: bool
    rounding: str


def norm_form(
    eps: Any, offset: Any, across_heads: Any, rounding: Any, *, offset_arg: str = "offset"
) -> NormForm:
    """A norm's form, checked: a ValueError or TypeError names the argument (the offset as
    ``offset_arg``, the caller's name for it)."""
    eps = check_number(eps, "eps")
    offset = check_number(offset, offset_arg, low=-float("inf"))
    across_heads = check_bool(across_heads, "across_heads")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={shown(rounding)} must be one of {', '.join(map(repr, ROUNDINGS))}")
    return NormForm(eps, offset, across_heads, str(rounding))


class QKNorm:
    """RMS norm of each head of q and k, as the model's own ``q_norm`` and ``k_norm`` compute it.

    Parameters
    ----------
    q_weight, k_weight : array
        The weights, in q's library and on its device: ``(head_dim,)``, one per head
        ``(heads, head_dim)``, or with ``across_heads`` one for every feature of a token,
        ``(heads * head_dim,)`` (OLMo 2). k's may be for another head count (grouped-query
        attention).
    eps : float
        Added to the mean square before the reciprocal square root.
    offset : float
        Added to the weight: ``1.0`` for Gemma's ``(1 + w)``.
    across_heads : bool
        One norm over all heads of a token (OLMo 2 normalises the whole projection), not one per head.
    rounding : {"before_weight", "after_weight"}
        ``"before_weight"`` rounds the normalised features to x's dtype, then multiplies by the
        weight (Llama's RMSNorm, Qwen3); ``"after_weight"`` multiplies in float32 and rounds
        once (Gemma, OLMo 2). The result is in x's dtype either way.

    Examples
    --------
    >>> import numpy as np, anyrope
    >>> norm = anyrope.QKNorm(np.ones(64, np.float32), np.ones(64, np.float32), eps=1e-6)
    >>> q = np.full((1, 2, 3, 64), 3.0, np.float32)
    >>> out = norm.q(q)  # 3 / sqrt(9 + 1e-6) everywhere
    >>> out.dtype, round(float(out[0, 0, 0, 0]), 6)
    (dtype('float32'), 1.0)
    """

    def __init__(
        self,
        q_weight: Any,
        k_weight: Any,
        *,
        eps: float = 1e-6,
        offset: float = 0.0,
        across_heads: bool = False,
        rounding: str = "before_weight",
    ) -> None:
        for arg, weight in (("q_weight", q_weight), ("k_weight", k_weight)):
            namespace_and_library((arg, weight))  # an array of a known library
            if len(weight.shape) not in (1, 2) or (across_heads and len(weight.shape) != 1):
                wanted = "(heads * head_dim,)" if across_heads else "(head_dim,) or (heads, head_dim)"
                raise ValueError(f"{arg} must have shape {wanted}, not {tuple(weight.shape)}")
        self.q_weight, self.k_weight = q_weight, k_weight
        self.eps, self.offset, self.across_heads, self.rounding = norm_form(
            eps, offset, across_heads, rounding
        )

    @classmethod
    def from_modules(cls, q_norm: Any, k_norm: Any, *, head_dim: int) -> QKNorm:
        """The QKNorm that a model's own ``q_norm`` and ``k_norm`` compute: torch modules (the
        RMS norms of transformers' models, whatever their class), holding ``weight`` and
        ``variance_epsilon`` or ``eps``.

        Where the weight meets the normalised features, and whether it is offset by one, is
        found by running each module on probes (in its weight's dtype and in float32, on its
        device) and keeping the form whose results equal the module's bit for bit; a weight of more than
        ``head_dim`` entries is one norm across a token's heads (OLMo 2). A module that
        computes none of these forms is refused, with its class named.
        """
        import torch  # the modules are torch's

        head_dim = check_int(head_dim, "head_dim", low=1)
        found = [
            _read_module(torch, module, arg, head_dim)
            for arg, module in (("q_norm", q_norm), ("k_norm", k_norm))
        ]
        (q_weight, eps, across, rounding, offset), (k_weight, *k_form) = found
        if k_form != [eps, across, rounding, offset]:
            raise ValueError(
                f"q_norm and k_norm compute different norms ({found[0][1:]} and {tuple(k_form)}); build a QKNorm yourself"
            )
        return cls(q_weight, k_weight, eps=eps, offset=offset, across_heads=across, rounding=rounding)

    def __repr__(self) -> str:
        shapes = f"q_weight {tuple(self.q_weight.shape)}, k_weight {tuple(self.k_weight.shape)}"
        flags = f"eps={self.eps!r}, offset={self.offset!r}, across_heads={self.across_heads}"
        return f"QKNorm({shapes}, {flags}, rounding={self.rounding!r})"

    def q(self, q: Any, *, seq_axis: int = -2) -> Any:
        """q normalised, in its dtype: ``(..., heads, seq, head_dim)`` with ``seq_axis=-2``, or
        ``(batch, seq, heads, head_dim)`` with ``seq_axis=-3``."""
        return self._norm(q, self.q_weight, "q", "q_weight", seq_axis)

    def k(self, k: Any, *, seq_axis: int = -2) -> Any:
        """k normalised, in its dtype (see :meth:`q`)."""
        return self._norm(k, self.k_weight, "k", "k_weight", seq_axis)

    def check(self, q: Any, k: Any, *, seq_axis: int = -2) -> None:
        """That the weights fit q and k (k may be None), as :meth:`q` and :meth:`k` check them:
        for a fused kernel that normalises them itself."""
        self._check(q, self.q_weight, "q", "q_weight", seq_axis)
        if k is not None:
            self._check(k, self.k_weight, "k", "k_weight", seq_axis)

    def _check(self, x: Any, weight: Any, arg: str, weight_arg: str, seq_axis: int) -> tuple[Any, int, int]:
        """The namespace, head count and head axis of x, its weight's shape checked against them."""
        xp, _ = namespace_and_library((arg, x), (weight_arg, weight))
        heads, head_axis = _heads(x, arg, seq_axis, needed=self.across_heads or len(weight.shape) == 2)
        head_dim = x.shape[-1]
        wanted = {1: (heads * head_dim,) if self.across_heads else (head_dim,), 2: (heads, head_dim)}
        if tuple(weight.shape) != wanted[len(weight.shape)]:
            raise ValueError(
                f"{weight_arg} has shape {tuple(weight.shape)}, but {arg} of shape {tuple(x.shape)} "
                f"(seq_axis={seq_axis}) needs {wanted[len(weight.shape)]}"
            )
        return xp, heads, head_axis

    def _norm(self, x: Any, weight: Any, arg: str, weight_arg: str, seq_axis: int) -> Any:
        xp, heads, head_axis = self._check(x, weight, arg, weight_arg, seq_axis)
        head_dim = x.shape[-1]
        work = compute_dtype(xp, x.dtype)
        h = xp.astype(x, work)
        squares = (
            _token_mean(xp, h * h, head_axis) if self.across_heads else xp.mean(h * h, axis=-1, keepdims=True)
        )
        h = h * rsqrt(xp, squares + self.eps)
        if len(weight.shape) == 2 or self.across_heads:  # one row per head, along the head axis
            weight = xp.reshape(weight, (heads, *(1,) * (-head_axis - 2), head_dim))
        if self.rounding == "before_weight":
            scale = weight + self.offset if self.offset else weight
            out = scale * xp.astype(h, x.dtype)
        else:
            wide = xp.astype(weight, work)
            out = h * (self.offset + wide if self.offset else wide)
        return out if out.dtype == x.dtype else xp.astype(out, x.dtype)


def _heads(x: Any, arg: str, seq_axis: int, *, needed: bool) -> tuple[int, int]:
    """The head count of ``x`` and its head axis (negative): the axis before the sequence with
    ``seq_axis=-2``, the one after it with ``seq_axis=-3``; (1, 0) where there is none and none
    is ``needed``."""
    if seq_axis == -2 and len(x.shape) >= 3:
        return int(x.shape[-3]), -3
    if seq_axis == -3 and len(x.shape) >= 3:
        return int(x.shape[-2]), -2
    if not needed and seq_axis in (-2, -3):
        return 1, 0
    raise ValueError(
        f"{arg} of shape {tuple(x.shape)} with seq_axis={seq_axis} has no head axis a QKNorm can "
        "find: pass (..., heads, seq, head_dim) with seq_axis=-2 or (batch, seq, heads, head_dim) "
        "with seq_axis=-3"
    )


def _token_mean(xp: Any, squares: Any, head_axis: int) -> Any:
    """The mean of ``squares`` over every head and feature of a token, summed as the models sum
    their projection's features, heads then features (``(..., heads * head_dim)`` contiguous),
    shaped to broadcast back against x."""
    shape = tuple(squares.shape)
    if head_axis == -3:  # (..., heads, seq, dim) -> (..., seq, heads, dim)
        order = (*range(len(shape) - 3), len(shape) - 2, len(shape) - 3, len(shape) - 1)
        squares = xp.permute_dims(squares, order)
    flat = xp.reshape(squares, (*squares.shape[:-2], squares.shape[-2] * squares.shape[-1]))
    mean = xp.mean(flat, axis=-1, keepdims=True)  # (..., seq, 1)
    if head_axis == -3:
        return xp.reshape(mean, (*shape[:-3], 1, shape[-2], 1))
    return xp.reshape(mean, (*shape[:-2], 1, 1))


def _read_module(torch: Any, module: Any, arg: str, head_dim: int) -> tuple[Any, float, bool, str, float]:
    """(weight, eps, across_heads, rounding, offset) of one torch norm module, its form found by
    running it on probes (see :meth:`QKNorm.from_modules`)."""
    kind = type(module).__name__
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, torch.Tensor) or eps is None or not callable(module):
        raise TypeError(f"{arg} ({kind}) is not an RMS norm module with a weight and an eps")
    weight = weight.detach()
    size = weight.numel()
    if weight.ndim != 1 or size % head_dim:
        raise ValueError(
            f"{arg} ({kind}) has a weight of shape {tuple(weight.shape)}, not of head_dim={head_dim} or a multiple"
        )
    across = size != head_dim
    generator = torch.Generator().manual_seed(0)
    forms = [(rounding, offset) for rounding in ROUNDINGS for offset in (0.0, 1.0)]
    # the module's own dtype tells where it rounds; float32 whether the weight is offset
    for dtype in dict.fromkeys((weight.dtype, torch.float32)):
        x = (torch.randn(2, 3, size, generator=generator) * 3).to(dtype=dtype, device=weight.device)
        with torch.no_grad():
            want = module(x)
        heads = x.reshape(2, 3, size // head_dim, head_dim)
        forms = [
            (rounding, offset)
            for rounding, offset in forms
            if _same(
                QKNorm(weight, weight, eps=float(eps), offset=offset, across_heads=across, rounding=rounding)
                .q(heads, seq_axis=-3)
                .reshape(want.shape),
                want,
            )
        ]
    if not forms:
        raise ValueError(
            f"{arg} ({kind}) computes none of the RMS norms a QKNorm takes (the weight after or "
            "before rounding, offset by 0 or 1, by the library's rsqrt); build a QKNorm yourself"
        )
    rounding, offset = forms[0]
    return weight, float(eps), across, rounding, offset


def _same(got: Any, want: Any) -> bool:
    return bool(got.dtype == want.dtype and got.shape == want.shape and (got == want).all())
