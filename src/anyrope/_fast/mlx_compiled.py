"""MLX's fast path: the generic rotation compiled by ``mx.compile`` into one fused kernel.

Same arithmetic as the generic path, so the result matches it; MLX differentiates compiled
functions itself. ``mx.fast.rope`` is not used: it forms angles in float32, which would break
the float64-table precision this library guarantees (it is off by position * 6e-8 rad).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._layout import Layout

__all__ = ["rotate"]

_lock = threading.Lock()
_compiled: dict[tuple[Any, ...], Callable[[Any, Any, Any], Any]] = {}


def rotate(xp: Any, x: Any, cos: Any, sin: Any, *, layout: Layout, inverse: bool, seq_axis: int) -> Any:
    from .._rotate import rotate_generic

    key = (layout, inverse, seq_axis)
    fn = _compiled.get(key)
    if fn is None:
        with _lock:

            def turn(x: Any, cos: Any, sin: Any) -> Any:
                return rotate_generic(xp, x, cos, sin, layout=layout, inverse=inverse, seq_axis=seq_axis)

            fn = _compiled.setdefault(key, xp.compile(turn))
    return fn(x, cos, sin)
