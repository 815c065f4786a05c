"""anyrope.layers.mlx.AttentionPrologue: anyrope.prologue as an mlx.nn.Module holding the
QK-norm's weights: the function's results with those weights, its parameters (saved, cast),
bad arguments named, mx.compile and gradients."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from mlx import nn
from mlx.utils import tree_flatten

import anyrope
from anyrope.layers.mlx import AttentionPrologue

import layer_checks
import oracle

HEAD_DIM, HEADS, KV_HEADS, SEQ = 16, 4, 2, 5


def _x(shape: tuple[int, ...], seed: int = 0) -> Any:
    return mx.array(layer_checks.sample(shape, seed))


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.astype(mx.float32))


def _layer(**options: Any) -> Any:
    layer = AttentionPrologue(HEAD_DIM, base=500.0, **options)
    if layer.norm is not None:
        layer.q_weight = 1 + 0.2 * _x(layer.q_weight.shape, 7)
        layer.k_weight = 1 + 0.2 * _x(layer.k_weight.shape, 8)
    return layer


def _cache(dtype: Any = mx.float32) -> anyrope.KVCache:
    return anyrope.KVCache(mx.full((2, KV_HEADS, 32, HEAD_DIM), 7.0, dtype=dtype),
                           mx.full((2, KV_HEADS, 32, HEAD_DIM), 7.0, dtype=dtype))  # fmt: skip


def test_equals_the_prologue_with_its_weights() -> None:
    layer = _layer(eps=1e-5, rounding="after_weight")
    q, k, v = (
        _x((2, HEADS, SEQ, HEAD_DIM)),
        _x((2, KV_HEADS, SEQ, HEAD_DIM), 1),
        _x((2, KV_HEADS, SEQ, HEAD_DIM), 2),
    )
    mine, theirs = _cache(), _cache()
    got = layer(q, k, v, offset=3, cache=mine)
    norm = anyrope.QKNorm(layer.q_weight, layer.k_weight, eps=1e-5, rounding="after_weight")
    want = anyrope.prologue(q, k, v, rope=layer.rope, norm=norm, offset=3, cache=theirs)
    for a, b in ((got.q, want.q), (got.k, want.k), (mine.k, theirs.k), (mine.v, theirs.v)):
        assert np.array_equal(_np(a), _np(b))
    assert got.cache is mine
    assert (_np(mine.k)[:, :, 3 + SEQ :] == 7.0).all()


def test_parameters_saved_loaded_and_cast(tmp_path: Any) -> None:
    layer = _layer()
    assert sorted(name for name, _ in tree_flatten(layer.parameters())) == ["k_weight", "q_weight"]
    layer.save_weights(str(tmp_path / "w.safetensors"))
    twin = AttentionPrologue(HEAD_DIM, base=500.0)
    twin.load_weights(str(tmp_path / "w.safetensors"), strict=True)
    q, k = _x((2, HEADS, SEQ, HEAD_DIM)), _x((2, KV_HEADS, SEQ, HEAD_DIM), 1)
    assert np.array_equal(_np(twin(q, k).q), _np(layer(q, k).q))
    layer.set_dtype(mx.bfloat16)
    assert layer.q_weight.dtype == mx.bfloat16
    q, k = q.astype(mx.bfloat16), k.astype(mx.bfloat16)
    got = layer(q, k, offset=2)
    want = anyrope.prologue(
        q, k, rope=layer.rope, norm=anyrope.QKNorm(layer.q_weight, layer.k_weight), offset=2
    )
    assert got.q.dtype == mx.bfloat16
    assert np.array_equal(_np(got.q), _np(want.q))
    assert not _np(AttentionPrologue(HEAD_DIM, norm_offset=1.0).q_weight).any()  # Gemma's 1 + w
    plain = AttentionPrologue(HEAD_DIM, qk_norm=False)
    assert tree_flatten(plain.parameters()) == []
    assert plain.norm is None


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="pass heads= and kv_heads="):
        AttentionPrologue(HEAD_DIM, across_heads=True)
    with pytest.raises(ValueError, match="rounding='late' must be one of"):
        AttentionPrologue(HEAD_DIM, rounding="late")


def test_compiled_equals_eager_and_gradients_are_the_steps_apart() -> None:
    layer = _layer()
    q, k = _x((2, HEADS, SEQ, HEAD_DIM)), _x((2, KV_HEADS, SEQ, HEAD_DIM), 1)
    step = mx.compile(lambda q, k, offset: layer(q, k, offset=offset)[:2])
    got = step(q, k, mx.array(9))
    eager = layer(q, k, offset=9)
    for a, b in zip(got, eager[:2], strict=True):
        layer_checks.assert_near(_np(a), _np(b), oracle.TOLERANCE["float32"])

    def loss(model: Any, q: Any, k: Any) -> Any:
        out = model(q, k, offset=9)
        return mx.sum(out.q * out.q) + mx.sum(out.k)

    def steps_apart(weights: Any, q: Any, k: Any) -> Any:
        norm = anyrope.QKNorm(weights["q_weight"], weights["k_weight"])
        rotated_q, rotated_k = layer.rope(norm.q(q), norm.k(k), offset=9)
        return mx.sum(rotated_q * rotated_q) + mx.sum(rotated_k)

    _, grads = nn.value_and_grad(layer, loss)(layer, q, k)
    want = mx.grad(steps_apart)({"q_weight": layer.q_weight, "k_weight": layer.k_weight}, q, k)
    for name in ("q_weight", "k_weight"):
        assert float(mx.abs(grads[name]).max()) > 0
        layer_checks.assert_near(_np(grads[name]), _np(want[name]), oracle.TOLERANCE["float32"], name)
