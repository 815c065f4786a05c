"""Exact angles: ``n * theta`` reduced modulo 2 pi in integer arithmetic, for any integer n.

A float64 product ``n * theta`` loses ``n * theta * 2**-53`` radians before any reduction, which
is 2048 rad at n = 2**63. Here theta (a float, so a dyadic rational) times n is formed exactly as
an integer in fixed point and reduced by 2 pi held to a few hundred bits; only the reduced
angle, in [0, 2 pi), is rounded to a float.
"""

from __future__ import annotations

__all__ = ["turn", "turns", "two_pi"]

_FRACTION_BITS = 256  # n * theta < 2**64 * 2**6: the quotient's error is far below 2**-150


def _two_pi(bits: int) -> int:
    """floor(2 pi * 2**bits), from Machin's formula pi = 16 atan(1/5) - 4 atan(1/239)."""
    guard = bits + 32

    def atan_inverse(n: int) -> int:  # atan(1/n) * 2**guard, each term truncated
        term = (1 << guard) // n
        total, k, square = term, 1, n * n
        while term:
            term //= square
            total += (-1) ** k * (term // (2 * k + 1))
            k += 1
        return total

    return (2 * (16 * atan_inverse(5) - 4 * atan_inverse(239))) >> 32


_TWO_PI = _two_pi(_FRACTION_BITS)  # the one every frequency above 2**-192 needs


def two_pi(bits: int) -> int:
    """floor(2 pi * 2**bits): the common precision made once, others each time (a memo would
    be read while dynamo traces, which guards on it)."""
    return _TWO_PI if bits == _FRACTION_BITS else _two_pi(bits)


def turn(n: int, theta: float) -> float:
    """``(n * theta) mod 2 pi`` in [0, 2 pi), with one rounding at the end.

    >>> import math
    >>> turn(3, 1.0) == 3.0
    True
    >>> abs(turn(2**62, 1.0) - math.fmod(2**62, 2 * math.pi)) > 1.0  # float64 gets it wrong
    True
    """
    numerator, denominator = float(theta).as_integer_ratio()  # denominator is a power of two
    shift = denominator.bit_length() - 1
    bits = max(_FRACTION_BITS, shift + 64)
    scaled = (n * numerator) << (bits - shift)
    return (scaled % two_pi(bits)) / (1 << bits)  # int / int rounds correctly


def turns(n: int, thetas: tuple[float, ...]) -> tuple[float, ...]:
    """:func:`turn` for each frequency."""
    return tuple(turn(n, t) for t in thetas)
