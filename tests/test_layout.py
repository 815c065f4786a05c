"""The two layouts are one rotation under a permutation: tensors and q/k weights convert exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import anyrope

from harness import Backend, assert_close, assert_same

PAIRS = [("half", "interleaved"), ("interleaved", "half")]


def test_aliases() -> None:
    assert {anyrope.LAYOUTS[a] for a in ("half", "neox", "hf")} == {"half"}
    assert anyrope.RoPE(8, layout="NeoX").layout == "half"
    assert {anyrope.LAYOUTS[a] for a in ("interleaved", "gptj", "meta")} == {"interleaved"}
    assert anyrope.RoPE(8, layout="HF").layout == "half"
    assert anyrope.RoPE(8, layout="meta").layout == "interleaved"


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_rotation_commutes_with_to_layout(
    backend: Backend, mode: str, src: str, dst: str, rotary_dim: int | None
) -> None:
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    x = backend.asarray(np.random.default_rng(0).standard_normal((2, 3, 5, 10)), dtype)
    rope_src = anyrope.RoPE(10, layout=src, rotary_dim=rotary_dim)
    rope_dst = anyrope.RoPE(10, layout=dst, rotary_dim=rotary_dim)

    def both(x: Any, o: Any) -> tuple[Any, Any]:
        left = anyrope.to_layout(rope_src(x, offset=o), src, dst, rotary_dim=rotary_dim)
        return left, rope_dst(anyrope.to_layout(x, src, dst, rotary_dim=rotary_dim), offset=o)

    offset = backend.asarray(np.array([7, -3]))
    for fast in (False, True):
        with anyrope.use_fast_paths(fast):
            left, right = backend.compile(both, mode)(x, offset)
        if fast or mode != "eager":  # kernels and compilers may fuse per layout: equal to rounding
            assert_close(backend, left, backend.to_numpy(right), dtype)
        else:  # the generic code does the same arithmetic in both layouts
            assert_same(backend, left, right, dtype)


def test_to_layout_round_trip_is_exact(backend: Backend, dtype: str) -> None:
    x = backend.asarray(np.random.default_rng(1).standard_normal((3, 16)), dtype)
    there = anyrope.to_layout(x, "neox", "gptj")
    back = anyrope.to_layout(there, "gptj", "neox")
    np.testing.assert_array_equal(backend.to_numpy(back), backend.to_numpy(x))
    assert not np.array_equal(backend.to_numpy(there), backend.to_numpy(x))


def test_to_layout_known_permutation(backend: Backend) -> None:
    x = backend.asarray(np.arange(8))
    np.testing.assert_array_equal(
        backend.to_numpy(anyrope.to_layout(x, "half", "interleaved")), [0, 4, 1, 5, 2, 6, 3, 7]
    )
    np.testing.assert_array_equal(
        backend.to_numpy(anyrope.to_layout(x, "interleaved", "half", rotary_dim=4)), [0, 2, 1, 3, 4, 5, 6, 7]
    )


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_permuted_weights_give_identical_attention_scores(
    backend: Backend, src: str, dst: str, rotary_dim: int | None
) -> None:
    rng = np.random.default_rng(2)
    heads, kv_heads, head_dim, hidden, seq = 4, 2, 8, 24, 6
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    hidden_states = backend.asarray(rng.standard_normal((seq, hidden)), dtype)
    w_q = backend.asarray(rng.standard_normal((heads * head_dim, hidden)), dtype)
    w_k = backend.asarray(rng.standard_normal((kv_heads * head_dim, hidden)), dtype)
    b_q = backend.asarray(rng.standard_normal(heads * head_dim), dtype)
    xp = backend.xp

    def scores(w_q: object, w_k: object, b_q: object, layout: str) -> np.ndarray:
        rope = anyrope.RoPE(head_dim, layout=layout, rotary_dim=rotary_dim)
        q = xp.reshape(xp.matmul(hidden_states, xp.permute_dims(w_q, (1, 0))) + b_q, (seq, heads, head_dim))
        k = xp.reshape(xp.matmul(hidden_states, xp.permute_dims(w_k, (1, 0))), (seq, kv_heads, head_dim))
        q, k = rope(q, k, seq_axis=-3, offset=5)
        q_np, k_np = backend.to_numpy(q), backend.to_numpy(k)
        k_np = np.repeat(k_np, heads // kv_heads, axis=1)
        return np.einsum("qhd,khd->hqk", q_np, k_np)

    before = scores(w_q, w_k, b_q, src)
    after = scores(
        anyrope.permute_qk_weight(w_q, heads, src, dst, rotary_dim=rotary_dim),
        anyrope.permute_qk_weight(w_k, kv_heads, src, dst, rotary_dim=rotary_dim),
        anyrope.permute_qk_weight(b_q, heads, src, dst, rotary_dim=rotary_dim),
        dst,
    )
    tolerance = 1e-12 if dtype == "float64" else 2e-5  # float32: sums of 8 products of size ~5
    np.testing.assert_allclose(after, before, rtol=tolerance, atol=tolerance)


def test_permute_qk_weight_round_trip_is_exact(backend: Backend, dtype: str) -> None:
    w = backend.asarray(np.random.default_rng(3).standard_normal((6 * 4, 5)), dtype)
    there = anyrope.permute_qk_weight(w, 6, "meta", "hf")
    back = anyrope.permute_qk_weight(there, 6, "hf", "meta")
    np.testing.assert_array_equal(backend.to_numpy(back), backend.to_numpy(w))


def test_permute_qk_weight_matches_the_checkpoint_conversion_recipe(backend: Backend) -> None:
    """Meta -> Hugging Face: view(heads, d/2, 2, hidden).transpose(1, 2), written here in NumPy."""
    heads, head_dim, hidden = 3, 8, 5
    w = np.random.default_rng(4).standard_normal((heads * head_dim, hidden))
    recipe = (
        w.reshape(heads, head_dim // 2, 2, hidden).transpose(0, 2, 1, 3).reshape(heads * head_dim, hidden)
    )
    dtype = "float64" if "float64" in backend.dtypes else "float32"
    got = anyrope.permute_qk_weight(backend.asarray(w, dtype), heads, "interleaved", "half")
    np.testing.assert_array_equal(backend.to_numpy(got), backend.to_numpy(backend.asarray(recipe, dtype)))


@given(
    half_pairs=st.integers(1, 8),
    tail=st.integers(0, 3),
    seq=st.integers(1, 6),
    offset=st.integers(0, 10_000),
)
def test_layout_equivalence_property(
    backend: Backend, half_pairs: int, tail: int, seq: int, offset: int
) -> None:
    rotary_dim, head_dim = 2 * half_pairs, 2 * half_pairs + 2 * tail
    x_np = np.random.default_rng(seq + offset).standard_normal((2, seq, head_dim))
    x = backend.asarray(x_np, "float32")
    half = anyrope.RoPE(head_dim, rotary_dim=rotary_dim, layout="half")
    inter = anyrope.RoPE(head_dim, rotary_dim=rotary_dim, layout="interleaved")
    converted = anyrope.to_layout(half(x, offset=offset), "half", "interleaved", rotary_dim=rotary_dim)
    direct = inter(anyrope.to_layout(x, "half", "interleaved", rotary_dim=rotary_dim), offset=offset)
    assert_close(backend, converted, backend.to_numpy(direct), "float32")
