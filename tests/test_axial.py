"""Axial RoPE (images and video) against the float64 oracle on every backend, eagerly and
compiled, and ``grid_positions``."""

from __future__ import annotations

import numpy as np
import pytest

import anyrope

import oracle
from harness import Backend, assert_close

KINDS = ["blocks", "alternating"]


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("kind", KINDS)
def test_image_matches_oracle(backend: Backend, dtype: str, kind: str, layout: str) -> None:
    """A class token, then a 3 x 4 patch grid: (2, 13) positions shared by the batch."""
    rope = anyrope.RoPE(32, rotary_dim=24, layout=layout, base=100.0, axial=2, axial_frequencies=kind)
    positions = anyrope.grid_positions((3, 4), prefix=1)
    x_np = _x((2, 3, 13, 32))
    out = rope(backend.asarray(x_np, dtype), positions=backend.asarray(positions))
    want = oracle.axial_rotate(
        _rounded(backend, x_np, dtype), positions, kind, layout=layout, rotary_dim=24, base=100.0
    )
    assert_close(backend, out, want, dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_video(backend: Backend, kind: str) -> None:
    _check_video(backend, "eager", kind)


def test_video_compiled(backend: Backend, mode: str) -> None:
    _check_video(backend, mode, "alternating")


def _check_video(backend: Backend, mode: str, kind: str) -> None:
    """Three axes (frames, rows, columns), positions per batch row, traced."""
    rope = anyrope.RoPE(24, axial=3, axial_frequencies=kind)
    grid = anyrope.grid_positions((2, 2, 3), start=1)  # (3, 12)
    positions = np.stack([grid, grid[:, ::-1]], axis=1)  # (3, batch=2, 12)
    x_np = _x((2, 2, 12, 24), 1)
    call = backend.compile(lambda x, p: rope(x, x, positions=p), mode)
    q, k = call(backend.asarray(x_np, "float32"), backend.asarray(positions))
    want = oracle.axial_rotate(_rounded(backend, x_np, "float32"), positions, kind)
    assert_close(backend, q, want, "float32")
    assert_close(backend, k, want, "float32")


@pytest.mark.parametrize("kind", KINDS)
def test_one_position_per_token_is_refused(backend: Backend, kind: str) -> None:
    """Axial pairs turn by their own axis's frequencies, so one position per token (1-D
    positions, offsets) is no rotation a vision model makes: an easy mistake, refused by name,
    eagerly and for cos_sin; the same row given for every axis is taken."""
    rope = anyrope.RoPE(16, axial=2, axial_frequencies=kind)
    x = backend.asarray(_x((2, 6, 16), 3), "float32")
    line = np.arange(4, 10)
    for call in ({"positions": backend.asarray(line)}, {"positions": [4, 5, 6, 7, 8, 9]}, {"offset": 4}, {}):
        with pytest.raises(
            ValueError, match=r"put every axis at the same position.*give positions of shape \(2, seq\)"
        ):
            rope(x, **call)
    with pytest.raises(ValueError, match=r"positions of shape \(6,\) put every axis"):
        rope.cos_sin(backend.asarray(line), like=x)
    with pytest.raises(ValueError, match=r"offset= \(or no positions\) put every axis"):
        anyrope.rerotate(x, rope, rope, offset=3, shift=1)
    every = backend.asarray(np.stack([line, line]))
    assert rope(x, positions=every).shape == x.shape


def test_prefix_tokens_stay_exactly_as_they_are(backend: Backend) -> None:
    rope = anyrope.RoPE(16, axial=2)
    x = backend.asarray(_x((1, 2, 9, 16), 2), "float32")
    positions = backend.asarray(anyrope.grid_positions((2, 3), prefix=3))
    out = rope(x, positions=positions)
    assert bool(backend.xp.all(out[..., :3, :] == x[..., :3, :]))


def test_grid_positions(backend: Backend) -> None:
    like = backend.asarray(np.zeros(1), "float32")
    got = backend.to_numpy(anyrope.grid_positions((2, 3, 2), prefix=1, start=5, like=like))
    frames, rows, columns = np.meshgrid(np.arange(2), np.arange(3), np.arange(2), indexing="ij")
    want = np.concatenate([np.zeros((3, 1)), np.stack([frames, rows, columns]).reshape(3, -1) + 5], axis=1)
    np.testing.assert_array_equal(got, want)


def test_properties() -> None:
    rope = anyrope.RoPE(16, axial=2, axial_frequencies="alternating")
    assert (rope.axial, rope.axial_frequencies, rope.streams, rope.mrope_section) == (
        2,
        "alternating",
        2,
        None,
    )
    assert rope.pair_streams == (0, 0, 0, 0, 1, 1, 1, 1)
    assert rope.pair_frequencies == (0, 2, 4, 6, 1, 3, 5, 7)
    assert anyrope.RoPE(16, axial=2).pair_frequencies == (0, 2, 4, 6, 0, 2, 4, 6)
    assert repr(rope) == "RoPE(16, base=10000.0, layout='half', axial=2, axial_frequencies='alternating')"
    assert anyrope.RoPE(16).axial is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"axial": 3}, ValueError, "8 pairs, which 3 axes cannot share equally"),
        ({"axial": 0}, ValueError, "axial=0 must be a positive int"),
        (
            {"axial": 2, "axial_frequencies": "zigzag"},
            ValueError,
            "axial_frequencies='zigzag' must be one of",
        ),
        ({"axial_frequencies": "alternating"}, ValueError, "needs axial="),
        ({"axial": 2, "mrope_section": [4, 2, 2]}, ValueError, "pass mrope_section or axial, not both"),
        ({"axial": 2, "xpos_scale_base": 512}, ValueError, "does not combine"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE(16, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: anyrope.grid_positions(()), TypeError, "non-empty sequence"),
        (lambda: anyrope.grid_positions((2, 0)), ValueError, "shape entries=0 must be a positive int"),
        (
            lambda: anyrope.grid_positions((2, 2), prefix=-1),
            ValueError,
            "prefix=-1 must be a non-negative int",
        ),
        (
            lambda: anyrope.RoPE(16, axial=2)(
                np.ones((1, 4, 16)), positions=np.zeros((3, 4), dtype=np.int64)
            ),
            ValueError,
            "do not fit this RoPE's 2 position streams",
        ),
    ],
)
def test_bad_grids(call: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]


def test_rerotate_needs_the_same_axes() -> None:
    """Keys of an axial RoPE move to another frequency split, not to another stream layout."""
    blocks, alternating = (
        anyrope.RoPE(16, axial=2),
        anyrope.RoPE(16, axial=2, axial_frequencies="alternating"),
    )
    k = _x((1, 1, 6, 16), 3)
    positions = anyrope.grid_positions((2, 3))
    moved = anyrope.rerotate(blocks(k, positions=positions), blocks, alternating, positions=positions)
    np.testing.assert_allclose(moved, alternating(k, positions=positions), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="old and new must share axial"):
        anyrope.rerotate(k, blocks, anyrope.RoPE(16), positions=positions)
