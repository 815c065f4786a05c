"""Whole models around the vision towers that test_vision_towers.py checks only as rotary modules.

test_vision_towers.py proves each supported vision rotary module's tables against anyrope's, and
runs ten Qwen-like vision-language models (and Pixtral's and Llama 4's encoders) whole. This file runs the other
twenty supported families whole, each in the smallest model that puts its tower to work on a real
input: the image-text-to-text model where the family has one (a prompt of text around one image:
its logits), else the vision model alone (MLCD: its last hidden state), else, for the SAM 2 / SAM 3
/ EdgeTAM video trackers, whose rotary module is the memory attention's, the video model tracking
a point prompt from frame 0 to frame 1 (frame 1's mask logits: the only frame that reads memory).
So the patched module meets its own model's position ids: their shape, their axis order (MiniMax
has three axes, Muse and Inkling2 offset them by one, Inkling2 gives class tokens (0, 0), EdgeTAM
rotates queries and keys on grids of different sizes), the window reordering, and the dtype the
tables go out in.

Every model is tiny and random, float32, seeded, one vision block (the text model is
tiny_models', two layers), weights drawn with ``initializer_range`` 0.1 as there: attention scores
of order 1, so the rotation shows in the output. For each:

* the vision rotation matters: the stock model with the tower's last two position axes swapped
  (rows and columns; MiniMax's height and width) moves the output by more than 10x the tolerance
  (measured: 6e-3 of its scale for Step3p7, whose layer scale of 0.1 damps its attention, to 0.6),
  so a wrong axis order, pairing or frequency would show;
* after ``use_anyrope(model)`` the vision rotary module is patched, and so is every other rotary
  module of the model (the text model's, Dots3's audio encoder's), except SAM 3's ViT backbone,
  whose rotation anyrope cannot express: it is left stock with a warning that names it;
* the output equals the stock one within in_model.py's ``LOGITS_RTOL`` (1e-5): the stock towers and
  text models form float32 angles from positions of at most 12 here (an angle error under
  12 * 2**-24 rad, as in in_model.py's models), which moves these outputs by at most 1.1e-6 of
  their scale, measured; the masks of the trackers' frame 1 come from float32 too (the memory they
  read, stored in bfloat16, is frame 0's, which no rotation touches);
* ``remove_anyrope(model)`` gives the stock output exactly.
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from anyrope._vision_families import VISION_FAMILIES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from peers import test_vision_towers as towers
from peers.in_model import LOGITS_RTOL, quiet_and_fast, relative  # noqa: F401 - quiet_and_fast: autouse
from peers.tiny_models import OVERRIDES, _tiny_kwargs
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

SENSITIVITY = towers.SENSITIVITY

# Supported vision families that test_vision_towers.py runs whole (its IN_MODEL, Pixtral's and
# Llama 4's encoders).
WHOLE_ELSEWHERE = {
    "ernie4_5_vl_moe_vision",
    "glm4v_moe_vision",
    "glm4v_vision",
    "glm_ocr_vision",
    "llama4_vision_model",
    "pixtral",
    "qwen2_5_vl_vision",
    "qwen2_vl_vision",
    "qwen3_5_moe_vision",
    "qwen3_5_vision",
    "qwen3_vl_moe_vision",
    "qwen3_vl_vision",
}

# One vision block of head 16: test_vision_towers.py's, also under the keys other families use.
VISION = {**towers.VISION, "num_hidden_layers": 1, "num_attention_heads": 4}
GRID = towers.GRID  # (frames, rows, columns) of patches: 6 image tokens after the 2 x 2 merge


@dataclass
class Built:
    """A whole model, a forward on its fixed input that returns the output compared, and its rotary
    modules (dotted names): the vision tower's, the text model's (None if its text model has no
    rotary module), and one anyrope leaves stock (None if none)."""

    model: torch.nn.Module
    run: Callable[[], torch.Tensor]
    vision: str
    text: str | None = "model.language_model.rotary_emb"
    left_stock: str | None = None


def _config(
    model_type: str,
    vision: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
    **top: Any,
) -> Any:
    """The family's config: tiny_models' text config, the one-block VISION (the keys the vision
    config has, and initializer_range, which some take undeclared) plus ``vision``, special tokens 120.. in the tiny vocabulary, and ``top``."""
    config_cls = CONFIG_MAPPING[model_type]
    default = config_cls()
    text_default = default.text_config
    text_kwargs = _tiny_kwargs(type(text_default), text_default, OVERRIDES.get(text_default.model_type, {}))
    text_kwargs.update(text or {})
    fields = default.vision_config.to_dict()
    vision_kwargs = {k: v for k, v in VISION.items() if k in fields or k == "initializer_range"}
    if "out_hidden_size" in fields:
        vision_kwargs["out_hidden_size"] = text_kwargs["hidden_size"]  # the merger feeds the text model
    vision_kwargs.update(vision or {})
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "image_start_token_id", "image_end_token_id")  # fmt: skip
    special = {k: 120 + i for i, k in enumerate(names) if getattr(default, k, None) is not None}
    return config_cls(
        text_config={**text_kwargs, "model_type": text_default.model_type},
        vision_config=vision_kwargs,
        **{**special, **top},
    )


def _model(config: Any, name: str | None = None) -> torch.nn.Module:
    name = name or MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[config.model_type]
    torch.manual_seed(0)
    return getattr(transformers, name)(config).float().eval()


def _prompt(config: Any, tokens: int) -> torch.Tensor:
    """Text, the image's tokens between the family's image start and end tokens (if it has them),
    text."""
    start = getattr(config, "vision_start_token_id", None) or getattr(config, "image_start_token_id", None)
    end = getattr(config, "vision_end_token_id", None) or getattr(config, "image_end_token_id", None)
    image = [config.image_token_id] * tokens
    return torch.tensor([[5, 6, *([start] if start else []), *image, *([end] if end else []), 7, 8, 9]])


def _pixels(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _logits(model: torch.nn.Module, **inputs: Any) -> Callable[[], torch.Tensor]:
    return lambda: model(**inputs).logits


def _vlm(
    model_type: str,
    patch: tuple[int, ...] = (3 * 2 * 4 * 4,),
    mm_token_types: bool = True,
    name: str | None = None,
    extra: dict[str, Any] | None = None,
    vision_rotary: str = "model.visual.rotary_pos_emb",
    text_rotary: str | None = "model.language_model.rotary_emb",
    **config: Any,
) -> Built:
    """A Qwen-like model: a GRID image as its patches (each of shape ``patch``: flattened, channels
    x frames x 4 x 4, by default) with ``image_grid_thw``, one image token per 2 x 2 patches."""
    model = _model(_config(model_type, **config), name)
    grid = torch.tensor([GRID])
    ids = _prompt(model.config, int(grid.prod()) // 4)
    inputs = {"input_ids": ids, "pixel_values": _pixels(int(grid.prod()), *patch), "image_grid_thw": grid}
    if mm_token_types:
        inputs["mm_token_type_ids"] = (ids == model.config.image_token_id).long()
    return Built(model, _logits(model, **inputs, **(extra or {})), vision_rotary, text_rotary)


def _kimi_k25() -> Built:
    # a learned 8 x 8 position grid; its deepseek_v3 text model as tiny_models builds it
    vision = {"pos_emb_height": 8, "pos_emb_width": 8}
    return _vlm(
        "kimi_k25", patch=(3, 4, 4), mm_token_types=False, vision=vision, projection_hidden_size=64,
        vision_rotary="model.vision_tower.rotary_emb",
    )  # fmt: skip


def _minimax_m3_vl() -> Built:
    # three axes (time, row, column), 2 * ((16 // 3) // 2) = 4 features each, the rest of the head passes
    return _vlm(
        "minimax_m3_vl", mm_token_types=False, image_token_index=120, video_token_index=121,
        projector_hidden_size=64, vision_rotary="model.vision_tower.rotary_emb",
    )  # fmt: skip


def _muse(model_type: str) -> Callable[[], Built]:
    def build() -> Built:
        # one full-attention block; positions (column, row) + 1 in window order
        vision = {"pos_emb_height": 8, "pos_emb_width": 8, "layer_types": ["full_attention"]}
        # Muse Spark's audio encoder, not run, shrunk to build fast; its output feeds the text model
        audio = {"out_hidden_size": 64, "num_hidden_layers": 1, "hidden_sizes": [16], "depths": [1], "patch_sizes": [4]}  # fmt: skip
        subs = {"audio_config": audio} if model_type == "muse_spark" else {}
        return _vlm(
            model_type, mm_token_types=False, vision=vision, out_hidden_size=4 * 64, projector_hidden_size=64,
            vision_rotary="model.vision_tower.rotary_emb", **subs,
        )  # fmt: skip

    return build


def _omni(model_type: str, name: str, audio: dict[str, Any]) -> Callable[[], Built]:
    def build() -> Built:
        # the thinker (the talker and token2wav do not see the image); its audio encoder shrunk, not run
        tokens = {"image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122, "vision_end_token_id": 123, "audio_start_token_id": 124, "audio_end_token_id": 125, "audio_token_id": 126}  # fmt: skip
        audio_config = {"encoder_layers": 1, "d_model": 64, "encoder_attention_heads": 4, "encoder_ffn_dim": 96, "output_dim": 64, **audio}  # fmt: skip
        return _vlm(model_type, mm_token_types=False, name=name, audio_config=audio_config, **tokens)

    return build


def _dots3_note() -> Built:
    # one dense vision block; the audio encoder (with a rotary module of its own) shrunk, not run
    vision = {"mlp_layer_types": ["dense"], "adapter_in_dim": 64, "adapter_out_dim": 64}
    audio = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 96, "adapter_input_size": 64, "adapter_out_dim": 64, "downsample_hidden_size": 32}  # fmt: skip
    return _vlm(
        "dots3_note", patch=(3 * 4 * 4,), mm_token_types=False, vision=vision, audio_config=audio,
        vision_rotary="model.vision_tower.rotary_pos_emb",
    )  # fmt: skip


def _glm5_next() -> Built:
    # its text model is NoPE (DSA layers with qk_rope_head_dim 0, linear-attention layers): no rotary
    text = {"num_key_value_heads": 4, "qk_rope_head_dim": 0, "index_topk": 16, "index_kpool": 4, "layer_types": ["linear_attention", "indexed_attention"]}  # fmt: skip
    return _vlm("glm5_next", text=text, vision={"projection_intermediate_size": 96}, text_rotary=None)


def _video_llama_3() -> Built:
    return _vlm(
        "video_llama_3", patch=(3 * 4 * 4,), mm_token_types=False, extra={"image_merge_sizes": torch.tensor([2])},
        vision_rotary="model.vision_model.rotary_pos_emb",
    )  # fmt: skip


def _paddleocr_vl() -> Built:
    # patches as (patches, channels, 4, 4); it merges them after the encoder, at the projector
    model = _model(_config("paddleocr_vl"))
    grid = torch.tensor([GRID])
    ids = _prompt(model.config, 6)
    mm = (ids == model.config.image_token_id).long()
    run = _logits(
        model, input_ids=ids, pixel_values=_pixels(24, 3, 4, 4), image_grid_thw=grid, mm_token_type_ids=mm
    )
    return Built(model, run, "model.visual.vision_model.encoder.rotary_pos_emb")


def _inkling2() -> Built:
    # the grid counted in image tokens (2 x 3, patches 4 x 6), pixels one 8 x 8 x 3 block per token;
    # a class token in front of the image at position (0, 0), the patches at (row, column) + 1.
    # Its text model has no rotary module; its attention widths shrunk
    vision = {"text_hidden_size": 64, "projection_hidden_dim": 64, "posemb_grid_size": 8}
    text = {"unpadded_vocab_size": 128, "swa_head_dim": 16, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2}  # fmt: skip
    model = _model(_config("inkling2", vision, text))
    ids = _prompt(model.config, 6)
    run = _logits(
        model, input_ids=ids, pixel_values=_pixels(6, 8, 8, 3), image_grid_thw=torch.tensor([[1, 2, 3]])
    )
    return Built(model, run, "model.vision_tower.rotary_emb", None)


def _step3p7() -> Built:
    # a 16 x 24 image (4 x 6 patches), two stride-2 convolutions after the encoder: 1 x 2 image tokens
    model = _model(_config("step3p7", {"image_size": 32}))
    ids = _prompt(model.config, 2)
    return Built(
        model,
        _logits(model, input_ids=ids, pixel_values=_pixels(1, 3, 16, 24)),
        "model.vision_model.rotary_emb",
    )


def _mlcd() -> Built:
    # a vision encoder alone (no vision-language model in transformers): a 16 x 24 image, 4 x 6
    # patches after a class token
    config = transformers.MLCDVisionConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, image_size=32,
        patch_size=4, initializer_range=0.1,
    )  # fmt: skip
    model = _model(config, "MLCDVisionModel")
    pixels = _pixels(1, 3, 16, 24)
    return Built(model, lambda: model(pixel_values=pixels).last_hidden_state, "vision_rotary_embedding", None)


# SAM 2 / SAM 3 / EdgeTAM video trackers: a 128 x 128 (SAM 3: 112 x 112) frame gives feature maps
# 32, 16 and 8 wide; the memory attention works on the 8 x 8 one. Its memory features are 64 wide
# (the cross-attention's key width is fixed at 64), and the tracker splits object pointers into
# memory-wide pieces only where its hidden size is larger: 128.
_FEATURES = [[32, 32], [16, 16], [8, 8]]
_HIERA = {
    "model_type": "sam2_hiera_det_model",
    "hidden_size": 16,
    "image_size": [128, 128],
    "blocks_per_stage": [1, 1, 1, 1],
    "embed_dim_per_stage": [16, 32, 64, 128],
    "num_attention_heads_per_stage": [1, 1, 2, 2],
    "window_size_per_stage": [8, 4, 4, 2],
    "global_attention_blocks": [],
    "window_positional_embedding_background_size": [2, 2],
    "initializer_range": 0.1,
}
_SAM3_VIT = {
    "model_type": "sam3_vit_model",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "image_size": 112,
    "patch_size": 14,
    "window_size": 4,
    "global_attn_indexes": [0],
    "pretrain_image_size": 112,
    "initializer_range": 0.1,
}
_TRACKER = {
    "initializer_range": 0.1,
    "mask_decoder_config": {
        "hidden_size": 128,
        "mlp_dim": 64,
        "num_attention_heads": 2,
        "iou_head_hidden_dim": 32,
    },
    "memory_attention_hidden_size": 128,
    "memory_attention_num_layers": 1,
    "memory_attention_rope_feat_sizes": [8, 8],
    "memory_encoder_hidden_size": 128,
    "mask_downsampler_embed_dim": 128,
    "memory_fuser_embed_dim": 128,
    "memory_fuser_intermediate_dim": 64,
}


def _tracker(model_type: str, seed: int = 0, **fields: Any) -> Callable[[], Built]:
    def build() -> Built:
        size = 112 if model_type == "sam3_tracker_video" else 128
        backbone = _SAM3_VIT if model_type == "sam3_tracker_video" else _HIERA
        vision = {"backbone_config": backbone, "backbone_feature_sizes": _FEATURES, "fpn_hidden_size": 128, "initializer_range": 0.1}  # fmt: skip
        if model_type != "sam3_tracker_video":
            vision["backbone_channel_list"] = [128, 64, 32, 16]
        prompt = {"hidden_size": 128, "image_size": size, "patch_size": size // 8, "mask_input_channels": 4}
        config = CONFIG_MAPPING[model_type](
            **_TRACKER, **fields, image_size=size, prompt_encoder_config=prompt, vision_config=vision
        )
        torch.manual_seed(seed)
        model = transformers.AutoModel.from_config(config).float().eval()
        modeling = importlib.import_module(type(model).__module__)
        session_cls = getattr(modeling, f"{type(model).__name__.removesuffix('Model')}InferenceSession")
        video = _pixels(2, 3, size, size)

        def run() -> torch.Tensor:  # a fresh session: the tracker keeps its memory there
            session = session_cls(video=video, video_height=size, video_width=size, dtype=torch.float32)
            obj = session.obj_id_to_idx(1)
            point = {"point_coords": torch.tensor([[[[40.0, 70.0]]]]), "point_labels": torch.tensor([[[1]]])}
            session.add_point_inputs(obj, 0, point)
            session.obj_with_new_inputs = [1]
            *_, tracked = model.propagate_in_video_iterator(
                session, start_frame_idx=0, max_frame_num_to_track=1
            )
            return tracked.pred_masks

        vit = "vision_encoder.backbone.layers.0.rotary_emb" if model_type == "sam3_tracker_video" else None
        return Built(model, run, "memory_attention.rotary_emb", None, vit)

    return build


# vision config model_type -> the whole model
BUILDERS: dict[str, Callable[[], Built]] = {
    "cohere_compass_vision": lambda: _vlm("cohere_compass"),
    "dots3_note_vision_encoder": _dots3_note,
    # EdgeTAM's perceiver resampler pools the memory to 4 x 4 latents: keys rotate on that grid
    "edgetam_video": _tracker(
        "edgetam_video",
        memory_attention_mlp_hidden_size=64,
        memory_attention_rope_k_sizes=[4, 4],
        perceiver_resampler_num_latents=16,
        perceiver_resampler_num_latents_2d=16,
        perceiver_resampler_mlp_intermediate_size=64,
        perceiver_resampler_num_layers=1,
    ),
    "exaone4_5_vision": lambda: _vlm("exaone4_5", vision={"num_key_value_heads": 2}),
    "glm5_next_vision": _glm5_next,
    "inkling2_vision": _inkling2,
    "kimi_k25_vision": _kimi_k25,
    "lfm3_vl_vision": lambda: _vlm(
        "lfm3_vl",
        vision={"num_key_value_heads": 2, "layer_types": ["full_attention"]},
        vision_rotary="model.vision_tower.rotary_pos_emb",
    ),
    "minimax_m3_vl_vision": _minimax_m3_vl,
    "mlcd_vision_model": _mlcd,
    "muse_glimmer_vision": _muse("muse_glimmer"),
    "muse_spark_vision": _muse("muse_spark"),
    "paddleocr_vl_vision": _paddleocr_vl,
    "qwen2_5_omni_vision_encoder": _omni(
        "qwen2_5_omni_thinker", "Qwen2_5OmniThinkerForConditionalGeneration", {}
    ),
    "qwen3_omni_moe_vision_encoder": _omni(
        "qwen3_omni_moe_thinker",
        "Qwen3OmniMoeThinkerForConditionalGeneration",
        {"downsample_hidden_size": 32},
    ),
    "qwen4_exp_vision": lambda: _vlm("qwen4_exp"),
    "sam2_video": _tracker("sam2_video", memory_attention_feed_forward_hidden_size=64),
    # seed 5: the object shows on frame 1 (its score is above 0), so frame 1's mask is the decoder's,
    # not the constant fill of an absent object that seeds 0 to 4 give
    "sam3_tracker_video": _tracker(
        "sam3_tracker_video", seed=5, memory_attention_feed_forward_hidden_size=64
    ),
    "step3p5_vision": _step3p7,
    "video_llama_3_vision": _video_llama_3,
}


def test_every_supported_vision_family_runs_whole_somewhere() -> None:
    supported = {f.model_type for f in VISION_FAMILIES if f.unsupported is None}
    assert set(BUILDERS) | WHOLE_ELSEWHERE == supported
    assert not set(BUILDERS) & WHOLE_ELSEWHERE


def _swapped(rotary: torch.nn.Module) -> Callable[..., Any]:
    """The stock forward with the last two position axes swapped: rows and columns (MiniMax's, after
    time)."""

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        axes = list(range(position_ids.shape[-1]))
        axes[-2:] = axes[-1], axes[-2]
        return type(rotary).forward(rotary, x, position_ids[..., axes])

    return forward


@pytest.mark.parametrize("family", list(BUILDERS))
def test_vision_tower_in_its_model(family: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = BUILDERS[family]()
    model = built.model
    rotary = model.get_submodule(built.vision)
    assert rotary.config.model_type == family  # the tower under test, not another rotary module
    stock = built.run()

    rotary.forward = _swapped(rotary)
    moved = relative(stock, built.run())
    del rotary.forward
    assert moved > SENSITIVITY * LOGITS_RTOL, (
        f"{family}: the vision rotation moves the output by only {moved:.2e}"
    )

    if built.left_stock is None:
        use_anyrope(model)
    else:
        left = model.get_submodule(built.left_stock)
        where = re.escape(f"{built.left_stock} ({type(left).__name__})")
        with pytest.warns(UserWarning, match=rf"leaves the rotary module {where} stock"):
            use_anyrope(model)
        assert not is_patched(left)
    assert is_patched(rotary)
    if built.text is not None:
        assert is_patched(model.get_submodule(built.text))
    rotaries = {n: m for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")}
    unpatched = [n for n, m in rotaries.items() if not is_patched(m) and n != built.left_stock]
    assert not unpatched, f"{family}: rotary modules left stock: {unpatched}"
    rel = relative(stock, built.run())
    assert rel <= LOGITS_RTOL, f"{family}: outputs differ by {rel:.2e} of their scale"

    remove_anyrope(model)
    assert not any(is_patched(m) for m in rotaries.values())
    assert torch.equal(built.run(), stock)
