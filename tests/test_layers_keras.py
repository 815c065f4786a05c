"""anyrope.layers.keras.RotaryEmbedding (Keras 3) on the backend of this session (KERAS_BACKEND:
jax in the JAX session, torch in the torch one; jax, else torch, where it is unset): rope(...)'s
call, no weights, exact under dtype policies, config and .keras round trips, jit_compile
training, TensorFlow refused by name, and rope(...)'s errors for bad input."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import pytest

# Keras reads its backend once, at import; TensorFlow, its default, is no backend anyrope takes.
os.environ.setdefault("KERAS_BACKEND", "jax" if importlib.util.find_spec("jax") else "torch")
keras = pytest.importorskip("keras")

import anyrope
from anyrope.layers.keras import RotaryEmbedding
from anyrope.scaling import YaRN

import layer_checks
import oracle

BACKEND = keras.backend.backend()
# Keras's own variables and its .keras writer call np.asarray on objects whose __array__ takes no
# copy= (NumPy 2 warns); nothing of anyrope's is involved.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)
HEAD, HEADS, SEQ = 16, 2, 6
WIDTH = HEAD * HEADS
FAR = layer_checks.FAR
ops = keras.ops


def _x(shape: tuple[int, ...], seed: int = 0) -> Any:
    return ops.convert_to_tensor(layer_checks.sample(shape, seed))


def _np(x: Any) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _model(seed: int = 0, **layer_kwargs: Any) -> Any:
    """A tiny functional attention block: projections, heads, the layer on q and k, softmax."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((SEQ, WIDTH))

    def heads(t: Any) -> Any:
        return keras.layers.Permute((2, 1, 3))(keras.layers.Reshape((SEQ, HEADS, HEAD))(t))

    q, k, v = (heads(keras.layers.Dense(WIDTH)(x)) for _ in range(3))
    q, k = RotaryEmbedding(HEAD, base=1000.0, name="rope", **layer_kwargs)(q, k)
    scores = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / np.sqrt(HEAD), axis=-1)
    out = keras.layers.Reshape((SEQ, WIDTH))(keras.layers.Permute((2, 1, 3))(ops.matmul(scores, v)))
    return keras.Model(x, keras.layers.Dense(WIDTH)(out))


def test_every_construction_rotates_as_its_rope() -> None:
    config = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5, "model_type": "cohere"}
    rope = anyrope.RoPE.from_hf_config(config)
    q, k = _x((2, 4, 5, HEAD)), _x((2, 2, 5, HEAD), 1)
    offsets = ops.convert_to_tensor(np.array([3, -1], dtype=np.int32))
    positions = ops.convert_to_tensor(np.array([[4, 3, 2, 1, 0], [9, 9, 9, 9, 9]], dtype=np.int32))
    named = RotaryEmbedding.from_hf_config(config, name="rotary")
    assert named.name == "rotary"
    for layer in (RotaryEmbedding(rope), RotaryEmbedding(HEAD, base=5e5, layout="interleaved"), named):
        assert repr(layer.rope) == repr(rope)
        for got, want in zip(layer(q, k, offset=offsets), rope(q, k, offset=offsets), strict=True):
            assert np.array_equal(_np(got), _np(want))
        assert np.array_equal(_np(layer(q, positions=positions)), _np(rope(q, positions=positions)))
        wide = _x((2, 5, 4, HEAD))  # (batch, seq, heads, head_dim)
        assert np.array_equal(_np(layer(wide, seq_axis=-3)), _np(rope(wide, seq_axis=-3)))


def test_no_weights() -> None:
    layer = RotaryEmbedding(HEAD)
    assert layer.weights == []
    assert layer.count_params() == 0
    model = _model()
    assert len(model.weights) == 8  # four Dense kernels and biases, nothing of the rope's
    assert model.get_layer("rope").weights == []


@pytest.mark.parametrize("how", ["layer dtype", "global mixed_bfloat16"])
def test_dtype_policies_keep_rotations_exact_far_out(how: str) -> None:
    """Keras casts q to the compute dtype before the call; the rotation of that bfloat16 q is
    exact, rounded once."""
    x = _x((1, HEADS, 4, HEAD))
    positions = np.arange(FAR, FAR + 4)
    if how == "layer dtype":
        layer = RotaryEmbedding(HEAD, dtype="bfloat16")
    else:
        keras.config.set_dtype_policy("mixed_bfloat16")
        try:
            layer = RotaryEmbedding(HEAD)
        finally:
            keras.config.set_dtype_policy("float32")
    got = layer(x, offset=FAR)
    assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
    exact = oracle.rotate(_np(ops.cast(x, "bfloat16")), positions)
    layer_checks.assert_rounded_once(_np(got), exact, "bfloat16")


def test_config_and_keras_file_round_trips(tmp_path: Any) -> None:
    rope = anyrope.RoPE(HEAD, rotary_dim=8, layout="interleaved", scaling=YaRN(4.0, 64), max_position=256)
    layer = RotaryEmbedding(rope, name="yarn", dtype="bfloat16")
    again = RotaryEmbedding.from_config(layer.get_config())
    assert repr(again.rope) == repr(rope)
    assert (again.name, again.dtype_policy.name) == ("yarn", "bfloat16")
    assert keras.saving.get_registered_name(RotaryEmbedding) == "anyrope>RotaryEmbedding"
    model = _model()
    path = str(tmp_path / "block.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.get_layer("rope"), RotaryEmbedding)
    assert repr(loaded.get_layer("rope").rope) == repr(model.get_layer("rope").rope)
    x = _x((2, SEQ, WIDTH))
    # the same computation, but JAX may compile the two models' calls with other fusions: to rounding
    layer_checks.assert_near(_np(loaded(x)), _np(model(x)), oracle.TOLERANCE["float32"])


# jit_compile on jax is XLA. On torch it is torch.compile of Keras's whole train step, which
# recompiles Keras's own internals step after step (3 minutes for two steps on a 2-core CPU, with
# or without this layer): there the block trains eagerly only; torch.compile of anyrope itself is
# tested by the torch suite.
COMPILED = (False, True) if BACKEND == "jax" else (False,)


def test_trains_compiled_as_eagerly() -> None:
    """A few SGD steps of the tiny block eagerly and with jit_compile: the same weights (to
    float32 rounding: compiled code fuses differently), so the same gradients, and a falling loss."""
    x = np.random.default_rng(0).standard_normal((4, SEQ, WIDTH)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((4, SEQ, WIDTH)).astype(np.float32)
    trained = []
    for jit in COMPILED:
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit, run_eagerly=not jit)
        history = model.fit(x, y, batch_size=4, epochs=4, verbose=0, shuffle=False)
        losses = history.history["loss"]
        assert losses[-1] < losses[0]
        trained.append(model.get_weights())
    for compiled in trained[1:]:
        for eager, weights in zip(trained[0], compiled, strict=True):
            layer_checks.assert_near(weights, eager, 1e-5)  # four steps of float32 rounding


def test_tensorflow_backend_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keras.backend, "backend", lambda: "tensorflow")
    with pytest.raises(RuntimeError, match=r"not 'tensorflow'.*KERAS_BACKEND=jax"):
        RotaryEmbedding(HEAD)


def test_bad_input_raises_what_rope_raises() -> None:
    rope = anyrope.RoPE(HEAD)
    layer = RotaryEmbedding(rope)
    q = _x((1, 2, 3, HEAD))
    layer_checks.assert_same_errors(layer, rope, layer_checks.bad_calls(ops.convert_to_tensor, HEAD))
    with pytest.raises(ValueError, match="positional"):  # Keras: non-tensors go by keyword
        layer(q, q, 3)


def test_bad_construction_names_the_argument() -> None:
    layer_checks.assert_bad_construction_named(RotaryEmbedding, HEAD)
    with pytest.raises(TypeError, match="rope"):
        RotaryEmbedding.from_config({"name": "x"})
