"""Which layers of a Hugging Face config rotate, and the config as one layer (or layer type) sees it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._config import ConfigReader
from ._families import Family

_NO_ATTENTION = frozenset({"linear_attention", "mamba", "mamba2", "conv", "recurrent"})
_WHOLE_CONFIG = {  # rules under which either every layer rotates or none does
    "position_embedding_type=rope": ("position_embedding_type", "rope"),
    "position_embedding_type=rotary": ("position_embedding_type", "rotary"),
    "position_embeddings_type=rotary": ("position_embeddings_type", "rotary"),  # speech conformers
    "use_mem_rope": ("use_mem_rope", True),
}


def _whole_config_rotates(cfg: ConfigReader, family: Family) -> None:
    rule = _WHOLE_CONFIG.get(family.nope or "")
    if rule is not None and cfg.get(rule[0]) != rule[1]:
        raise ValueError(
            f"this {family.model_type} config uses no rotary embedding ({rule[0]}={cfg.get(rule[0], None)!r}, "
            f"not {rule[1]!r})"
        )


def _layer_blocks(cfg: ConfigReader, family: Family) -> ConfigReader:
    """A saved Dory config's layers: its ``layer_types`` list an "mlp" block after every layer and
    its counts are of blocks, which DoryConfig.__post_init__ halves (a config object is already read so)."""
    source = cfg.source
    types = cfg.get("layer_types", None)
    if not (family.mlp_blocks and isinstance(source, Mapping) and isinstance(types, (list, tuple))):
        return cfg
    if "mlp" not in types:
        return cfg
    if len(types) % 2 or list(types[1::2]) != ["mlp"] * (len(types) // 2):
        raise ValueError(
            f"this {family.model_type} config's layer_types mixes 'mlp' blocks into its layers other than "
            "one after every layer, as saved configs list them; give one entry per layer instead"
        )
    blocks: dict[str, Any] = {"layer_types": list(types[::2])}
    for key in ("num_hidden_layers", "n_input_layers", "n_recurrent_layers", "n_output_layers"):
        count = cfg.get(key, None)
        if isinstance(count, int) and not isinstance(count, bool):
            blocks[key] = count // 2
    return ConfigReader({**source, **blocks}, aliases=family.aliases)


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
