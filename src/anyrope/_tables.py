"""Table sources: where a job's cos and sin come from, as tables or as a fused kernel forms them.

:class:`PositionTables` makes the tables of a call's positions (cached rows of the prefix table
where the positions are known on the host, else formed on the device, with length-dependent
scaling chosen there too); :class:`GivenTables` holds the tables a caller passed to
:func:`anyrope.apply`; :class:`XPosTables` scales a call's tables by xPos's decay. Each says what
it is (``kind`` and the flags the kernel key reads) and gives its own fused-kernel form.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable
from typing import Any

from ._angles import cos_sin, cos_sin_of_angles
from ._cache import table_cache, untracked
from ._compat import Environment, environment, float64_scope, materialize, take_rows
from ._context import CallContext
from ._frequencies import LengthSwitch, PairFrequencies
from ._kernel_angles import OFFSET, POSITIONS, STARTS, TABLES, KernelAngles, device_steps
from ._layout import Layout
from ._policy import graph_capturing, keep_tables
from ._positions import ArrayOffset, MultiAxis, Offset, Positions, PositionSpec
from ._rotary import Rotary
from ._xpos import xpos_scale
from .scaling import exponents

__all__ = [
    "GivenTables", "PositionTables", "TableFacts", "XPosTables", "prefix_tables", "scaled", "side_by_side",
    "signed_sin",
]  # fmt: skip

_KINDS = {Offset: "offset", ArrayOffset: "row-offsets", Positions: "positions", MultiAxis: "multi-axis"}


def scaled(tables: tuple[Any, Any], scale: float) -> tuple[Any, Any]:
    return tables if scale == 1.0 else (tables[0] * scale, tables[1] * scale)


def side_by_side(xp: Any, cos: Any, sin: Any) -> Any:
    """(..., pairs) cos and sin tables as one (..., 2 * pairs) table, each pair's cos and sin
    side by side, [c0, s0, c1, s1, ...]: the form the CPU kernels read as one stream."""
    table = xp.stack((cos, sin), axis=-1)
    return xp.reshape(table, (*table.shape[:-2], 2 * table.shape[-2]))


def signed_sin(xp: Any, sin: Any, layout: Layout) -> Any:
    """A (..., pairs) sin table as the (..., 2 * pairs) factor of each feature's partner, in the
    layout's feature order: [-s | s] for half pairs, [-s0, s0, -s1, s1, ...] for interleaved
    ones, so that a rotation is ``x * cos + partner * signed`` (the MLX kernel's form)."""
    table = xp.stack((-sin, sin), axis=-2 if layout == "half" else -1)
    return xp.reshape(table, (*sin.shape[:-1], 2 * sin.shape[-1]))


#: The forms a prefix table is kept in, each a cache entry of its own: what it holds, made from
#: (cos, sin), and its width in pairs (for the cache's byte count). The kernels that read a form
#: other than "cos_sin" say so where they ask for it.
_FORMS: dict[str, tuple[Callable[[Any, Any, Any], tuple[Any, ...]], int]] = {
    "cos_sin": (lambda xp, cos, sin: (cos, sin), 2),  # noqa: ARG005 - every form takes xp
    "side_by_side": (lambda xp, cos, sin: (side_by_side(xp, cos, sin),), 2),
    "signed_half": (lambda xp, cos, sin: (cos, signed_sin(xp, sin, "half")), 3),
    "signed_interleaved": (lambda xp, cos, sin: (cos, signed_sin(xp, sin, "interleaved")), 3),
}


def prefix_tables(
    rotary: Rotary,
    xp: Any,
    env: Environment,
    freqs: PairFrequencies,
    length: int,
    dtype: Any,
    *,
    form: str = "cos_sin",
) -> tuple[Any, ...] | None:
    """Cached tables for positions 0 .. length - 1 or more, in ``form`` (a key of :data:`_FORMS`:
    (cos, sin) by default), or None where none are kept."""
    if not rotary.spectrum.cacheable(freqs):
        return None  # DynamicNTK past the original length: new frequencies at every length
    make, width = _FORMS[form]
    key = (freqs, env, dtype, form)  # env: one object per library and device
    found = table_cache.covering(key, length)
    if found is not None:
        return found

    def build(n: int) -> tuple[Any, ...]:
        with untracked(xp):
            positions = Offset(0).positions(xp, env, n)
            tables = cos_sin(xp, env, positions, freqs.inv_freq, dtype=dtype)
            made = make(xp, *scaled(tables, freqs.scale))
        materialize(xp, *made)  # the cache shares them across threads
        return made

    row_bytes = width * rotary.rotary_dim // 2 * (8 if dtype == getattr(xp, "float64", None) else 4)
    return table_cache.prefix(key, length, build, row_bytes=row_bytes, hint=rotary.max_position or 0)


#: Positions in the prefix table a traced call reads (see PositionTables._kept_rows): 8192
#: positions of 64 pairs take 4 MiB in float32.
TRACED_ROWS = 8192


def _traced_length(rotary: Rotary) -> int:
    """How many positions the prefix table a traced call reads covers at least (dynamo cannot
    read a fetched tensor's shape under ``dynamic=True``)."""
    return min(rotary.max_position or TRACED_ROWS, TRACED_ROWS)


#: What a traced call fetches of the kept prefix (see _kept_prefix): the cos or the sin table, or
#: the one table of both side by side that the CPU kernels read.
_PARTS = {"cos": ("cos_sin", 0), "sin": ("cos_sin", 1), "side_by_side": ("side_by_side", 0)}


def _kept_prefix(
    rotary: Rotary, device: Any, dtype: Any, which: str, part: str, rows: tuple[int, int] | None = None
) -> Any:
    """One ``part`` (a key of :data:`_PARTS`) of the prefix table of a traced call's frequencies,
    as eager calls keep it (the same entry), or None where the cache keeps none that long;
    ``rows``: (start, stop), only those rows (a view)."""
    from array_api_compat import torch as xp

    from ._torch_ops import real_tensors

    form, index = _PARTS[part]
    length = _traced_length(rotary)
    with real_tensors():
        freqs, env = rotary.spectrum.named(which), environment(xp, device)
        found = prefix_tables(rotary, xp, env, freqs, length, dtype, form=form)
        if found is None:
            return None
        return found[index] if rows is None else found[index][rows[0] : rows[1], ...]


def _once(made: list[tuple[Any, Any, Any]], seq: int, dtype: Any, make: Callable[[], Any]) -> Any:
    """``make()``'s result for (seq, dtype), made once per call: q and k of one length share it.
    Searched with ==, not hashed: hashing a traced length (a torch SymInt) would fix it to one
    value, and dynamic shapes would recompile for every other."""
    for made_seq, made_dtype, value in made:
        if made_dtype == dtype and made_seq == seq:
            return value
    value = make()
    made.append((seq, dtype, value))
    return value


class TableFacts:
    """What the tables of a RoPE's calls in one context and position form are, before any value:
    made once per call plan (see anyrope._plan), shared by its calls' :class:`PositionTables`.
    ``keys``: the table cache's key of each (dtype, form) of the fixed frequencies' prefix
    tables, worked out once (hashing the frequencies costs a call)."""

    __slots__ = ("cacheable", "ctx", "fixed", "keys", "kind", "plain", "rotary", "steps")

    def __init__(self, rotary: Rotary, ctx: CallContext, kind: str, multi_axis: bool) -> None:
        self.rotary, self.ctx, self.kind = rotary, ctx, kind
        spectrum = rotary.spectrum
        self.fixed = spectrum.static if spectrum.switch is None else None  # one set for every call
        # whether the tables are rows of the plain spectrum's table (cached per position)
        self.plain = not multi_axis and rotary.plain_order
        self.cacheable = self.plain and not ctx.traced and not ctx.env.lazy
        self.keys: dict[tuple[Any, str], tuple[Any, ...]] = {}
        self.steps: dict[tuple[PairFrequencies, bool], tuple[Any, Any]] = {}

    def fused_steps(self, freqs: PairFrequencies, multi: bool) -> tuple[Any, Any]:
        """The fused kernels' steps of ``freqs`` (see :func:`device_steps`), found once per plan."""
        found = self.steps.get((freqs, multi))
        if found is None:
            found = self.steps[freqs, multi] = device_steps(self.ctx, self.rotary, freqs, multi=multi)
        return found

    def key(self, freqs: PairFrequencies, dtype: Any, form: str) -> tuple[Any, ...]:
        """The table cache's key of the prefix tables of ``freqs`` in ``dtype`` and ``form``."""
        if freqs is not self.fixed:
            return (freqs, self.ctx.env, dtype, form)
        found = self.keys.get((dtype, form))
        if found is None:
            found = self.keys[dtype, form] = (
                freqs,
                self.ctx.env,
                dtype,
                form,
            )  # env: one per library and device
        return found


class PositionTables:
    """The tables of a RoPE call's positions, for each sequence length and dtype, made once per call."""

    table_grad = False

    def __init__(
        self, rotary: Rotary, ctx: CallContext, spec: PositionSpec, seq: int, facts: TableFacts | None = None
    ) -> None:
        if facts is None:
            facts = TableFacts(rotary, ctx, _KINDS[type(spec)], isinstance(spec, MultiAxis))
        self.rotary, self.ctx, self.spec, self.seq, self.facts = rotary, ctx, spec, seq, facts
        self.kind, self.plain = facts.kind, facts.plain
        self.host = None if ctx.traced else spec.host_range(seq)  # over the longest array
        fixed = facts.fixed
        self.freqs = (
            fixed
            if fixed is not None
            else rotary.spectrum.for_call(None if self.host is None else self.host[1] + 1)
        )
        self.device_frequencies = fixed is None and isinstance(self.freqs, LengthSwitch)
        self.unsigned64 = spec.unsigned64
        self._made: list[tuple[Any, Any, Any]] = []  # (seq, dtype, tables): see _once
        self._sides: list[tuple[Any, Any, Any]] = []  # (seq, dtype, side-by-side table)
        self._lookups: dict[tuple[int, Any], tuple[Any, Any] | None] = {}
        self._signed: dict[Layout, list[tuple[Any, Any, Any]]] = {"half": [], "interleaved": []}  # see _once
        self._fused: dict[Any, KernelAngles] = {}  # by the compute dtype

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        return _once(self._made, seq, dtype, lambda: self._make_tables(seq, dtype))  # type: ignore[no-any-return]

    def _make_tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        policy = self.ctx.tracing
        if not policy.tracer:
            return _recent_tables(self, seq, dtype)
        kept = self._kept_rows(seq, dtype, "cos", "sin")
        if kept is not None:
            return kept[0], kept[1]
        # formed once, not again in the loop over each array's heads
        return keep_tables(policy, self.ctx.xp, *self._tables(seq, dtype))

    def side_by_side(self, seq: int, dtype: Any) -> Any:
        """The call's table of :func:`side_by_side`, one for q and k: at an int offset inside the
        kept prefix, while the policy fetches its rows, those rows, fetched as
        :meth:`_kept_rows` fetches cos and sin (the graph forms and stacks nothing); else
        :meth:`tables` put side by side."""

        def make() -> Any:
            found = self._kept_rows(seq, dtype, "side_by_side")
            return side_by_side(self.ctx.xp, *self.tables(seq, dtype)) if found is None else found[0]

        return _once(self._sides, seq, dtype, make)

    def _kept_rows(self, seq: int, dtype: Any, *parts: str) -> tuple[Any, ...] | None:
        """Where the call's policy reads kept rows (:attr:`anyrope._policy.Tracing.kept_rows`)
        and the call is at an int offset: its rows of the cached prefix table's ``parts`` (see
        :data:`_PARTS`), fetched as plain Python through the rotary's handle (see
        :mod:`._handle`), so they enter the graph as inputs. Tables formed in the graph cost the
        cos and sin of every position on every call, several times a copy of q and k. The table
        holds :data:`TRACED_ROWS` positions (fewer where the RoPE's ``max_position`` says so); a
        call past them forms its own (a guard on its traced length)."""
        policy, spec, freqs = self.ctx.tracing, self.spec, self.freqs
        if not (policy.kept_rows and self.plain and isinstance(spec, Offset)):
            return None
        which = self.rotary.spectrum.name_of(freqs) if isinstance(freqs, PairFrequencies) else None
        if which is None:
            return None
        from ._torch_ops import as_traced  # imports torch: the array came from it

        start = spec.start
        if start < 0 or start + seq > _traced_length(self.rotary):
            return None
        # A handed-on call (offset 0, see rope_call) takes the rows themselves: AOTAutograd's graph
        # copies a constant on every call. Each part is fetched apart: dynamo cannot index a
        # tuple of fetched tensors (dynamic=True)
        rows = (start, start + seq) if policy.handed_on else None
        fetch = self.rotary.handle.fetch
        kept = [fetch(_kept_prefix, self.ctx.device, dtype, which, part, rows) for part in parts]
        if kept[0] is None:
            return None
        if rows is not None:
            return as_traced(*kept)
        return tuple(table[start : start + seq, ...] for table in kept)

    def _tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        if not isinstance(self.freqs, LengthSwitch):
            return self._static(self.freqs, seq, dtype)
        # Length-dependent scaling under tracing: both sides of the threshold, chosen on the device.
        threshold, short, long = self.freqs.threshold, self.freqs.short, self.freqs.long
        short_tables = self._static(short, seq, dtype)
        ctx, xp, rotary = self.ctx, self.ctx.xp, self.rotary
        if math.prod(short_tables[0].shape) == 0:  # no positions: no largest one
            return short_tables
        largest = self.spec.largest(xp, ctx.env, self.seq)
        if long is None:  # DynamicNTK: frequencies from the length itself
            work = xp.float64 if ctx.env.float64 else xp.float32
            with float64_scope(xp) if ctx.env.float64 else contextlib.nullcontext():
                length = xp.astype(largest, work) + 1.0  # in floats: + 1 cannot wrap
                powers, factors = self._exponents(work)
                inv_freq = rotary.spectrum.device_frequencies(xp, length, exponents=powers, factors=factors)
            long_tables = self._each_stream(
                seq,
                inv_freq,
                lambda p, pairs, wrapped: cos_sin_of_angles(
                    xp, ctx.env, p, pairs, dtype=dtype, wrapped=wrapped
                ),
                lambda pairs: take_rows(
                    xp, inv_freq, xp.asarray(pairs, dtype=ctx.env.index, device=ctx.device)
                ),
            )
        else:
            long_tables = self._static(long, seq, dtype)
        is_long = largest >= threshold  # max(positions) + 1 > threshold
        return xp.where(is_long, long_tables[0], short_tables[0]), xp.where(
            is_long, long_tables[1], short_tables[1]
        )

    def _exponents(self, dtype: Any) -> tuple[Any, Any]:
        """-2i / rotary_dim per pair, and the frequency scale (None without one), on the device:
        made there once (a copy per call could not be replayed by a CUDA graph)."""
        ctx, rotary_dim = self.ctx, self.rotary.rotary_dim
        given = self.rotary.spectrum.frequency_scale

        def build() -> tuple[Any, Any]:
            values = ctx.xp.asarray(exponents(rotary_dim), dtype=dtype, device=ctx.device)
            return values, values if given is None else ctx.xp.asarray(given, dtype=dtype, device=ctx.device)

        key = ("exponents", rotary_dim, dtype, given)
        powers, factors = table_cache.constant(
            ctx.xp, ctx.env, key, build, nbytes=8 * rotary_dim, traced=ctx.traced
        )
        return powers, None if given is None else factors

    def _each_stream(
        self,
        seq: int,
        inv_freq: Any,
        tables: Callable[[Any, Any, Any], tuple[Any, Any]],
        pick: Callable[[tuple[int, ...]], Any],
    ) -> tuple[Any, Any]:
        """``tables(positions, inv_freq, wrapped)``, where positions come per stream (M-RoPE,
        axial): each stream's tables for its own pairs (``pick`` takes their frequencies by
        index), then put in pair order; ``wrapped``: see :meth:`PositionSpec.wrapped`."""
        ctx = self.ctx
        positions = self.spec.positions(ctx.xp, ctx.env, seq)
        sections = self.rotary.sections
        if not isinstance(self.spec, MultiAxis):  # every stream at these positions
            wrapped = self.spec.wrapped(ctx.xp, ctx.env, positions)
            if sections is not None and sections.reordered:
                return tables(positions, pick(sections.freq_of), wrapped)
            return tables(positions, inv_freq, wrapped)
        assert sections is not None  # position_spec makes MultiAxis only for M-RoPE and axial RoPE
        return sections.tables(
            ctx.xp, positions, lambda p, s: tables(p, pick(sections.frequency_indices[s]), None)
        )

    def _cached(
        self, freqs: PairFrequencies, seq: int, dtype: Any, *, form: str = "cos_sin"
    ) -> tuple[Any, ...] | None:
        """The cached prefix tables covering this call's positions, where they are known on the
        host, not negative, and rows of the plain spectrum serve them (``form``: see
        :func:`prefix_tables`)."""
        if not self.facts.cacheable:
            return None
        host = self.host if seq == self.seq else self.spec.host_range(seq)
        if host is None or host[0] < 0:
            return None
        facts = self.facts
        key = facts.keys.get((dtype, form)) if freqs is facts.fixed else None
        found = table_cache.covering(key if key is not None else facts.key(freqs, dtype, form), host[1] + 1)
        if found is not None:
            return found
        ctx = self.ctx
        return prefix_tables(self.rotary, ctx.xp, ctx.env, freqs, host[1] + 1, dtype, form=form)

    def _rows(self, cached: tuple[Any, ...], seq: int) -> tuple[Any, ...]:
        """Each of the cached prefix tables at this call's positions, shape (*positions, width)."""
        ctx, xp, spec = self.ctx, self.ctx.xp, self.spec
        if isinstance(spec, Offset):
            return tuple(table[spec.start : spec.start + seq, ...] for table in cached)
        positions = spec.positions(xp, ctx.env, seq)
        flat = xp.reshape(positions, (-1,))
        if flat.dtype != ctx.env.index:
            flat = xp.astype(flat, ctx.env.index)
        return tuple(
            xp.reshape(take_rows(xp, table, flat), (*positions.shape, table.shape[-1])) for table in cached
        )

    def _static(self, freqs: PairFrequencies, seq: int, dtype: Any) -> tuple[Any, Any]:
        ctx, xp = self.ctx, self.ctx.xp
        cached = self._cached(freqs, seq, dtype)
        if cached is not None:
            cos, sin = self._rows(cached, seq)
            return cos, sin
        tables = self._each_stream(
            seq,
            freqs.inv_freq,
            lambda p, pairs, wrapped: cos_sin(
                xp, ctx.env, p, pairs, dtype=dtype, traced=ctx.traced, wrapped=wrapped
            ),
            lambda pairs: tuple(freqs.inv_freq[j] for j in pairs),
        )
        return scaled(tables, freqs.scale)

    def signed(self, seq: int, dtype: Any, layout: Layout) -> tuple[Any, Any]:
        """cos and :func:`signed_sin` at this call's positions, made once for q and k: rows of the
        cached prefix tables in that form where cached rows serve the call (nothing stacked per
        call), else the call's tables, stacked."""

        def make() -> tuple[Any, Any]:
            freqs = self.freqs
            form = f"signed_{layout}"
            cached = (
                self._cached(freqs, seq, dtype, form=form) if isinstance(freqs, PairFrequencies) else None
            )
            if cached is not None:
                cos, signed = self._rows(cached, seq)
                return cos, signed
            cos, sin = self.tables(seq, dtype)
            return cos, signed_sin(self.ctx.xp, sin, layout)

        return _once(self._signed[layout], seq, dtype, make)  # type: ignore[no-any-return]

    def lookup(self, seq: int, dtype: Any) -> tuple[Any, Any] | None:
        """The cached prefix table of :func:`side_by_side` and host rows into it, where the
        positions are host-known and inside it: the CPU kernels then read each token's row
        directly, with no gathered copy."""
        if self.device_frequencies or not self.facts.cacheable:
            return None
        key = (seq, dtype)  # q and k of one length share it
        if key in self._lookups:
            return self._lookups[key]
        found = None
        rows = self.spec.host(seq)
        if rows is not None:
            assert isinstance(self.freqs, PairFrequencies)
            cached = self._cached(self.freqs, seq, dtype, form="side_by_side")
            found = None if cached is None else (cached[0], rows)
        self._lookups[key] = found
        return found

    def kernel_angles(self, dtype: Any) -> KernelAngles:
        """The angles as a fused kernel takes them for arrays of compute dtype ``dtype`` (the
        plan's), made once for q and k (while traced, each made copy of the steps is a launch of
        its own): at an int offset whose rows the cached prefix table holds, those rows, read in
        place (the kernel forms no angle; the table grows on demand, as every eager call's does);
        else as the kernel forms them (declared: fixed frequencies, 64-bit integers)."""
        found = self._fused.get(dtype)
        if found is None:
            found = self._fused[dtype] = self._kept_kernel_rows(dtype) or self._kernel_angles()
        return found

    def _kept_kernel_rows(self, dtype: Any) -> KernelAngles | None:
        """The cached prefix table's rows of an int offset's positions, over the longest array."""
        if not isinstance(self.spec, Offset) or not isinstance(self.freqs, PairFrequencies):
            return None
        if graph_capturing(self.ctx.library, self.ctx.env.device_type):
            return None
        cached = self._cached(self.freqs, self.seq, dtype)
        if cached is None:
            return None
        cos, sin = self._rows(cached, self.seq)
        return KernelAngles(TABLES, cos.shape[-1], 1, cos=cos[None, ...], sin=sin[None, ...])

    def _kernel_angles(self) -> KernelAngles:
        assert isinstance(self.freqs, PairFrequencies)
        rotary, spec, xp = self.rotary, self.spec, self.ctx.xp
        pairs = len(rotary.pair_frequencies)
        # one position per token (1-D positions, offsets) puts every stream there: no stream lookup
        steps, streams = self.facts.fused_steps(self.freqs, isinstance(spec, MultiAxis))
        common = {"steps": steps, "streams": streams, "scaled": self.freqs.scale != 1.0}
        if isinstance(spec, Offset):
            return KernelAngles(OFFSET, pairs, 1, start=spec.start, **common)
        if isinstance(spec, ArrayOffset):
            starts = spec.start.array()
            rows = 1 if starts.ndim == 0 else starts.shape[0]
            return KernelAngles(STARTS, pairs, rows, index=xp.reshape(starts, (rows,)), **common)
        values = spec.values.array()  # type: ignore[attr-defined]
        streams_first = values if isinstance(spec, MultiAxis) else values[None, ...]
        if streams_first.ndim == 2:  # (streams, seq): shared by the batch
            streams_first = streams_first[:, None, :]
        return KernelAngles(POSITIONS, pairs, streams_first.shape[1], index=streams_first, **common)


# The tables of the position array each (frequencies, device, dtype, form, length) met last, for
# as long as that array lives unchanged: a model that passes one positions tensor to every layer
# forms its angles once per forward, not once per layer. Keyed by the array's identity (a weak
# reference) and torch's version counter, which every in-place write bumps; never by value, and
# never while traced (a traced call does not come here). Arrays without a version counter
# (NumPy's, CuPy's, torch's inference tensors) are not kept: they may be written in place unseen.
_recent: dict[tuple[Any, ...], tuple[Any, int, tuple[Any, Any]]] = {}


def _recent_tables(source: PositionTables, seq: int, dtype: Any) -> tuple[Any, Any]:
    """``source``'s tables, the last ones of its position array where that is unchanged."""
    given = source.spec.given()
    version = _version(given)
    if version is None:
        return source._tables(seq, dtype)
    key = (source.freqs, source.ctx.env, dtype, source.kind, seq)
    found = _recent.get(key)
    if found is not None and found[0]() is given and found[1] == version:
        return found[2]
    tables = source._tables(seq, dtype)
    if len(_recent) >= 64:  # one entry per frequencies, device and dtype: few
        _recent.clear()
    _recent[key] = (weakref.ref(given), version, tables)
    return tables


def _version(array: Any) -> int | None:
    """torch's count of in-place writes to ``array``, or None (no array, or none is kept)."""
    if array is None or not type(array).__module__.startswith("torch") or array.is_inference():
        return None
    version: int = array._version
    return version


class GivenTables:
    """The tables a caller made (:func:`anyrope.apply`, :func:`anyrope.rerotate`), in the compute dtype."""

    __slots__ = ("cos", "sin", "table_grad")
    kind = "tables"
    device_frequencies = False
    unsigned64 = False

    def __init__(self, cos: Any, sin: Any, *, grad: bool) -> None:
        self.cos, self.sin = cos, sin
        # gradients for the tables themselves: the generic kernel has them
        self.table_grad = grad and (
            getattr(cos, "requires_grad", False) or getattr(sin, "requires_grad", False)
        )

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:  # noqa: ARG002 - one pair for every array
        return self.cos, self.sin

    def kernel_angles(self, dtype: Any) -> KernelAngles:  # noqa: ARG002 - the caller's own dtype
        cos, sin = self.cos, self.sin
        if cos.ndim == 2:
            cos, sin = cos[None, ...], sin[None, ...]
        return KernelAngles(TABLES, cos.shape[-1], cos.shape[0], cos=cos, sin=sin)


class XPosTables:
    """A call's tables with xPos's scale: q's times ``zeta ** (m / scale_base)`` (``sign`` +1), k's
    divided by ``zeta ** (n / scale_base)`` (-1). Every kernel reads the tables then (no shared
    cached rows: the scale differs per array)."""

    __slots__ = ("positions", "sign")
    kind = "xpos"
    device_frequencies = False
    table_grad = False

    def __init__(self, positions: PositionTables, sign: float) -> None:
        self.positions, self.sign = positions, sign

    @property
    def unsigned64(self) -> bool:
        return self.positions.unsigned64

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        source = self.positions
        cos, sin = source.tables(seq, dtype)
        scale = xpos_scale(source.ctx, source.spec, seq, source.rotary, self.sign, dtype)
        return cos * scale, sin * scale
