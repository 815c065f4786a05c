"""The prologue in a model: tiny Qwen3, Gemma 3 and OLMo 2 (transformers, random weights) whose attention
runs through ``anyrope.prologue`` (its q_norm and k_norm read by ``QKNorm.from_modules``, its
RoPE by ``RoPE.from_hf_config``, a preallocated ``KVCache``) decode the same greedy tokens as the
stock model, their logits within the dtype's tolerance (anyrope's angles are exact, the model's
are formed in float32). How a model author calls it: ``_attention`` below."""

from __future__ import annotations

import types
from typing import Any

import pytest

import anyrope

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Olmo2Config,
    Olmo2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

PROMPT, NEW_TOKENS, MAX_ROWS = 6, 8, 32
# The logits' tolerance: float32 differs by the angles' rounding (~1e-6 relative) through the layers;
# bfloat16 by a rounding of q or k (2**-8 relative) in a few places.
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}


def _model(family: str, dtype: str) -> Any:
    torch.manual_seed(0)
    shared = {
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "attn_implementation": "sdpa",
    }  # fmt: skip
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **shared))
    elif family == "gemma3":  # its sliding window longer than the test: every layer attends to all
        config = Gemma3TextConfig(head_dim=16, sliding_window=64, query_pre_attn_scalar=16, **shared)
        model = Gemma3ForCausalLM(config)
    else:
        model = Olmo2ForCausalLM(Olmo2Config(**shared))
    return model.to(getattr(torch, dtype)).eval()


def _attention(self: Any, hidden_states: Any, position_embeddings: Any, attention_mask: Any,
               cache: Any = None, **kwargs: Any) -> tuple[Any, None]:  # fmt: skip
    """The attention of Qwen3 and OLMo 2, its norm, rotation and cache write one prologue call."""
    batch, seq, _ = hidden_states.shape
    shape = (batch, seq, -1, self.head_dim)  # the projections' views: (batch, seq, heads, head_dim)
    q, k, v = (proj(hidden_states).view(shape) for proj in (self.q_proj, self.k_proj, self.v_proj))
    positions = kwargs["position_ids"]
    out = anyrope.prologue(
        q, k, v, rope=self.anyrope_rope, norm=self.anyrope_norm, positions=positions, seq_axis=-3,
        cache=self.anyrope_cache,
    )  # fmt: skip
    end = int(positions.max()) + 1
    keys, values = (c[:, :end].transpose(1, 2) for c in (out.cache.k, out.cache.v))
    causal = torch.arange(end)[None, :] <= positions[0][:, None]  # (seq, rows): earlier tokens only
    attended = torch.nn.functional.scaled_dot_product_attention(
        out.q.transpose(1, 2), keys, values, attn_mask=causal, scale=self.scaling, enable_gqa=True
    )
    return self.o_proj(attended.transpose(1, 2).reshape(batch, seq, -1)), None


def _patch(model: Any) -> None:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for index, layer in enumerate(model.model.layers):
        attention = layer.self_attn
        attention.anyrope_rope = anyrope.RoPE.from_hf_config(config, layer=index)  # Gemma 3's differ by layer
        attention.anyrope_norm = anyrope.QKNorm.from_modules(
            attention.q_norm, attention.k_norm, head_dim=head_dim
        )
        dtype = attention.q_proj.weight.dtype
        rows = torch.zeros(1, MAX_ROWS, config.num_key_value_heads, head_dim, dtype=dtype)
        attention.anyrope_cache = anyrope.KVCache(rows, rows.clone(), layout="bshd")
        attention.forward = types.MethodType(_attention, attention)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "olmo2"])
def test_greedy_decode_through_the_prologue(family: str, dtype: str) -> None:
    model = _model(family, dtype)
    prompt = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stock = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                               return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    _patch(model)
    tokens, logits = prompt, []
    with torch.no_grad():
        step = prompt
        for _ in range(NEW_TOKENS):
            start = tokens.shape[1] - step.shape[1]
            positions = torch.arange(start, tokens.shape[1])[None, :]
            last = model(input_ids=step, position_ids=positions, use_cache=False).logits[:, -1]
            logits.append(last)
            step = last.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, step], dim=1)
    assert torch.equal(tokens, stock.sequences)
    written = PROMPT + NEW_TOKENS - 1  # the last token is sampled, never attended
    for layer in model.model.layers:  # the prologue ran: each layer's cache holds every token's row
        rows = layer.self_attn.anyrope_cache.k[0].abs().sum((-2, -1))
        assert bool((rows[:written] > 0).all())
        assert not rows[written:].any()
    for got, want in zip(logits, stock.logits, strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=TOLERANCE[dtype])
