"""The fused prologue for torch CUDA tensors (Triton): q and k within a few units in the last
place of its steps apart (``use_fast_paths(False)``), the cache holding those k and v at each
token's place and the canary everywhere else, across dtypes, norms, layouts, partial rotary,
M-RoPE, cache layouts, skipped places and places given on the device; kept calls; a CUDA graph
replayed with new positions and places; and the kernel compiled for NVIDIA GPUs.

It runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
``nox -s tests-torch-triton``); elsewhere these tests skip but the last.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope._kernels import FUSIONS

from harness import (
    Backend,
    assert_prologue_same,
    canary_cache,
    count_prologue_checks,
    prologue_arrays,
    skip_unless_it_runs,
)

TRITON = next(f for f in FUSIONS if f.name == "triton")
pytestmark = pytest.mark.backends("torch")
RNG = np.random.default_rng(8)
BATCH, HEADS, KV_HEADS, SEQ, MAX_ROWS = 2, 4, 2, 5, 16
PLACES = np.array([[3, 4, -1, 6, 1], [0, 9, 2, 15, 8]])  # a skipped token, rows out of order
CANARY = 7.0

# (dtype, head_dim, rotary_dim, layout, rounding, offset, per-head k weights, seq_axis, cache
# layout, M-RoPE sections): each factor at least twice
CASES = [
    ("float32", 64, 64, "half", "before_weight", 0.0, False, -2, "bhsd", None),
    ("float32", 80, 48, "interleaved", "after_weight", 1.0, True, -3, "bshd", None),
    ("float64", 64, 32, "interleaved", "before_weight", 0.5, True, -2, "paged_nhd", None),
    ("float16", 128, 128, "half", "after_weight", 1.0, False, -3, "paged_hnd", None),
    ("bfloat16", 128, 128, "half", "before_weight", 0.0, False, -2, "bhsd", [16, 24, 24]),
    ("bfloat16", 96, 64, "interleaved", "after_weight", 0.0, True, -2, None, None),
    ("float32", 64, 64, "half", None, 0.0, False, -3, "bshd", None),  # rope and the cache write alone
    ("bfloat16", 576, 64, "interleaved", "before_weight", 0.0, False, -3, "paged_nhd", None),  # MLA's width
    ("float32", 192, 192, "half", "after_weight", 1.0, True, -2, "bhsd", None),
]


@pytest.fixture
def torch_backend(backend: Backend) -> Backend:
    return skip_unless_it_runs(backend, "the Triton prologue", TRITON.devices, TRITON.available)


def _array(backend: Backend, data: np.ndarray, dtype: str) -> Any:
    return backend.asarray(data, dtype)


def _cache(backend: Backend, layout: str, dtype: str, head_dim: int) -> Any:
    return canary_cache(
        backend, layout, dtype, head_dim, batch=BATCH, kv_heads=KV_HEADS, rows=MAX_ROWS, canary=CANARY
    )


def _host(backend: Backend, x: Any) -> np.ndarray:
    return backend.to_numpy(x).astype(np.float64)


def _both(backend: Backend, call: Any, cache: Any) -> tuple[Any, Any]:
    """The call fused by Triton (its explanation says so), then its steps apart; each with a
    cache of its own made by ``cache()``."""
    fresh = cache()
    with anyrope.use_fast_paths("triton"):
        said = anyrope.explain_prologue(**call(fresh))
        assert said.startswith("fused: triton"), said
        fused = anyrope.prologue(**call(fresh))
    apart = cache()
    with anyrope.use_fast_paths(False):
        steps = anyrope.prologue(**call(apart))
    return fused, steps


def _assert_like_steps(backend: Backend, fused: Any, steps: Any, dtype: str) -> None:
    for got, want in ((fused.q, steps.q), (fused.k, steps.k)):
        assert got.dtype == want.dtype
        assert_prologue_same(_host(backend, got), _host(backend, want), dtype, exact=False)
    if steps.cache is None:
        return
    for got, want in ((fused.cache.k, steps.cache.k), (fused.cache.v, steps.cache.v)):
        host_got, host_want = _host(backend, got), _host(backend, want)
        np.testing.assert_array_equal(host_got == CANARY, host_want == CANARY)  # the same places written
        assert (host_want != CANARY).any()
    np.testing.assert_array_equal(_host(backend, fused.cache.v), _host(backend, steps.cache.v))
    assert_prologue_same(_host(backend, fused.cache.k), _host(backend, steps.cache.k), dtype, exact=False)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}-{c[4]}-{c[8]}" for c in CASES])
def test_fused_is_within_ulps_of_its_steps(torch_backend: Backend, case: tuple[Any, ...]) -> None:
    backend = torch_backend
    dtype, head_dim, rotary_dim, layout, rounding, offset, per_head, seq_axis, cache_layout, sections = case

    q, k, v, norm = prologue_arrays(
        backend, RNG, dtype, head_dim, rounding=rounding, offset=offset, per_head=per_head, seq_axis=seq_axis,
        shape=(BATCH, HEADS, KV_HEADS, SEQ),
    )  # fmt: skip
    rope = anyrope.RoPE(head_dim, rotary_dim=rotary_dim, layout=layout, mrope_section=sections)
    at = np.maximum(PLACES, 0) + 100
    if sections is not None:  # three streams: time, height, width
        at = np.stack([at, at // 3, at % 7])
    positions = _array(backend, at, backend.index)
    index = _array(backend, PLACES if cache_layout in ("bhsd", "bshd", None) else PLACES + 7, backend.index)

    def call(cache: Any) -> dict[str, Any]:
        where = {"cache": cache, "cache_index": None if cache is None else index}
        return {
            "q": q,
            "k": k,
            "v": v,
            "rope": rope,
            "positions": positions,
            "seq_axis": seq_axis,
            "norm": norm,
            **where,
        }

    fused, steps = _both(
        backend, call, lambda: cache_layout and _cache(backend, cache_layout, dtype, head_dim)
    )
    _assert_like_steps(backend, fused, steps, dtype)
    assert fused.v is v


@pytest.mark.parametrize("seq_axis", [-2, -3])
def test_decode_steps_at_an_int_offset(torch_backend: Backend, seq_axis: int) -> None:
    """The decode form (one token, an int offset, a contiguous cache): each later call takes the
    kept launch, whose rows are formed in the kernel from the offset; a negative offset's rows
    are skipped; one past the cache is refused with nothing written."""
    backend = torch_backend
    rope = anyrope.RoPE(64)
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(64), "bfloat16")
    norm = anyrope.QKNorm(weight, weight)
    layout = "bhsd" if seq_axis == -2 else "bshd"
    fused, steps = _cache(backend, layout, "bfloat16", 64), _cache(backend, layout, "bfloat16", 64)

    def shape(heads: int) -> tuple[int, ...]:
        return (BATCH, heads, 1, 64) if seq_axis == -2 else (BATCH, 1, heads, 64)

    for offset in (3, 4, -1, MAX_ROWS - 1):
        q, k, v = (
            _array(backend, RNG.standard_normal(shape(h)), "bfloat16") for h in (HEADS, KV_HEADS, KV_HEADS)
        )
        call: dict[str, Any] = {"rope": rope, "norm": norm, "offset": offset, "seq_axis": seq_axis}
        with anyrope.use_fast_paths("triton"):
            got = anyrope.prologue(q, k, v, cache=fused, **call)
        with anyrope.use_fast_paths(False):
            want = anyrope.prologue(q, k, v, cache=steps, **call)
        _assert_like_steps(backend, got, want, "bfloat16")
    rows = (
        _host(backend, fused.k)[:, :, [0, 1, 2, 5]]
        if seq_axis == -2
        else _host(backend, fused.k)[:, [0, 1, 2, 5]]
    )
    assert (rows == CANARY).all()
    before = _host(backend, fused.k)
    with (
        pytest.raises(ValueError, match=f"offset reaches {MAX_ROWS}, past the cache"),
        anyrope.use_fast_paths("triton"),
    ):
        anyrope.prologue(q, k, v, cache=fused, **(call | {"offset": MAX_ROWS}))
    np.testing.assert_array_equal(_host(backend, fused.k), before)


def test_kept_calls_read_new_places(torch_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Later calls of one signature take the kept launch (the argument checks run once) with
    the places and positions given as tensors, new each call."""
    backend = torch_backend
    checks = count_prologue_checks(monkeypatch)
    rope = anyrope.RoPE(64, layout="interleaved")
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(64), "float32")
    norm = anyrope.QKNorm(weight, weight, offset=1.0, rounding="after_weight")
    fused, steps = _cache(backend, "paged_nhd", "float32", 64), _cache(backend, "paged_nhd", "float32", 64)
    for step in range(3):
        q = _array(backend, RNG.standard_normal((BATCH, HEADS, 1, 64)), "float32")
        k, v = (_array(backend, RNG.standard_normal((BATCH, KV_HEADS, 1, 64)), "float32") for _ in "kv")
        call = {
            "rope": rope, "norm": norm, "positions": _array(backend, np.array([[step], [40 + step]]), backend.index),
            "cache_index": _array(backend, np.array([[step], [31 - step]]), backend.index),
        }  # fmt: skip
        with anyrope.use_fast_paths("triton"):
            got = anyrope.prologue(q, k, v, cache=fused, **call)
        with anyrope.use_fast_paths(False):
            want = anyrope.prologue(q, k, v, cache=steps, **call)
        _assert_like_steps(backend, got, want, "float32")
    assert len(checks) == 2  # the first fused call's and the first of the steps apart's


def test_kept_calls_launch_by_the_first_call_s_views(
    torch_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call of a signature works out what its arrays' strides fix of the launch; the
    later ones hand the kernel their own arrays by it, each with new values, as the steps apart
    give: views of a packed projection with a strided cache, features apart (read through a
    contiguous copy) into a paged cache, k a stride-0 view, and no cache with v given."""
    from anyrope._kernels import _triton_prologue

    views: list[int] = []
    five_of = _triton_prologue._five_of
    monkeypatch.setattr(_triton_prologue, "_five_of", lambda *a: (views.append(1), five_of(*a))[1])
    backend, dim, kv = torch_backend, 64, KV_HEADS
    rope = anyrope.RoPE(dim, rotary_dim=48)

    def arrays(seed: int, form: str) -> tuple[Any, Any, Any]:
        rng = np.random.default_rng(seed)
        packed = _array(backend, 3 * rng.standard_normal((BATCH, SEQ, (HEADS + 2 * kv) * 2 * dim)), "float32")
        q, k, v = packed.unflatten(-1, (HEADS + 2 * kv, 2 * dim)).split([HEADS, kv, kv], dim=2)
        if form == "features apart":  # (batch, seq, heads, head_dim) with features 2 apart
            return q[..., ::2], k[..., ::2], v[..., ::2]
        if form == "k of one head":
            return q[..., :dim], k[:, :, :1, :dim].expand(BATCH, SEQ, kv, dim), v[..., :dim]
        return q[..., :dim], k[..., :dim], v[..., dim:]

    def wide_cache() -> Any:
        wide = _array(backend, np.full((BATCH, MAX_ROWS, kv, 2 * dim), CANARY), "float32")
        return anyrope.KVCache(wide[..., :dim], wide[..., dim:], layout="bshd")

    caches = {
        "packed": wide_cache,
        "features apart": lambda: _cache(backend, "paged_hnd", "float32", dim),
        "k of one head": wide_cache,
        "no cache": lambda: None,
    }
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(dim), "float32")
    norm = anyrope.QKNorm(weight, weight)
    for form, cache in caches.items():
        views.clear()
        for seed in range(3):
            q, k, v = arrays(seed, form)
            paged = form == "features apart"
            where = PLACES + 7 + seed if paged else None

            def call(
                cache: Any, q: Any = q, k: Any = k, v: Any = v, where: Any = where, seed: int = seed
            ) -> Any:
                index = None if where is None or cache is None else _array(backend, where, backend.index)
                return {
                    "q": q, "k": k, "v": v, "rope": rope, "norm": norm, "seq_axis": -3, "offset": 2 + seed,
                    "cache": cache, "cache_index": index,
                }  # fmt: skip

            fused, steps = _both(backend, call, cache)
            _assert_like_steps(backend, fused, steps, "float32")
        assert views == [1, 1, 1], form  # q's, k's and v's views, worked out by the first call alone


def test_cuda_graph_replays_new_places(torch_backend: Backend) -> None:
    """Captured once (positions and places as device tensors, nothing read on the host), then
    replayed with other values written into the same tensors: the steps apart's results."""
    import torch

    backend = torch_backend
    if backend.device_kind != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    rope = anyrope.RoPE(128)
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(128), "bfloat16")
    norm = anyrope.QKNorm(weight, weight)
    q = _array(backend, RNG.standard_normal((BATCH, HEADS, 1, 128)), "bfloat16")
    k, v = (_array(backend, RNG.standard_normal((BATCH, KV_HEADS, 1, 128)), "bfloat16") for _ in "kv")
    positions = torch.tensor([[0], [5]], device=q.device)
    places = torch.tensor([[0], [5]], device=q.device)
    cache = _cache(backend, "bhsd", "bfloat16", 128)
    call = {"rope": rope, "norm": norm, "positions": positions, "cache_index": places, "cache": cache}
    with anyrope.use_fast_paths("triton"):
        anyrope.prologue(q, k, v, **call)  # warm: compile the kernel, keep the launch
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = anyrope.prologue(q, k, v, **call)
    for new in ([[7], [1]], [[12], [15]]):
        positions.copy_(torch.tensor(new))
        places.copy_(torch.tensor(new))
        graph.replay()
        steps = _cache(backend, "bhsd", "bfloat16", 128)
        with anyrope.use_fast_paths(False):
            want = anyrope.prologue(q, k, v, **(call | {"cache": steps}))
        assert_prologue_same(_host(backend, out.q), _host(backend, want.q), "bfloat16", exact=False)
        for b, (row,) in enumerate(new):
            stored, wanted = _host(backend, cache.k[b, :, row]), _host(backend, steps.k[b, :, row])
            assert_prologue_same(stored, wanted, "bfloat16", exact=False)


def test_places_past_the_cache(torch_backend: Backend) -> None:
    """A place past the cache: refused with nothing written where the places are host values
    (CPU tensors); on a GPU, where nothing reads them on the host, the kernel skips it and writes
    the others, with no synchronisation of the device (torch's sync debug mode raises on one)."""
    import torch

    backend = torch_backend
    rope = anyrope.RoPE(64)
    q = _array(backend, RNG.standard_normal((1, HEADS, 2, 64)), "float32")
    k, v = (_array(backend, RNG.standard_normal((1, KV_HEADS, 2, 64)), "float32") for _ in "kv")
    cache = _cache(backend, "paged_nhd", "float32", 64)  # 32 slots
    places = _array(backend, np.array([[5, 32]]), backend.index)
    call = {"rope": rope, "cache": cache, "cache_index": places, "offset": 3}
    with anyrope.use_fast_paths("triton"):
        if backend.device_kind != "cuda":
            with pytest.raises(ValueError, match="cache_index reaches 32, past the cache's 32 slots"):
                anyrope.prologue(q, k, v, **call)
            assert (_host(backend, cache.k) == CANARY).all()
            return
        anyrope.prologue(q, k, v, **call)  # warm: the kernel and its kept launch
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = anyrope.prologue(q, k, v, **call)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    written = _host(backend, cache.k) != CANARY
    assert written[1, 1].all()  # slot 5: page 1, offset 1
    written[1, 1] = False
    assert not written.any()
    np.testing.assert_array_equal(_host(backend, cache.v)[1, 1], _host(backend, v)[0, :, 0])
    assert out.k is not None


def test_views_of_a_packed_projection_and_a_strided_cache(torch_backend: Backend) -> None:
    """q, k and v as views of one packed qkv projection (batch, seq, heads, head_dim), each
    strided, and a cache that is a view into a wider buffer: read and written through their
    strides, as the steps apart read and write them."""
    backend = torch_backend
    heads, kv, dim = HEADS, KV_HEADS, 64
    packed = _array(backend, 3 * RNG.standard_normal((BATCH, SEQ, (heads + 2 * kv) * dim)), "bfloat16")
    q = packed[..., : heads * dim].unflatten(-1, (heads, dim))
    k = packed[..., heads * dim : (heads + kv) * dim].unflatten(-1, (kv, dim))
    v = packed[..., (heads + kv) * dim :].unflatten(-1, (kv, dim))
    assert not q.is_contiguous()
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(dim), "bfloat16")
    norm = anyrope.QKNorm(weight, weight)
    rope = anyrope.RoPE(dim, layout="interleaved")

    def cache() -> Any:
        wide = _array(backend, np.full((BATCH, MAX_ROWS, kv, 2 * dim), CANARY), "bfloat16")
        return anyrope.KVCache(wide[..., :dim], wide[..., dim:], layout="bshd")

    def call(cache: Any) -> dict[str, Any]:
        return {
            "q": q,
            "k": k,
            "v": v,
            "rope": rope,
            "norm": norm,
            "seq_axis": -3,
            "offset": 4,
            "cache": cache,
        }

    fused, steps = _both(backend, call, cache)
    _assert_like_steps(backend, fused, steps, "bfloat16")


def test_q_and_k_whose_features_are_not_innermost(torch_backend: Backend) -> None:
    """q with its heads innermost in memory and k a stride-0 view of one head (expand): the
    kernel reads them through their strides and writes dense outputs (an output of q's own
    strides had no rows of contiguous features to write), within the steps' rounding."""
    backend = torch_backend
    dim = 64
    data = _array(backend, 3 * RNG.standard_normal((BATCH, HEADS, SEQ, dim)), "float32")
    q = data.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    k = data[:, :1].expand(BATCH, KV_HEADS, SEQ, dim)
    v = _array(backend, RNG.standard_normal((BATCH, KV_HEADS, SEQ, dim)), "float32")
    weight = _array(backend, 1 + 0.1 * RNG.standard_normal(dim), "float32")

    def call(cache: Any) -> dict[str, Any]:
        norm = anyrope.QKNorm(weight, weight)
        return {"q": q, "k": k, "v": v, "rope": anyrope.RoPE(dim), "norm": norm, "offset": 3, "cache": cache}

    fused, steps = _both(backend, call, lambda: _cache(backend, "bhsd", "float32", dim))
    _assert_like_steps(backend, fused, steps, "float32")
