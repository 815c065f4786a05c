"""M-RoPE (Qwen2-VL's contiguous sections, Qwen3-VL's interleaved streams) against the float64
oracle on every backend, eagerly and compiled, with positions as traced inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

import oracle
from harness import Backend, assert_close

LAYOUTS = ["half", "interleaved"]
# 12 pairs in 3 streams: contiguous blocks; interleaved with a tail on stream 0 (Qwen3-VL's
# shape); interleaved with a tail on stream 1 (Qwen3.5's [11, 11, 10]); an empty stream.
SECTIONS = {
    "contiguous": ([4, 4, 4], False),
    "interleaved": ([6, 3, 3], True),
    "interleaved, tail on h": ([4, 4, 4], True),
    "empty stream": ([6, 0, 6], False),
}


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


def _image_positions(batch: int | None) -> np.ndarray:
    """(3, [batch,] 7): text, then a 2 x 2 image (time fixed, height and width varying), then
    text again from the largest position + 1, as Qwen2-VL's get_rope_index forms them; the
    second row starts elsewhere and reaches far positions and a negative one (far enough for
    float32's angle error to show, near enough that the float64 tolerance, which does not grow
    with the position, still holds)."""
    row = np.array([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]])
    if batch is None:
        return row
    other = np.array([[900, 901, -3, 5, 5, 7000, 6], [900, 8, 7, 5, 6, 7000, 6], [900, 2, 1, 6, 5, 0, 6]])
    return np.stack([row, other][:batch], axis=1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(SECTIONS))
def test_matches_oracle(backend: Backend, dtype: str, layout: str, name: str) -> None:
    _check_against_oracle(backend, "eager", dtype, layout, name)


def test_compiled_matches_oracle(backend: Backend, mode: str) -> None:
    """Under each compiler, with positions traced: the sections with every kind of piece (a
    cycle through the streams, then single pairs of stream 0 and 1). (Layouts and sections are
    independent of the compiler; the eager test covers every combination.)"""
    _check_against_oracle(backend, mode, "float32", "interleaved", "interleaved, tail on h")


def _check_against_oracle(backend: Backend, mode: str, dtype: str, layout: str, name: str) -> None:
    section, interleaved = SECTIONS[name]
    rope = anyrope.RoPE(
        32, rotary_dim=24, layout=layout, base=5000.0, mrope_section=section, mrope_interleaved=interleaved
    )
    positions = _image_positions(2)
    q_np, k_np = _x((2, 3, 7, 32)), _x((2, 1, 7, 32), 1)
    q, k = backend.asarray(q_np, dtype), backend.asarray(k_np, dtype)
    call = backend.compile(lambda q, k, p: rope(q, k, positions=p), mode)
    got = call(q, k, backend.asarray(positions))
    streams = oracle.mrope_streams(section, interleaved)
    for out, data in zip(got, (q_np, k_np), strict=True):
        want = oracle.mrope_rotate(
            _rounded(backend, data, dtype), positions, streams, layout=layout, rotary_dim=24, base=5000.0
        )
        assert out.dtype == q.dtype
        assert_close(backend, out, want, dtype)


def test_one_row_of_positions_for_the_batch(backend: Backend, mode: str) -> None:
    """(streams, seq) positions are shared by every batch row, and seq_axis=-3 works too."""
    rope = anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True, layout="interleaved")
    positions = _image_positions(None)
    x_np = _x((2, 7, 3, 16))  # (batch, seq, heads, head_dim)
    x = backend.asarray(x_np, "float32")
    out = backend.compile(lambda x, p: rope(x, positions=p, seq_axis=-3), mode)(x, backend.asarray(positions))
    streams = oracle.mrope_streams([4, 2, 2], True)
    want = oracle.mrope_rotate(
        _rounded(backend, x_np, "float32"), positions, streams, layout="interleaved", seq_axis=-3
    )
    assert_close(backend, out, want, "float32")


def test_text_tokens_turn_as_plain_rope(backend: Backend) -> None:
    """Where every stream agrees (1-D positions, offsets, or equal streams), M-RoPE is plain
    RoPE: the same angles, so the same bits."""
    mrope = anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True)
    plain = anyrope.RoPE(16)
    x = backend.asarray(_x((2, 2, 5, 16)), "float32")
    xp = backend.xp
    same = backend.asarray(np.tile(np.arange(3, 8), (3, 1)))
    for got, want in (
        (mrope(x, offset=3), plain(x, offset=3)),
        (mrope(x, offset=[3, 9]), plain(x, offset=[3, 9])),
        (mrope(x, positions=backend.asarray(np.arange(3, 8))), plain(x, offset=3)),
        (mrope(x, positions=same), plain(x, offset=3)),
    ):
        assert bool(xp.all(got == want))


def test_cos_sin_tables_per_stream(backend: Backend, mode: str) -> None:
    rope = anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True)
    positions = _image_positions(2)  # (3, 2, 7): tables (2, 7, 8)
    like = backend.asarray(np.zeros(1), "float32")
    positions_array = backend.asarray(positions)
    cos, sin = backend.compile(lambda p, l: rope.cos_sin(p, like=l), mode)(positions_array, like)
    streams = oracle.mrope_streams([4, 2, 2], True)
    angles = np.stack([positions[s] for s in streams], axis=-1) * oracle.inv_freq(16)
    assert_close(backend, cos, np.cos(angles), "float32")
    assert_close(backend, sin, np.sin(angles), "float32")
    if mode == "eager":
        x_np = _x((2, 1, 7, 16))
        x = backend.asarray(x_np, "float32")
        want = backend.to_numpy(rope(x, positions=positions_array))
        assert_close(backend, anyrope.apply(x, cos, sin), want, "float32")


SCALINGS = {
    "linear": sc.Linear(4.0),
    "yarn": sc.YaRN(4.0, 8),
    "dynamic": sc.DynamicNTK(2.0, 8),
    "longrope": sc.LongRoPE([1.0, 1.5, 2.0, 2.5], [2, 3, 4, 5], 8),
}


@pytest.mark.parametrize("name", list(SCALINGS))
def test_scaling_takes_the_length_from_every_stream(backend: Backend, name: str) -> None:
    _check_scaling(backend, "eager", name)


@pytest.mark.parametrize("name", ["dynamic", "longrope"])
def test_compiled_scaling_chooses_on_the_device(backend: Backend, mode: str, name: str) -> None:
    _check_scaling(backend, mode, name)


def _check_scaling(backend: Backend, mode: str, name: str) -> None:
    """Length-dependent frequencies follow max(positions) + 1 over all streams, as transformers'
    dynamic update does on (3, batch, seq) position ids; traced, they are chosen on the device."""
    rope = anyrope.RoPE(8, mrope_section=[2, 1, 1], scaling=SCALINGS[name], max_position=32)
    positions = np.array([[0, 1, 2], [0, 1, 2], [0, 1, 20]])  # only the width stream is long
    x_np = _x((1, 2, 3, 8))
    out = backend.compile(lambda x, p: rope(x, positions=p), mode)(
        backend.asarray(x_np, "float32"), backend.asarray(positions)
    )
    want = oracle.mrope_rotate(
        _rounded(backend, x_np, "float32"),
        positions,
        oracle.mrope_streams([2, 1, 1], False),
        frequencies=np.array(rope.inv_freq_at(21)),
        scale=rope.at_length(21).attention_scaling,
    )
    assert_close(backend, out, want, "float32")


def test_rerotate_moves_multi_axis_keys(backend: Backend) -> None:
    """From one base to another (compiled: test_shift.py's multi-axis test rerotates M-RoPE keys
    under each compiler)."""
    old = anyrope.RoPE(16, mrope_section=[4, 2, 2], base=10000.0)
    new = anyrope.RoPE(16, mrope_section=[4, 2, 2], base=1000.0)
    positions = backend.asarray(_image_positions(2))
    k = backend.asarray(_x((2, 2, 7, 16)), "float32")
    moved = anyrope.rerotate(old(k, positions=positions), old, new, positions=positions)
    assert_close(backend, moved, backend.to_numpy(new(k, positions=positions)), "float32")


def test_properties_and_repr() -> None:
    rope = anyrope.RoPE(128, mrope_section=(24, 20, 20), mrope_interleaved=True, base=5e5)
    assert rope.mrope_section == (24, 20, 20)
    assert rope.mrope_interleaved
    assert rope.streams == 3
    assert (
        repr(rope)
        == "RoPE(128, base=500000.0, layout='half', mrope_section=[24, 20, 20], mrope_interleaved=True)"
    )
    plain = anyrope.RoPE(128)
    assert plain.mrope_section is None
    assert not plain.mrope_interleaved
    assert plain.streams == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mrope_section": [2, 2, 2]}, ValueError, r"adds up to 6 pairs but rotary_dim=16 has 8"),
        ({"mrope_section": [8]}, ValueError, "two or more streams"),
        ({"mrope_section": [4, -1, 5]}, ValueError, "non-negative ints"),
        ({"mrope_section": [4.0, 2, 2]}, ValueError, "non-negative ints"),
        ({"mrope_section": "422"}, TypeError, "sequence of ints"),
        (
            {"mrope_section": [2, 3, 3], "mrope_interleaved": True},
            ValueError,
            r"stream 2 takes pairs 2, 5, \.\.\. \(3 of them\), which runs past the 8 pairs",
        ),
        ({"mrope_interleaved": True}, ValueError, "needs mrope_section"),
        (
            {"mrope_section": [4, 2, 2], "mrope_interleaved": 1},
            TypeError,
            "mrope_interleaved must be True or False",
        ),
    ],
)
def test_bad_sections(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE(16, **kwargs)


def test_bad_positions(backend: Backend) -> None:
    rope = anyrope.RoPE(16, mrope_section=[4, 2, 2])
    x = backend.asarray(_x((2, 1, 7, 16)), "float32")
    for shape in ((2, 7), (4, 2, 7), (3, 2, 2, 7)):
        with pytest.raises(
            ValueError,
            match=r"do not fit this RoPE's 3 position streams \(M-RoPE or axial\): give shape \(3, seq\)",
        ):
            rope(x, positions=backend.asarray(np.zeros(shape, dtype=np.int64)))
    with pytest.raises(ValueError, match="positions has 6 entries per row but q has 7"):
        rope(x, positions=backend.asarray(np.zeros((3, 6), dtype=np.int64)))
    with pytest.raises(ValueError, match="positions has 3 rows but q has batch size 2"):
        rope(x, positions=backend.asarray(np.zeros((3, 3, 7), dtype=np.int64)))
    with pytest.raises(ValueError, match="old and new must share mrope_section"):
        anyrope.rerotate(x, rope, anyrope.RoPE(16), positions=np.arange(7))


def test_traced_in_one_graph() -> None:
    torch = pytest.importorskip("torch")
    rope = anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True, scaling=sc.DynamicNTK(2.0, 8))
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16)
    positions = torch.as_tensor(_image_positions(2))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda q, k, p: rope(q, k, positions=p))(q, k, positions)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
