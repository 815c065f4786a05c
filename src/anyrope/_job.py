"""A job (one array to rotate), the key kernels are chosen by, and a kernel's declaration.

The key holds every fact a kernel's ability depends on, so a kernel whose declaration covers a
key takes the job: kernels never decline at run time, and :func:`anyrope.use_fast_paths` with a
kernel's name either runs it or says, before any work, what the call has that it does not take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeAlias

from ._arrays import is_installed
from ._compat import is_c_contiguous
from ._context import CallContext
from ._dtypes import dtype_name
from ._layout import Layout
from ._policy import TRACERS

__all__ = [
    "ANY",
    "FORMS",
    "INTO",
    "IN_PLACE",
    "NEW",
    "SOURCES",
    "Job",
    "Kernel",
    "KernelKey",
    "Launch",
    "PairLaunch",
    "TableSource",
    "key_prefix",
    "make_job",
    "offers",
    "turn_alike",
]  # fmt: skip

#: Where a job's angles come from: an int offset, one offset per row (or a 0-d array), explicit
#: positions, several position streams per token (M-RoPE, axial), the caller's tables
#: (:func:`anyrope.apply`, :func:`anyrope.rerotate`), or positions with xPos's scale.
SOURCES = ("offset", "row-offsets", "positions", "multi-axis", "tables", "xpos")

ANY: frozenset[str] = frozenset()


class KernelKey(NamedTuple):
    """What the registry chooses a kernel by; one per job, made from shapes, dtypes and flags."""

    library: str
    device: str  # the device type
    dtype: str
    layout: Layout
    inplace: bool
    traced: bool
    grad: bool
    source: str  # one of SOURCES
    device_frequencies: bool  # DynamicNTK or LongRoPE choosing frequencies on the device
    float64: bool  # float64 arithmetic and 64-bit integers on the device
    unsigned64: bool  # 64-bit unsigned position integers
    strided_out: bool  # an in-place or out= destination that is not C-contiguous
    table_grad: bool  # the caller's tables themselves need gradients
    tracer: str  # what traces the call (see anyrope._policy.TRACERS), "" for an eager call
    one_token: bool  # one token per sequence: a decode step


def key_prefix(ctx: CallContext, dtype: Any, layout: Layout, inplace: bool) -> tuple[Any, ...]:
    """What the array's library, device, dtype, layout and the call's flags put in the key: the
    part a call plan can keep per signature."""
    return (ctx.library, ctx.env.device_type, dtype_name(dtype), layout, inplace, ctx.traced, ctx.grad)


class TableSource(Protocol):
    """The angles of a call's array: every source's tables, and the forms of :data:`FORMS` its
    kind offers beside them."""

    kind: str  # one of SOURCES
    device_frequencies: bool  # frequencies chosen on the device
    unsigned64: bool  # positions given as 64-bit unsigned integers
    table_grad: bool  # tables that themselves need gradients

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        """Compact (cos, sin), shape (seq, pairs) or (rows, seq, pairs), in ``dtype``."""


# The forms of the angles a source of the call's positions offers (anyrope._tables.PositionTables):
# ``lookup``: (a table of cos and sin side by side, (rows, seq) host indices into it), or None:
# cached rows a CPU kernel reads by position, with no gathered copy; ``signed``: (cos,
# signed_sin), the MLX kernel's form, made once for q and k; ``side_by_side``: the call's one
# table of cos and sin side by side, rows 0, 1, ... its tokens (kept rows while dynamo traces);
# ``kernel_angles``: the angles as a fused kernel forms them.
_POSITION_FORMS = frozenset({"lookup", "signed", "side_by_side", "kernel_angles"})

#: The forms each kind of source offers beside its tables: a kernel asks once, as it prepares a
#: launch (:func:`offers`), so no source answers for a form it does not have.
FORMS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("offset", "row-offsets", "positions", "multi-axis"), _POSITION_FORMS),
    "tables": frozenset({"kernel_angles"}),  # the caller's (anyrope._tables.GivenTables)
    "xpos": frozenset(),  # scaled per array (anyrope._tables.XPosTables)
}


def offers(job: Job, form: str) -> bool:
    """Whether the source of ``job``'s angles offers ``form`` (see :data:`FORMS`)."""
    return form in FORMS[job.key.source]


#: What a job's result is written into: a new array, x itself, or another array (``apply``'s out=).
NEW, IN_PLACE, INTO = "new", "in place", "into"


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One array of a call signature, as a kernel prepares its launch: nothing here is a value.
    ``writes``: NEW, IN_PLACE or INTO; ``inverse``: turn by the negated angles; ``compute``: the
    dtype the rotation is done in; ``shape``: the array's (symbolic where traced)."""

    ctx: CallContext
    arg: str
    seq_axis: int
    layout: Layout
    inverse: bool
    writes: str
    compute: Any
    key: KernelKey
    shape: tuple[Any, ...]

    @property
    def seq(self) -> Any:
        return self.shape[self.seq_axis]


#: A prepared launch of one array: ``launch(x, out, source)`` -> the rotated array (``out``: None,
#: x itself, or the array to write into, as the job's ``writes`` says).
Launch: TypeAlias = "Callable[[Any, Any, Any], Any]"
#: A prepared launch of q and k: ``launch(q, k, out_q, out_k, source_q, source_k)`` -> (q, k).
PairLaunch: TypeAlias = "Callable[[Any, Any, Any, Any, Any, Any], tuple[Any, Any]]"


def make_job(
    ctx: CallContext,
    x: Any,
    *,
    arg: str,
    seq_axis: int,
    layout: Layout,
    inverse: bool,
    out: Any,
    source: TableSource,
    compute: Any,
    prefix: tuple[Any, ...] | None = None,
) -> Job:
    """The job of array ``x`` written into ``out`` (None, x, or another array), and its key
    (``prefix``: :func:`key_prefix`'s part, where the caller has it)."""
    if prefix is None:
        prefix = key_prefix(ctx, x.dtype, layout, out is not None)
    env = ctx.env
    # A traced length of 1 is an int (torch specialises sizes 0 and 1 even under dynamic=True),
    # and a symbolic one is known to be 2 or more: asking adds no guard.
    one_token = bool(x.shape[seq_axis] == 1)
    key = KernelKey._make((
        *prefix, source.kind, source.device_frequencies, env.float64 and env.index_bits == 64,
        source.unsigned64, out is not None and not is_c_contiguous(ctx.xp, out), source.table_grad,
        ctx.tracing.tracer, one_token,
    ))  # fmt: skip
    writes = NEW if out is None else IN_PLACE if out is x else INTO
    return Job(
        ctx=ctx, arg=arg, seq_axis=seq_axis, layout=layout, inverse=inverse, writes=writes,
        compute=compute, key=key, shape=tuple(x.shape),
    )  # fmt: skip


def turn_alike(q: Job, k: Job) -> bool:
    """Whether one launch can turn q and k of a call whose arrays share one source of angles:
    one dtype, layout and direction, and both out of place or both in place (in place, they
    share no memory: checked before any kernel runs). A kernel adds what its own launch needs
    besides."""
    return (
        q.key.dtype == k.key.dtype
        and q.layout == k.layout
        and q.inverse == k.inverse
        and q.writes == k.writes
        and q.writes in (NEW, IN_PLACE)
    )


@dataclass(frozen=True)
class Kernel:
    """One way to rotate, and everything it takes. Empty ``libraries``, ``devices``, ``dtypes`` or
    ``sources`` mean "any"; ``requires`` names optional modules it needs (checked without
    importing them). The flags say whether it takes in-place writes, tracing, gradients,
    frequencies chosen on the device, 64-bit unsigned positions, strided destinations,
    tables that need gradients, and whether it needs float64 on the device; ``tracers``: those a
    traceable kernel takes (empty: every one, as the sets); ``eager``: whether it takes calls
    that nothing traces."""

    name: str
    summary: str
    libraries: frozenset[str]
    devices: frozenset[str]
    layouts: frozenset[str]
    dtypes: frozenset[str]
    inplace: bool
    traceable: bool
    differentiable: bool
    # Its launch of one job, prepared once per call signature (see anyrope._plan).
    prepare: Callable[[Job], Launch] = field(repr=False, compare=False)
    # Both arrays of a call (q and k) in one pass where it can: one launch instead of two, the
    # larger part of a GPU decode step's time. Given two jobs it takes that share a source of
    # angles; None where it launches them apart.
    prepare_pair: Callable[[Job, Job], PairLaunch | None] | None = field(
        default=None, repr=False, compare=False
    )
    # Its launches for a traced call, where they differ from an eager call's (a custom operator
    # the compiler keeps in its graph): chosen by the call's policy (anyrope._policy), so the
    # kernel never asks what traces it. Without a traced pair launch, a traced call launches apart.
    prepare_traced: Callable[[Job], Launch] | None = field(default=None, repr=False, compare=False)
    prepare_pair_traced: Callable[[Job, Job], PairLaunch | None] | None = field(
        default=None, repr=False, compare=False
    )
    requires: tuple[str, ...] = ()
    sources: frozenset[str] = ANY
    device_frequencies: bool = True
    unsigned64: bool = True
    strided_out: bool = True
    table_grad: bool = True
    # The tracers it takes, where it is traceable (ANY: every one). torch.export is left out by
    # a kernel that is a custom op: an exported program is read by ONNX, AOTInductor and other
    # runtimes, which know standard operators only.
    tracers: frozenset[str] = ANY
    # Whether it takes a traced call of one token per sequence (a decode step). A kernel that is
    # an opaque operator to the compiler can cost more there, in its fixed cost per call, than
    # the compiler's own fused code for so little work.
    traced_one_token: bool = True
    # Whether it takes an eager call: a kernel written for a compiler to fuse can be many small
    # operations, each its own pass when run eagerly.
    eager: bool = True
    needs_float64: bool = False
    # Whether every module in ``requires`` is installed: found once, when the kernel is declared,
    # because a compiler tracing a call cannot trace importlib's lookup (dynamo refuses find_spec).
    available: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "available", all(is_installed(module) for module in self.requires))

    def why_not(self, key: KernelKey) -> str | None:
        """What a job with this key has that this kernel does not take, or None if it takes it."""
        for field_name, what in _SETS:
            have, wanted = getattr(self, field_name), getattr(key, _KEY_OF.get(field_name, field_name))
            if have and wanted not in have:
                return f"{what} {wanted} (it takes {', '.join(sorted(have))})"
        for flag, what in _FLAGS:
            if getattr(key, flag) and not getattr(self, _DECLARED_BY.get(flag, flag)):
                return f"no {what}"
        if key.tracer and self.tracers and key.tracer not in self.tracers:
            return f"no {_TRACED_BY[key.tracer]}"
        if key.tracer and key.one_token and not self.traced_one_token:
            return f"no {_ONE_TOKEN}"
        if not key.tracer and not self.eager:
            return f"no {_EAGER}"
        if self.needs_float64 and not key.float64:
            return _NEEDS_FLOAT64
        if not self.available:
            return f"needs {', '.join(self.requires)} (not installed)"
        return None

    def refuses(self) -> tuple[str, ...]:
        """What this kernel does not take besides its sets and its in-place, tracing and gradient
        flags (the docs' table has columns for those), in why_not's words."""
        return (
            *(_TRACED_BY[t] for t in TRACERS if self.traceable and self.tracers and t not in self.tracers),
            *(what for flag, what in _FLAGS[3:] if not getattr(self, _DECLARED_BY.get(flag, flag))),
            *((_ONE_TOKEN,) if self.traceable and not self.traced_one_token else ()),
            *((_EAGER,) if not self.eager else ()),
            *((_NEEDS_FLOAT64.removeprefix("it "),) if self.needs_float64 else ()),
        )

    def takes(self, key: KernelKey) -> bool:
        return self.why_not(key) is None


# The declaration's sets and flags, with the key field each is held against and how a refusal reads.
_SETS = (
    ("libraries", "library"),
    ("devices", "device"),
    ("dtypes", "dtype"),
    ("layouts", "layout"),
    ("sources", "positions from"),
)
_KEY_OF = {
    "libraries": "library",
    "devices": "device",
    "dtypes": "dtype",
    "layouts": "layout",
    "sources": "source",
}
_FLAGS = (
    ("inplace", "in-place writes"),
    ("traced", "tracing"),
    ("grad", "gradients"),
    ("device_frequencies", "frequencies chosen on the device"),
    ("unsigned64", "64-bit unsigned positions"),
    ("strided_out", "strided destination"),
    ("table_grad", "gradients for the tables"),
)
_DECLARED_BY = {"traced": "traceable", "grad": "differentiable"}
_TRACED_BY = {  # how a refusal of each tracer reads
    "torch.compile": "tracing by torch.compile",
    "torch.export": "torch.export (whose programs hold standard operators only)",
    "other": "tracing other than by torch.compile or torch.export (jax.jit, torch.func, torch.jit.trace, fake tensors)",
}
_ONE_TOKEN = "traced calls of one token per sequence (the compiler's own code is faster there)"
_EAGER = "eager calls (a form for the compiler to fuse: eagerly, each operation is a pass of its own)"
_NEEDS_FLOAT64 = "it needs float64 and 64-bit integers on the device"
