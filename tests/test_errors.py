"""Bad input gets a TypeError or ValueError that names the argument and the fix."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import anyrope

from harness import Backend


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"head_dim": 7}, ValueError, "head_dim=7 must be a positive even"),
        ({"head_dim": 0}, ValueError, "head_dim=0 must be a positive even"),
        ({"head_dim": -4}, ValueError, "head_dim=-4"),
        ({"head_dim": 8.0}, TypeError, "head_dim must be an int"),
        ({"head_dim": 8, "rotary_dim": 5}, ValueError, "rotary_dim=5 must be an even number from 2 to 8"),
        ({"head_dim": 8, "rotary_dim": 10}, ValueError, r"rotary_dim=10 must be .* to 8 \(.*head_dim=8\)"),
        ({"head_dim": 8, "rotary_dim": 4.0}, TypeError, "rotary_dim must be an int"),
        (
            {"head_dim": 8, "layout": "sideways"},
            ValueError,
            "layout='sideways' is not a known layout; use one of 'half'",
        ),
        ({"head_dim": 8, "base": 0.0}, ValueError, "base=0.0 must be a positive"),
        ({"head_dim": 8, "max_position": 0}, ValueError, "max_position=0"),
        ({"head_dim": 8, "clockwise": "yes"}, TypeError, "clockwise must be True or False"),
        (
            {"head_dim": 8, "scaling": "yarn"},
            TypeError,
            "scaling must be None or a method from anyrope.scaling",
        ),
    ],
)
def test_constructor_rejects(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    head_dim = kwargs.pop("head_dim")
    with pytest.raises(error, match=match):
        anyrope.RoPE(head_dim, **kwargs)  # type: ignore[arg-type]


def test_call_rejects_bad_arrays(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.zeros((2, 3, 8)), "float32")
    with pytest.raises(TypeError, match="q must be a real floating-point array"):
        rope(backend.asarray(np.zeros((2, 3, 8), dtype=np.int32)))
    with pytest.raises(ValueError, match=r"q.shape\[-1\]=6 does not match head_dim=8"):
        rope(backend.asarray(np.zeros((2, 3, 6)), "float32"))
    with pytest.raises(ValueError, match=r"k.shape\[-1\]=4 does not match head_dim=8"):
        rope(x, backend.asarray(np.zeros((2, 3, 4)), "float32"))
    with pytest.raises(ValueError, match="q must have at least two axes"):
        rope(backend.asarray(np.zeros(8), "float32"))
    with pytest.raises(ValueError, match="seq_axis=-1 is not a sequence axis"):
        rope(x, seq_axis=-1)
    with pytest.raises(ValueError, match="seq_axis=-4 is not a sequence axis"):
        rope(x, seq_axis=-4)


def test_call_rejects_bad_positions(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.zeros((2, 3, 8)), "float32")
    with pytest.raises(TypeError, match="positions must be an integer array, got dtype"):
        rope(x, positions=backend.asarray(np.arange(3.0), "float32"))
    with pytest.raises(TypeError, match="positions must hold integers"):
        rope(x, positions=[0, 1.5, 2])
    with pytest.raises(ValueError, match="positions must be rectangular"):
        rope(x, positions=[[0, 1, 2], [3, 4]])
    with pytest.raises(TypeError, match="positions must be an integer array or a sequence of ints, not str"):
        rope(x, positions="012")
    with pytest.raises(ValueError, match="positions has 4 entries per row but q has 3 positions"):
        rope(x, positions=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="positions must be 1-d or 2-d"):
        rope(x, positions=backend.asarray(np.zeros((1, 1, 3), dtype=np.int64)))
    with pytest.raises(ValueError, match="positions has 5 rows but q has batch size 2"):
        rope(x, positions=backend.asarray(np.zeros((5, 3), dtype=np.int64)))
    with pytest.raises(ValueError, match="pass positions or offset, not both"):
        rope(x, positions=[0, 1, 2], offset=4)
    with pytest.raises(ValueError, match="no batch axis before its sequence axis"):
        rope(backend.asarray(np.zeros((3, 8)), "float32"), positions=[[0, 1, 2]])


def test_call_rejects_bad_offsets(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.zeros((2, 3, 8)), "float32")
    with pytest.raises(
        TypeError, match=r"offset must be an int, an integer array or a sequence of ints .*not float"
    ):
        rope(x, offset=1.5)
    with pytest.raises(TypeError, match="not bool"):
        rope(x, offset=True)
    with pytest.raises(ValueError, match="offset has 3 rows but q has batch size 2"):
        rope(x, offset=[1, 2, 3])
    with pytest.raises(TypeError, match="offset must be an integer array"):
        rope(x, offset=backend.asarray(np.array([1.0, 2.0]), "float32"))
    with pytest.raises(ValueError, match="offset must be one int, or 1-d with one int per batch row"):
        rope(x, offset=[[1], [2]])
    bits = 64 if backend.index == "int64" else 32
    with pytest.raises(ValueError, match=f"offset={2**bits} does not fit in {bits}-bit integers"):
        rope(x, offset=2**bits)
    with pytest.raises(ValueError, match=f"positions={2**bits} does not fit in {bits}-bit integers"):
        rope(x, positions=[0, 1, 2**bits])


def test_negative_offsets_and_positions_are_positions(backend: Backend) -> None:
    """Negative positions are legal (left padding, re-rotation): they rotate the other way."""
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.ones((2, 3, 8)), "float32")
    by_offset = backend.to_numpy(rope(x, offset=[-4, 2]))
    by_positions = backend.to_numpy(rope(x, positions=[[-4, -3, -2], [2, 3, 4]]))
    np.testing.assert_array_equal(by_offset, by_positions)
    np.testing.assert_array_equal(backend.to_numpy(rope(x, offset=-4))[0], by_offset[0])


def test_apply_rejects_mismatched_tables(backend: Backend) -> None:
    x = backend.asarray(np.zeros((2, 3, 8)), "float32")
    table = backend.asarray(np.zeros((3, 4)), "float32")
    with pytest.raises(ValueError, match="cos and sin must have one shape"):
        anyrope.apply(x, table, backend.asarray(np.zeros((3, 2)), "float32"))
    with pytest.raises(ValueError, match="from duplicated"):
        anyrope.apply(
            x, backend.asarray(np.zeros((3, 8)), "float32"), backend.asarray(np.zeros((3, 8)), "float32")
        )
    long_seq = backend.asarray(np.zeros((5, 4)), "float32")
    with pytest.raises(ValueError, match=r"cos.shape\[-2\]=5 does not match the sequence length 3"):
        anyrope.apply(x, long_seq, long_seq)
    batched = backend.asarray(np.zeros((4, 3, 4)), "float32")
    with pytest.raises(ValueError, match=r"cos.shape\[0\]=4 does not match x's batch size 2"):
        anyrope.apply(x, batched, batched)
    flat = backend.asarray(np.zeros(4), "float32")
    with pytest.raises(ValueError, match="must have shape \\(seq, rotary_dim // 2\\)"):
        anyrope.apply(x, flat, flat)
    ints = backend.asarray(np.zeros((3, 4), dtype=np.int32))
    with pytest.raises(TypeError, match="cos must be a real floating-point array"):
        anyrope.apply(x, ints, ints)
    with pytest.raises(ValueError, match="layout='diagonal' is not a known layout"):
        anyrope.apply(x, table, table, layout="diagonal")


def test_layout_helpers_reject(backend: Backend) -> None:
    w = backend.asarray(np.zeros((12, 4)), "float32")
    with pytest.raises(ValueError, match="src='x' is not a known layout"):
        anyrope.to_layout(w, "x", "half")
    with pytest.raises(ValueError, match="rotary_dim=3 must be an even number from 2 to 4"):
        anyrope.to_layout(w, "half", "meta", rotary_dim=3)
    with pytest.raises(ValueError, match=r"weight.shape\[0\]=12 is not divisible by num_heads=5"):
        anyrope.permute_qk_weight(w, 5, "meta", "hf")
    with pytest.raises(ValueError, match="num_heads=0 must be a positive int"):
        anyrope.permute_qk_weight(w, 0, "meta", "hf")
    with pytest.raises(ValueError, match="weight must have shape"):
        anyrope.permute_qk_weight(backend.asarray(np.zeros((2, 6, 4)), "float32"), 2, "meta", "hf")
    with pytest.raises(ValueError, match="dim=5 must be a positive even"):
        anyrope.sinusoidal(backend.asarray(np.arange(3)), 5)


def test_cos_sin_rejects(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    with pytest.raises(TypeError, match="like must be a real floating-point array"):
        rope.cos_sin([0, 1], like=backend.asarray(np.zeros(2, dtype=np.int32)))
    with pytest.raises(TypeError, match="positions must be an integer array"):
        rope.cos_sin(backend.asarray(np.zeros(2), "float32"), like=backend.asarray(np.zeros(2), "float32"))


def test_not_an_array() -> None:
    with pytest.raises(TypeError, match="q must be an array of a supported library"):
        anyrope.RoPE(8)([[0.0] * 8])


def test_mixed_libraries_name_both(backend: Backend) -> None:
    if backend.name == "numpy":
        pytest.skip("needs a second library beside NumPy")
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.zeros((2, 3, 8)), "float32")
    lib = "mlx" if backend.name == "mlx" else backend.xp.__name__.removeprefix("array_api_compat.")
    with pytest.raises(TypeError, match=f"q is a {lib} array but k is a numpy array"):
        rope(x, np.zeros((2, 3, 8), dtype=np.float32))
    with pytest.raises(TypeError, match=f"q is a {lib} array but positions is a numpy array"):
        rope(x, positions=np.arange(3))
    with pytest.raises(TypeError, match=f"x is a {lib} array but cos is a numpy array"):
        anyrope.apply(x, np.zeros((3, 4)), np.zeros((3, 4)))


@pytest.mark.feature("inplace")
def test_inplace_checks_everything_before_writing(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.random.default_rng(0).standard_normal((2, 3, 8)), "float32")
    before = backend.to_numpy(x).copy()
    with pytest.raises(ValueError, match="q and k share memory: in place, it would be rotated twice"):
        rope(x, x, inplace=True)
    np.testing.assert_array_equal(backend.to_numpy(x), before)
    if backend.name == "numpy":
        k = np.ones((2, 3, 8), dtype=np.float32)
        k.flags.writeable = False
        with pytest.raises(ValueError, match="k is read-only; inplace= would write into it"):
            rope(x, k, inplace=True)
        np.testing.assert_array_equal(x, before)  # q was not rotated first


def test_empty_sequences(backend: Backend) -> None:
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.zeros((2, 0, 8)), "float32")
    empty = backend.xp.reshape(backend.asarray(np.zeros(0, dtype=np.int64)), (1, 0))
    for call in ({}, {"offset": 5}, {"offset": [1, 2]}, {"positions": empty}, {"positions": [[], []]}):
        out = rope(x, **call)
        assert tuple(out.shape) == (2, 0, 8)


def test_numpy_dtypes_outside_the_standard() -> None:
    rope = anyrope.RoPE(8)
    data = np.random.default_rng(1).standard_normal((2, 5, 8))
    big_endian = data.astype(">f8")
    # every kernel, partial rotary too: NumPy 2's stack and concat return a native byte order
    for fast, partial in itertools.product((True, False), (rope, anyrope.RoPE(8, rotary_dim=4))):
        with anyrope.use_fast_paths(fast):
            out = partial(big_endian, offset=1000)
            assert out.dtype == big_endian.dtype, (fast, partial)
            want = partial(data, offset=1000)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-15)  # float64, not float32
    with pytest.raises(TypeError, match=r"q has dtype float128 .*cast q to float64 first"):
        rope(data.astype(np.longdouble))


def test_torch_tensors_outside_the_common_kinds() -> None:
    torch = pytest.importorskip("torch")
    rope = anyrope.RoPE(8)
    x = torch.randn(2, 5, 8)
    low = x.to(torch.float8_e4m3fn)
    out = rope(low, offset=3)  # no kernel declares float8: the generic one takes it
    assert out.dtype == torch.float8_e4m3fn
    want = rope(low.float(), offset=3).to(torch.float8_e4m3fn)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    with pytest.raises(
        TypeError, match=r"q is a torch.sparse_coo tensor; RoPE rotates dense .*q.to_dense\(\)"
    ):
        rope(x.to_sparse())
    with pytest.raises(ValueError, match="k is on meta, q on cpu; move k to cpu first"):
        rope(x, torch.empty(2, 5, 8, device="meta"))


def test_out_and_inplace_are_checked(backend: Backend) -> None:
    x = backend.asarray(np.zeros((4, 5, 8)), "float32")
    cos, sin = anyrope.RoPE(8).cos_sin(backend.asarray(np.arange(5)), like=x)
    if backend.name in ("mlx", "jax", "dask"):
        library = {"mlx": "mlx arrays are immutable", "jax": "jax.numpy arrays are immutable"}.get(
            backend.name, "dask.array arrays are lazy"
        )
        with pytest.raises(TypeError, match=library):
            anyrope.apply(x, cos, sin, out=x)
        with pytest.raises(TypeError, match="inplace= needs mutable arrays"):
            anyrope.RoPE(8)(x, inplace=True)
        return
    with pytest.raises(ValueError, match=r"out must have the input's shape \(4, 5, 8\)"):
        anyrope.apply(x, cos, sin, out=backend.asarray(np.zeros((4, 5, 4)), "float32"))
    if "float64" in backend.dtypes:
        with pytest.raises(ValueError, match="and dtype"):
            anyrope.apply(x, cos, sin, out=backend.asarray(np.zeros((4, 5, 8)), "float64"))


@pytest.mark.backends("torch")
def test_inplace_refuses_tensors_that_require_grad(backend: Backend) -> None:
    x = backend.asarray(np.zeros((4, 5, 8)), "float32").requires_grad_(True)
    with pytest.raises(ValueError, match="q requires grad: rotating in place would break autograd"):
        anyrope.RoPE(8)(x, inplace=True)


def test_a_remembered_call_plan_skips_no_check(backend: Backend) -> None:
    """The call plan is remembered per signature; a float seq_axis equals the int one as a key
    unless its type is in the key, and must still be refused after the int call ran."""
    rope = anyrope.RoPE(8)
    x = backend.asarray(np.ones((2, 3, 4, 8)), "float32")
    rope(x, seq_axis=-2)
    with pytest.raises(TypeError, match="seq_axis must be an int"):
        rope(x, seq_axis=-2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="head_dim=16"):
        anyrope.RoPE(16)(x, seq_axis=-2)
