"""Dask arrays beyond the shared suite: every call form stays lazy (a scheduler that raises on
compute proves it), keeps x's chunks, sends each chunk through the NumPy kernels, splits no
pair, and runs on a real cluster of worker processes."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope.scaling import DynamicNTK, YaRN

from harness import Backend

pytestmark = pytest.mark.backends("dask")
RNG = np.random.default_rng(11)


@pytest.fixture
def da(backend: Backend) -> Any:
    import dask.array

    return dask.array


def _no_compute(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the graph was computed during the call")


@contextlib.contextmanager
def lazy() -> Iterator[None]:
    import dask

    with dask.config.set(scheduler=_no_compute):
        yield


def _chunked(da: Any, a: np.ndarray, chunks: Any) -> Any:
    return da.from_array(a, chunks=chunks)


X = RNG.standard_normal((4, 3, 10, 16)).astype(np.float32)  # (batch, heads, seq, head_dim)
CHUNKS = (2, 1, 3, 16)
STARTS = np.array([0, 7, 300, 5])
PER_ROW = RNG.integers(0, 4096, size=(4, 10))
STREAMS = RNG.integers(0, 64, size=(3, 4, 10))
CALLS: dict[str, tuple[Any, Any, Any]] = {
    # name: (RoPE, the call on dask arrays, the same call on NumPy arrays)
    "offset": (anyrope.RoPE(16), lambda da: {"offset": 9}, {"offset": 9}),
    "per-row offsets": (
        anyrope.RoPE(16, layout="interleaved"),
        lambda da: {"offset": _chunked(da, STARTS, 3)},
        {"offset": STARTS},
    ),
    "positions": (
        anyrope.RoPE(16, rotary_dim=10),
        lambda da: {"positions": da.arange(10, chunks=4) * 5},
        {"positions": np.arange(10) * 5},
    ),
    "per-row positions": (
        anyrope.RoPE(16, scaling=YaRN(4.0, original_max_position=64)),
        lambda da: {"positions": _chunked(da, PER_ROW, (3, 4))},
        {"positions": PER_ROW},
    ),
    "m-rope": (
        anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True),
        lambda da: {"positions": _chunked(da, STREAMS, (1, 2, 3))},
        {"positions": STREAMS},
    ),
    "dynamic ntk": (
        anyrope.RoPE(16, scaling=DynamicNTK(2.0, original_max_position=8)),
        lambda da: {"positions": _chunked(da, PER_ROW, (1, 5))},
        {"positions": PER_ROW},
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_every_call_form_is_lazy_and_keeps_chunks(da: Any, name: str) -> None:
    rope, dask_call, numpy_call = CALLS[name]
    q = _chunked(da, X, CHUNKS)
    k = _chunked(da, X[:, :1] * 2, (1, 1, 4, 16))  # other heads, other chunks
    with lazy():
        got_q, got_k = rope(q, k, **dask_call(da))
    assert got_q.chunks == q.chunks
    assert got_k.chunks == k.chunks
    want_q, want_k = rope(X, X[:, :1] * 2, **numpy_call)
    np.testing.assert_array_equal(got_q.compute(), want_q)
    np.testing.assert_array_equal(got_k.compute(), want_k)


def test_tables_and_xpos_are_lazy(da: Any) -> None:
    rope = anyrope.RoPE(16)
    x = _chunked(da, X, CHUNKS)
    cos, sin = rope.cos_sin(np.arange(10), like=X)
    with lazy():
        applied = anyrope.apply(x, _chunked(da, cos, (4, 8)), _chunked(da, sin, (4, 8)), inverse=True)
        q, k = anyrope.RoPE(16, xpos_scale_base=64.0)(x, x, offset=3)
    np.testing.assert_array_equal(applied.compute(), anyrope.apply(X, cos, sin, inverse=True))
    want_q, want_k = anyrope.RoPE(16, xpos_scale_base=64.0)(X, X, offset=3)
    np.testing.assert_array_equal(q.compute(), want_q)
    np.testing.assert_array_equal(k.compute(), want_k)


def test_a_split_head_is_joined_along_its_axis_only(da: Any) -> None:
    """A pair spans the feature axis: split features are joined for the rotation and split back."""
    rope = anyrope.RoPE(16)
    x = _chunked(da, X, (2, 3, 5, (6, 10)))
    with lazy():
        out = rope(x, offset=4)
    assert out.chunks == x.chunks
    np.testing.assert_array_equal(out.compute(), rope(X, offset=4))


def test_unknown_chunk_sizes_get_a_clear_error(da: Any) -> None:
    x = _chunked(da, X, CHUNKS)
    unknown = x[x[:, 0, 0, 0] > -10]  # boolean indexing: chunk sizes unknown until computed
    with lazy(), pytest.raises(ValueError, match=r"compute_chunk_sizes\(\) first"):
        anyrope.RoPE(16)(unknown)


def test_chunks_go_through_the_numpy_kernels(da: Any) -> None:
    """Each NumPy chunk is rotated by the registry's first NumPy kernel (numba where installed),
    not the generic formula, under the kernel switch of the call that built the graph (a
    stand-in that counts its runs, here); the result is held to the generic one."""
    fast = next(k for k in anyrope.kernels() if "numpy" in k.libraries and k.available)
    taken: list[tuple[int, ...]] = []

    def counted(job: Any) -> Any:
        launch = fast.prepare(job)

        def run(x: Any, out: Any, source: Any) -> Any:
            taken.append(tuple(x.shape))
            return launch(x, out, source)

        return run

    rope = anyrope.RoPE(
        16, layout="interleaved" if "interleaved" in fast.layouts and "half" not in fast.layouts else "half"
    )
    x = _chunked(da, X, CHUNKS)
    with anyrope.use_fast_paths(dataclasses.replace(fast, prepare=counted)):
        lazy_result = rope(x, offset=[1, 2, 3, 4])
    got = lazy_result.compute(scheduler="sync")  # the blocks run after the with block
    assert sorted(taken) == sorted(tuple(map(len, block)) for block in _blocks(x.chunks))
    with anyrope.use_fast_paths(False):
        want = rope(X, offset=[1, 2, 3, 4])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _blocks(chunks: tuple[tuple[int, ...], ...]) -> Iterator[tuple[range, ...]]:
    import itertools

    for sizes in itertools.product(*chunks):
        yield tuple(range(s) for s in sizes)


def test_on_a_cluster_of_worker_processes(da: Any) -> None:
    """dask.distributed's LocalCluster with two worker processes: the rope object, the graph and
    the positions travel to the workers by pickle, and the result is NumPy's."""
    distributed = pytest.importorskip("distributed")
    rope = anyrope.RoPE(16, scaling=YaRN(4.0, original_max_position=64), layout="interleaved")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        x = _chunked(da, X, CHUNKS)
        positions = _chunked(da, PER_ROW, (2, 5))
        got = client.compute(rope(x, positions=positions)).result()
    np.testing.assert_array_equal(got, rope(X, positions=PER_ROW))
