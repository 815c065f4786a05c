"""anyrope.layers.mlx.RotaryEmbedding: rope(...)'s call and nn.RoPE's, no parameters, exact after
set_dtype, under mx.compile, in training, and rope(...)'s errors for bad input."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from mlx import nn
from mlx import optimizers as optim
from mlx.utils import tree_flatten

import anyrope
from anyrope.layers.mlx import RotaryEmbedding
from anyrope.scaling import Linear

import layer_checks
import oracle

HEAD = 16
FAR = layer_checks.FAR


def _x(shape: tuple[int, ...], seed: int = 0) -> Any:
    return mx.array(layer_checks.sample(shape, seed))


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.astype(mx.float32))


def test_every_construction_rotates_as_its_rope() -> None:
    config = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5, "model_type": "cohere"}
    rope = anyrope.RoPE.from_hf_config(config)
    q, k = _x((2, 4, 5, HEAD)), _x((2, 2, 5, HEAD), 1)
    for layer in (RotaryEmbedding(rope), RotaryEmbedding(HEAD, base=5e5, layout="interleaved")):
        assert layer.rope.layout == "interleaved"
        want_q, want_k = rope(q, k, offset=mx.array([3, -1]))
        got_q, got_k = layer(q, k, offset=mx.array([3, -1]))
        assert np.array_equal(_np(got_q), _np(want_q))
        assert np.array_equal(_np(got_k), _np(want_k))
    layer = RotaryEmbedding.from_hf_config(config)
    assert repr(layer.rope) == repr(rope)
    assert repr(rope) in repr(layer)
    positions = mx.array([[4, 3, 2, 1, 0], [9, 9, 9, 9, 9]])
    assert np.array_equal(_np(layer(q, positions=positions)), _np(rope(q, positions=positions)))
    wide = _x((2, 5, 4, HEAD))  # (batch, seq, heads, head_dim)
    assert np.array_equal(_np(layer(wide, seq_axis=-3)), _np(rope(wide, seq_axis=-3)))


@pytest.mark.parametrize("offset", [0, 7, "0-d", "per row"])
def test_nn_rope_call_forms_agree_with_nn_rope(offset: Any) -> None:
    """nn.RoPE's ``(x, offset)`` and mlx-lm's ``rope(x, offset=...)``: an int, a 0-d array, or
    one offset per row (BatchKVCache), against mx.fast.rope row by row. mx.fast.rope forms its
    angles in float32: within float32's tolerance at these small positions."""
    x = _x((2, 3, 6, HEAD))
    layer, stock = (
        RotaryEmbedding(HEAD, base=500.0, scaling=Linear(2.0)),
        nn.RoPE(HEAD, base=500.0, scale=0.5),
    )
    rows = [7, 2] if offset == "per row" else [0 if offset == 0 else 7] * 2
    given = {"0-d": mx.array(7), "per row": mx.array(rows)}.get(offset, offset)
    want = np.stack([_np(stock(x[i : i + 1], rows[i]))[0] for i in range(2)])
    for got in (layer(x, given), layer(x, offset=given)):
        layer_checks.assert_near(_np(got), want, oracle.TOLERANCE["float32"])


class Attention(nn.Module):  # type: ignore[misc]
    """A tiny attention block as mlx-lm writes one: projections, rope(x, offset=...), softmax."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.o_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.rope = RotaryEmbedding(width // heads, base=1000.0)

    def __call__(self, x: Any, offset: Any = 0) -> Any:
        b, n, _ = x.shape
        q, k, v = (
            p(x).reshape(b, n, self.heads, -1).transpose(0, 2, 1, 3)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = self.rope(q, offset=offset), self.rope(k, offset=offset)
        scores = mx.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), axis=-1)
        return self.o_proj((scores @ v).transpose(0, 2, 1, 3).reshape(b, n, -1))


def _block(seed: int = 0) -> Any:
    mx.random.seed(seed)
    return Attention()


def test_no_parameters_and_weights_files_unchanged(tmp_path: Any) -> None:
    assert tree_flatten(RotaryEmbedding(HEAD).parameters()) == []
    model = _block()
    names = [name for name, _ in tree_flatten(model.parameters())]
    assert names
    assert not [n for n in names if "rope" in n], names
    model.save_weights(str(tmp_path / "w.safetensors"))
    fresh = _block(seed=1)
    fresh.load_weights(str(tmp_path / "w.safetensors"), strict=True)
    x = _x((2, 5, 32))
    assert np.array_equal(_np(fresh(x)), _np(model(x)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_set_dtype_keeps_rotations_exact_far_out(dtype: str) -> None:
    model = _block()
    model.set_dtype(getattr(mx, dtype))
    assert tree_flatten(model.rope.parameters()) == []
    x = _x((1, 2, 4, HEAD)).astype(getattr(mx, dtype))
    positions = np.arange(FAR, FAR + 4)
    got = model.rope(x, offset=FAR)
    assert got.dtype == x.dtype
    exact = oracle.rotate(_np(x), positions, base=1000.0)
    layer_checks.assert_rounded_once(_np(got), exact, dtype)


def test_compiles_with_traced_offsets() -> None:
    layer = RotaryEmbedding(HEAD)
    x = _x((2, 2, 3, HEAD))
    step = mx.compile(lambda x, offset: layer(x, offset))
    for offset in (mx.array(5), mx.array(FAR), mx.array([3, -2])):
        layer_checks.assert_near(
            _np(step(x, offset)), _np(layer(x, offset=offset)), oracle.TOLERANCE["float32"]
        )


def test_trains_with_compiled_gradients_equal_to_eager() -> None:
    """A few Adam steps of the tiny block, eagerly and as one mx.compile step: the same gradients
    and weights (to float32's rounding: compiled code may fuse differently), and a falling loss."""
    x, target = _x((2, 6, 32)), _x((2, 6, 32), 1)

    def loss(model: Any, x: Any, target: Any) -> Any:
        return mx.mean((model(x) - target) ** 2)

    eager, compiled = _block(), _block()
    eager_grad, compiled_grad = nn.value_and_grad(eager, loss), nn.value_and_grad(compiled, loss)
    first, grads = eager_grad(eager, x, target)
    # value_and_grad sets the model's parameters while traced: they are the compiled call's outputs too
    traced_grad = mx.compile(
        lambda x, t: compiled_grad(compiled, x, t), inputs=compiled.state, outputs=compiled.state
    )
    _, traced = traced_grad(x, target)
    for (name, g), (_, h) in zip(tree_flatten(traced), tree_flatten(grads), strict=True):
        layer_checks.assert_near(_np(g), _np(h), oracle.TOLERANCE["float32"], name)
    eager_opt, compiled_opt = optim.Adam(learning_rate=1e-2), optim.Adam(learning_rate=1e-2)
    compiled_opt.init(compiled.trainable_parameters())  # its state exists before compile captures it
    state = [compiled.state, compiled_opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x: Any, target: Any) -> Any:
        value, grads = compiled_grad(compiled, x, target)
        compiled_opt.update(compiled, grads)
        return value

    for _ in range(5):
        _, grads = eager_grad(eager, x, target)
        eager_opt.update(eager, grads)
        step(x, target)
        mx.eval(eager.parameters(), eager_opt.state, state)
    for (name, a), (_, b) in zip(
        tree_flatten(compiled.parameters()), tree_flatten(eager.parameters()), strict=True
    ):
        layer_checks.assert_near(_np(a), _np(b), 1e-5, name)  # five steps of float32 rounding, not more
    assert float(loss(eager, x, target)) < float(first)


def test_bad_input_raises_what_rope_raises() -> None:
    rope = anyrope.RoPE(HEAD)
    layer = RotaryEmbedding(rope)
    q = _x((1, 2, 3, HEAD))
    layer_checks.assert_same_errors(layer, rope, layer_checks.bad_calls(mx.array, HEAD))
    with pytest.raises(TypeError, match="offset given twice"):
        layer(q, 3, offset=2)
    with pytest.raises(TypeError, match="positional"):
        layer(q, q, 3)


def test_bad_construction_names_the_argument() -> None:
    layer_checks.assert_bad_construction_named(RotaryEmbedding, HEAD)
    with pytest.raises(TypeError, match="bogus"):
        RotaryEmbedding(HEAD, bogus=1)
