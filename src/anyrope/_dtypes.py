"""Facts about dtypes that every call asks (floating? how wide? which compute dtype?), each
computed once per dtype: asking the library costs microseconds that a decode step notices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._compat import torch_compiling
from ._memo import Memo

__all__ = [
    "compute_dtype",
    "dtype_name",
    "float_bits",
    "index_kind",
    "input_kind",
    "int_info",
    "isdtype",
]

_dtype_facts: Memo[Any] = Memo(1024)


def _dtype_fact(what: str, dtype: Any, compute: Callable[[], Any]) -> Any:
    # Keyed by the dtype's class before the dtype: two libraries' dtypes are never compared.
    return _dtype_facts.get((what, type(dtype), dtype), compute, traced=torch_compiling(dtype))


def isdtype(xp: Any, dtype: Any, kind: str) -> bool:
    """``xp.isdtype``, remembered."""
    return bool(_dtype_fact(kind, dtype, lambda: xp.isdtype(dtype, kind)))


def input_kind(xp: Any, dtype: Any) -> tuple[bool, int]:
    """(real floating?, bits) of an input's dtype: what every call checks, asked once per dtype."""

    def compute() -> tuple[bool, int]:
        floating = bool(xp.isdtype(dtype, "real floating"))
        return floating, int(xp.finfo(dtype).bits) if floating else 0

    return _dtype_fact("input", dtype, compute)  # type: ignore[no-any-return]


def float_bits(xp: Any, dtype: Any) -> int:
    """The width of a floating dtype in bits (64 for NumPy's big-endian float64 too)."""
    return int(_dtype_fact("float bits", dtype, lambda: xp.finfo(dtype).bits))


def int_info(xp: Any, dtype: Any) -> tuple[int, bool]:
    """(bits, signed) of an integer dtype (from ``iinfo``'s bounds: MLX's has no ``bits``)."""

    def compute() -> tuple[int, bool]:
        info = xp.iinfo(dtype)
        signed = int(info.min) < 0
        return int(info.max).bit_length() + signed, signed

    return _dtype_fact("int info", dtype, compute)  # type: ignore[no-any-return]


def index_kind(xp: Any, dtype: Any) -> tuple[bool, bool]:
    """(integral?, 64-bit unsigned?) of a positions array's dtype: what every call with positions
    asks, in one look-up."""

    def compute() -> tuple[bool, bool]:
        integral = bool(xp.isdtype(dtype, "integral"))
        return integral, integral and int_info(xp, dtype) == (64, False)

    return _dtype_fact("index kind", dtype, compute)  # type: ignore[no-any-return]


def dtype_name(dtype: Any) -> str:
    """ "float32", "bfloat16", ...; NumPy's non-native byte orders keep their mark (">f8")."""

    def compute() -> str:
        if getattr(dtype, "isnative", True) is False:
            return str(dtype)
        return str(getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1])

    return str(_dtype_fact("name", dtype, compute))


def compute_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype RoPE arithmetic runs in: float64 for 64-bit floats, float32 for everything narrower."""
    return xp.float64 if float_bits(xp, dtype) == 64 else xp.float32
