"""Fusions of the attention prologue: kernels that normalise q and k, rotate them and write the
KV cache in one pass, each declared by what it takes, as the rotation kernels are (see
:class:`anyrope._job.Kernel`).

A prologue call is described by a :class:`PrologueJob`, made from shapes, dtypes, devices and
the arguments' forms only (never values); a fusion takes it or says why not, in words
:func:`anyrope.explain_prologue` shows. Where none takes it, the prologue runs its steps apart
(the generic composition).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._arrays import is_installed

__all__ = [
    "AFTER_WEIGHT",
    "BEFORE_WEIGHT",
    "NO_NORM",
    "ROUNDING_CODES",
    "Fusion",
    "PrologueJob",
    "PrologueLaunch",
]

#: ``launch(q, k, v, norm, cache, places, host_places, source) -> (q, k)``: the fused pass of one
#: call, prepared once per :class:`PrologueJob`; the cache is written in place. ``places``: each
#: token's place as an array of k's library, or None where ``host_places`` (NumPy's) has them.
PrologueLaunch = Callable[..., tuple[Any, Any]]


#: Where a fused kernel's norm meets its weight, as the kernels take it: no norm, the weight
#: after rounding to x's dtype (``"before_weight"``), or before it (``"after_weight"``).
NO_NORM, BEFORE_WEIGHT, AFTER_WEIGHT = 0, 1, 2
ROUNDING_CODES = {None: NO_NORM, "before_weight": BEFORE_WEIGHT, "after_weight": AFTER_WEIGHT}


class PrologueJob(NamedTuple):
    """What a prologue call's signature fixes, as a fusion reads it (hashable: its prepared
    launch is kept by it). ``rounding``: the norm's, None without one; ``cache``: the cache's
    layout, None without one; ``host_places``: whether the cache places were read on the host."""

    library: str
    device: str
    dtype: str
    traced: bool
    grad: bool
    layout: str
    inverse: bool
    compute: Any
    seq_axis: int
    shapes: tuple[tuple[int, ...], ...]  # q's, k's and v's (v's () where not given)
    head_dim: int
    rounding: str | None
    across_heads: bool
    one_dtype: bool
    features_innermost: bool  # q's and k's (see anyrope._compat.features_innermost)
    cache: str | None
    host_places: bool
    streams: int
    xpos: bool
    has_k: bool


@dataclass(frozen=True)
class Fusion:
    """One fused prologue and everything it takes: libraries, device types, dtypes, the norm's
    longest head (``longest_head``: its sum of squares is written for up to that many features),
    and the optional modules it needs (``requires``). It takes eager calls only, with no
    gradients, where the cache's places are host values unless it reads them on the device
    (``device_places``); it fuses a norm or a cache write (a call with neither is a rotation,
    which the rotation kernels do)."""

    name: str
    summary: str
    libraries: frozenset[str]
    devices: frozenset[str]
    dtypes: frozenset[str]
    longest_head: int
    prepare: Callable[[PrologueJob], PrologueLaunch] = field(repr=False, compare=False)
    requires: tuple[str, ...] = ()
    device_places: bool = False
    # Whether its q and k equal the steps apart's bit for bit; else they are within a few units
    # in the last place of each head's largest value (its summary says why).
    exact: bool = True
    # Whether it takes only calls with a norm: where a rotation and a cache write alone run
    # faster as their steps (the rotation kernel, then a slice write), as on a CPU.
    needs_norm: bool = False
    # What this machine refuses that no declaration can say (a probe, run once per kind of call):
    # why the fusion would not equal the steps apart here, or None.
    refuses: Callable[[PrologueJob], str | None] | None = field(default=None, repr=False, compare=False)
    available: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "available", all(is_installed(module) for module in self.requires))

    def why_not(self, job: PrologueJob) -> str | None:
        """What the call has that this fusion does not take, or None if it takes it."""
        reasons = (
            (job.traced, "no tracing (a compiler runs the steps apart, and fuses what it can)"),
            (not job.has_k, "no calls without k"),
            (job.library not in self.libraries, f"no library {job.library} (it takes {_listed(self.libraries)})"),
            (job.device not in self.devices, f"no device {job.device} (it takes {_listed(self.devices)})"),
            (job.dtype not in self.dtypes, f"no dtype {job.dtype} (it takes {_listed(self.dtypes)})"),
            (job.grad, "no gradients (the steps apart carry them)"),
            (len(job.shapes[0]) != 4 or job.seq_axis not in (-2, -3),
             "no q and k other than (batch, heads, seq, head_dim) or (batch, seq, heads, head_dim)"),
            (job.rounding is None and job.cache is None,
             "no calls with neither a norm nor a cache (a rotation alone, which the rotation kernels take)"),
            (job.rounding is None and self.needs_norm,
             "no calls without a norm (a rotation and a cache write take less time as their steps here)"),
            (job.across_heads, "no norms across a token's heads (OLMo 2's)"),
            (not job.one_dtype, "no q, k and norm weights of different dtypes"),
            (self.exact and job.rounding is not None and not job.features_innermost,
             "no q or k whose features are not their innermost axis in memory (the library sums them in another order)"),
            (job.rounding is not None and job.head_dim > self.longest_head,
             f"no norms over more than {self.longest_head} features"),
            (job.cache is not None and not job.host_places and not self.device_places,
             "no cache places that are not host values"),
            (job.xpos, "no xPos scaling"),
            (not self.available, f"needs {', '.join(self.requires)}, which is not installed"),
        )  # fmt: skip
        found = next((why for refused, why in reasons if refused), None)
        if found is None and self.refuses is not None:
            return self.refuses(job)
        return found


def _listed(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))
