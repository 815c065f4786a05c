"""Reading a vision tower's config (``rope_type="axial"``) into the arguments of :class:`~anyrope.RoPE`.

transformers' vision rotary modules rotate image patches by their row and column (MiniMax-M3-VL
also by frame) with ``RoPE(head_dim, axial=axes, axial_frequencies=...)``'s tables; what differs
between families (frequencies, pairing, head width, axis order) comes from
:mod:`anyrope._vision_families`. Every value read is checked (:mod:`anyrope._config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._config import MISSING, ConfigReader
from ._hf_scaling import _rope_parameters
from ._vision_families import GENERIC_VISION, VisionFamily, vision_family_of

__all__ = ["parse_vision_config", "refusal", "vision_family"]

#: What a vision config's rope_type may say: transformers' vision configs turn "default" into
#: "axial" (their ``default_rope_type``), and their rotary modules refuse every other type.
_VISION_TYPES = ("axial", "default")


def vision_family(cfg: ConfigReader) -> VisionFamily | None:
    """The vision record of a config: its family's, the generic one for another config that says
    ``rope_type="axial"``, or None for a config of a text model."""
    known = vision_family_of(cfg.get("model_type"))
    if known is not None:
        return known
    for key in ("rope_scaling", "rope_parameters"):  # rope_scaling wins, as for text configs
        params = cfg.get(key, None)
        if isinstance(params, Mapping) and params:
            return GENERIC_VISION if params.get("rope_type", params.get("type")) == "axial" else None
    return None


def _head_dim(cfg: ConfigReader, family: VisionFamily) -> int:
    if family.reads_head_dim:
        found = cfg.integer("head_dim", None)
        if found is not None:
            return int(found)
    width = cfg.integer(family.width_key, None)
    heads = cfg.integer(family.heads_key, None)
    if width is None or heads is None:
        raise ValueError(
            f"this vision config needs {'head_dim, or ' if family.reads_head_dim else ''}"
            f"{family.width_key} and {family.heads_key}"
        )
    divisor = heads * (cfg.integer(family.divisor_key) if family.divisor_key else 1)
    if width % divisor:
        raise ValueError(
            f"the config's {family.width_key}={width} is not divisible by {divisor} "
            f"({family.heads_key}{f' * {family.divisor_key}' if family.divisor_key else ''})"
        )
    return int(width // divisor)


def _base(cfg: ConfigReader, params: ConfigReader, family: VisionFamily) -> float:
    for reader in (params, cfg):
        if reader.get("rope_theta") is not MISSING:
            return float(reader.number("rope_theta"))
    return family.base


def refusal(family: VisionFamily) -> str:
    """Why anyrope does not express a refused vision tower's rotation, as its errors say it."""
    return f"anyrope cannot express the rotation of {family.model_type!r} vision towers yet: {family.unsupported}"


def parse_vision_config(
    cfg: ConfigReader, family: VisionFamily, *, layer_type: str | None = None, layer: int | None = None
) -> dict[str, Any]:
    """The keyword arguments of :class:`~anyrope.RoPE` for a vision tower's rotation."""
    name = family.model_type or "this"
    if layer_type is not None or layer is not None:
        given = "layer_type" if layer_type is not None else "layer"
        raise ValueError(
            f"{given}= was given, but {name} vision configs rotate every layer alike (rope_type 'axial'); "
            f"leave {given} out"
        )
    if family.unsupported is not None:
        raise ValueError(refusal(family))
    params = _rope_parameters(cfg, None)
    rope_type = params.get("rope_type", params.get("type", "axial"))
    if rope_type not in _VISION_TYPES:
        raise ValueError(
            f"{params.where}'s rope_type is {rope_type!r}, but {name} vision towers rotate with "
            "rope_type 'axial' only (one position per axis), as transformers' vision rotary modules do"
        )
    head_dim = _head_dim(cfg, family)
    # MiniMax-M3-VL rotates 2 * ((head_dim // 3) // 2) features per axis; the others the whole head
    rotary_dim = family.axes * 2 * ((head_dim // family.axes) // 2) if family.partial else head_dim
    if rotary_dim < 2 * family.axes or rotary_dim % (2 * family.axes):
        raise ValueError(
            f"the config's head dimension is {head_dim}; {name} vision towers share its pairs out "
            f"equally among {family.axes} axes, which needs a multiple of {2 * family.axes}"
        )
    streams: dict[str, Any] = {"axial": family.axes, "axial_frequencies": family.frequencies}
    if family.frequencies == "blocks, pairs alternating":  # pair j: axis j % axes, blocks' frequency
        axes = family.axes
        pairs = range(rotary_dim // 2)
        streams = {
            "pair_streams": [j % axes for j in pairs],
            "pair_frequencies": [j - j % axes for j in pairs],
        }
    return {
        "head_dim": head_dim,
        "rotary_dim": rotary_dim,
        "base": _base(cfg, params, family),
        "layout": family.layout,
        **streams,
    }
