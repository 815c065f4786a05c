"""Make an mlx-lm model rotate with anyrope: a drop-in for mlx-lm's rope modules.

mlx-lm's attention layers hold a rope module (``mlx.nn.RoPE``, or one of
``mlx_lm.models.rope_utils``: ``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE``,
``ProportionalRoPE``, ``DynamicNTKScalingRoPE``) and call it as ``self.rope(x, offset=...)`` on
``x`` of shape ``(batch, heads, seq, head_dim)``, the offset a Python int (``KVCache``) or an
``mx.array`` with one offset per batch row, negative for left-padded rows (``BatchKVCache``).
:class:`AnyRoPE` takes that same call and rotates with :class:`anyrope.RoPE`: angles formed
exactly on the device, where ``mx.fast.rope`` forms ``position * frequency`` in float32 (off by
about ``position * 2**-24`` rad, 6e-3 rad at position 10**5). It reads no array value, so it
runs under ``mx.compile`` with traced offsets.

- :func:`patch_model` replaces every mlx-lm rope module of a model in place;
- :func:`from_mlx_lm` converts one module;
- :func:`initialize_rope` builds one from a config, with ``mlx_lm``'s signature (so it can
  also stand in for mlx-lm's own while a model is built).

``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE`` and ``ProportionalRoPE`` keep only float32
frequencies; :func:`patch_model` computes theirs exactly from the model's config
(``model.args``) where that describes them, and otherwise uses the modules' own.

Each conversion is checked: the new module must rotate a probe as the mlx-lm module does (within
float32's error of that module), or a ValueError says by how much it does not; a module of a
class it does not know is refused by name, never left to rotate differently unnoticed.

>>> from mlx_lm import load  # doctest: +SKIP
>>> from anyrope.integrations.mlx_lm import patch_model  # doctest: +SKIP
>>> model, tokenizer = load("mlx-community/Llama-3.2-1B-Instruct-4bit")  # doctest: +SKIP
>>> patch_model(model)  # doctest: +SKIP
16

What anyrope reproduces is mlx-lm's rotation, including where it departs from transformers:
``SuScaledRoPE`` (LongRoPE) always uses the long factors and always pairs features half-split;
YaRN's input multiplier is mlx-lm's ``mscale`` ratio; the linear ``scale`` of ``nn.RoPE`` becomes
``anyrope.scaling.Linear(1 / scale)``.
"""

from __future__ import annotations

from ._conversion import from_mlx_lm
from ._from_config import initialize_rope
from ._models import patch_model, unpatch_model
from ._module import AnyRoPE, StoredFrequencies

__all__ = [
    "AnyRoPE",
    "StoredFrequencies",
    "from_mlx_lm",
    "initialize_rope",
    "patch_model",
    "unpatch_model",
]

# Their home is this package, the path users import them by (reprs, pickles, the API docs).
for _public in (AnyRoPE, StoredFrequencies, from_mlx_lm, initialize_rope, patch_model, unpatch_model):
    _public.__module__ = __name__
del _public
