"""JAX arrays sharded over a device mesh: RoPE is elementwise per token and feature pair, so
with positions sharded like their tokens the compiled program needs no communication at all.

Under ``jax.jit`` each call keeps its input's sharding, compiles to a program with no
collective, and equals the unsharded call bit for bit: over batch and heads (data and tensor
parallel), over the sequence (context parallel), also in a load-balanced order where each
device holds two distant chunks, and inside ``shard_map``; with meshes of explicit and of
automatic axes. Eager calls on sharded arrays work too.

They need 8 devices: on the CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=8``, which
the jax nox session sets.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope

from harness import Backend

COLLECTIVES = (
    "all-gather",
    "all-reduce",
    "collective-permute",
    "all-to-all",
    "reduce-scatter",
    "collective-broadcast",
)
pytestmark = pytest.mark.backends("jax")
RNG = np.random.default_rng(5)


@pytest.fixture
def jax(backend: Backend) -> Any:
    import jax

    if len(jax.devices()) < 8:
        pytest.skip(
            "needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 (nox -s tests-jax sets it)"
        )
    return jax


def _mesh(jax: Any, shape: tuple[int, ...], names: tuple[str, ...], axis_type: str) -> Any:
    kinds = getattr(jax.sharding, "AxisType", None)
    if kinds is None:
        pytest.skip("this JAX has no mesh axis types")
    kind = kinds.Explicit if axis_type == "explicit" else kinds.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))


def _put(jax: Any, mesh: Any, a: np.ndarray, *spec: Any) -> Any:
    return jax.device_put(a, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))


def _compiled(jax: Any, fn: Any, *args: Any) -> tuple[Any, str]:
    jitted = jax.jit(fn)
    return jitted(*args), jitted.lower(*args).compile().as_text()


def _check(jax: Any, fn: Any, sharded: tuple[Any, ...], plain: tuple[Any, ...]) -> None:
    """Same sharding out as in (per output, its input's), no collective, and the unsharded values."""
    got, program = _compiled(jax, fn, *sharded)
    found = [c for c in COLLECTIVES if c in program]
    assert not found, f"the compiled program communicates: {found}"
    want = jax.jit(fn)(*plain)
    for out, into, expected in zip(_tuple(got), sharded, _tuple(want), strict=False):
        assert out.sharding.is_equivalent_to(into.sharding, out.ndim), (out.sharding, into.sharding)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))


def _tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_batch_and_heads(jax: Any, axis_type: str) -> None:
    """Data and tensor parallel: q and k (other head counts) over batch and heads, one position
    row per sequence over the batch; and per-row offsets."""
    mesh = _mesh(jax, (2, 4), ("data", "model"), axis_type)
    rope = anyrope.RoPE(32, layout="interleaved")
    q = RNG.standard_normal((4, 8, 16, 32)).astype(np.float32)
    k = RNG.standard_normal((4, 4, 16, 32)).astype(np.float32)
    positions = RNG.integers(0, 5000, size=(4, 16))
    starts = np.array([0, 17, 900, 4])
    sq, sk = _put(jax, mesh, q, "data", "model"), _put(jax, mesh, k, "data", "model")
    _check(
        jax,
        lambda q, k, p: rope(q, k, positions=p),
        (sq, sk, _put(jax, mesh, positions, "data")),
        (q, k, positions),
    )
    _check(jax, lambda q, s: rope(q, offset=s), (sq, _put(jax, mesh, starts, "data")), (q, starts))


def _load_balanced(seq: int, devices: int) -> np.ndarray:
    """The token order of load-balanced context parallelism (causal attention): the sequence in
    2 x devices chunks, device d holding chunks d and 2 devices - 1 - d."""
    chunks = np.array_split(np.arange(seq), 2 * devices)
    return np.concatenate([np.concatenate([chunks[d], chunks[2 * devices - 1 - d]]) for d in range(devices)])


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_sequence_parallel_positions_travel_with_tokens(jax: Any, axis_type: str) -> None:
    mesh = _mesh(jax, (8,), ("seq",), axis_type)
    rope = anyrope.RoPE(64, rotary_dim=48)
    q = RNG.standard_normal((2, 4, 64, 64)).astype(np.float32)
    order = _load_balanced(64, 8)
    reordered, positions = q[:, :, order], (1000 + order).astype(np.int64)
    sharded = (_put(jax, mesh, reordered, None, None, "seq"), _put(jax, mesh, positions, "seq"))
    _check(jax, lambda q, p: rope(q, positions=p), sharded, (reordered, positions))
    # each token turned by its own position: the natural order's result, reordered
    got = np.asarray(jax.jit(lambda q, p: rope(q, positions=p))(*sharded))
    natural = jax.jit(lambda q: rope(q, offset=1000))(q)
    np.testing.assert_array_equal(got, np.asarray(natural)[:, :, order])
    # in natural order with an int offset, the positions made inside the program
    _check(jax, lambda q: rope(q, offset=7), (_put(jax, mesh, q, None, None, "seq"),), (q,))


def test_sequence_parallel_mrope(jax: Any) -> None:
    """M-RoPE's three position streams, sharded along the sequence with their tokens."""
    mesh = _mesh(jax, (8,), ("seq",), "explicit")
    rope = anyrope.RoPE(32, mrope_section=[8, 4, 4])
    q = RNG.standard_normal((1, 2, 32, 32)).astype(np.float32)
    positions = RNG.integers(0, 64, size=(3, 32))
    sharded = (_put(jax, mesh, q, None, None, "seq"), _put(jax, mesh, positions, None, "seq"))
    _check(jax, lambda q, p: rope(q, positions=p), sharded, (q, positions))


def test_shard_map(jax: Any) -> None:
    """Inside shard_map each device rotates its own tokens by its own positions."""
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        pytest.skip("this JAX has no jax.shard_map")
    mesh = _mesh(jax, (2, 4), ("data", "seq"), "explicit")
    spec = jax.sharding.PartitionSpec
    rope = anyrope.RoPE(32)
    q = RNG.standard_normal((4, 2, 32, 32)).astype(np.float32)
    positions = RNG.integers(0, 10_000, size=(4, 32))
    local = shard_map(
        lambda q, p: rope(q, positions=p),
        mesh=mesh,
        in_specs=(spec("data", None, "seq"), spec("data", "seq")),
        out_specs=spec("data", None, "seq"),
    )
    sharded = (_put(jax, mesh, q, "data", None, "seq"), _put(jax, mesh, positions, "data", "seq"))
    got, program = _compiled(jax, local, *sharded)
    assert not [c for c in COLLECTIVES if c in program]
    np.testing.assert_array_equal(
        np.asarray(got), np.asarray(jax.jit(lambda q, p: rope(q, positions=p))(q, positions))
    )


def test_eager_calls_on_sharded_arrays(jax: Any) -> None:
    """Without jit: what the call makes beside x is replicated over x's devices."""
    mesh = _mesh(jax, (2, 4), ("data", "model"), "auto")
    rope = anyrope.RoPE(32)
    q = RNG.standard_normal((4, 8, 16, 32)).astype(np.float32)
    positions = RNG.integers(0, 5000, size=(4, 16))
    got = rope(_put(jax, mesh, q, "data", "model"), positions=_put(jax, mesh, positions, "data"))
    want = rope(jax.numpy.asarray(q), positions=jax.numpy.asarray(positions))  # one device
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
