"""Bad inputs at every public entry point: the documented result, or a ValueError / TypeError
whose message names the argument, raised before anything is written (the inputs unchanged).

The first half pins the cases of issue 27 on every backend where they apply (fast and generic
paths); the second half throws generated values (hypothesis) at each entry point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import anyrope
from anyrope import scaling as sc

import oracle
from harness import Backend, assert_close, assert_same

FAST = pytest.mark.parametrize("fast", [True, False], ids=["fast", "generic"])


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


@contextmanager
def _refused(error: type[Exception] | tuple[type[Exception], ...], *names: str) -> Iterator[None]:
    """The block raises ``error`` and its message names one of ``names``."""
    with pytest.raises(error) as caught:
        yield
    assert any(name in str(caught.value) for name in names), f"{caught.value!r} names none of {names}"


def _exact(x: np.ndarray, positions: np.ndarray, rope: anyrope.RoPE) -> np.ndarray:
    """The half-layout rotation of x (batch, heads, seq, d) at (batch or 1, seq) positions, exactly."""
    cos, sin = oracle.exact_cos_sin(np.asarray(positions), np.asarray(rope.inv_freq))
    cos, sin = cos[:, None], sin[:, None]  # over the heads
    half = rope.rotary_dim // 2
    a, b = x[..., :half], x[..., half : 2 * half]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * half :]], axis=-1)


def _largest(backend: Backend) -> int:
    return int(np.iinfo(backend.index).max)


# --- issue 27, item 1: offsets past 2**53 on MLX (and everywhere) ------------------------------


@FAST
def test_offset_past_two_to_the_53_is_exact(backend: Backend, fast: bool) -> None:
    """MLX built positions with an arange that takes ints past int32 as doubles: offset=2**53
    gave an empty sequence axis (generic) or a reshape error (fused)."""
    rope, x_np = anyrope.RoPE(8), _x((2, 3, 2, 8))
    x = backend.asarray(x_np, "float32")
    rounded = backend.to_numpy(x).astype(np.float64)
    with anyrope.use_fast_paths(fast):
        for offset in (2**31 + 5, 2**53, 2**53 + 1):
            if offset + 1 > _largest(backend):  # JAX without x64: int32 positions
                with _refused(ValueError, "offset"):
                    rope(x, offset=offset)
                continue
            out = rope(x, offset=offset)
            positions = np.arange(offset, offset + 2, dtype=np.uint64)[None]
            assert_close(backend, out, _exact(rounded, positions, rope), "float32")


# --- issue 27, item 2: positions past the index dtype -------------------------------------------


@FAST
def test_offsets_past_the_index_dtype_name_offset(backend: Backend, fast: bool) -> None:
    """Never a wrapped position: per-row offsets, and one offset, whose last position passes the
    index dtype are refused naming offset; the last representable position is exact."""
    rope, top = anyrope.RoPE(8), _largest(backend)
    x_np = _x((2, 3, 4, 8))
    x = backend.asarray(x_np, "float32")
    with anyrope.use_fast_paths(fast):
        for offset in ([top - 2, 0], top, top - 2, [top, top]):
            with _refused(ValueError, "offset"):
                rope(x, offset=offset)
        if backend.host_values:  # host-known arrays
            with _refused(ValueError, "offset"):
                rope(x, offset=backend.asarray(np.array([top - 2, 0])))
        np.testing.assert_array_equal(backend.to_numpy(x), backend.to_numpy(backend.asarray(x_np, "float32")))
        one = backend.asarray(x_np[:, :, :1], "float32")
        rounded = backend.to_numpy(one).astype(np.float64)
        for offset in (top, [top, top - 1]):
            starts = np.array([offset] if isinstance(offset, int) else offset, dtype=np.uint64)[:, None]
            assert_close(backend, rope(one, offset=offset), _exact(rounded, starts, rope), "float32")


def test_shift_grid_and_packed_positions_past_the_index_dtype(backend: Backend) -> None:
    top = _largest(backend)
    rope = anyrope.RoPE(8)
    k = backend.asarray(_x((4, 8)), "float32")
    with _refused(ValueError, "shift"):
        anyrope.rerotate(k, rope, rope, offset=top - 10, shift=20)
    like = backend.asarray(np.zeros(1), "float32")
    with _refused(ValueError, "start"):
        anyrope.grid_positions((2, 3), start=top - 1, like=like)
    got = anyrope.grid_positions((2, 3), start=top - 2, like=like)
    assert int(backend.to_numpy(got).max()) == top
    if backend.host_values:  # offsets known on the host
        cu = backend.asarray(np.array([0, 3]))
        with _refused(ValueError, "offsets"):
            anyrope.packed_positions(cu, 4, offsets=backend.asarray(np.array([top - 2])))


# --- issue 27, item 4: real scalars of every type ----------------------------------------------


@pytest.mark.parametrize(
    "base", [np.float32(1e4), np.float64(1e4), np.int64(10_000), Fraction(10_000), 10_000]
)
def test_base_takes_every_real_scalar(base: Any) -> None:
    rope = anyrope.RoPE(8, base=base)
    assert type(rope.base) is float
    assert rope.base == 10_000.0
    assert rope.inv_freq == anyrope.RoPE(8, base=10_000.0).inv_freq


@pytest.mark.parametrize(
    ("value", "error"),
    [(10**400, ValueError), (-(10**400), ValueError), (np.bool_(True), TypeError), (True, TypeError),
     ("1e4", TypeError), (np.float64("nan"), ValueError), (np.longdouble("1e400"), ValueError)],
)  # fmt: skip
def test_base_refusals_name_base(value: Any, error: type[Exception]) -> None:
    with _refused(error, "base="):
        anyrope.RoPE(8, base=value)


# --- issue 27, item 5: scaling objects built in Python -----------------------------------------


NAN = math.nan


@pytest.mark.parametrize(
    ("make", "error", "name"),
    [
        (lambda: sc.YaRN(4.0, 2048, mscale=NAN, mscale_all_dim=1.0), ValueError, "mscale="),
        (lambda: sc.YaRN(4.0, 2048, mscale=-20.0, mscale_all_dim=1.0), ValueError, "mscale="),
        (lambda: sc.YaRN(4.0, 2048, mscale="x", mscale_all_dim=1.0), TypeError, "mscale="),
        (lambda: sc.YaRN(4.0, 2048, mscale=1.0, mscale_all_dim=math.inf), ValueError, "mscale_all_dim="),
        (lambda: sc.YaRN(4.0, 2048, truncate="false"), TypeError, "truncate="),
        (lambda: sc.YaRN(4.0, 2048, beta_fast=NAN), ValueError, "beta_fast="),
        (lambda: anyrope.RoPE(8, base=1.0, scaling=sc.YaRN(4.0, 2048)), ValueError, "base="),
        (lambda: anyrope.RoPE(8, base=0.5, scaling=sc.YaRN(4.0, 2048)), ValueError, "base="),
        (lambda: sc.Proportional(fraction="a"), TypeError, "fraction="),
        (lambda: sc.Proportional(fraction=NAN), ValueError, "fraction="),
        (lambda: sc.Proportional(fraction=-0.5), ValueError, "fraction="),
        (lambda: sc.LongRoPE(short_factor="1.0", long_factor=[1.0], original_max_position=8), TypeError,
         "short_factor"),
        (lambda: sc.LongRoPE([1.0], {"a": 1.0}, 8), TypeError, "long_factor"),
        (lambda: sc.LongRoPE([1.0], ["2"], 8), TypeError, "long_factor"),
        (lambda: sc.LongRoPE([1.0], [NAN], 8), ValueError, "long_factor"),
        (lambda: anyrope.RoPE(2, scaling=sc.LongRoPE([1.0], [1.0], 1, factor=2.0)), ValueError,
         "original_max_position"),
        (lambda: sc.Linear("2"), TypeError, "factor="),
        (lambda: sc.NTKAware(None), TypeError, "factor="),  # type: ignore[arg-type]
        (lambda: sc.DynamicNTK(2.0, 2.5), TypeError, "original_max_position"),
        (lambda: sc.Llama3(8.0, NAN, 4.0, 8192), ValueError, "low_freq_factor="),
        (lambda: sc.MaxLengthAware(0), ValueError, "max_position="),
        (lambda: anyrope.RoPE(8, scaling=sc.NTKAware(1e300)), ValueError, "scaling="),
        (lambda: anyrope.RoPE(8, scaling=sc.Linear(5e-324)), ValueError, "scaling="),
    ],
)  # fmt: skip
def test_scaling_constructors_check_as_configs_do(make: Any, error: type[Exception], name: str) -> None:
    with _refused(error, name):
        make()


def test_scaling_keeps_numpy_scalars_as_python_numbers() -> None:
    """Equal methods compare, hash and print alike, whatever scalar type they were given."""
    given_numpy = sc.YaRN(np.float32(4.0), np.int64(2048), mscale=np.float64(1.0), truncate=np.bool_(False))
    plain = sc.YaRN(4.0, 2048, mscale=1.0, truncate=False)
    assert given_numpy == plain
    assert hash(given_numpy) == hash(plain)
    assert repr(given_numpy) == repr(plain)
    rope = anyrope.RoPE(4, scaling=sc.LongRoPE(np.array([1.0, 2.0]), (3.0, 4.0), 16))
    assert rope.scaling == sc.LongRoPE([1.0, 2.0], [3.0, 4.0], 16)


# --- issue 27, item 6: rerotate's lengths ------------------------------------------------------


def test_rerotate_names_old_and_new_length(backend: Backend) -> None:
    rope = anyrope.RoPE(8, scaling=sc.DynamicNTK(2.0, 4))
    k = backend.asarray(_x((4, 8)), "float32")
    for arg in ("old_length", "new_length"):
        with _refused(ValueError, f"{arg}=-1"):
            anyrope.rerotate(k, rope, rope, **{arg: -1})
        with _refused(ValueError, f"{arg}=0"):
            anyrope.rerotate(k, rope, rope, **{arg: 0})
        with _refused(TypeError, arg):
            anyrope.rerotate(k, rope, rope, **{arg: "a"})


# --- issue 27, item 7: devices and views that cannot be written ---------------------------------


@FAST
@pytest.mark.backends("torch")
def test_torch_arrays_on_another_device_name_the_argument(backend: Backend, fast: bool) -> None:
    import torch

    rope = anyrope.RoPE(8)
    q = backend.asarray(_x((2, 4, 8)), "float32")
    meta = {"device": "meta"}
    with anyrope.use_fast_paths(fast):
        with _refused(ValueError, "positions is on meta"):
            rope(q, positions=torch.arange(4, **meta))
        with _refused(ValueError, "offset is on meta"):
            rope(q, offset=torch.zeros(2, dtype=torch.int64, **meta))
        with _refused(ValueError, "positions is on meta"):
            rope.cos_sin(torch.arange(4, **meta), like=q)
        with _refused(ValueError, "cos is on meta"):
            anyrope.apply(q, torch.ones(4, 4, **meta), torch.ones(4, 4))
        with _refused(ValueError, "shift is on meta"):
            anyrope.rerotate(q, rope, rope, shift=torch.tensor(1, **meta))


@FAST
@pytest.mark.backends("array-api-strict")
def test_array_api_strict_arrays_on_another_device_name_the_argument(backend: Backend, fast: bool) -> None:
    import array_api_strict as xs

    other = xs.Device("device1")
    rope = anyrope.RoPE(8)
    x_np = _x((2, 4, 8))
    q, k = backend.asarray(x_np, "float32"), backend.asarray(x_np, "float32")
    away = xs.asarray(np.asarray(x_np, dtype=np.float32), device=other)
    with anyrope.use_fast_paths(fast):
        with _refused(ValueError, "k is on"):
            rope(q, away)
        with _refused(ValueError, "positions is on"):
            rope(q, positions=xs.arange(4, device=other))
        with _refused(ValueError, "offset is on"):
            rope(q, offset=xs.asarray([1, 2], device=other))
        with _refused(ValueError, "positions is on"):
            rope.cos_sin(xs.arange(4, device=other), like=q)
        with _refused(ValueError, "sin is on"):
            anyrope.apply(q, xs.ones((4, 4)), xs.ones((4, 4), device=other))
        with _refused(ValueError, "positions is on"):
            anyrope.rerotate(k, rope, rope, positions=xs.arange(4, device=other))
    np.testing.assert_array_equal(backend.to_numpy(q), backend.to_numpy(backend.asarray(x_np, "float32")))


@FAST
def test_inplace_into_a_stride_zero_view_is_refused_before_writing(backend: Backend, fast: bool) -> None:
    rope = anyrope.RoPE(8)
    if backend.name == "torch":
        base = backend.asarray(_x((1, 1, 4, 8)), "float32")
        view = base.expand(2, 3, 4, 8)
        fine = backend.asarray(_x((2, 3, 4, 8)), "float32")
    elif backend.name == "numpy":
        base = _x((1, 1, 4, 8))
        view = np.lib.stride_tricks.as_strided(base, (2, 3, 4, 8), (0, 0, *base.strides[2:]), writeable=True)
        fine = _x((2, 3, 4, 8))
    else:
        pytest.skip("in-place calls on stride-0 views: NumPy and PyTorch")
    before, fine_before = backend.to_numpy(base).copy(), backend.to_numpy(fine).copy()
    with anyrope.use_fast_paths(fast):
        with _refused(ValueError, "q has a stride-0 axis"):
            rope(view, inplace=True)
        with _refused(ValueError, "k has a stride-0 axis"):
            rope(fine, view, inplace=True)  # q comes first, and is not written either
        with _refused(ValueError, "out has a stride-0 axis"):
            anyrope.apply(fine, *rope.cos_sin(backend.asarray(np.arange(4)), like=fine), out=view)
    np.testing.assert_array_equal(backend.to_numpy(base), before)
    np.testing.assert_array_equal(backend.to_numpy(fine), fine_before)


# --- issue 57, item 1: arrays of too few axes --------------------------------------------------


@FAST
def test_arrays_of_too_few_axes_name_their_argument(backend: Backend, fast: bool) -> None:
    """A 0-d (or 1-d) q or k, and 0-d or 3-d positions, are refused naming the argument, on a
    RoPE's first call of that form and on later ones (a RoPE keeps a plan per call signature,
    made by the first valid call), with nothing written; a 0-d offset array is one offset."""
    rope, x_np = anyrope.RoPE(8), _x((2, 3, 4, 8))
    q = backend.asarray(x_np, "float32")
    k = backend.asarray(x_np[:, :1], "float32")
    scalar, row = backend.asarray(np.float32(0.5), "float32"), backend.asarray(x_np[0, 0, 0], "float32")
    before = _snapshot(backend, q, k)
    refusals: list[tuple[Callable[[], Any], str]] = [
        (lambda: rope(scalar), "q must have at least two axes"),
        (lambda: rope(row), "q must have at least two axes"),
        (lambda: rope(scalar, k), "q must have at least two axes"),
        (lambda: rope(q, scalar), "k must have at least two axes"),
        (lambda: rope(q, row), "k must have at least two axes"),
        (lambda: rope(q, positions=backend.asarray(np.int64(3))), "positions must be 1-d or 2-d"),
        (lambda: rope(q, k, positions=backend.asarray(np.zeros((1, 2, 4), np.int64))), "positions must be"),
        (lambda: rope(scalar, offset=backend.asarray(np.array([1, 2]))), "q must have at least two axes"),
        (lambda: rope(q, scalar, offset=backend.asarray(np.array([1, 2]))), "k must have at least two axes"),
    ]
    with anyrope.use_fast_paths(fast):
        for _ in range(2):  # the second round meets the plans of the valid calls below
            for call, message in refusals:
                with _refused(ValueError, message):
                    call()
            _unchanged(backend, (q, k), before)
            rope(q, k)
            rope(q, k, positions=backend.asarray(np.arange(4)))
        one = rope(q, offset=backend.asarray(np.int64(3)))  # a 0-d offset: one for every row
        np.testing.assert_array_equal(backend.to_numpy(one), backend.to_numpy(rope(q, offset=3)))
    cos, sin = rope.cos_sin(backend.asarray(np.int64(3)), like=q)  # any shape: () -> (4,)
    assert tuple(cos.shape) == tuple(sin.shape) == (4,)


# --- issue 57, item 2: per-row offsets past the index dtype, on every backend ---------------------


def _reads_offsets(backend: Backend) -> str:
    """Where a backend's offset arrays are checked against the index dtype: "call" (their values
    are on the host: NumPy, CPU torch, array-api-strict), "compute" (Dask: as the graph computes
    them) or "" (never read: devices, MLX, JAX; docs/positions.md says what then happens)."""
    if backend.host_values or backend.name == "array-api-strict":
        return "call"
    return "compute" if backend.name == "dask" else ""


@FAST
def test_offset_arrays_past_the_index_dtype_are_refused(backend: Backend, fast: bool) -> None:
    """Per-row offsets ``[top - 2, 0]`` with 4 tokens put a position past the index dtype: never
    a wrapped (3.7 rad off) result. Refused naming offset where the values can be read; Dask
    raises as it computes the result; where they are never read (MLX, JAX, GPUs), the positions
    past the range turn by their own angles: the result of the same positions given unsigned."""
    when = _reads_offsets(backend)
    rope, top = anyrope.RoPE(8), _largest(backend)
    x_np = _x((2, 3, 4, 8))
    q, k = backend.asarray(x_np, "float32"), backend.asarray(x_np[:, :1], "float32")
    offsets = (np.array([top - 2, 0]), np.array([top, top]), np.array(top - 1))
    if not when:
        unsigned = np.dtype(f"uint{np.iinfo(backend.index).bits}")
        with anyrope.use_fast_paths(fast):
            for offset in offsets:
                positions = offset.astype(unsigned)[..., None] + np.arange(4, dtype=unsigned)
                got = rope(q, k, offset=backend.asarray(offset.astype(backend.index)))
                want = rope(q, k, positions=backend.asarray(np.broadcast_to(positions, (2, 4)).copy()))
                for g, w in zip(got, want, strict=True):
                    assert_same(backend, g, w, "float32")
        return
    before = _snapshot(backend, q, k)
    with anyrope.use_fast_paths(fast):
        for offset in offsets:
            with _refused(ValueError, "offset"):
                out = rope(q, k, offset=backend.asarray(offset))
                assert when == "compute", "refused at the call"
                _snapshot(backend, *out)
            _unchanged(backend, (q, k), before)


# --- issue 57, item 3: in place into arrays with no elements ------------------------------------


EMPTY = [(0, 3, 4, 8), (2, 3, 0, 8), (2, 0, 4, 8)]


@FAST
@pytest.mark.parametrize("shape", EMPTY, ids=str)
def test_inplace_into_an_empty_array_returns_it(backend: Backend, fast: bool, shape: tuple[int, ...]) -> None:
    """NumPy 2 gives empty arrays zero strides: that is no stride-0 view, and an in-place call
    (or apply's out=) returns the empty array itself; immutable arrays are refused as ever."""
    rope = anyrope.RoPE(8)
    q, k = backend.asarray(np.zeros(shape), "float32"), backend.asarray(np.zeros(shape), "float32")
    positions = backend.asarray(np.arange(shape[2]))
    offsets = backend.asarray(np.zeros(shape[0], np.int64))
    calls: list[tuple[Callable[[], Any], tuple[Any, ...]]] = [
        (lambda: rope(q, inplace=True), (q,)),
        (lambda: rope(q, k, inplace=True), (q, k)),
        (lambda: rope(q, k, positions=positions, inplace=True), (q, k)),
        (lambda: rope(q, offset=offsets, inplace=True), (q,)),
        (lambda: anyrope.apply(q, *rope.cos_sin(positions, like=q), out=k), (k,)),
    ]
    mutable = backend.name in ("numpy", "torch", "array-api-strict")
    with anyrope.use_fast_paths(fast):
        for call, written in calls * 2:  # the second time through the kept plans
            out = _answers(call, "inplace=", "out=")
            assert (out is not None) == mutable, f"{backend.name}: {out!r}"
            if out is not None:
                got = out if isinstance(out, tuple) else (out,)
                assert all(a is b for a, b in zip(got, written, strict=True))
    assert tuple(q.shape) == tuple(k.shape) == shape


# --- generated bad values at every entry point ---------------------------------------------------


ODD_VALUES = [
    0, -1, 1, 2, 3, 7, 0.0, -0.0, 1.5, -2.5, 4.0, math.nan, math.inf, -math.inf, True, False, None, "1", "x",
    b"1", [1], (2.0,), {}, 10**400, -(10**400), 2**63, 2**64, np.float32(2.0), np.int64(3), np.bool_(True),
    np.float64("nan"), Fraction(3, 2), 1e308, 5e-324, np.zeros(2), np.int32(-4),
]  # fmt: skip
odd = st.one_of(st.sampled_from(ODD_VALUES), st.integers(-(2**66), 2**66), st.floats())


def _answers(call: Callable[[], Any], *names: str) -> Any:
    """``call()``'s result, or None where it raised a ValueError / TypeError naming one of ``names``."""
    try:
        return call()
    except (ValueError, TypeError) as exc:
        message = str(exc)
    if not any(name in message for name in names):
        pytest.fail(f"{message!r} names none of {names}")
    return None


@given(arg=st.sampled_from(["base", "rotary_dim", "max_position", "xpos_scale_base", "head_dim"]), value=odd)
def test_rope_constructor(arg: str, value: Any) -> None:
    if arg in ("head_dim", "rotary_dim") and isinstance(value, int) and value > 64:
        value = 66  # a valid huge head would build huge tables
    rope = _answers(
        lambda: anyrope.RoPE(
            8 if arg != "head_dim" else value, **({arg: value} if arg != "head_dim" else {})
        ),
        arg,
    )
    if rope is not None:
        assert all(math.isfinite(f) for f in rope.inv_freq)
        assert 0 < rope.attention_scaling < math.inf


SCALINGS: dict[str, tuple[type[sc.Scaling], dict[str, Any]]] = {
    "Linear": (sc.Linear, {"factor": 2.0}),
    "NTKAware": (sc.NTKAware, {"factor": 2.0}),
    "DynamicNTK": (sc.DynamicNTK, {"factor": 2.0, "original_max_position": 16, "alpha": None}),
    "YaRN": (sc.YaRN, {"factor": 4.0, "original_max_position": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                       "mscale": None, "mscale_all_dim": None, "attention_factor": None, "truncate": True}),
    "Llama3": (sc.Llama3, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position": 16}),
    "LongRoPE": (sc.LongRoPE, {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "original_max_position": 16,
                               "factor": None, "attention_factor": None, "long_attention_factor": None}),
    "Proportional": (sc.Proportional, {"fraction": 0.5, "factor": 1.0}),
    "MaxLengthAware": (sc.MaxLengthAware, {"max_position": 16}),
}  # fmt: skip


@given(data=st.data(), method=st.sampled_from(sorted(SCALINGS)), value=odd)
def test_scaling_constructors(data: st.DataObject, method: str, value: Any) -> None:
    """Each field of each method: refused naming it, or a RoPE with finite frequencies and a positive
    attention factor (or a refusal naming the scaling, where fields valid alone overflow together)."""
    cls, fields = SCALINGS[method]
    field = data.draw(st.sampled_from(sorted(fields)))
    built = _answers(lambda: cls(**{**fields, field: value}), field)
    if built is None:
        return
    rope = _answers(lambda: anyrope.RoPE(8, scaling=built, max_position=64), "scaling", field)
    if rope is not None:
        for length in (1, 16, 17, 64):
            inv_freq = _answers(lambda: rope.inv_freq_at(length), "scaling")  # noqa: B023
            assert inv_freq is None or all(0 <= f < math.inf for f in inv_freq)
        assert 0 < rope.attention_scaling < math.inf


def _snapshot(backend: Backend, *arrays: Any) -> list[np.ndarray]:
    return [backend.to_numpy(a).copy() for a in arrays]


def _unchanged(backend: Backend, arrays: tuple[Any, ...], before: list[np.ndarray]) -> None:
    for array, was in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(backend.to_numpy(array), was)


offsets = st.one_of(
    odd,
    st.lists(st.integers(-(2**64), 2**64), min_size=0, max_size=3),
    st.lists(st.floats(), min_size=2, max_size=2),
    st.sampled_from([[[1, 2]], [1, "2"], [[1], [2, 3]], np.array([1.5, 2.0]), np.array([[1, 2]])]),
)


@given(offset=offsets, seq_axis=st.sampled_from([-2, -3, 2, -2.0, "x", None, 0, 5, np.int64(-2)]))
def test_rope_call(backend: Backend, offset: Any, seq_axis: Any) -> None:
    rope = anyrope.RoPE(8)
    x_np = _x((2, 3, 4, 8))
    q, k = backend.asarray(x_np, "float32"), backend.asarray(x_np[:, :1], "float32")
    before = _snapshot(backend, q, k)
    out = _answers(lambda: rope(q, k, offset=offset, seq_axis=seq_axis), "offset", "seq_axis", "q", "k")
    _unchanged(backend, (q, k), before)
    if out is None or not (type(offset) is int and seq_axis == -2):
        return
    # the documented result: positions offset, offset + 1, ...
    want = rope(q, k, positions=backend.asarray(np.arange(4) + offset)) if abs(offset) < 2**30 else None
    for got, expected in zip(out, want or out, strict=True):  # another form of the same rotation
        assert_same(backend, got, expected, "float32")


positions_values = st.one_of(
    odd,
    st.lists(st.integers(-(2**64), 2**64), min_size=1, max_size=4),
    st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=4), min_size=1, max_size=3),
    st.sampled_from([np.array([1.0, 2.0]), [True, False], ["a"], np.arange(6).reshape(1, 2, 3)]),
)


@given(positions=positions_values)
def test_cos_sin(backend: Backend, positions: Any) -> None:
    rope = anyrope.RoPE(8)
    like = backend.asarray(np.zeros((1, 8)), "float32")
    tables = _answers(lambda: rope.cos_sin(positions, like=like), "positions")
    if tables is not None:
        shape = np.shape(positions)
        assert tuple(tables[0].shape) == (*shape, 4)
        assert tuple(tables[1].shape) == (*shape, 4)


@given(
    seq=st.integers(0, 6), half=st.integers(0, 6), batch=st.sampled_from([None, 1, 2, 3]),
    layout=st.sampled_from(["half", "interleaved", "hf", "HALF", "x", None, 1]),
    seq_axis=st.sampled_from([-2, -3, 1, 4, -2.0]), dtype=st.sampled_from(["float32", "int64"]),
)  # fmt: skip
def test_apply(
    backend: Backend, seq: int, half: int, batch: int | None, layout: Any, seq_axis: Any, dtype: str
) -> None:
    x = backend.asarray(_x((2, 4, 8)), "float32")
    shape = (seq, half) if batch is None else (batch, seq, half)
    cos = backend.asarray(np.cos(_x(shape)), "float32")
    sin = backend.asarray(np.sin(_x(shape)), "float32")
    if dtype == "int64":
        cos = backend.asarray(np.ones(shape, dtype=np.int64))
    before = _snapshot(backend, x, cos, sin)
    out = _answers(lambda: anyrope.apply(x, cos, sin, layout=layout, seq_axis=seq_axis), "cos", "sin", "layout",
                   "seq_axis", "x")  # fmt: skip
    _unchanged(backend, (x, cos, sin), before)
    if out is not None:
        assert tuple(out.shape) == tuple(x.shape)


@given(
    arg=st.sampled_from(["old_length", "new_length", "shift", "offset", "seq_axis"]),
    value=st.one_of(odd, st.lists(st.integers(-3, 3), min_size=1, max_size=3)),
)
def test_rerotate(backend: Backend, arg: str, value: Any) -> None:
    rope = anyrope.RoPE(8, scaling=sc.DynamicNTK(2.0, 4))
    k = backend.asarray(_x((2, 4, 8)), "float32")
    before = _snapshot(backend, k)
    # a huge length is refused by the scaling whose frequencies it would overflow
    out = _answers(lambda: anyrope.rerotate(k, rope, rope, **{arg: value}), arg, "k", "sequence length")
    _unchanged(backend, (k,), before)
    if out is not None:
        assert tuple(out.shape) == tuple(k.shape)


layouts = st.sampled_from(["half", "interleaved", "neox", "meta", "bogus", None, 3])


@given(src=layouts, dst=layouts, rotary_dim=st.one_of(st.none(), odd), num_heads=odd)
def test_to_layout_and_permute_qk_weight(
    backend: Backend, src: Any, dst: Any, rotary_dim: Any, num_heads: Any
) -> None:
    x = backend.asarray(_x((3, 8)), "float32")
    before = _snapshot(backend, x)
    out = _answers(lambda: anyrope.to_layout(x, src, dst, rotary_dim=rotary_dim), "src", "dst", "rotary_dim")
    if out is not None:
        assert tuple(out.shape) == (3, 8)
        back = anyrope.to_layout(out, dst, src, rotary_dim=rotary_dim)
        np.testing.assert_array_equal(backend.to_numpy(back), before[0])
    weight = _answers(
        lambda: anyrope.permute_qk_weight(x, num_heads, src, dst, rotary_dim=rotary_dim),
        "src", "dst", "rotary_dim", "num_heads", "weight",
    )  # fmt: skip
    if weight is not None:
        assert tuple(weight.shape) == (3, 8)
    _unchanged(backend, (x,), before)


@given(
    shape=st.one_of(odd, st.lists(st.one_of(st.integers(-1, 4), st.sampled_from([1.0, "2", None])), max_size=3)),
    prefix=odd, start=odd,
)  # fmt: skip
def test_grid_positions(backend: Backend, shape: Any, prefix: Any, start: Any) -> None:
    like = backend.asarray(np.zeros(1), "float32")
    if isinstance(prefix, int) and not isinstance(prefix, bool) and prefix > 4096:
        prefix = 4096  # a valid huge prefix would allocate it (2**32 tokens: 34 GB)
    grid = _answers(lambda: anyrope.grid_positions(shape, prefix=prefix, start=start, like=like),
                    "shape", "prefix", "start")  # fmt: skip
    if grid is not None:
        sizes = [int(n) for n in shape]
        assert tuple(grid.shape) == (len(sizes), int(prefix) + math.prod(sizes))


def _on(backend: Backend, a: np.ndarray) -> Any:
    return backend.asarray(a, "float32" if a.dtype.kind == "f" else None)


@given(
    cu=st.sampled_from([[0, 3], [0, 2, 5], [1, 3], [0, 4, 2], [[0, 1]], [0.0, 2.0], []]),
    total=odd, offsets=st.one_of(st.none(), odd, st.sampled_from([[1, 2], np.array([5]), np.array([2.0])])),
)  # fmt: skip
def test_packed_positions(backend: Backend, cu: Any, total: Any, offsets: Any) -> None:
    cu_seqlens = _on(backend, np.array(cu))
    if isinstance(offsets, np.ndarray):
        offsets = _on(backend, offsets)
    before = _snapshot(backend, cu_seqlens)
    if isinstance(total, int) and not isinstance(total, bool) and total > 4096:
        total = 4096  # a valid huge total would allocate it
    out = _answers(lambda: anyrope.packed_positions(cu_seqlens, total, offsets=offsets), "cu_seqlens", "total",
                   "offsets")  # fmt: skip
    _unchanged(backend, (cu_seqlens,), before)
    if out is not None:
        assert tuple(out.shape) == (int(total),)


def _ranked(rank: int, heads: int) -> tuple[int, ...]:
    """The last ``rank`` axes of (batch 2, heads, seq 4, head_dim 8)."""
    return (2, heads, 4, 8)[4 - rank :]


POSITIONS_OF_RANK = [np.int64(5), np.arange(4) + 5, (np.arange(4) + 5)[None], np.zeros((1, 1, 4), np.int64)]


@given(
    q_rank=st.integers(0, 4), k_rank=st.one_of(st.none(), st.integers(0, 4)),
    positions_rank=st.one_of(st.none(), st.integers(0, 3)), inplace=st.booleans(),
)  # fmt: skip
def test_rope_call_ranks(
    backend: Backend, q_rank: int, k_rank: int | None, positions_rank: int | None, inplace: bool
) -> None:
    """q, k and positions of every rank (issue 57: 0-d ones raised IndexError): refused naming the
    argument, with nothing written, or rotated exactly by their positions."""
    rope = anyrope.RoPE(8)
    q_np = _x(_ranked(q_rank, 3))
    q = backend.asarray(q_np, "float32")
    k = None if k_rank is None else backend.asarray(_x(_ranked(k_rank, 1), 1), "float32")
    arrays = (q,) if k is None else (q, k)
    before = _snapshot(backend, *arrays)
    where = (
        {} if positions_rank is None else {"positions": backend.asarray(POSITIONS_OF_RANK[positions_rank])}
    )
    out = _answers(lambda: rope(*arrays, inplace=inplace, **where), "q", "k", "positions", "inplace=")
    if out is None:
        _unchanged(backend, arrays, before)
        return
    positions = np.arange(4) + (0 if positions_rank is None else 5)
    for got, was in zip(out if k is not None else (out,), before, strict=True):
        flat = was.reshape(1, -1, 4, 8)  # every token of every head at its position
        want = _exact(flat, positions[None], rope).reshape(was.shape)
        assert_close(backend, got, want, "float32")


@given(drops=st.lists(st.integers(0, 8), min_size=1, max_size=3), seq=st.integers(1, 5), one=st.booleans())
def test_offsets_near_the_index_dtypes_top(backend: Backend, drops: list[int], seq: int, one: bool) -> None:
    """Offset arrays a few below the index dtype's largest value (issue 57: ``2**63 - 2`` with 4
    tokens came back 3.7 rad off on MLX and array-api-strict): where a last position passes it,
    refused naming offset wherever the values are read (see _reads_offsets); else exact, the
    positions past it included where nothing reads them (see PositionSpec.wrapped)."""
    top, when = _largest(backend), _reads_offsets(backend)
    starts = np.array([top - drops[0]] if one else [top - d for d in drops], dtype=np.uint64)
    past = int(starts.max()) + seq - 1 > top
    rope = anyrope.RoPE(8)
    x_np = _x((len(starts), 2, seq, 8))
    x = backend.asarray(x_np, "float32")
    before = _snapshot(backend, x)
    offset = backend.asarray(starts[0] if one else starts, backend.index)
    out = _answers(lambda: backend.to_numpy(rope(x, offset=offset)), "offset")
    _unchanged(backend, (x,), before)
    assert (out is None) == (past and bool(when)), (
        f"last position {int(starts.max()) + seq - 1}, largest {top}"
    )
    if out is not None:
        positions = starts[:, None] + np.arange(seq, dtype=np.uint64)
        want = _exact(before[0].astype(np.float64), positions, rope)
        assert_close(backend, backend.asarray(out, "float32"), want, "float32")


@given(
    lead=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    head_dim=st.sampled_from([8, 0]),
    both=st.booleans(),
)
def test_inplace_with_no_elements(backend: Backend, lead: list[int], head_dim: int, both: bool) -> None:
    """Arrays with no elements (issue 57: NumPy 2 gives them zero strides, refused as stride-0
    views): in place, the array itself comes back; immutable arrays are refused naming inplace=."""
    shape = (*lead, 0, head_dim) if 0 not in lead and head_dim else (*lead, 2, head_dim)
    rope = anyrope.RoPE(8)
    q = backend.asarray(np.zeros(shape), "float32")
    k = backend.asarray(np.zeros(shape), "float32")
    out = _answers(
        lambda: rope(q, k, inplace=True) if both else rope(q, inplace=True), "inplace=", "head_dim"
    )
    mutable = backend.name in ("numpy", "torch", "array-api-strict")
    assert (out is not None) == (mutable and head_dim == 8), f"{backend.name}, shape {shape}: {out!r}"
    if out is not None:
        assert all(got is want for got, want in zip(out if both else (out,), (q, k), strict=False))
        assert tuple(q.shape) == shape


@pytest.mark.parametrize("flag", [np.bool_(True), np.array(True)], ids=["numpy bool", "0-d bool array"])
def test_numpy_booleans_are_no_counts(flag: Any) -> None:
    """A NumPy boolean for a count is refused like True, naming it (older NumPy's ``__index__``
    took it, with a DeprecationWarning, which hypothesis found on the lowest versions)."""
    with pytest.raises(TypeError, match="num_heads must be an int"):
        anyrope.permute_qk_weight(np.zeros((4, 8)), flag, "half", "interleaved")
    with pytest.raises(TypeError, match="head_dim must be an int"):
        anyrope.RoPE(flag)
