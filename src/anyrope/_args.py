"""Python arguments: the one integer validator and the one positive-number validator that every
front end uses, so each message names the argument and says what was wanted."""

from __future__ import annotations

import math
import operator
from typing import Any

__all__ = ["check_int", "check_positive"]


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
    if type(value) is int:  # the common case, first: this runs on every call
        number = value
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{arg} must be an int, not {type(value).__name__}")
    else:
        number = operator.index(value)
    if (low is not None and number < low) or (high is not None and number > high) or (even and number % 2):
        raise ValueError(f"{arg}={number} must be {_wanted(low, high, even)}{why}")
    return number


def _wanted(low: int | None, high: int | None, even: bool) -> str:
    kind = "even number" if even else "int"
    if high is not None:
        return f"an {kind} from {low} to {high}" if low is not None else f"an {kind} at most {high}"
    if low == 1:
        return f"a positive {kind}"
    if low == 0:
        return f"a non-negative {kind}"
    return f"an {kind} of at least {low}" if low is not None else f"an {kind}"


def check_positive(value: Any, arg: str, *, at_least: float | None = None, why: str = "") -> float:
    """``value`` as a positive finite float (at least ``at_least``), or a ValueError naming ``arg``."""
    # Comparisons rather than math.isfinite: dynamo may trace a float argument as a symbol.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{arg}={value!r} must be a positive finite number{why}")
    if at_least is not None and value < at_least:
        raise ValueError(f"{arg}={value!r} must be at least {at_least}{why}")
    return float(value)
