"""Building an :class:`AnyRoPE` from an mlx-lm rope config, as mlx-lm's ``initialize_rope`` does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import scaling as sc
from ..._rope import RoPE
from ._libs import _stock_initialize_rope
from ._module import AnyRoPE
from ._probe import _check

_YARN_TYPES = ("yarn", "deepseek_yarn", "telechat3-yarn")


def _required(config: Mapping[str, Any], key: str, rope_type: str) -> Any:
    if key not in config:
        raise ValueError(f"scaling_config for rope_type={rope_type!r} needs {key!r} (mlx-lm reads it)")
    return config[key]


def _hf_parameters(
    rope_type: str, config: Mapping[str, Any], max_position_embeddings: int | None
) -> tuple[dict[str, Any] | None, str | None, int | None]:
    """The rope_scaling dict that makes :meth:`RoPE.from_hf_config` rotate as mlx-lm's
    ``initialize_rope`` does, a layout that overrides ``traditional`` (or None), and the length
    whose frequencies every call uses (or None)."""
    if rope_type in ("default", "mrope"):
        if rope_type == "mrope" and len(config.get("mrope_section", [])) != 3:
            raise ValueError(
                f"mrope_section must have 3 sections, as mlx-lm requires; got {config.get('mrope_section')!r}"
            )
        # mlx-lm rotates text with plain RoPE here: text tokens share one position on every
        # M-RoPE axis, so the sections all turn alike.
        return None, None, None
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": _required(config, "factor", rope_type)}, None, None
    if rope_type == "dynamic":
        if max_position_embeddings is None:
            raise ValueError("rope_type='dynamic' needs max_position_embeddings (the original context)")
        return {"rope_type": "dynamic", "factor": _required(config, "factor", rope_type)}, None, None
    if rope_type == "llama3":
        return (
            {
                "rope_type": "llama3",
                "factor": _required(config, "factor", rope_type),
                "low_freq_factor": config.get("low_freq_factor", 1.0),
                "high_freq_factor": config.get("high_freq_factor", 4.0),
                "original_max_position_embeddings": config.get("original_max_position_embeddings", 8192),
            },
            None,
            None,
        )
    if rope_type in _YARN_TYPES:
        factor = _required(config, "factor", rope_type)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"scaling_config's factor must be a number, got {factor!r}")
        # mlx-lm multiplies the rotated features by mscale(factor, mscale) /
        # mscale(factor, mscale_all_dim), defaults 1 and 0, and ignores attention_factor.
        try:
            attention = float(sc.yarn_mscale(factor, config.get("mscale", 1))) / float(
                sc.yarn_mscale(factor, config.get("mscale_all_dim", 0))
            )
        except TypeError as exc:
            raise TypeError(f"scaling_config's mscale and mscale_all_dim must be numbers: {exc}") from None
        return (
            {
                "rope_type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": config.get("original_max_position_embeddings", 4096),
                "beta_fast": config.get("beta_fast", 32),
                "beta_slow": config.get("beta_slow", 1),
                "attention_factor": attention,
            },
            None,
            None,
        )
    if rope_type == "longrope":
        if max_position_embeddings is None:
            raise ValueError(
                "rope_type='longrope' needs max_position_embeddings (mlx-lm's SuScaledRoPE reads it)"
            )
        original = _required(config, "original_max_position_embeddings", rope_type)
        factor = max_position_embeddings / original
        attention = sc.longrope_attention(factor, original)
        params = {
            "rope_type": "longrope",
            "short_factor": _required(config, "short_factor", rope_type),
            "long_factor": _required(config, "long_factor", rope_type),
            "original_max_position_embeddings": original,
            "attention_factor": attention,
        }
        # SuScaledRoPE always rotates with the long factors, half-split: fix the length past
        # the original context so that the long factors hold at every position.
        return params, "half", int(original) + 1
    if rope_type == "proportional":
        return (
            {
                "rope_type": "proportional",
                "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
                "factor": config.get("factor", 1.0),
            },
            None,
            None,
        )
    raise ValueError(
        f"Unsupported RoPE type {rope_type!r}: mlx-lm's initialize_rope and this one read default, "
        f"linear, dynamic, llama3, {', '.join(_YARN_TYPES)}, longrope, proportional and mrope"
    )


def initialize_rope(
    dims: int,
    base: float,
    traditional: bool,
    scaling_config: Mapping[str, Any] | None = None,
    max_position_embeddings: int | None = None,
    *,
    check: bool = True,
) -> AnyRoPE:
    """The drop-in for ``mlx_lm.models.rope_utils.initialize_rope``: same arguments, an :class:`AnyRoPE`.

    The scaling is read as mlx-lm reads it (its ``type``/``rope_type`` names and defaults) and
    built exactly, in float64, by :meth:`anyrope.RoPE.from_hf_config`, where mlx-lm rounds its
    frequencies to float32.

    Parameters
    ----------
    dims : int
        Features rotated per head (inputs may be wider: the rest pass through).
    base : float
        The frequency base (``rope_theta``).
    traditional : bool
        True pairs consecutive features (anyrope's "interleaved"), False pairs i with
        i + dims / 2 ("half"). LongRoPE ignores it and pairs half-split, as mlx-lm does.
    scaling_config : dict, optional
        The model's ``rope_scaling``: ``type`` or ``rope_type`` one of default, linear, dynamic,
        llama3, yarn (deepseek_yarn, telechat3-yarn), longrope, proportional, mrope.
    max_position_embeddings : int, optional
        Needed by dynamic and longrope, as in mlx-lm.
    check : bool
        Also build mlx-lm's own module and check that both rotate a probe alike (a few
        milliseconds); a ValueError says by how much they differ.

    Raises
    ------
    ValueError, TypeError
        For an unknown rope type, a missing or malformed key (naming it), or a failed check.
    """
    if scaling_config is not None and not isinstance(scaling_config, Mapping):
        raise TypeError(f"scaling_config must be a dict or None, not {type(scaling_config).__name__}")
    config: Mapping[str, Any] = scaling_config or {}
    rope_type = config.get("type") or config.get("rope_type", "default")
    params, layout, fixed = _hf_parameters(rope_type, config, max_position_embeddings)
    hf: dict[str, Any] = {"head_dim": dims, "rope_theta": base}
    if max_position_embeddings is not None:
        hf["max_position_embeddings"] = max_position_embeddings
    if params is not None:
        hf["rope_scaling"] = params
    if layout is None:
        layout = "interleaved" if traditional else "half"
    parsed = RoPE.from_hf_config(hf, layout=layout)
    # Without max_position: it would only ask anyrope to build tables for every position up to
    # it on first use (seconds for 131072 of them); they grow with the positions used instead.
    # The scalings above took what they need from max_position_embeddings already.
    rope = RoPE(
        parsed.head_dim,
        base=parsed.base,
        rotary_dim=parsed.rotary_dim,
        layout=parsed.layout,
        scaling=parsed.scaling,
    )
    if fixed is not None:
        rope = rope.at_length(fixed)
    if rope_type == "proportional":
        rotated = int(dims * config.get("partial_rotary_factor", 1.0))
        turning = sum(f != 0 for f in rope.inv_freq)
        if turning != (rotated + 1) // 2:
            raise ValueError(
                f"proportional RoPE rotating {rotated} of {dims} features: anyrope turns {turning} "
                f"pairs where mlx-lm turns {(rotated + 1) // 2}; give a partial_rotary_factor that "
                "rotates an even number of features"
            )
    module = AnyRoPE(rope)
    if check:
        theirs = _stock_initialize_rope(dims, base, traditional, scaling_config, max_position_embeddings)
        _check(theirs, module, f"initialize_rope({dims}, {base}, {traditional}) with rope_type={rope_type!r}")
    return module
