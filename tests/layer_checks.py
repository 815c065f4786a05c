"""Checks the framework layers' tests share (anyrope.layers): closeness, one rounding to a 16-bit
dtype, and errors equal to rope(...)'s. NumPy only: each test file brings its framework."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from oracle import TOLERANCE

# Unit roundoff: rounding a real v to the dtype moves it by at most UNIT[dtype] * |v|.
UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}


def assert_near(got: np.ndarray, want: np.ndarray, tolerance: float, what: str = "") -> None:
    """Within ``tolerance`` relative to the largest value (at least 1)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what} shape {got.shape} != {want.shape}"
    size = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    err = float(np.max(np.abs(got - want), initial=0.0))
    assert err <= tolerance * size, f"{what} max error {err:.3g} > {tolerance * size:.3g}"


def assert_rounded_once(got: np.ndarray, exact: np.ndarray, dtype: str) -> None:
    """``got`` (in ``dtype``) is the float64 ``exact`` rounded once: each value within the dtype's
    unit roundoff of its own magnitude, plus what a float32 computation before that rounding may
    carry (oracle's float32 tolerance of the largest value; float16's subnormals are inside it)."""
    got, exact = np.asarray(got, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    assert got.shape == exact.shape, f"shape {got.shape} != {exact.shape}"
    bound = UNIT[dtype] * np.abs(exact) + 2 * TOLERANCE["float32"] * float(np.max(np.abs(exact)))
    worst = int(np.argmax(np.abs(got - exact) - bound))
    assert np.all(np.abs(got - exact) <= bound), (
        f"{dtype}: {got.flat[worst]} != {exact.flat[worst]} beyond one rounding ({bound.flat[worst]:.3g})"
    )


def _raised(call: Callable[[], Any]) -> BaseException:
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    return caught.value


def assert_same_errors(layer: Any, rope: Any, cases: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
    """For each call ``(args, kwargs)``, the layer raises what ``rope(*args, **kwargs)`` raises:
    the same type, with rope's message (a framework may add its own context after it)."""
    for args, kwargs in cases:
        want = _raised(lambda: rope(*args, **kwargs))  # noqa: B023 - called at once
        got = _raised(lambda: layer(*args, **kwargs))  # noqa: B023
        assert type(got) is type(want), (kwargs, want, got)
        assert str(want) in str(got), (kwargs, want, got)


FAR = 10**6  # a position where angles formed in a 16-bit (or float32) dtype would be O(1) off


def sample(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random float32 features."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def bad_calls(array: Callable[[np.ndarray], Any], head: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Calls every layer must refuse as rope(...) does; ``array`` makes the framework's arrays."""
    q = array(sample((1, 2, 3, head)))
    return [
        ((array(sample((1, 2, 3, head + 2))),), {}),  # the last axis is not head_dim
        ((q,), {"positions": array(np.arange(4, dtype=np.int32))}),  # positions of the wrong length
        ((q, array(sample((1, 2, 3, head // 2)))), {}),  # k's last axis
        ((q,), {"offset": 1.5}),
        ((q,), {"seq_axis": 4}),
    ]


def assert_bad_construction_named(layer: Any, head: int) -> None:
    """A layer class refuses what is neither a RoPE nor a head width, both at once, and RoPE's
    own bad arguments, naming them."""
    import anyrope

    with pytest.raises(TypeError, match=r"rope must be an anyrope\.RoPE or head_dim"):
        layer("64")
    with pytest.raises(TypeError, match="not both: got a RoPE and base"):
        layer(anyrope.RoPE(head), base=10.0)
    with pytest.raises(ValueError, match="head_dim"):
        layer(head - 1)
