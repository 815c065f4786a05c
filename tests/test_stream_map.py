"""Any map from frequency pair to position stream (``pair_streams``, ``pair_frequencies``) against
the float64 oracle on every backend, eagerly and compiled; M-RoPE and axial RoPE as named cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope

import oracle
from harness import Backend, assert_close, assert_same

LAYOUTS = ["half", "interleaved"]
# 12 pairs. ERNIE 4.5-VL's form (height and width alternate over the first 8, time takes the
# rest); frequencies of its own per stream, with a stream no pair follows (row 2 unread) and a
# frequency used twice; four streams in contiguous runs that come back (no named case).
MAPS: dict[str, tuple[list[int], list[int] | None]] = {
    "ernie": ([1, 2, 1, 2, 1, 2, 1, 2, 0, 0, 0, 0], None),
    "reordered, unread stream": (
        [0, 3, 0, 3, 0, 3, 3, 0, 0, 3, 3, 0],
        [0, 1, 2, 3, 4, 5, 5, 7, 8, 9, 10, 11],
    ),
    "runs": ([0, 0, 1, 1, 2, 2, 3, 3, 0, 1, 2, 3], None),
}


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _rounded(backend: Backend, a: np.ndarray, dtype: str) -> np.ndarray:
    return backend.to_numpy(backend.asarray(a, dtype)).astype(np.float64)


def _positions(streams: int) -> np.ndarray:
    """(streams, 2, 7): every stream its own positions, far ones and a negative one included."""
    rng = np.random.default_rng(streams)
    return rng.integers(-5, 9000, size=(streams, 2, 7))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(MAPS))
def test_matches_oracle(backend: Backend, dtype: str, layout: str, name: str) -> None:
    _check_against_oracle(backend, "eager", dtype, layout, name)


def test_compiled_matches_oracle(backend: Backend, mode: str) -> None:
    _check_against_oracle(backend, mode, "float32", "interleaved", "reordered, unread stream")


def _check_against_oracle(backend: Backend, mode: str, dtype: str, layout: str, name: str) -> None:
    streams, frequencies = MAPS[name]
    rope = anyrope.RoPE(
        32, rotary_dim=24, layout=layout, base=5000.0, pair_streams=streams, pair_frequencies=frequencies
    )
    assert rope.pair_streams == tuple(streams)
    assert rope.pair_frequencies == tuple(frequencies or range(12))
    positions = _positions(max(streams) + 1)
    q_np, k_np = _x((2, 3, 7, 32)), _x((2, 1, 7, 32), 1)
    q, k = backend.asarray(q_np, dtype), backend.asarray(k_np, dtype)
    call = backend.compile(lambda q, k, p: rope(q, k, positions=p), mode)
    got = call(q, k, backend.asarray(positions))
    for out, data in zip(got, (q_np, k_np), strict=True):
        want = oracle.stream_map_rotate(
            _rounded(backend, data, dtype),
            positions,
            np.array(streams),
            np.array(rope.pair_frequencies),
            layout=layout,
            rotary_dim=24,
            base=5000.0,
        )
        assert out.dtype == q.dtype
        assert_close(backend, out, want, dtype)


NAMED: dict[str, dict[str, Any]] = {
    "contiguous": {"mrope_section": [3, 2, 3]},
    "interleaved": {"mrope_section": [4, 2, 2], "mrope_interleaved": True},
    "axial blocks": {"axial": 2},
    "axial alternating": {"axial": 2, "axial_frequencies": "alternating"},
    "video": {"axial": 4, "axial_frequencies": "alternating"},
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_cases_are_maps(backend: Backend, name: str) -> None:
    """M-RoPE and axial RoPE given as their map are built as themselves, and rotate alike."""
    named = anyrope.RoPE(16, **NAMED[name])
    given = anyrope.RoPE(16, pair_streams=named.pair_streams, pair_frequencies=named.pair_frequencies)
    assert repr(given) == repr(named)
    for attr in ("mrope_section", "mrope_interleaved", "axial", "axial_frequencies", "streams"):
        assert getattr(given, attr) == getattr(named, attr)
    x = backend.asarray(_x((2, 2, 7, 16)), "float32")
    positions = backend.asarray(_positions(named.streams))
    assert_same(backend, given(x, positions=positions), named(x, positions=positions), "float32")


def test_text_tokens_turn_as_plain_rope(backend: Backend) -> None:
    """Streams that agree on a map of the pairs' own frequencies are plain RoPE, bit for bit."""
    rope = anyrope.RoPE(24, pair_streams=MAPS["ernie"][0])
    plain = anyrope.RoPE(24)
    x = backend.asarray(_x((2, 2, 5, 24)), "float32")
    same = backend.asarray(np.tile(np.arange(3, 8), (3, 1)))
    for got in (
        rope(x, offset=3),
        rope(x, positions=backend.asarray(np.arange(3, 8))),
        rope(x, positions=same),
    ):
        assert bool(backend.xp.all(got == plain(x, offset=3)))


def test_cos_sin_and_apply(backend: Backend) -> None:
    rope = anyrope.RoPE(24, pair_streams=MAPS["runs"][0])
    positions = _positions(4)
    like = backend.asarray(np.zeros(1), "float32")
    cos, sin = rope.cos_sin(backend.asarray(positions), like=like)
    theta = oracle.inv_freq(24)
    angles = np.stack([positions[s] for s in MAPS["runs"][0]], axis=-1) * theta
    assert_close(backend, cos, np.cos(angles), "float32")
    assert_close(backend, sin, np.sin(angles), "float32")


def test_repr_and_layer_config() -> None:
    streams, frequencies = MAPS["reordered, unread stream"]
    rope = anyrope.RoPE(24, pair_streams=streams, pair_frequencies=frequencies)
    assert (
        repr(rope)
        == f"RoPE(24, base=10000.0, layout='half', pair_streams={streams}, pair_frequencies={frequencies})"
    )
    assert (rope.mrope_section, rope.axial, rope.streams) == (None, None, 4)
    ernie = anyrope.RoPE(24, pair_streams=MAPS["ernie"][0])
    assert "pair_frequencies" not in repr(ernie)
    from anyrope.layers._build import rope_config, rope_from_config

    for made in (rope, ernie):
        again = rope_from_config(rope_config(made))
        assert repr(again) == repr(made)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"pair_streams": [0, 1] * 3},
            ValueError,
            r"pair_streams has 6 entries but this RoPE has 8 frequency pairs",
        ),
        ({"pair_streams": [0] * 8}, ValueError, "every pair on stream 0, which is plain RoPE"),
        ({"pair_streams": [0, 1, 0, 1, 0, 1, 0, -1]}, ValueError, r"pair_streams must hold ints from 0 to 7"),
        ({"pair_streams": [0, 1, 0, 1, 0, 1, 0, 8]}, ValueError, r"pair_streams must hold ints from 0 to 7"),
        ({"pair_streams": [0, 1, 0, 1, 0, 1, 0, True]}, ValueError, "pair_streams must hold ints"),
        ({"pair_streams": [0, 1, 0, 1, 0, 1, 0, 1.0]}, ValueError, "pair_streams must hold ints"),
        ({"pair_streams": "01010101"}, TypeError, "pair_streams must be a sequence of ints"),
        ({"pair_streams": 2}, TypeError, "pair_streams must be a sequence of ints"),
        (
            {"pair_streams": [0, 1] * 4, "pair_frequencies": [0, 1, 2, 3, 4, 5, 6, 8]},
            ValueError,
            r"pair_frequencies must hold ints from 0 to 7",
        ),
        (
            {"pair_streams": [0, 1] * 4, "pair_frequencies": [0] * 7},
            ValueError,
            "pair_frequencies has 7 entries",
        ),
        ({"pair_frequencies": list(range(8))}, ValueError, "pair_frequencies needs pair_streams="),
        (
            {"pair_streams": [0, 1] * 4, "mrope_section": [4, 4]},
            ValueError,
            "pass pair_streams, mrope_section or axial",
        ),
        ({"pair_streams": [0, 1] * 4, "axial": 2}, ValueError, "pass pair_streams, mrope_section or axial"),
        (
            {"pair_streams": [0, 1] * 4, "xpos_scale_base": 512.0},
            ValueError,
            "xpos_scale_base does not combine",
        ),
    ],
)
def test_bad_maps(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        anyrope.RoPE(16, **kwargs)


def test_bad_positions(backend: Backend) -> None:
    """Positions need one row per stream, up to the highest stream the map names."""
    rope = anyrope.RoPE(24, pair_streams=MAPS["reordered, unread stream"][0])
    x = backend.asarray(_x((2, 1, 7, 24)), "float32")
    with pytest.raises(ValueError, match=r"do not fit this RoPE's 4 position streams"):
        rope(x, positions=backend.asarray(np.zeros((3, 2, 7), dtype=np.int64)))
    with pytest.raises(ValueError, match="old and new must share pair_streams"):
        anyrope.rerotate(
            x, rope, anyrope.RoPE(24, pair_streams=MAPS["runs"][0]), positions=np.zeros((4, 7), np.int64)
        )
