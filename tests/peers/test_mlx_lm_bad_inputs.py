"""Bad inputs to anyrope.integrations.mlx_lm: a clear error naming the argument, and nothing
changed; or the documented result.

Property-based (hypothesis): ``patch_model``, ``unpatch_model`` and ``from_mlx_lm`` given
anything that is not what they take, and an AnyRoPE called with offsets, scales and flags of
any kind (mlx-lm calls it as ``rope(x, offset=...)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx import nn
from mlx_lm.models import llama

import anyrope
from anyrope.integrations import mlx_lm as am

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
HEAD = 16


def _tiny_llama() -> Any:
    args = llama.ModelArgs(
        model_type="llama", hidden_size=32, num_hidden_layers=1, intermediate_size=32,
        num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=16,
        head_dim=HEAD, rope_theta=10000.0,
    )  # fmt: skip
    return llama.Model(args)


NOT_MODELS = st.one_of(
    st.none(), st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=3),
    st.builds(lambda n: np.zeros(n), st.integers(0, 3)), st.builds(lambda n: mx.zeros((n,)), st.integers(0, 3)),
)  # fmt: skip
NOT_BOOLS = st.one_of(st.text(max_size=3), st.integers(), st.none(), st.floats(allow_nan=False))


@SETTINGS
@given(NOT_MODELS)
def test_model_functions_refuse_what_is_not_a_model(value: Any) -> None:
    for function in (am.patch_model, am.unpatch_model):
        with pytest.raises(TypeError, match=r"model must be an mlx\.nn\.Module"):
            function(value)
    with pytest.raises(TypeError):
        am.from_mlx_lm(value)


@SETTINGS
@given(st.sampled_from(["strict", "exact", "check"]), NOT_BOOLS)
def test_patch_model_flags_must_be_bools(flag: str, value: Any) -> None:
    """A string such as "no" reads as True: refused, naming the flag, with nothing replaced."""
    model = _tiny_llama()
    before = type(model.layers[0].self_attn.rope)
    with pytest.raises(TypeError, match=rf"{flag}=.* must be True or False"):
        am.patch_model(model, **{flag: value})
    assert type(model.layers[0].self_attn.rope) is before


@st.composite
def offsets(draw: Any, batch: int) -> tuple[Any, str]:
    """(offset, "ok" or the word the error must hold) of every kind mlx-lm's caches pass and more."""
    kind = draw(st.sampled_from(["int", "0-d", "rows", "float", "float array", "2-d", "wrong rows", "str"]))
    if kind == "int":
        return draw(st.integers(-5, 10**6)), "ok"
    if kind == "0-d":
        return mx.array(draw(st.integers(0, 10**6))), "ok"
    if kind == "rows":
        return mx.array(draw(st.lists(st.integers(-3, 10**6), min_size=batch, max_size=batch))), "ok"
    if kind == "float":
        return draw(st.floats(allow_nan=True)), "offset"
    if kind == "float array":
        return mx.array([0.5] * batch), "offset"
    if kind == "2-d":
        return mx.zeros((batch, 2), dtype=mx.int32), "offset"
    if kind == "wrong rows":
        return mx.zeros((batch + 1,), dtype=mx.int32), "offset"
    return "3", "offset"


@SETTINGS
@given(offsets(batch=2), st.sampled_from([1.0, 0.5, 2]), st.booleans())
def test_anyrope_call_takes_mlx_lm_offsets_or_names_the_argument(
    case: tuple[Any, str], scale: Any, inverse: bool
) -> None:
    offset, expected = case
    rope = am.AnyRoPE(anyrope.RoPE(HEAD))
    x = mx.random.normal((2, 3, 4, HEAD), key=mx.random.key(0))
    x_before = np.array(x)
    if expected == "ok":
        got = rope(x, offset=offset, scale=scale, inverse=inverse)
        assert got.shape == x.shape
        back = rope(got, offset=offset, scale=scale, inverse=not inverse)  # the documented inverse
        np.testing.assert_allclose(np.array(back), x_before, atol=1e-5)
    else:
        with pytest.raises((TypeError, ValueError), match=expected):
            rope(x, offset=offset, scale=scale, inverse=inverse)
    np.testing.assert_array_equal(np.array(x), x_before)


@SETTINGS
@given(st.one_of(st.text(max_size=3), st.floats(allow_nan=True), st.none(), st.booleans()), NOT_BOOLS)
def test_anyrope_call_checks_scale_and_inverse(scale: Any, inverse: Any) -> None:
    rope = am.AnyRoPE(anyrope.RoPE(HEAD))
    x = mx.zeros((1, 1, 2, HEAD))
    finite = isinstance(scale, float) and np.isfinite(scale)
    with pytest.raises(TypeError, match=r"inverse=.* must be True or False" if finite else "scale must be"):
        rope(x, scale=scale, inverse=inverse)


@pytest.mark.parametrize("x", [[1.0] * HEAD, np.float32(1.0), "x"], ids=["list", "scalar", "str"])
def test_anyrope_call_names_x(x: Any) -> None:
    with pytest.raises(ValueError, match="x must be an array of shape"):
        am.AnyRoPE(anyrope.RoPE(HEAD))(x)
    with pytest.raises(ValueError, match="features per head, fewer than"):
        am.AnyRoPE(anyrope.RoPE(HEAD))(mx.zeros((1, 2, HEAD - 2)))
    with pytest.raises(TypeError, match=r"rope must be an anyrope\.RoPE"):
        am.AnyRoPE(nn.RoPE(HEAD))
