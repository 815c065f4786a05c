"""The kernel registry: every rotation kernel, declared by what it supports, chosen at one point.

A kernel declares the libraries, device types, layouts and dtypes it takes, and whether it
writes in place, can be traced (``torch.compile``, ``jax.jit``, ``mx.compile``) and is
differentiable. :func:`rotate` tries, in registry order, the kernels whose declaration covers a
job; a kernel may still decline one (returning None) for what only the arrays show, such as a
memory layout, before it writes anything. The generic array-API kernel comes last and takes
every job. The same declarations drive the tests' parametrization and the docs' tables.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._plan import Job

__all__ = ["Kernel", "kernels", "rotate", "use_fast_paths"]

ANY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Kernel:
    """One way to rotate: what it supports, and how to run it.

    Empty ``libraries``, ``devices`` or ``dtypes`` mean "any". ``requires`` names optional
    modules it needs (checked without importing them).
    """

    name: str
    summary: str
    libraries: frozenset[str]
    devices: frozenset[str]
    layouts: frozenset[str]
    dtypes: frozenset[str]
    inplace: bool
    traceable: bool
    differentiable: bool
    run: Callable[[Job], Any] = field(repr=False, compare=False)
    requires: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        """Whether every module in ``requires`` is installed."""
        return all(_installed(module) for module in self.requires)

    def declares(self, key: tuple[Any, ...]) -> str | None:
        """None if this kernel's declaration covers a job with this key, else why not."""
        library, device, dtype, layout, inplace, traced, grad = key
        for wanted, have, what in (
            (library, self.libraries, "library"),
            (device, self.devices, "device"),
            (dtype, self.dtypes, "dtype"),
            (layout, self.layouts, "layout"),
        ):
            if have and wanted not in have:
                return f"{what} {wanted} (it takes {', '.join(sorted(have))})"
        for needed, has, what in (
            (inplace, self.inplace, "in-place writes"),
            (traced, self.traceable, "tracing"),
            (grad, self.differentiable, "gradients"),
        ):
            if needed and not has:
                return f"no {what}"
        if not self.available:
            return f"needs {', '.join(self.requires)} (not installed)"
        return None


_found: dict[str, bool] = {}


def _installed(module: str) -> bool:
    if module not in _found:
        _found[module] = importlib.util.find_spec(module) is not None
    return _found[module]


def kernels() -> tuple[Kernel, ...]:
    """Every registered kernel, in the order they are tried; the generic one is last."""
    from ._kernels import REGISTRY  # a plain import, not a cached call: dynamo traces this

    return REGISTRY


# The switch: a ContextVar (thread- and task-local), mirrored in a thread-local that dynamo can
# read while tracing (it cannot trace ContextVar.get).
_switch: ContextVar[bool | str] = ContextVar("anyrope_kernels", default=True)
_mirror = threading.local()


def _current(traced: bool) -> bool | str:
    if traced:
        return getattr(_mirror, "value", True)
    return _switch.get()


@contextlib.contextmanager
def use_fast_paths(enabled: bool | str = True) -> Iterator[None]:
    """Choose kernels within a ``with`` block: all (True, the default), the generic array-API
    code only (False), or one kernel by name, which then must take every call in the block.

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
    if isinstance(enabled, str):
        names = [k.name for k in kernels()]
        if enabled not in names:
            raise ValueError(f"no kernel named {enabled!r}; the registry has {', '.join(names)}")
    elif not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool or a kernel name, not {type(enabled).__name__}")
    token = _switch.set(enabled)
    previous = getattr(_mirror, "value", True)
    _mirror.value = enabled
    try:
        yield
    finally:
        _mirror.value = previous
        _switch.reset(token)


def fast_paths_enabled() -> bool | str:
    """The switch in this context: True, False or a kernel name."""
    return _switch.get()


_candidates: dict[tuple[Any, ...], tuple[Kernel, ...]] = {}


def candidates(key: tuple[Any, ...], switch: bool | str, *, traced: bool = False) -> tuple[Kernel, ...]:
    """The kernels whose declarations cover ``key``, in order; remembered per key (a pure function
    of it), which keeps selection to one dict lookup on the decode path, except while traced
    (nothing traced reads a memo: see ``_compat.torch_compiling``)."""
    found = None if traced else _candidates.get((key, switch))
    if found is None:
        every = kernels()
        if switch is False:
            every = every[-1:]
        elif isinstance(switch, str):
            every = tuple(k for k in every if k.name == switch)
        found = tuple(k for k in every if k.declares(key) is None)
        if not traced:
            _candidates[(key, switch)] = found
    return found


def rotate(job: Job) -> Any:
    """Run the first kernel that takes ``job``."""
    switch = _current(job.traced)
    for kernel in candidates(job.key, switch, traced=job.traced):
        result = kernel.run(job)
        if result is not None:
            return result
    raise ValueError(_refusal(switch, job))


def _refusal(switch: bool | str, job: Job) -> str:
    """Why the kernel ``use_fast_paths`` named could not take ``job`` (the generic one takes all)."""
    forced = next(k for k in kernels() if k.name == switch)
    why = forced.declares(job.key) or "it declined these arrays (memory layout or table dtype)"
    return f"kernel {switch!r} cannot rotate {job.arg} here: {why}"
