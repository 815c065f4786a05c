"""Fused fast paths, one small module per backend, each held to the generic result by the tests.

:func:`rotate_fast` is tried before the generic array-API rotation; it returns None whenever its
backend has no fast path for the call (a dtype, a layout of memory, a missing optional JIT), and
the generic code runs instead. ``use_fast_paths(False)`` forces the generic path, for tests and
benchmarks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import array_api_compat

from .._compat import is_mlx_namespace
from .._layout import Layout
from . import mlx_compiled, numpy_cpu, torch_cpu  # each imports its backend only when called

__all__ = ["fast_paths_enabled", "rotate_fast", "use_fast_paths"]

_enabled: ContextVar[bool] = ContextVar("anyrope_fast_paths", default=True)


def fast_paths_enabled() -> bool:
    """Whether fast paths are on in this context (they are by default)."""
    return _enabled.get()


@contextlib.contextmanager
def use_fast_paths(enabled: bool = True) -> Iterator[None]:
    """Turn the per-backend fast paths on or off within a ``with`` block (thread- and task-local).

    Examples
    --------
    >>> import numpy as np
    >>> import anyrope
    >>> x = np.ones((4, 8), dtype=np.float32)
    >>> with anyrope.use_fast_paths(False):      # the generic array-API code only
    ...     generic = anyrope.RoPE(8)(x, offset=3)
    >>> bool(np.allclose(generic, anyrope.RoPE(8)(x, offset=3), atol=1e-6))
    True
    """
    token = _enabled.set(bool(enabled))
    try:
        yield
    finally:
        _enabled.reset(token)


def rotate_fast(
    xp: Any, x: Any, cos: Any, sin: Any, *, layout: Layout, inverse: bool, seq_axis: int, out: Any
) -> Any | None:
    """The fused rotation for ``x``'s backend, or None where there is none for this call.

    cos and sin are compact (seq, h) or (batch, seq, h) tables in the compute dtype.
    """
    if not _enabled.get():
        return None
    if array_api_compat.is_numpy_namespace(xp):
        return numpy_cpu.rotate(x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis, out=out)
    if array_api_compat.is_torch_namespace(xp):
        return torch_cpu.rotate(x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis, out=out)
    if is_mlx_namespace(xp) and out is None:
        return mlx_compiled.rotate(x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis)
    return None
