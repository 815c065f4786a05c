"""The compiler policy: how a call that a compiler traces differs from an eager one, decided here.

An eager call reads values where they live on the host, keeps tables and plans, and launches
its kernels directly. A traced call is a plan made and used once (nothing is kept), and this
module decides, once per plan, what else differs (:class:`Tracing`): which tracer it is, whether
constants that eager calls keep enter dynamo's graph as inputs (fetched through the RoPE's
handle, :mod:`._handle`), whether a call at an int offset reads rows of the kept prefix table,
how formed tables stay one node (:func:`keep_tables`), and which launch a kernel prepares.
Before any plan, :func:`call_form` says whether a call runs in a compiler's own form: JAX's
eager calls jitted whole, a call dynamo hands whole to AOTAutograd.

Table sources and kernels read these decisions; none of them asks which tracer runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ._compat import dynamo_hands_on, is_library

__all__ = [
    "EAGER", "HAND_ON", "JAX_JIT", "TRACERS", "Tracing", "call_form", "graph_capturing", "keep_tables", "tracing",
]  # fmt: skip

#: What traces a traced call, as kernels declare it: dynamo for torch.compile, torch.export (by
#: default without dynamo; its strict mode with it, told apart from torch 2.12 on), and "other"
#: for every other tracer (``jax.jit``, ``mx.compile``, ``torch.jit.trace``, ``torch.func``, fake
#: tensors).
TRACERS = ("torch.compile", "torch.export", "other")

_Prepared = TypeVar("_Prepared")


@dataclass(frozen=True, slots=True)
class Tracing:
    """How one call differs from an eager one. ``tracer``: "" (eager) or one of :data:`TRACERS`;
    ``fetches``: dynamo traces it for torch.compile, so constants that eager calls keep (the
    fused kernels' steps, prefix tables) are fetched through the RoPE's handle and enter the
    graph as inputs read in place (made inside the trace, each would be a constant the compiled
    graph copies on every call); ``kept_rows``: a call at an int offset reads its rows of the kept
    prefix table (not under ``dynamic=True``, where dynamo cannot read a fetched tensor's shape);
    ``handed_on``: AOTAutograd traces a call dynamo handed on, so fetched rows are sliced before
    the fetch (its graph would copy a whole fetched constant on every call)."""

    tracer: str
    fetches: bool = False
    kept_rows: bool = False
    handed_on: bool = False

    def prepared(self, eager: _Prepared, traced: _Prepared | None) -> _Prepared:
        """A kernel's launch for this call: its traced form, where it has one and the call is traced."""
        return traced if self.tracer and traced is not None else eager

    def paired(self, eager: _Prepared | None, traced: _Prepared | None) -> _Prepared | None:
        """A kernel's launch of q and k together for this call, or None: a traced call without
        a traced pair launch launches them apart."""
        return traced if self.tracer else eager


EAGER = Tracing("")
_EXPORT, _OTHER = Tracing("torch.export"), Tracing("other")


def tracing(xp: Any, traced: bool) -> Tracing:
    """The policy of a call on ``xp``'s arrays (``traced``: :func:`anyrope._compat.is_traced` said so)."""
    if not traced:
        return EAGER
    if not is_library(xp, "torch"):
        return _OTHER
    import torch

    # _torch_ops, loaded here before any kernel is chosen, has dynamo fold Handle.fetch (._handle)
    from ._torch_ops import dynamo_static_by_default, dynamo_traces, handed_on

    if dynamo_traces():
        return Tracing("torch.compile", True, dynamo_static_by_default(), handed_on())
    return _EXPORT if torch.compiler.is_compiling() else _OTHER


def keep_tables(policy: Tracing, xp: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    """A traced call's cos and sin tables, formed once however many arrays and heads read them.

    Under ``torch.compile`` they pass through an operator inductor cannot fuse into the rotation
    (:mod:`anyrope._torch_ops`). While ``torch.export`` traces, whose programs keep to standard
    operators that ONNX and other runtimes know, they are scattered into a buffer of their own,
    which AOTInductor keeps as well; not for ONNX, whose runtimes form each node once anyway.
    Under ``jax.jit`` see :func:`_jax_keep`. Elsewhere they are returned as they are.
    """
    if is_library(xp, "jax.numpy"):
        return _jax_keep(cos), _jax_keep(sin)
    if not is_library(xp, "torch"):
        return cos, sin
    import torch

    if not hasattr(torch.library, "register_fake"):  # torch < 2.4
        return cos, sin
    # defines its operator as it loads: eagerly, never traced
    from ._torch_ops import keep_tables as keep
    from ._torch_ops import scatter_tables

    kept: tuple[Any, Any]
    if policy.tracer == "torch.export" and not torch.onnx.is_in_onnx_export():
        kept = scatter_tables(cos, sin)
        return kept
    if policy.tracer != "torch.compile":
        return cos, sin
    if cos.requires_grad or sin.requires_grad:  # the operator has no gradient (no table needs one)
        return cos, sin
    kept = keep(cos, sin)
    return kept


def _jax_keep(table: Any) -> Any:
    """``table`` as XLA keeps it: computed once into a buffer of its own, not again inside the
    rotation's loop over every head.

    XLA fuses a cheap producer into every consumer, even one that reads each of its elements once
    per head through a broadcast, and its CPU compiler removes ``optimization_barrier`` before it
    fuses. An expensive producer it keeps out of such a consumer: a floating remainder is one, and
    the remainder of every table value by the dtype's largest gives it back bit for bit (an
    elementwise operation, so a sharded table stays where it is, where a gather of its own rows
    would make XLA gather them across a mesh). The barrier keeps the table on compilers that keep
    barriers until after fusion (GPUs).
    """
    import jax

    lax: Any = jax.lax  # untyped in JAX's stubs
    jnp: Any = jax.numpy
    largest = jnp.asarray(jnp.finfo(table.dtype).max, dtype=table.dtype)
    return lax.optimization_barrier(jnp.fmod(table, largest))  # C's fmod: the sign of table


#: The compilers' own call forms (see :func:`call_form`).
JAX_JIT, HAND_ON = "jax.jit", "hand-on"

# An offset this far from 0 leaves room for any sequence within int32: past it, the eager path
# checks that the last position fits.
_SAFE_OFFSET = 2**30


def call_form(
    q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any, inplace: bool, switch: Callable[[], Any]
) -> str | None:
    """The form a ``rope(...)`` call with no plan runs in, where a compiler's own serves it:

    - :data:`JAX_JIT`: an eager JAX call runs as one jitted call. Its arrays are concrete JAX
      arrays and every other argument is either static or an array or int that jax.jit traces.
      Anything else (lists, NumPy positions, ``inplace``, odd types) takes the eager path and its
      checks.
    - :data:`HAND_ON`: dynamo traces the call and can hand it whole to AOTAutograd, to be traced
      there as plain Python (:func:`anyrope._torch_ops.hand_on`): dynamo then guards the call's
      arguments, not every function and constant that anyrope's Python reads (a tenth of a
      compiled decode step on a CPU). Its arrays must be tensors and every other argument a
      Python scalar; lists, NumPy positions, ``inplace`` and a Kernel object as the switch
      (``switch()``: the switch that holds while traced) are traced by dynamo step by step. So
      is an int offset other than 0: dynamo makes a changing int symbolic, which a handed-on call
      would fix to each value (a compilation per decode step), and dynamo shows a symbolic int as
      an int (0 itself is handed on as the literal).
    - None: the plan of an eager call, or of a call traced step by step.
    """
    if inplace or type(seq_axis) is not int or not (k is None or type(k) is type(q)):
        return None
    if type(q).__name__ == "ArrayImpl":
        return JAX_JIT if _jax_jits(q, positions, offset) else None
    if not dynamo_hands_on(q) or not (positions is None or type(positions) is type(q)):
        return None
    if not (type(offset) is type(q) or (type(offset) is int and offset == 0)):
        return None
    return HAND_ON if type(switch()) in (bool, str) else None


def _jax_jits(q: Any, positions: Any, offset: Any) -> bool:
    if positions is not None:
        return type(positions) is type(q) and type(offset) is int and offset == 0
    if type(offset) is int:
        return -_SAFE_OFFSET < offset < _SAFE_OFFSET
    return type(offset) is type(q)


def graph_capturing(library: str, device_type: str) -> bool:
    """Whether a CUDA graph is being captured on the current stream (torch, CuPy): a replay
    reads whatever its captured pointers hold then, so a call captured reads nothing that a
    cache may regrow and free (the kept prefix table's rows), and forms its angles in the graph.
    Asked on every call: capture is no part of a call's signature."""
    if device_type != "cuda":
        return False
    if library == "torch":
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
    if library == "cupy":
        import cupy

        asked = getattr(cupy.cuda.get_current_stream(), "is_capturing", None)  # CuPy >= 10
        return asked is not None and bool(asked())
    return False
