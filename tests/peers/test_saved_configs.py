"""Saved configs that leave a key out read as the family's config class reads them.

A config.json written by hand or by an older version may lack ``partial_rotary_factor``; the
family's config class then sets its own default (GLM: 0.5, GPT-NeoX: 0.25, Moonshine: 0.9, ...),
and a dict read by anyrope must rotate the same width as the config object transformers builds
from it. Checked for every family whose width is ``partial_rotary_factor`` of the head; for the
families whose RoPE parameters differ by layer type (Laguna, Mellum, MiMo-V2-Flash, NeoMME,
Step 3.5, ZAYA), on each layer type of the class's default config saved without the key, which
the class fills in again (NeoMME: 0.25 for full attention, 1.0 for sliding) or leaves out (the
whole head).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

import anyrope
from anyrope._families import FAMILIES, Family

transformers = pytest.importorskip("transformers", minversion="5.0")

PARTIAL = [f for f in FAMILIES if f.width == "partial" and f.unsupported is None and not f.per_layer]
PER_LAYER = [f for f in FAMILIES if f.width == "partial" and f.unsupported is None and f.per_layer]


def _head_dim(family: Family) -> int:
    """A head whose rotated width is even at the family's default (Qwen3.5's sections need 32 pairs)."""
    if family.model_type.startswith("qwen3_5") or family.model_type == "qwen4_exp_text":
        return 256
    return 40 if family.model_type.startswith("moonshine") else 128


@pytest.mark.parametrize("family", PARTIAL, ids=lambda f: f.model_type)
def test_a_dict_without_partial_rotary_factor_reads_as_the_config_class(family: Family) -> None:
    from transformers import CONFIG_MAPPING

    if family.model_type not in CONFIG_MAPPING:
        pytest.skip(f"{family.model_type} has no config class of its own in transformers")
    keys = {"head_dim": _head_dim(family), "hidden_size": 1024, "num_attention_heads": 8}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = CONFIG_MAPPING[family.model_type](**keys)
    try:
        want = anyrope.RoPE.from_hf_config(built)
    except ValueError as error:  # the class's default does not fit this head: nothing to compare
        pytest.skip(f"{family.model_type}'s config class defaults do not fit a tiny head: {error}")
    got = anyrope.RoPE.from_hf_config({"model_type": family.model_type, **keys})
    assert (got.rotary_dim, got.head_dim) == (want.rotary_dim, want.head_dim)


def _without(value: Any, key: str) -> Any:
    """A saved config with ``key`` left out at every level."""
    if isinstance(value, dict):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


@pytest.mark.parametrize("family", PER_LAYER, ids=lambda f: f.model_type)
def test_a_per_layer_dict_without_partial_rotary_factor_reads_as_the_config_class(family: Family) -> None:
    from transformers import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[family.model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saved = _without(config_cls().to_dict(), "partial_rotary_factor")
        kwargs = {k: v for k, v in saved.items() if k not in ("model_type", "transformers_version")}
        built = config_cls(**copy.deepcopy(kwargs))  # the class fills the dicts it is given in
    layer_types = sorted(built.rope_parameters)
    assert set(built.layer_types) <= set(layer_types), built.layer_types
    for layer_type in layer_types:
        want = anyrope.RoPE.from_hf_config(built, layer_type=layer_type)
        got = anyrope.RoPE.from_hf_config(saved, layer_type=layer_type)
        assert (got.rotary_dim, got.head_dim, got.base) == (want.rotary_dim, want.head_dim, want.base), (
            layer_type
        )
