"""``RotaryEmbedding``: an ``mlx.nn.Module`` that rotates with :class:`anyrope.RoPE`; and
``AttentionPrologue``, the module of :func:`anyrope.prologue` (QK-norm, RoPE and the KV-cache
write), holding the norm's weights.

It takes ``rope(...)``'s call, and ``mlx.nn.RoPE``'s (``x, offset``), so it drops into mlx-lm
models and other MLX code in place of ``nn.RoPE``. It holds no arrays: ``parameters()`` is
empty, ``set_dtype`` leaves the rotation exact, and weights files see no change.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._build import LayerBase, make_rope
from ._prologue_build import PrologueBase

__all__ = ["AttentionPrologue", "RotaryEmbedding"]

# As Any: mlx's typing is partial, and the lint environment may not have it installed.
mx: Any = importlib.import_module("mlx.core")
nn: Any = importlib.import_module("mlx.nn")

_UNSET: Any = object()  # offset not given: tells nn.RoPE's positional offset from a second one


class RotaryEmbedding(LayerBase, nn.Module):  # type: ignore[misc]  # nn is Any
    """Rotary position embedding as an ``mlx.nn.Module``.

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments in
        ``options`` (``base=``, ``layout=``, ``scaling=``, ...). ``RotaryEmbedding.from_hf_config``
        reads a Hugging Face config.

    Notes
    -----
    ``mlx.nn.RoPE(dims, traditional, base, scale)`` is ``RotaryEmbedding(head_dim,
    rotary_dim=dims, layout="interleaved" if traditional else "half", base=base,
    scaling=anyrope.scaling.Linear(1 / scale))`` (no scaling where ``scale`` is 1), with angles
    formed exactly rather than in float32.

    Examples
    --------
    >>> import mlx.core as mx  # doctest: +SKIP
    >>> from anyrope.layers.mlx import RotaryEmbedding  # doctest: +SKIP
    >>> rope = RotaryEmbedding(64, base=500000.0)  # doctest: +SKIP
    >>> q, k = mx.ones((2, 8, 5, 64)), mx.ones((2, 2, 5, 64))  # doctest: +SKIP
    >>> q, k = rope(q, k, offset=mx.array([3, 0]))  # doctest: +SKIP
    >>> rope(q, 7).shape  # nn.RoPE's call: x at positions 7, 8, ...  # doctest: +SKIP
    (2, 8, 5, 64)
    """

    def __init__(self, rope: Any, **options: Any) -> None:
        super().__init__()
        self._rope = make_rope(rope, options, "RotaryEmbedding")

    def __call__(
        self,
        q: Any,
        k: Any = None,
        *,
        positions: Any = None,
        offset: Any = _UNSET,
        seq_axis: int = -2,
        inverse: bool = False,
    ) -> Any:
        """``rope(q, k, positions=..., offset=..., seq_axis=..., inverse=...)``, or ``nn.RoPE``'s
        ``(x, offset)``.

        A second positional argument that is an int or an integer ``mx.array`` is the offset
        (``nn.RoPE``'s call, and mlx-lm's ``rope(x, offset=cache.offset)``); a floating one is k.
        """
        if _is_offset(k):
            if offset is not _UNSET:
                raise TypeError(
                    "offset given twice: the second positional argument is nn.RoPE's offset (an int or "
                    "integer array), so pass k as an array or drop offset="
                )
            k, offset = None, k
        return self._rotate(q, k, positions, 0 if offset is _UNSET else offset, seq_axis, inverse)


def _is_offset(value: Any) -> bool:
    if isinstance(value, mx.array):
        return not mx.issubdtype(value.dtype, mx.floating)
    return isinstance(value, int) and not isinstance(value, bool)


class AttentionPrologue(PrologueBase, nn.Module):  # type: ignore[misc]  # nn is Any
    """What attention does to q, k and v after their projections, as an ``mlx.nn.Module``:
    :func:`anyrope.prologue` with the layer's RoPE and QK-norm, whose weights are the module's
    parameters (``q_weight``, ``k_weight``: ``set_dtype`` casts them, weights files hold them).

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments.
    qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads
        As :class:`anyrope.layers.torch.AttentionPrologue` takes them.

    Examples
    --------
    >>> import mlx.core as mx, anyrope  # doctest: +SKIP
    >>> from mlx.utils import tree_flatten  # doctest: +SKIP
    >>> from anyrope.layers.mlx import AttentionPrologue  # doctest: +SKIP
    >>> prologue = AttentionPrologue(64, base=1_000_000.0)  # doctest: +SKIP
    >>> cache = anyrope.KVCache(mx.zeros((2, 2, 128, 64)), mx.zeros((2, 2, 128, 64)))  # doctest: +SKIP
    >>> q, k, v = mx.ones((2, 8, 5, 64)), mx.ones((2, 2, 5, 64)), mx.ones((2, 2, 5, 64))  # doctest: +SKIP
    >>> out = prologue(q, k, v, offset=3, cache=cache)  # doctest: +SKIP
    >>> sorted(k for k, _ in tree_flatten(prologue.parameters()))  # doctest: +SKIP
    ['k_weight', 'q_weight']
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
            fill = mx.zeros if from_zero else mx.ones
            self.q_weight, self.k_weight = fill(q_shape), fill(k_shape)

    def _norm_weights(self) -> tuple[Any, Any]:
        return self.q_weight, self.k_weight

    __call__ = PrologueBase.call

    def _extra_repr(self) -> str:
        return f"{self._rope!r}, {self._form_repr()}"
