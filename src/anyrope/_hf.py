"""Reading a Hugging Face model config into a :class:`~anyrope.RoPE`.

Follows transformers' own standardisation (``RotaryEmbeddingConfigMixin``): ``rope_scaling`` (old)
wins over ``rope_parameters`` (v5); ``rope_theta`` and ``partial_rotary_factor`` may sit at the top
level or inside; ``original_max_position_embeddings`` at the top level (Phi-3) wins for the
methods that use it; "type" is the old spelling of "rope_type".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import scaling as sc

__all__ = ["SUPPORTED_TYPES", "parse_hf_config"]

# Model types whose transformers config defaults rope_interleave to True when config.json omits it.
_INTERLEAVED_BY_DEFAULT = ("axk1", "deepseek_v3", "glm4_moe_lite", "mistral4", "youtu")
SUPPORTED_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_USES_ORIGINAL = ("llama3", "yarn", "longrope")


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):  # a transformers PretrainedConfig
        return dict(to_dict())
    raise TypeError(
        f"config must be a config.json dict or a transformers config object, not {type(config).__name__}"
    )


def _rope_parameters(cfg: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"rope_scaling / rope_parameters must be a dict, got {type(params).__name__}")
    nested = [key for key, value in params.items() if isinstance(value, Mapping)]
    if nested:
        if layer_type is None:
            raise ValueError(
                f"this config has RoPE parameters per layer type ({', '.join(nested)}); pass "
                "layer_type= to choose one"
            )
        if layer_type not in nested:
            raise ValueError(
                f"layer_type={layer_type!r} is not in this config; choose one of {', '.join(nested)}"
            )
        return dict(params[layer_type])
    if layer_type is not None:
        raise ValueError(
            f"layer_type={layer_type!r} was given but this config has one set of RoPE parameters"
        )
    return dict(params)


def _interleaved(cfg: Mapping[str, Any]) -> bool:
    flag = cfg.get("rope_interleave")
    return bool(flag) if flag is not None else cfg.get("model_type") in _INTERLEAVED_BY_DEFAULT


def _required(params: Mapping[str, Any], key: str, rope_type: str, kind: type = float) -> Any:
    value = params.get(key)
    if value is None:
        raise ValueError(f"the config's RoPE parameters need {key!r} for rope_type={rope_type!r}")
    return kind(value)


def parse_hf_config(config: Any, *, layer_type: str | None = None) -> dict[str, Any]:
    """The keyword arguments of :class:`~anyrope.RoPE` that ``config`` describes."""
    cfg = _as_dict(config)
    params = _rope_parameters(cfg, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type == "su" or (rope_type == "yarn" and cfg.get("model_type") == "phi3"):
        rope_type = "longrope"  # Phi-3's legacy names, as transformers maps them
    if rope_type not in SUPPORTED_TYPES:
        hint = " (multi-axis M-RoPE is not supported yet)" if rope_type == "mrope" else ""
        raise ValueError(
            f"rope_type={rope_type!r} is not supported{hint}; anyrope reads {', '.join(SUPPORTED_TYPES)}"
        )

    # DeepSeek's multi-head latent attention rotates only a qk_rope_head_dim slice of each head.
    head_dim = cfg.get("qk_rope_head_dim") or cfg.get("head_dim")
    if not head_dim:
        try:
            head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        except KeyError:
            raise ValueError("the config needs head_dim, or hidden_size and num_attention_heads") from None
    # GPT-NeoX-era configs spell these rotary_emb_base and rotary_pct.
    base = float(params.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0))))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", cfg.get("rotary_pct")))
    partial = float(partial) if partial else 1.0
    max_position = cfg.get("max_position_embeddings")
    original = 0  # read only by the methods that set it below
    if rope_type in _USES_ORIGINAL:
        found = cfg.get("original_max_position_embeddings") or params.get(
            "original_max_position_embeddings", max_position
        )
        if found is None:
            raise ValueError(
                f"rope_type={rope_type!r} needs original_max_position_embeddings or max_position_embeddings"
            )
        original = int(found)

    rotary_dim = int(head_dim * partial)
    method: sc.Scaling | None = None
    if rope_type == "linear":
        method = sc.Linear(_required(params, "factor", rope_type))
    elif rope_type == "dynamic":
        if max_position is None:
            raise ValueError("rope_type='dynamic' needs max_position_embeddings (the original context)")
        method = sc.DynamicNTK(_required(params, "factor", rope_type), int(max_position))
    elif rope_type == "yarn":
        factor = params.get("factor")
        if factor is None:
            if max_position is None:
                raise ValueError("rope_type='yarn' needs factor or max_position_embeddings")
            factor = max_position / original
        method = sc.YaRN(
            float(factor),
            original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor=params.get("attention_factor"),
            truncate=bool(params.get("truncate", True)),
        )
    elif rope_type == "longrope":
        method = sc.LongRoPE(
            _required(params, "short_factor", rope_type, list),
            _required(params, "long_factor", rope_type, list),
            original,
            factor=params.get("factor"),
            attention_factor=params.get("attention_factor"),
        )
    elif rope_type == "llama3":
        method = sc.Llama3(
            _required(params, "factor", rope_type),
            _required(params, "low_freq_factor", rope_type),
            _required(params, "high_freq_factor", rope_type),
            original,
        )
    elif rope_type == "proportional":
        method = sc.Proportional(partial, float(params.get("factor", 1.0)))
        rotary_dim = int(head_dim)
    return {
        "layout": "interleaved" if _interleaved(cfg) else "half",
        "head_dim": int(head_dim),
        "base": base,
        "rotary_dim": rotary_dim,
        "scaling": method,
        "max_position": int(max_position) if max_position else None,
    }
