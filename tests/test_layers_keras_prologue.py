"""anyrope.layers.keras.AttentionPrologue (Keras 3, this session's backend: jax or torch):
anyrope.prologue as a layer holding the QK-norm's weights: the function's results with those
weights, the cache written (in place on torch, handed back on JAX), its weights and config
round trip, the compute dtype of a policy, and bad arguments named."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax" if importlib.util.find_spec("jax") else "torch")
keras = pytest.importorskip("keras")

import anyrope
from anyrope.layers.keras import AttentionPrologue

import layer_checks

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)
HEAD_DIM, HEADS, KV_HEADS, SEQ = 16, 4, 2, 5
ops = keras.ops


def _x(shape: tuple[int, ...], seed: int = 0) -> Any:
    return ops.convert_to_tensor(layer_checks.sample(shape, seed))


def _np(x: Any) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _cache() -> anyrope.KVCache:
    full = np.full((2, KV_HEADS, 32, HEAD_DIM), 7.0, np.float32)
    return anyrope.KVCache(ops.convert_to_tensor(full), ops.convert_to_tensor(full))


def test_equals_the_prologue_with_its_weights() -> None:
    layer = AttentionPrologue(HEAD_DIM, base=500.0, eps=1e-5, rounding="after_weight")
    layer.q_weight.assign(1 + 0.2 * _x((HEAD_DIM,), 7))
    layer.k_weight.assign(1 + 0.2 * _x((HEAD_DIM,), 8))
    q, k, v = (
        _x((2, HEADS, SEQ, HEAD_DIM)),
        _x((2, KV_HEADS, SEQ, HEAD_DIM), 1),
        _x((2, KV_HEADS, SEQ, HEAD_DIM), 2),
    )
    got = layer(q, k, v, offset=3, cache=_cache())
    norm = anyrope.QKNorm(layer.q_weight.value, layer.k_weight.value, eps=1e-5, rounding="after_weight")
    want = anyrope.prologue(q, k, v, rope=layer.rope, norm=norm, offset=3, cache=_cache())
    for a, b in ((got.q, want.q), (got.k, want.k), (got.cache.k, want.cache.k), (got.cache.v, want.cache.v)):
        assert np.array_equal(_np(a), _np(b))
    assert (_np(got.cache.k)[:, :, 3 + SEQ :] == 7.0).all()


def test_weights_config_and_policy() -> None:
    layer = AttentionPrologue(HEAD_DIM, base=500.0, norm_offset=1.0, rounding="after_weight", name="pro")
    assert sorted(w.name for w in layer.weights) == ["k_weight", "q_weight"]
    assert not _np(layer.q_weight.value).any()  # Gemma's 1 + w starts at w = 0
    twin = AttentionPrologue.from_config(layer.get_config())
    assert twin.get_config() == layer.get_config()
    assert repr(twin.rope) == repr(layer.rope)
    plain = AttentionPrologue(HEAD_DIM, qk_norm=False)
    assert plain.weights == []
    assert plain.norm is None
    mixed = AttentionPrologue(HEAD_DIM, dtype="mixed_bfloat16")
    assert mixed.q_weight.dtype == "float32"
    q, k = _x((2, HEADS, SEQ, HEAD_DIM)), _x((2, KV_HEADS, SEQ, HEAD_DIM), 1)
    out = mixed(ops.cast(q, "bfloat16"), ops.cast(k, "bfloat16"), offset=2)
    assert "bfloat16" in str(out.q.dtype)
    with pytest.raises(ValueError, match="pass heads= and kv_heads="):
        AttentionPrologue(HEAD_DIM, across_heads=True)
