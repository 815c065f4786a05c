"""anyrope against Hugging Face transformers, on the RoPE configurations of real models.

For each model's ``config.json`` (written out below; no network) and each regime of positions:

(a) inverse frequencies: anyrope's float64 ``inv_freq_at(max(positions) + 1)`` against the float32
    ``inv_freq`` buffer of the model family's own ``*RotaryEmbedding`` module, read *after* a
    forward at those positions (which is when transformers switches DynamicNTK's base and
    LongRoPE's long factors);
(b) the attention factor carried by cos and sin;
(c) rotated q and k: ``rope(q, k, positions=position_ids)`` against the family's own
    ``apply_rotary_pos_emb(q, k, cos, sin)``, and both against a float64 evaluation of the same
    formula, to show that anyrope's float32 output is the closer one.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import anyrope

from oracle import rotate as oracle_rotate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="4.56")

F32_ULP = 2.0**-24  # half an ulp of 1.0 in float32: float32's relative rounding error


# --- The models' config.json, as published (the keys that concern the attention and RoPE; the
# tokenizer ids, auto_map and quantization_config entries are left out). -----------------------

LLAMA_2_7B = {  # meta-llama/Llama-2-7b-hf
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "vocab_size": 32000,
}

LLAMA_3_1_8B = {  # meta-llama/Llama-3.1-8B
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

QWEN2_5_7B_INSTRUCT_YARN = {  # Qwen/Qwen2.5-7B-Instruct, with the YaRN block its model card adds
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (its RoPE runs on the qk_rope_head_dim = 64 features)
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# DeepSeek-V3 has mscale == mscale_all_dim, so its attention factor is exactly 1; this variant
# (DeepSeek-V2-Lite-like: mscale 1.0, mscale_all_dim 0.5) makes the ratio of the two count.
DEEPSEEK_V3_MSCALE_RATIO = {
    **DEEPSEEK_V3,
    "rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale": 1.0, "mscale_all_dim": 0.5},
}

GPT_OSS_20B = {  # openai/gpt-oss-20b: YaRN without truncating the ramp's ends
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 201088,
}

# The 48 + 48 LongRoPE factors of the first 128k Phi-3 release (published the same for
# Phi-3-vision-128k-instruct, which mlx-vlm's tests copy); the later Phi-3-mini-128k-instruct
# update ships re-searched lists. Either way they are real factors of the right length (one per
# pair of the 96-feature heads).
# fmt: off
PHI_3_LONG_FACTOR = [
    1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547,
    1.2299998998641968, 1.2299998998641968, 1.2999999523162842, 1.4499999284744263,
    1.5999999046325684, 1.6499998569488525, 1.8999998569488525, 2.859999895095825,
    3.68999981880188, 5.419999599456787, 5.489999771118164, 5.489999771118164,
    9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
    15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055,
    30.009998321533203, 32.35000228881836, 32.590003967285156, 35.56000518798828,
    39.95000457763672, 53.840003967285156, 56.20000457763672, 57.95000457763672,
    59.29000473022461, 59.77000427246094, 59.920005798339844, 61.190006256103516,
    61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
    63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922,
    64.760009765625, 64.80001068115234, 64.81001281738281, 64.81001281738281,
]
PHI_3_SHORT_FACTOR = [
    1.05, 1.05, 1.05, 1.1,
    1.1, 1.1, 1.2500000000000002, 1.2500000000000002,
    1.4000000000000004, 1.4500000000000004, 1.5500000000000005, 1.8500000000000008,
    1.9000000000000008, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.1000000000000005, 2.1000000000000005, 2.2, 2.3499999999999996,
    2.3499999999999996, 2.3499999999999996, 2.3499999999999996, 2.3999999999999995,
    2.3999999999999995, 2.6499999999999986, 2.6999999999999984, 2.8999999999999977,
    2.9499999999999975, 3.049999999999997, 3.049999999999997, 3.049999999999997,
]
# fmt: on

PHI_3_MINI_128K = {  # microsoft/Phi-3-mini-128k-instruct
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    # "longrope" is the updated spelling; the first release said "su" (transformers reads both).
    "rope_scaling": {
        "long_factor": PHI_3_LONG_FACTOR,
        "short_factor": PHI_3_SHORT_FACTOR,
        "type": "longrope",
    },
    "rope_theta": 10000.0,
    "sliding_window": 262144,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32064,
}

LLAMA_2_7B_32K = {  # togethercomputer/LLaMA-2-7B-32K: position interpolation by 8
    **LLAMA_2_7B,
    "max_position_embeddings": 32768,
    "rope_scaling": {"factor": 8.0, "type": "linear"},
}

LLAMA_2_7B_DYNAMIC = {  # Llama 2 7B with dynamic NTK scaling, as transformers' docs configure it
    **LLAMA_2_7B,
    "rope_scaling": {"factor": 2.0, "type": "dynamic"},
}

PHI_2 = {  # microsoft/phi-2: 40% of each 80-feature head rotates
    "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 50256,
    "embd_pdrop": 0.0,
    "eos_token_id": 50256,
    "hidden_act": "gelu_new",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 10240,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "phi",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4,
    "qk_layernorm": False,
    "resid_pdrop": 0.1,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "vocab_size": 51200,
}


@dataclass(frozen=True, eq=False)  # hashed by identity, for the functools.cache below
class Model:
    name: str
    config: dict[str, Any]
    family: str  # transformers.models.<family>.modeling_<family>
    config_class: str
    rotary_class: str
    # regime -> positions beyond arange(SEQ) at which to evaluate (max + 1 picks the regime)
    regimes: dict[str, tuple[int, ...]]
    # "half": apply_rotary_pos_emb; "interleave": DeepSeek's apply_rotary_pos_emb_interleave too
    applies: tuple[str, ...] = ("half",)
    # regimes whose frequencies differ from those within the original context (inv_freq)
    switched: tuple[str, ...] = ()


MODELS = [
    Model("llama-2-7b", LLAMA_2_7B, "llama", "LlamaConfig", "LlamaRotaryEmbedding",
          {"context": (1000, 2047, 4095)}),
    Model("llama-3.1-8b", LLAMA_3_1_8B, "llama", "LlamaConfig", "LlamaRotaryEmbedding",
          {"long": (8191, 32767, 100_000, 131_071)}),
    Model("qwen2.5-7b-yarn", QWEN2_5_7B_INSTRUCT_YARN, "qwen2", "Qwen2Config", "Qwen2RotaryEmbedding",
          {"long": (4095, 32767, 100_000, 131_071)}),
    Model("deepseek-v3", DEEPSEEK_V3, "deepseek_v3", "DeepseekV3Config", "DeepseekV3RotaryEmbedding",
          {"long": (4095, 100_000, 163_839)}, applies=("half", "interleave")),
    Model("deepseek-v3-mscale-ratio", DEEPSEEK_V3_MSCALE_RATIO, "deepseek_v3", "DeepseekV3Config",
          "DeepseekV3RotaryEmbedding", {"long": (4095, 100_000, 163_839)}, applies=("half", "interleave")),
    Model("gpt-oss-20b", GPT_OSS_20B, "gpt_oss", "GptOssConfig", "GptOssRotaryEmbedding",
          {"long": (4095, 100_000, 131_071)}),
    Model("phi-3-mini-128k", PHI_3_MINI_128K, "phi3", "Phi3Config", "Phi3RotaryEmbedding",
          {"short": (1000, 4095), "long": (4096, 100_000, 131_071)}, switched=("long",)),
    Model("llama-2-7b-32k-linear", LLAMA_2_7B_32K, "llama", "LlamaConfig", "LlamaRotaryEmbedding",
          {"long": (4095, 8191, 32767)}),
    Model("llama-2-7b-dynamic", LLAMA_2_7B_DYNAMIC, "llama", "LlamaConfig", "LlamaRotaryEmbedding",
          {"context": (1000, 4095), "beyond": (4096, 8191, 10_000)}, switched=("beyond",)),
    Model("phi-2", PHI_2, "phi", "PhiConfig", "PhiRotaryEmbedding", {"context": (1000, 2047)}),
]  # fmt: skip
CASES = [pytest.param(m, regime, id=f"{m.name}-{regime}") for m in MODELS for regime in m.regimes]
SEQ = 48
HEADS, KV_HEADS = 3, 1  # k has fewer heads than q, as in grouped-query attention


def _modeling(model: Model) -> Any:
    return importlib.import_module(f"transformers.models.{model.family}.modeling_{model.family}")


def _hf_config(model: Model) -> Any:
    return getattr(transformers, model.config_class)(**model.config)


@dataclass
class Run:
    """One model at one set of positions, through transformers and through anyrope."""

    rope: anyrope.RoPE
    positions: np.ndarray  # (1, seq) int64
    hf_inv_freq: np.ndarray  # transformers' float32 buffer after the forward, as float64
    hf_attention_scaling: float
    q: Any
    k: Any
    hf: dict[str, tuple[Any, Any]]  # apply function -> transformers' (q, k)


@functools.cache
def _run(model: Model, regime: str) -> Run:
    modeling = _modeling(model)
    config = _hf_config(model)
    rotary = getattr(modeling, model.rotary_class)(config=config)
    rope = anyrope.RoPE.from_hf_config(config, layout="half")  # as apply_rotary_pos_emb rotates
    positions = np.concatenate([np.arange(SEQ), np.asarray(model.regimes[regime])])[None, :]
    position_ids = torch.from_numpy(positions)
    gen = torch.Generator().manual_seed(0)
    seq = positions.shape[-1]
    q = torch.randn(1, HEADS, seq, rope.head_dim, generator=gen, dtype=torch.float32)
    k = torch.randn(1, KV_HEADS, seq, rope.head_dim, generator=gen, dtype=torch.float32)
    cos, sin = rotary(q, position_ids)  # the forward also updates DynamicNTK's / LongRoPE's buffer
    r = rope.rotary_dim
    hf = {}
    for apply in model.applies:
        fn = (
            modeling.apply_rotary_pos_emb_interleave
            if apply == "interleave"
            else modeling.apply_rotary_pos_emb
        )
        # Partial rotary (Phi-2): as PhiAttention, rotate the first rotary_dim features only.
        q_rot, k_rot = fn(q[..., :r], k[..., :r], cos, sin)
        hf[apply] = (torch.cat([q_rot, q[..., r:]], dim=-1), torch.cat([k_rot, k[..., r:]], dim=-1))
    return Run(
        rope=rope,
        positions=positions,
        hf_inv_freq=rotary.inv_freq.double().numpy(),
        hf_attention_scaling=float(rotary.attention_scaling),
        q=q,
        k=k,
        hf=hf,
    )


def _anyrope(run: Run, apply: str) -> tuple[np.ndarray, np.ndarray]:
    """anyrope's rotated (q, k) as float64 NumPy, in the layout ``apply`` produces."""
    position_ids = torch.from_numpy(run.positions)
    if apply == "half":
        q, k = run.rope(run.q, run.k, positions=position_ids)
        return q.double().numpy(), k.double().numpy()
    # DeepSeek's interleave apply reads pairs (2i, 2i + 1) and writes the rotated pairs back as
    # [all firsts, all seconds]: anyrope's interleaved result with its even, then odd, features.
    rope = anyrope.RoPE(
        run.rope.head_dim, base=run.rope.base, layout="interleaved", scaling=run.rope.scaling,
        max_position=run.rope.max_position,
    )  # fmt: skip
    q, k = rope(run.q, run.k, positions=position_ids)
    return tuple(
        np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        for x in (q.double().numpy(), k.double().numpy())
    )  # type: ignore[return-value]


def _float64(run: Run, apply: str) -> tuple[np.ndarray, np.ndarray]:
    """The rotation evaluated in float64 from anyrope's float64 frequencies (tests/oracle.py)."""
    rope = run.rope
    seq_len = int(run.positions.max()) + 1
    out = []
    for x in (run.q, run.k):
        y = oracle_rotate(
            x.double().numpy(), run.positions, layout="half" if apply == "half" else "interleaved",
            rotary_dim=rope.rotary_dim, frequencies=np.asarray(rope.inv_freq_at(seq_len)),
            scale=rope.attention_scaling,
        )  # fmt: skip
        if apply == "interleave":
            y = np.concatenate([y[..., 0::2], y[..., 1::2]], axis=-1)
        out.append(y)
    return out[0], out[1]


def _tolerance(run: Run) -> np.ndarray:
    """Allowed |anyrope - transformers| per position, shaped to broadcast over (1, heads, seq, dim).

    transformers forms each angle in float32, ``position * inv_freq`` from a float32 ``inv_freq``,
    so its angle at position m is off by up to about m * inv_freq * 2 * 2**-24 rad (inv_freq <= 1,
    one rounding in the buffer and one in the product), and its outputs by that times |x| and the
    attention factor. At position 131071 that is ~0.016 rad, far beyond float32 rounding: it is
    transformers' error, not anyrope's (test_anyrope_is_closer_to_float64 shows which side is off).
    Hence 1e-5 plus twice that bound, per position.
    """
    largest = float(np.max(np.abs(run.q.numpy()))) * max(1.0, run.hf_attention_scaling)
    per_position = (1e-5 + 4 * run.positions.astype(np.float64) * F32_ULP) * largest
    return per_position[:, None, :, None]


# --- The tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "regime"), CASES)
def test_inverse_frequencies(model: Model, regime: str) -> None:
    run = _run(model, regime)
    seq_len = int(run.positions.max()) + 1
    ours = np.asarray(run.rope.inv_freq_at(seq_len))
    assert ours.shape == run.hf_inv_freq.shape
    # The regime is the one meant: LongRoPE's long factors, DynamicNTK's larger base, or neither.
    assert (ours != np.asarray(run.rope.inv_freq)).any() == (regime in model.switched)
    rel = np.abs(ours - run.hf_inv_freq) / np.abs(ours)
    assert rel.max() <= 2e-6, (
        f"worst pair {rel.argmax()}: anyrope {ours[rel.argmax()]!r} vs {run.hf_inv_freq[rel.argmax()]!r}"
    )


@pytest.mark.parametrize(("model", "regime"), CASES)
def test_attention_factor(model: Model, regime: str) -> None:
    run = _run(model, regime)
    assert run.rope.attention_scaling == pytest.approx(run.hf_attention_scaling, rel=1e-6)


@pytest.mark.parametrize(("model", "regime"), CASES)
def test_rotated_q_k(model: Model, regime: str) -> None:
    run = _run(model, regime)
    tol = _tolerance(run)
    for apply, (hf_q, hf_k) in run.hf.items():
        ours_q, ours_k = _anyrope(run, apply)
        assert ours_q.shape == tuple(hf_q.shape)
        assert ours_k.shape == tuple(hf_k.shape)
        for name, mine, theirs in (("q", ours_q, hf_q), ("k", ours_k, hf_k)):
            excess = np.abs(mine - theirs.double().numpy()) / tol
            worst = np.unravel_index(excess.argmax(), excess.shape)
            assert excess.max() <= 1, f"{name} ({apply}) at {worst}, position {run.positions[0, worst[2]]}"


@pytest.mark.parametrize(("model", "regime"), CASES)
def test_anyrope_is_closer_to_float64(model: Model, regime: str) -> None:
    """anyrope forms angles in float64 and rounds only cos, sin and the result to float32."""
    run = _run(model, regime)
    largest = float(np.max(np.abs(run.q.numpy())))
    for apply, hf_out in run.hf.items():
        ours = _anyrope(run, apply)
        exact = _float64(run, apply)
        for name, mine, theirs, ref in zip("qk", ours, hf_out, exact, strict=True):
            err_ours = float(np.max(np.abs(mine - ref)))
            err_hf = float(np.max(np.abs(theirs.double().numpy() - ref)))
            # A few float32 roundings of values up to |x| * attention factor, at any position.
            assert err_ours <= 8 * F32_ULP * largest * max(1.0, run.rope.attention_scaling), (name, apply)
            assert err_ours < err_hf, (name, apply, err_ours, err_hf)


# A raw DeepSeek config.json has no head_dim: its RoPE width is qk_rope_head_dim (64), which
# transformers' DeepseekV3Config copies into head_dim, while anyrope's parse_hf_config falls back
# to hidden_size // num_attention_heads = 7168 // 128 = 56.
DICT_CASES = [pytest.param(m, id=m.name) for m in MODELS]


@pytest.mark.parametrize("model", DICT_CASES)
def test_config_json_dict_reads_like_config_object(model: Model) -> None:
    """``from_hf_config`` on the raw config.json dict agrees with it on the transformers object."""
    from_dict = anyrope.RoPE.from_hf_config(model.config)
    from_object = anyrope.RoPE.from_hf_config(_hf_config(model))
    assert repr(from_dict) == repr(from_object)
    assert from_dict.inv_freq == from_object.inv_freq
    assert from_dict.attention_scaling == from_object.attention_scaling
