"""anyrope's RoPE as a layer of your framework: one module per framework, each with a
``RotaryEmbedding`` that holds a :class:`anyrope.RoPE` and no weights, and an
``AttentionPrologue`` (:func:`anyrope.prologue` holding the QK-norm's weights).

Import the one you use; each imports its framework alone, and this package imports none:
:mod:`anyrope.layers.torch` (``torch.nn``, and models that export to ONNX's RotaryEmbedding op),
:mod:`anyrope.layers.flax` (Flax NNX), :mod:`anyrope.layers.keras` (Keras 3) and
:mod:`anyrope.layers.mlx` (``mlx.nn``).
"""
