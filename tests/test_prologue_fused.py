"""The fused prologue (numba, on NumPy and CPU torch): the same q, k and cache bit for bit as its
steps apart (``use_fast_paths(False)``) across dtypes, norms, layouts, cache layouts and skipped
places; what takes a call and why not, as ``explain_prologue`` says; the probe of each library's
order of summing squares; nothing written on bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope._fusion import PrologueJob
from anyrope._kernels import FUSIONS, numba_prologue

from harness import Backend, canary_cache, count_prologue_checks, prologue_arrays

pytestmark = pytest.mark.backends("numpy", "torch")
numba = pytest.importorskip("numba", reason="the fused prologue is numba's")
RNG = np.random.default_rng(5)
BATCH, HEADS, KV_HEADS, SEQ, MAX_ROWS = 2, 4, 2, 5, 16
# per batch row: a skipped token (-1) between written ones, and rows out of order
PLACES = np.array([[3, 4, -1, 6, 1], [0, 9, 2, 15, 8]])
CANARY = 7.0

# (dtype, head_dim, rotary_dim, layout, rounding, offset, per-head k weights, seq_axis, cache layout):
# each factor at least twice, and not every combination (each is a compiled kernel of its own)
CASES = [
    ("float32", 64, 64, "half", "before_weight", 0.0, False, -2, "bhsd"),
    ("float32", 80, 48, "interleaved", "after_weight", 1.0, True, -3, "bshd"),
    ("float64", 64, 32, "interleaved", "before_weight", 0.5, True, -2, "paged_nhd"),
    ("float16", 128, 128, "half", "after_weight", 1.0, False, -3, "paged_hnd"),
    ("bfloat16", 256, 256, "half", "before_weight", 0.0, False, -2, "bhsd"),
    ("bfloat16", 96, 64, "interleaved", "after_weight", 0.0, True, -2, None),
    ("float32", 64, 64, "half", None, 0.0, False, -3, "bshd"),  # rope and the cache write alone: apart
]


def _array(backend: Backend, data: np.ndarray, dtype: str) -> Any:
    return backend.asarray(data, dtype)


def _cache(backend: Backend, layout: str, dtype: str, head_dim: int) -> Any:
    return canary_cache(
        backend, layout, dtype, head_dim, batch=BATCH, kv_heads=KV_HEADS, rows=MAX_ROWS, canary=CANARY
    )


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}-{c[4]}-{c[8]}" for c in CASES])
def test_fused_equals_its_steps_apart(backend: Backend, case: tuple[Any, ...]) -> None:
    dtype, head_dim, rotary_dim, layout, rounding, offset, per_head, seq_axis, cache_layout = case
    if dtype not in backend.dtypes:
        pytest.skip(f"{backend.name} has no {dtype}")

    q, k, v, norm = prologue_arrays(
        backend, RNG, dtype, head_dim, rounding=rounding, offset=offset, per_head=per_head, seq_axis=seq_axis,
        shape=(BATCH, HEADS, KV_HEADS, SEQ),
    )  # fmt: skip
    rope = anyrope.RoPE(head_dim, rotary_dim=rotary_dim, layout=layout)
    positions = _array(backend, np.maximum(PLACES, 0) + 100, backend.index)
    index = PLACES if cache_layout in ("bhsd", "bshd", None) else PLACES + 7  # paged: slots 6..22
    where = {"positions": positions, "seq_axis": seq_axis, "norm": norm}
    caches = []
    for switch in (True, False):
        cache = None if cache_layout is None else _cache(backend, cache_layout, dtype, head_dim)
        cache_index = None if cache is None else _array(backend, index, backend.index)
        with anyrope.use_fast_paths(switch):
            if switch:
                said = anyrope.explain_prologue(
                    q, k, v, rope=rope, cache=cache, cache_index=cache_index, **where
                )
                taken = "steps apart: numba: no calls without a norm" if rounding is None else "fused: numba"
                assert said.startswith(taken), said
            out = anyrope.prologue(q, k, v, rope=rope, cache=cache, cache_index=cache_index, **where)
        caches.append((out, cache))
    (fused, fused_cache), (steps, steps_cache) = caches
    for got, want in ((fused.q, steps.q), (fused.k, steps.k)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(_bits(backend, got), _bits(backend, want))
    assert fused.v is v
    if fused_cache is not None:
        for got, want in ((fused_cache.k, steps_cache.k), (fused_cache.v, steps_cache.v)):
            np.testing.assert_array_equal(_bits(backend, got), _bits(backend, want))
        untouched = _bits(backend, _cache(backend, cache_layout, dtype, head_dim).k)
        assert (_bits(backend, fused_cache.k) != untouched).any()  # something was written


def _bits(backend: Backend, x: Any) -> np.ndarray:
    """An array's bits (16-bit floats as integers: NaN payloads and signed zeros count)."""
    if backend.name == "torch":
        import torch

        x = x.view(torch.int16) if x.dtype in (torch.float16, torch.bfloat16) else x
    host = backend.to_numpy(x)
    return host.view(np.int16) if host.dtype == np.float16 else host


def _call(backend: Backend, **kwargs: Any) -> dict[str, Any]:
    q = _array(backend, RNG.standard_normal((BATCH, HEADS, SEQ, 64)), "float32")
    k = _array(backend, RNG.standard_normal((BATCH, KV_HEADS, SEQ, 64)), "float32")
    weight = _array(backend, np.ones(64), "float32")
    call = {"q": q, "k": k, "rope": anyrope.RoPE(64), "norm": anyrope.QKNorm(weight, weight)}
    call.update(kwargs)
    return call


def test_explain_says_why_the_steps_run_apart(backend: Backend) -> None:
    said = anyrope.explain_prologue(**_call(backend, norm=None))
    assert said.startswith(
        "steps apart: numba: no calls with neither a norm nor a cache (a rotation alone, which the rotation kernels take)"
    )
    v = _array(backend, RNG.standard_normal((BATCH, KV_HEADS, SEQ, 64)), "float32")
    cache = _cache(backend, "bhsd", "float32", 64)
    assert anyrope.explain_prologue(**_call(backend, norm=None, v=v, cache=cache)).startswith(
        "steps apart: numba: no calls without a norm (a rotation and a cache write take less time as their steps here)"
    )
    assert ("triton" in said) == (backend.name == "torch")  # the fusions of the call's library alone
    with anyrope.use_fast_paths(False):
        assert (
            anyrope.explain_prologue(**_call(backend)) == "steps apart: fast paths are off (use_fast_paths)"
        )
    with anyrope.use_fast_paths("generic"):
        assert "names another kernel" in anyrope.explain_prologue(**_call(backend))
    across = np.ones(HEADS * 64), np.ones(KV_HEADS * 64)
    norm = anyrope.QKNorm(*(_array(backend, w, "float32") for w in across), across_heads=True)
    assert "no norms across a token's heads" in anyrope.explain_prologue(**_call(backend, norm=norm))
    wide = anyrope.QKNorm(_array(backend, np.ones(64), "float64"), _array(backend, np.ones(64), "float64"))
    assert "different dtypes" in anyrope.explain_prologue(**_call(backend, norm=wide))
    three = _call(backend)
    three["q"], three["k"] = three["q"][0], three["k"][0]
    assert "other than (batch, heads, seq, head_dim)" in anyrope.explain_prologue(**three)
    if backend.name == "torch":
        grads = _call(backend)
        grads["q"] = grads["q"].requires_grad_()
        assert "no gradients" in anyrope.explain_prologue(**grads)


def test_a_call_the_fusion_refuses_runs_its_steps(backend: Backend) -> None:
    """An across-heads norm (refused) still gets the composition's result."""
    across = np.ones(HEADS * 64), np.ones(KV_HEADS * 64)
    norm = anyrope.QKNorm(*(_array(backend, w, "float32") for w in across), across_heads=True)
    call = _call(backend, norm=norm)
    got = anyrope.prologue(**call)
    want = call["rope"](norm.q(call["q"]), norm.k(call["k"]))
    np.testing.assert_array_equal(backend.to_numpy(got.q), backend.to_numpy(want[0]))


def test_the_fusion_checks_before_it_writes(backend: Backend) -> None:
    """Weights of the wrong shape are named by the norm's own check, the cache untouched."""
    cache = _cache(backend, "bhsd", "float32", 64)
    v = _array(backend, RNG.standard_normal((BATCH, KV_HEADS, SEQ, 64)), "float32")
    bad = anyrope.QKNorm(_array(backend, np.ones(32), "float32"), _array(backend, np.ones(64), "float32"))
    with pytest.raises(ValueError, match="q_weight has shape"):
        anyrope.prologue(**_call(backend, norm=bad, v=v, cache=cache, offset=2))
    assert (backend.to_numpy(cache.k) == CANARY).all()


def test_rows_that_are_not_innermost_take_the_steps_apart(backend: Backend) -> None:
    """q or k whose features are not their innermost axis in memory (heads or tokens innermost, a
    stride-0 view of k's heads): the library sums their squares in another order than for rows,
    so the fusion refuses them and the result is the steps' own; a packed projection's views and
    features every other element keep their rows innermost and stay fused, equal to the steps."""
    rng = np.random.default_rng(11)
    weight = _array(backend, np.ones(128), "float32")
    norm, rope = anyrope.QKNorm(weight, weight), anyrope.RoPE(128)
    k = _array(backend, 3 * rng.standard_normal((2, 2, 3, 128)), "float32")
    data = 3 * rng.standard_normal((2, 4, 3, 128)).astype(np.float32)
    views = _views(backend, data)
    for name, q in views.items():
        said = anyrope.explain_prologue(q, k, rope=rope, norm=norm, offset=2)
        fused = name == "every other"
        assert said.startswith("fused: numba") if fused else "not their innermost axis" in said, (name, said)
        got = anyrope.prologue(q, k, rope=rope, norm=norm, offset=2)
        with anyrope.use_fast_paths(False):
            want = anyrope.prologue(q, k, rope=rope, norm=norm, offset=2)
        np.testing.assert_array_equal(_bits(backend, got.q), _bits(backend, want.q), err_msg=name)


def _views(backend: Backend, data: np.ndarray) -> dict[str, Any]:
    """data (batch, heads, seq, features) as views with heads innermost, tokens innermost, every
    other feature of a wider buffer and one head broadcast to all."""
    if backend.name == "torch":
        import torch

        x = torch.from_numpy(data)
        return {
            "heads": x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
            "tokens": x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2),
            "every other": x.repeat_interleave(2, dim=-1)[..., ::2],
            "broadcast": x[:, :1].expand(x.shape),
        }
    return {
        "heads": np.ascontiguousarray(data.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
        "tokens": np.ascontiguousarray(data.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2),
        "every other": np.repeat(data, 2, axis=-1)[..., ::2],
        "broadcast": np.broadcast_to(data[:, :1], data.shape),
    }


def test_sum_order_probes_each_library() -> None:
    """NumPy sums a head's squares pairwise (order 0); torch's order, found per machine, is one the
    kernel knows wherever the fusion takes torch calls, and a refusal names the library if not."""
    assert numba_prologue.sum_order("numpy", 128, "float32") == 0
    assert numba_prologue.sum_order("numpy", 1024, "float64") == 0
    pytest.importorskip("torch")
    job = PrologueJob(
        library="torch", device="cpu", dtype="float32", traced=False, grad=False, layout="half", inverse=False,
        compute="float32", seq_axis=-2, shapes=((1, 1, 1, 128),) * 3, head_dim=128, rounding="before_weight",
        across_heads=False, one_dtype=True, features_innermost=True, cache=None, host_places=False, streams=1,
        xpos=False, has_k=True,
    )  # fmt: skip
    found = numba_prologue.sum_order("torch", 128, "float32")
    refused = FUSIONS[0].why_not(job)
    assert (refused is None) == (found is not None)
    if refused is not None:
        assert "torch sums here in an order" in refused


def test_leaves_are_numpys_tree() -> None:
    from anyrope._kernels import _jit_prologue

    assert _jit_prologue.LONGEST == numba_prologue.LONGEST_HEAD
    assert _jit_prologue.leaves(128) == [(0, 128)] + [(0, 0)] * 7
    assert _jit_prologue.leaves(256) == [
        (0, 128),
        (0, 0),
        (0, 0),
        (0, 0),
        (128, 128),
        (128, 0),
        (128, 0),
        (128, 0),
    ]
    for n in (8, 80, 200, 576, 1000, 1024):
        assert sum(length for _, length in _jit_prologue.leaves(n)) == n
    with pytest.raises(ValueError, match="three levels"):
        _jit_prologue.leaves(1025)


@pytest.mark.parametrize("lanes", [0, 4, 8, 16])
def test_vector_sums_of_squares_are_the_scalar_orders(lanes: int) -> None:
    """The sums of squares in SIMD vectors (``_jit_sums``) equal, bit for bit, the same order
    spelled out one element at a time (the path of float16 kept as bits), at every head size:
    whole groups of vectors, leftover vectors, leftover elements, NumPy's leaves."""
    from anyrope._kernels import _jit, _jit_prologue

    if not _jit._HARDWARE_HALF:
        pytest.skip("this CPU has no float16 vector conversion: both paths are the scalar one")
    rng = np.random.default_rng(1)
    for n in (3, 8, 60, 64, 80, 96, 100, 128, 192, 200, 256, 576, 1000):
        rows = (
            (rng.standard_normal((64, n)) * rng.uniform(0.1, 30, (64, 1))).astype(np.float16).view(np.int16)
        )
        at = np.array(_jit_prologue.leaves(n), dtype=np.int64)
        vector = _jit_prologue.inverse_rms(rows, at, lanes, 1e-6, lanes == 0, _jit.FLOAT16_HARDWARE)
        scalar = _jit_prologue.inverse_rms(rows, at, lanes, 1e-6, lanes == 0, _jit.FLOAT16_BITS)
        np.testing.assert_array_equal(vector, scalar, err_msg=f"{n} features")


def test_a_kept_call_does_only_its_values_work(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Later calls of one signature take the kept fused launch (the argument checks run once): new
    offsets and places each time give the steps apart's results, and a place past the cache is
    still refused unwritten."""
    checks = count_prologue_checks(monkeypatch)
    rope = anyrope.RoPE(64)
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(64), "float32")
    norm = anyrope.QKNorm(weight, weight)
    v = _array(backend, RNG.standard_normal((BATCH, KV_HEADS, 1, 64)), "float32")
    fused, steps = _cache(backend, "bhsd", "float32", 64), _cache(backend, "bhsd", "float32", 64)
    for step in range(4):
        q = _array(backend, RNG.standard_normal((BATCH, HEADS, 1, 64)), "float32")
        k = _array(backend, RNG.standard_normal((BATCH, KV_HEADS, 1, 64)), "float32")
        places = _array(backend, np.array([[step], [MAX_ROWS - 1 - step]]), backend.index)
        got = anyrope.prologue(
            q, k, v, rope=rope, norm=norm, cache=fused, offset=50 + step, cache_index=places
        )
        with anyrope.use_fast_paths(False):
            want = anyrope.prologue(
                q, k, v, rope=rope, norm=norm, cache=steps, offset=50 + step, cache_index=places
            )
        np.testing.assert_array_equal(backend.to_numpy(got.q), backend.to_numpy(want.q))
        np.testing.assert_array_equal(backend.to_numpy(fused.k), backend.to_numpy(steps.k))
    assert len(checks) == 2  # the first fused call's and the first of the steps apart's
    before = backend.to_numpy(fused.k).copy()
    past = _array(backend, np.array([[0], [MAX_ROWS]]), backend.index)
    with pytest.raises(ValueError, match="past the cache"):
        anyrope.prologue(q, k, v, rope=rope, norm=norm, cache=fused, offset=1, cache_index=past)
    np.testing.assert_array_equal(backend.to_numpy(fused.k), before)


def test_kept_decode_steps_write_their_offsets_rows(backend: Backend) -> None:
    """The decode form (an int offset alone, a contiguous cache): kept calls write row ``offset``
    as the steps apart do, a negative offset's rows are skipped, and an offset past the cache is
    refused with nothing written."""
    rope = anyrope.RoPE(64)
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(64), "float32")
    norm = anyrope.QKNorm(weight, weight)
    fused, steps = _cache(backend, "bshd", "float32", 64), _cache(backend, "bshd", "float32", 64)
    for offset in (3, 4, -1, MAX_ROWS - 1):
        q, k, v = (
            _array(backend, RNG.standard_normal((BATCH, 1, heads, 64)), "float32")
            for heads in (HEADS, KV_HEADS, KV_HEADS)
        )
        got = anyrope.prologue(q, k, v, rope=rope, norm=norm, cache=fused, offset=offset, seq_axis=-3)
        with anyrope.use_fast_paths(False):
            want = anyrope.prologue(q, k, v, rope=rope, norm=norm, cache=steps, offset=offset, seq_axis=-3)
        np.testing.assert_array_equal(backend.to_numpy(got.k), backend.to_numpy(want.k))
        np.testing.assert_array_equal(backend.to_numpy(fused.k), backend.to_numpy(steps.k))
        np.testing.assert_array_equal(backend.to_numpy(fused.v), backend.to_numpy(steps.v))
    assert (backend.to_numpy(fused.k)[:, [0, 1, 2, 5]] == CANARY).all()
    before = backend.to_numpy(fused.k).copy()
    with pytest.raises(ValueError, match=f"offset reaches {MAX_ROWS}, past the cache"):
        anyrope.prologue(q, k, v, rope=rope, norm=norm, cache=fused, offset=MAX_ROWS, seq_axis=-3)
    np.testing.assert_array_equal(backend.to_numpy(fused.k), before)


@pytest.mark.backends("torch")
def test_weights_that_need_gradients_take_the_steps_apart(backend: Backend) -> None:
    """A norm whose weights require gradients (a model's parameters, in training) is refused by
    the fusion, which carries none, though q and k need none: the result records the graph."""
    import torch

    weight = torch.nn.Parameter(_array(backend, 1 + 0.1 * RNG.standard_normal(64), "float32"))
    call = _call(backend, norm=anyrope.QKNorm(weight, weight))
    assert anyrope.explain_prologue(**call).startswith("steps apart: numba: no gradients")
    out = anyrope.prologue(**call)
    assert out.q.requires_grad
    out.q.sum().backward()
    assert weight.grad is not None
    with torch.no_grad():
        assert anyrope.explain_prologue(**call).startswith("fused: numba")
