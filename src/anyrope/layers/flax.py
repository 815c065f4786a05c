"""``RotaryEmbedding``: a Flax NNX module that rotates with :class:`anyrope.RoPE`; and
``AttentionPrologue``, the module of :func:`anyrope.prologue` (QK-norm, RoPE and the KV-cache
write), holding the norm's weights as ``nnx.Param``.

It holds no variables (``nnx.state`` of it is empty, so checkpoints hold nothing of it) and
only static configuration, so ``nnx.jit``, ``nnx.grad`` and ``nnx.split``/``nnx.merge`` pass it
through unchanged; angles are formed on the device from the positions, never from a stored table.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._build import LayerBase, make_rope
from ._prologue_build import PrologueBase

__all__ = ["AttentionPrologue", "RotaryEmbedding"]

# As Any: the lint environment may not have flax installed, and typed or not, it reads alike.
nnx: Any = importlib.import_module("flax.nnx")


class RotaryEmbedding(LayerBase, nnx.Module):  # type: ignore[misc]  # nnx is Any
    """Rotary position embedding as a Flax NNX module.

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments in
        ``options`` (``base=``, ``layout=``, ``scaling=``, ...). ``RotaryEmbedding.from_hf_config``
        reads a Hugging Face config.
    dtype : dtype, optional
        Cast q and k to this dtype before rotating, as NNX layers' ``dtype`` sets their
        computation's; None keeps theirs. The angles are formed exactly either way, and a 16-bit
        result is rounded once from float32.

    Examples
    --------
    >>> import jax.numpy as jnp  # doctest: +SKIP
    >>> from anyrope.layers.flax import RotaryEmbedding  # doctest: +SKIP
    >>> rope = RotaryEmbedding(64, base=500000.0)  # doctest: +SKIP
    >>> q, k = rope(jnp.ones((2, 8, 5, 64)), jnp.ones((2, 2, 5, 64)), offset=3)  # doctest: +SKIP
    """

    def __init__(self, rope: Any, *, dtype: Any = None, **options: Any) -> None:
        self._rope = make_rope(rope, options, "RotaryEmbedding")
        self.dtype = dtype

    def __call__(
        self,
        q: Any,
        k: Any = None,
        *,
        positions: Any = None,
        offset: Any = 0,
        seq_axis: int = -2,
        inverse: bool = False,
    ) -> Any:
        """``rope(q, k, positions=..., offset=..., seq_axis=..., inverse=...)``: the rotated q, or (q, k)."""
        if self.dtype is not None:
            q = q.astype(self.dtype) if hasattr(q, "astype") else q  # else rope names q
            k = k.astype(self.dtype) if hasattr(k, "astype") else k
        return self._rotate(q, k, positions, offset, seq_axis, inverse)


class AttentionPrologue(PrologueBase, nnx.Module):  # type: ignore[misc]  # nnx is Any
    """What attention does to q, k and v after their projections, as a Flax NNX module:
    :func:`anyrope.prologue` with the layer's RoPE and QK-norm, whose weights are ``nnx.Param``
    (``q_weight``, ``k_weight``: in ``nnx.state``, trained by ``nnx.grad``). JAX's caches are
    immutable: the written cache comes back in the result's ``cache``.

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments.
    qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads
        As :class:`anyrope.layers.torch.AttentionPrologue` takes them.
    param_dtype : dtype, optional
        The weights' dtype (float32 by default), as NNX layers' ``param_dtype``.

    Examples
    --------
    >>> import jax.numpy as jnp, anyrope  # doctest: +SKIP
    >>> from anyrope.layers.flax import AttentionPrologue  # doctest: +SKIP
    >>> prologue = AttentionPrologue(64, base=1_000_000.0)  # doctest: +SKIP
    >>> cache = anyrope.KVCache(jnp.zeros((2, 2, 128, 64)), jnp.zeros((2, 2, 128, 64)))  # doctest: +SKIP
    >>> q, k, v = jnp.ones((2, 8, 5, 64)), jnp.ones((2, 2, 5, 64)), jnp.ones((2, 2, 5, 64))  # doctest: +SKIP
    >>> cache = prologue(q, k, v, offset=3, cache=cache).cache  # doctest: +SKIP
    """

    _keeps_norm = False  # nnx.jit and nnx.grad trace the module's state apart: a norm per call

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
        param_dtype: Any = None,
        **options: Any,
    ) -> None:
        found = self._set_up(
            rope, options, qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads
        )
        if found is not None:
            jnp = importlib.import_module("jax.numpy")
            q_shape, k_shape, from_zero = found
            fill = jnp.zeros if from_zero else jnp.ones
            dtype = param_dtype or jnp.float32
            self.q_weight, self.k_weight = nnx.Param(fill(q_shape, dtype)), nnx.Param(fill(k_shape, dtype))

    def _norm_weights(self) -> tuple[Any, Any]:
        return self.q_weight[...], self.k_weight[...]

    __call__ = PrologueBase.call
