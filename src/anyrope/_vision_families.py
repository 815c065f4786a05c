"""How the vision towers of transformers' multimodal models rotate: data, in one place.

One record per vision config ``model_type`` (transformers 5.24, whose new vision towers do not
rotate) whose rotary module takes ``(x, position_ids)`` with one position per axis
(``rope_type="axial"``) or keeps the table of one fixed patch grid (Llama 4), and per tower
whose rotation anyrope cannot express in any form (DINOv3's patch centres): which frequencies
each axis gets, how features pair, how many axes, where the head width comes from, and what
anyrope cannot express. Gathered by reading each
family's vision rotary module and its apply function; the ``peers`` test session checks every
record against transformers. Read by :mod:`anyrope._hf_vision`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._layout import Layout

__all__ = ["GENERIC_VISION", "VISION_FAMILIES", "VisionFamily", "vision_family_of"]


@dataclass(frozen=True)
class VisionFamily:
    """How one vision tower rotates.

    ``frequencies``: :class:`~anyrope.RoPE`'s ``axial_frequencies``, "blocks" (each axis the
    spectrum of a RoPE over ``rotary_dim / axes`` features) or "alternating" (Pixtral); or
    "blocks, pairs alternating": the frequencies of "blocks", but the pairs take the axes in
    turn rather than in contiguous shares (Kimi-K2.5), a stream map. ``layout``:
    the pairing of the family's apply function. ``axes``: positions per patch. ``base``: the
    theta of the family's config class, where a config gives none. ``partial``: each
    axis rotates ``2 * ((head_dim // axes) // 2)`` features and the rest of the head passes
    (MiniMax-M3-VL); else the whole head rotates. The head width is ``head_dim`` where the module
    reads it, else ``width_key // (heads_key * divisor_key)``. ``unsupported``: why anyrope cannot
    express the rotation. ``grid_table``: the buffer in which the rotary module keeps the
    complex table (``cos + i sin``) of its config's one patch grid, ``image_size // patch_size``
    patches a side, counted from 1 on each axis, and a class token last that does not turn; the
    module takes no positions, and ``use_anyrope`` swaps the table's values (Llama 4's
    ``freqs_ci``). (Which axis a family's tables put first is learned from the module by
    ``use_anyrope``: Step3p7's, Inkling2's and Llama 4's put the column first.)
    """

    model_type: str
    frequencies: str = "blocks"
    layout: Layout = "half"
    axes: int = 2
    base: float = 10000.0
    partial: bool = False
    reads_head_dim: bool = True
    width_key: str = "hidden_size"
    heads_key: str = "num_attention_heads"
    divisor_key: str | None = None
    unsupported: str | None = None
    grid_table: str | None = None


def V(model_type: str, **fields: Any) -> VisionFamily:
    return VisionFamily(model_type, **fields)


# DINOv3's ViT and the models built on it: patch centres, not patch indices.
_PATCH_CENTRES = (
    "its positions are each patch's centre, normalised to [-1, 1] (and jittered and rescaled in "
    "training), fractional, not integer positions"
)

#: A config of unknown family with ``rope_type="axial"``: Qwen2-VL's vision rotation, the most
#: common (rows then columns, each the spectrum of half the head, half pairs); ``use_anyrope``
#: proves it against the module before patching.
GENERIC_VISION = VisionFamily("")

# SAM 2's and SAM 3's video memory attention: pairs interleaved, a head width of its own keys.
_SAM_MEMORY: dict[str, Any] = {
    "layout": "interleaved",
    "reads_head_dim": False,
    "width_key": "memory_attention_hidden_size",
    "heads_key": "memory_attention_num_attention_heads",
    "divisor_key": "memory_attention_downsample_rate",
}

VISION_FAMILIES = (
    V("cohere_compass_vision"),
    V("dinov3_vit", unsupported=_PATCH_CENTRES),
    V("dots3_note_vision_encoder"),
    V("edgetam_video", **_SAM_MEMORY),
    V(
        "efficientloftr",
        frequencies="blocks, pairs alternating",
        layout="interleaved",
        unsupported=(
            "its rotary module makes its own grid from the feature map's shape (rows and columns "
            "from 1 after the aggregation) and the attention rotates the whole hidden state before "
            "the head split; anyrope does not read that config yet (as a stream map it is "
            "pair_streams [0, 1, 0, 1, ...] with pair_frequencies [0, 0, 2, 2, ...] over hidden_size "
            "features)"
        ),
    ),
    V("eomt_dinov3", unsupported=_PATCH_CENTRES),
    V("ernie4_5_vl_moe_vision"),
    V("exaone4_5_vision"),
    V(
        "gemma4_vision",
        base=100.0,
        unsupported=(
            "it rotates each half of the head on its own, rows in the first half and columns in the "
            "second (feature i pairs with i + head_dim / 4), a pairing RoPE's layouts do not have"
        ),
    ),
    V("glm4v_moe_vision"),
    V("glm4v_vision"),
    V("glm5_next_vision"),
    V("glm_ocr_vision"),
    V("inkling2_vision", layout="interleaved"),
    V(
        "kimi_k25_vision",
        frequencies="blocks, pairs alternating",
    ),
    V("lfm3_vl_vision", base=1000000.0),
    V("llama4_vision_model", layout="interleaved", reads_head_dim=False, grid_table="freqs_ci"),
    V("minimax_m3_vl_vision", axes=3, partial=True),
    V("mlcd_vision_model"),
    V("muse_glimmer_vision"),
    V("muse_spark_vision"),
    V("paddleocr_vl_vision"),
    V("pixtral", frequencies="alternating"),
    V("qwen2_5_omni_vision_encoder"),
    V("qwen2_5_vl_vision"),
    V("qwen2_vl_vision", width_key="embed_dim"),
    V("qwen3_5_moe_vision"),
    V("qwen3_5_vision"),
    V("qwen3_omni_moe_vision_encoder"),
    V("qwen3_vl_moe_vision"),
    V("qwen3_vl_vision"),
    V("qwen4_exp_vision"),
    V("sam2_video", **_SAM_MEMORY),
    V("sapiens2", unsupported=_PATCH_CENTRES),
    V("sam3_tracker_video", **_SAM_MEMORY),
    V(
        "sam3_vit_model",
        layout="interleaved",
        unsupported=(
            "its positions are the patch's row and column scaled by window_size / grid width, "
            "fractional where the two differ, not integer positions"
        ),
    ),
    V("step3p5_vision"),
    V("video_llama_3_vision"),
    V(
        "vjepa2",
        axes=3,
        layout="interleaved",
        unsupported=(
            "it is no rotation: features 2i and 2i + 1 form a pair, but their cos and sin come from a "
            "cat(c, c) table, so the two turn by different frequencies (2i and 2i + 1 of the axis's "
            "share), which RoPE's pairs never do"
        ),
    ),
)

_BY_TYPE = {family.model_type: family for family in VISION_FAMILIES}


def vision_family_of(model_type: object) -> VisionFamily | None:
    """The vision record of ``model_type``, or None."""
    return _BY_TYPE.get(model_type) if isinstance(model_type, str) else None
