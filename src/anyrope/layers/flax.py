"""``RotaryEmbedding``: a Flax NNX module that rotates with :class:`anyrope.RoPE`.

It holds no variables (``nnx.state`` of it is empty, so checkpoints hold nothing of it) and
only static configuration, so ``nnx.jit``, ``nnx.grad`` and ``nnx.split``/``nnx.merge`` pass it
through unchanged; angles are formed on the device from the positions, never from a stored table.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._build import LayerBase, make_rope

__all__ = ["RotaryEmbedding"]

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
