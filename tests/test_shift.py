"""Shifting cached keys (``rerotate(..., shift=)``, llama.cpp's context shift): keys moved by
``shift`` positions equal keys rotated at the shifted positions, for every layout, scaling method
and M-RoPE, on every backend, eagerly and compiled with the shift as a traced input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

from harness import Backend, assert_close

ROPES = {
    "plain": anyrope.RoPE(16),
    "partial interleaved": anyrope.RoPE(16, rotary_dim=8, layout="interleaved", base=500.0),
    "yarn": anyrope.RoPE(16, scaling=sc.YaRN(4.0, 8)),
    "llama3": anyrope.RoPE(16, scaling=sc.Llama3(8.0, 1.0, 4.0, 8)),
    # the new length is the shifted keys' own: as a call at those positions chooses it
    "dynamic": anyrope.RoPE(16, scaling=sc.DynamicNTK(2.0, 8)),
    "longrope": anyrope.RoPE(16, scaling=sc.LongRoPE([1.0, 1.2, 1.5, 2.0] * 2, [2.0, 3.0, 4.0, 5.0] * 2, 8)),
    "dynamic at one length": anyrope.RoPE(16, scaling=sc.DynamicNTK(2.0, 8)).at_length(64),
    "clockwise": anyrope.RoPE(16, clockwise=True),
}
POSITIONS = np.array([[0, 1, 2, 3, 4], [12, 13, 14, 15, 16]])
SHIFTS = {"int": -3, "0-d": np.array(9), "per row": np.array([4, -10])}


def _k(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3, 5, 16))


def _shift_value(backend: Backend, kind: str) -> Any:
    value = SHIFTS[kind]
    return value if isinstance(value, int) else backend.asarray(value)


def _moved(positions: np.ndarray, shift: Any) -> np.ndarray:
    shift = np.asarray(shift)
    return positions + (shift[:, None] if shift.ndim == 1 else shift)


def _check(backend: Backend, mode: str, rope: anyrope.RoPE, kind: str) -> None:
    k_np = _k()
    k = backend.asarray(k_np, "float32")
    positions = backend.asarray(POSITIONS)
    shift = _shift_value(backend, kind)
    if isinstance(shift, int):
        call = backend.compile(
            lambda k, p: anyrope.rerotate(rope(k, positions=p), rope, rope, positions=p, shift=shift), mode
        )
        out = call(k, positions)
    else:
        call = backend.compile(
            lambda k, p, s: anyrope.rerotate(rope(k, positions=p), rope, rope, positions=p, shift=s), mode
        )
        out = call(k, positions, shift)
    want = rope(
        k_np, positions=_moved(POSITIONS, SHIFTS[kind])
    )  # float64, checked against the oracle elsewhere
    assert_close(backend, out, want, "float32")


@pytest.mark.parametrize("kind", list(SHIFTS))
@pytest.mark.parametrize("name", list(ROPES))
def test_shift_equals_rotating_at_the_shifted_positions(backend: Backend, name: str, kind: str) -> None:
    _check(backend, "eager", ROPES[name], kind)


@pytest.mark.parametrize(("name", "kind"), [("plain", "per row"), ("dynamic", "0-d")])
def test_compiled_shift(backend: Backend, mode: str, name: str, kind: str) -> None:
    _check(backend, mode, ROPES[name], kind)


def test_shift_with_an_offset_and_between_configurations(backend: Backend) -> None:
    """Keys cached from offset 20 under base 10000, moved to offset 5 under base 500."""
    old, new = anyrope.RoPE(16), anyrope.RoPE(16, base=500.0)
    k_np = _k(1)
    k = backend.asarray(k_np, "float32")
    out = anyrope.rerotate(old(k, offset=20), old, new, offset=20, shift=-15)
    assert_close(backend, out, new(k_np, offset=5), "float32")


MROPE = anyrope.RoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True)
STREAMS = np.array([[0, 1, 2, 2, 4], [0, 1, 2, 3, 4], [0, 1, 3, 2, 4]])  # (3, seq)


@pytest.mark.parametrize(
    ("shift", "moved"),
    [
        (-2, STREAMS - 2),
        (np.array([5, -1, 3]), STREAMS + np.array([5, -1, 3])[:, None]),  # one per stream
        (
            np.array([[5, 0], [-1, 2], [3, 7]]),
            STREAMS[:, None, :] + np.array([[5, 0], [-1, 2], [3, 7]])[..., None],
        ),
    ],
    ids=["int", "per stream", "per stream and row"],
)
def test_shift_multi_axis_keys(backend: Backend, shift: Any, moved: np.ndarray) -> None:
    _check_multi_axis(backend, "eager", shift, moved)


def test_compiled_shift_multi_axis_keys(backend: Backend, mode: str) -> None:
    shift = np.array([[5, 0], [-1, 2], [3, 7]])  # one per stream and row, traced
    _check_multi_axis(backend, mode, shift, STREAMS[:, None, :] + shift[..., None])


def _check_multi_axis(backend: Backend, mode: str, shift: Any, moved: np.ndarray) -> None:
    k_np = _k(2)
    k = backend.asarray(k_np, "float32")
    positions = backend.asarray(STREAMS)
    given = shift if isinstance(shift, int) else backend.asarray(shift)
    call = backend.compile(
        lambda k, p, s: anyrope.rerotate(MROPE(k, positions=p), MROPE, MROPE, positions=p, shift=s), mode
    )
    if isinstance(shift, int):  # a constant of the compiled function
        call = backend.compile(
            lambda k, p: anyrope.rerotate(MROPE(k, positions=p), MROPE, MROPE, positions=p, shift=shift), mode
        )
        out = call(k, positions)
    else:
        out = call(k, positions, given)
    assert_close(backend, out, MROPE(k_np, positions=moved), "float32")
    # Text keys (one position for every stream, from an offset) shift per stream too.
    text = anyrope.rerotate(MROPE(k, offset=3), MROPE, MROPE, offset=3, shift=given)
    text_moved = np.arange(3, 8) + np.asarray(shift)[..., None]  # (seq,), (3, seq) or (3, batch, seq)
    assert_close(backend, text, MROPE(k_np, positions=text_moved), "float32")


@pytest.mark.parametrize(
    ("rope", "shift", "error", "match"),
    [
        (anyrope.RoPE(16), 1.5, TypeError, "shift must be an int or an integer array, not float"),
        (anyrope.RoPE(16), True, TypeError, "shift must be an int or an integer array, not bool"),
        (
            anyrope.RoPE(16),
            np.array([1.0, 2.0]),
            TypeError,
            "shift must be an int or an integer array, got dtype",
        ),
        (
            anyrope.RoPE(16),
            np.zeros((2, 2), dtype=np.int64),
            ValueError,
            r"shift of shape \(2, 2\) does not fit.*\(batch,\)",
        ),
        (
            anyrope.RoPE(16),
            np.zeros(3, dtype=np.int64),
            ValueError,
            "offset has 3 rows but k has batch size 2|positions has 3 rows",
        ),
        (
            MROPE,
            np.zeros(2, dtype=np.int64),
            ValueError,
            r"shift of shape \(2,\) does not fit.*\(streams=3,\)",
        ),
    ],
)
def test_bad_shift(rope: anyrope.RoPE, shift: Any, error: type[Exception], match: str) -> None:
    k = _k()
    with pytest.raises(error, match=match):
        anyrope.rerotate(k, rope, rope, offset=2, shift=shift)
