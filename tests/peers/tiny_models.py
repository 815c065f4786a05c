"""Tiny random-weight transformers models, one per model family anyrope supports.

``tiny_model(model_type)`` builds the family's own model class (its causal LM where it has one,
else its seq2seq LM, masked LM or base model) from the family's own config class, float32, eval
mode, seeded: hidden 64, 2 layers covering each of the family's layer types (sliding / full,
NoPE / rotating, linear / attention), 4 heads and 2 KV heads of 16 features, vocabulary 128, a
few small experts, and the family's rope settings kept: layout flags, rotary fractions and
widths, MLA slices, per-layer-type parameters, scaled down together with the head.

``GENERIC`` shrinks every config that has the key; ``OVERRIDES`` holds what differs by family,
as data; ``NOT_IN_MODEL`` says why a family is not built.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Any

import torch
from transformers import PreTrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)

from anyrope._families import FAMILIES

SEED = 0

#: Applied to every config (and, recursively, sub-config) that has the key, directly or through
#: its ``attribute_map``.
GENERIC: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    # 5x the usual 0.02: attention scores of order 1, so the rotation matters to the output (a 1%
    # frequency error moves the logits by 1e-3 relative, not 1e-5 as with near-uniform attention)
    "initializer_range": 0.1,
    # mixture of experts: one dense layer, then MoE layers
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "shared_expert_intermediate_size": 32,
    "shared_experts_intermediate_size": 32,
    "shared_intermediate_size": 32,
    "share_expert_dim": 32,
    "moe_hidden_size": 32,
    "expert_ffn_hidden_size": 32,
    "dense_intermediate_size": 96,
    "intermediate_size_mlp": 96,
    "ffn_hidden_size": 96,
    "ffn_dim": 96,
    "router_hidden_size": 32,
    "hidden_size_global": 64,
    "backbone_hidden_size": 64,
    # multi-head latent attention: DeepSeek-V3's rope 64 / nope 128 / v 128 scaled by 1/8, ranks smaller
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "index_n_heads": 2,
    "index_head_dim": 16,
    # linear attention / state-space / recurrent layers of hybrid models
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_heads": 4,
    "linear_head_dim": 16,
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "mamba_chunk_size": 8,
    "chunk_size": 8,
    "lru_width": 64,
    "adapter_rank": 8,
    # Gemma 3n / EmbeddingGemma per-layer inputs
    "vocab_size_per_layer_input": 128,
    "hidden_size_per_layer_input": 16,
    "laurel_rank": 8,
}

_SW = ["sliding_attention", "full_attention"]
_MIMI = {
    "num_filters": 4,
    "upsample_groups": 64,
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "num_quantizers": 8,
}
# BLT's model builds DynamicCache(config=BltConfig), which has no num_hidden_layers (transformers
# 5.23): it runs without a KV cache.
_BLT = {"_parent": "blt", "encoder_hash_byte_group_vocab": 256, "_use_cache": False}
_T5GEMMA2 = {
    "_parent": "t5gemma2",
    "encoder": {"text_config": {"layer_types": _SW}},
    "decoder": {"layer_types": _SW},
}
_DIA = {
    "_parent": "dia",
    "decoder_config": {
        "cross_hidden_size": 64,
        "cross_num_attention_heads": 4,
        "cross_num_key_value_heads": 4,
        "cross_head_dim": 16,
    },
    "_decoder_channels": 9,
    "_generate": False,
}
_MLA = {"head_dim": None, "num_key_value_heads": 4}
# speech conformers rotate only with position_embeddings_type "rotary"; a base other than the
# default shows that the probe reads rotary_embedding_base
_SPEECH_CONFORMER = {"position_embeddings_type": "rotary", "rotary_embedding_base": 500}


def _mrope(section: list[int], theta: float, **fields: Any) -> dict[str, Any]:
    """M-RoPE parameters: the real models' sections scaled to the tiny head's rotated pairs."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": section, **fields}


# M-RoPE sections must add up to the rotated pairs of the tiny head (16 features: 8 pairs), in the
# real models' proportions: contiguous Qwen2-VL [16, 24, 24] -> [2, 3, 3]; interleaved Qwen3-VL
# [24, 20, 20] -> [4, 2, 2] (h and w on pairs 1, 4 and 2, 5, the rest t, as 64 pairs give
# "012" x 20 then "0000"). GLM-4.1V-style partial rotation (0.5 of head 128, [8, 12, 12]) keeps
# 0.5 of a head of 32; Qwen3.5's 0.25 of head 256 ([11, 11, 10]: "012" ... "01") 0.25 of 64.
_QWEN2_VL = {"rope_parameters": _mrope([2, 3, 3], 1000000.0)}
_GLM4V = {"hidden_size": 128, "rope_parameters": _mrope([2, 3, 3], 10000.0, partial_rotary_factor=0.5)}
_QWEN3_5 = {
    "layer_types": ["linear_attention", "full_attention"],
    "head_dim": 64,
    "rope_parameters": _mrope([3, 3, 2], 10000.0, partial_rotary_factor=0.25),
}

#: Per-family data on top of GENERIC. Config keys (None drops a GENERIC key; a dict for a
#: sub-config's key is merged into that sub-config's), and, starting with "_":
#:   _model: the model class where the auto mappings have none ("module.path.Class" if not
#:     exported); _parent: the composite model_type built instead, whose model holds this family
#:     as a sub-module (BLT, Dia, T5Gemma), or the family itself for a variant keyed by
#:     another name (gemma3n_kv_shared); _fill: parameter-name suffix -> value after init;
#:     _normal: parameter-name suffixes drawn from N(0, initializer_range) after init (weights
#:     the model's own init leaves as torch.empty);
#: and for test_families.py: _seed (the prompt's), _generate (False: the model's generate does not
#: take token prompts), _use_cache (False: transformers cannot build the model's cache),
#: _inputs_embeds (the model takes embeddings only), _extra (name -> shape of a fixed random
#: tensor every forward needs), _input_values (audio samples for a speech encoder),
#: _input_features ((frames, features) of filter-bank features for a speech encoder) and
#: _decoder_channels (audio-code channels of Dia's decoder input).
OVERRIDES: dict[str, dict[str, Any]] = {
    "afmoe": {"layer_types": _SW},
    "axk1": _MLA,
    "axk2": _MLA,
    "bailing_hybrid": {**_MLA, "layer_types": ["linear_attention", "full_attention"]},
    "bamba": {"attn_layer_indices": [1]},
    "beam": {"mlp_layer_types": ["dense", "sparse"]},
    "blt_global_transformer": _BLT,
    "blt_local_decoder": _BLT,
    "blt_local_encoder": _BLT,
    "blt_patcher": _BLT,
    "chameleon": {
        "_model": "ChameleonForConditionalGeneration",
        "_seed": 2,  # seed 1's prompt has a greedy step with a top-2 margin of 1.3e-4
        "vocabulary_map": {"<image>": 127},
        "vq_config": {
            "base_channels": 32,
            "channel_multiplier": [1, 2],
            "embed_dim": 8,
            "latent_channels": 32,
            "num_embeddings": 16,
            "num_res_blocks": 1,
        },
    },
    # CLVP rotates max(projection_dim // (2 * heads), 32) features (at least 32): a wider head
    "clvp_encoder": {"_model": "ClvpEncoder", "hidden_size": 256, "head_dim": 64, "projection_dim": 128},
    "codegen": {"hidden_size": 128, "rotary_dim": 8},  # GPT-J/CodeGen: rotary_dim 64 of head 256
    "cohere2": {"layer_types": _SW},
    "cohere2_moe": {"layer_types": _SW},
    # rope parameters by layer type
    "cohere_compass_text": {"rope_parameters": {"full_attention": _mrope([4, 2, 2], 10000.0)}},
    "cosmos3_edge_text": {"rope_parameters": _mrope([4, 2, 2], 100000000.0)},
    "csm": {"codec_config": _MIMI, "text_vocab_size": 128, "_generate": False},
    "csm_depth_decoder_model": {"_model": "CsmDepthDecoderForCausalLM", "_generate": False},
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 96},
    },
    "deepseek_ocr2_text": {"_model": "DeepseekOcr2TextModel", "mlp_layer_types": ["dense", "sparse"]},
    "deepseek_v2": _MLA,
    "deepseek_v3": _MLA,
    "deepseek_v32": _MLA,
    # a sliding layer ("main" table) and a compressed one ("compress"); values rotated, outputs
    # turned back by the model's own code from the patched tables
    "deepseek_v4": {"layer_types": ["sliding_attention", "heavily_compressed_attention"]},
    # Dia generates audio codes with its own generate; the forward is compared
    "dia_decoder": _DIA,
    "dia_encoder": _DIA,
    # DSA layers: MLA head 256 with a 64-wide rope slice, scaled to 32 / 8; the sliding layers'
    # own MLA shapes (64 heads, head 256 = nope 192 + rope 64) scaled to 4 heads, 32 = 24 + 8
    # an input, a recurrent (run twice, at the same positions) and an output layer
    "dory": {
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "n_input_layers": 1,
        "n_output_layers": 1,
    },
    "dots3_note_text": {
        **_MLA,
        "head_dim": 32,
        "layer_types": ["sliding_attention", "indexed_attention"],
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 4,
        "swa_q_lora_rank": 48,
        "swa_kv_lora_rank": 32,
        "swa_head_dim": 32,
        "swa_qk_nope_head_dim": 24,
        "swa_v_head_dim": 16,
    },
    # full-attention layers of head 512 = 2x the sliding ones' 256 (global_head_dim): 32 = 2 x 16
    "embedding_gemma2_text": {"layer_types": _SW, "global_head_dim": 32},
    "gemma4_text": {"layer_types": _SW, "global_head_dim": 32},
    "gemma4_unified_text": {"layer_types": _SW, "global_head_dim": 32},
    # the block-diffusion model's text encoder (its decoder denoises blocks: no greedy generation)
    "diffusion_gemma_text": {
        "_model": "diffusion_gemma.modeling_diffusion_gemma.DiffusionGemmaEncoderTextModel",
        "top_k_experts": 2,
        "layer_types": _SW,
        "global_head_dim": 32,
        "_generate": False,
    },
    "emu3_text_model": {"_model": "Emu3ForCausalLM"},
    "esm": {"position_embedding_type": "rotary"},
    "esmc": {"num_key_value_heads": 4},
    "evolla": {
        "_model": "EvollaForProteinText2Text",
        "aligner_num_add_layers": 1,
        "resampler_depth": 1,
        "resampler_heads": 2,
        "resampler_dim_head": 16,
        "resampler_num_latents": 8,
    },
    "ernie4_5_vl_moe_text": {  # [height, width, time], as [22, 22, 20]; experts (text, vision)
        "rope_parameters": _mrope([3, 3, 2], 500000.0),
        "moe_intermediate_size": [32, 32],
        "_model": "ernie4_5_vl_moe.modeling_ernie4_5_vl_moe.Ernie4_5_VLMoeTextModel",
    },
    "exaone4": {"layer_types": _SW},
    "exaone_moe": {"layer_types": _SW},
    "flint": {"layer_types": _SW},
    "gemma3_text": {"layer_types": _SW},
    "gemma3n_text": {"layer_types": _SW, "num_kv_shared_layers": 0},
    # test_families.py's variant: layers 2 and 3 reuse the keys layers 0 and 1 rotated and stored
    "gemma3n_kv_shared": {
        "_parent": "gemma3n_text",
        "num_hidden_layers": 4,
        "layer_types": _SW * 2,
        "num_kv_shared_layers": 2,
    },
    # the same for Gemma 4, whose full-attention layers have wider heads of their own
    "gemma4_kv_shared": {
        "_parent": "gemma4_text",
        "num_hidden_layers": 4,
        "layer_types": _SW * 2,
        "global_head_dim": 32,
        "num_kv_shared_layers": 2,
    },
    "glm4_moe_lite": _MLA,
    "glm4v_moe_text": {**_GLM4V, "hidden_size": 64, "head_dim": 32},
    "glm4v_text": _GLM4V,
    "glm_image_text": _GLM4V,
    "glm_moe_dsa": _MLA,
    "glm_ocr_text": {"rope_parameters": _mrope([2, 3, 3], 10000.0)},  # its default rotates the whole head
    "gptj": {"hidden_size": 128, "rotary_dim": 8},
    "gradium_phonon_tts": {
        "flow_head_config": {"condition_dim": 64, "frequency_embedding_size": 16},
        "audio_prompt_dim": 32,
        "duration_delta_embedding_dim": 16,
    },
    "granite4_vision_text": {"_model": "Granite4VisionTextModel"},
    # its attention_multiplier 1/64 (1/head_dim of the real model) leaves scores near 0 at head 16
    "granite_docling_text": {"attention_multiplier": 0.25},
    "granitemoehybrid": {"position_embedding_type": "rope", "layer_types": ["mamba", "attention"]},
    "hunyuan_v1_moe": {"_seed": 2},  # seed 1's prompt has a greedy step with a top-2 margin of 8e-5
    "hy_v4": _MLA,
    # interleaved sections [12, 10, 10] of 32 pairs scaled to qk_rope_head_dim 8: 4 pairs t, h, w, t
    "hy_v4_vl_text": {**_MLA, "rope_parameters": _mrope([2, 1, 1], 10000.0)},
    "kolibri1": {"layer_types": _SW},
    # one of each layer type: linear attention (GatedDeltaNet), sliding (rotates), full (NoPE)
    "lara_mini": {
        "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "sliding_attention", "full_attention"],
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "lfm3": {"layer_types": _SW},
    "llama4_text": {"no_rope_layers": [1, 0], "layer_types": ["chunked_attention", "full_attention"]},
    "longcat_flash": {**_MLA, "head_dim": 8, "num_layers": 1, "zero_expert_num": 2},
    "mimo_v2_flash": {"head_dim": 48},  # rotates int(0.334 * head_dim): 64 of 192, 16 of 48
    "minicpm3": _MLA,
    "mistral4": {**_MLA, "_model": "Mistral4ForCausalLM"},
    # its learned frequency scale exp(alpha) drawn away from 1 (its init is 0), so it shows
    "mistral_large4_text": {"num_key_value_heads": 4, "_normal": ("rotary_emb.alpha",)},
    # test_families.py's variant: layers 2 and 3 rotate their queries only, against the keys
    # layers 0 and 1 rotated and stored (every layer rotates, so each finds keys to reuse)
    "mistral_large4_kv_shared": {
        "_parent": "mistral_large4_text",
        "num_key_value_heads": 4,
        "_normal": ("rotary_emb.alpha",),
        "num_hidden_layers": 4,
        "no_rope_layers": [1, 1, 1, 1],
        "kv_source_layers": [0, 1, 0, 1],
    },
    "mllama_text_model": {"_model": "MllamaForCausalLM"},
    "moonshine": {
        "_model": "MoonshineForConditionalGeneration",
        "hidden_size": 144,
        "_input_values": 3200,
    },  # head 36 = 288 / 8, rotates 32 of it
    "moonshine_streaming": {
        "_model": "MoonshineStreamingForConditionalGeneration",
        # MoonshineStreamingConfig has no num_key_value_heads, which its attention reads (5.23)
        "num_key_value_heads": 4,
        "hidden_size": 80,
        "head_dim": 20,  # rotates 0.8 of it: 16, as 32 of 40
        "encoder_config": {"sliding_windows": [[16, 4], [16, 0]], "head_dim": 16},
        "_input_values": 3200,
    },
    # its attention output and MLP down projections start at zero: no attention, so no rotation, seen
    "neomme": {"_normal": ("o_proj.weight", "mlp.down_proj.weight")},
    "olmo3": {"layer_types": _SW},
    "olmo_hybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "paddleocr_vl_text": {"_model": "PaddleOCRTextModel", "rope_parameters": _mrope([2, 3, 3], 500000.0)},
    "pocket_tts": {
        "flow_head_config": {"condition_dim": 64, "frequency_embedding_size": 16},
        "audio_prompt_token_id": 124,
        "audio_latent_token_id": 125,
        "audio_prompt_bos_token_id": 126,
        "audio_bos_token_id": 127,
    },
    "qwen2_5_omni_talker": {"_model": "Qwen2_5OmniTalkerModel", "embedding_size": 64, **_QWEN2_VL},
    "qwen2_5_omni_text": {"_model": "Qwen2_5OmniThinkerTextModel", **_QWEN2_VL},
    "qwen2_5_vl_text": _QWEN2_VL,
    "qwen2_vl_text": _QWEN2_VL,
    "qwen3_5_moe_text": _QWEN3_5,
    "qwen3_5_text": _QWEN3_5,
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"], "head_dim": 32},
    "qwen3_omni_moe_talker_code_predictor": {
        "_model": "Qwen3OmniMoeTalkerCodePredictorModel",
        "_inputs_embeds": True,
    },
    "qwen3_omni_moe_talker_text": {
        "_model": "Qwen3OmniMoeTalkerModel",
        "_inputs_embeds": True,  # its embed_tokens is None (the talker reads the thinker's states)
        # its config has no such field (5.23), but its shared expert reads it
        "shared_expert_intermediate_size": 32,
        # its _init_weights skips the talker's experts and router (5.23): torch.empty, zeros
        "_normal": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"),
        "rope_parameters": _mrope([4, 2, 2], 10000.0),
    },
    "qwen3_omni_moe_text": {
        "_model": "Qwen3OmniMoeThinkerTextModel",
        "rope_parameters": _mrope([4, 2, 2], 1000000.0),
    },
    "qwen3_vl_moe_text": {"rope_parameters": _mrope([4, 2, 2], 500000.0)},
    "qwen3_vl_text": {"rope_parameters": _mrope([4, 2, 2], 500000.0)},
    "qwen4_exp_text": {
        **_QWEN3_5,
        "layer_types": ["linear_attention", "indexed_attention"],
        "hc_lowrank": 8,
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 32,
        "indexer_budget": 4,
        "indexer_compress_ratio": 2,
    },
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "sarvam_mla": _MLA,
    "seamless_m4t": {
        **_SPEECH_CONFORMER,
        "_model": "seamless_m4t.modeling_seamless_m4t.SeamlessM4TSpeechEncoder",
        # its own heads (2: head 32), not the text decoder's num_attention_heads (4)
        "speech_encoder_attention_heads": 2,
        "speech_encoder_layers": 2,
        "speech_encoder_intermediate_size": 96,
        "_input_features": (32, 160),  # 4 outputs after the adapter's stride of 8
    },
    "smollm3": {"no_rope_layers": [1, 0]},
    "step3p5": {
        "_model": "Step3p7TextModel",
        "layer_types": _SW,
        "sliding_window": 512,
        "mlp_layer_types": ["dense", "sparse"],
    },
    "t5_gemma_module": {
        "_parent": "t5gemma",
        "encoder": {"layer_types": _SW},
        "decoder": {"layer_types": _SW},
    },
    "t5gemma2_decoder": _T5GEMMA2,
    "t5gemma2_text": _T5GEMMA2,
    "ultrabert": {"layer_types": _SW},
    "unlimited_ocr_text": {"_model": "UnlimitedOcrTextModel"},
    "voxtral_realtime_text": {
        "_model": "voxtral_realtime.modeling_voxtral_realtime.VoxtralRealtimeTextModel",
        "_extra": {"t_cond": (1, 1, 64)},  # the time conditioning its parent computes from the audio
    },
    "wav2vec2-bert": {**_SPEECH_CONFORMER, "_input_features": (24, 160)},
    "wav2vec2-conformer": {
        **_SPEECH_CONFORMER,
        # a feature encoder of two convolutions (20 samples a frame) and a narrow positional one
        "conv_dim": (32, 32),
        "conv_stride": (5, 4),
        "conv_kernel": (10, 8),
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 4,
        "_input_values": 480,
    },
    "youtu": _MLA,
    "zamba2": {"layer_types": ["mamba", "hybrid"], "use_mem_rope": True, "head_dim": None},
    "zaya": {
        "num_experts_per_tok": 1,
        "layer_types": ["hybrid", "hybrid_sliding"],
        "sliding_window": 64,
        "_fill": {"qk_norm.temp": 1.0},  # the key scale starts at 0: uniform attention, no rotation seen
    },
}


#: model_type -> why it is not built in-model.
# Why a family is not built: anyrope's family data says (it also drives the docs' table).
NOT_IN_MODEL: dict[str, str] = {f.model_type: f.not_in_model for f in FAMILIES if f.not_in_model}


def _fields(config_cls: type, default: PreTrainedConfig) -> set[str]:
    names = (
        {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    )
    return names | set(default.to_dict()) | set(getattr(config_cls, "attribute_map", {}))


def _tiny_kwargs(config_cls: type, default: PreTrainedConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    # Through the attribute_map to the field's own name: an alias passed to the constructor is
    # set only after __post_init__ has derived other fields from the default.
    aliases = getattr(config_cls, "attribute_map", {})
    known = _fields(config_cls, default)
    kwargs = {aliases.get(k, k): v for k, v in GENERIC.items() if k in known}
    specs = getattr(config_cls, "sub_configs_defaults", {})
    for key, sub in vars(default).items():
        if not isinstance(sub, PreTrainedConfig):
            continue
        sub_kwargs = _tiny_kwargs(type(sub), sub, overrides.get(key) or {})
        spec = specs.get(key)
        if spec is None or not issubclass(spec.config_class, type(sub)):
            sub_kwargs["model_type"] = sub.model_type
        kwargs[key] = sub_kwargs
    for key, value in overrides.items():
        if key.startswith("_") or isinstance(kwargs.get(key), dict):
            continue
        key = aliases.get(key, key)
        if value is None:
            kwargs.pop(key, None)
        else:
            kwargs[key] = value
    return kwargs


def _built_type(model_type: str) -> str:
    """The model_type whose config and model are built: the family's, or its composite parent's."""
    return OVERRIDES.get(model_type, {}).get("_parent", model_type)


def tiny_config(model_type: str) -> PreTrainedConfig:
    overrides = OVERRIDES.get(model_type, {})
    config_cls = CONFIG_MAPPING[_built_type(model_type)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_cls(**_tiny_kwargs(config_cls, config_cls(), overrides))


def model_class(model_type: str) -> type:
    import transformers

    built = _built_type(model_type)
    name = (
        OVERRIDES.get(model_type, {}).get("_model")
        or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(built)
        or MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(built)
        or MODEL_FOR_MASKED_LM_MAPPING_NAMES.get(built)
        or MODEL_MAPPING_NAMES.get(built)
    )
    if name is None:
        raise LookupError(f"no model class for {model_type}")
    if "." in name:
        module, _, name = name.rpartition(".")
        return getattr(importlib.import_module(f"transformers.models.{module}"), name)
    return getattr(transformers, name)


def tiny_model(model_type: str) -> torch.nn.Module:
    if model_type in NOT_IN_MODEL:
        raise ValueError(f"{model_type} is not built in-model: {NOT_IN_MODEL[model_type]}")
    config = tiny_config(model_type)
    cls = model_class(model_type)
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(config)
    overrides = OVERRIDES.get(model_type, {})
    generator = torch.Generator().manual_seed(SEED)
    for name, parameter in model.named_parameters():
        for suffix, value in overrides.get("_fill", {}).items():
            if name.endswith(suffix):
                parameter.data.fill_(value)
        if name.endswith(tuple(overrides.get("_normal", ()))):
            normal = torch.randn(parameter.shape, generator=generator) * GENERIC["initializer_range"]
            parameter.data.copy_(normal)
    return model.to(torch.float32).eval()
