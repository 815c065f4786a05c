"""``mlx.core`` as an array-API namespace: the keywords it lacks, and float64 cos, sin and exp that are exact.

MLX arrives through array-api-compat's ``__array_namespace__`` fallback; this wraps only what
MLX does not take (``device=``, ``copy=``) and what it gets wrong (float64 trigonometry and exp).
"""

from __future__ import annotations

import math
import threading
from types import ModuleType
from typing import Any

__all__ = ["MLXNamespace", "mlx_namespace"]


class MLXNamespace:
    """``mlx.core`` with the array-API keywords it does not take (``device=``, ``copy=``).

    MLX arrays live in unified memory, so ``device=`` has nothing to choose and is dropped.
    """

    __name__ = "mlx.core"

    def __init__(self, mx: ModuleType) -> None:
        self._mx = mx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mx, name)

    def asarray(self, obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None) -> Any:  # noqa: ARG002
        return self._mx.array(obj, dtype=dtype) if dtype is not None else self._mx.array(obj)

    def arange(self, *args: Any, device: Any = None, **kwargs: Any) -> Any:  # noqa: ARG002
        if len(args) == 2 and _past_int32(*args) and self._integral(kwargs.get("dtype")):
            # MLX takes ints past int32 as doubles: its values and length round above 2**53
            # (positions 2**53, 2**53 + 1 came out empty). Count up from 0 and add the start.
            start, stop = args
            dtype = kwargs.get("dtype") or self._mx.int64
            return self._mx.arange(max(stop - start, 0), dtype=dtype) + self._mx.array(start, dtype=dtype)
        return self._mx.arange(*args, **kwargs)

    def _integral(self, dtype: Any) -> bool:
        return dtype is None or bool(self._mx.issubdtype(dtype, self._mx.integer))

    def zeros(self, shape: Any, *, dtype: Any = None, device: Any = None) -> Any:  # noqa: ARG002
        return self._mx.zeros(shape, dtype=dtype if dtype is not None else self._mx.float32)

    def full(self, shape: Any, fill_value: Any, *, dtype: Any = None, device: Any = None) -> Any:  # noqa: ARG002
        return (
            self._mx.full(shape, fill_value, dtype=dtype)
            if dtype is not None
            else self._mx.full(shape, fill_value)
        )

    def full_like(self, x: Any, /, fill_value: Any, *, dtype: Any = None, device: Any = None) -> Any:  # noqa: ARG002
        return self._mx.full(x.shape, fill_value, dtype=dtype if dtype is not None else x.dtype)

    def astype(self, x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Any:  # noqa: ARG002
        if not copy and x.dtype == dtype:
            return x
        return self._mx.astype(x, dtype)

    # MLX evaluates float64 cos and sin to float32 accuracy only (0.02 off near 1.7e6 rad), while
    # its float64 multiply and add are exact: float64 inputs take an accurate route instead.
    def cos(self, x: Any, /) -> Any:
        if x.dtype != self._mx.float64:
            return self._mx.cos(x)
        return _sin_cos_float64(self._mx, x, phase=1)

    def sin(self, x: Any, /) -> Any:
        if x.dtype != self._mx.float64:
            return self._mx.sin(x)
        return _sin_cos_float64(self._mx, x, phase=0)

    # The same holds for exp (2e-6 relative off in float64): xPos's decay needs it.
    def exp(self, x: Any, /) -> Any:
        if x.dtype != self._mx.float64:
            return self._mx.exp(x)
        return _exp_float64(self._mx, x)


def _past_int32(*values: Any) -> bool:
    """Whether these are Python ints, one of them outside int32."""
    return all(type(v) is int for v in values) and not all(-(2**31) <= v < 2**31 for v in values)


# pi/2 split into parts of 33 bits or fewer (fdlibm's), so n * part is exact for |n| < 2**20.
_PIO2 = (1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624871116645580e-21)
_SIN_TAYLOR = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(10))
_COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(10))


def _sin_cos_float64(mx: Any, x: Any, *, phase: int) -> Any:
    """sin (phase 0) or cos (phase 1) of a float64 array with float64 arithmetic only.

    x = n * pi/2 + r with |r| <= pi/4 (Cody-Waite); Taylor series to degree 19 on r leave an
    error near 1e-19, far below the rounding of r itself.
    """
    n = mx.round(x * (2 / math.pi))
    r = x - n * _PIO2[0] - n * _PIO2[1] - n * _PIO2[2]
    r2 = r * r

    def series(coefficients: tuple[float, ...]) -> Any:
        total = mx.full(r.shape, coefficients[-1], dtype=mx.float64)
        for c in reversed(coefficients[:-1]):
            total = total * r2 + c
        return total

    sin_r, cos_r = r * series(_SIN_TAYLOR), series(_COS_TAYLOR)
    quadrant = mx.remainder(n + phase, 4)  # sin(r + q pi/2) = sin r, cos r, -sin r, -cos r
    value = mx.where(mx.remainder(quadrant, 2) == 0, sin_r, cos_r)
    return mx.where(quadrant >= 2, -value, value)


# ln 2 split so that k * _LN2[0] is exact for |k| < 2**20 (fdlibm's), and exp's Taylor series on
# |r| <= ln(2) / 2, to degree 17 (remainder below 1e-22).
_LN2 = (6.93147180369123816490e-01, 1.90821492927058770002e-10)
_EXP_TAYLOR = tuple(1 / math.factorial(k) for k in range(18))


def _exp_float64(mx: Any, x: Any) -> Any:
    """exp of a float64 array with float64 arithmetic only: x = k ln 2 + r, exp(x) = 2**k exp(r)
    (2**k for integer k is exact in MLX's float64 power)."""
    k = mx.round(x * (1 / math.log(2)))
    r = x - k * _LN2[0] - k * _LN2[1]
    total = mx.full(r.shape, _EXP_TAYLOR[-1], dtype=mx.float64)
    for c in reversed(_EXP_TAYLOR[:-1]):
        total = total * r + c
    return total * mx.power(mx.array(2.0, dtype=mx.float64), k)


_lock = threading.Lock()
_shims: dict[int, MLXNamespace] = {}


def mlx_namespace(mx: ModuleType) -> MLXNamespace:
    key = id(mx)
    shim = _shims.get(key)
    if shim is None:
        with _lock:
            shim = _shims.setdefault(key, MLXNamespace(mx))
    return shim
