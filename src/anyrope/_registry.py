"""The kernel registry: every rotation kernel, declared by what it takes, chosen at one point.

A kernel declares everything it takes (see :class:`anyrope._job.Kernel`): libraries, device
types, layouts, dtypes, position sources, and whether it writes in place, can be traced
(``torch.compile``, ``jax.jit``, ``mx.compile``), is differentiable, and so on. :func:`choose`
takes, in registry order, the first kernel whose declaration covers a job's key: no kernel
declines at run time. The generic array-API kernel comes last and takes every job. The same
declarations drive the tests' parametrization and the docs' tables.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, TypeAlias

from ._fusion import Fusion, PrologueJob
from ._handle import Handle
from ._job import Job, Kernel, KernelKey
from ._kernels import FUSIONS, REGISTRY
from ._memo import Memo

__all__ = [
    "Switch",
    "choose",
    "choose_fusion",
    "current_switch",
    "fast_paths_enabled",
    "fusion_libraries",
    "kernels",
    "prepare",
    "switch_now",
    "use_fast_paths",
]

#: What ``use_fast_paths`` sets: every kernel (True), the generic one only (False), one
#: registered kernel by name, or a Kernel object (a test's stand-in for a registered one).
Switch: TypeAlias = "bool | str | Kernel"


def kernels() -> tuple[Kernel, ...]:
    """Every registered kernel, in the order they are tried; the generic one is last."""
    return REGISTRY


def fusions() -> tuple[Fusion, ...]:
    """Every fused attention prologue, in the order they are tried."""
    return FUSIONS


# The switch: a ContextVar (thread- and task-local), mirrored in a thread-local that dynamo can
# read while tracing (it cannot trace ContextVar.get).
_switch: ContextVar[Switch] = ContextVar("anyrope_kernels", default=True)
_mirror = threading.local()
#: The switch of an eager call, read with no Python frame (a call plan's signature holds it).
switch_now = _switch.get


def current_switch(traced: bool) -> Switch:
    """The switch in this context (from the mirror while traced)."""
    if traced:
        value: Switch = getattr(_mirror, "value", True)
        return value
    return _switch.get()


@contextlib.contextmanager
def use_fast_paths(enabled: Switch = True) -> Iterator[None]:
    """Choose kernels within a ``with`` block: all (True, the default), the generic array-API
    code only (False), or one kernel, by name or as an ``anyrope.Kernel`` (which need not
    be registered: tests pass stand-ins), which then must take every call in the block; a call
    it cannot take raises ValueError before any work, naming what the call has that it does not
    take. Dask arrays are rotated chunk by chunk under the switch of the call that made them.

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
    elif not isinstance(enabled, (bool, Kernel)):
        raise TypeError(f"enabled must be a bool, a kernel name or a Kernel, not {type(enabled).__name__}")
    token = _switch.set(enabled)
    previous = getattr(_mirror, "value", True)
    _mirror.value = enabled
    try:
        yield
    finally:
        _mirror.value = previous
        _switch.reset(token)


def fast_paths_enabled() -> Switch:
    """The switch in this context: True, False, a kernel name or a Kernel."""
    return _switch.get()


def _allowed(switch: Switch) -> tuple[Kernel, ...]:
    if switch is True:
        return kernels()
    if switch is False:
        return kernels()[-1:]
    if isinstance(switch, Kernel):
        return (switch,)
    return tuple(k for k in kernels() if k.name == switch)


# A pure function of (key, switch name): selection is one dict lookup on the decode path.
_candidates: Memo[tuple[Kernel, ...]] = Memo()


def candidates(key: KernelKey, switch: Switch) -> tuple[Kernel, ...]:
    """The kernels that take a job with ``key`` under ``switch``, in registry order."""
    if isinstance(switch, Kernel) or key.traced:  # a stand-in is not registered: never memoised
        return tuple(k for k in _allowed(switch) if k.takes(key))
    return _candidates.get((key, switch), lambda: tuple(k for k in _allowed(switch) if k.takes(key)))


def _first_taking(registry: tuple[Kernel, ...], switch: bool | str, *fields: Any) -> tuple[int, int]:
    """The index in ``registry`` of :func:`candidates`' first for a job whose key has ``fields``
    and then ``one_token`` False, and True, under ``switch`` (-1: none takes it)."""

    def first(one_token: bool) -> int:
        found = candidates(KernelKey._make((*fields[:_ONE_TOKEN], one_token, *fields[_ONE_TOKEN:])), switch)
        return registry.index(found[0]) if found else -1

    return first(False), first(True)


# While traced, the choice is made as plain Python through this handle, its answer a constant to
# the tracer (dynamo folds Handle.fetch): traced, every declaration's checks became guards that
# each compiled call evaluates, a fifth of the guards of a decode step. Under dynamic shapes
# one_token is symbolic, which a fetch cannot take: both answers come back, and it picks one.
_REGISTRY = Handle(REGISTRY)
_ONE_TOKEN = KernelKey._fields.index("one_token")


def choose(job: Job, switch: Switch) -> Kernel:
    """The kernel that runs ``job``: the first that takes it, or ValueError where the kernel the
    switch names does not (the generic kernel takes every job)."""
    if job.key.traced and not isinstance(switch, Kernel):
        key = job.key
        fields = (*key[:_ONE_TOKEN], *key[_ONE_TOKEN + 1 :])
        index = _REGISTRY.fetch(_first_taking, switch, *fields)[1 if key.one_token else 0]
        found: tuple[Kernel, ...] | None = (REGISTRY[index],) if index >= 0 else ()
    else:
        found = None if job.key.traced else _candidates.find((job.key, switch))  # no memo read while traced
    if found is None:
        found = candidates(job.key, switch)
    if found:
        return found[0]
    forced = _allowed(switch)[0]
    raise ValueError(f"kernel {forced.name!r} cannot rotate {job.arg} here: {forced.why_not(job.key)}")


def prepare(jobs: tuple[Job, ...], switch: Switch, *, shared: bool) -> Any:
    """The launch of a call's jobs: every kernel chosen (under ``switch``) before any is prepared.
    One job: its kernel's :data:`anyrope._job.Launch`. Two (q and k): a
    ``launch(q, k, out_q, out_k, source_q, source_k)``, one launch where one kernel took both,
    ``shared`` says they turn by one source of angles and the kernel pairs them. Each kernel's
    eager or traced launch, as the call's policy says (:meth:`anyrope._policy.Tracing.prepared`)."""
    chosen = tuple(choose(job, switch) for job in jobs)
    policy = jobs[0].ctx.tracing
    if len(jobs) == 1:
        return policy.prepared(chosen[0].prepare, chosen[0].prepare_traced)(jobs[0])
    q, k = jobs
    first, second = chosen
    pair = policy.paired(first.prepare_pair, first.prepare_pair_traced)
    if shared and first is second and pair is not None:
        together = pair(q, k)
        if together is not None:
            return together
    launch_q = policy.prepared(first.prepare, first.prepare_traced)(q)
    launch_k = policy.prepared(second.prepare, second.prepare_traced)(k)

    def apart(x: Any, y: Any, out_x: Any, out_y: Any, source_x: Any, source_y: Any) -> tuple[Any, Any]:
        return launch_q(x, out_x, source_x), launch_k(y, out_y, source_y)

    return apart


def choose_fusion(job: PrologueJob, switch: Switch) -> tuple[Fusion | None, list[str]]:
    """The fused prologue that takes ``job`` under ``switch`` (every one where it is True, the
    one of a kernel's name, none where it is False or a stand-in), or None; and why each fusion
    of the call's library tried before it, or every one, did not take it."""
    if switch is False or isinstance(switch, Kernel):
        return None, [
            "fast paths are off (use_fast_paths)" if switch is False else "a stand-in kernel is forced"
        ]
    why: list[str] = []
    # those of the call's library (all, where none takes it: each says so)
    for fusion in [f for f in FUSIONS if job.library in f.libraries] or FUSIONS:
        if switch is not True and fusion.name != switch:
            why.append(f"{fusion.name}: use_fast_paths({switch!r}) names another kernel")
            continue
        refused = fusion.why_not(job)
        if refused is None:
            return fusion, why
        why.append(f"{fusion.name}: {refused}")
    return None, why


_FUSED_LIBRARIES = frozenset().union(*(fusion.libraries for fusion in FUSIONS))


def fusion_libraries() -> frozenset[str]:
    """The libraries some fused prologue takes: a call on any other is refused before its plan."""
    return _FUSED_LIBRARIES
