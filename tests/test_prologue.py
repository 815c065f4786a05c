"""anyrope.QKNorm and anyrope.prologue on every backend: the norm against a float64 NumPy oracle,
the prologue against its two steps bit for bit (eagerly and compiled), and bad input named.
Against the models' own norm modules: tests/peers/test_prologue_peers.py."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope._compat import environment

from harness import (
    Backend,
    assert_close,
    assert_prologue_same,
    assert_same,
    count_prologue_checks,
    prologue_exact,
)

# How families normalise q and k: the weight's shape ("head": (head_dim,), "heads": one per
# head, "token": across every head of a token), the rounding and the weight's offset.
FAMILIES = {
    "qwen3": ("head", "before_weight", 0.0),
    "gemma3": ("head", "after_weight", 1.0),
    "olmo2": ("token", "after_weight", 0.0),
    "per-head": ("heads", "before_weight", 0.5),
}
HEADS, KV_HEADS, SEQ, HEAD_DIM = 4, 2, 5, 16
RNG = np.random.default_rng(11)


def _shape(heads: int, seq_axis: int) -> tuple[int, ...]:
    return (2, heads, SEQ, HEAD_DIM) if seq_axis == -2 else (2, SEQ, heads, HEAD_DIM)


def _weights(kind: str, heads: int) -> np.ndarray:
    shape = {"head": (HEAD_DIM,), "heads": (heads, HEAD_DIM), "token": (heads * HEAD_DIM,)}[kind]
    return 1.0 + 0.25 * RNG.standard_normal(shape)


def _norm(backend: Backend, family: str, dtype: str) -> tuple[anyrope.QKNorm, np.ndarray, np.ndarray]:
    kind, rounding, offset = FAMILIES[family]
    q_w, k_w = _weights(kind, HEADS), _weights(kind, KV_HEADS)
    norm = anyrope.QKNorm(
        backend.asarray(q_w, dtype), backend.asarray(k_w, dtype), eps=1e-5, offset=offset,
        across_heads=kind == "token", rounding=rounding,
    )  # fmt: skip
    return norm, q_w, k_w


def oracle(
    x: np.ndarray, weight: np.ndarray, seq_axis: int, *, eps: float, offset: float, across: bool
) -> np.ndarray:
    """The RMS norm in float64: x / sqrt(mean(x^2) + eps) * (weight + offset), the mean over a
    head's features, or over every head's of a token (``across``)."""
    x = x.astype(np.float64)
    head_axis = -3 if seq_axis == -2 else -2
    squares = np.mean(x * x, axis=(head_axis, -1) if across else -1, keepdims=True)
    w = np.asarray(weight, dtype=np.float64) + offset
    if w.ndim == 2 or across:
        w = w.reshape((x.shape[head_axis], *(1,) * (-head_axis - 2), HEAD_DIM))
    return x / np.sqrt(squares + eps) * w


@pytest.mark.parametrize("seq_axis", [-2, -3])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_qk_norm_matches_the_oracle(backend: Backend, dtype: str, family: str, seq_axis: int) -> None:
    kind, _, offset = FAMILIES[family]
    norm, q_w, k_w = _norm(backend, family, dtype)
    for heads, weight, step in ((HEADS, q_w, norm.q), (KV_HEADS, k_w, norm.k)):
        data = 3.0 * RNG.standard_normal(_shape(heads, seq_axis))
        x = backend.asarray(data, dtype)
        got = step(x, seq_axis=seq_axis)
        assert got.dtype == x.dtype
        rounded_weight = backend.to_numpy(backend.asarray(weight, dtype))
        want = oracle(
            backend.to_numpy(x), rounded_weight, seq_axis, eps=1e-5, offset=offset, across=kind == "token"
        )
        assert_close(backend, got, want, dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_prologue_is_its_two_steps(backend: Backend, dtype: str, layout: str, family: str) -> None:
    """prologue(q, k, v) equals rope(norm.q(q), norm.k(k)) bit for bit and hands v back; with
    per-row positions and an int offset, partial rotary."""
    _compare(backend, dtype, layout, family, "eager")


@pytest.mark.dtypes("float32", "bfloat16")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("family", ["qwen3", "olmo2"])  # each rounding, per head and per token
def test_compiled_prologue_is_its_two_steps(
    backend: Backend, dtype: str, layout: str, family: str, mode: str
) -> None:
    """Compiled, the prologue and its two steps are one graph (the same code, bit for bit), and
    within the dtype's rounding of the eager steps (a compiler sums the squares in an order of
    its own)."""
    _compare(backend, dtype, layout, family, mode)


def _compare(backend: Backend, dtype: str, layout: str, family: str, mode: str) -> None:
    norm, _, _ = _norm(backend, family, dtype)
    rope = anyrope.RoPE(HEAD_DIM, rotary_dim=12, layout=layout)
    q = backend.asarray(RNG.standard_normal(_shape(HEADS, -2)), dtype)
    k = backend.asarray(RNG.standard_normal(_shape(KV_HEADS, -2)), dtype)
    v = backend.asarray(RNG.standard_normal(_shape(KV_HEADS, -2)), dtype)
    positions = backend.asarray(np.array([[3, 4, 5, 6, 7], [90, 91, 92, 93, 94]]))
    # compiled: device positions, the traced form (int offsets are the rotation's own tests')
    forms = ({"positions": positions}, {"offset": 7}) if mode == "eager" else ({"positions": positions},)
    for where in forms:

        def fused(q: Any, k: Any, v: Any, where: dict[str, Any] = where) -> Any:
            return tuple(anyrope.prologue(q, k, v, rope=rope, norm=norm, **where))

        def steps(q: Any, k: Any, where: dict[str, Any] = where) -> Any:
            return rope(norm.q(q), norm.k(k), **where)

        got_q, got_k, got_v, cache = backend.compile(fused, mode)(q, k, v)
        want_q, want_k = backend.compile(steps, mode)(q, k)
        assert cache is None
        same_as_steps(backend, got_q, want_q, dtype)
        same_as_steps(backend, got_k, want_k, dtype)
        np.testing.assert_array_equal(backend.to_numpy(got_v), backend.to_numpy(v))
        if mode != "eager":
            for got, want in zip((got_q, got_k), steps(q, k), strict=True):
                assert_close(backend, got, backend.to_numpy(want), dtype)


def same_as_steps(backend: Backend, got: Any, want: Any, dtype: str) -> None:
    """A prologue's q or k as its steps apart's: bit for bit (or as the backend's declared
    deviations allow), but where a fusion that sums squares in its own order takes the call."""
    if prologue_exact(backend.name, environment(backend.xp, backend.device).device_type):
        assert_same(backend, got, want, dtype)
    else:
        assert_prologue_same(backend.to_numpy(got), backend.to_numpy(want), dtype, exact=False)


def test_prologue_without_norm_or_k(backend: Backend) -> None:
    """No norm: the rotation alone; q alone: k and v None."""
    rope = anyrope.RoPE(HEAD_DIM)
    q = backend.asarray(RNG.standard_normal(_shape(HEADS, -3)), "float32")
    out = anyrope.prologue(q, rope=rope, offset=4, seq_axis=-3)
    assert (out.k, out.v, out.cache) == (None, None, None)
    assert_same(backend, out.q, rope(q, offset=4, seq_axis=-3), "float32")


def test_prologue_names_bad_input() -> None:
    rope = anyrope.RoPE(HEAD_DIM)
    ones = np.ones(HEAD_DIM, np.float32)
    norm = anyrope.QKNorm(ones, ones)
    q = np.zeros(_shape(HEADS, -2), np.float32)
    k = np.zeros(_shape(KV_HEADS, -2), np.float32)
    with pytest.raises(TypeError, match=r"rope must be an anyrope\.RoPE, not dict"):
        anyrope.prologue(q, rope={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"norm must be an anyrope\.QKNorm or None, not function"):
        anyrope.prologue(q, rope=rope, norm=lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="v was given without k"):
        anyrope.prologue(q, v=k, rope=rope)
    with pytest.raises(ValueError, match=r"v has shape \(2, 4, 5, 16\) but k has \(2, 2, 5, 16\)"):
        anyrope.prologue(q, k, q, rope=rope)
    with pytest.raises(ValueError, match=r"k_weight has shape \(16,\), but k of shape \(2, 2, 5, 8\)"):
        anyrope.prologue(q, k[..., :8], rope=rope, norm=norm)
    per_head = anyrope.QKNorm(np.ones((HEADS, HEAD_DIM), np.float32), np.ones((3, HEAD_DIM), np.float32))
    with pytest.raises(ValueError, match=r"k_weight has shape \(3, 16\), but k .* needs \(2, 16\)"):
        anyrope.prologue(q, k, rope=rope, norm=per_head)
    with pytest.raises(ValueError, match="has no head axis a QKNorm can find"):
        per_head.q(np.zeros((SEQ, HEAD_DIM), np.float32))


def test_qk_norm_names_bad_arguments() -> None:
    ones = np.ones(HEAD_DIM, np.float32)
    with pytest.raises(ValueError, match=r"q_weight must have shape \(head_dim,\) or \(heads, head_dim\)"):
        anyrope.QKNorm(np.ones((1, 2, 3)), ones)
    with pytest.raises(ValueError, match=r"k_weight must have shape \(heads \* head_dim,\)"):
        anyrope.QKNorm(ones, np.ones((2, HEAD_DIM)), across_heads=True)
    with pytest.raises(ValueError, match="eps=0 must be a positive finite number"):
        anyrope.QKNorm(ones, ones, eps=0)
    with pytest.raises(ValueError, match="rounding='late' must be one of 'before_weight', 'after_weight'"):
        anyrope.QKNorm(ones, ones, rounding="late")
    with pytest.raises(TypeError, match="across_heads"):
        anyrope.QKNorm(ones, ones, across_heads=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="q_weight"):
        anyrope.QKNorm([1.0] * HEAD_DIM, ones)
    norm = anyrope.QKNorm(ones, ones)
    assert repr(norm) == (
        "QKNorm(q_weight (16,), k_weight (16,), eps=1e-06, offset=0.0, across_heads=False, "
        "rounding='before_weight')"
    )
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="q is a torch array but q_weight is a numpy array"):
        norm.q(torch.zeros(_shape(HEADS, -2)))
    # compiled too: dynamo reports the same error, not a failure to trace the library check
    torch._dynamo.reset()
    compiled = torch.compile(norm.q, fullgraph=True)
    with pytest.raises((TypeError, torch._dynamo.exc.Unsupported), match="but q_weight is a numpy array"):
        compiled(torch.zeros(_shape(HEADS, -2)))


# The KV cache: the layouts' shapes (batch 2, KV_HEADS heads, 12 rows or 6 pages of 4 slots),
# and each token's place: rows, or flat slots of a paged cache, -1 skipped.
CACHES = {
    "bhsd": (2, KV_HEADS, 12, HEAD_DIM),
    "bshd": (2, 12, KV_HEADS, HEAD_DIM),
    "paged_nhd": (6, 4, KV_HEADS, HEAD_DIM),
    "paged_hnd": (6, KV_HEADS, 4, HEAD_DIM),
}
PLACES = {"rows": [[2, -1, 4, 5, 11], [0, 1, -1, -1, 3]], "slots": [[0, 23, -1, 7, 8], [-1, 4, 5, 6, 1]]}
CANARY = 7.0
WRITERS = ("numpy", "cupy", "torch", "mlx", "jax")


def _expected_cache(layout: str, k: np.ndarray, places: np.ndarray, dim: int) -> np.ndarray:
    """The canary cache with each token's k (batch, heads, seq, dim) written at its place."""
    out = np.full((*CACHES[layout][:-1], dim), CANARY)
    for b in range(k.shape[0]):
        for t in range(k.shape[2]):
            p = int(places[b, t])
            if p < 0:
                continue
            for h in range(k.shape[1]):
                where = {
                    "bhsd": (b, h, p), "bshd": (b, p, h), "paged_nhd": (p // 4, p % 4, h), "paged_hnd": (p // 4, h, p % 4),
                }[layout]  # fmt: skip
                out[where] = k[b, h, t]
    return out


@pytest.mark.parametrize("given", ["positions", "offset", "cache_index", "nothing written"])
@pytest.mark.parametrize("layout", list(CACHES))
def test_prologue_writes_the_cache(backend: Backend, mode: str, layout: str, given: str) -> None:
    """Every token's rotated k and its v land at its place (its position, or cache_index; paged
    caches by slot), and every other slot keeps the canary, skipped tokens' included; in place
    where the library writes in place (eagerly), into a new cache for JAX; compiled as eagerly."""
    if backend.name not in WRITERS:
        pytest.skip(f"{backend.name} arrays are not written by index (test_cache_names_bad_input)")
    paged = layout.startswith("paged")
    if given in ("positions", "offset") and paged:
        pytest.skip("a paged cache is addressed by cache_index")
    rope = anyrope.RoPE(HEAD_DIM, rotary_dim=12)
    dtype = "float32"
    q = backend.asarray(RNG.standard_normal(_shape(HEADS, -2)), dtype)
    k = backend.asarray(RNG.standard_normal(_shape(KV_HEADS, -2)), dtype)
    v = backend.asarray(RNG.standard_normal((2, KV_HEADS, SEQ, 6)), dtype)
    positions = np.array([[3, 4, 5, 6, 7], [6, 7, 8, 9, 10]])
    offset = 4  # every row's tokens to rows 4, 5, ...: the write by slicing, where the host knows it
    if given == "offset":
        positions = np.broadcast_to(offset + np.arange(SEQ), (2, SEQ))
    places = {
        "positions": positions, "offset": positions, "cache_index": np.array(PLACES["slots" if paged else "rows"]),
        "nothing written": np.full((2, SEQ), -1),
    }[given]  # fmt: skip
    index = None if given in ("positions", "offset") else backend.asarray(places)
    k_cache = backend.asarray(np.full(CACHES[layout], CANARY), dtype)
    v_cache = backend.asarray(np.full((*CACHES[layout][:-1], 6), CANARY), dtype)

    def call(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, index: Any, positions: Any) -> Any:
        cache = anyrope.KVCache(k_cache, v_cache, layout=layout)
        if given == "offset":
            out = anyrope.prologue(q, k, v, rope=rope, offset=offset, cache=cache)
        else:
            out = anyrope.prologue(q, k, v, rope=rope, positions=positions, cache=cache, cache_index=index)
        return out.k, out.cache.k, out.cache.v

    called = backend.compile(call, mode)
    got_k, stored_k, stored_v = called(q, k, v, k_cache, v_cache, index, backend.asarray(positions))
    assert_same(
        backend, got_k, rope(k, positions=backend.asarray(positions)), dtype, compiled=mode != "eager"
    )
    np.testing.assert_array_equal(
        backend.to_numpy(stored_k), _expected_cache(layout, backend.to_numpy(got_k), places, HEAD_DIM)
    )
    np.testing.assert_array_equal(
        backend.to_numpy(stored_v), _expected_cache(layout, backend.to_numpy(v), places, 6)
    )
    if mode == "eager" and backend.name != "jax":  # written in place: the caller's arrays
        np.testing.assert_array_equal(backend.to_numpy(k_cache), backend.to_numpy(stored_k))


@pytest.mark.parametrize("layout", ["bshd", "paged_hnd"])
def test_places_past_the_cache_are_skipped_where_no_host_reads_them(
    backend: Backend, mode: str, layout: str
) -> None:
    """Where the places are not read on the host (JAX and MLX arrays, GPUs, a compiler's trace),
    no check can refuse a place past the cache: it is skipped as a negative one is, the other
    tokens written and every other slot keeping the canary (MLX's scatter wrote out of bounds,
    torch's compiled one raised from generated code, a GPU's asserts on the device)."""
    if backend.name not in WRITERS:
        pytest.skip(f"{backend.name} arrays are not written by index (test_cache_names_bad_input)")
    if backend.host_values and mode == "eager":
        pytest.skip("host values: a place past the cache is refused (test_cache_names_bad_input)")
    rope, dtype = anyrope.RoPE(HEAD_DIM), "float32"
    q = backend.asarray(RNG.standard_normal(_shape(HEADS, -2)), dtype)
    k, v = (backend.asarray(RNG.standard_normal(_shape(KV_HEADS, -2)), dtype) for _ in "kv")
    capacity = 24 if layout.startswith("paged") else 12
    places = np.array([[2, capacity, 4, -1, 9], [capacity + 40, 1, 3, 0, capacity - 1]])
    k_cache, v_cache = (backend.asarray(np.full(CACHES[layout], CANARY), dtype) for _ in "kv")

    def call(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, index: Any) -> Any:
        cache = anyrope.KVCache(k_cache, v_cache, layout=layout)
        out = anyrope.prologue(q, k, v, rope=rope, offset=3, cache=cache, cache_index=index)
        return out.k, out.cache.k, out.cache.v

    got_k, stored_k, stored_v = backend.compile(call, mode)(
        q, k, v, k_cache, v_cache, backend.asarray(places)
    )
    kept = np.where(places < capacity, places, -1)
    np.testing.assert_array_equal(
        backend.to_numpy(stored_k), _expected_cache(layout, backend.to_numpy(got_k), kept, HEAD_DIM)
    )
    np.testing.assert_array_equal(
        backend.to_numpy(stored_v), _expected_cache(layout, backend.to_numpy(v), kept, HEAD_DIM)
    )


@pytest.mark.backends("numpy", "torch")
def test_a_cache_that_cannot_be_written_is_refused_before_any_write(backend: Backend) -> None:
    """A read-only NumPy cache, a stride-0 view, a torch leaf that requires grad: refused naming
    the array, with nothing written (v's refusal used to come after k's write), on the fused
    path and the steps apart, and after a call of the same shapes kept its plan."""
    rope = anyrope.RoPE(HEAD_DIM)
    weight = backend.asarray(np.ones(HEAD_DIM), "float32")
    norm = anyrope.QKNorm(weight, weight)
    q = backend.asarray(RNG.standard_normal(_shape(HEADS, -2)), "float32")
    k, v = (backend.asarray(RNG.standard_normal(_shape(KV_HEADS, -2)), "float32") for _ in "kv")

    def fresh() -> tuple[Any, Any]:
        return tuple(backend.asarray(np.full(CACHES["bhsd"], CANARY), "float32") for _ in "kv")  # type: ignore[return-value]

    spoiled: list[tuple[str, Any]] = []
    if backend.name == "numpy":
        read_only = fresh()[1]
        read_only.setflags(write=False)
        spoiled.append(("cache.v is read-only", read_only))  # broadcast_to's views are too
    else:
        spoiled.append(("cache.v is a leaf tensor that requires grad", fresh()[1].requires_grad_()))
        spoiled.append(("cache.v has a stride-0 axis", fresh()[1][:1].expand(CACHES["bhsd"])))
    for switch in (True, False):
        with anyrope.use_fast_paths(switch):
            anyrope.prologue(q, k, v, rope=rope, norm=norm, offset=2, cache=anyrope.KVCache(*fresh()))  # kept
            for message, bad_v in spoiled:
                k_cache = fresh()[0]
                with pytest.raises(ValueError, match=message):
                    anyrope.prologue(
                        q, k, v, rope=rope, norm=norm, offset=2, cache=anyrope.KVCache(k_cache, bad_v)
                    )
                np.testing.assert_array_equal(backend.to_numpy(k_cache), np.full(CACHES["bhsd"], CANARY))


def test_cache_names_bad_input(backend: Backend) -> None:
    """Each mistake is named before anything is written: the canary cache stays as it was."""
    if backend.name not in WRITERS:
        with pytest.raises(TypeError, match="a KVCache is written by index"):
            anyrope.KVCache(backend.asarray(np.zeros((1, 1, 1, 2))), backend.asarray(np.zeros((1, 1, 1, 2))))
        return
    rope = anyrope.RoPE(HEAD_DIM)
    k = backend.asarray(np.ones(_shape(KV_HEADS, -2)), "float32")
    k_cache = backend.asarray(np.full(CACHES["bhsd"], CANARY), "float32")
    cache = anyrope.KVCache(k_cache, backend.asarray(np.full(CACHES["bhsd"], CANARY), "float32"))
    paged = anyrope.KVCache(
        backend.asarray(np.full(CACHES["paged_nhd"], CANARY), "float32"),
        backend.asarray(np.full(CACHES["paged_nhd"], CANARY), "float32"),
        layout="paged_nhd",
    )
    cases = [
        ({"cache": cache}, ValueError, "cache= writes k and v: pass both"),
        ({"cache": paged, "v": k}, ValueError, "a paged cache needs cache_index"),
        ({"cache_index": [0] * SEQ, "v": k}, ValueError, "cache_index was given without a cache"),
        ({"cache": cache, "v": k, "offset": 9}, ValueError, r"offset reaches 13, past the cache's 12 rows"),
        (
            {"cache": paged, "v": k, "cache_index": [[0, 1, 2, 3, 24]] * 2},
            ValueError,
            "past the cache's 24 slots",
        ),
        ({"cache": paged, "v": k, "cache_index": [0, 1, 2, 3, 4]}, ValueError, "would send every row of k"),
        (
            {"cache": cache, "v": k, "cache_index": [1, 2]},
            ValueError,
            r"cache_index of shape \(2,\) names no place",
        ),
        ({"cache": {}, "v": k}, TypeError, "cache must be an anyrope.KVCache or None, not dict"),
    ]
    if not backend.host_values:
        cases = [c for c in cases if "past the cache" not in c[2]]  # nothing reads them there
    for extra, error, message in cases:
        with pytest.raises(error, match=message):
            anyrope.prologue(k, k, rope=rope, **extra)
    other = backend.asarray(np.ones((2, 3, SEQ, HEAD_DIM)), "float32")
    with pytest.raises(ValueError, match=r"cannot hold k of shape \(2, 3, 5, 16\): 3 heads of 16 features"):
        anyrope.prologue(other, other, other, rope=rope, cache=cache)
    if "float64" in backend.dtypes:
        wide = backend.asarray(np.ones(_shape(KV_HEADS, -2)), "float64")
        with pytest.raises(TypeError, match=r"the cache's k is .*float32 but k is .*float64"):
            anyrope.prologue(wide, wide, wide, rope=rope, cache=cache)
    mrope = anyrope.RoPE(HEAD_DIM, mrope_section=[2, 3, 3])
    with pytest.raises(ValueError, match=r"several position streams .* pass cache_index"):
        anyrope.prologue(k, k, k, rope=mrope, cache=cache)
    np.testing.assert_array_equal(backend.to_numpy(k_cache), np.full(CACHES["bhsd"], CANARY))


def test_prologue_takes_views_of_one_packed_projection(backend: Backend) -> None:
    """q, k and v as views of one projection's output, (batch, seq, (heads + 2 kv_heads) *
    head_dim) split and viewed as (batch, seq, heads, head_dim): the same results and cache as
    from contiguous copies, with partial rotary."""
    if backend.name not in WRITERS:
        pytest.skip(f"{backend.name} arrays are not written by index")
    xp = backend.xp
    rope = anyrope.RoPE(HEAD_DIM, rotary_dim=10)
    norm, _, _ = _norm(backend, "qwen3", "float32")
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    packed = backend.asarray(RNG.standard_normal((2, SEQ, width)), "float32")
    cuts = (HEADS * HEAD_DIM, (HEADS + KV_HEADS) * HEAD_DIM)
    views = [
        xp.reshape(packed[..., a:b], (2, SEQ, b // HEAD_DIM - a // HEAD_DIM, HEAD_DIM))
        for a, b in ((0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], width))
    ]
    copies = [backend.asarray(backend.to_numpy(view), "float32") for view in views]
    results = []
    for q, k, v in (views, copies):
        cache = anyrope.KVCache(
            backend.asarray(np.full(CACHES["bshd"], CANARY), "float32"),
            backend.asarray(np.full(CACHES["bshd"], CANARY), "float32"),
            layout="bshd",
        )
        out = anyrope.prologue(q, k, v, rope=rope, norm=norm, offset=3, seq_axis=-3, cache=cache)
        results.append([backend.to_numpy(a) for a in (out.q, out.k, out.cache.k, out.cache.v)])
    for got, want in zip(*results, strict=True):
        np.testing.assert_array_equal(got, want)


def test_prologue_replays_in_a_cuda_graph(backend: Backend) -> None:
    """Captured once with device positions and a cache, replayed with new positions written into
    the same tensor: the steps apart's q, k and cache (as close as the fused call is to them: see
    same_as_steps), with no host read inside."""
    if backend.name != "torch" or backend.device_kind != "cuda":
        pytest.skip("CUDA graphs need torch on a CUDA device")
    import torch

    rope = anyrope.RoPE(HEAD_DIM)
    norm, _, _ = _norm(backend, "gemma3", "bfloat16")
    q = backend.asarray(RNG.standard_normal((4, HEADS, 1, HEAD_DIM)), "bfloat16")
    k = backend.asarray(RNG.standard_normal((4, KV_HEADS, 1, HEAD_DIM)), "bfloat16")
    rows = torch.tensor([[0], [5], [9], [11]], device=q.device)
    caches = [torch.zeros(4, KV_HEADS, 12, HEAD_DIM, device=q.device, dtype=torch.bfloat16) for _ in range(2)]
    cache = anyrope.KVCache(*caches)

    def step() -> Any:
        return anyrope.prologue(q, k, k, rope=rope, norm=norm, positions=rows, cache=cache)

    step()  # warm: compile the kernel, cache the constants
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for new in ([[1], [2], [3], [4]], [[11], [0], [7], [10]]):
        rows.copy_(torch.tensor(new))
        graph.replay()
        want_k = rope(norm.k(k), positions=rows)
        same_as_steps(backend, captured.q, rope(norm.q(q), positions=rows), "bfloat16")
        same_as_steps(backend, captured.k, want_k, "bfloat16")
        for b, (r,) in enumerate(new):
            same_as_steps(backend, caches[0][b, :, r], want_k[b, :, 0], "bfloat16")


@pytest.mark.backends("jax")
def test_jax_writes_a_donated_cache() -> None:
    """Under jax.jit with the cache's arrays donated, a decode loop writes each step's row into
    the buffers it was given back (no copy of the cache a step, where the platform takes
    donations) and equals the eager calls; the rows not written keep the canary."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rope = anyrope.RoPE(HEAD_DIM)
    f32 = jnp.float32  # with x64 on, JAX's default is float64
    norm = anyrope.QKNorm(jnp.ones(HEAD_DIM, dtype=f32), jnp.full(HEAD_DIM, 0.5, dtype=f32))

    def step(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, offset: Any) -> Any:
        cache = anyrope.KVCache(k_cache, v_cache)
        out = anyrope.prologue(q, k, v, rope=rope, norm=norm, offset=offset, cache=cache)
        return out.q, out.cache.k, out.cache.v

    jitted = jax.jit(step, donate_argnums=(3, 4))
    shape = (2, KV_HEADS, 8, HEAD_DIM)
    k_cache, v_cache = jnp.full(shape, CANARY, dtype=f32), jnp.full(shape, CANARY, dtype=f32)
    eager_k, eager_v = np.full(shape, CANARY, np.float32), np.full(shape, CANARY, np.float32)
    for offset in range(3):
        q = jnp.asarray(RNG.standard_normal((2, HEADS, 1, HEAD_DIM)), jnp.float32)
        k, v = (jnp.asarray(RNG.standard_normal((2, KV_HEADS, 1, HEAD_DIM)), jnp.float32) for _ in "kv")
        given, pointer = k_cache, k_cache.unsafe_buffer_pointer()
        got_q, k_cache, v_cache = jitted(q, k, v, k_cache, v_cache, offset)
        # JAX 0.6 and later take donations on CPUs as on GPUs: the step writes the buffer given
        assert given.is_deleted() or jax.__version_info__ < (0, 6)
        if given.is_deleted():
            assert k_cache.unsafe_buffer_pointer() == pointer
        want_q, eager_k, eager_v = step(q, k, v, jnp.asarray(eager_k), jnp.asarray(eager_v), offset)
        np.testing.assert_allclose(np.asarray(got_q), np.asarray(want_q), rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(np.asarray(k_cache), np.asarray(eager_k), rtol=2e-6, atol=2e-6)
        np.testing.assert_array_equal(np.asarray(v_cache), np.asarray(eager_v))
    assert (np.asarray(k_cache)[:, :, 3:] == CANARY).all()


@pytest.mark.backends("mlx")
@pytest.mark.parametrize("given", ["cache_index", "positions"])
def test_mlx_writes_device_places_in_place(backend: Backend, given: str) -> None:
    """Places given as MLX arrays (read nowhere on the host): the write's graph reads no value of
    the cache (no gather), which MLX needs to write the cache's buffer in place, where it copied
    all of it a call before (0.5 s a decode step of a 4096-row cache); the rows as the steps say."""
    import mlx.core as mx

    rope = anyrope.RoPE(HEAD_DIM)
    q, k, v = (
        backend.asarray(RNG.standard_normal((2, h, 1, HEAD_DIM)), "float32")
        for h in (HEADS, KV_HEADS, KV_HEADS)
    )
    cache = anyrope.KVCache(
        *(backend.asarray(np.full((2, KV_HEADS, 16, HEAD_DIM), CANARY), "float32") for _ in "kv")
    )
    mx.eval(cache.k, cache.v)
    rows = mx.array([[3], [9]])
    out = anyrope.prologue(q, k, v, rope=rope, cache=cache, **{given: rows})
    graph = io.StringIO()
    mx.export_to_dot(graph, cache.k, cache.v)
    assert "Gather" not in graph.getvalue()
    stored = np.asarray(cache.k)
    np.testing.assert_array_equal(stored[0, :, 3], np.asarray(out.k)[0, :, 0])
    np.testing.assert_array_equal(stored[1, :, 9], np.asarray(out.k)[1, :, 0])
    stored[0, :, 3] = stored[1, :, 9] = CANARY
    assert (stored == CANARY).all()


@pytest.mark.backends("numpy", "torch")
def test_kept_steps_apart_check_each_calls_places(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps apart, kept for a signature after its first call (its checks once), still check
    each call's places where they are host values: one past the cache is refused, nothing written."""
    if backend.device_kind != "cpu":
        pytest.skip("places are host values on the CPU only")
    checks = count_prologue_checks(monkeypatch)
    rope = anyrope.RoPE(HEAD_DIM)
    q = backend.asarray(RNG.standard_normal(_shape(HEADS, -2)), "float32")
    k, v = (backend.asarray(RNG.standard_normal(_shape(KV_HEADS, -2)), "float32") for _ in "kv")
    k_cache = backend.asarray(np.full(CACHES["bhsd"], CANARY), "float32")
    cache = anyrope.KVCache(k_cache, backend.asarray(np.full(CACHES["bhsd"], CANARY), "float32"))
    rows = CACHES["bhsd"][2]
    with anyrope.use_fast_paths(False):
        for start in (0, rows - SEQ):
            out = anyrope.prologue(
                q, k, v, rope=rope, cache=cache, cache_index=backend.asarray(start + np.arange(SEQ))
            )
        assert len(checks) == 1
        stored = backend.to_numpy(out.cache.k)
        past = backend.asarray(rows - SEQ + 1 + np.arange(SEQ))
        with pytest.raises(ValueError, match=f"cache_index reaches {rows}, past the cache"):
            anyrope.prologue(q, k, v, rope=rope, cache=cache, cache_index=past)
    np.testing.assert_array_equal(backend.to_numpy(cache.k), stored)
