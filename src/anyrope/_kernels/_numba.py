"""Fused CPU kernels compiled by numba (an optional dependency): one pass over x, in parallel.

This module finds numba and hands out its kernels (written in :mod:`._jit`) safely across
threads; it imports numba only on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["kernel", "on_one_thread", "prologue_kernel"]

_lock = threading.Lock()
_compiled: dict[str, Callable[..., None]] = {}


def _build() -> dict[str, Callable[..., None]]:
    """Every kernel, named layout[:storage] ("half", "interleaved:bfloat16", ...);
    numba compiles each (or loads it from its cache) on first call."""
    from . import _jit

    kernels: dict[str, Callable[..., None]] = {}
    for storage, code in _jit.STORAGES.items():
        suffix = "" if storage == "float" else ":" + storage
        for name, fn in _jit.rotations(code).items():
            kernels[name + suffix] = fn
    return kernels


_serial: bool | None = None  # whether calls must be serialised (numba's workqueue layer)


def _probe(compiled: dict[str, Callable[..., None]]) -> bool:
    """Start numba's thread pool once, under the lock, and ask which threading layer it chose.

    The "workqueue" layer (numba's fallback without OpenMP or TBB) aborts the process when two
    threads launch parallel kernels at once, so calls are then taken one at a time.
    """
    import numba
    import numpy as np

    tiny = np.zeros((1, 1, 1, 1, 2), dtype=np.float32)
    table = np.zeros((1, 2), dtype=np.float32)
    compiled["half"](
        tiny, tiny, False, tiny, tiny, False, table, np.zeros((1, 1), dtype=np.int64), np.float32(1.0)
    )
    layer: Any = getattr(numba, "threading_layer")  # noqa: B009 - not in numba's typed exports
    return bool(layer() == "workqueue")


def kernel(name: str, storage: str = "float") -> Callable[..., None]:
    """The compiled kernel ``name`` for x stored as ``storage``, numba-compiled (or loaded from
    its cache) on first use.

    ``kernel(layout)(x, out, copy_tail, y, out_y, copy_tail_y, table, positions, sign)``
    rotates x and y (y may have no rows) at a (length, 2 * pairs) table of cos and sin side by
    side and (1 or batch, seq) positions, and looks the rows up itself (see
    :func:`._jit.rotations`). ``storage`` is "float" (x, out and table of one dtype) or
    "float16" / "bfloat16" (x and out as int16 bits, a float32 table); "float16-bits" is
    float16 without the CPU's conversion instructions, for tests.
    """
    global _serial
    if not _compiled:
        with _lock:
            if not _compiled:
                built = _build()
                _serial = _probe(built)
                _compiled.update(built if not _serial else {k: _serialised(f) for k, f in built.items()})
    return _compiled[name if storage == "float" else f"{name}:{storage}"]


_prologues: dict[tuple[str, str, int], Callable[..., None]] = {}


def prologue_kernel(layout: str, storage: str, rounding: int) -> Callable[..., None]:
    """The fused prologue's kernel (:mod:`._jit_prologue`) for one layout, storage and norm
    rounding, built on first use, taken one call at a time where :func:`kernel` found that
    numba's threading layer needs it."""
    kernel(layout, storage)  # starts numba's pool once and learns its threading layer
    key = (layout, storage, rounding)
    found = _prologues.get(key)
    if found is None:
        with _lock:
            if key not in _prologues:
                from . import _jit, _jit_prologue

                for name, fn in _jit_prologue.prologues(_jit.STORAGES[storage], rounding).items():
                    _prologues[name, storage, rounding] = _serialised(fn) if _serial else fn
        found = _prologues[key]
    return found


def _serialised(fn: Callable[..., None]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        with _lock:
            fn(*args)

    return call


def on_one_thread(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` run on the calling thread alone (numba's thread count is per thread): for calls so
    small that waking the pool costs more than they do, and would wait for a busy core."""
    import numba
    from numba.np.ufunc import parallel

    # The pool is running (kernel() started it), so numba's unchecked setters serve: the public
    # ones check and start it on every call, most of a small call's time (numba 0.68).
    get = getattr(parallel, "_get_num_threads", numba.get_num_threads)
    set_ = getattr(parallel, "_set_num_threads", numba.set_num_threads)

    def call(*args: Any) -> None:
        threads = get()
        set_(1)
        try:
            fn(*args)
        finally:
            set_(threads)

    return call
