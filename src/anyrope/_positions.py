"""Checking and normalising ``positions`` and ``offset`` arguments."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import array_api_compat

from ._compat import _by_type as _array_types
from ._compat import isdtype

__all__ = ["as_index_array", "is_array", "plain_offset"]


def is_array(value: Any) -> bool:
    # Types already seen as arrays answer from the namespace cache (a dict lookup).
    return type(value) in _array_types or array_api_compat.is_array_api_obj(value)


def as_index_array(xp: Any, value: Any, *, device: Any, arg: str, ndims: Sequence[int] | None) -> Any:
    """``value`` (an array of ``xp`` or nested Python ints) as a checked integer array.

    Raises TypeError for non-integers and ValueError for negatives or a rank not in ``ndims``.
    """
    if not is_array(value):
        if isinstance(value, (str, bytes)) or not (
            isinstance(value, Sequence) or hasattr(value, "__index__")
        ):
            raise TypeError(
                f"{arg} must be an integer array or a sequence of ints, not {type(value).__name__}"
            )
        if _has_non_int(value):
            raise TypeError(f"{arg} must hold integers, got {value!r}")
        if len({len(row) if isinstance(row, Sequence) else -1 for row in _rows(value)}) > 1:
            raise ValueError(f"{arg} must be rectangular: every row needs the same length")
        value = xp.asarray(value, dtype=xp.int64, device=device)
    elif not isdtype(xp, value.dtype, "integral"):
        raise TypeError(
            f"{arg} must be an integer array, got dtype {value.dtype}; positions count tokens, "
            "so cast them to int64 (fractional positions come from scaling=, not from here)"
        )
    if ndims is not None and value.ndim not in ndims:
        wanted = " or ".join(f"{n}-d" for n in ndims)
        raise ValueError(f"{arg} must be {wanted}, got shape {tuple(value.shape)}")
    if math.prod(value.shape) and int(xp.min(value)) < 0:  # min: a third of any's cost on torch
        raise ValueError(f"{arg} must be non-negative; got a negative entry")
    return value


def _rows(value: Any) -> list[Any]:
    return list(value) if isinstance(value, Sequence) else []


def _has_non_int(value: Any) -> bool:
    if isinstance(value, Sequence):
        return any(_has_non_int(v) for v in value)
    return isinstance(value, bool) or not hasattr(value, "__index__")


def plain_offset(offset: Any) -> int | None:
    """``offset`` as a Python int when it is one int, else None (it is per-row)."""
    if is_array(offset):
        return None if offset.ndim else _checked_int(offset)
    if isinstance(offset, Sequence) and not isinstance(offset, (str, bytes)):
        return None
    return _checked_int(offset)


def _checked_int(offset: Any) -> int:
    if isinstance(offset, bool):
        raise TypeError("offset must be an int or one int per batch row, not a bool")
    try:
        value = operator.index(offset)
    except TypeError:
        raise TypeError(
            f"offset must be an int or one int per batch row, not {type(offset).__name__} {offset!r}"
        ) from None
    if value < 0:
        raise ValueError(f"offset={value} must be non-negative (the number of tokens already cached)")
    return value
