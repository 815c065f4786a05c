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
