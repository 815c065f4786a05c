"""Vision towers (``rope_type="axial"``) through ``use_anyrope``, against transformers 5.24.

* Every vision rotary module of ``anyrope._vision_families`` (built from its family's default
  vision config): where anyrope expresses it, ``use_anyrope`` patches it and its tables equal the
  stock module's at positions whose axes differ (up to 255, so the axis order shows), in the
  layout ``from_hf_config`` says: a ``cat(c, c)`` table is read by ``rotate_half`` (half pairs),
  a table with each column twice by ``rotate_pairwise`` (interleaved). Where it does not, the
  module is left stock with a warning that names it and says why, and the rest is patched.
* Whole vision-language models, tiny and random (``tiny_models``' text configs, a one-block
  vision tower of head 16), on one prompt of text and a 4 x 6 patch image: the logits after
  ``use_anyrope`` (text and vision towers patched) equal the stock ones within in_model.py's
  ``LOGITS_RTOL``. Both towers form float32 angles from positions below 24 (angle error under
  24 * 2**-24 rad), which moves these logits by ~1e-6 of their scale. The vision rotation
  matters: the stock model with the vision tower's row and column swapped moves the logits by
  more than 10x the tolerance, so a wrong axis order or frequency would show.
* Pixtral's vision encoder in a tiny ``PixtralVisionModel`` (tables in x's dtype): float32 and
  bfloat16 last hidden states equal the stock ones (bfloat16: both round the same float32
  tables to bfloat16, so they agree to bfloat16's rounding of the outputs, 2**-8 relative).
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

import pytest

from anyrope._vision_families import VISION_FAMILIES, VisionFamily

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from peers.in_model import LOGITS_RTOL, quiet_and_fast, relative  # noqa: F401 - quiet_and_fast: autouse
from peers.tiny_models import OVERRIDES, _tiny_kwargs
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import anyrope
from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

# The rotary module of each vision config model_type: "package.Class" under transformers.models.
ROTARY = {
    "cohere_compass_vision": "cohere_compass.CohereCompassVisionRotaryEmbedding",
    "dinov3_vit": "dinov3_vit.DINOv3ViTRopePositionEmbedding",
    "dots3_note_vision_encoder": "dots3_note.Dots3NoteVisionRotaryEmbedding",
    "edgetam_video": "edgetam_video.EdgeTamVideoVisionRotaryEmbedding",
    "efficientloftr": "efficientloftr.EfficientLoFTRRotaryEmbedding",
    "eomt_dinov3": "eomt_dinov3.EomtDinov3RotaryEmbedding",
    "ernie4_5_vl_moe_vision": "ernie4_5_vl_moe.Ernie4_5_VLMoeVisionRotaryEmbedding",
    "exaone4_5_vision": "exaone4_5.Exaone4_5_VisionRotaryEmbedding",
    "gemma4_vision": "gemma4.Gemma4VisionRotaryEmbedding",
    "glm4v_moe_vision": "glm4v_moe.Glm4vMoeVisionRotaryEmbedding",
    "glm4v_vision": "glm4v.Glm4vVisionRotaryEmbedding",
    "glm5_next_vision": "glm5_next.Glm5NextVisionRotaryEmbedding",
    "glm_ocr_vision": "glm_ocr.GlmOcrVisionRotaryEmbedding",
    "inkling2_vision": "inkling2.Inkling2VisionRotaryEmbedding",
    "kimi_k25_vision": "kimi_k25.Kimi_K25VisionRotaryEmbedding",
    "lfm3_vl_vision": "lfm3_vl.Lfm3VlVisionRotaryEmbedding",
    "llama4_vision_model": "llama4.Llama4VisionRotaryEmbedding",
    "minimax_m3_vl_vision": "minimax_m3_vl.MiniMaxM3VLVisionRotaryEmbedding",
    "mlcd_vision_model": "mlcd.MLCDRotaryEmbedding",
    "muse_glimmer_vision": "muse_glimmer.MuseGlimmerVisionRotaryEmbedding",
    "muse_spark_vision": "muse_spark.MuseSparkVisionRotaryEmbedding",
    "paddleocr_vl_vision": "paddleocr_vl.PaddleOCRVisionRotaryEmbedding",
    "pixtral": "pixtral.PixtralVisionRotaryEmbedding",
    "qwen2_5_omni_vision_encoder": "qwen2_5_omni.Qwen2_5OmniVisionRotaryEmbedding",
    "qwen2_5_vl_vision": "qwen2_5_vl.Qwen2_5_VLVisionRotaryEmbedding",
    "qwen2_vl_vision": "qwen2_vl.Qwen2VLVisionRotaryEmbedding",
    "qwen3_5_moe_vision": "qwen3_5_moe.Qwen3_5MoeVisionRotaryEmbedding",
    "qwen3_5_vision": "qwen3_5.Qwen3_5VisionRotaryEmbedding",
    "qwen3_omni_moe_vision_encoder": "qwen3_omni_moe.Qwen3OmniMoeVisionRotaryEmbedding",
    "qwen3_vl_moe_vision": "qwen3_vl_moe.Qwen3VLMoeVisionRotaryEmbedding",
    "qwen3_vl_vision": "qwen3_vl.Qwen3VLVisionRotaryEmbedding",
    "qwen4_exp_vision": "qwen4_exp.Qwen4ExpVisionRotaryEmbedding",
    "sam2_video": "sam2_video.Sam2VideoVisionRotaryEmbedding",
    "sam3_tracker_video": "sam3_tracker_video.Sam3TrackerVideoVisionRotaryEmbedding",
    "sapiens2": "sapiens2.Sapiens2RopePositionEmbedding",
    "sam3_vit_model": "sam3.Sam3ViTRotaryEmbedding",
    "step3p5_vision": "step3p7.Step3p7VisionRotaryEmbedding",
    "video_llama_3_vision": "video_llama_3.VideoLlama3VisionRotaryEmbedding",
    "vjepa2": "vjepa2.VJEPA2RopeAttention",  # its attention rotates: no rotary module of its own
}
# The stock module's float32 angles at positions below 256: off by up to 256 * 2**-24 = 1.5e-5 rad.
TABLE_ATOL = 5e-5
SENSITIVITY = 10
LAYOUT_OF_TABLE = {"cat": "half", "repeat": "interleaved"}


def _rotary_module(model_type: str) -> torch.nn.Module:
    package, name = ROTARY[model_type].split(".")
    modeling = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    cls = getattr(modeling, name)
    config_cls = inspect.signature(cls.__init__).parameters["config"].annotation
    config_cls = getattr(modeling, config_cls) if isinstance(config_cls, str) else config_cls
    config = config_cls()
    assert config.model_type == model_type
    return cls(config)


def _llama_rotary() -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1)
    return transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)


def test_every_vision_rotary_of_transformers_has_a_record() -> None:
    assert set(ROTARY) == {family.model_type for family in VISION_FAMILIES}


SUPPORTED = [f for f in VISION_FAMILIES if f.unsupported is None and f.grid_table is None]
UNSUPPORTED = [f for f in VISION_FAMILIES if f.unsupported is not None]


@pytest.mark.parametrize("family", SUPPORTED, ids=[f.model_type for f in SUPPORTED])
def test_vision_rotary_module(family: VisionFamily) -> None:
    module = _rotary_module(family.model_type)
    holder = torch.nn.ModuleDict({"visual": module})
    generator = torch.Generator().manual_seed(0)
    position_ids = torch.randint(0, 256, (200, family.axes), generator=generator)
    x = torch.zeros(1, 200, 1)
    stock = type(module).forward(module, x, position_ids)
    use_anyrope(holder)
    assert is_patched(module)
    patched = module(x, position_ids)
    for ours, theirs in zip(patched, stock, strict=True):
        assert ours.shape == theirs.shape
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, rtol=0, atol=TABLE_ATOL)
    rope = anyrope.RoPE.from_hf_config(module.config)
    table_format = module._anyrope_rotary.table_format
    assert rope.layout == LAYOUT_OF_TABLE[table_format.expand], family.model_type
    remove_anyrope(holder)
    assert torch.equal(module(x, position_ids)[0], stock[0])


@pytest.mark.parametrize("family", UNSUPPORTED, ids=[f.model_type for f in UNSUPPORTED])
def test_a_tower_anyrope_cannot_express_is_left_stock_with_a_warning(family: VisionFamily) -> None:
    vision, text = _rotary_module(family.model_type), _llama_rotary()
    model = torch.nn.ModuleDict({"visual": torch.nn.ModuleDict({"rotary": vision}), "text": text})
    name = type(vision).__name__
    with pytest.warns(
        UserWarning, match=rf"leaves the rotary module visual\.rotary \({name}\) stock: .*{family.model_type}"
    ):
        use_anyrope(model)
    assert is_patched(text)
    assert not is_patched(vision)
    with pytest.raises(ValueError, match=rf"none of ModuleDict's rotary modules: rotary \({name}\)"):
        use_anyrope(torch.nn.ModuleDict({"rotary": _rotary_module(family.model_type)}))


def test_patched_vision_tower_checks_its_position_ids() -> None:
    module = _rotary_module("qwen2_vl_vision")
    use_anyrope(torch.nn.ModuleDict({"visual": module}))
    x = torch.zeros(1, 4, 1)
    with pytest.raises(ValueError, match=r"position_ids of a vision tower must have shape \(patches, 2\)"):
        module(x, torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        module(x, torch.zeros(4, 2))


# Vision-language models built whole: image tokens, a 1 x 4 x 6 patch grid (2 x 3 after the merge).
IN_MODEL = [
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "glm4v",
    "glm4v_moe",
    "glm_ocr",
    "ernie4_5_vl_moe",
]
VISION = {
    "depth": 1,
    "num_heads": 4,
    "embed_dim": 64,
    "hidden_size": 64,
    "intermediate_size": 96,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "deepstack_visual_indexes": [],
    "fullatt_block_indexes": [0],
    "window_size": 16,
    "num_position_embeddings": 64,
    "image_size": 32,
    "initializer_range": 0.1,  # as tiny_models' text configs: attention scores of order 1
}
GRID = (1, 4, 6)


def _vision_language_model(model_type: str) -> torch.nn.Module:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    config_cls = CONFIG_MAPPING[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = config_cls()
        text = default.text_config
        text_kwargs = _tiny_kwargs(type(text), text, OVERRIDES.get(text.model_type, {}))
        vision = {k: v for k, v in VISION.items() if hasattr(default.vision_config, k)}
        vision["out_hidden_size"] = text_kwargs["hidden_size"]  # the merger feeds the text model
        special = {k: 120 + i for i, k in enumerate(("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "image_start_token_id", "image_end_token_id")) if getattr(default, k, None) is not None}  # fmt: skip
        config = config_cls(
            text_config={**text_kwargs, "model_type": text.model_type}, vision_config=vision, **special
        )
        torch.manual_seed(0)
        model = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])(config)
    return model.float().eval()


def _inputs(model: torch.nn.Module) -> dict[str, Any]:
    config, vision = model.config, model.config.vision_config
    grid = torch.tensor([GRID])
    patch = vision.in_channels * getattr(vision, "temporal_patch_size", 1) * vision.patch_size**2  # ERNIE: 1
    pixels = torch.randn(int(grid.prod()), patch, generator=torch.Generator().manual_seed(1))
    image = [config.image_token_id] * (int(grid.prod()) // vision.spatial_merge_size**2)
    start = getattr(config, "vision_start_token_id", None) or getattr(config, "image_start_token_id", None)
    end = getattr(config, "vision_end_token_id", None) or getattr(config, "image_end_token_id", None)
    ids = torch.tensor([[5, 6, start, *image, end, 7, 8, 9]])
    mm = (ids == config.image_token_id).long()
    return {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": grid, "mm_token_type_ids": mm}


@pytest.mark.parametrize("model_type", IN_MODEL)
def test_vision_language_model_with_an_image(model_type: str) -> None:
    model = _vision_language_model(model_type)
    inputs = _inputs(model)
    stock = model(**inputs).logits
    tower = getattr(model.model, "visual", None) or model.model.vision_tower  # ERNIE 4.5-VL: vision_tower
    visual = tower.rotary_pos_emb

    def swapped(x: torch.Tensor, position_ids: torch.Tensor) -> Any:  # rows and columns swapped
        return type(visual).forward(visual, x, position_ids.flip(-1))

    visual.forward = swapped
    moved = relative(stock, model(**inputs).logits)
    del visual.forward
    assert moved > SENSITIVITY * LOGITS_RTOL, (
        f"{model_type}: the vision rotation moves the logits by only {moved:.2e}"
    )

    use_anyrope(model)
    assert is_patched(visual)
    assert is_patched(model.model.language_model.rotary_emb)
    rel = relative(stock, model(**inputs).logits)
    assert rel <= LOGITS_RTOL, f"{model_type}: logits differ by {rel:.2e} of their scale"
    remove_anyrope(model)
    assert torch.equal(model(**inputs).logits, stock)


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, LOGITS_RTOL), (torch.bfloat16, 2**-7)])
def test_pixtral_vision_model_through_use_anyrope(dtype: torch.dtype, rtol: float) -> None:
    config = transformers.PixtralVisionConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
        image_size=32, patch_size=4, num_channels=3, initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.PixtralVisionModel(config).to(dtype).eval()
    # .to() rounds the rotary module's inv_freq buffer too; from_pretrained(dtype=...) keeps it
    # float32, as a module built afresh has it (the probe refuses the rounded one: other angles)
    rotary = type(model.patch_positional_embedding)(config)
    model.patch_positional_embedding = rotary
    pixels = torch.randn(1, 3, 24, 32, generator=torch.Generator().manual_seed(2)).to(dtype)
    sizes = torch.tensor([[24, 32]])
    stock = model(pixels, image_sizes=sizes).last_hidden_state
    use_anyrope(model)
    assert is_patched(model.patch_positional_embedding)
    rel = relative(stock.float(), model(pixels, image_sizes=sizes).last_hidden_state.float())
    assert rel <= rtol, f"pixtral {dtype}: last hidden states differ by {rel:.2e} of their scale"


def test_llama4_vision_model_through_use_anyrope() -> None:
    """Llama 4's vision rotary keeps the complex table of its one patch grid (columns, then rows,
    counted from 1; the class token last, unturned) and takes no positions: anyrope swaps the
    table's values, checked at every patch, and the encoder's output stays the stock one."""
    # intermediate_size: the adapter shuffles 2 x 2 patches into one, of 4 x 64 features
    config = transformers.Llama4VisionConfig(
        hidden_size=64, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4, image_size=24,
        patch_size=4, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64,
        initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Llama4VisionModel(config).eval()
    rotary = model.rotary_embedding
    pixels = torch.randn(1, 3, 24, 24, generator=torch.Generator().manual_seed(3))
    stock = model(pixels).last_hidden_state
    side = config.image_size // config.patch_size
    table = rotary.freqs_ci.clone()
    # rows and columns swapped: the table of the transposed grid, the class token left as it is
    rotary.freqs_ci[:-1] = table[:-1].reshape(side, side, -1).transpose(0, 1).reshape(table[:-1].shape)
    moved = relative(stock, model(pixels).last_hidden_state)
    rotary.freqs_ci.copy_(table)
    assert moved > SENSITIVITY * LOGITS_RTOL, f"the vision rotation moves the output by only {moved:.2e}"

    use_anyrope(model)
    assert is_patched(rotary)
    assert not torch.equal(rotary.freqs_ci, table)  # anyrope's values, not the stock ones
    rel = relative(stock, model(pixels).last_hidden_state)
    assert rel <= LOGITS_RTOL, f"last hidden states differ by {rel:.2e} of their scale"
    remove_anyrope(model)
    assert torch.equal(rotary.freqs_ci, table)
    assert torch.equal(model(pixels).last_hidden_state, stock)


class PatchRopePositionEmbedding(torch.nn.Module):
    """Named as a rotary module, but makes its own positions from the pixels."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return pixel_values


def test_a_rotary_module_anyrope_does_not_recognise_is_named() -> None:
    """Never left silently: said to be left stock (or refused, where nothing else rotates)."""
    with pytest.raises(
        ValueError,
        match=r"none of ModuleDict's rotary modules: rope \(PatchRopePositionEmbedding\): "
        r"its forward takes \(pixel_values\), not position ids",
    ):
        use_anyrope(torch.nn.ModuleDict({"rope": PatchRopePositionEmbedding()}))
    model = torch.nn.ModuleDict({"rope": PatchRopePositionEmbedding(), "text": _llama_rotary()})
    with pytest.warns(
        UserWarning, match=r"leaves the rotary module rope \(PatchRopePositionEmbedding\) stock"
    ):
        use_anyrope(model)
    assert is_patched(model["text"])
    assert not is_patched(model["rope"])
