"""Bad inputs to anyrope.integrations.transformers: a clear error naming the argument, and nothing
changed; or the documented result.

Property-based (hypothesis): ``use_anyrope`` given anything that is not a model, and a patched
rotary module called with position ids of any dtype and shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from anyrope.integrations.transformers import is_patched, remove_anyrope, use_anyrope

TINY = {
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 16,
    "max_position_embeddings": 64,
}
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _llama() -> Any:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()


def _qwen2_vl_text() -> Any:
    """A model whose rotary module is M-RoPE: position ids of (3, batch, seq) or (batch, seq)."""
    from peers.tiny_models import tiny_model

    return tiny_model("qwen2_vl_text")


def _rotary(model: Any) -> Any:
    return next(m for n, m in model.named_modules() if n.endswith("rotary_emb"))


NOT_MODELS = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=True), st.text(max_size=4), st.lists(st.integers(), max_size=3),
    st.builds(lambda n: np.zeros(n), st.integers(0, 3)), st.builds(lambda n: torch.zeros(n), st.integers(0, 3)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)  # fmt: skip


@SETTINGS
@given(NOT_MODELS)
def test_use_anyrope_refuses_what_is_not_a_model(value: Any) -> None:
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        use_anyrope(value)


def test_a_module_without_rotary_is_refused_unchanged() -> None:
    module = torch.nn.Linear(4, 4)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match="has no rotary embedding module"):
        use_anyrope(module)
    assert not is_patched(module)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert remove_anyrope(module) is module  # never patched: nothing to undo, no error


INTEGER_DTYPES = [torch.int64, torch.int32, torch.int16, torch.uint8]
BAD_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool, torch.complex64]


@st.composite
def position_ids(draw: Any, streams: int) -> tuple[Any, str]:
    """(position ids, "ok" or the word the error must hold): any dtype, 0 to 4 dimensions."""
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(INTEGER_DTYPES + BAD_DTYPES))
    values = torch.from_numpy(
        draw(st.builds(np.random.default_rng, st.integers(0, 9))).integers(0, 50, shape)
    )
    ids = values.to(dtype)
    if dtype in BAD_DTYPES:
        return ids, "integer tensor"
    fits = ndim == 2 or (streams > 1 and ndim == 3 and shape[0] in (1, streams))
    return ids, "ok" if fits else "shape"


@pytest.mark.parametrize("make", [_llama, _qwen2_vl_text], ids=["llama", "qwen2-vl-text"])
def test_patched_rotary_module_checks_position_ids(make: Any) -> None:
    model = make()
    rotary = _rotary(model)
    streams = 3 if make is _qwen2_vl_text else 1
    use_anyrope(model)
    assert is_patched(rotary)

    @SETTINGS
    @given(position_ids(streams))
    def check(case: tuple[Any, str]) -> None:
        ids, expected = case
        x = torch.randn(1, 4, 8)  # the rotary modules read only x's dtype and device
        x_before, ids_before = x.clone(), ids.clone()
        if expected == "ok":
            got = rotary(x, ids)
            remove_anyrope(model)  # the stock module, for the documented result
            try:
                want = rotary(x, ids.long())
            finally:
                use_anyrope(model)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=2e-6)  # float32 rounding of the angles
        else:
            with pytest.raises(
                (TypeError, ValueError), match=rf"position_ids.*{expected}|{expected}.*position_ids"
            ):
                rotary(x, ids)
        assert torch.equal(x, x_before)
        assert torch.equal(ids, ids_before)
        assert is_patched(rotary)

    check()
    for bad in (None, [[0, 1, 2]], np.zeros((1, 3), dtype=np.int64)):
        with pytest.raises((TypeError, ValueError), match="position_ids"):
            rotary(torch.randn(1, 3, 8), bad)


def test_unknown_layer_type_is_named() -> None:
    model = _llama()
    use_anyrope(model)
    with pytest.raises(ValueError, match="layer_type='nope' is none of this model's"):
        _rotary(model)(torch.randn(1, 2, 32), torch.zeros(1, 2, dtype=torch.long), "nope")
