"""``RotaryEmbedding``: a Keras 3 layer that rotates with :class:`anyrope.RoPE`.

It runs on Keras's JAX, PyTorch and NumPy backends, whose tensors anyrope rotates natively; on
TensorFlow (and OpenVINO) it refuses to be built, naming the backend and the fix. It has no
weights, and its config is the RoPE's arguments, so ``get_config``/``from_config`` and
``model.save``/``keras.saving.load_model`` round-trip it (registered as
``"anyrope>RotaryEmbedding"``). Under a dtype policy (``mixed_bfloat16``, ``dtype="bfloat16"``)
Keras casts q and k to the compute dtype; the angles stay exact, formed from the positions.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._build import ROPE_OPTIONS, LayerBase, make_rope, rope_config, rope_from_config

__all__ = ["RotaryEmbedding"]

# As Any: the lint environment may not have keras installed, and keras has no type hints.
keras: Any = importlib.import_module("keras")

# Backends whose tensors are arrays anyrope takes (numpy: inference only, Keras cannot train there).
_BACKENDS = ("jax", "torch", "numpy")


class RotaryEmbedding(LayerBase, keras.layers.Layer):  # type: ignore[misc]  # keras is Any
    """Rotary position embedding as a Keras 3 layer.

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments
        (``base=``, ``layout=``, ``scaling=``, ...) among ``kwargs``.
        ``RotaryEmbedding.from_hf_config`` reads a Hugging Face config.
    **kwargs
        RoPE's keyword arguments, and the Layer's own (``name``, ``dtype``, ...).

    Raises
    ------
    RuntimeError
        On a Keras backend anyrope cannot rotate the tensors of (TensorFlow, OpenVINO).

    Examples
    --------
    >>> import numpy as np  # doctest: +SKIP
    >>> from anyrope.layers.keras import RotaryEmbedding  # doctest: +SKIP
    >>> rope = RotaryEmbedding(64, base=500000.0)  # doctest: +SKIP
    >>> q = rope(np.ones((2, 8, 5, 64), dtype="float32"), offset=3)  # doctest: +SKIP
    """

    def __init__(self, rope: Any, **kwargs: Any) -> None:
        backend = keras.backend.backend()
        if backend not in _BACKENDS:
            raise RuntimeError(
                f"anyrope.layers.keras.RotaryEmbedding runs on Keras's jax, torch and numpy backends, "
                f"not {backend!r}, whose tensors anyrope cannot rotate: set KERAS_BACKEND=jax (or torch) "
                "before importing keras"
            )
        options = {name: kwargs.pop(name) for name in ROPE_OPTIONS & kwargs.keys()}
        rotation = make_rope(rope, options, "RotaryEmbedding")  # checked before Layer's arguments
        super().__init__(**kwargs)
        self._rope = rotation
        self.built = True  # nothing to build: no weights

    def call(
        self,
        q: Any,
        k: Any = None,
        positions: Any = None,
        offset: Any = 0,
        seq_axis: int = -2,
        inverse: bool = False,
    ) -> Any:
        """``rope(q, k, positions=..., offset=..., seq_axis=..., inverse=...)``: the rotated q, or (q, k)."""
        return self._rotate(q, k, positions, offset, seq_axis, inverse)

    def get_config(self) -> dict[str, Any]:
        """The Layer's config and the RoPE's arguments (``"rope"``), as JSON-ready data."""
        return {**super().get_config(), "rope": rope_config(self._rope)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RotaryEmbedding:
        """The layer :meth:`get_config` described."""
        config = dict(config)
        return cls(rope_from_config(config.pop("rope", None)), **config)


keras.saving.register_keras_serializable(package="anyrope")(RotaryEmbedding)
