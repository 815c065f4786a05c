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

from ._config import MISSING, ConfigReader
from ._families import GENERIC, Family, family_of
from ._hf_layers import _layer_blocks, _nested, _per_layer, _whole_config_rotates, layer_rotation
from ._hf_scaling import SUPPORTED_TYPES, _rope_parameters, _rope_type, _scaling
from ._hf_vision import parse_vision_config, vision_family
from .scaling import _ntk_base

__all__ = [
    "SUPPORTED_TYPES",
    "UnknownFamilyWarning",
    "layer_count",
    "layer_rotation",
    "parse_hf_config",
    "text_config",
]


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


def _rotary_dim(
    cfg: ConfigReader, params: ConfigReader, head_dim: int, family: Family, layer_type: str | None
) -> tuple[int, float]:
    """The rotated width (of the layers of ``layer_type``) and the partial factor it came from."""
    if family.width == "rotary_dim" and cfg.get("rotary_dim") is not None:
        width = cfg.integer("rotary_dim")
        if width > head_dim:
            raise ValueError(f"the config's 'rotary_dim' is {width}; it must be at most head_dim={head_dim}")
        return width, width / head_dim
    if family.width == "clvp":  # ClvpRotaryPositionalEmbedding's own rule, not the head's
        width = max(cfg.integer("projection_dim") // (2 * cfg.integer("num_attention_heads")), 32)
        if width > head_dim:
            raise ValueError(
                f"the config's projection_dim and num_attention_heads give {width} rotated features, "
                f"max(projection_dim // (2 * num_attention_heads), 32); at most head_dim={head_dim} rotate"
            )
        return width, width / head_dim
    # what the config class sets where the config has no key
    partial = family.partial_default
    if isinstance(partial, Mapping):
        partial = partial.get(layer_type or "", 1.0)
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


def parse_hf_config(
    config: Any, *, layer_type: str | None = None, layer: int | None = None, layout: str | None = None
) -> dict[str, Any]:
    """The keyword arguments of :class:`~anyrope.RoPE` that ``config`` describes (for layer
    ``layer``, or for the layers of type ``layer_type``), with the pairing ``layout`` where given.
    A config of a ``model_type`` anyrope does not know is read the Llama way, with an
    :class:`UnknownFamilyWarning` unless ``layout`` pins the pairing."""
    cfg = text_config(config)
    model_type = cfg.get("model_type")
    family = family_of(model_type if isinstance(model_type, str) else None)
    vision = vision_family(cfg)
    if vision is not None:  # a vision tower's config: rows and columns (rope_type "axial")
        if family is not GENERIC:
            raise ValueError(
                f"this config says rope_type='axial' (a vision tower's rows and columns), but "
                f"{family.model_type!r} models rotate with one position per token"
            )
        return parse_vision_config(cfg, vision, layer_type=layer_type, layer=layer)
    cfg = _layer_blocks(ConfigReader(cfg.source, aliases=family.aliases), family)
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
    if layer_type is not None:  # a layer type whose parameters sit under another key
        layer_type = family.rope_keys.get(layer_type, layer_type)
    params = _rope_parameters(cfg, layer_type)
    rope_type = _rope_type(cfg, params, family)
    head_dim = _head_dim(cfg, family)
    if head_dim % 2:
        raise ValueError(f"the config's head dimension is {head_dim}; RoPE needs an even one")
    rotary_dim, partial = _rotary_dim(cfg, params, head_dim, family, kind)
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
    if layout is None:
        layout = _layout(cfg, family)
        if family is GENERIC and isinstance(model_type, str) and model_type:
            _warn_unknown(model_type, layout, head_dim, rotary_dim, section, interleaved)
    return {
        "mrope_section": section,
        "mrope_interleaved": interleaved,
        "layout": layout,
        "head_dim": head_dim,
        "base": base,
        "rotary_dim": rotary_dim,
        "scaling": method,
        "max_position": max_position,
        "clockwise": family.clockwise,
        **_stream_map(params, family, rotary_dim),
    }


class UnknownFamilyWarning(UserWarning):
    """A config's ``model_type`` is none of anyrope's families: it was read the Llama way."""


def _warn_unknown(
    model_type: str,
    layout: str,
    head_dim: int,
    rotary_dim: int,
    section: list[int] | None,
    interleaved: bool,
) -> None:
    # A dict without model_type is taken as hand-written for the generic reading: no warning.
    sections = (
        f", M-RoPE sections {section} ({'interleaved' if interleaved else 'contiguous'})" if section else ""
    )
    warnings.warn(
        f"anyrope does not know model_type={model_type!r} and read its config the Llama way: "
        f"layout={layout!r} (the rope_interleave flag, half pairs without it), rotary_dim={rotary_dim} "
        f"of head_dim={head_dim} (partial_rotary_factor, rotary_pct or qk_rope_head_dim){sections}, "
        "and every attention layer rotating (no NoPE layers). Check this against the model's code; "
        "pin the pairing with RoPE.from_hf_config(config, layout='half' or 'interleaved'), which "
        "also silences this warning",
        UnknownFamilyWarning,
        stacklevel=4,
    )


def _sections(params: ConfigReader, family: Family, rotary_dim: int) -> tuple[list[int] | None, bool]:
    """M-RoPE's ``mrope_section`` and whether its streams interleave, as the family's rotary
    module reads them: from ``rope_parameters`` (else the module's default); interleaving is
    fixed per family in transformers, which ignores ``mrope_interleaved`` (vLLM reads it, and
    so does anyrope for a config of unknown family)."""
    pairs = rotary_dim // 2
    if family.multi_axis == "alternating":  # NeoMME: rows on even pairs, columns on odd ones
        return [pairs - pairs // 2, pairs // 2], True
    if family.multi_axis == "alternating_then_time":  # no sections: a stream map (_stream_map)
        return None, False
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


def _stream_map(params: ConfigReader, family: Family, rotary_dim: int) -> dict[str, Any]:
    """ERNIE 4.5-VL's map: ``mrope_section`` is [height, width, time] pairs; height and width
    alternate over the first pairs (height on even ones), time takes the rest, and every pair
    keeps its own frequency (the family's code pre-permutes inv_freq, then re-interleaves)."""
    if family.multi_axis != "alternating_then_time":
        return {}
    section = params.get("mrope_section", None)
    section = family.mrope_section if section is None else section
    if (
        isinstance(section, (str, bytes))
        or not isinstance(section, (list, tuple))
        or len(section) != 3
        or not all(type(n) is int and n >= 0 for n in section)
    ):
        raise ValueError(
            f"{params.where}'s mrope_section is {section!r}; {family.model_type!r} models read it as "
            "3 non-negative ints: [height, width, time] pairs"
        )
    height, width, time = section
    pairs = rotary_dim // 2
    if height != width or height + width + time != pairs:
        raise ValueError(
            f"{params.where}'s mrope_section={list(section)!r} must give height and width the same "
            f"number of pairs (the family's code stacks them) and add up to the {pairs} pairs rotated"
        )
    return {"pair_streams": [1 + j % 2 if j < height + width else 0 for j in range(pairs)]}


def layer_count(config: Any) -> int:
    """``num_hidden_layers`` of the config's text model."""
    cfg = text_config(config)
    model_type = cfg.get("model_type")
    family = family_of(model_type if isinstance(model_type, str) else None)
    cfg = _layer_blocks(ConfigReader(cfg.source, aliases=family.aliases), family)
    return int(cfg.integer("num_hidden_layers"))
