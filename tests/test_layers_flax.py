"""anyrope.layers.flax.RotaryEmbedding (Flax NNX): rope(...)'s call, no state, exact in bfloat16
modules, under nnx.jit and jax.jit, in training, and rope(...)'s errors for bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import jax.numpy as jnp

import anyrope
from anyrope.layers.flax import RotaryEmbedding

import layer_checks
import oracle

HEAD = 16
FAR = layer_checks.FAR


def _x(shape: tuple[int, ...], seed: int = 0) -> Any:
    return jnp.asarray(layer_checks.sample(shape, seed))


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32))


class Attention(nnx.Module):  # type: ignore[misc]
    """A tiny attention block: projections, then the layer rotates q and k together."""

    def __init__(self, *, width: int = 32, heads: int = 2, dtype: Any = None, seed: int = 0) -> None:
        rngs = nnx.Rngs(seed)
        self.heads = heads
        self.q, self.k, self.v, self.o = (
            nnx.Linear(width, width, dtype=dtype, param_dtype=dtype or jnp.float32, rngs=rngs)
            for _ in range(4)
        )
        self.rope = RotaryEmbedding(width // heads, base=1000.0)

    def heads_of(self, x: Any) -> Any:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, -1).transpose(0, 2, 1, 3)

    def __call__(self, x: Any, offset: Any = 0) -> Any:
        q, k, v = self.heads_of(self.q(x)), self.heads_of(self.k(x)), self.heads_of(self.v(x))
        q, k = self.rope(q, k, offset=offset)
        scores = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), axis=-1)
        out = (scores @ v).transpose(0, 2, 1, 3)
        return self.o(out.reshape(*out.shape[:2], -1))


def test_every_construction_rotates_as_its_rope() -> None:
    config = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5, "model_type": "cohere"}
    rope = anyrope.RoPE.from_hf_config(config)
    q, k = _x((2, 4, 5, HEAD)), _x((2, 2, 5, HEAD), 1)
    positions = jnp.asarray([[4, 3, 2, 1, 0], [9, 9, 9, 9, 9]])
    layers = (RotaryEmbedding(rope), RotaryEmbedding(HEAD, base=5e5, layout="interleaved"))
    for layer in (*layers, RotaryEmbedding.from_hf_config(config)):
        assert repr(layer.rope) == repr(rope)
        for got, want in zip(
            layer(q, k, offset=jnp.asarray([3, -1])), rope(q, k, offset=jnp.asarray([3, -1])), strict=True
        ):
            assert np.array_equal(_np(got), _np(want))
        assert np.array_equal(_np(layer(q, positions=positions)), _np(rope(q, positions=positions)))
        wide = _x((2, 5, 4, HEAD))  # (batch, seq, heads, head_dim)
        assert np.array_equal(_np(layer(wide, seq_axis=-3)), _np(rope(wide, seq_axis=-3)))


def test_no_state_to_checkpoint() -> None:
    layer = RotaryEmbedding(HEAD)
    assert not jax.tree_util.tree_leaves(nnx.state(layer))
    model = Attention()
    params = nnx.state(model, nnx.Param)
    assert set(params.keys()) == {"q", "k", "v", "o"}
    assert len(jax.tree_util.tree_leaves(nnx.state(model))) == len(jax.tree_util.tree_leaves(params)) == 8
    graph, state = nnx.split(model)
    again = nnx.merge(graph, state)
    x = _x((2, 5, 32))
    assert np.array_equal(_np(again(x, offset=3)), _np(model(x, offset=3)))


def test_bfloat16_modules_rotate_exactly_far_out() -> None:
    """Inputs a bfloat16 nnx.Linear made, and the layer's own dtype=: the angles are exact, the
    result is the exact rotation of the bfloat16 input rounded once."""
    model = Attention(dtype=jnp.bfloat16)
    q = model.heads_of(model.q(_x((1, 4, 32))))
    assert q.dtype == jnp.bfloat16
    positions = np.arange(FAR, FAR + 4)
    got = model.rope(q, offset=FAR)
    assert got.dtype == jnp.bfloat16
    layer_checks.assert_rounded_once(_np(got), oracle.rotate(_np(q), positions, base=1000.0), "bfloat16")
    cast = RotaryEmbedding(HEAD, dtype=jnp.bfloat16)
    x = _x((1, 2, 4, HEAD))
    got = cast(x, offset=FAR)
    assert got.dtype == jnp.bfloat16
    exact = oracle.rotate(_np(x.astype(jnp.bfloat16)), positions)
    layer_checks.assert_rounded_once(_np(got), exact, "bfloat16")


def test_traces_under_nnx_jit_and_jax_jit() -> None:
    model, layer = Attention(), RotaryEmbedding(HEAD)
    x, q = _x((2, 5, 32)), _x((2, 2, 5, HEAD))
    step = nnx.jit(lambda model, x, offset: model(x, offset))
    rotate = jax.jit(lambda q, offset: layer(q, offset=offset))
    for offset in (jnp.asarray(5), jnp.asarray(FAR), jnp.asarray([3, -2])):
        eager = model(x, offset=offset)
        layer_checks.assert_near(_np(step(model, x, offset)), _np(eager), oracle.TOLERANCE["float32"])
        want = layer(q, offset=offset)
        layer_checks.assert_near(_np(rotate(q, offset)), _np(want), oracle.TOLERANCE["float32"])


def test_trains_with_jitted_gradients_equal_to_eager() -> None:
    """A few Adam steps of the tiny block, eagerly and under nnx.jit: the same gradients and
    weights (to float32's rounding: XLA fuses differently), and a falling loss."""
    x, target = _x((2, 6, 32)), _x((2, 6, 32), 1)

    def loss(model: Any) -> Any:
        return jnp.mean((model(x) - target) ** 2)

    def step(model: Any, optimizer: Any) -> Any:
        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    eager, jitted = Attention(), Attention()
    first, grads = nnx.value_and_grad(loss)(eager)
    traced = nnx.jit(nnx.grad(loss))(jitted)
    for (path, g), (_, h) in zip(
        jax.tree_util.tree_leaves_with_path(traced), jax.tree_util.tree_leaves_with_path(grads), strict=True
    ):
        layer_checks.assert_near(np.asarray(g), np.asarray(h), oracle.TOLERANCE["float32"], str(path))
    eager_opt = nnx.Optimizer(eager, optax.adam(1e-2), wrt=nnx.Param)
    jitted_opt = nnx.Optimizer(jitted, optax.adam(1e-2), wrt=nnx.Param)
    jitted_step = nnx.jit(step)
    for _ in range(5):
        step(eager, eager_opt)
        jitted_step(jitted, jitted_opt)
    for (path, a), (_, b) in zip(
        jax.tree_util.tree_leaves_with_path(nnx.state(jitted, nnx.Param)),
        jax.tree_util.tree_leaves_with_path(nnx.state(eager, nnx.Param)),
        strict=True,
    ):
        layer_checks.assert_near(np.asarray(a), np.asarray(b), 1e-5, str(path))  # five steps of rounding
    assert float(loss(eager)) < float(first)


def test_bad_input_raises_what_rope_raises() -> None:
    rope = anyrope.RoPE(HEAD)
    layer = RotaryEmbedding(rope)
    q = _x((1, 2, 3, HEAD))
    layer_checks.assert_same_errors(layer, rope, layer_checks.bad_calls(jnp.asarray, HEAD))
    with pytest.raises(TypeError, match="positional"):
        layer(q, q, 3)


def test_bad_construction_names_the_argument() -> None:
    layer_checks.assert_bad_construction_named(RotaryEmbedding, HEAD)
