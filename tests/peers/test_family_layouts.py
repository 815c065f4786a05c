"""Every model family anyrope supports, against that family's own rotary code in transformers.

For each record of :data:`anyrope._families.FAMILIES` (so a new record is tested automatically):

* a family anyrope supports: build the family's config with its defaults (small overrides only
  where the default config does not rotate or cannot run), the family's own ``*RotaryEmbedding``
  module and its own apply function, and rotate random float64 q and k of shape
  ``(batch=2, heads=2, seq, head_dim)`` at positions that differ per batch row (near 0, and
  beyond 4000). ``anyrope.RoPE.from_hf_config(config, layer_type=...)`` must give the same
  attention scores ``q_rot @ k_rot.T`` for every (batch, head) -- a comparison that holds under
  any permutation of the output features, such as the ``cat(evens, odds)`` that DeepSeek's
  ``apply_rotary_pos_emb_interleave`` writes -- and the same rotated q and k (for DeepSeek's
  interleave apply, after putting anyrope's output in that order), with the features it does not
  rotate bit-identical. Families with RoPE parameters per layer type are checked for each layer
  type.
  M-RoPE families get positions of shape (streams, batch, seq) that differ per stream, as an
  image's time, height and width do.
* a family anyrope refuses (a rotation it cannot express): ``from_hf_config`` raises a
  ValueError that gives the family's reason.
* families whose layers differ in theta or scaling outside ``rope_parameters`` (a per-layer theta
  list, Molmo 2's ``rope_scaling_layers``): ``from_hf_config(config, layer=i)`` against the
  rotary module the family's model builds for layer i.

What the family does in the attention code around the apply function is done here as that code
does it (read it): Phi, Persimmon, StableLM and GPT-NeoX-Japanese rotate the first
``rotary_ndims`` features of the attention module (built on the meta device to read them); the
DeepSeek-style multi-head latent attention families rotate a separate ``qk_rope_head_dim``
tensor; GPT-J and CodeGen gather (sin, cos) from their rotary module's sinusoid table; RoFormer
looks positions up in its sinusoidal embedding.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

import anyrope
from anyrope._families import FAMILIES, Family

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0")

from transformers.models.auto.configuration_auto import CONFIG_MAPPING

EPS32 = 2.0**-24  # float32's unit roundoff
EPS64 = 2.0**-53

# --- Tolerance -----------------------------------------------------------------------------------
# transformers forms every angle in float32: ``inv_freq = 1 / base ** (arange(0, d, 2) / d)`` and
# ``angle = inv_freq * position``. The exponent 2i/d is rounded (relative error <= EPS32), which
# base ** e turns into a relative error of ln(base) * e * EPS32 <= ln(base) * EPS32; pow, the
# division, the product with the position (exact as a float32 integer below 2**24) and the
# float32 arithmetic of the scaling methods (linear, llama3's smoothing, YaRN's ramp blend) add
# at most 8 more roundings. So the angle of pair p at position m is off by at most
#     ANGLE_REL * |inv_freq_p * m|,  ANGLE_REL = (ln(base) + 8) * EPS32,
# while anyrope forms it in float64 (error ~ EPS64, neglected next to this).
# cos and sin are then rounded to float32 (each <= EPS32, a perturbation of the 2x2 rotation of
# norm <= sqrt(2) EPS32), multiplied by the attention factor in float32 (EPS32), and several
# families rotate in float32 (Cohere, ESM, ERNIE, DeepSeek-V2 and Llama 4's complex products: q
# rounded to float32, two products and a sum, <= 4 EPS32): a rotated pair of norm r is off by at
# most r * (angle error + ROUND_REL), ROUND_REL = 8 * EPS32. A feature of the rotated vector is
# off by at most that (its pair's error bounds it); a score sum_p <q'_p, k'_p> by at most
#     a**2 * sum_p r_q,p r_k,p * (ANGLE_REL * (|theta_p,m| + |theta_p,n|) + 2 ROUND_REL)
# (a: the attention factor), plus float64 summation of both scores (4 * head_dim * EPS64 * |q||k|).
ROUND_REL = 8 * EPS32

BATCH, HEADS, SEQ = 2, 2, 6
# Positions differ per batch row; the far rows reach where float32 angles carry real error.
POSITIONS = {
    "near": [list(range(SEQ)), list(range(5, 5 + SEQ))],
    "far": [list(range(4000, 4000 + SEQ)), [4093 + 3 * i for i in range(SEQ)]],
}
# M-RoPE families: (streams, batch, seq), every stream different (an image's time, height and
# width); NeoMME's two streams are the first two.
STREAM_POSITIONS = {
    "near": [
        [[0, 1, 2, 2, 2, 5], [5, 6, 7, 7, 7, 10]],
        [[0, 1, 2, 2, 3, 5], [5, 6, 7, 8, 8, 10]],
        [[0, 1, 2, 3, 2, 5], [5, 6, 7, 8, 7, 10]],
    ],
    "far": [
        [[4000, 4001, 4002, 4002, 4002, 4005], [4093, 4096, 4099, 4099, 4099, 4108]],
        [[4000, 4001, 4002, 4002, 4003, 4005], [4093, 4096, 4099, 4102, 4102, 4108]],
        [[4000, 4001, 4002, 4003, 4002, 4005], [4093, 4096, 4099, 4105, 4100, 4108]],
    ],
}
TABLE_LENGTH = 4160  # sinusoid tables (GPT-J, CodeGen, RoFormer) must reach the far positions


@dataclass(frozen=True)
class Spec:
    """How to drive one family's own rotary code (defaults: the Llama pattern)."""

    module: str | None = None  # transformers.models.<module>.modeling_<module>; default: the config's
    rotary: str | None = None  # the rotary class; default: the module's only non-vision *RotaryEmbedding
    apply: str = "apply_rotary_pos_emb"
    # "qk": apply(q, k, cos, sin) on (b, h, s, d); "single": apply(x, cos, sin, unsqueeze_dim=1);
    # "complex_bhsd" / "complex_bshd": apply(q, k, freqs_cis) (DeepSeek-V2, Llama 4);
    # "gptj": (sin, cos) from the rotary module's sinusoid table, apply(x, sin, cos) on (b, s, h, d); "roformer";
    # "clvp": angles of positions 0.. from the rotary module, apply(q, k, v, cos, sin, position_ids);
    # "conformer": stacked cos and sin of positions 0.. from the rotary module, the attention
    # class's _apply_rotary_embedding(hidden_states) on (b, s, h * d).
    kind: str = "qk"
    attention: str | None = None  # attention class whose forward slices q[..., :rotary_ndims]
    permutes: bool = False  # the apply writes its output as cat(evens, odds) (DeepSeek's *_interleave)
    config: dict[str, Any] = field(default_factory=dict)  # overrides of the default config


_INTERLEAVE = "apply_rotary_pos_emb_interleave"


def _conformer(prefix: str, config: dict[str, Any] | None = None) -> Spec:
    return Spec(
        rotary=f"{prefix}RotaryPositionalEmbedding",
        attention=f"{prefix}SelfAttention",
        kind="conformer",
        config={"position_embeddings_type": "rotary", **(config or {})},
    )


SPECS: dict[str, Spec] = {
    # served by LlamaModel (no modeling file of their own)
    "internlm3": Spec(module="llama", rotary="LlamaRotaryEmbedding"),
    "exaone": Spec(module="llama", rotary="LlamaRotaryEmbedding"),
    "sarvam_moe": Spec(module="glm4_moe"),
    "iquestcoder": Spec(module="llama", rotary="LlamaRotaryEmbedding"),
    # modules with several rotary classes: the one the text model builds
    "deepseek_ocr2_text": Spec(rotary="DeepseekOcr2TextRotaryEmbedding"),
    "evolla": Spec(rotary="EvollaRotaryEmbedding"),  # (EvollaSaProt... is the protein encoder's)
    "granite4_vision_text": Spec(rotary="Granite4VisionTextRotaryEmbedding"),
    "minimax_m3_vl_text": Spec(rotary="MiniMaxM3VLRotaryEmbedding"),
    "muse_glimmer_text": Spec(rotary="MuseGlimmerTextRotaryEmbedding"),
    "muse_spark_text": Spec(rotary="MuseSparkTextRotaryEmbedding"),
    "qwen3_omni_moe_talker_code_predictor": Spec(rotary="Qwen3OmniMoeRotaryEmbedding"),
    "step3p5": Spec(rotary="Step3p7RotaryEmbedding"),
    "qwen2_5_omni_text": Spec(rotary="Qwen2_5OmniRotaryEmbedding"),  # (not the DiT's)
    "qwen2_5_omni_talker": Spec(rotary="Qwen2_5OmniRotaryEmbedding"),
    "qwen3_omni_moe_talker_text": Spec(rotary="Qwen3OmniMoeTalkerRotaryEmbedding"),
    # complex freqs_cis
    "deepseek_v2": Spec(apply="apply_rotary_emb", kind="complex_bhsd"),
    "llama4_text": Spec(rotary="Llama4TextRotaryEmbedding", apply="apply_rotary_emb", kind="complex_bshd"),
    # multi-head latent attention whose attention calls the interleave apply
    "axk1": Spec(apply=_INTERLEAVE, permutes=True),  # rope_interleave=True (default)
    "axk2": Spec(apply=_INTERLEAVE, permutes=True),
    "bailing_hybrid": Spec(apply=_INTERLEAVE, permutes=True),
    "deepseek_v3": Spec(apply=_INTERLEAVE, permutes=True),
    "deepseek_v32": Spec(apply=_INTERLEAVE, permutes=True),
    "dots3_note_text": Spec(rotary="Dots3NoteTextRotaryEmbedding", apply=_INTERLEAVE, permutes=True),
    "glm4_moe_lite": Spec(apply=_INTERLEAVE, permutes=True),
    "glm_moe_dsa": Spec(apply=_INTERLEAVE, permutes=True),
    "longcat_flash": Spec(apply=_INTERLEAVE, permutes=True),
    "mistral4": Spec(apply=_INTERLEAVE, permutes=True),
    "mistral_large4_text": Spec(apply=_INTERLEAVE, permutes=True),  # (alpha at its init: exp(0) = 1)
    "clvp_encoder": Spec(module="clvp", rotary="ClvpRotaryPositionalEmbedding", kind="clvp"),
    "sarvam_mla": Spec(module="deepseek_v3", apply=_INTERLEAVE, permutes=True),
    "youtu": Spec(apply=_INTERLEAVE, permutes=True),
    # Gemma 3n rotates q and k in separate calls (on (b, s, h, d) with unsqueeze_dim=2; the same
    # here on (b, h, s, d) with unsqueeze_dim=1)
    "gemma3n_text": Spec(kind="single"),
    "gemma4_text": Spec(kind="single"),  # (and Gemma 4's kin)
    "gemma4_unified_text": Spec(kind="single"),
    "diffusion_gemma_text": Spec(kind="single"),
    # the attention code slices the rotated part
    "phi": Spec(attention="PhiAttention"),
    "persimmon": Spec(attention="PersimmonAttention"),
    "stablelm": Spec(attention="StableLmAttention"),
    "gpt_neox_japanese": Spec(attention="GPTNeoXJapaneseAttention"),
    # sinusoid tables built by the attention module (small configs: the module has real weights)
    "gptj": Spec(
        kind="gptj",
        attention="GPTJAttention",
        config={"n_embd": 256, "n_head": 4, "rotary_dim": 16, "n_positions": TABLE_LENGTH},
    ),
    "codegen": Spec(
        kind="gptj",
        attention="CodeGenAttention",
        config={"n_embd": 256, "n_head": 4, "rotary_dim": 16, "n_positions": TABLE_LENGTH},
    ),
    "roformer": Spec(
        kind="roformer",
        config={"hidden_size": 128, "num_attention_heads": 8, "max_position_embeddings": TABLE_LENGTH},
    ),
    # The default GLM-4.5 config has hidden_size=4096 with 96 heads: 4096 // 96 = 42 features, of
    # which 21 would rotate (odd). The released checkpoints set head_dim=128.
    "glm4_moe": Spec(config={"head_dim": 128}),
    "glm4v_moe_text": Spec(config={"head_dim": 128}),  # (the same 4096 // 96)
    "qwen3_omni_moe_text": Spec(
        rotary="Qwen3OmniMoeThinkerTextRotaryEmbedding", config={"head_dim": 128}
    ),  # 2048 // 28
    # GLM-4.1V and GLM-Image default to rotating every feature, with sections for half of them
    # (8 + 12 + 12 of 64 pairs): their checkpoints set partial_rotary_factor=0.5
    "glm4v_text": Spec(config={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    "glm_image_text": Spec(config={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    # rope_parameters has an entry for a layer type that no layer of the default config has (so
    # the rotary module builds no frequencies for it): give the model one layer of each type
    "laguna": Spec(config={"num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"]}),
    "mellum": Spec(config={"num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"]}),
    # its "main" parameters serve sliding layers, which the default config has none of
    "deepseek_v4": Spec(
        kind="single",
        config={"num_hidden_layers": 2, "layer_types": ["sliding_attention", "heavily_compressed_attention"]},
    ),
    "zaya": Spec(
        config={"num_hidden_layers": 2, "layer_types": ["hybrid", "hybrid_sliding"], "sliding_window": 128}
    ),
    # RoPE parameters nested by layer type, and none in the default config
    "cohere_compass_text": Spec(config={"rope_parameters": {"full_attention": {"rope_theta": 10000.0}}}),
    # whole-config switches that are off by default
    "esm": Spec(config={"position_embedding_type": "rotary"}),
    "granitemoehybrid": Spec(config={"position_embedding_type": "rope"}),
    "zamba2": Spec(config={"use_mem_rope": True}),
    # speech conformers: rotary only with position_embeddings_type "rotary"; SeamlessM4T's speech
    # encoder has heads of its own (8 here, the decoder's 16)
    "seamless_m4t": _conformer(
        "SeamlessM4TConformer", {"speech_encoder_attention_heads": 8, "rotary_embedding_base": 500}
    ),
    "wav2vec2-bert": _conformer("Wav2Vec2Bert"),
    "wav2vec2-conformer": _conformer("Wav2Vec2Conformer"),
}

# Further configurations worth a case of their own: (label, spec).
VARIANTS: dict[str, list[tuple[str, Spec]]] = {
    name: [("rope_interleave=False", Spec(config={"rope_interleave": False}))]
    for name in ("axk1", "deepseek_v3", "glm4_moe_lite", "mistral4", "youtu")
}
VARIANTS["sarvam_mla"] = [
    ("rope_interleave=False", Spec(module="deepseek_v3", config={"rope_interleave": False}))
]
VARIANTS["sarvam_moe"] = [
    ("partial_rotary_factor=0.5", Spec(module="glm4_moe", config={"partial_rotary_factor": 0.5}))
]
VARIANTS["gpt_neox_japanese"] = [
    ("rotary_pct=0.5", Spec(attention="GPTNeoXJapaneseAttention", config={"rotary_pct": 0.5}))
]
VARIANTS["phi3"] = [("partial_rotary_factor=0.5", Spec(config={"partial_rotary_factor": 0.5}))]
VARIANTS["phi4_multimodal"] = [("partial_rotary_factor=0.5", Spec(config={"partial_rotary_factor": 0.5}))]
VARIANTS["minimax_m2"] = [("rotary_dim=64", Spec(config={"rotary_dim": 64}))]
for _name, _prefix in (("wav2vec2-bert", "Wav2Vec2Bert"), ("wav2vec2-conformer", "Wav2Vec2Conformer")):
    VARIANTS[_name] = [("rotary_embedding_base=500", _conformer(_prefix, {"rotary_embedding_base": 500}))]
# HunYuan's checkpoints say "dynamic" with an alpha: a fixed NTK stretch of the base (its "ntk_alpha")
_NTK_ALPHA = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
for _name in ("hunyuan_v1_dense", "hunyuan_v1_moe"):
    VARIANTS[_name] = [("alpha=1000", Spec(config={"head_dim": 128, "rope_parameters": _NTK_ALPHA}))]

# PhiMoE's LongRoPE: an attention factor per side of original_max_position_embeddings. With equal
# short and long factors the frequencies cannot differ, so the far positions check long_mscale.
_PHIMOE = {
    "rope_type": "longrope",
    "rope_theta": 1e6,
    "original_max_position_embeddings": 4096,
    "short_mscale": 1.1,
    "long_mscale": 1.3,
    "short_factor": [1.0 + i / 64 for i in range(64)],
}
VARIANTS["phimoe"] = [
    (
        "longrope equal factors",
        Spec(config={"rope_parameters": {**_PHIMOE, "long_factor": _PHIMOE["short_factor"]}}),
    ),
    (
        "longrope",
        Spec(config={"rope_parameters": {**_PHIMOE, "long_factor": [4.0 + i / 8 for i in range(64)]}}),
    ),
]

# Families this test cannot drive, with the reason (aim: none).
CANNOT_DRIVE: dict[str, str] = {}

# Refused families whose default config cannot be built: the overrides that let it build.
REFUSED_CONFIG: dict[str, dict[str, Any]] = {}

# Where anyrope and the family's own code disagree: case id -> what differs. Marked xfail(strict),
# so that a fix shows up as an XPASS to remove the entry.
DISAGREEMENTS: dict[str, str] = {
    "phimoe/longrope": (
        "past original_max_position_embeddings transformers 5.24's PhimoeRotaryEmbedding.forward "
        "takes long_mscale but recomputes inv_freq without the length, so with short_factor; anyrope "
        "rotates with long_factor there, as LongRoPE does and as vLLM pairs them (long_factor with long_mscale)"
    ),
}


def _refused(family: Family) -> bool:
    return family.unsupported is not None


def _build_config(model_type: str, overrides: dict[str, Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CONFIG_MAPPING[model_type](**overrides)


def _nested_layer_types(config: Any) -> list[str] | None:
    """The layer types of RoPE parameters nested by layer type (None where they are flat)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        return [key for key, value in params.items() if isinstance(value, dict) or value is None]
    return None


@dataclass(frozen=True)
class Case:
    model_type: str
    label: str
    spec: Spec
    layer_type: str | None

    @property
    def id(self) -> str:
        parts = [self.model_type]
        if self.label:
            parts.append(self.label)
        if self.layer_type is not None:
            parts.append(self.layer_type)
        return "/".join(parts)


def _param(case: Case) -> Any:
    marks = []
    if case.id in DISAGREEMENTS:
        marks.append(pytest.mark.xfail(reason=DISAGREEMENTS[case.id], strict=True))
    return pytest.param(case, id=case.id, marks=marks)


def _cases() -> Iterator[Any]:
    for family in FAMILIES:
        if _refused(family):
            continue
        if family.model_type in CANNOT_DRIVE:
            reason = CANNOT_DRIVE[family.model_type]
            yield pytest.param(None, id=family.model_type, marks=pytest.mark.skip(reason=reason))
            continue
        variants = [("", SPECS.get(family.model_type, Spec())), *VARIANTS.get(family.model_type, [])]
        for label, spec in variants:
            types = _nested_layer_types(_build_config(family.model_type, spec.config)) or [None]
            for layer_type in types:
                yield _param(Case(family.model_type, label, spec, layer_type))


CASES = list(_cases())
_FAMILY = {family.model_type: family for family in FAMILIES}


# --- The family's own code ---------------------------------------------------------------------


def _module_of(model_type: str, spec: Spec) -> Any:
    name = spec.module or CONFIG_MAPPING[model_type].__module__.split(".")[-2]
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _rotary_class(module: Any, spec: Spec) -> Any:
    if spec.rotary is not None:
        return getattr(module, spec.rotary)
    found = [
        obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and name.endswith("RotaryEmbedding")
        and "Vision" not in name
    ]
    assert len(found) == 1, f"{module.__name__}: name the rotary class in SPECS, candidates {found}"
    return found[0]


def _on_meta(cls: Any, config: Any) -> Any:
    """An attention module without weights, to read what its __init__ derives from the config."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(config, layer_idx=0)


def _family_head_dim(case: Case, config: Any) -> int:
    """The width of the tensors the family rotates, as its attention code derives it."""
    spec, family = case.spec, _FAMILY[case.model_type]
    if spec.kind == "gptj":  # GPTJAttention / CodeGenAttention: embed_dim // num_attention_heads
        return config.n_embd // config.n_head
    if spec.kind == "roformer":  # RoFormerEncoder: hidden_size // num_attention_heads
        return config.hidden_size // config.num_attention_heads
    if spec.kind == "conformer":  # its self-attention's (SeamlessM4T: speech_encoder_attention_heads)
        with torch.device("meta"):
            return int(getattr(_module_of(case.model_type, spec), spec.attention)(config).head_size)
    if spec.attention is not None:
        attention = _on_meta(getattr(_module_of(case.model_type, spec), spec.attention), config)
        return int(getattr(attention, "head_dim", None) or attention.head_size)
    if case.layer_type is not None and getattr(config, "per_layer_config", None) is not None:
        # heterogeneous configs: a layer of that type's (layers of one type may differ in keys
        # that do not rotate, as NeoMME's sliding windows do, which transformers' view refuses)
        keys = [family.rope_keys.get(kind, kind) for kind in config.layer_types]  # DeepSeek-V4's labels
        config = config.per_layer_config[keys.index(case.layer_type)]
    if family.width == "mla":  # latent attention rotates a separate qk_rope_head_dim tensor
        return int(config.qk_rope_head_dim)
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _apply(case: Case, module: Any, config: Any, emb: Any, q: Any, k: Any) -> tuple[Any, Any]:
    """q and k rotated by the family's apply function, given its rotary module's output."""
    spec = case.spec
    apply = getattr(module, spec.apply)
    if spec.kind == "complex_bhsd":
        return apply(q, k, emb)
    if spec.kind == "complex_bshd":
        q_rot, k_rot = apply(q.transpose(1, 2), k.transpose(1, 2), emb)
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)
    cos, sin = emb
    if spec.kind == "single":
        return apply(q, cos, sin, unsqueeze_dim=1), apply(k, cos, sin, unsqueeze_dim=1)
    if spec.attention is not None:  # e.g. PhiAttention.forward: rotate [..., :rotary_ndims], keep the rest
        ndims = _on_meta(getattr(module, spec.attention), config).rotary_ndims
        q_rot, k_rot = apply(q[..., :ndims], k[..., :ndims], cos, sin)
        return torch.cat([q_rot, q[..., ndims:]], dim=-1), torch.cat([k_rot, k[..., ndims:]], dim=-1)
    return apply(q, k, cos, sin)


def _family_rotate(case: Case, config: Any, q: Any, k: Any, position_ids: Any) -> tuple[Any, Any]:
    """q and k rotated by the family's own code, as its attention forward does."""
    spec = case.spec
    module = _module_of(case.model_type, spec)
    if spec.kind == "gptj":  # GPTJAttention.forward / CodeGenAttention.forward, on (b, s, h, d)
        sin, cos = _rotary_class(module, spec)(config)(q, position_ids)  # (sin, cos), since 5.24
        rotary_dim = _on_meta(getattr(module, spec.attention), config).rotary_dim
        rotated = []
        for x in (q.transpose(1, 2), k.transpose(1, 2)):
            x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
            x = torch.cat([module.apply_rotary_pos_emb(x_rot, sin, cos), x_pass], dim=-1)
            rotated.append(x.transpose(1, 2))
        return rotated[0], rotated[1]
    if spec.kind == "roformer":  # RoFormerEncoder + RoFormerSelfAttention.apply_rotary_position_embeddings
        embedding = module.RoFormerSinusoidalPositionalEmbedding(config.max_position_embeddings, q.shape[-1])
        embedding.weight.copy_(embedding.create_weight())  # as RoFormerPreTrainedModel._init_weights does
        sinusoidal_pos = embedding(q.shape[:2], position_ids=position_ids)[:, None]  # (b, 1, s, d)
        return module.RoFormerSelfAttention.apply_rotary_position_embeddings(sinusoidal_pos, q, k)
    if spec.kind == "clvp":  # ClvpSelfAttention.forward: the first rotary_emb_dim features of q, k (and v)
        length = int(position_ids.max()) + 1  # its table covers positions 0 .. seq - 1 of hidden_states
        angles = _rotary_class(module, spec)(config)(q.new_zeros(1, length, 1))
        width = angles.shape[-1]
        cos, sin = angles.cos().squeeze(0), angles.sin().squeeze(0)
        q_rot, k_rot, _ = module.apply_rotary_pos_emb(
            q[..., :width], k[..., :width], k[..., :width], cos, sin, position_ids
        )
        return torch.cat([q_rot, q[..., width:]], dim=-1), torch.cat([k_rot, k[..., width:]], dim=-1)
    if spec.kind == "conformer":
        return _conformer_rotate(module, spec, config, q, k, position_ids)
    rotary = _rotary_class(module, spec)(config)
    emb = rotary(q, position_ids) if case.layer_type is None else rotary(q, position_ids, case.layer_type)
    return _apply(case, module, config, emb, q, k)


def _conformer_rotate(
    module: Any, spec: Spec, config: Any, q: Any, k: Any, position_ids: Any
) -> tuple[Any, Any]:
    """*SelfAttention.forward of the speech conformers: _apply_rotary_embedding rotates the hidden
    states (batch, seq, heads * head_size) by the table rows of positions 0 .. seq - 1; here each
    batch row by the rows of its own positions."""
    length = int(position_ids.max()) + 1
    table = _rotary_class(module, spec)(config)(q.new_zeros(1, length, 1))  # (2, length, 1, 1, d)
    batch, heads, seq, head_size = q.shape
    attention = SimpleNamespace(num_heads=heads, head_size=head_size)  # what the method reads
    apply = getattr(module, spec.attention)._apply_rotary_embedding

    def rotate(x: Any) -> Any:
        rows = []
        for row in range(batch):
            hidden = x[row].transpose(0, 1).reshape(1, seq, heads * head_size)
            rotated = apply(attention, hidden, table[:, position_ids[row]])
            rows.append(rotated.view(seq, heads, head_size).transpose(0, 1))
        return torch.stack(rows)

    return rotate(q), rotate(k)


# --- Comparison --------------------------------------------------------------------------------


def _pair_norms(x: Any, rope: anyrope.RoPE) -> Any:
    """|(x_a, x_b)| for each rotated pair (a, b) of anyrope's layout, pair index last."""
    rot = x[..., : rope.rotary_dim]
    if rope.layout == "half":
        first, second = rot[..., : rope.rotary_dim // 2], rot[..., rope.rotary_dim // 2 :]
    else:
        first, second = rot[..., 0::2], rot[..., 1::2]
    return torch.sqrt(first**2 + second**2)


def _bounds(rope: anyrope.RoPE, q: Any, k: Any, position_ids: Any) -> tuple[Any, Any, Any]:
    """Bounds (see the top of the file) on each feature of rotated q and k, in anyrope's feature
    order, and on each score."""
    inv_freq = torch.tensor(rope.inv_freq_at(int(position_ids.max()) + 1), dtype=torch.float64)
    if position_ids.ndim == 3:  # M-RoPE: a bound for every stream's position bounds each pair's
        position_ids = position_ids.abs().amax(dim=0)
    theta = position_ids.to(torch.float64)[:, None, :, None] * inv_freq  # (b, 1, s, pairs)
    angle_err = (math.log(max(rope.base, math.e)) + 8) * EPS32 * theta.abs()
    scale = rope.at_length(int(position_ids.max()) + 1).attention_scaling  # LongRoPE's may switch
    rq, rk = _pair_norms(q, rope), _pair_norms(k, rope)

    def per_feature(r: Any) -> Any:
        bound = scale * r * (angle_err + ROUND_REL)
        spread = torch.cat([bound, bound], -1) if rope.layout == "half" else bound.repeat_interleave(2, -1)
        rest = torch.zeros(*r.shape[:-1], q.shape[-1] - rope.rotary_dim, dtype=torch.float64)
        return torch.cat([spread, rest], -1)

    scores = scale**2 * (
        (rq * angle_err) @ rk.transpose(-1, -2)
        + rq @ (rk * angle_err).transpose(-1, -2)
        + 2 * ROUND_REL * rq @ rk.transpose(-1, -2)
    )
    norms = q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :]
    scores = scores + 4 * q.shape[-1] * EPS64 * max(scale, 1.0) ** 2 * norms
    return per_feature(rq), per_feature(rk), scores


def _assert_within(name: str, got: Any, want: Any, bound: Any) -> None:
    difference = (got - want).abs()
    worst = int((difference - bound).argmax())
    assert float((difference - bound).flatten()[worst]) <= 0, (
        f"{name}: |anyrope - family| = {float(difference.flatten()[worst]):.3e} exceeds the bound "
        f"{float(bound.flatten()[worst]):.3e} at flat index {worst} (largest difference "
        f"{float(difference.max()):.3e})"
    )


def _evens_odds(x: Any) -> Any:
    """The feature order DeepSeek's apply_rotary_pos_emb_interleave writes: cat(x[0::2], x[1::2])."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def _compare(where: str, rope: anyrope.RoPE, rotate: Any, head_dim: int, permutes: bool, seed: str) -> None:
    """anyrope's rope(q, k, positions=...) against ``rotate(q, k, position_ids)`` (the family's)."""
    generator = torch.Generator().manual_seed(sum(map(ord, seed)))
    for regime, rows in POSITIONS.items():
        position_ids = torch.tensor(rows, dtype=torch.int64)
        if rope.streams > 1:
            position_ids = torch.tensor(STREAM_POSITIONS[regime][: rope.streams], dtype=torch.int64)
        q = torch.randn(BATCH, HEADS, SEQ, head_dim, dtype=torch.float64, generator=generator)
        k = torch.randn(BATCH, HEADS, SEQ, head_dim, dtype=torch.float64, generator=generator)
        q_fam, k_fam = rotate(q.clone(), k.clone(), position_ids)
        q_any, k_any = rope(q, k, positions=position_ids)
        q_bound, k_bound, score_bound = _bounds(rope, q, k, position_ids)
        here = f"{where} ({regime} positions)"
        assert q_fam.dtype == torch.float64
        _assert_within(
            f"{here}: scores q_rot @ k_rot.T",
            q_any @ k_any.transpose(-1, -2),
            q_fam @ k_fam.transpose(-1, -2),
            score_bound,
        )
        if permutes:  # the family wrote cat(evens, odds): put anyrope's output (and bounds) in that order
            assert rope.rotary_dim == head_dim, "the interleave apply rotates every feature it is given"
            q_any, k_any, q_bound, k_bound = (_evens_odds(x) for x in (q_any, k_any, q_bound, k_bound))
        _assert_within(f"{here}: rotated q", q_any, q_fam, q_bound)
        _assert_within(f"{here}: rotated k", k_any, k_fam, k_bound)
        if rope.rotary_dim < head_dim:  # the features neither rotates stay bit-identical
            r = rope.rotary_dim
            for who, x_rot, x in (
                ("anyrope", q_any, q),
                ("anyrope", k_any, k),
                ("the family", q_fam, q),
                ("the family", k_fam, k),
            ):
                assert torch.equal(x_rot[..., r:], x[..., r:]), (
                    f"{here}: {who} changed features it does not rotate"
                )


# --- Tests -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _fast() -> Iterator[None]:
    """Tiny tensors, so: no gradients; one torch thread (a thread pool costs more than these
    products, several times more on a busy machine); and no cos/sin tables for the whole context
    -- anyrope builds prefix tables for ``max_position_embeddings`` positions on first use (up to
    2**18 rows here, seconds each). With a 2 MiB bound the near positions still go through a
    (short) prefix table, the far ones are computed for just the positions asked."""
    limit, threads = anyrope.table_cache.limit_bytes, torch.get_num_threads()
    anyrope.table_cache.set_limit(2 * 2**20)
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)
        anyrope.table_cache.set_limit(limit)


@pytest.mark.parametrize("case", CASES)
def test_rotates_as_the_family(case: Case) -> None:
    config = _build_config(case.model_type, case.spec.config)
    params = getattr(config, "rope_parameters", None) or {}
    if case.layer_type is not None and params.get(case.layer_type) is None:
        # a layer type whose entry is None does not rotate (Beam's global layers)
        with pytest.raises(ValueError, match="has no rotary embedding"):
            anyrope.RoPE.from_hf_config(config, layer_type=case.layer_type)
        return
    rope = anyrope.RoPE.from_hf_config(config, layer_type=case.layer_type)
    head_dim = _family_head_dim(case, config)
    assert rope.head_dim == head_dim, f"anyrope reads head_dim={rope.head_dim}, the family uses {head_dim}"

    def rotate(q: Any, k: Any, position_ids: Any) -> tuple[Any, Any]:
        return _family_rotate(case, config, q, k, position_ids)

    _compare(case.id, rope, rotate, head_dim, case.spec.permutes, case.id)


REFUSED = [family for family in FAMILIES if _refused(family)]


@pytest.mark.parametrize("family", REFUSED, ids=[family.model_type for family in REFUSED])
def test_refuses_what_it_cannot_express(family: Family) -> None:
    config = _build_config(family.model_type, REFUSED_CONFIG.get(family.model_type, {}))
    match = re.escape(family.unsupported or "")
    types = _nested_layer_types(config) or [None]
    for layer_type in [t for t in types if t is None or config.rope_parameters[t] is not None]:
        with pytest.raises(ValueError, match=match):
            anyrope.RoPE.from_hf_config(config, layer_type=layer_type)


def test_every_family_is_covered() -> None:
    """Each record is either driven (or an explicit skip) or refused: none falls between."""
    driven = {param.id.split("/")[0] for param in CASES}
    refused = {family.model_type for family in REFUSED}
    assert driven | refused == set(_FAMILY)
    assert not driven & refused


# --- Layers that differ outside rope_parameters ------------------------------------------------


def _per_theta_rotary(module: Any, config: Any, layer: int) -> Any:
    """GraniteSWAModel.__init__ / forward: one rotary module per distinct non-zero theta, built from
    a copy of the config with that rope_theta; theta 0 = NoPE."""
    theta = config.layer_rope_theta[layer]
    if not theta:
        return None
    theta_config = copy.deepcopy(config)
    theta_config.rope_parameters = {**config.rope_parameters, "rope_theta": theta}
    return _rotary_class(module, Spec())(theta_config)


def _global_rotary_unless_zero(module: Any, config: Any, layer: int) -> Any:
    """MuseSparkTextModel.forward: the one rotary module (the global theta) for every layer whose
    layer_rope_theta is non-zero; 0 = NoPE."""
    rotary = {
        "muse_glimmer_text": "MuseGlimmerTextRotaryEmbedding",
        "muse_spark_text": "MuseSparkTextRotaryEmbedding",
    }
    if not config.layer_rope_theta[layer]:
        return None
    return getattr(module, rotary[config.model_type])(config)


def _molmo2_rotary(module: Any, config: Any, layer: int) -> Any:
    """Molmo2TextModel: scaled RoPE on rope_scaling_layers, the same theta unscaled elsewhere."""
    return module.Molmo2RotaryEmbedding(config, scaled=layer in config.rope_scaling_layers)


_THREE_LAYERS = {
    "num_hidden_layers": 3,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
}
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024}

LAYER_CASES = [
    # (id, model_type, config overrides, the family's rotary module for layer i, known disagreement)
    (
        "granite_swa",
        "granite_swa",
        {**_THREE_LAYERS, "layer_rope_theta": [10000.0, 0, 500000.0]},
        _per_theta_rotary,
        None,
    ),
    (
        "granitemoe_swa",
        "granitemoe_swa",
        {**_THREE_LAYERS, "layer_rope_theta": [10000.0, 0, 500000.0]},
        _per_theta_rotary,
        None,
    ),
    ("muse_glimmer_text", "muse_glimmer_text", {"num_hidden_layers": 4}, _global_rotary_unless_zero, None),
    ("muse_spark_text", "muse_spark_text", {"num_hidden_layers": 4}, _global_rotary_unless_zero, None),
    (
        "muse_glimmer_text/theta-unlike-global",
        "muse_glimmer_text",
        {"num_hidden_layers": 3, "layer_rope_theta": [500000.0, 0, 20000.0]},
        _global_rotary_unless_zero,
        None,
    ),
    (
        "muse_spark_text/theta-unlike-global",
        "muse_spark_text",
        {"num_hidden_layers": 3, "layer_rope_theta": [500000.0, 0, 10000.0]},
        _global_rotary_unless_zero,
        None,
    ),
    ("molmo2_text", "molmo2_text", {"num_hidden_layers": 2, "rope_parameters": _YARN}, _molmo2_rotary, None),
    (
        "molmo2_text/rope_scaling_layers",
        "molmo2_text",
        {"num_hidden_layers": 2, "rope_parameters": _YARN, "rope_scaling_layers": [0]},
        _molmo2_rotary,
        None,
    ),
]


@pytest.mark.parametrize(
    ("model_type", "overrides", "rotary_for_layer"),
    [
        pytest.param(
            model_type,
            overrides,
            rotary_for_layer,
            id=case_id,
            marks=[pytest.mark.xfail(reason=why, strict=True)] if why else [],
        )
        for case_id, model_type, overrides, rotary_for_layer, why in LAYER_CASES
    ],
)
def test_each_layer_rotates_as_the_family(
    model_type: str, overrides: dict[str, Any], rotary_for_layer: Callable[[Any, Any, int], Any]
) -> None:
    config = _build_config(model_type, overrides)
    module = _module_of(model_type, Spec())
    case = Case(model_type, "", SPECS.get(model_type, Spec()), None)
    head_dim = _family_head_dim(case, config)
    for layer in range(config.num_hidden_layers):
        rotary = rotary_for_layer(module, config, layer)
        if rotary is None:
            with pytest.raises(ValueError, match="has no rotary embedding"):
                anyrope.RoPE.from_hf_config(config, layer=layer)
            continue
        rope = anyrope.RoPE.from_hf_config(config, layer=layer)

        def rotate(q: Any, k: Any, position_ids: Any, rotary: Any = rotary) -> tuple[Any, Any]:
            return _apply(case, module, config, rotary(q, position_ids), q, k)

        _compare(f"{model_type} layer {layer}", rope, rotate, head_dim, False, f"{model_type}{layer}")
