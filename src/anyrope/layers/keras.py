"""``RotaryEmbedding``: a Keras 3 layer that rotates with :class:`anyrope.RoPE`; and
``AttentionPrologue``, the layer of :func:`anyrope.prologue` (QK-norm, RoPE and the KV-cache
write), holding the norm's weights.

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
from ._prologue_build import PrologueBase

__all__ = ["AttentionPrologue", "RotaryEmbedding"]

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
        _check_backend("RotaryEmbedding")
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


def _check_backend(layer: str) -> None:
    backend = keras.backend.backend()
    if backend not in _BACKENDS:
        raise RuntimeError(
            f"anyrope.layers.keras.{layer} runs on Keras's jax, torch and numpy backends, not {backend!r}, "
            "whose tensors anyrope cannot rotate: set KERAS_BACKEND=jax (or torch) before importing keras"
        )


class AttentionPrologue(PrologueBase, keras.layers.Layer):  # type: ignore[misc]  # keras is Any
    """What attention does to q, k and v after their projections, as a Keras 3 layer:
    :func:`anyrope.prologue` with the layer's RoPE and QK-norm, whose weights are the layer's
    (``q_weight``, ``k_weight``: saved, trained, used in the compute dtype). On JAX the written
    cache comes back in the result's ``cache``; on torch the cache is written in place.

    Parameters
    ----------
    rope : anyrope.RoPE or int
        The rotation, or its ``head_dim`` with :class:`anyrope.RoPE`'s keyword arguments among
        ``kwargs``.
    qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads
        As :class:`anyrope.layers.torch.AttentionPrologue` takes them.
    **kwargs
        RoPE's keyword arguments, and the Layer's own (``name``, ``dtype``, ...).

    Examples
    --------
    >>> import numpy as np  # doctest: +SKIP
    >>> from anyrope.layers.keras import AttentionPrologue  # doctest: +SKIP
    >>> prologue = AttentionPrologue(64, base=1_000_000.0)  # doctest: +SKIP
    >>> out = prologue(np.ones((2, 8, 5, 64), "float32"), np.ones((2, 2, 5, 64), "float32"), offset=3)  # doctest: +SKIP
    """

    _keeps_norm = False  # Keras hands the weights' values in afresh under its compiled calls

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
        **kwargs: Any,
    ) -> None:
        _check_backend("AttentionPrologue")
        options = {name: kwargs.pop(name) for name in ROPE_OPTIONS & kwargs.keys()}
        super().__init__(**kwargs)
        found = self._set_up(
            rope, options, qk_norm, eps, norm_offset, across_heads, rounding, heads, kv_heads
        )
        self._options = {"qk_norm": qk_norm, "eps": eps, "norm_offset": norm_offset, "across_heads": across_heads,
                         "rounding": rounding, "heads": heads, "kv_heads": kv_heads}  # fmt: skip
        if found is not None:
            q_shape, k_shape, from_zero = found
            start = "zeros" if from_zero else "ones"
            self.q_weight = self.add_weight(shape=q_shape, initializer=start, name="q_weight")
            self.k_weight = self.add_weight(shape=k_shape, initializer=start, name="k_weight")
        self.built = True  # the weights' shapes come from the arguments, not the inputs

    def _norm_weights(self) -> tuple[Any, Any]:
        cast = keras.ops.cast
        return cast(self.q_weight.value, self.compute_dtype), cast(self.k_weight.value, self.compute_dtype)

    call = PrologueBase.call

    def get_config(self) -> dict[str, Any]:
        """The Layer's config, the norm's arguments, and the RoPE's (``"rope"``), as JSON-ready data."""
        return {**super().get_config(), **self._options, "rope": rope_config(self._rope)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AttentionPrologue:
        """The layer :meth:`get_config` described."""
        config = dict(config)
        return cls(rope_from_config(config.pop("rope", None)), **config)


keras.saving.register_keras_serializable(package="anyrope")(RotaryEmbedding)
keras.saving.register_keras_serializable(package="anyrope")(AttentionPrologue)
