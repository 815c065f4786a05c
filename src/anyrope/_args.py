"""Python arguments: the one validator of each kind (ints, real numbers, lists of numbers, flags)
that every front end uses, the constructors of scaling methods and the config reader included,
so each message names the argument and says what was wanted.

A leaf module: it imports nothing from the package.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "check_bool",
    "check_float_vector",
    "check_int",
    "check_number",
    "check_numbers",
    "check_positive",
    "shown",
]


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
    elif isinstance(value, bool) or _is_boolean(value) or not hasattr(value, "__index__"):
        raise TypeError(f"{arg} must be an int, not {type(value).__name__}{why}")
    else:
        try:
            number = operator.index(value)
        except TypeError:  # NumPy arrays have __index__ but only 0-d integer ones answer it
            raise TypeError(f"{arg} must be an int, not {type(value).__name__}{why}") from None
    if (low is not None and number < low) or (high is not None and number > high) or (even and number % 2):
        raise ValueError(f"{arg}={shown(number)} must be {_wanted(low, high, even)}{why}")
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


def check_number(value: Any, arg: str, *, low: float = 0.0, strict: bool = True, why: str = "") -> float:
    """``value`` as a finite float above ``low`` (``strict``) or at least it, or a TypeError /
    ValueError naming ``arg``.

    Every real scalar counts (Python and NumPy ints and floats, fractions), as configs and arrays
    hand out NumPy scalars; bools do not. ``arg`` is an argument's name (the message reads
    ``base=0.0 must be ...``) or a description of where the value came from (``the config's
    'factor' is 0.0; it must be ...``).
    """
    if isinstance(value, bool):
        raise TypeError(f"{_subject(arg, value)} must be a number, not bool{why}")
    if isinstance(value, (int, float)):  # first, and as is: dynamo may trace a float as a symbol
        number: Any = value
    elif isinstance(value, numbers.Real):  # NumPy scalars, fractions
        number = _float(value, arg, why)
    else:
        raise TypeError(f"{_subject(arg, value)} must be a number, not {type(value).__name__}{why}")
    # Comparisons rather than math.isfinite: dynamo may trace a float argument as a symbol.
    if not (low < number if strict else low <= number) or not number < math.inf:
        raise ValueError(f"{_subject(arg, value)} must be {_range(low, strict)}{why}")
    return _float(number, arg, why)


def _float(value: Any, arg: str, why: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int past float's range (10**400)
        raise ValueError(f"{_subject(arg, value)} must be a finite number{why}") from None


def _range(low: float, strict: bool) -> str:
    if low == 0 and strict:
        return "a positive finite number"
    return f"a finite number {'above' if strict else 'of at least'} {low:g}"


def _subject(arg: str, value: Any) -> str:
    """``arg=value`` for an argument's name, else "where is value; it"."""
    return f"{arg}={shown(value)}" if arg.isidentifier() else f"{arg} is {shown(value)}; it"


def check_positive(value: Any, arg: str, *, at_least: float | None = None, why: str = "") -> float:
    """``value`` as a positive finite float (at least ``at_least``), or a TypeError / ValueError naming ``arg``."""
    number = check_number(value, arg, why=why)
    if at_least is not None and number < at_least:
        raise ValueError(f"{_subject(arg, value)} must be at least {at_least}{why}")
    return number


def check_numbers(value: Any, arg: str, *, length: int | None = None, why: str = "") -> tuple[float, ...]:
    """A list (sequence, 1-d array) of positive finite numbers as a tuple of floats (``length`` of
    them, where given), or a TypeError / ValueError naming ``arg``; a string is not a list."""
    listed = hasattr(value, "__len__") and hasattr(value, "__getitem__")
    if isinstance(value, (str, bytes, Mapping)) or not (isinstance(value, Sequence) or listed):
        raise TypeError(f"{arg} must be a list of numbers, got {type(value).__name__}{why}")
    checked = []
    for i, item in enumerate(value):
        try:
            checked.append(check_number(item, f"{arg}[{i}]"))
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"{arg}[{i}] is {shown(item)}; {arg} must hold positive finite numbers{why}"
            ) from None
    if length is not None and len(checked) != length:
        raise ValueError(f"{arg} has {len(checked)} entries; it needs {length}, one per pair{why}")
    return tuple(checked)


def check_float_vector(value: Any, arg: str, *, length: int, why: str = "") -> tuple[float, ...]:
    """:func:`check_numbers` for a sequence, or for a 1-D array of real floating dtype of any
    library (a checkpoint's weight: NumPy, a torch tensor on any device, ...), read once here.
    Integer, bool and complex arrays are refused: such a weight is not a frequency scale."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "shape"):
        kind = str(dtype).rsplit(".", 1)[-1]  # float32 from torch.float32, mlx.core.float32, NumPy's
        if not kind.startswith(("float", "bfloat")):
            raise TypeError(f"{arg} must have a real floating dtype, not {kind}{why}")
        if len(value.shape) != 1:
            raise ValueError(f"{arg} must be 1-D, one entry per pair, not of shape {tuple(value.shape)}{why}")
        value = value.tolist()  # Python floats (a tensor that requires grad too: its values now)
    return check_numbers(value, arg, length=length, why=why)


def check_bool(value: Any, arg: str, *, why: str = "") -> bool:
    """``value`` if it is True or False (NumPy's bool too), else a TypeError naming ``arg``: a
    string such as "false" would read as True."""
    if type(value) is bool:
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # NumPy 2, 1
        return bool(value)
    raise TypeError(f"{_subject(arg, value)} must be True or False, not {type(value).__name__}{why}")


def shown(value: Any) -> str:
    """``repr(value)`` for a message, shortened: an int of thousands of digits cannot be printed."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an int of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...{text[-12:]}"


def _is_boolean(value: Any) -> bool:
    """A NumPy (or other array library's) boolean scalar or 0-d array: older NumPy's
    ``__index__`` takes it, with a DeprecationWarning, though True for a length is a mistake."""
    return getattr(getattr(value, "dtype", None), "kind", None) == "b"
