"""The prologue in an mlx-lm model: a tiny Qwen3 (mlx_lm.models.qwen3, random weights) whose
attention runs through ``anyrope.prologue`` (its q_norm and k_norm's weights and eps in a
``QKNorm``, the RoPE of its ModelArgs, a preallocated ``KVCache``) decodes the same greedy tokens
as the stock model with mlx-lm's own KV cache, its logits within the dtype's tolerance (MLX's
fast ops form the angles in float32 and round the norm in their own order)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx_lm.models import qwen3
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import make_prompt_cache

import anyrope

PROMPT = [5, 17, 3, 88, 41, 2, 60]
NEW_TOKENS, MAX_ROWS = 10, 32
# float32: the angles' rounding (~1e-6 relative) through two layers; bfloat16: a rounding of q
# or k (2**-8 relative) in a few places, as the transformers proofs (test_prologue_in_model.py).
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}


def _model(dtype: str) -> Any:
    args = qwen3.ModelArgs(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        rms_norm_eps=1e-6, vocab_size=97, num_key_value_heads=2, max_position_embeddings=256, head_dim=16,
        tie_word_embeddings=False, rope_theta=1_000_000.0,
    )  # fmt: skip
    mx.random.seed(3)
    model = qwen3.Model(args)
    for layer in model.layers:  # q and k scaled up, norms not all ones: positions decide the tokens
        attn = layer.self_attn
        attn.q_proj.weight = 4 * attn.q_proj.weight
        attn.k_proj.weight = 4 * attn.k_proj.weight
        attn.q_norm.weight = 1 + 0.3 * mx.random.normal(attn.q_norm.weight.shape)
        attn.k_norm.weight = 1 + 0.3 * mx.random.normal(attn.k_norm.weight.shape)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


def _attention(self: Any, x: Any, mask: Any = None, cache: Any = None) -> Any:
    """Qwen3's attention with its norm, rotation and cache write one prologue call (tokens at
    rows ``self.position`` on; mlx-lm's cache is not used)."""
    batch, seq, _ = x.shape
    q = self.q_proj(x).reshape(batch, seq, self.n_heads, -1)
    k = self.k_proj(x).reshape(batch, seq, self.n_kv_heads, -1)
    v = self.v_proj(x).reshape(batch, seq, self.n_kv_heads, -1)
    out = anyrope.prologue(
        q, k, v, rope=self.anyrope_rope, norm=self.anyrope_norm, offset=self.position, seq_axis=-3,
        cache=self.anyrope_cache,
    )  # fmt: skip
    self.position += seq
    keys, values = (c[:, : self.position].transpose(0, 2, 1, 3) for c in (out.cache.k, out.cache.v))
    attended = scaled_dot_product_attention(
        out.q.transpose(0, 2, 1, 3), keys, values, cache=None, scale=self.scale, mask=mask
    )
    return self.o_proj(attended.transpose(0, 2, 1, 3).reshape(batch, seq, -1))


class _Prologued(qwen3.Attention):  # type: ignore[misc]
    __call__ = _attention


def _through_prologue(model: Any, dtype: str) -> Any:
    for layer in model.layers:
        attn = layer.self_attn
        head_dim = attn.q_norm.weight.shape[0]
        attn.anyrope_rope = anyrope.RoPE(head_dim, base=model.args.rope_theta)
        attn.anyrope_norm = anyrope.QKNorm(attn.q_norm.weight, attn.k_norm.weight, eps=attn.q_norm.eps)
        shape = (1, MAX_ROWS, attn.n_kv_heads, head_dim)
        attn.anyrope_cache = anyrope.KVCache(
            mx.zeros(shape, dtype=getattr(mx, dtype)),
            mx.zeros(shape, dtype=getattr(mx, dtype)),
            layout="bshd",
        )
        attn.position = 0
        attn.__class__ = _Prologued  # Python finds __call__ on the class
    return model


def _greedy(model: Any, cache: Any) -> tuple[list[int], list[np.ndarray]]:
    logits = model(mx.array([PROMPT]), cache=cache)[:, -1]
    tokens, seen = [], []
    for _ in range(NEW_TOKENS):
        tokens.append(int(mx.argmax(logits, axis=-1).item()))
        seen.append(np.array(logits.astype(mx.float32)))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[:, -1]
    return tokens, seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_qwen3_decodes_as_stock_through_the_prologue(dtype: str) -> None:
    stock = _model(dtype)
    stock_tokens, stock_logits = _greedy(stock, make_prompt_cache(stock))
    ours = _through_prologue(_model(dtype), dtype)
    our_tokens, our_logits = _greedy(ours, None)
    assert our_tokens == stock_tokens
    assert len(set(stock_tokens)) >= 3  # the positions decide a walk over the vocabulary
    for a, b in zip(our_logits, stock_logits, strict=True):
        assert np.max(np.abs(a - b)) <= TOLERANCE[dtype] * np.max(np.abs(b)), np.max(np.abs(a - b))
