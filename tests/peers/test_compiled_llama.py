"""A tiny transformers Llama with its rotary routed through anyrope, compiled as the stock model is.

The model's ``LlamaRotaryEmbedding`` is made to hand the position ids on, and the module-level
``apply_rotary_pos_emb`` to rotate with ``anyrope.RoPE.from_hf_config(config)`` at them: the
hand-made routing the integration issue will replace with an API. Under ``torch.compile`` the
routed model must not break its graph (the stock one does not either, but for DynamicNTK,
whose update transformers decides on the host), and give the same logits, with a per-row
position layout (a left-padded row) and under DynamicNTK on both sides of its original length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import anyrope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="4.56")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")


@contextlib.contextmanager
def routed_through(rope: anyrope.RoPE) -> Iterator[None]:
    """Llama's rotary, replaced for the duration: positions instead of cos/sin tables."""

    def positions_only(self: Any, x: Any, position_ids: Any) -> tuple[Any, Any]:
        return position_ids, position_ids

    def rotate(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> tuple[Any, Any]:
        return rope(q, k, positions=cos)  # cos carries the position ids here

    original = modeling_llama.LlamaRotaryEmbedding.forward, modeling_llama.apply_rotary_pos_emb
    modeling_llama.LlamaRotaryEmbedding.forward = positions_only
    modeling_llama.apply_rotary_pos_emb = rotate
    try:
        yield
    finally:
        modeling_llama.LlamaRotaryEmbedding.forward, modeling_llama.apply_rotary_pos_emb = original


def _model(rope_scaling: dict[str, Any] | None) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rope_theta=10000.0,
        rope_scaling=rope_scaling,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("rope_scaling", [None, {"rope_type": "dynamic", "factor": 2.0}])
@pytest.mark.parametrize("length", [12, 48])  # DynamicNTK: within and past 32
def test_routed_llama_compiles_without_graph_breaks(rope_scaling: dict[str, Any] | None, length: int) -> None:
    model = _model(rope_scaling)
    ids = torch.randint(0, 97, (2, length))
    positions = torch.arange(length).expand(2, length).clone()
    positions[1] -= 3  # a left-padded row: its tokens sit three places earlier
    with torch.no_grad():
        torch._dynamo.reset()
        stock = torch._dynamo.explain(model)(input_ids=ids, position_ids=positions)
        stock_logits = model(input_ids=ids, position_ids=positions).logits
        with routed_through(anyrope.RoPE.from_hf_config(model.config)):
            torch._dynamo.reset()
            routed = torch._dynamo.explain(model)(input_ids=ids, position_ids=positions)
            compiled = torch.compile(model, fullgraph=True)
            routed_logits = compiled(input_ids=ids, position_ids=positions).logits
    assert routed.graph_break_count == 0, routed.break_reasons
    # The stock model traces in one graph too, except that its DynamicNTK update branches on the
    # largest position id (a data-dependent branch: five breaks in transformers 5.23), which
    # anyrope makes on the device.
    assert stock.graph_break_count == 0 or rope_scaling is not None
    # transformers forms float32 angles (off by up to position * 6e-8 rad), anyrope exact ones:
    # logits of size ~1 agree to a few float32 ulps times the depth.
    torch.testing.assert_close(routed_logits, stock_logits, rtol=1e-4, atol=1e-4)
