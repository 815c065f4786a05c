"""Packed variable-length batches (flash-attn's ``cu_seqlens``): positions against a loop over
sequences, eagerly and compiled, and RoPE on a packed buffer equal to RoPE on each sequence."""

from __future__ import annotations

import doctest
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import anyrope
from anyrope import _packed, packed_positions
from anyrope._compat import device_of

from harness import Backend


def oracle(lengths: Sequence[int], total: int, offsets: Any = 0) -> np.ndarray:
    """Positions by a loop over sequences; padding tokens (past the last sequence) get 0."""
    per_sequence = np.broadcast_to(np.asarray(offsets, dtype=np.int64), (len(lengths),))
    positions = np.zeros(total, dtype=np.int64)
    start = 0
    for length, offset in zip(lengths, per_sequence, strict=True):
        for j in range(length):
            positions[start + j] = offset + j
        start += length
    return positions


def cumulative(lengths: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


_RANDOM = [int(n) for n in np.random.default_rng(7).integers(0, 6, size=9)] + [0]  # some empty
# name: (sequence lengths, padding tokens after the last sequence, offsets: None, an int,
# "0-d" (a 0-d array) or "per-sequence" (one array entry per sequence))
CASES: dict[str, tuple[list[int], int, Any]] = {
    "random, padded, per-sequence": (_RANDOM, 3, "per-sequence"),
    "random, int offset": (_RANDOM, 0, 11),
    "leading empty, padded, 0-d": ([0, 4, 2], 2, "0-d"),
    "single sequence, 0-d": ([6], 0, "0-d"),
    "single sequence, padded": ([4], 5, None),
    "all empty, per-sequence": ([0, 0, 0], 3, "per-sequence"),
    "no sequences": ([], 4, None),
    "no tokens": ([0, 0], 0, 5),
}


def _offsets(backend: Backend, kind: Any, num_seqs: int) -> tuple[Any, Any]:
    """(the offsets argument, its values in NumPy) for a kind of CASES."""
    if kind == "per-sequence":
        values = np.random.default_rng(num_seqs).integers(-20, 1000, size=num_seqs)
        return backend.asarray(values), values
    if kind == "0-d":
        return backend.asarray(np.array(100)), np.array(100)
    return kind, 0 if kind is None else kind


def _positions(backend: Backend, mode: str, cu_seqlens: Any, total: int, offsets: Any) -> Any:
    """packed_positions as ``mode`` runs it, array offsets traced, Python ones constants."""
    if offsets is None or isinstance(offsets, int):
        return backend.compile(lambda cu: packed_positions(cu, total, offsets=offsets), mode)(cu_seqlens)
    return backend.compile(lambda cu, o: packed_positions(cu, total, offsets=o), mode)(cu_seqlens, offsets)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_loop_over_sequences(backend: Backend, case: str) -> None:
    _check_case(backend, "eager", case)


@pytest.mark.parametrize("case", ["random, padded, per-sequence", "leading empty, padded, 0-d"])
def test_compiled_matches_the_loop_over_sequences(backend: Backend, mode: str, case: str) -> None:
    """Under each compiler: offsets as traced arrays (per sequence, 0-d); a constant one is in
    the packed RoPE test below."""
    _check_case(backend, mode, case)


def _check_case(backend: Backend, mode: str, case: str) -> None:
    lengths, padding, kind = CASES[case]
    total = sum(lengths) + padding
    offsets, values = _offsets(backend, kind, len(lengths))
    cu_seqlens = backend.asarray(cumulative(lengths))
    got = _positions(backend, mode, cu_seqlens, total, offsets)
    assert got.shape == (total,)
    assert got.dtype == backend.dtype(backend.index)
    assert device_of(backend.xp, got) == device_of(backend.xp, cu_seqlens)
    np.testing.assert_array_equal(backend.to_numpy(got), oracle(lengths, total, values))


@given(
    lengths=st.lists(st.integers(0, 7), max_size=8),
    padding=st.integers(0, 4),
    offsets=st.one_of(st.none(), st.integers(-1000, 1000), st.just("per-sequence"), st.just("0-d")),
    int_dtype=st.sampled_from(["int32", "int64", "uint8", "int16"]),
)
def test_random_layouts(
    backend: Backend, lengths: list[int], padding: int, offsets: Any, int_dtype: str
) -> None:
    """Random lengths (empty sequences included), padding, offsets and cu_seqlens dtypes, eagerly."""
    if np.iinfo(int_dtype).bits > np.iinfo(backend.index).bits or not hasattr(backend.xp, int_dtype):
        int_dtype = backend.index
    total = sum(lengths) + padding
    argument, values = _offsets(backend, offsets, len(lengths))
    cu_seqlens = backend.asarray(cumulative(lengths).astype(int_dtype))
    got = packed_positions(cu_seqlens, total, offsets=argument)
    np.testing.assert_array_equal(backend.to_numpy(got), oracle(lengths, total, values))


def test_rope_on_a_packed_buffer_equals_rope_on_each_sequence(backend: Backend, mode: str) -> None:
    """RoPE with packed positions rotates each sequence exactly as RoPE on that sequence alone,
    started at its offset, and leaves padding tokens as they were (position 0); offsets one per
    sequence (traced) and one int (a constant).

    Compiled, the packed call is compared with the same call eagerly, within the few ulps a
    compiler's own fusion and trigonometry may change; eagerly, with each sequence alone, bit
    for bit."""
    lengths, padding = [3, 0, 5, 1, 4], 2
    total, head_dim = sum(lengths) + padding, 8
    rope = anyrope.RoPE(head_dim)
    q = backend.asarray(_x((total, 4, head_dim), 1), "float32")
    k = backend.asarray(_x((total, 2, head_dim), 2), "float32")  # grouped heads
    cu_np = cumulative(lengths)
    cu_seqlens = backend.asarray(cu_np)

    def packed(q: Any, k: Any, cu: Any, o: Any) -> Any:
        return rope(q, k, positions=packed_positions(cu, q.shape[0], offsets=o), seq_axis=-3)

    by_array = backend.compile(packed, mode)
    by_int = backend.compile(lambda q, k, cu: packed(q, k, cu, 3), mode)
    per_sequence = np.random.default_rng(0).integers(-20, 1000, size=len(lengths))
    for got, offsets, eager in (
        (by_array(q, k, cu_seqlens, backend.asarray(per_sequence)), per_sequence, per_sequence),
        (by_int(q, k, cu_seqlens), np.full(len(lengths), 3), 3),
    ):
        if mode != "eager":
            for result, expected in zip(
                got, packed(q, k, cu_seqlens, _eager_offsets(backend, eager)), strict=True
            ):
                scale = max(1.0, float(np.max(np.abs(backend.to_numpy(expected)))))
                np.testing.assert_allclose(
                    backend.to_numpy(result), backend.to_numpy(expected), rtol=0, atol=4e-7 * scale
                )
            continue
        want = [backend.to_numpy(q).copy(), backend.to_numpy(k).copy()]  # padding unchanged
        for i, (start, end) in enumerate(itertools.pairwise(cu_np)):
            if start == end:
                continue
            rotated = rope(q[start:end, ...], k[start:end, ...], offset=int(offsets[i]), seq_axis=-3)
            for whole, part in zip(want, rotated, strict=True):
                whole[start:end] = backend.to_numpy(part)
        for result, expected in zip(got, want, strict=True):
            np.testing.assert_array_equal(backend.to_numpy(result), expected)


def _eager_offsets(backend: Backend, offsets: Any) -> Any:
    return offsets if isinstance(offsets, int) else backend.asarray(offsets)


class _WithoutSearchsorted:
    """A namespace that lacks ``searchsorted``, as older MLX did."""

    def __init__(self, xp: Any) -> None:
        self._xp = xp

    def __getattr__(self, name: str) -> Any:
        if name == "searchsorted":
            raise AttributeError(name)
        return getattr(self._xp, name)


@pytest.mark.parametrize("lengths", [[3, 0, 5, 1, 0], [], [0, 0], [7]])
def test_fallback_without_searchsorted_agrees(backend: Backend, lengths: list[int]) -> None:
    xp, index = backend.xp, backend.dtype(backend.index)
    bounds = backend.asarray(cumulative(lengths))
    tokens = xp.arange(sum(lengths) + 2, dtype=index, device=backend.device)
    fast = _packed._sequence_of(xp, bounds, tokens, index)
    counted = _packed._sequence_of(_WithoutSearchsorted(xp), bounds, tokens, index)
    assert fast.dtype == counted.dtype == index
    want = np.searchsorted(cumulative(lengths)[1:], np.arange(sum(lengths) + 2), side="right")
    np.testing.assert_array_equal(backend.to_numpy(fast), want)
    np.testing.assert_array_equal(backend.to_numpy(counted), want)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda b: packed_positions([0, 3], 3), TypeError, "cu_seqlens must be an array"),
        (
            lambda b: packed_positions(b.asarray(np.zeros((2, 2), np.int64)), 3),
            ValueError,
            "cu_seqlens must be 1-d",
        ),
        (
            lambda b: packed_positions(b.asarray(np.zeros(0, np.int64)), 3),
            ValueError,
            r"cu_seqlens .*shape \(0,\)",
        ),
        (
            lambda b: packed_positions(b.asarray(np.array([0.0, 3.0]), "float32"), 3),
            TypeError,
            "cu_seqlens must be an integer array",
        ),
        (
            lambda b: packed_positions(b.asarray(np.array([0, 3])), -1),
            ValueError,
            "total=-1 must be a non-negative int",
        ),
        (lambda b: packed_positions(b.asarray(np.array([0, 3])), 3.0), TypeError, "total must be an int"),
        (lambda b: packed_positions(b.asarray(np.array([0, 3])), None), TypeError, "total must be an int"),
        (lambda b: packed_positions(b.asarray(np.array([0, 3])), 2**63), ValueError, "total=.* does not fit"),
        (
            lambda b: packed_positions(b.asarray(np.array([0, 3])), 3, offsets=1.5),
            TypeError,
            "offsets must be an int or an integer array",
        ),
        (
            lambda b: packed_positions(b.asarray(np.array([0, 3])), 3, offsets=True),
            TypeError,
            "offsets must be an int",
        ),
        (
            lambda b: packed_positions(b.asarray(np.array([0, 3])), 3, offsets=[1]),
            TypeError,
            "offsets must be an int",
        ),
        (
            lambda b: packed_positions(b.asarray(np.array([0, 3])), 3, offsets=2**70),
            ValueError,
            "offsets=.* does not fit",
        ),
        (
            lambda b: packed_positions(
                b.asarray(np.array([0, 3])), 3, offsets=b.asarray(np.array([1.0]), "float32")
            ),
            TypeError,
            "offsets must be an integer array",
        ),
        (
            lambda b: packed_positions(
                b.asarray(np.array([0, 3, 4])), 4, offsets=b.asarray(np.array([1, 2, 3]))
            ),
            ValueError,
            r"offsets of shape \(3,\) do not fit 2 sequences.*shape \(2,\)",
        ),
        (
            lambda b: packed_positions(
                b.asarray(np.array([0, 3])), 3, offsets=b.asarray(np.zeros((1, 1), np.int64))
            ),
            ValueError,
            r"offsets of shape \(1, 1\)",
        ),
    ],
)
def test_rejects_bad_arguments(backend: Backend, call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(backend)


@pytest.mark.parametrize(
    ("cu", "total", "match"),
    [
        ([1, 3], 3, "cu_seqlens must start at 0, got 1"),
        ([0, 4, 2, 5], 5, r"cu_seqlens must not decrease .* cu_seqlens\[1\]=4 > cu_seqlens\[2\]=2"),
        ([0, 2, 6], 5, "cu_seqlens ends at 6, past total=5"),
    ],
)
def test_rejects_bad_cu_seqlens_known_on_the_host(
    backend: Backend, cu: list[int], total: int, match: str
) -> None:
    if not backend.host_values:
        pytest.skip(f"{backend.id}: cu_seqlens' values are not read on the host")
    with pytest.raises(ValueError, match=match):
        packed_positions(backend.asarray(np.array(cu)), total)


def test_offsets_of_another_library(backend: Backend) -> None:
    if backend.name == "numpy":
        pytest.skip("needs a library other than NumPy")
    with pytest.raises(TypeError, match=r"cu_seqlens is a .* array but offsets is a numpy array"):
        packed_positions(backend.asarray(np.array([0, 3])), 3, offsets=np.array([1]))


def test_docstring_example() -> None:
    result = doctest.testmod(_packed, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
