"""What differs between transformers' model families in how they rotate: data, in one place.

One record per transformers ``model_type`` (transformers 5.24) whose modeling code applies
rotary embeddings to the queries and keys of a token sequence: how it pairs features, which
config key sets the rotated width, its default base, whether positions come in several axes
(M-RoPE), which layers rotate at all, and what anyrope cannot express yet. It was gathered by
reading each family's modeling code and running its rotary functions on one-hot inputs; the
``peers`` test session checks it against transformers. :func:`anyrope._hf.parse_hf_config`
reads it, and the docs' model-family table is generated from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._layout import Layout

__all__ = ["FAMILIES", "GENERIC", "Family", "family_of"]


@dataclass(frozen=True)
class Family:
    """How one model family rotates.

    ``layout``: the pairing; where ``layout_key`` names a config flag, the flag chooses
    "interleaved" (true, also its default ``layout_default``) or "half". ``width``: "head" (the
    whole head rotates; transformers' Llama-style rotary ignores ``partial_rotary_factor``),
    "partial" (the first ``int(head_dim * partial_rotary_factor)`` features), "rotary_dim" (an
    absolute ``rotary_dim`` key, GPT-J and CodeGen), "mla" (DeepSeek's multi-head latent
    attention: the ``qk_rope_head_dim`` slice) or "clvp" (``max(projection_dim // (2 *
    num_attention_heads), 32)`` features). ``base``: the family's default theta (None where
    it differs by layer type). ``multi_axis``: M-RoPE, "contiguous" or "interleaved" sections
    (``mrope_section`` when the config has none), "alternating" (two streams, row and column,
    over even and odd pairs: NeoMME), "alternating_then_time" (ERNIE 4.5-VL: ``mrope_section`` is
    [height, width, time]; height and width alternate over the first pairs, time takes the rest)
    or "custom" (none of these). ``nope``: the rule that says which layers do
    not rotate (see :func:`anyrope._hf.layer_rotation`). ``per_layer``: RoPE parameters nested by layer type.
    ``unsupported``: why anyrope cannot express the family's rotation yet. ``aliases``: config
    keys under the name the family's code reads (transformers' ``attribute_map``, or a key of its
    own: SeamlessM4T's speech encoder); the alias wins over the key. ``scope``: what kind of model.
    ``ntk_alpha``: a "dynamic" rope_type with an ``alpha`` is HunYuan's fixed NTK base stretch.
    ``rope_types``: "all" of transformers' rope types, "default" (the model refuses the others)
    or "fixed" (the model ignores rope scaling: a precomputed sin/cos table, or a rotary module
    that reads no rope parameters). ``not_in_model``:
    why the peers session cannot run the family in a tiny model of its own (None: it does).
    ``global_head_dim``: the head width of the full-attention layers where a config dict gives
    neither ``global_head_dim`` nor ``per_layer_config`` (Gemma 4: transformers builds
    ``per_layer_config`` from that key, with this default).
    ``mscales``: the attention factor of a scaled rotation is ``short_mscale`` within the original
    context and ``long_mscale`` beyond it (PhiMoE; LongRoPE only). ``clockwise``: pairs turn by
    ``-position * theta`` (NanoChat's ``rotate_half`` is ``cat(x2, -x1)``).
    ``rope_type_aliases``: legacy rope type names the family's config class renames (Sarvam-MLA's
    "deepseek_yarn" is "yarn"). ``mlp_blocks``: a saved config lists an "mlp" block after every
    layer in ``layer_types`` and counts blocks, not layers (Dory); read as its config class reads it.
    ``rope_keys``: the key in ``rope_parameters`` of each layer type, where the family names its
    parameters otherwise (DeepSeek-V4: "main" for sliding layers, "compress" for compressed ones).
    ``log_frequency_scale``: the rotary module's weight whose ``exp`` multiplies the frequencies,
    one per pair (Mistral Large 4's "alpha"): a checkpoint value the config does not hold, so
    ``from_hf_config`` leaves it out and ``use_anyrope`` reads it from the module.
    ``partial_default``: the ``partial_rotary_factor`` the family's config class sets where a
    config (a saved dict) has none; a mapping by layer type where it differs by layer type (NeoMME).
    """

    model_type: str
    layout: Layout = "half"
    layout_key: str | None = None
    layout_default: bool = True
    width: str = "head"
    base: float | None = 10000.0
    multi_axis: str | None = None
    mrope_section: tuple[int, ...] | None = None
    nope: str | None = None
    per_layer: bool = False
    unsupported: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    scope: str = "text_decoder"
    ntk_alpha: bool = False
    rope_types: str = "all"
    not_in_model: str | None = None
    global_head_dim: int | None = None
    mscales: bool = False
    clockwise: bool = False
    rope_type_aliases: Mapping[str, str] = field(default_factory=dict)
    mlp_blocks: bool = False
    # layer type -> its key in rope_parameters, where they differ (DeepSeek-V4's "main", "compress")
    rope_keys: Mapping[str, str] = field(default_factory=dict)
    log_frequency_scale: str | None = None
    partial_default: float | Mapping[str, float] = 1.0


def F(model_type: str, layout: Layout = "half", **fields: Any) -> Family:
    return Family(model_type, layout, **fields)


#: The reading for a config whose family is unknown (or a dict without model_type): half pairs
#: unless ``rope_interleave`` says otherwise, ``partial_rotary_factor`` or ``rotary_pct`` read,
#: and a ``qk_rope_head_dim`` slice where the config has one.
GENERIC = Family("", layout_key="rope_interleave", layout_default=False, width="partial", base=10000.0)

_MODEL_MAX_LENGTH = {"max_position_embeddings": "model_max_length"}
_BLOCK_TYPES = {"layer_types": "layers_block_type"}
_GPT2_NAMES = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}
_MPT_NAMES = {
    "hidden_size": "d_model",
    "max_position_embeddings": "max_seq_len",
    "num_attention_heads": "n_heads",
    "num_hidden_layers": "n_layers",
}
_ROPE_HEAD_DIM = {"head_dim": "qk_rope_head_dim"}
_KV_CHANNELS = {"head_dim": "kv_channels"}
_DECODER_NAMES = {
    "num_attention_heads": "decoder_num_attention_heads",
    "num_hidden_layers": "decoder_num_hidden_layers",
}
_BLOCK_TYPES_AND_WINDOW = {"layer_types": "layers_block_type", "sliding_window": "attention_window_size"}
_ATTENTION_HEAD_DIM = {"head_dim": "attention_head_dim", "layer_types": "layers_block_type"}

# M-RoPE families: the sections the rotary modules use when a config has none.
_QWEN2_VL: dict[str, Any] = {"multi_axis": "contiguous", "mrope_section": (16, 24, 24)}
_GLM_V: dict[str, Any] = {"multi_axis": "contiguous", "mrope_section": (8, 12, 12)}
_QWEN3_VL: dict[str, Any] = {"multi_axis": "interleaved", "mrope_section": (24, 20, 20)}
_QWEN3_5: dict[str, Any] = {"multi_axis": "interleaved", "mrope_section": (11, 11, 10)}
_HY_V4_VL: dict[str, Any] = {"multi_axis": "interleaved", "mrope_section": (12, 10, 10)}

# Speech conformers' encoders: they rotate only with position_embeddings_type "rotary", and rotate
# each head's slice of the hidden states (half pairs, *SelfAttention._apply_rotary_embedding)
# before the q and k projections, not q and k. The rotary module reads rotary_embedding_base and
# no rope parameters.
_SPEECH_CONFORMER: dict[str, Any] = {
    "nope": "position_embeddings_type=rotary",
    "scope": "speech_encoder",
    "rope_types": "fixed",
}
_ROTARY_EMBEDDING_BASE = {"rope_theta": "rotary_embedding_base"}

FAMILIES = (
    F("afmoe", nope="sliding_only"),
    F("apertus", base=12000000.0),
    F("apertus1p5_text", base=12000000.0, scope="text_decoder_of_multimodal"),
    F("arcee"),
    F("aria_text", scope="text_decoder_of_multimodal"),
    F("axk1", "interleaved", layout_key="rope_interleave", width="mla"),
    F("axk2", "interleaved", width="mla"),
    F("bailing_hybrid", "interleaved", width="mla", base=6000000.0, aliases=_MODEL_MAX_LENGTH),
    F("bamba", width="partial", aliases=_BLOCK_TYPES, partial_default=0.5),
    F("beam", nope="none_entry", per_layer=True),
    F("bitnet", base=500000.0),
    F("blt_global_transformer", "interleaved", base=500000.0, scope="byte_lm"),
    F("blt_local_decoder", "interleaved", base=500000.0, scope="byte_lm"),
    F("blt_local_encoder", "interleaved", base=500000.0, scope="byte_lm"),
    F("blt_patcher", "interleaved", scope="byte_lm"),
    F("chameleon"),
    F(
        "clvp_encoder",
        width="clvp",  # also rotates its values, by the same angles (rope(v, positions=...))
        scope="text_encoder",
        rope_types="fixed",
    ),
    F("codegen", "interleaved", width="rotary_dim", aliases=_GPT2_NAMES, rope_types="fixed"),
    F("cohere", "interleaved", base=500000.0),
    F("cohere2", "interleaved", nope="sliding_only"),
    F("cohere2_moe", "interleaved", nope="sliding_or_dense_prefix"),
    F(
        "cohere_compass_text",
        nope="none_entry",
        per_layer=True,
        scope="text_decoder_of_multimodal",
        **_QWEN3_VL,
    ),
    F("cosmos3_edge_text", base=100000000.0, scope="text_decoder_of_multimodal", **_QWEN3_VL),
    F("csm", base=500000.0, scope="audio_token_lm"),
    F("csm_depth_decoder_model", base=500000.0, scope="audio_token_lm"),
    F("cwm", base=1000000.0),
    F("dbrx", aliases=_MPT_NAMES),
    F("deepseek_ocr2_text", scope="text_decoder_of_multimodal"),
    F("deepseek_v2", "interleaved", width="mla"),
    F("deepseek_v3", "interleaved", layout_key="rope_interleave", width="mla"),
    F("deepseek_v32", "interleaved", width="mla"),
    F(
        "deepseek_v4",
        "interleaved",
        width="mla",
        per_layer=True,
        # sliding layers read the "main" parameters, compressed ones "compress" (its rotary module
        # keys them so); the model also rotates its values and turns outputs back (inverse=True)
        rope_keys={
            "sliding_attention": "main",
            "compressed_sparse_attention": "compress",
            "heavily_compressed_attention": "compress",
        },
    ),
    F("dia_decoder", scope="audio_token_lm"),
    F("dia_encoder", scope="text_encoder"),
    F("diffllama"),
    F("diffusion_gemma_text", per_layer=True, global_head_dim=512),
    F("doge"),
    # saved configs list an "mlp" block after each layer and count blocks (DoryConfig.to_dict)
    F("dory", base=None, per_layer=True, mlp_blocks=True),
    F("dots1"),
    F("dots3_note_text", "interleaved", width="mla", per_layer=True, scope="text_decoder_of_multimodal"),
    F("embedding_gemma2_text", per_layer=True, global_head_dim=512, scope="text_encoder"),
    F("emu3_text_model", base=1000000.0, scope="text_decoder_of_multimodal"),
    F("ernie4_5", "interleaved", base=500000.0),
    F("ernie4_5_moe", "interleaved", base=500000.0),
    F(
        "ernie4_5_vl_moe_text",
        "interleaved",
        base=500000.0,
        multi_axis="alternating_then_time",
        mrope_section=(22, 22, 20),
        rope_types="default",
        scope="text_decoder_of_multimodal",
    ),
    F("esm", nope="position_embedding_type=rotary", scope="protein_lm_encoder"),
    F("esmc", scope="protein_lm_encoder"),
    F("eurobert", scope="text_encoder"),
    F("evolla", base=500000.0),
    F("exaone", base=500000.0, aliases={"num_hidden_layers": "num_layers"}),
    F("exaone4", nope="sliding_when_windowed"),
    F("exaone_moe", nope="sliding_when_windowed"),
    F("falcon"),
    F("falcon_h1", aliases=_BLOCK_TYPES),
    F("flex_olmo", base=500000.0),
    F("flint", nope="sliding_only"),
    F("gemma"),
    F("gemma2"),
    F("gemma3_text", per_layer=True),
    F("gemma3n_text", per_layer=True),
    F("gemma4_text", per_layer=True, global_head_dim=512),
    F("gemma4_unified_text", per_layer=True, global_head_dim=512),
    F("glm", "interleaved", width="partial", partial_default=0.5),
    F("glm4", "interleaved", width="partial", partial_default=0.5),
    F("glm4_moe", width="partial", partial_default=0.5),
    F("glm4_moe_lite", "interleaved", layout_key="rope_interleave", width="mla", aliases=_ROPE_HEAD_DIM),
    F("glm4v_moe_text", width="partial", scope="text_decoder_of_multimodal", **_GLM_V, partial_default=0.5),
    F("glm4v_text", "interleaved", width="partial", scope="text_decoder_of_multimodal", **_GLM_V),
    F("glm_image_text", width="partial", scope="text_decoder_of_multimodal", **_GLM_V),
    F("glm_moe_dsa", "interleaved", width="mla"),
    F("glm_ocr_text", "interleaved", width="partial", scope="text_decoder_of_multimodal", **_GLM_V),
    F("gpt_neox", width="partial", partial_default=0.25),
    F("gpt_neox_japanese", width="partial"),
    F("gpt_oss", base=150000.0),
    F("gptj", "interleaved", width="rotary_dim", aliases=_GPT2_NAMES, rope_types="fixed"),
    F("gradium_phonon_tts", scope="audio_token_lm"),
    F("granite"),
    F("granite4_vision_text", scope="text_decoder_of_multimodal"),
    F("granite_docling_text", scope="text_decoder_of_multimodal"),
    F("granite_swa", nope="layer_rope_theta", per_layer=True),
    F("granitemoe"),
    F("granitemoe_swa", nope="layer_rope_theta", per_layer=True),
    F("granitemoehybrid", nope="position_embedding_type=rope"),
    F("granitemoeshared"),
    F("gte", base=160000.0, scope="text_encoder"),
    F("helium", "interleaved", base=100000.0),
    F("higgs_audio_v2", base=500000.0, scope="audio_token_lm"),
    F("hrm_text"),
    F("hunyuan_v1_dense", ntk_alpha=True),
    F("hunyuan_v1_moe", ntk_alpha=True),
    F(
        "hunyuan_vl_text",
        multi_axis="custom",
        unsupported=(
            "transformers 5.23 splits doubled xdrope sections, so for image tokens the two features "
            "of a pair follow different position streams (no rotation; Tencent's code and vLLM use "
            "contiguous sections instead)"
        ),
        scope="text_decoder_of_multimodal",
    ),
    F("hy_v3", base=11158840.0),
    F("hy_v4", width="mla"),
    # unlike hy_v4, interleaved pairs (its rotate_half pairs features 2j, 2j + 1)
    F("hy_v4_vl_text", "interleaved", width="mla", scope="text_decoder_of_multimodal", **_HY_V4_VL),
    F("hyperclovax"),
    F(
        "idefics",
        scope="text_decoder_of_multimodal",
        not_in_model="its decoder cross-attends to images: every forward needs pixel_values or image embeddings",
    ),
    F("internlm3"),
    F("iquestcoder"),
    F("jais2"),
    F("jetmoe", aliases=_KV_CHANNELS),
    F("jina_embeddings_v3", base=20000.0, scope="text_encoder"),
    F("kolibri1", nope="sliding_when_windowed"),
    F(
        "kyutai_speech_to_text",
        scope="speech_text_decoder",
        not_in_model="its decoder reads a text token and the Mimi codec's audio codes per frame, and generates from audio",
    ),
    F("laguna", width="partial", per_layer=True),
    F("lara_mini", nope="sliding_only"),
    F("lfm2", base=1000000.0),
    F("lfm2_moe", base=1000000.0),
    F("lfm3", per_layer=True),
    F("llama"),
    F("llama4_text", "interleaved", base=500000.0, nope="no_rope_layers", scope="text_decoder_of_multimodal"),
    F("longcat_flash", "interleaved", width="mla", base=10000000.0),
    F("mellum", width="partial", per_layer=True),
    F("mimo_v2_flash", width="partial", per_layer=True),
    F("minicpm3", width="mla"),
    F("minimax", base=1000000.0),
    F("minimax_m2", width="partial", base=5000000.0),
    F("minimax_m3_vl_text", width="partial", base=5000000.0, scope="text_decoder_of_multimodal"),
    F("ministral"),
    F("ministral3", base=1000000.0),
    F("mistral"),
    F("mistral4", "interleaved", layout_key="rope_interleave", width="mla"),
    F(
        "mistral_large4_text",
        "interleaved",
        width="mla",
        nope="no_rope_layers",
        log_frequency_scale="alpha",
        scope="text_decoder_of_multimodal",
    ),
    F("mixtral", base=1000000.0),
    F("mllama_text_model", base=500000.0, scope="text_decoder_of_multimodal"),
    F("modernbert", per_layer=True, scope="text_encoder"),
    F("modernbert-decoder", per_layer=True),
    F("molmo2_text", per_layer=True, scope="text_decoder_of_multimodal"),
    F(
        "moonshine",
        "interleaved",
        width="partial",
        aliases=_DECODER_NAMES,
        scope="speech_text_decoder",
        partial_default=0.9,
    ),
    F(
        "moonshine_streaming",
        "interleaved",
        width="partial",
        scope="speech_text_decoder",
        partial_default=0.8,
    ),
    F("moshi", scope="audio_token_lm"),
    F(
        "muse_glimmer_assistant",
        base=500000.0,
        not_in_model="a drafting module: its forward needs the target model's hidden states, and takes no tokens",
    ),
    F("muse_glimmer_text", nope="layer_rope_flag", scope="text_decoder_of_multimodal"),
    F("muse_spark_text", base=500000.0, nope="layer_rope_flag", scope="text_decoder_of_multimodal"),
    F("nanochat", clockwise=True),
    F("nemotron", width="partial", partial_default=0.5),
    F(
        "neomme",
        width="partial",
        multi_axis="alternating",
        per_layer=True,
        scope="multimodal_encoder",
        partial_default={"full_attention": 0.25, "sliding_attention": 1.0},
    ),
    F("nomic_bert", base=1000.0, scope="text_encoder"),
    F("olmo"),
    F("olmo2"),
    F("olmo3", per_layer=True),
    F("olmo_hybrid", nope="full_with_theta"),
    F("olmoe"),
    F("openai_privacy_filter", "interleaved", base=150000.0, scope="text_encoder"),
    F("paddleocr_vl_text", base=500000.0, scope="text_decoder_of_multimodal", **_QWEN2_VL),
    F("persimmon", width="partial", partial_default=0.5),
    F("phi", width="partial", partial_default=0.5),
    F("phi3", width="partial"),
    F("phi4_multimodal", width="partial"),
    F("phimoe", base=1000000.0, mscales=True),
    F("pocket_tts", scope="audio_token_lm"),
    F("qwen2"),
    F("qwen2_5_omni_talker", base=1000000.0, scope="audio_token_lm", **_QWEN2_VL),
    F("qwen2_5_omni_text", base=1000000.0, scope="text_decoder_of_multimodal", **_QWEN2_VL),
    F("qwen2_5_vl_text", base=1000000.0, scope="text_decoder_of_multimodal", **_QWEN2_VL),
    F("qwen2_moe"),
    F("qwen2_vl_text", base=1000000.0, scope="text_decoder_of_multimodal", **_QWEN2_VL),
    F("qwen3"),
    F(
        "qwen3_5_moe_text",
        width="partial",
        scope="text_decoder_of_multimodal",
        **_QWEN3_5,
        partial_default=0.25,
    ),
    F("qwen3_5_text", width="partial", scope="text_decoder_of_multimodal", **_QWEN3_5, partial_default=0.25),
    F("qwen3_moe"),
    F("qwen3_next", width="partial", partial_default=0.25),
    F("qwen3_omni_moe_talker_code_predictor", scope="audio_token_lm"),
    F("qwen3_omni_moe_talker_text", scope="audio_token_lm", **_QWEN3_VL),
    F("qwen3_omni_moe_text", base=1000000.0, scope="text_decoder_of_multimodal", **_QWEN3_VL),
    F("qwen3_vl_moe_text", base=500000.0, scope="text_decoder_of_multimodal", **_QWEN3_VL),
    F("qwen3_vl_text", base=500000.0, scope="text_decoder_of_multimodal", **_QWEN3_VL),
    F("qwen4_exp_text", width="partial", scope="text_decoder_of_multimodal", **_QWEN3_5),
    F(
        "recurrent_gemma",
        width="partial",
        aliases=_BLOCK_TYPES_AND_WINDOW,
        rope_types="default",
        partial_default=0.5,
    ),
    F("roformer", "interleaved", scope="text_encoder", rope_types="fixed"),
    # legacy remote-code configs say rope_scaling type "deepseek_yarn": YaRN, as SarvamMLAConfig reads it
    F(
        "sarvam_mla",
        "interleaved",
        layout_key="rope_interleave",
        width="mla",
        rope_type_aliases={"deepseek_yarn": "yarn"},
    ),
    F("sarvam_moe", width="partial", base=8000000.0),
    # the speech encoder's heads and layers, not the text decoder's (transformers' attribute_map)
    F(
        "seamless_m4t",
        aliases={
            **_ROTARY_EMBEDDING_BASE,
            "num_attention_heads": "speech_encoder_attention_heads",
            "num_hidden_layers": "speech_encoder_layers",
        },
        **_SPEECH_CONFORMER,
    ),
    F("seed_oss"),
    F("smollm3", base=2000000.0, nope="no_rope_layers"),
    F("solar_open", base=1000000.0),
    F("stablelm", width="partial", partial_default=0.25),
    F("starcoder2"),
    F("step3p5", width="partial", per_layer=True, scope="text_decoder_of_multimodal"),
    F("t5_gemma_module", scope="text_encoder_decoder"),
    F("t5gemma2_decoder", per_layer=True),
    F("t5gemma2_text", per_layer=True, scope="text_encoder"),
    F("ultrabert", per_layer=True, scope="text_encoder"),
    F("unlimited_ocr_text", scope="text_decoder_of_multimodal"),
    F("vaultgemma"),
    F("voxtral_realtime_text", scope="speech_text_decoder"),
    F("wav2vec2-bert", aliases=_ROTARY_EMBEDDING_BASE, **_SPEECH_CONFORMER),
    F("wav2vec2-conformer", aliases=_ROTARY_EMBEDDING_BASE, **_SPEECH_CONFORMER),
    F("youtu", "interleaved", layout_key="rope_interleave", width="mla"),
    F("zamba2", nope="use_mem_rope", aliases=_ATTENTION_HEAD_DIM),
    F("zaya", width="partial", per_layer=True, partial_default=0.5),
)

_BY_TYPE = {family.model_type: family for family in FAMILIES}


def family_of(model_type: str | None) -> Family:
    """The family record of ``model_type``, or :data:`GENERIC`."""
    return _BY_TYPE.get(model_type or "", GENERIC)
