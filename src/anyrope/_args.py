"""Python arguments: the one integer validator every front end uses."""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["check_int"]


def check_int(
    value: Any,
    arg: str,
    *,
    low: int | None = None,
    high: int | None = None,
    even: bool = False,
    why: str = "",
) -> int:
    """``value`` as an int within ``[low, high]`` (and even), or a TypeError / ValueError naming ``arg``.

    Anything with ``__index__`` counts (NumPy integers, 0-d integer arrays of host libraries);
    bools do not, as ``True`` for a length is always a mistake. ``why`` ends the message.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{arg} must be an int, not {type(value).__name__}")
    number = operator.index(value)
    if (low is not None and number < low) or (high is not None and number > high) or (even and number % 2):
        raise ValueError(f"{arg}={number} must be {_wanted(low, high, even)}{why}")
    return number


def _wanted(low: int | None, high: int | None, even: bool) -> str:
    if high is not None:
        return f"an int from {low} to {high}" if low is not None else f"an int at most {high}"
    kind = "even number" if even else "int"
    if low == 1:
        return f"a positive {kind}"
    if low == 0:
        return f"a non-negative {kind}"
    return f"an {kind} of at least {low}" if low is not None else f"an {kind}"
