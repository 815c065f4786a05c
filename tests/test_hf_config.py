"""RoPE.from_hf_config reads every config form transformers accepts (checked against transformers
itself in tests/peers)."""

from __future__ import annotations

import math
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
            {"head_dim": 64, "rope_scaling": {"type": "mrope", "mrope_section": "16,24,24"}},
            TypeError,
            "mrope_section is '16,24,24'; it must be a list of ints",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"rope_type": "fancy"}},
            ValueError,
            "rope_type='fancy' is not supported; anyrope reads default, linear",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"type": "linear"}},
            ValueError,
            "rope_scaling needs 'factor'",
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


# --- model families (anyrope._families): pairing, width keys, layers -----------------------


@pytest.mark.parametrize("model_type", ["cohere", "glm", "deepseek_v2", "helium", "ernie4_5", "llama4_text"])
def test_interleaved_families(model_type: str) -> None:
    config = {"model_type": model_type, "hidden_size": 512, "num_attention_heads": 4, "head_dim": 128}
    assert anyrope.RoPE.from_hf_config(config).layout == "interleaved"


def test_gptj_reads_its_own_key_names() -> None:
    config = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048}
    rope = anyrope.RoPE.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.layout, rope.max_position) == (256, 64, "interleaved", 2048)


def test_llama_style_families_rotate_the_whole_head() -> None:
    # transformers' Llama rotary ignores partial_rotary_factor for its default rope type
    config = {"model_type": "llama", "head_dim": 64, "partial_rotary_factor": 0.5}
    assert anyrope.RoPE.from_hf_config(config).rotary_dim == 64
    assert anyrope.RoPE.from_hf_config({**config, "model_type": "phi"}).rotary_dim == 32


@pytest.mark.parametrize(
    ("config", "section", "interleaved"),
    [
        # transformers drops "mrope" and keeps the sections; the family's module has a default
        ({"model_type": "qwen2_vl_text", "head_dim": 128}, (16, 24, 24), False),
        (
            {
                "model_type": "qwen2_vl_text",
                "head_dim": 128,
                "rope_scaling": {"type": "mrope", "mrope_section": [8, 28, 28]},
            },
            (8, 28, 28),
            False,
        ),
        # a hub config: the text model's under text_config
        (
            {
                "model_type": "qwen2_vl",
                "text_config": {"model_type": "qwen2_vl_text", "hidden_size": 512, "num_attention_heads": 4},
            },
            (16, 24, 24),
            False,
        ),
        ({"model_type": "qwen3_vl_text", "head_dim": 128}, (24, 20, 20), True),
        # Qwen3.5 rotates a quarter of each head; the time section is never read, so it takes the rest
        (
            {
                "model_type": "qwen3_5_text",
                "head_dim": 256,
                "partial_rotary_factor": 0.25,
                "rope_parameters": {"mrope_section": [99, 11, 10]},
            },
            (11, 11, 10),
            True,
        ),
        # Qwen4-exp's default config rotates every feature: pairs past the sections follow time
        ({"model_type": "qwen4_exp_text", "head_dim": 128}, (43, 11, 10), True),
        ({"model_type": "glm4v_text", "head_dim": 128, "partial_rotary_factor": 0.5}, (8, 12, 12), False),
        # NeoMME: rows and columns on alternate pairs
        ({"model_type": "neomme", "head_dim": 64, "rope_parameters": {"rope_theta": 1e4}}, (16, 16), True),
        # a config of unknown family reads mrope_interleaved, as vLLM does
        (
            {"head_dim": 128, "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24]}},
            (16, 24, 24),
            False,
        ),
        (
            {"head_dim": 128, "rope_parameters": {"mrope_section": [24, 20, 20], "mrope_interleaved": True}},
            (24, 20, 20),
            True,
        ),
    ],
)
def test_multi_axis_configs(config: dict[str, Any], section: tuple[int, ...], interleaved: bool) -> None:
    rope = anyrope.RoPE.from_hf_config(config)
    assert rope.mrope_section == section
    assert rope.mrope_interleaved is interleaved


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "qwen2_vl_text", "head_dim": 64}, r"adds up to 64 pairs but rotary_dim=64 has 32"),
        (
            {"model_type": "qwen3_vl_text", "head_dim": 128, "rope_parameters": {"mrope_section": [24, 20]}},
            r"mrope_section=\[24, 20\] must have 3 entries",
        ),
        (
            {"model_type": "llama", "head_dim": 64, "rope_parameters": {"mrope_section": [8, 12, 12]}},
            "'llama' models rotate with one position",
        ),
        (
            {"model_type": "llama", "head_dim": 64, "rope_scaling": {"type": "mrope"}},
            "rope_type='mrope' \\(M-RoPE\\), but 'llama'",
        ),
        (
            {"model_type": "ernie4_5_vl_moe_text", "hidden_size": 256, "num_attention_heads": 4},
            r"mrope_section=\[22, 22, 20\] must give height and width the same number of pairs .* the 32 pairs",
        ),
        (
            {
                "model_type": "ernie4_5_vl_moe_text",
                "head_dim": 64,
                "rope_parameters": {"mrope_section": [12, 10, 10]},
            },
            "must give height and width the same number of pairs",
        ),
        (
            {
                "model_type": "ernie4_5_vl_moe_text",
                "head_dim": 64,
                "rope_parameters": {"mrope_section": [16, 16]},
            },
            r"3 non-negative ints: \[height, width, time\]",
        ),
        ({"model_type": "hunyuan_vl_text", "head_dim": 128}, "different position streams"),
    ],
)
def test_multi_axis_configs_anyrope_refuses(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        anyrope.RoPE.from_hf_config(config)


def test_ernie_alternates_height_and_width_then_time() -> None:
    """ERNIE 4.5-VL: mrope_section is [height, width, time]; pairs 0, 2, ... below height + width
    follow height (stream 1), the odd ones width (stream 2), the rest time, each at its own
    frequency (the peers session checks the tables against the family's rotary module)."""
    rope = anyrope.RoPE.from_hf_config(
        {
            "model_type": "ernie4_5_vl_moe_text",
            "head_dim": 32,
            "rope_parameters": {"mrope_section": [5, 5, 6]},
        }
    )
    assert rope.pair_streams == (1, 2) * 5 + (0,) * 6
    assert rope.pair_frequencies == tuple(range(16))
    assert (rope.layout, rope.base, rope.streams) == ("interleaved", 500000.0, 3)
    default = anyrope.RoPE.from_hf_config({"model_type": "ernie4_5_vl_moe_text", "head_dim": 128})
    assert default.pair_streams == (1, 2) * 22 + (0,) * 20


DEEPSEEK_V4 = {
    "model_type": "deepseek_v4",
    "qk_rope_head_dim": 64,
    "num_hidden_layers": 3,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 10000.0},
        "compress": {
            "rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
            "original_max_position_embeddings": 65536, "attention_factor": 1.0,
        },
    },
}  # fmt: skip


def test_deepseek_v4_layers_read_their_rope_labels() -> None:
    """Sliding layers take the "main" parameters, compressed ones "compress" (the model rotates
    values and turns outputs back with the same tables: rope(o, ..., inverse=True))."""
    main = anyrope.RoPE.from_hf_config(DEEPSEEK_V4, layer_type="main")
    compress = anyrope.RoPE.from_hf_config(DEEPSEEK_V4, layer_type="compress")
    assert (main.head_dim, main.layout, main.base, main.scaling) == (64, "interleaved", 10000.0, None)
    assert (compress.base, type(compress.scaling).__name__, compress.attention_scaling) == (
        160000.0,
        "YaRN",
        1.0,
    )
    layers = anyrope.RoPE.layers_from_hf_config(DEEPSEEK_V4)
    assert [rope.inv_freq if rope else None for rope in layers] == [main.inv_freq] + [compress.inv_freq] * 2
    assert anyrope.RoPE.from_hf_config(DEEPSEEK_V4, layer_type="sliding_attention").inv_freq == main.inv_freq


def test_clvp_rotates_its_own_width() -> None:
    """ClvpRotaryPositionalEmbedding: max(projection_dim // (2 * heads), 32) features of the head."""
    config = {
        "model_type": "clvp_encoder",
        "hidden_size": 768,
        "num_attention_heads": 12,
        "projection_dim": 768,
    }
    rope = anyrope.RoPE.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.layout, rope.base) == (64, 32, "half", 10000.0)
    wide = anyrope.RoPE.from_hf_config({**config, "projection_dim": 1536})
    assert wide.rotary_dim == 64
    with pytest.raises(ValueError, match=r"give 128 rotated features.*at most head_dim=64"):
        anyrope.RoPE.from_hf_config({**config, "projection_dim": 3072})


def test_mistral_large4_scale_comes_from_the_checkpoint() -> None:
    """The config does not hold exp(alpha): from_hf_config gives the rotation without it, and
    with_frequency_scale adds the checkpoint's (use_anyrope reads it from the rotary module)."""
    rope = anyrope.RoPE.from_hf_config({"model_type": "mistral_large4_text", "qk_rope_head_dim": 8})
    assert rope.frequency_scale is None
    assert rope.layout == "interleaved"
    alpha = (0.1, -0.2, 0.0, 0.3)
    scaled = rope.with_frequency_scale([math.exp(a) for a in alpha])
    assert scaled.inv_freq == tuple(f * math.exp(a) for f, a in zip(rope.inv_freq, alpha, strict=True))


def test_nanochat_turns_clockwise() -> None:
    rope = anyrope.RoPE.from_hf_config(
        {"model_type": "nanochat", "hidden_size": 256, "num_attention_heads": 4}
    )
    assert rope.clockwise
    assert rope.layout == "half"
    assert not anyrope.RoPE.from_hf_config({"model_type": "llama", "head_dim": 64}).clockwise


GEMMA4 = {
    "model_type": "gemma4_text",
    "head_dim": 256,
    "num_hidden_layers": 3,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
    },
}


def test_gemma4_full_attention_layers_are_wider() -> None:
    """transformers builds per_layer_config from global_head_dim (default 512) for the
    full-attention layers; a saved config carries per_layer_config itself."""
    full = anyrope.RoPE.from_hf_config(GEMMA4, layer_type="full_attention")
    assert (full.head_dim, full.rotary_dim, full.base) == (512, 512, 1e6)
    assert full.scaling == sc.Proportional(0.25)
    assert anyrope.RoPE.from_hf_config(GEMMA4, layer_type="sliding_attention").head_dim == 256
    assert anyrope.RoPE.from_hf_config({**GEMMA4, "global_head_dim": 384}, layer=2).head_dim == 384
    assert anyrope.RoPE.from_hf_config({**GEMMA4, "global_head_dim": 384}, layer=1).head_dim == 256
    saved = {**GEMMA4, "per_layer_config": {"2": {"head_dim": 320, "num_key_value_heads": 1}}}
    assert anyrope.RoPE.from_hf_config(saved, layer_type="full_attention").head_dim == 320
    assert anyrope.RoPE.from_hf_config(saved, layer=2).head_dim == 320
    assert [r.head_dim for r in anyrope.RoPE.layers_from_hf_config(saved)] == [256, 256, 320]


@pytest.mark.parametrize(
    ("per_layer", "error", "match"),
    [
        ([{"head_dim": 320}], TypeError, "per_layer_config must be a dict"),
        ({"last": {"head_dim": 320}}, TypeError, "its keys are layer indices"),
        ({"2": 320}, TypeError, r"per_layer_config\['2'\] must be a dict"),
        ({"0": {"head_dim": 128}}, ValueError, "layers of type 'sliding_attention' differ"),
    ],
)
def test_malformed_per_layer_config(per_layer: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE.from_hf_config({**GEMMA4, "per_layer_config": per_layer}, layer_type="sliding_attention")


def test_per_layer_head_widths_need_a_layer() -> None:
    config = {"head_dim": 64, "per_layer_config": {"1": {"head_dim": 128}}, "num_hidden_layers": 2}
    with pytest.raises(ValueError, match="head_dim differs by layer"):
        anyrope.RoPE.from_hf_config(config)
    assert anyrope.RoPE.from_hf_config(config, layer=1).head_dim == 128
    # overrides of keys that do not touch the rotation change nothing
    assert (
        anyrope.RoPE.from_hf_config(
            {**config, "per_layer_config": {"1": {"num_key_value_heads": 1}}}
        ).head_dim
        == 64
    )


def test_phimoe_short_and_long_mscales() -> None:
    config = {
        "model_type": "phimoe",
        "head_dim": 8,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 1e6,
            "original_max_position_embeddings": 4096,
            "short_factor": [1.0, 1.1, 1.2, 1.3],
            "long_factor": [2.0, 2.5, 3.0, 3.5],
            "short_mscale": 1.243,
            "long_mscale": 1.243,
        },
    }
    rope = anyrope.RoPE.from_hf_config(config)
    assert rope.scaling == sc.LongRoPE(
        [1.0, 1.1, 1.2, 1.3], [2.0, 2.5, 3.0, 3.5], 4096, attention_factor=1.243, long_attention_factor=1.243
    )
    params = config["rope_parameters"]
    with pytest.raises(ValueError, match="needs 'long_mscale'"):
        anyrope.RoPE.from_hf_config(
            {**config, "rope_parameters": {k: v for k, v in params.items() if k != "long_mscale"}}
        )
    with pytest.raises(ValueError, match=r"short_mscale and long_mscale.*'linear'"):
        anyrope.RoPE.from_hf_config({**config, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})


def test_layers_without_rotary() -> None:
    smol = {"model_type": "smollm3", "head_dim": 64, "num_hidden_layers": 8, "rope_theta": 2e6}
    assert [r is not None for r in anyrope.RoPE.layers_from_hf_config(smol)] == [True, True, True, False] * 2
    with pytest.raises(ValueError, match="layer 3 of this smollm3 config has no rotary embedding"):
        anyrope.RoPE.from_hf_config(smol, layer=3)
    cohere2 = {
        "model_type": "cohere2", "head_dim": 64, "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    }  # fmt: skip
    assert [r is not None for r in anyrope.RoPE.layers_from_hf_config(cohere2)] == [True, True, True, False]
    assert anyrope.RoPE.from_hf_config(cohere2, layer=0).layout == "interleaved"
    exaone = {**cohere2, "model_type": "exaone4"}
    assert [r is not None for r in anyrope.RoPE.layers_from_hf_config(exaone)] == [True] * 4
    windowed = [r is not None for r in anyrope.RoPE.layers_from_hf_config({**exaone, "sliding_window": 128})]
    assert windowed == [True, True, True, False]
    granite = {
        "model_type": "granite_swa",
        "head_dim": 64,
        "num_hidden_layers": 3,
        "layer_rope_theta": [1e4, 0, 5e5],
    }
    ropes = anyrope.RoPE.layers_from_hf_config(granite)
    assert ropes[1] is None
    assert (ropes[0].base, ropes[2].base) == (1e4, 5e5)  # type: ignore[union-attr]
    hybrid = {"head_dim": 64, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}
    assert [r is not None for r in anyrope.RoPE.layers_from_hf_config(hybrid)] == [False, True]


def test_a_layer_takes_its_layer_types_parameters() -> None:
    gemma = {
        "model_type": "gemma3_text", "head_dim": 64, "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    }  # fmt: skip
    ropes = anyrope.RoPE.layers_from_hf_config(gemma)
    assert [(r.base, r.scaling) for r in ropes if r is not None] == [(10000.0, None), (1e6, sc.Linear(8.0))]
    beam = {
        **gemma,
        "model_type": "beam",
        "rope_parameters": {**gemma["rope_parameters"], "full_attention": None},
    }
    assert anyrope.RoPE.layers_from_hf_config(beam)[1] is None
    with pytest.raises(ValueError, match="pass layer or layer_type, not both"):
        anyrope.RoPE.from_hf_config(gemma, layer=0, layer_type="full_attention")


# --- malformed configs: a clear error naming the key ---------------------------------------

GOOD = {"hidden_size": 512, "num_attention_heads": 4, "max_position_embeddings": 4096, "rope_theta": 1e4}


def _yarn(**extra: Any) -> dict[str, Any]:
    return {**GOOD, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                     **extra}}  # fmt: skip


def _longrope(**extra: Any) -> dict[str, Any]:
    pairs = 64
    return {**GOOD, "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * pairs,
                                     "long_factor": [2.0] * pairs, "original_max_position_embeddings": 1024,
                                     **extra}}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({**GOOD, "num_attention_heads": 0}, ValueError, "'num_attention_heads' is 0; it must be at least 1"),
        ({**GOOD, "hidden_size": "512"}, TypeError, "'hidden_size' is '512'; it must be an int, not str"),
        ({**GOOD, "head_dim": "64"}, TypeError, "'head_dim' is '64'; it must be an int"),
        ({**GOOD, "head_dim": 64.5}, ValueError, "'head_dim' is 64.5; it must be a whole number"),
        ({**GOOD, "rope_theta": "1e4"}, TypeError, "'rope_theta' is '1e4'; it must be a number"),
        ({**GOOD, "rope_theta": None}, TypeError, "'rope_theta' is None; it must be a number"),
        (
            {**GOOD, "rope_theta": float("nan")},
            ValueError,
            "'rope_theta' is nan; it must be a positive finite number",
        ),
        ({**GOOD, "max_position_embeddings": "4096"}, TypeError, "'max_position_embeddings' is '4096'"),
        (
            {**GOOD, "rope_interleave": "false"},
            TypeError,
            "'rope_interleave' is 'false'; it must be true or false",
        ),
        (
            {**GOOD, "hidden_size": 510},
            ValueError,
            "hidden_size=510 is not divisible by num_attention_heads=4",
        ),
        (
            {**GOOD, "rope_scaling": {"type": "linear", "factor": True}},
            TypeError,
            "'factor' in rope_scaling is True",
        ),
        (
            {**GOOD, "rope_scaling": {"type": "linear", "factor": "2"}},
            TypeError,
            "'factor' in rope_scaling is '2'",
        ),
        (_yarn(mscale=float("nan")), ValueError, "'mscale' in rope_scaling is nan"),
        (_yarn(mscale_all_dim=-1.0), ValueError, "'mscale_all_dim' in rope_scaling is -1.0"),
        (_yarn(attention_factor=-0.5), ValueError, "'attention_factor' in rope_scaling is -0.5"),
        ({**_yarn(), "rope_theta": 1.0}, ValueError, "YaRN needs a base above 1"),
        (_longrope(attention_factor=-1.0), ValueError, "'attention_factor' in rope_scaling is -1.0"),
        (
            _longrope(short_factor=[1.0] * 3),
            ValueError,
            "'short_factor' in rope_scaling has 3 entries; it needs 64",
        ),
        (
            _longrope(long_factor="2.0" * 64),
            TypeError,
            "'long_factor' in rope_scaling must be a list of numbers",
        ),
        (_longrope(long_factor=["2"] * 64), TypeError, r"'long_factor' in rope_scaling\[0\] is '2'"),
    ],
)
def test_malformed_configs_name_the_key(config: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE.from_hf_config(config)


def test_a_factor_below_one_warns_as_transformers_does() -> None:
    with pytest.warns(UserWarning, match="factor=0.5 < 1 shrinks the context"):
        rope = anyrope.RoPE.from_hf_config({**GOOD, "rope_scaling": {"type": "linear", "factor": 0.5}})
    assert rope.scaling == sc.Linear(0.5)


def test_hunyuan_alpha_raises_the_base_at_every_length() -> None:
    """HunYuan labels a fixed NTK stretch "dynamic": with an alpha, base * alpha ** (d / (d - 2))."""
    config = {
        "model_type": "hunyuan_v1_dense",
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0},
    }
    rope = anyrope.RoPE.from_hf_config(config)
    assert rope.scaling is None
    assert rope.base == pytest.approx(10000.0 * 1000.0 ** (128 / 126), rel=1e-15)
    llama = anyrope.RoPE.from_hf_config({**config, "model_type": "llama"})  # Llama ignores alpha
    assert llama.base == 10000.0
    assert llama.scaling is not None
    with pytest.raises(ValueError, match="alpha"):
        anyrope.RoPE.from_hf_config(
            {**config, "rope_parameters": {**config["rope_parameters"], "alpha": -1.0}}
        )


def test_rope_types_as_the_family_takes_them() -> None:
    """GPT-J keeps a fixed sin/cos table (scaling is ignored); RecurrentGemma refuses scaling."""
    linear = {"rope_type": "linear", "factor": 2.0}
    gptj = {"model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 16, "rope_scaling": linear}
    assert anyrope.RoPE.from_hf_config(gptj).scaling is None
    gemma = {
        "model_type": "recurrent_gemma",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "rope_scaling": linear,
    }
    with pytest.raises(ValueError, match="plain RoPE only and refuse rope_type='linear'"):
        anyrope.RoPE.from_hf_config(gemma)


def test_layer_flags_and_scaled_layers() -> None:
    """MuseSpark's layer_rope_theta only marks NoPE layers; Molmo2 scales only rope_scaling_layers."""
    muse = {
        "model_type": "muse_spark_text",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "rope_theta": 500000.0,
        "layer_rope_theta": [500000.0, 0, 10000.0],
    }
    assert anyrope.RoPE.from_hf_config(muse, layer=2).base == 500000.0
    with pytest.raises(ValueError, match=r"layer 1 .* no rotary embedding"):
        anyrope.RoPE.from_hf_config(muse, layer=1)
    molmo = {
        "model_type": "molmo2_text",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "rope_scaling_layers": [0],
    }
    assert anyrope.RoPE.from_hf_config(molmo, layer=0).scaling == sc.Linear(2.0)
    assert anyrope.RoPE.from_hf_config(molmo, layer=1).scaling is None


def test_rotary_value_is_refused() -> None:
    config = {"model_type": "roformer", "hidden_size": 256, "num_attention_heads": 4, "rotary_value": True}
    with pytest.raises(ValueError, match="rotary_value=True"):
        anyrope.RoPE.from_hf_config(config)


@pytest.mark.parametrize(
    ("model_type", "key", "value"),
    [
        ("esm", "position_embedding_type", "absolute"),
        ("wav2vec2-conformer", "position_embeddings_type", "relative"),
        ("wav2vec2-bert", "position_embeddings_type", "relative_key"),
        ("seamless_m4t", "position_embeddings_type", "relative"),
    ],
)
def test_a_config_switched_off_rotary_is_refused(model_type: str, key: str, value: str) -> None:
    config = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4, key: value}
    with pytest.raises(ValueError, match=rf"uses no rotary embedding \({key}='{value}', not 'rotary'\)"):
        anyrope.RoPE.from_hf_config(config)
    assert anyrope.RoPE.from_hf_config({**config, key: "rotary"}).head_dim == 64


def test_speech_conformers_read_their_own_keys() -> None:
    """rotary_embedding_base is their theta; SeamlessM4T's speech encoder has heads and layers of
    its own, which win over the text decoder's (its num_attention_heads, num_hidden_layers)."""
    conformer = {
        "model_type": "wav2vec2-conformer",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "position_embeddings_type": "rotary",
        "rotary_embedding_base": 500,
    }
    rope = anyrope.RoPE.from_hf_config(conformer)
    assert (rope.head_dim, rope.rotary_dim, rope.layout, rope.base) == (64, 64, "half", 500.0)
    seamless = {
        **conformer,
        "model_type": "seamless_m4t",
        "num_attention_heads": 4,
        "num_hidden_layers": 6,
        "speech_encoder_attention_heads": 2,
        "speech_encoder_layers": 3,
    }
    ropes = anyrope.RoPE.layers_from_hf_config(seamless)
    assert [(r.head_dim, r.base) for r in ropes] == [(128, 500.0)] * 3  # type: ignore[union-attr]
    # transformers' rope scaling does not reach their rotary module
    scaled = {**conformer, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert anyrope.RoPE.from_hf_config(scaled).scaling is None


def test_transformers_5_24_families_from_saved_configs() -> None:
    """What a config.json of each new 5.24 family leaves out is read as its config class fills it."""
    # HY-V4-VL: interleaved pairs of the qk_rope_head_dim slice, Qwen3-VL-style interleaved sections
    hy = anyrope.RoPE.from_hf_config({"model_type": "hy_v4_vl_text", "head_dim": 256, "qk_rope_head_dim": 64})
    assert (hy.layout, hy.rotary_dim, hy.mrope_section) == ("interleaved", 64, (12, 10, 10))
    assert hy.pair_streams[:6] == (0, 1, 2, 0, 1, 2)
    assert hy.pair_streams[-2:] == (0, 0)
    # Sarvam-MLA: rope_interleave defaults to true; the remote code's "deepseek_yarn" is YaRN
    sarvam = {
        "model_type": "sarvam_mla",
        "head_dim": 576,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 4096,
    }
    assert anyrope.RoPE.from_hf_config(sarvam).layout == "interleaved"
    assert anyrope.RoPE.from_hf_config({**sarvam, "rope_interleave": False}).layout == "half"
    legacy = {
        **sarvam,
        "rope_scaling": {"type": "deepseek_yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    }
    assert anyrope.RoPE.from_hf_config(legacy).scaling == sc.YaRN(4.0, 1024)
    with pytest.raises(ValueError, match="'deepseek_yarn' is not supported"):
        anyrope.RoPE.from_hf_config({**legacy, "model_type": "deepseek_v3"})
    # default thetas: Sarvam-MoE 8e6, EXAONE 3 5e5 (its num_layers is num_hidden_layers), Apertus 1.5 1.2e7
    moe = anyrope.RoPE.from_hf_config(
        {"model_type": "sarvam_moe", "head_dim": 64, "partial_rotary_factor": 0.5}
    )
    assert (moe.base, moe.rotary_dim) == (8e6, 32)
    exaone = {"model_type": "exaone", "hidden_size": 4096, "num_attention_heads": 32, "num_layers": 3}
    assert [r.base for r in anyrope.RoPE.layers_from_hf_config(exaone)] == [5e5] * 3  # type: ignore[union-attr]
    assert anyrope.RoPE.from_hf_config({"model_type": "apertus1p5_text", "head_dim": 128}).base == 1.2e7
    # LARA-mini: only the sliding-attention layers rotate (its full-attention layers are NoPE)
    lara = {
        "model_type": "lara_mini", "head_dim": 128, "num_hidden_layers": 5,
        "layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"],
    }  # fmt: skip
    rotating = [r is not None for r in anyrope.RoPE.layers_from_hf_config(lara)]
    assert rotating == [False, True, False, False, True]


def test_dory_saved_configs_list_mlp_blocks() -> None:
    thetas = {"sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_theta": 1e7}}
    layers = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    saved = {
        "model_type": "dory", "head_dim": 256, "num_hidden_layers": 8, "rope_parameters": thetas,
        "layer_types": [block for kind in layers for block in (kind, "mlp")],
    }  # fmt: skip
    assert [r.base for r in anyrope.RoPE.layers_from_hf_config(saved)] == [1e4, 1e4, 1e4, 1e7]  # type: ignore[union-attr]
    assert anyrope.RoPE.from_hf_config(saved, layer=3).base == 1e7
    with pytest.raises(ValueError, match="layer=4 is out of range: this config has 4 layers"):
        anyrope.RoPE.from_hf_config(saved, layer=4)
    unpaired = {**saved, "layer_types": ["sliding_attention", "mlp", "mlp", "full_attention"]}
    with pytest.raises(ValueError, match="one after every layer"):
        anyrope.RoPE.layers_from_hf_config(unpaired)
    with pytest.raises(ValueError, match="needs rope_theta"):  # its default theta differs by layer type
        anyrope.RoPE.from_hf_config({"model_type": "dory", "head_dim": 256})


def test_an_unknown_family_is_read_the_llama_way_with_a_warning() -> None:
    config = {
        "model_type": "some_new_lm",
        "head_dim": 64,
        "partial_rotary_factor": 0.5,
        "num_hidden_layers": 2,
    }
    with pytest.warns(
        UserWarning, match=r"model_type='some_new_lm'.*layout='half'.*rotary_dim=32 of head_dim=64"
    ):
        rope = anyrope.RoPE.from_hf_config(config)
    assert (rope.layout, rope.rotary_dim) == ("half", 32)
    with pytest.warns(
        UserWarning, match=r"layout='interleaved'.*M-RoPE sections \[6, 5, 5\] \(interleaved\)"
    ):
        anyrope.RoPE.from_hf_config(
            {
                **config,
                "rope_interleave": True,
                "rope_parameters": {"mrope_section": [6, 5, 5], "mrope_interleaved": True},
            }
        )
    with pytest.warns(UserWarning, match="pin the pairing"):
        assert len(anyrope.RoPE.layers_from_hf_config(config)) == 2
    # pinned, or without a model_type (a hand-written config): no warning (warnings are errors here)
    assert anyrope.RoPE.from_hf_config(config, layout="interleaved").layout == "interleaved"
    del config["model_type"]
    assert anyrope.RoPE.from_hf_config(config).layout == "half"
