"""RoPE.from_hf_config reads vision towers' configs (``rope_type="axial"``) into axial RoPE.

The rotation each record describes is checked against the families' own rotary modules in
tests/peers/test_vision_towers.py; here, that configs are read as transformers' vision rotary
modules read them (head width, base, rotated width), and that what cannot be read is refused
with the key or the reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope._vision_families import VISION_FAMILIES

AXIAL = {"rope_type": "axial", "rope_theta": 10000.0}


def _read(config: dict[str, Any]) -> anyrope.RoPE:
    return anyrope.RoPE.from_hf_config(config)


def test_qwen2_vl_vision_tower_is_blocks_over_embed_dim() -> None:
    # hidden_size is the merger's output width, not the tower's: the module reads embed_dim
    rope = _read(
        {
            "model_type": "qwen2_vl_vision",
            "embed_dim": 1280,
            "hidden_size": 3584,
            "num_heads": 16,
            "num_attention_heads": 16,
            "rope_parameters": AXIAL,
        }
    )
    assert (rope.head_dim, rope.rotary_dim, rope.base, rope.layout) == (80, 80, 10000.0, "half")
    assert (rope.axial, rope.axial_frequencies) == (2, "blocks")


def test_blocks_is_the_spectrum_of_half_the_head_per_axis() -> None:
    """Qwen2-VL's module: inv_freq = base ** (-arange(0, d/2, 2) / (d/2)), rows then columns."""
    rope = _read({"model_type": "qwen2_5_vl_vision", "hidden_size": 64, "num_attention_heads": 4})
    positions = np.array([[3, 0, 7], [5, 2, 1]])  # (axes, patches): rows, columns
    cos, _ = rope.cos_sin(positions, like=np.zeros((), dtype=np.float64))
    inv_freq = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    expected = np.concatenate([positions[0, :, None] * inv_freq, positions[1, :, None] * inv_freq], axis=-1)
    np.testing.assert_allclose(cos, np.cos(expected), rtol=0, atol=1e-12)


def test_pixtral_alternates_frequencies() -> None:
    rope = _read({"model_type": "pixtral", "hidden_size": 1024, "head_dim": 64, "num_attention_heads": 16})
    assert (rope.head_dim, rope.axial, rope.axial_frequencies) == (64, 2, "alternating")


def test_minimax_m3_vl_rotates_three_axes_of_a_third_each() -> None:
    rope = _read({"model_type": "minimax_m3_vl_vision", "hidden_size": 1280, "num_attention_heads": 16})
    # head 80: 2 * ((80 // 3) // 2) = 26 features per axis (frames, rows, columns), the last 2 pass
    assert (rope.head_dim, rope.rotary_dim, rope.axial) == (80, 78, 3)


def test_sam_memory_attention_reads_its_own_width() -> None:
    rope = _read(
        {
            "model_type": "sam2_video",
            "memory_attention_hidden_size": 256,
            "memory_attention_num_attention_heads": 1,
            "memory_attention_downsample_rate": 1,
            "rope_parameters": AXIAL,
        }
    )
    assert (rope.head_dim, rope.layout, rope.axial) == (256, "interleaved", 2)


def test_family_default_base_and_config_theta() -> None:
    lfm = {"model_type": "lfm3_vl_vision", "hidden_size": 64, "num_attention_heads": 4}
    assert _read(lfm).base == 1e6  # its config class's default
    assert _read({**lfm, "rope_parameters": {"rope_type": "axial", "rope_theta": 500.0}}).base == 500.0
    assert _read({**lfm, "rope_theta": 42.0}).base == 42.0


def test_unknown_family_with_axial_rope_type_reads_as_qwen2_vl() -> None:
    rope = _read({"hidden_size": 64, "num_attention_heads": 4, "rope_parameters": AXIAL})
    assert (rope.head_dim, rope.axial, rope.axial_frequencies, rope.layout) == (16, 2, "blocks", "half")


def test_a_vision_tower_of_a_multimodal_dict_is_read_as_given() -> None:
    """The top-level config still means the text model; its vision_config the tower."""
    vision = {"model_type": "qwen3_vl_vision", "hidden_size": 64, "num_attention_heads": 4}
    text = {"model_type": "qwen3_vl_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}
    config = {"model_type": "qwen3_vl", "text_config": text, "vision_config": vision}
    assert _read(config).mrope_section is not None
    assert _read(config).axial is None
    assert _read(config["vision_config"]).axial == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("family", [f for f in VISION_FAMILIES if f.unsupported], ids=lambda f: f.model_type)
def test_vision_towers_anyrope_cannot_express_say_why(family: Any) -> None:
    config = {"model_type": family.model_type, "hidden_size": 64, "num_attention_heads": 4}
    with pytest.raises(ValueError, match=f"cannot express the rotation of '{family.model_type}'"):
        _read(config)


def test_every_supported_record_reads() -> None:
    for family in VISION_FAMILIES:
        if family.unsupported:
            continue
        config = {
            "model_type": family.model_type,
            family.width_key: 192,
            family.heads_key: 2,
            **({family.divisor_key: 1} if family.divisor_key else {}),
        }
        rope = _read(config)
        assert (rope.head_dim, rope.streams) == (96, family.axes), family.model_type


def test_kimi_k25_pairs_take_the_axes_in_turn() -> None:
    """Kimi-K2.5: the spectrum of half the head for each axis (as "blocks"), but pair j on axis
    j % 2; the peers session checks it against the module, which lists the column first."""
    rope = _read({"model_type": "kimi_k25_vision", "hidden_size": 64, "num_attention_heads": 4})
    assert rope.pair_streams == (0, 1) * 4
    assert rope.pair_frequencies == (0, 0, 2, 2, 4, 4, 6, 6)
    positions = np.array([[3, 0, 7], [5, 2, 1]])
    cos, _ = rope.cos_sin(positions, like=np.zeros((), dtype=np.float64))
    half = 10000.0 ** (-np.arange(0, 8, 2) / 8)  # the spectrum of 8 features
    expected = np.stack([positions[0, :, None] * half, positions[1, :, None] * half], axis=-1).reshape(3, 8)
    np.testing.assert_allclose(cos, np.cos(expected), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("config", "kwargs", "error", "match"),
    [
        (
            {"model_type": "qwen3_vl_vision", "num_attention_heads": 4},
            {},
            ValueError,
            "needs head_dim, or hidden_size",
        ),
        (
            {"model_type": "qwen3_vl_vision", "hidden_size": 66, "num_attention_heads": 4},
            {},
            ValueError,
            "hidden_size=66 is not divisible by 4",
        ),
        (
            {"model_type": "qwen3_vl_vision", "hidden_size": 72, "num_attention_heads": 4},
            {},
            ValueError,
            "head dimension is 18.*multiple of 4",
        ),
        (
            {"model_type": "qwen3_vl_vision", "head_dim": "64", "num_attention_heads": 4},
            {},
            TypeError,
            "'head_dim' is '64'",
        ),
        (
            {
                "model_type": "pixtral",
                "head_dim": 64,
                "rope_parameters": {"rope_type": "yarn", "factor": 2.0},
            },
            {},
            ValueError,
            "rope_type is 'yarn'.*'axial' only",
        ),
        (
            {
                "model_type": "pixtral",
                "head_dim": 64,
                "rope_parameters": {"rope_type": "axial", "rope_theta": -1},
            },
            {},
            ValueError,
            "rope_theta",
        ),
        (
            {"model_type": "pixtral", "head_dim": 64},
            {"layer_type": "full_attention"},
            ValueError,
            "leave layer_type out",
        ),
        ({"model_type": "pixtral", "head_dim": 64}, {"layer": 0}, ValueError, "leave layer out"),
        (
            {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_parameters": AXIAL},
            {},
            ValueError,
            "rope_type='axial'.*'llama' models rotate with one position per token",
        ),
        (
            {"model_type": "sam2_video", "rope_parameters": AXIAL},
            {},
            ValueError,
            "memory_attention_hidden_size",
        ),
    ],
)
def test_malformed_vision_configs_name_the_key(
    config: dict[str, Any], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE.from_hf_config(config, **kwargs)
