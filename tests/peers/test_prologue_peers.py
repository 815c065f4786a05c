"""anyrope.QKNorm against the models' own q_norm and k_norm modules in transformers, bit for bit:
Qwen3's (Llama's RMSNorm: rounded to the input's dtype, then times the weight), Gemma 3's
(times ``1 + w`` in float32, then rounded) and OLMo 2's (one norm over the whole projection,
times the weight in float32, then rounded), in float32, bfloat16 and float16 on torch's CPU.
Then a prologue against the models' own order of steps: their norm, then
``apply_rotary_pos_emb`` on tables from their rotary embedding.
"""

from __future__ import annotations

import pytest

import anyrope

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
from transformers.models.qwen3 import modeling_qwen3

HEADS, SEQ, HEAD_DIM, EPS = 4, 7, 64, 1e-6
DTYPES = ("float32", "bfloat16", "float16")


def _module(family: str, dtype: torch.dtype) -> tuple[torch.nn.Module, anyrope.QKNorm]:
    """A family's norm module with random weights in ``dtype``, and the QKNorm that reads it."""
    size = HEADS * HEAD_DIM if family == "olmo2" else HEAD_DIM
    make = {"qwen3": modeling_qwen3.Qwen3RMSNorm, "gemma3": Gemma3RMSNorm, "olmo2": Olmo2RMSNorm}[family]
    module = make(size, eps=EPS).to(dtype)
    with torch.no_grad():
        module.weight.copy_(torch.randn(size, generator=torch.Generator().manual_seed(3)) * 0.3 + 0.5)
    weight = module.weight.detach()
    norm = anyrope.QKNorm(
        weight, weight, eps=EPS, offset=1.0 if family == "gemma3" else 0.0, across_heads=family == "olmo2",
        rounding="before_weight" if family == "qwen3" else "after_weight",
    )  # fmt: skip
    return module, norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "olmo2"])
def test_qk_norm_is_the_models_own(family: str, dtype: str) -> None:
    """On (batch, seq, heads, head_dim), as the models view their projections, and on the
    (batch, heads, seq, head_dim) they attend in: the same values as the module's, bit for bit."""
    torch_dtype = getattr(torch, dtype)
    module, norm = _module(family, torch_dtype)
    x = (torch.randn(2, SEQ, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(5)) * 4).to(torch_dtype)
    with torch.no_grad():
        if family == "olmo2":  # the whole projection, (batch, seq, heads * head_dim)
            want = module(x.reshape(2, SEQ, HEADS * HEAD_DIM)).reshape(x.shape)
        else:
            want = module(x)
    torch.testing.assert_close(norm.q(x, seq_axis=-3), want, rtol=0, atol=0)
    torch.testing.assert_close(norm.k(x.transpose(1, 2), seq_axis=-2), want.transpose(1, 2), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prologue_is_qwen3s_order_of_steps(dtype: str) -> None:
    """Qwen3's attention prologue: q_norm and k_norm on the projections' views, then
    apply_rotary_pos_emb on its rotary embedding's tables, against anyrope.prologue on the same
    arrays: equal within the tables' roundings (transformers forms its angles in float32; anyrope
    exactly, then rounds once), bit for bit where the norm alone is compared (above)."""
    torch_dtype = getattr(torch, dtype)
    module, norm = _module("qwen3", torch_dtype)
    config = modeling_qwen3.Qwen3Config(
        head_dim=HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=HEADS
    )
    rotary = modeling_qwen3.Qwen3RotaryEmbedding(config)
    positions = torch.arange(SEQ)[None] + 1000
    x = torch.randn(1, SEQ, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(9)).to(torch_dtype)
    with torch.no_grad():
        q = module(x).transpose(1, 2)
        cos, sin = rotary(q, positions)
        want, _ = modeling_qwen3.apply_rotary_pos_emb(q, q, cos, sin)
    rope = anyrope.RoPE(HEAD_DIM, base=config.rope_parameters["rope_theta"])
    got = anyrope.prologue(x.transpose(1, 2), rope=rope, norm=norm, positions=positions).q
    assert got.dtype == want.dtype
    tolerance = {"float32": 2e-3, "bfloat16": 4e-2}[dtype]  # float32 angles at position ~1000
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tolerance)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "olmo2"])
def test_qk_norm_reads_the_models_modules(family: str, dtype: str) -> None:
    """QKNorm.from_modules finds each family's form by running its modules, and then computes
    what they compute, bit for bit."""
    torch_dtype = getattr(torch, dtype)
    module, built = _module(family, torch_dtype)
    norm = anyrope.QKNorm.from_modules(module, module, head_dim=HEAD_DIM)
    assert (norm.eps, norm.across_heads) == (EPS, family == "olmo2")
    if dtype == "bfloat16":  # in float32 both roundings are one form
        assert (norm.rounding, norm.offset) == (built.rounding, built.offset)
    x = (torch.randn(3, SEQ, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(8)) * 2).to(torch_dtype)
    with torch.no_grad():
        want = module(x.reshape(3, SEQ, -1)).reshape(x.shape) if family == "olmo2" else module(x)
    torch.testing.assert_close(norm.q(x, seq_axis=-3), want, rtol=0, atol=0)


def test_qk_norm_refuses_modules_it_cannot_read() -> None:
    qwen, _ = _module("qwen3", torch.bfloat16)
    gemma, _ = _module("gemma3", torch.bfloat16)
    layer_norm = torch.nn.LayerNorm(HEAD_DIM)
    with pytest.raises(ValueError, match=r"q_norm \(LayerNorm\) computes none of the RMS norms"):
        anyrope.QKNorm.from_modules(layer_norm, layer_norm, head_dim=HEAD_DIM)
    with pytest.raises(TypeError, match=r"k_norm \(Linear\) is not an RMS norm module"):
        anyrope.QKNorm.from_modules(qwen, torch.nn.Linear(2, 2), head_dim=HEAD_DIM)
    with pytest.raises(ValueError, match="q_norm and k_norm compute different norms"):
        anyrope.QKNorm.from_modules(qwen, gemma, head_dim=HEAD_DIM)
    with pytest.raises(
        ValueError, match=r"q_norm \(Qwen3RMSNorm\) has a weight of shape \(64,\), not of head_dim=48"
    ):
        anyrope.QKNorm.from_modules(qwen, qwen, head_dim=48)
