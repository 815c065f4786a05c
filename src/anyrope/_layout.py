"""The two ways models pair features for rotation, and conversion between them.

"half" pairs feature i with i + r/2 (GPT-NeoX, Hugging Face, ``mlx`` ``traditional=False``);
"interleaved" pairs 2i with 2i + 1 (RoFormer, GPT-J, Meta Llama, ``traditional=True``). Pair i
turns by the same angle in both, so the layouts differ only by a fixed permutation of features.
"""

from __future__ import annotations

from typing import Any, Literal

from ._args import check_int
from ._compat import array_namespace

__all__ = ["LAYOUTS", "Layout", "normalize_layout", "permute_qk_weight", "to_layout"]

Layout = Literal["half", "interleaved"]

#: Every accepted layout name, mapped to the canonical one.
LAYOUTS: dict[str, Layout] = {
    "half": "half",
    "neox": "half",
    "hf": "half",
    "interleaved": "interleaved",
    "gptj": "interleaved",
    "meta": "interleaved",
}


def normalize_layout(layout: str, *, arg: str = "layout") -> Layout:
    """The canonical name of ``layout``, or a ValueError listing the accepted names."""
    try:
        return LAYOUTS[layout.lower()] if isinstance(layout, str) else LAYOUTS[layout]
    except (KeyError, TypeError):
        accepted = ", ".join(repr(name) for name in LAYOUTS)
        raise ValueError(f"{arg}={layout!r} is not a known layout; use one of {accepted}") from None


def check_rotary_dim(rotary_dim: int, head_dim: int, *, arg: str = "rotary_dim") -> int:
    return check_int(
        rotary_dim,
        arg,
        low=2,
        high=head_dim,
        even=True,
        why=f" (features rotate in pairs, head_dim={head_dim})",
    )


def _permute_last(xp: Any, x: Any, src: Layout, dst: Layout, rotary_dim: int) -> Any:
    if src == dst:
        return x
    head_dim = x.shape[-1]
    rot, tail = x[..., :rotary_dim], x[..., rotary_dim:]
    if src == "half":  # (first halves, second halves) -> pairs side by side
        half = rotary_dim // 2
        paired = xp.stack([rot[..., :half], rot[..., half:]], axis=-1)
        rot = xp.reshape(paired, (*x.shape[:-1], rotary_dim))
    else:
        rot = xp.concat([rot[..., 0::2], rot[..., 1::2]], axis=-1)
    return rot if rotary_dim == head_dim else xp.concat([rot, tail], axis=-1)


def to_layout(x: Any, src: str, dst: str, *, rotary_dim: int | None = None) -> Any:
    """Permute the last axis of ``x`` from layout ``src`` to layout ``dst``.

    The permutation commutes with rotation::

        to_layout(apply(x, cos, sin, layout=src), src, dst)
            == apply(to_layout(x, src, dst), cos, sin, layout=dst)

    Parameters
    ----------
    x : array
        Any array whose last axis holds the head features.
    src, dst : str
        Layout names ("half", "interleaved" or an alias).
    rotary_dim : int, optional
        Only the first ``rotary_dim`` features are permuted (partial rotary); the rest stay.
        Defaults to the whole last axis.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> anyrope.to_layout(np.arange(6), "half", "interleaved")
    array([0, 3, 1, 4, 2, 5])
    >>> anyrope.to_layout(np.arange(6), "interleaved", "half")
    array([0, 2, 4, 1, 3, 5])
    """
    xp = array_namespace(x=x)
    src_, dst_ = normalize_layout(src, arg="src"), normalize_layout(dst, arg="dst")
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (the features to permute)")
    head_dim = x.shape[-1]
    rotary_dim = check_rotary_dim(head_dim if rotary_dim is None else rotary_dim, head_dim)
    return _permute_last(xp, x, src_, dst_, rotary_dim)


def permute_qk_weight(
    weight: Any, num_heads: int, src: str, dst: str, *, rotary_dim: int | None = None
) -> Any:
    """Permute a q or k projection from layout ``src`` to ``dst``, head by head.

    Converting a checkpoint trained with one layout so that a model using the other gives the
    same attention scores: the projection's output features are reordered within each head, so
    ``q @ k.T`` is unchanged after each side is rotated in its own layout.

    Parameters
    ----------
    weight : array
        Shape ``(num_heads * head_dim, hidden)``, as stored in ``nn.Linear`` (out, in), or a bias
        of shape ``(num_heads * head_dim,)``.
    num_heads : int
        Heads in this projection (the key/value head count for ``k_proj`` under GQA).
    src, dst : str
        Layout names. Meta's Llama checkpoints are "interleaved", Hugging Face's are "half".
    rotary_dim : int, optional
        Rotated features per head (partial rotary); defaults to the whole head.

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> w = np.arange(8).reshape(8, 1)  # two heads of four features
    >>> anyrope.permute_qk_weight(w, 2, "meta", "hf")[:, 0]
    array([0, 2, 1, 3, 4, 6, 5, 7])
    """
    xp = array_namespace(weight=weight)
    src_, dst_ = normalize_layout(src, arg="src"), normalize_layout(dst, arg="dst")
    num_heads = check_int(num_heads, "num_heads", low=1)
    if weight.ndim not in (1, 2):
        raise ValueError(
            f"weight must have shape (num_heads * head_dim, hidden) or (num_heads * head_dim,), "
            f"got {tuple(weight.shape)}"
        )
    out_features = weight.shape[0]
    if out_features % num_heads:
        raise ValueError(
            f"weight.shape[0]={out_features} is not divisible by num_heads={num_heads}; pass the "
            "head count of this projection (the key/value heads for k_proj)"
        )
    head_dim = out_features // num_heads
    rotary_dim = check_rotary_dim(head_dim if rotary_dim is None else rotary_dim, head_dim)
    if weight.ndim == 1:
        heads = xp.reshape(weight, (num_heads, head_dim))
        return xp.reshape(_permute_last(xp, heads, src_, dst_, rotary_dim), (out_features,))
    hidden = weight.shape[1]
    heads = xp.permute_dims(xp.reshape(weight, (num_heads, head_dim, hidden)), (0, 2, 1))
    moved = xp.permute_dims(_permute_last(xp, heads, src_, dst_, rotary_dim), (0, 2, 1))
    return xp.reshape(moved, (out_features, hidden))
