"""Reading a Hugging Face model config into the arguments of :class:`~anyrope.RoPE`.

Follows transformers' own standardisation (``RotaryEmbeddingConfigMixin``): ``rope_scaling`` (old)
wins over ``rope_parameters`` (v5); ``rope_theta`` and ``partial_rotary_factor`` may sit at the top
level or inside; ``original_max_position_embeddings`` at the top level (Phi-3) wins for the
methods that use it; "type" is the old spelling of "rope_type". What differs between model
families (pairing, the rotated width's key, multi-axis positions) comes from
:mod:`anyrope._families`; every value read is checked (:mod:`anyrope._config`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from . import scaling as sc
from ._config import MISSING, ConfigReader
from ._families import GENERIC, Family, family_of
from .scaling import _ntk_base

__all__ = ["SUPPORTED_TYPES", "layer_count", "layer_rotation", "parse_hf_config", "text_config"]

SUPPORTED_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_USES_ORIGINAL = ("llama3", "yarn", "longrope")
_MULTI_AXIS = ("mrope", "3d", "mrope_interleaved")


def text_config(config: Any) -> ConfigReader:
    """The config of the text model: a multimodal config's ``text_config``, else the config."""
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config) and not isinstance(config, dict):
        return ConfigReader(get_text_config())
    reader = ConfigReader(config)
    nested = reader.sub("text_config")
    if nested is not None and not any(
        reader.has(k) for k in ("head_dim", "hidden_size", "n_embd", "d_model")
    ):
        return nested
    return reader


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


def _head_dim(cfg: ConfigReader, family: Family) -> int:
    # DeepSeek's multi-head latent attention rotates only a qk_rope_head_dim slice of each head.
    mla = family.width == "mla" or (family is GENERIC and cfg.get("qk_rope_head_dim") not in (MISSING, None))
    for key in ("qk_rope_head_dim", "head_dim") if mla else ("head_dim",):
        found = cfg.integer(key, None)
        if found is not None:
            return int(found)
    hidden = cfg.integer("hidden_size", None)
    heads = cfg.integer("num_attention_heads", None)
    if hidden is None or heads is None:
        raise ValueError("the config needs head_dim, or hidden_size and num_attention_heads")
    if hidden % heads:
        raise ValueError(
            f"the config's hidden_size={hidden} is not divisible by num_attention_heads={heads}; give head_dim"
        )
    return int(hidden // heads)


def _rotary_dim(cfg: ConfigReader, params: ConfigReader, head_dim: int, family: Family) -> tuple[int, float]:
    """The rotated width and the partial factor it came from."""
    if family.width == "rotary_dim" and cfg.get("rotary_dim") is not None:
        width = cfg.integer("rotary_dim")
        if width > head_dim:
            raise ValueError(f"the config's 'rotary_dim' is {width}; it must be at most head_dim={head_dim}")
        return width, width / head_dim
    partial = 1.0
    for reader, key in (
        (params, "partial_rotary_factor"),
        (cfg, "partial_rotary_factor"),
        (cfg, "rotary_pct"),
    ):
        value = reader.get(key)
        if value is not MISSING and value is not None:
            partial = reader.number(key)
            break
    if partial > 1:
        raise ValueError(f"the config's partial rotary factor is {partial}; it must be at most 1")
    if family.width in ("head", "mla"):  # Llama-style rotary: the whole head (or slice) turns
        return head_dim, partial
    return int(head_dim * partial), partial


def _base(cfg: ConfigReader, params: ConfigReader, family: Family) -> float:
    for reader, key in ((params, "rope_theta"), (cfg, "rope_theta"), (cfg, "rotary_emb_base")):
        if reader.get(key) is not MISSING:
            return float(reader.number(key))
    if family.base is None:
        raise ValueError(
            f"this {family.model_type} config needs rope_theta (its default differs by layer type)"
        )
    return family.base


def _layout(cfg: ConfigReader, family: Family) -> str:
    if family.layout_key is not None:
        return "interleaved" if cfg.boolean(family.layout_key, family.layout_default) else "half"
    return family.layout


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


_NO_ATTENTION = frozenset({"linear_attention", "mamba", "mamba2", "conv", "recurrent"})
_WHOLE_CONFIG = {  # rules under which either every layer rotates or none does
    "position_embedding_type=rope": ("position_embedding_type", "rope"),
    "position_embedding_type=rotary": ("position_embedding_type", "rotary"),
    "use_mem_rope": ("use_mem_rope", True),
}


def _whole_config_rotates(cfg: ConfigReader, family: Family) -> None:
    rule = _WHOLE_CONFIG.get(family.nope or "")
    if rule is not None and cfg.get(rule[0]) != rule[1]:
        raise ValueError(
            f"this {family.model_type} config uses no rotary embedding ({rule[0]}={cfg.get(rule[0], None)!r}, "
            f"not {rule[1]!r})"
        )


def layer_rotation(cfg: ConfigReader, family: Family, layer: int) -> tuple[str | None, float | None]:
    """Layer ``layer``'s layer type (``layer_types[layer]``) and a theta of its own, where it has
    them; a ValueError saying why where that layer does not rotate."""
    count = cfg.integer("num_hidden_layers", None)
    if count is not None and layer >= count:
        raise ValueError(f"layer={layer} is out of range: this config has {count} layers")
    types = cfg.get("layer_types")
    kind = types[layer] if isinstance(types, (list, tuple)) and layer < len(types) else None

    def nope(why: str) -> ValueError:
        return ValueError(
            f"layer {layer} of this {family.model_type or 'model'} config has no rotary embedding: {why}"
        )

    if kind in _NO_ATTENTION:
        raise nope(f"it is a {kind} layer, without attention")
    rule, theta = family.nope, None
    if rule == "sliding_only" and kind != "sliding_attention":
        raise nope("only its sliding-attention layers rotate")
    windowed = cfg.get("sliding_window", None) is not None
    if rule == "sliding_when_windowed" and windowed and kind != "sliding_attention":
        raise nope("with a sliding window set, only its sliding-attention layers rotate")
    if rule == "no_rope_layers":
        flags = cfg.get("no_rope_layers")
        if isinstance(flags, (list, tuple)) and layer < len(flags):
            rotates = bool(flags[layer])
        else:  # transformers' default: every no_rope_layer_interval-th layer is NoPE
            rotates = (layer + 1) % cfg.integer("no_rope_layer_interval", 4) != 0
        if not rotates:
            raise nope("no_rope_layers marks it NoPE")
    if rule in ("layer_rope_theta", "layer_rope_flag"):
        thetas = cfg.get("layer_rope_theta")
        if not isinstance(thetas, (list, tuple)) or layer >= len(thetas):
            raise ValueError(f"this {family.model_type} config needs layer_rope_theta, one theta per layer")
        if not thetas[layer]:
            raise nope("its layer_rope_theta is 0")
        if rule == "layer_rope_flag":  # MuseSpark: a flag only; every rotating layer uses rope_theta
            return kind, None
        theta = ConfigReader({"layer_rope_theta": thetas[layer]}).number("layer_rope_theta")
    if rule == "sliding_or_dense_prefix":
        mlp = cfg.get("mlp_layer_types")
        dense = isinstance(mlp, (list, tuple)) and layer < len(mlp) and mlp[layer] == "dense"
        if kind != "sliding_attention" and not (
            dense and cfg.get("prefix_dense_sliding_window_pattern") == 1
        ):
            raise nope("only its sliding-attention layers (and a dense prefix, where configured) rotate")
    if rule == "full_with_theta" and kind != "full_attention":
        raise nope("only its full-attention layers rotate")
    return kind, theta


def parse_hf_config(
    config: Any, *, layer_type: str | None = None, layer: int | None = None
) -> dict[str, Any]:
    """The keyword arguments of :class:`~anyrope.RoPE` that ``config`` describes (for layer
    ``layer``, or for the layers of type ``layer_type``)."""
    cfg = text_config(config)
    model_type = cfg.get("model_type")
    family = family_of(model_type if isinstance(model_type, str) else None)
    cfg = ConfigReader(cfg.source, aliases=family.aliases)
    _whole_config_rotates(cfg, family)
    if cfg.get("rotary_value", False) is True:
        raise ValueError(
            "this config has rotary_value=True: the model rotates the values too, which a RoPE of q "
            "and k does not describe; rotate v with the same RoPE if that is what you want"
        )
    theta, kind = None, layer_type
    if layer is not None:
        if layer_type is not None:
            raise ValueError("pass layer or layer_type, not both (a layer's type comes from the config)")
        kind, theta = layer_rotation(cfg, family, layer)
        if _nested(cfg):
            layer_type = kind
    cfg = _per_layer(cfg, family, kind, layer)
    params = _rope_parameters(cfg, layer_type)
    rope_type = _rope_type(cfg, params, family)
    head_dim = _head_dim(cfg, family)
    if head_dim % 2:
        raise ValueError(f"the config's head dimension is {head_dim}; RoPE needs an even one")
    rotary_dim, partial = _rotary_dim(cfg, params, head_dim, family)
    base = theta if theta is not None else _base(cfg, params, family)
    if family.ntk_alpha and rope_type == "dynamic" and params.get("alpha", None):
        # HunYuan's checkpoints say "dynamic", but a fixed alpha only raises the base, by
        # alpha ** (d / (d - 2)), at every length (transformers' "ntk_alpha")
        alpha = params.number("alpha")
        base, rope_type = _ntk_base(base, alpha, rotary_dim), "default"
    method = _scaling(rope_type, cfg, params, rotary_dim, base, partial, family)
    scaled_layers = cfg.get("rope_scaling_layers", None)
    if layer is not None and isinstance(scaled_layers, (list, tuple)) and layer not in scaled_layers:
        method = None  # Molmo2: layers outside rope_scaling_layers rotate unscaled
    max_position = cfg.integer("max_position_embeddings", None)
    if rope_type == "proportional":
        rotary_dim = head_dim
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"the config rotates {rotary_dim} of {head_dim} features; RoPE needs a positive even number"
        )
    section, interleaved = _sections(params, family, rotary_dim)
    return {
        "mrope_section": section,
        "mrope_interleaved": interleaved,
        "layout": _layout(cfg, family),
        "head_dim": head_dim,
        "base": base,
        "rotary_dim": rotary_dim,
        "scaling": method,
        "max_position": max_position,
        "clockwise": family.clockwise,
    }


def _sections(params: ConfigReader, family: Family, rotary_dim: int) -> tuple[list[int] | None, bool]:
    """M-RoPE's ``mrope_section`` and whether its streams interleave, as the family's rotary
    module reads them: from ``rope_parameters`` (else the module's default); interleaving is
    fixed per family in transformers, which ignores ``mrope_interleaved`` (vLLM reads it, and
    so does anyrope for a config of unknown family)."""
    pairs = rotary_dim // 2
    if family.multi_axis == "alternating":  # NeoMME: rows on even pairs, columns on odd ones
        return [pairs - pairs // 2, pairs // 2], True
    given = params.get("mrope_section", None)
    if family.multi_axis is None:
        if given is None:
            return None, False
        if family is not GENERIC:
            raise ValueError(
                f"this config has {params.where}['mrope_section'] (M-RoPE), but {family.model_type!r} "
                "models rotate with one position per token"
            )
    section = given if given is not None else family.mrope_section
    if isinstance(section, (str, bytes)) or not isinstance(section, (list, tuple)):
        raise TypeError(f"{params.where}'s mrope_section is {section!r}; it must be a list of ints")
    section = list(section)
    interleaved = family.multi_axis == "interleaved" or (
        family is GENERIC and params.get("mrope_interleaved", False) is True
    )
    if family.multi_axis is not None and len(section) != 3:
        raise ValueError(
            f"{params.where}'s mrope_section={section!r} must have 3 entries (time, height, width), "
            f"as {family.model_type!r} models read it"
        )
    if family.multi_axis == "interleaved" and all(type(n) is int and n >= 0 for n in section):
        # The family's code sets pairs s, s + 3, ... below 3 * section[s] to stream s (a slice:
        # pairs past the last are dropped) and never reads the time section: stream 0 takes the rest.
        for stream in (1, 2):
            section[stream] = len(range(stream, min(3 * section[stream], pairs), 3))
        section[0] = pairs - section[1] - section[2]
    return section, interleaved


# The keys whose per-layer overrides change a layer's rotation.
_ROTATION_KEYS = frozenset(
    {
        "head_dim",
        "hidden_size",
        "num_attention_heads",
        "qk_rope_head_dim",
        "partial_rotary_factor",
        "rotary_pct",
        "rotary_dim",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "max_position_embeddings",
        "original_max_position_embeddings",
    }
)


def _per_layer(cfg: ConfigReader, family: Family, layer_type: str | None, layer: int | None) -> ConfigReader:
    """The config as layer ``layer`` (of type ``layer_type``), or every layer of type
    ``layer_type``, sees it: with transformers' ``per_layer_config`` overrides (Gemma 4's wider
    full-attention heads) applied."""
    source = cfg.source
    if isinstance(source, Mapping):
        overrides = _dict_overrides(cfg, family, layer_type, layer)
        return ConfigReader({**source, **overrides}, aliases=family.aliases) if overrides else cfg
    if not getattr(source, "is_heterogeneous", False):
        return cfg
    varying = set(source.per_layer_attributes or ()) & _ROTATION_KEYS
    if not varying:
        return cfg
    if layer is None and layer_type is None:
        raise _choose_layers(varying)
    try:
        view = source.per_layer_config[layer if layer is not None else layer_type]
    except (ValueError, IndexError) as error:  # a layer type whose layers differ, or none
        raise ValueError(f"per_layer_config: {error}") from None
    return ConfigReader(view, aliases=family.aliases)


def _choose_layers(varying: set[str]) -> ValueError:
    return ValueError(
        f"this config's {', '.join(sorted(varying))} differs by layer (per_layer_config); pass "
        "layer_type= or layer= to choose the layers"
    )


def _dict_overrides(
    cfg: ConfigReader, family: Family, layer_type: str | None, layer: int | None
) -> dict[str, Any]:
    per_layer = cfg.get("per_layer_config", None)
    if per_layer is None:
        if family.global_head_dim is None or layer_type != "full_attention":
            return {}
        # transformers turns global_head_dim into per_layer_config for the full-attention layers
        return {"head_dim": cfg.get("global_head_dim", family.global_head_dim)}
    if not isinstance(per_layer, Mapping):
        raise TypeError(
            f"the config's per_layer_config must be a dict of layer index -> overrides, not {type(per_layer).__name__}"
        )
    by_index: dict[int, Mapping[str, Any]] = {}
    for key, overrides in per_layer.items():
        if isinstance(key, bool) or not (isinstance(key, int) or (isinstance(key, str) and key.isdigit())):
            raise TypeError(f"the config's per_layer_config has the key {key!r}; its keys are layer indices")
        if not isinstance(overrides, Mapping):
            raise TypeError(f"the config's per_layer_config[{key!r}] must be a dict of overrides")
        by_index[int(key)] = {k: v for k, v in overrides.items() if k in _ROTATION_KEYS}
    if layer is not None:
        return dict(by_index.get(layer, {}))
    if layer_type is None:
        varying = {k for overrides in by_index.values() for k in overrides}
        if varying:
            raise _choose_layers(varying)
        return {}
    types = cfg.get("layer_types", None)
    if not isinstance(types, (list, tuple)):
        raise TypeError(
            "the config has per_layer_config but no layer_types list to find the layers of layer_type"
        )
    indices = [i for i, kind in enumerate(types) if kind == layer_type]
    chosen = [by_index.get(i, {}) for i in indices]
    for i, overrides in zip(indices, chosen, strict=True):
        if overrides != chosen[0]:
            raise ValueError(
                f"the layers of type {layer_type!r} differ in per_layer_config (layers {indices[0]} and {i}); "
                "pass layer= instead"
            )
    return dict(chosen[0]) if chosen else {}


def _nested(cfg: ConfigReader) -> bool:
    """Whether the RoPE parameters are nested by layer type."""
    for key in ("rope_scaling", "rope_parameters"):
        value = cfg.get(key)
        if isinstance(value, Mapping) and value:
            return any(isinstance(v, Mapping) for v in value.values())
    return False


def layer_count(config: Any) -> int:
    """``num_hidden_layers`` of the config's text model."""
    cfg = text_config(config)
    model_type = cfg.get("model_type")
    family = family_of(model_type if isinstance(model_type, str) else None)
    return int(ConfigReader(cfg.source, aliases=family.aliases).integer("num_hidden_layers"))
