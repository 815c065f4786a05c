"""RoPE.from_hf_config reads every config form transformers accepts (checked against transformers
itself in tests/peers)."""

from __future__ import annotations

from typing import Any

import pytest

import anyrope
from anyrope import scaling as sc

LLAMA3 = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}


def test_plain_config() -> None:
    rope = anyrope.RoPE.from_hf_config(
        {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096}
    )
    assert (rope.head_dim, rope.rotary_dim, rope.base, rope.layout) == (128, 128, 10000.0, "half")
    assert rope.scaling is None
    assert rope.max_position == 4096


def test_old_style_rope_scaling_with_type_or_rope_type() -> None:
    old = {**LLAMA3, "rope_scaling": {**LLAMA3["rope_scaling"], "type": "llama3"}}  # type: ignore[dict-item]
    del old["rope_scaling"]["rope_type"]
    for config in (LLAMA3, old):
        rope = anyrope.RoPE.from_hf_config(config)
        assert rope.scaling == sc.Llama3(8.0, 1.0, 4.0, 8192)
        assert rope.base == 500000.0


def test_v5_rope_parameters_carry_theta_and_partial_factor() -> None:
    config = {
        "head_dim": 80,
        "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 25000.0, "partial_rotary_factor": 0.4},
    }
    rope = anyrope.RoPE.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.base) == (80, 32, 25000.0)


def test_rope_scaling_wins_over_rope_parameters() -> None:
    config = {
        "head_dim": 64,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "rope_parameters": {"rope_type": "linear", "factor": 4.0},
    }
    assert anyrope.RoPE.from_hf_config(config).scaling == sc.Linear(2.0)


def test_top_level_original_max_position_wins_for_longrope() -> None:
    short, long = [1.0] * 48, [2.0] * 48
    config = {
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "original_max_position_embeddings": 999,
        },
    }
    rope = anyrope.RoPE.from_hf_config(config)
    assert rope.scaling == sc.LongRoPE(short, long, 4096)
    assert rope.attention_scaling == pytest.approx(
        (1 + __import__("math").log(32) / __import__("math").log(4096)) ** 0.5
    )


@pytest.mark.parametrize("legacy", ["su", "yarn"])
def test_phi3_legacy_names_mean_longrope(legacy: str) -> None:
    config = {
        "model_type": "phi3",
        "head_dim": 8,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,
        "rope_scaling": {"type": legacy, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
    }
    assert isinstance(anyrope.RoPE.from_hf_config(config).scaling, sc.LongRoPE)


def test_yarn_defaults_and_optional_keys() -> None:
    qwen = {
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "rope_theta": 1e6,
        "max_position_embeddings": 32768,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    }
    assert anyrope.RoPE.from_hf_config(qwen).scaling == sc.YaRN(4.0, 32768)
    gpt_oss = {
        "head_dim": 64,
        "rope_theta": 150000.0,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
    }
    assert anyrope.RoPE.from_hf_config(gpt_oss).scaling == sc.YaRN(32.0, 4096, truncate=False)
    no_factor = {
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_scaling": {
            "type": "yarn",
            "original_max_position_embeddings": 2048,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "beta_fast": None,
        },
    }
    assert anyrope.RoPE.from_hf_config(no_factor).scaling == sc.YaRN(
        4.0, 2048, mscale=1.0, mscale_all_dim=0.5
    )


def test_dynamic_uses_max_position_embeddings_as_the_original_length() -> None:
    config = {
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "dynamic", "factor": 2.0},
    }
    assert anyrope.RoPE.from_hf_config(config).scaling == sc.DynamicNTK(2.0, 4096)


def test_gpt_neox_key_names() -> None:
    config = {"hidden_size": 6144, "num_attention_heads": 64, "rotary_pct": 0.25, "rotary_emb_base": 10000}
    rope = anyrope.RoPE.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim) == (96, 24)


def test_proportional_rotates_the_whole_head_with_zero_tail() -> None:
    config = {
        "head_dim": 16,
        "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
    }
    rope = anyrope.RoPE.from_hf_config(config)
    assert rope.rotary_dim == 16
    assert rope.inv_freq[2:] == (0.0,) * 6


def test_nested_layer_types() -> None:
    config: dict[str, Any] = {
        "head_dim": 16,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    }
    with pytest.raises(
        ValueError, match="per layer type \\(sliding_attention, full_attention\\); pass layer_type="
    ):
        anyrope.RoPE.from_hf_config(config)
    full = anyrope.RoPE.from_hf_config(config, layer_type="full_attention")
    assert (full.base, full.scaling) == (1e6, sc.Linear(8.0))
    with pytest.raises(ValueError, match="layer_type='global' is not in this config"):
        anyrope.RoPE.from_hf_config(config, layer_type="global")


def test_layout_is_half_unless_told() -> None:
    assert anyrope.RoPE.from_hf_config(LLAMA3).layout == "half"
    assert anyrope.RoPE.from_hf_config(LLAMA3, layout="meta").layout == "interleaved"
    deepseek = {**LLAMA3, "rope_interleave": True}
    assert anyrope.RoPE.from_hf_config(deepseek).layout == "interleaved"
    assert anyrope.RoPE.from_hf_config(deepseek, layout="half").layout == "half"
    # DeepSeek-V3's config.json omits the key; its transformers config defaults it to True.
    assert anyrope.RoPE.from_hf_config({**LLAMA3, "model_type": "deepseek_v3"}).layout == "interleaved"
    assert (
        anyrope.RoPE.from_hf_config({**LLAMA3, "model_type": "deepseek_v3", "rope_interleave": False}).layout
        == "half"
    )


def test_deepseek_rotates_the_qk_rope_slice() -> None:
    config = {
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
    }
    assert anyrope.RoPE.from_hf_config(config).head_dim == 64


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        (
            {"head_dim": 64, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
            ValueError,
            "rope_type='mrope' is not supported \\(multi-axis",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"rope_type": "fancy"}},
            ValueError,
            "rope_type='fancy' is not supported; anyrope reads default, linear",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"type": "linear"}},
            ValueError,
            "need 'factor' for rope_type='linear'",
        ),
        ({"rope_theta": 1e4}, ValueError, "needs head_dim, or hidden_size and num_attention_heads"),
        (
            {"head_dim": 64, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
            ValueError,
            "needs max_position_embeddings",
        ),
        ("llama", TypeError, "config must be a config.json dict or a transformers config object, not str"),
        ({"head_dim": 64, "rope_scaling": [1, 2]}, TypeError, "must be a dict"),
    ],
)
def test_rejects(config: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE.from_hf_config(config)


def test_accepts_objects_with_to_dict() -> None:
    class Config:
        def to_dict(self) -> dict[str, Any]:
            return dict(LLAMA3)

    assert anyrope.RoPE.from_hf_config(Config()).scaling == sc.Llama3(8.0, 1.0, 4.0, 8192)
