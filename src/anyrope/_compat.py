"""Array-library dispatch: which namespace an array belongs to, and the few gaps we paper over.

Every backend goes through array-api-compat, which recognises NumPy, PyTorch, CuPy, JAX and Dask
through ``sys.modules`` (so nothing is imported here) and falls back to ``__array_namespace__``.
MLX arrives through that fallback; :class:`_MLXNamespace` wraps only what MLX lacks.
"""

from __future__ import annotations

import contextlib
import math
import threading
from types import ModuleType
from typing import Any, cast

import array_api_compat

__all__ = [
    "array_namespace",
    "compute_dtype",
    "device_of",
    "float64_scope",
    "isdtype",
    "library_name",
    "materialize",
    "take_rows",
]


def is_mlx_namespace(xp: Any) -> bool:
    return isinstance(xp, _MLXNamespace)


def library_name(xp: Any) -> str:
    """A short, user-facing name for an array namespace ("numpy", "torch", "mlx", ...)."""
    name = getattr(xp, "__name__", type(xp).__name__)
    if name.startswith("array_api_compat."):
        name = name.removeprefix("array_api_compat.")
    if name == "mlx.core" or isinstance(xp, _MLXNamespace):
        return "mlx"
    return name


# An array's namespace depends only on its type: look each type up once. This keeps dispatch
# to a dict lookup on the decode path, where array-api-compat's general checks cost 10 us each.
_by_type: dict[type, tuple[Any, str]] = {}


def _namespace_of(arg: str, value: Any) -> tuple[Any, str]:
    kind = type(value)
    found = _by_type.get(kind)
    if found is None:
        try:
            xp = array_api_compat.array_namespace(value)
        except TypeError:
            raise TypeError(
                f"{arg} must be an array of a supported library (NumPy, PyTorch, CuPy, MLX or any "
                f"array-API library), not {kind.__name__}"
            ) from None
        lib = library_name(xp)
        found = (_mlx_namespace(xp) if lib == "mlx" else xp, lib)
        if not array_api_compat.is_dask_namespace(xp):  # dask's namespace follows its chunk type
            _by_type[kind] = found
    return found


def array_namespace(**named: Any) -> Any:
    """The namespace shared by the named arrays; ``None`` values are ignored.

    The keyword names are the caller's argument names, so a mismatch can say which argument
    came from which library.
    """
    first: tuple[str, Any, str] | None = None
    for arg, value in named.items():
        if value is None:
            continue
        xp, lib = _namespace_of(arg, value)
        if first is None:
            first = (arg, xp, lib)
        elif lib != first[2]:
            raise TypeError(
                f"{first[0]} is a {first[2]} array but {arg} is a {lib} array; pass arrays "
                f"of one library (convert with {first[2]}'s asarray or from_dlpack)"
            )
    if first is None:
        raise TypeError("no array was given")
    return first[1]


def device_of(xp: Any, x: Any) -> Any:
    """The device of ``x``; MLX arrays live in unified memory, so the default device's name stands in."""
    if isinstance(xp, _MLXNamespace):
        return str(xp.default_device())  # a fresh Device object each call: keep a stable label
    device = getattr(x, "device", None)  # the standard's attribute; NumPy < 2 lacks it
    return device if device is not None else array_api_compat.device(x)


def float64_scope(xp: Any, device: Any) -> contextlib.AbstractContextManager[None] | None:
    """A context in which float64 arithmetic works for arrays on ``device``, or None.

    Angles are formed in float64 so that large positions keep their precision. Where the device
    cannot do float64 (Apple GPUs under MLX or PyTorch MPS, JAX without x64) the caller falls back
    to an exact float32 scheme instead.
    """
    if isinstance(xp, _MLXNamespace):
        # MLX's CPU stream does float64 and shares memory with the GPU, so the tables are
        # computed there whatever the default device is.
        return cast("contextlib.AbstractContextManager[None]", xp.stream(xp.cpu))
    if array_api_compat.is_torch_namespace(xp):
        if getattr(device, "type", "cpu") == "mps":
            return None
    elif array_api_compat.is_jax_namespace(xp):
        import jax  # already imported: the array came from it

        if not jax.config.read("jax_enable_x64"):
            return None
    elif not hasattr(xp, "float64"):
        return None
    return contextlib.nullcontext()


def materialize(xp: Any, *arrays: Any) -> None:
    """Finish computing lazy arrays before they are shared between threads (MLX evaluates lazily,
    and one graph evaluated from several threads at once gives wrong values)."""
    if isinstance(xp, _MLXNamespace):
        xp.eval(*arrays)


def take_rows(xp: Any, table: Any, indices: Any) -> Any:
    """``xp.take(table, indices, axis=0)`` for non-negative indices.

    array-api-compat's torch ``take`` also wraps negative indices, which costs a third of a
    decode step; positions are never negative, so torch gets ``index_select`` directly.
    """
    if array_api_compat.is_torch_namespace(xp):
        return table.index_select(0, indices)
    return xp.take(table, indices, axis=0)


_kinds: dict[tuple[type, Any, str], bool] = {}


def isdtype(xp: Any, dtype: Any, kind: str) -> bool:
    """``xp.isdtype`` remembered per dtype: a dtype's kind never changes, and the per-call cost
    of array-api-compat's version shows on the decode path."""
    key = (type(dtype), dtype, kind)  # the type first: dtypes of two libraries are never compared
    found = _kinds.get(key)
    if found is None:
        found = _kinds[key] = bool(xp.isdtype(dtype, kind))
    return found


def compute_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype RoPE arithmetic runs in: float64 stays, everything narrower runs in float32."""
    return xp.float64 if hasattr(xp, "float64") and dtype == xp.float64 else xp.float32


class _MLXNamespace:
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
        return self._mx.arange(*args, **kwargs)

    def zeros(self, shape: Any, *, dtype: Any = None, device: Any = None) -> Any:  # noqa: ARG002
        return self._mx.zeros(shape, dtype=dtype if dtype is not None else self._mx.float32)

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


_mlx_lock = threading.Lock()
_mlx_cache: dict[int, _MLXNamespace] = {}


def _mlx_namespace(mx: ModuleType) -> _MLXNamespace:
    key = id(mx)
    shim = _mlx_cache.get(key)
    if shim is None:
        with _mlx_lock:
            shim = _mlx_cache.setdefault(key, _MLXNamespace(mx))
    return shim
