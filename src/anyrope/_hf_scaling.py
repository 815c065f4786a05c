"""A Hugging Face config's RoPE parameters: where they sit, which rope type they name, and the
:mod:`anyrope.scaling` method they describe, every value checked."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from . import scaling as sc
from ._config import MISSING, ConfigReader
from ._families import GENERIC, Family

SUPPORTED_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_USES_ORIGINAL = ("llama3", "yarn", "longrope")
_MULTI_AXIS = ("mrope", "3d", "mrope_interleaved")


def _rope_parameters(cfg: ConfigReader, layer_type: str | None) -> ConfigReader:
    where = "rope_scaling"
    params = cfg.get("rope_scaling")
    if params is MISSING or params is None or (isinstance(params, Mapping) and not params):
        where, params = "rope_parameters", cfg.get("rope_parameters")
    if params is MISSING or params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise TypeError(f"the config's {where} must be a dict, got {type(params).__name__}")
    reader = ConfigReader(params, where=where)
    values = {key: reader.get(key) for key in reader.names()}
    nested = [key for key, value in values.items() if isinstance(value, Mapping)]
    if nested:
        nested += [key for key, value in values.items() if value is None]  # layer types without RoPE
        if layer_type is None:
            raise ValueError(
                f"this config has RoPE parameters per layer type ({', '.join(nested)}); pass "
                "layer_type= to choose one"
            )
        if layer_type not in nested:
            raise ValueError(
                f"layer_type={layer_type!r} is not in this config; choose one of {', '.join(nested)}"
            )
        if values[layer_type] is None:
            raise ValueError(
                f"layer type {layer_type!r} of this config has no rotary embedding (its entry is None)"
            )
        return ConfigReader(values[layer_type], where=f"rope_parameters[{layer_type!r}]")
    if layer_type is not None:
        raise ValueError(
            f"layer_type={layer_type!r} was given but this config has one set of RoPE parameters"
        )
    return reader


def _rope_type(cfg: ConfigReader, params: ConfigReader, family: Family) -> str:
    rope_type = params.get("rope_type", MISSING)
    if rope_type is MISSING:
        rope_type = params.get("type", "default")
    rope_type = rope_type or "default"
    if not isinstance(rope_type, str):
        raise TypeError(f"{params.where}'s rope_type is {rope_type!r}; it must be a string such as 'yarn'")
    rope_type = family.rope_type_aliases.get(rope_type, rope_type)
    if rope_type == "su" or (rope_type == "yarn" and cfg.get("model_type") == "phi3"):
        rope_type = "longrope"  # Phi-3's legacy names, as transformers maps them
    if family.unsupported is not None:
        raise ValueError(
            f"anyrope cannot express the rotation of {family.model_type!r} models yet: {family.unsupported}"
        )
    if family.rope_types == "fixed":
        return "default"  # the model keeps a sin/cos table and ignores any rope scaling
    if family.mscales and rope_type not in ("default", "longrope"):
        raise ValueError(
            f"{family.model_type!r} models scale attention by short_mscale and long_mscale, which "
            f"anyrope reads with rope_type 'longrope' only, not {rope_type!r}"
        )
    if family.rope_types == "default" and rope_type != "default":
        raise ValueError(
            f"{family.model_type!r} models rotate with plain RoPE only and refuse rope_type={rope_type!r}, "
            "as transformers does"
        )
    if rope_type in _MULTI_AXIS:
        # transformers rewrites "mrope" to "default" and keeps the sections, read below
        if not (family.multi_axis or family is GENERIC):
            raise ValueError(
                f"this config says rope_type={rope_type!r} (M-RoPE), but {family.model_type!r} models "
                "rotate with one position per token"
            )
        return "default"
    if rope_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"rope_type={rope_type!r} is not supported; anyrope reads {', '.join(SUPPORTED_TYPES)}"
        )
    return rope_type


def _warn_factor(factor: float, rope_type: str) -> None:
    if factor < 1:  # transformers warns and goes on; so do we
        warnings.warn(
            f"rope_type={rope_type!r} with factor={factor} < 1 shrinks the context rather than extending it",
            stacklevel=4,
        )


def _scaling(
    rope_type: str,
    cfg: ConfigReader,
    params: ConfigReader,
    rotary_dim: int,
    base: float,
    partial: float,
    family: Family,
) -> sc.Scaling | None:
    max_position = cfg.integer("max_position_embeddings", None)
    original = 0
    if rope_type in _USES_ORIGINAL:
        found = cfg.integer("original_max_position_embeddings", None)
        if found is None:
            found = params.integer("original_max_position_embeddings", max_position)
        if found is None:
            raise ValueError(
                f"rope_type={rope_type!r} needs original_max_position_embeddings or max_position_embeddings"
            )
        original = int(found)
    if rope_type == "linear":
        factor = params.number("factor")
        _warn_factor(factor, rope_type)
        return sc.Linear(factor)
    if rope_type == "dynamic":
        if max_position is None:
            raise ValueError("rope_type='dynamic' needs max_position_embeddings (the original context)")
        factor = params.number("factor")
        _warn_factor(factor, rope_type)
        return sc.DynamicNTK(factor, max_position)
    if rope_type == "yarn":
        if base <= 1:
            raise ValueError(
                f"the config's rope_theta is {base}; YaRN needs a base above 1 (it divides by log(base))"
            )
        if params.get("factor", None) is None:
            if max_position is None:
                raise ValueError("rope_type='yarn' needs factor or max_position_embeddings")
            factor = max_position / original
        else:
            factor = params.number("factor")
        _warn_factor(factor, rope_type)
        return sc.YaRN(
            factor,
            original,
            beta_fast=params.number("beta_fast", 32.0, allow_none=True),
            beta_slow=params.number("beta_slow", 1.0, allow_none=True),
            mscale=params.number("mscale", None, strict=False, allow_none=True),
            mscale_all_dim=params.number("mscale_all_dim", None, strict=False, allow_none=True),
            attention_factor=params.number("attention_factor", None, allow_none=True),
            truncate=params.boolean("truncate", True),
        )
    if rope_type == "longrope":
        factor = params.number("factor", None, allow_none=True)
        if factor is not None:
            _warn_factor(factor, rope_type)
        if family.mscales:  # PhiMoE: an attention factor for each side of the original context
            attention, long_attention = params.number("short_mscale"), params.number("long_mscale")
        else:
            attention, long_attention = params.number("attention_factor", None, allow_none=True), None
        return sc.LongRoPE(
            params.numbers("short_factor", rotary_dim // 2),
            params.numbers("long_factor", rotary_dim // 2),
            original,
            factor=factor,
            attention_factor=attention,
            long_attention_factor=long_attention,
        )
    if rope_type == "llama3":
        factor = params.number("factor")
        _warn_factor(factor, rope_type)
        return sc.Llama3(
            factor, params.number("low_freq_factor"), params.number("high_freq_factor"), original
        )
    if rope_type == "proportional":
        return sc.Proportional(partial, params.number("factor", 1.0))
    return None
