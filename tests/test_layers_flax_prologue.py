"""anyrope.layers.flax.AttentionPrologue (Flax NNX): anyrope.prologue as a module holding the
QK-norm's weights as nnx.Param: the function's results with those weights, its state, bad
arguments named, nnx.jit with the cache handed back, and nnx.grad equal to the steps apart's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

import jax.numpy as jnp

import anyrope
from anyrope.layers.flax import AttentionPrologue

import layer_checks
import oracle

HEAD_DIM, HEADS, KV_HEADS, SEQ = 16, 4, 2, 5


def _x(shape: tuple[int, ...], seed: int = 0) -> Any:
    return jnp.asarray(layer_checks.sample(shape, seed), dtype=jnp.float32)


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32))


def _layer(**options: Any) -> Any:
    layer = AttentionPrologue(HEAD_DIM, base=500.0, **options)
    layer.q_weight[...] = 1 + 0.2 * _x(layer.q_weight[...].shape, 7)
    layer.k_weight[...] = 1 + 0.2 * _x(layer.k_weight[...].shape, 8)
    return layer


def _cache() -> anyrope.KVCache:
    shape = (2, KV_HEADS, 32, HEAD_DIM)
    return anyrope.KVCache(jnp.full(shape, 7.0, jnp.float32), jnp.full(shape, 7.0, jnp.float32))


def _qkv() -> tuple[Any, Any, Any]:
    return (
        _x((2, HEADS, SEQ, HEAD_DIM)),
        _x((2, KV_HEADS, SEQ, HEAD_DIM), 1),
        _x((2, KV_HEADS, SEQ, HEAD_DIM), 2),
    )


def test_equals_the_prologue_with_its_weights_eager_and_jitted() -> None:
    layer = _layer(eps=1e-5, rounding="after_weight")
    q, k, v = _qkv()
    got = layer(q, k, v, offset=3, cache=_cache())
    norm = anyrope.QKNorm(layer.q_weight[...], layer.k_weight[...], eps=1e-5, rounding="after_weight")
    want = anyrope.prologue(q, k, v, rope=layer.rope, norm=norm, offset=3, cache=_cache())
    for a, b in ((got.q, want.q), (got.k, want.k), (got.cache.k, want.cache.k), (got.cache.v, want.cache.v)):
        assert np.array_equal(_np(a), _np(b))
    assert (_np(got.cache.k)[:, :, 3 + SEQ :] == 7.0).all()

    @nnx.jit
    def step(layer: Any, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, offset: Any) -> Any:
        out = layer(q, k, v, offset=offset, cache=anyrope.KVCache(k_cache, v_cache))
        return out.q, out.cache.k

    cache = _cache()
    jitted_q, jitted_k = step(layer, q, k, v, cache.k, cache.v, 3)
    layer_checks.assert_near(_np(jitted_q), _np(want.q), oracle.TOLERANCE["float32"])
    layer_checks.assert_near(_np(jitted_k), _np(want.cache.k), oracle.TOLERANCE["float32"])


def test_state_holds_the_weights_and_bad_arguments_are_named() -> None:
    layer = AttentionPrologue(HEAD_DIM, param_dtype=jnp.bfloat16)
    state = nnx.state(layer, nnx.Param)
    assert sorted(str(key) for key in state) == ["k_weight", "q_weight"]
    assert layer.q_weight[...].dtype == jnp.bfloat16
    assert not _np(AttentionPrologue(HEAD_DIM, norm_offset=1.0).k_weight[...]).any()  # Gemma's 1 + w
    plain = AttentionPrologue(HEAD_DIM, qk_norm=False)
    assert plain.norm is None
    assert not nnx.state(plain, nnx.Param)
    with pytest.raises(ValueError, match="pass heads= and kv_heads="):
        AttentionPrologue(HEAD_DIM, across_heads=True)


def test_gradients_are_the_steps_aparts() -> None:
    layer = _layer()
    q, k, _ = _qkv()

    def loss(layer: Any) -> Any:
        out = layer(q, k, offset=9)
        return jnp.sum(out.q * out.q) + jnp.sum(out.k)

    def steps_apart(q_weight: Any, k_weight: Any) -> Any:
        norm = anyrope.QKNorm(q_weight, k_weight)
        rotated_q, rotated_k = layer.rope(norm.q(q), norm.k(k), offset=9)
        return jnp.sum(rotated_q * rotated_q) + jnp.sum(rotated_k)

    grads = nnx.grad(loss)(layer)
    want = jax.grad(steps_apart, argnums=(0, 1))(layer.q_weight[...], layer.k_weight[...])
    for name, expected in zip(("q_weight", "k_weight"), want, strict=True):
        got = grads[name][...]
        assert float(jnp.abs(got).max()) > 0
        layer_checks.assert_near(_np(got), _np(expected), oracle.TOLERANCE["float32"], name)
