"""anyrope.layers.mlx.RotaryEmbedding dropped into an mlx-lm Llama in place of its nn.RoPE: the
same greedy tokens and logits with mlx-lm's KV cache (int offsets) and its BatchKVCache (one
offset per row, negative for left-padded rows), as mlx-lm's attention calls it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx import nn
from mlx_lm.models import llama
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from anyrope.layers.mlx import RotaryEmbedding

# mx.fast.rope forms angles in float32 (a few ulps off at these short positions, relative to |q|
# and |k|), carried through two layers: 1e-4 of the logits' range, as tests/peers/test_mlx_lm.py.
LOGIT_RTOL = 1e-4


def _tiny_llama(traditional: bool) -> Any:
    """Two layers, random weights, q and k scaled up so that positions decide the tokens."""
    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97, rope_theta=500000.0,
        rope_traditional=traditional, tie_word_embeddings=False,
    )  # fmt: skip
    mx.random.seed(1)
    model = llama.Model(args)
    for layer in model.layers:
        layer.self_attn.q_proj.weight = 4 * layer.self_attn.q_proj.weight
        layer.self_attn.k_proj.weight = 4 * layer.self_attn.k_proj.weight
    mx.eval(model.parameters())
    return model


def _twins(traditional: bool) -> tuple[Any, Any]:
    stock, ours = _tiny_llama(traditional), _tiny_llama(traditional)
    for layer in ours.layers:
        stock_rope = layer.self_attn.rope
        assert type(stock_rope) is nn.RoPE
        layer.self_attn.rope = RotaryEmbedding(
            stock_rope.dims, base=stock_rope.base, layout="interleaved" if traditional else "half"
        )
    return stock, ours


def _assert_logits(ours: Any, theirs: Any) -> None:
    a, b = np.array(ours), np.array(theirs)
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= LOGIT_RTOL * np.max(np.abs(b)), np.max(np.abs(a - b))


def _greedy(model: Any, prompt: list[int], steps: int) -> tuple[list[int], list[Any]]:
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    tokens, seen = [], []
    for _ in range(steps):
        tokens.append(int(mx.argmax(logits, axis=-1).item()))
        seen.append(logits)
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[:, -1]
    return tokens, seen


@pytest.mark.parametrize("traditional", [False, True])
def test_greedy_generation_as_with_nn_rope(traditional: bool) -> None:
    stock, ours = _twins(traditional)
    prompt = [5, 17, 3, 88, 41, 2, 60]
    (our_tokens, our_logits), (their_tokens, their_logits) = (
        _greedy(ours, prompt, 12),
        _greedy(stock, prompt, 12),
    )
    assert our_tokens == their_tokens
    assert len(set(their_tokens)) >= 4  # the rotation decides a walk over the vocabulary
    for a, b in zip(our_logits, their_logits, strict=True):
        _assert_logits(a, b)


def test_batched_generation_with_left_padding() -> None:
    stock, ours = _twins(False)
    padding = [0, 4]
    batch = mx.array([[5, 17, 3, 88, 41, 2, 60], [0, 0, 0, 0, 9, 31, 7]])
    results = []
    for model in (ours, stock):
        cache = [BatchKVCache(padding) for _ in model.layers]
        logits = model(batch, cache=cache)[:, -1]
        steps = [logits]
        for _ in range(4):
            logits = model(mx.argmax(logits, axis=-1)[:, None], cache=cache)[:, -1]
            steps.append(logits)
        assert isinstance(cache[0].offset, mx.array)  # per-row offsets reached the layer
        results.append(steps)
    for a, b in zip(*results, strict=True):
        _assert_logits(a, b)
