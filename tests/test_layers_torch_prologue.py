"""anyrope.layers.torch.AttentionPrologue: anyrope.prologue as a torch module holding the QK-norm's
weights: the same results as the function with those weights, its state (saved, cast, shared
with a model's own norm modules), bad arguments named, torch.compile and gradients.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

import anyrope

torch = pytest.importorskip("torch")
from anyrope.layers.torch import AttentionPrologue  # after the skip: it imports torch

from harness import assert_prologue_same, prologue_exact

HEAD_DIM, HEADS, KV_HEADS, SEQ = 16, 4, 2, 5
RNG = np.random.default_rng(11)


def _tensor(*shape: int, dtype: Any = None) -> Any:
    return torch.from_numpy(RNG.standard_normal(shape).astype(np.float32)).to(dtype or torch.float32)


def _qkv(dtype: Any = None) -> tuple[Any, Any, Any]:
    return (_tensor(2, HEADS, SEQ, HEAD_DIM, dtype=dtype), _tensor(2, KV_HEADS, SEQ, HEAD_DIM, dtype=dtype),
            _tensor(2, KV_HEADS, SEQ, HEAD_DIM, dtype=dtype))  # fmt: skip


def _cache(dtype: Any = torch.float32) -> anyrope.KVCache:
    return anyrope.KVCache(torch.full((2, KV_HEADS, 32, HEAD_DIM), 7.0, dtype=dtype),
                           torch.full((2, KV_HEADS, 32, HEAD_DIM), 7.0, dtype=dtype))  # fmt: skip


def _randomised(layer: Any) -> Any:
    with torch.no_grad():
        for weight in layer.parameters():
            weight.copy_(1 + 0.2 * _tensor(*weight.shape))
    return layer


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_equals_the_prologue_with_its_weights(grad: bool) -> None:
    """Bit for bit anyrope.prologue with QKNorm(q_weight, k_weight): with gradients recorded (the
    steps apart) and without (the fused pass, where numba is installed); the cache written alike."""
    layer = _randomised(AttentionPrologue(HEAD_DIM, base=500.0, eps=1e-5, rounding="after_weight"))
    q, k, v = _qkv()
    mine, theirs = _cache(), _cache()
    with torch.set_grad_enabled(grad):
        got = layer(q, k, v, offset=3, cache=mine)
        norm = anyrope.QKNorm(layer.q_weight, layer.k_weight, eps=1e-5, rounding="after_weight")
        want = anyrope.prologue(q, k, v, rope=layer.rope, norm=norm, offset=3, cache=theirs)
    assert torch.equal(got.q, want.q)
    assert torch.equal(got.k, want.k)
    assert got.v is v
    assert got.cache is mine
    assert torch.equal(mine.k, theirs.k)
    assert torch.equal(mine.v, theirs.v)
    assert got.q.requires_grad == grad


def test_state_is_the_norms_weights_saved_and_cast() -> None:
    """state_dict holds the two weights; a layer loaded from it computes the same; ``.to(bfloat16)``
    casts them, and the call is then the bfloat16 prologue; Gemma's offset starts them at zero."""
    layer = _randomised(AttentionPrologue(HEAD_DIM, base=500.0))
    assert sorted(layer.state_dict()) == ["k_weight", "q_weight"]
    twin = AttentionPrologue(HEAD_DIM, base=500.0)
    twin.load_state_dict(layer.state_dict())
    q, k, v = _qkv()
    with torch.no_grad():
        assert torch.equal(twin(q, k).q, layer(q, k).q)
        for copied in (pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)):
            assert torch.equal(copied(q, k).k, layer(q, k).k)
        layer.to(torch.bfloat16)
        assert layer.q_weight.dtype == torch.bfloat16
        q, k, v = _qkv(torch.bfloat16)
        got = layer(q, k, v, offset=2, cache=_cache(torch.bfloat16))
        norm = anyrope.QKNorm(layer.q_weight, layer.k_weight)
        want = anyrope.prologue(q, k, v, rope=layer.rope, norm=norm, offset=2)
        assert got.q.dtype == torch.bfloat16
        assert torch.equal(got.q, want.q)
        assert torch.equal(got.k, want.k)
    gemma = AttentionPrologue(HEAD_DIM, norm_offset=1.0, rounding="after_weight")
    assert not gemma.q_weight.any()
    assert not gemma.k_weight.any()
    olmo = AttentionPrologue(
        HEAD_DIM, across_heads=True, heads=HEADS, kv_heads=KV_HEADS, rounding="after_weight"
    )
    assert olmo.q_weight.shape == (HEADS * HEAD_DIM,)
    assert olmo.k_weight.shape == (KV_HEADS * HEAD_DIM,)
    assert "across_heads=True" in repr(olmo)


def test_without_norm_it_rotates_and_writes() -> None:
    layer = AttentionPrologue(anyrope.RoPE(HEAD_DIM, layout="interleaved"), qk_norm=False)
    assert layer.state_dict() == {}
    assert layer.norm is None
    assert repr(layer) == f"AttentionPrologue({layer.rope!r}, qk_norm=False)"
    q, k, v = _qkv()
    cache = _cache()
    got = layer(q, k, v, offset=4, cache=cache, seq_axis=-2)
    want_q, want_k = layer.rope(q, k, offset=4)
    assert torch.equal(got.q, want_q)
    assert torch.equal(got.k, want_k)
    assert torch.equal(cache.k[:, :, 4 : 4 + SEQ], want_k)
    assert (cache.k[:, :, 4 + SEQ :] == 7.0).all()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"across_heads": True}, "pass heads= and kv_heads= \\(positive ints\\), not heads=None"),
        ({"across_heads": True, "heads": 4, "kv_heads": 0}, "not kv_heads=0"),
        ({"rounding": "after"}, "rounding='after' must be one of 'before_weight', 'after_weight'"),
        ({"eps": -1.0}, "eps"),
        ({"qk_norm": "yes"}, "qk_norm"),
    ],
)
def test_bad_arguments_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        AttentionPrologue(HEAD_DIM, **options)


def test_from_modules_holds_the_models_weights() -> None:
    """Made from a model's q_norm and k_norm (torch.nn.RMSNorm here), the layer holds their
    parameters themselves and computes what they and the rotation compute, bit for bit."""
    q_norm, k_norm = torch.nn.RMSNorm(HEAD_DIM, eps=1e-6), torch.nn.RMSNorm(HEAD_DIM, eps=1e-6)
    _randomised(q_norm), _randomised(k_norm)
    layer = AttentionPrologue.from_modules(HEAD_DIM, q_norm, k_norm, base=500.0)
    assert layer.q_weight is q_norm.weight
    assert layer.k_weight is k_norm.weight
    q, k, _ = _qkv()
    with torch.no_grad():
        got = layer(q, k)
        want = layer.rope(q_norm(q), k_norm(k))
    exact = prologue_exact("torch", q.device.type)
    assert_prologue_same(got.q.numpy(), want[0].numpy(), "float32", exact=exact)
    assert_prologue_same(got.k.numpy(), want[1].numpy(), "float32", exact=exact)


def test_compiled_equals_eager_and_trains() -> None:
    """torch.compile(fullgraph=True) of the layer gives the eager result, and the norm's weights
    get the gradients of the steps apart (norm, then rope) computed by autograd."""
    torch._dynamo.reset()
    layer = _randomised(AttentionPrologue(HEAD_DIM, base=500.0))
    compiled = torch.compile(layer, fullgraph=True)
    q, k, _ = _qkv()
    eager = layer(q, k, offset=9)
    got = compiled(q, k, offset=9)
    torch.testing.assert_close(got.q, eager.q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.k, eager.k, rtol=1e-6, atol=1e-6)
    (got.q.square().sum() + got.k.sum()).backward()
    twin = copy.deepcopy(layer)
    twin.zero_grad()
    norm = anyrope.QKNorm(twin.q_weight, twin.k_weight)
    rotated_q, rotated_k = layer.rope(norm.q(q), norm.k(k), offset=9)
    (rotated_q.square().sum() + rotated_k.sum()).backward()
    for mine, steps in ((layer.q_weight, twin.q_weight), (layer.k_weight, twin.k_weight)):
        assert mine.grad is not None
        assert float(mine.grad.abs().max()) > 0
        torch.testing.assert_close(mine.grad, steps.grad, rtol=1e-5, atol=1e-5)
