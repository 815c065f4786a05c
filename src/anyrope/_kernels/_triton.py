"""The Triton kernel and the torch custom ops around it; imported on first use (it imports
torch and triton).

x is seen as (batch, heads, seq, trail, head_dim) with any strides (the last one 1): batch is
x's first axis, heads the axes between it and the sequence, trail those between the sequence
and the features. A program takes a block of tokens of one batch row, forms their angles once
(see :mod:`anyrope._kernel_angles`) or reads them, and rotates them in a group of heads, one
head after another; a one-token launch (a decode step) rotates its group's heads as one tile
instead, so that every access is 16 bytes wide there too. Each pair is read once and written
once. Arithmetic is the generic path's, operation for operation: float64 angles, float32 (or
float64) rotation, one rounding to x's dtype, and no fused multiply-adds (``enable_fp_fusion``
off), so on a GPU it differs from the generic result only where the device's cos or sin
differ from torch's. bfloat16 is rounded with integer arithmetic (to nearest even, NaN to
0x7FC0, as torch does on the CPU): Triton's interpreter truncates.

The ops ``anyrope::rotate`` (out of place) and ``anyrope::rotate_`` (in place) are Triton ops
(``torch.library.triton_op``): ``torch.compile(fullgraph=True)`` traces them without a graph
break, and inductor sees through them to the kernel, which it launches from its own compiled
wrapper rather than through the op's Python body (a decode step on an H200 took half the time
that way). CUDA graphs capture them (nothing here copies to or from the host). The gradient of
a rotation is the inverse rotation, through the same op.
"""

import contextlib
import os
import threading
from typing import Any, NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .._angles import SPLIT_BITS
from .._job import IN_PLACE, NEW
from .._kernel_angles import POSITIONS, STARTS, TABLES, KernelAngles
from .._memo import Memo
from .._pairs import five_axes

__all__ = ["prepare", "prepare_pair", "prepare_pair_traced", "prepare_traced"]

HALF, INVERSE, SCALED = 1, 2, 4  # flags of a call

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Triton's interpreter swaps parts of triton.language while it runs a kernel: one launch at a time.
_one_launch_at_a_time: Any = threading.Lock() if _INTERPRETED else contextlib.nullcontext()


@triton.jit
def _widen(v, BF16: tl.constexpr, COMPUTE: tl.constexpr):  # type: ignore[no-untyped-def]  # pragma: no cover
    if BF16:
        bits = v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True)
    return v.to(COMPUTE)


@triton.jit
def _narrow(v, BF16: tl.constexpr, OUT: tl.constexpr):  # type: ignore[no-untyped-def]  # pragma: no cover
    if BF16:
        bits = v.to(tl.uint32, bitcast=True).to(tl.int64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        return tl.where(nan, 0x7FC0, rounded).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return v.to(OUT)


@triton.jit
def _rotate_kernel(  # type: ignore[no-untyped-def]  # pragma: no cover - Triton types the pointers
    x_ptr, out_ptr, y_ptr, y_out_ptr, index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr,
    start, width, x_programs,
    heads, trail, seq, sxb, sxh, sxs, sxt, sob, soh, sos, sot,
    y_heads, y_trail, y_seq, syb, syh, sys, syt, syob, syoh, syos, syot,
    si_stream, si_row, si_seq, sc_row, sc_seq,
    PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr, TAIL_P2: tl.constexpr, MODE: tl.constexpr,
    MULTI: tl.constexpr, HALF: tl.constexpr, INVERSE: tl.constexpr, SCALED: tl.constexpr,
    COPY_TAIL: tl.constexpr, WIDE: tl.constexpr, BF16: tl.constexpr, SPLIT: tl.constexpr, MASK: tl.constexpr,
    BLOCK_S: tl.constexpr, HEADS: tl.constexpr, TWO: tl.constexpr,
):  # fmt: skip
    """x's programs first, then (``TWO``) y's: q and k of one call in one launch. Without TWO the
    y branch is compiled out, which tells inductor, reading the kernel for what it writes, that
    a lone x's arguments repeated as y's are not written twice."""
    pid = tl.program_id(0)
    if TWO:  # noqa: SIM102 - a constexpr test compiles the branch out; "and" with a tensor would not
        if pid >= x_programs:
            _rotate_block(
                pid - x_programs, y_ptr, y_out_ptr, y_heads, y_trail, y_seq, syb, syh, sys, syt, syob, syoh, syos,
                syot, index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, width, si_stream, si_row, si_seq,
                sc_row, sc_seq, PAIRS, PAIRS_P2, TAIL_P2, MODE, MULTI, HALF, INVERSE, SCALED, COPY_TAIL, WIDE, BF16,
                SPLIT, MASK, BLOCK_S, HEADS,
            )  # fmt: skip
            return
    _rotate_block(
        pid, x_ptr, out_ptr, heads, trail, seq, sxb, sxh, sxs, sxt, sob, soh, sos, sot,
        index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, width, si_stream, si_row, si_seq, sc_row,
        sc_seq, PAIRS, PAIRS_P2, TAIL_P2, MODE, MULTI, HALF, INVERSE, SCALED, COPY_TAIL, WIDE, BF16, SPLIT,
        MASK, BLOCK_S, HEADS,
    )  # fmt: skip


@triton.jit
def _rotate_block(  # type: ignore[no-untyped-def]  # pragma: no cover - Triton types the pointers
    pid, x_ptr, out_ptr, heads, trail, seq, sxb, sxh, sxs, sxt, sob, soh, sos, sot,
    index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, width, si_stream, si_row, si_seq, sc_row, sc_seq,
    PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr, TAIL_P2: tl.constexpr, MODE: tl.constexpr,
    MULTI: tl.constexpr, HALF: tl.constexpr, INVERSE: tl.constexpr, SCALED: tl.constexpr,
    COPY_TAIL: tl.constexpr, WIDE: tl.constexpr, BF16: tl.constexpr, SPLIT: tl.constexpr, MASK: tl.constexpr,
    BLOCK_S: tl.constexpr, HEADS: tl.constexpr,
):  # fmt: skip
    """Program ``pid`` of one array: a block of tokens of one batch row, in a group of heads."""
    COMPUTE: tl.constexpr = tl.float64 if WIDE else tl.float32
    b, group, s, s_ok = _tile(pid, heads, trail, seq, BLOCK_S, HEADS)
    c, n = _turns(
        b, s, s_ok, index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, si_stream, si_row, si_seq, sc_row,
        sc_seq, PAIRS, PAIRS_P2, MODE, MULTI, INVERSE, SCALED, COMPUTE, SPLIT, MASK,
    )  # fmt: skip
    out_type = out_ptr.dtype.element_ty
    if BLOCK_S == 1:  # one token (a decode step): the group's heads as one tile, each access wide
        head = group * HEADS + tl.arange(0, HEADS)
        live = (head < heads * trail) & s_ok  # the last group may be short
        a = (head // trail).to(tl.int64)
        t = (head % trail).to(tl.int64)
        x_rows = x_ptr + (b * sxb + a * sxh + t * sxt + s * sxs)[:, None]
        out_rows = out_ptr + (b * sob + a * soh + t * sot + s * sos)[:, None]
        _rotate_rows(x_rows, out_rows, live, c, n, width, PAIRS, PAIRS_P2, TAIL_P2, HALF, COPY_TAIL, BF16, COMPUTE, out_type, HEADS)  # fmt: skip
    else:
        for h in range(HEADS):
            head = group * HEADS + h
            live = head < heads * trail
            a = (head // trail).to(tl.int64)
            t = (head % trail).to(tl.int64)
            x_rows = x_ptr + b * sxb + a * sxh + t * sxt + s[:, None] * sxs
            out_rows = out_ptr + b * sob + a * soh + t * sot + s[:, None] * sos
            rows_ok = s < tl.where(live, seq, 0)  # tokens of the sequence, none past the last head
            _rotate_rows(x_rows, out_rows, rows_ok, c, n, width, PAIRS, PAIRS_P2, TAIL_P2, HALF, COPY_TAIL, BF16, COMPUTE, out_type, BLOCK_S)  # fmt: skip


@triton.jit
def _tile(pid, heads, trail, seq, BLOCK_S: tl.constexpr, HEADS: tl.constexpr):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Program ``pid``'s batch row (int64), group of heads, and block of tokens (int64, with
    which of them are real): the programs run through the blocks, then the groups, then the rows."""
    blocks = tl.cdiv(seq, BLOCK_S)
    groups = tl.cdiv(heads * trail, HEADS)
    rest = pid // blocks
    s = (pid % blocks) * BLOCK_S + tl.arange(0, BLOCK_S)
    return (rest // groups).to(tl.int64), rest % groups, s.to(tl.int64), s < seq


@triton.jit
def _turns(  # type: ignore[no-untyped-def]  # pragma: no cover - Triton types the pointers
    b, s, s_ok, index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, si_stream, si_row, si_seq, sc_row,
    sc_seq, PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr, MODE: tl.constexpr, MULTI: tl.constexpr,
    INVERSE: tl.constexpr, SCALED: tl.constexpr, COMPUTE: tl.constexpr, SPLIT: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """The cos and sine (negated for the inverse rotation) of each pair (columns) at each token
    ``s`` (rows: int64 token numbers of batch row ``b``, ``s_ok`` the real ones), in COMPUTE:
    read from the caller's tables, or formed from the positions (see :mod:`anyrope._kernel_angles`)."""
    j = tl.arange(0, PAIRS_P2)
    j_ok = j < PAIRS
    ok = s_ok[:, None] & j_ok[None, :]
    if MODE == 3:  # TABLES: the caller's, in the compute dtype
        where = b * sc_row + s[:, None] * sc_seq + j[None, :]
        c = tl.load(cos_ptr + where, mask=ok, other=0.0)
        n = tl.load(sin_ptr + where, mask=ok, other=0.0)
    else:
        if MODE == 0:  # OFFSET
            p = (start + s)[:, None]
        elif MODE == 1:  # STARTS, one per batch row
            row_start = tl.load(index_ptr + b * si_row).to(tl.int64)
            p = (row_start + s)[:, None]
        elif MULTI:  # POSITIONS, each pair at its own stream's
            stream = tl.load(streams_ptr + j, mask=j_ok, other=0).to(tl.int64)
            where = stream[None, :] * si_stream + b * si_row + s[:, None] * si_seq
            p = tl.load(index_ptr + where, mask=ok, other=0).to(tl.int64)
        else:  # POSITIONS
            p = tl.load(index_ptr + b * si_row + s * si_seq, mask=s_ok, other=0).to(tl.int64)[:, None]
        # the core's float64 scheme (_angles._by_float64), step for step
        negative = p < 0
        magnitude = tl.where(negative, -1 - p, p)
        f0 = tl.load(steps_ptr + j, mask=j_ok, other=0.0)[None, :]
        f1 = tl.load(steps_ptr + PAIRS + j, mask=j_ok, other=0.0)[None, :]
        f2 = tl.load(steps_ptr + 2 * PAIRS + j, mask=j_ok, other=0.0)[None, :]
        low = (magnitude & MASK).to(tl.float64) * f0
        high = magnitude >> SPLIT
        low = (high & MASK).to(tl.float64) * f1 + low
        low = ((high >> SPLIT) & MASK).to(tl.float64) * f2 + low
        angle = tl.where(negative, -(low + f0), low)
        if MODE == 1:  # a position past int64 wrapped below its row's start: 2**64 positions back
            back = tl.load(steps_ptr + 4 * PAIRS + j, mask=j_ok, other=0.0)[None, :]
            angle = tl.where(p < row_start, angle + back, angle)
        c = tl.cos(angle).to(COMPUTE)
        n = tl.sin(angle).to(COMPUTE)
        if SCALED:
            scale = tl.load(steps_ptr + 3 * PAIRS + j, mask=j_ok, other=0.0).to(COMPUTE)[None, :]
            c = c * scale
            n = n * scale
    if INVERSE:
        n = -n
    return c, n


@triton.jit
def _rotate_rows(  # type: ignore[no-untyped-def]  # pragma: no cover - Triton types the pointers
    x_rows, out_rows, rows_ok, c, n, width, PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr, TAIL_P2: tl.constexpr,
    HALF: tl.constexpr, COPY_TAIL: tl.constexpr, BF16: tl.constexpr, COMPUTE: tl.constexpr, out_type: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    """ROWS rows of features (tokens of a head, or heads of a token: ``x_rows`` and ``out_rows``
    point at each row's first feature, ``rows_ok`` says which are real), each turned by its row
    of ``c`` and ``n`` (broadcast against the rows)."""
    j = tl.arange(0, PAIRS_P2)[None, :]
    if HALF:  # pair j is (j, j + PAIRS)
        here = rows_ok[:, None] & (j < PAIRS)
        x1 = _widen(tl.load(x_rows + j, mask=here, other=0.0), BF16, COMPUTE)
        x2 = _widen(tl.load(x_rows + j + PAIRS, mask=here, other=0.0), BF16, COMPUTE)
        tl.store(out_rows + j, _narrow(x1 * c - x2 * n, BF16, out_type), mask=here)
        tl.store(out_rows + j + PAIRS, _narrow(x2 * c + x1 * n, BF16, out_type), mask=here)
    else:  # pair j is (2j, 2j + 1): contiguous rows split into pairs in registers (stride-2
        # accesses are not vectorised)
        element = tl.arange(0, 2 * PAIRS_P2)[None, :]
        here = rows_ok[:, None] & (element < 2 * PAIRS)
        row = _widen(tl.load(x_rows + element, mask=here, other=0.0), BF16, COMPUTE)
        x1, x2 = tl.split(tl.reshape(row, (ROWS, PAIRS_P2, 2)))
        turned = tl.reshape(tl.join(x1 * c - x2 * n, x2 * c + x1 * n), (ROWS, 2 * PAIRS_P2))
        tl.store(out_rows + element, _narrow(turned, BF16, out_type), mask=here)
    if COPY_TAIL:
        tail = 2 * PAIRS + tl.arange(0, TAIL_P2)[None, :]
        kept = rows_ok[:, None] & (tail < width)
        tl.store(out_rows + tail, tl.load(x_rows + tail, mask=kept), mask=kept)


def _five(x: torch.Tensor, seq_axis: int) -> torch.Tensor | None:
    """x as (batch, heads, seq, trail, head_dim) sharing its memory, or None where its strides
    do not allow that view (or its features are not adjacent)."""
    shape = five_axes(tuple(x.shape), seq_axis)
    try:
        view = x.view(shape)
    except RuntimeError:
        return None
    return view if view.stride(-1) == 1 or shape[-1] == 1 else None


def _five_of(x: torch.Tensor, seq_axis: int) -> tuple[torch.Tensor, bool]:
    """x as (batch, heads, seq, trail, head_dim): a view where its strides allow one, else a
    view of a contiguous copy (a kernel only reads x); and whether it is the copy's."""
    found = _five(x, seq_axis)
    if found is not None:
        return found, False
    copy = _five(x.contiguous(), seq_axis)
    assert copy is not None
    return copy, True


class Angles(NamedTuple):
    """A call's angles as the ops take them (see :class:`anyrope._kernel_angles.KernelAngles`), and its flags."""

    positions: torch.Tensor | None  # or the starts
    start: int
    steps: torch.Tensor | None
    streams: torch.Tensor | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    mode: int
    pairs: int
    flags: int


def angle_arguments(
    angles: Angles, spare: torch.Tensor
) -> tuple[list[torch.Tensor], tuple[int, ...], tuple[int, ...]]:
    """What :func:`_turns` reads of a call's angles: its five tensors (``spare``, any tensor,
    where the mode reads none), the index's strides (stream, row, token) and the tables' (row,
    token), 0 along an axis the batch shares."""
    index, cos, sin, mode = angles.positions, angles.cos, angles.sin, angles.mode
    si = (0, 0, 0)
    if index is not None and mode == STARTS:
        si = (0, index.stride(0) if index.shape[0] > 1 else 0, 0)
    elif index is not None and mode == POSITIONS:
        si = (index.stride(0), index.stride(1) if index.shape[1] > 1 else 0, index.stride(2))
    sc = (0, 0)
    if cos is not None and sin is not None and mode == TABLES:
        if cos.stride(-1) != 1 or sin.stride() != cos.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
        sc = (cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1))
    pointers = [spare if a is None else a for a in (index, angles.steps, angles.streams, cos, sin)]
    return pointers, si, sc


def tiling(seqs: list[Any], lanes: list[Any], pairs_p2: int, row_bytes: int) -> tuple[int, int, int]:
    """A launch's block of tokens, group of heads and warps, for arrays of these lengths and
    head counts (heads times trail), whose widest load of a row is ``row_bytes``."""
    # A traced length or head count (a SymInt of torch.export's dynamic shapes) takes the widest
    # block and group: fitting them to it would be a guard outside the range it declares.
    widest = 2048 // pairs_p2
    static = True
    for n in (*seqs, *lanes):
        static = static and isinstance(n, int)
    block_s = max(1, min(triton.next_power_of_2(max(seqs)), widest)) if static else widest
    if block_s > 1:
        return block_s, min(8, max(lanes)) if static else 8, 4
    # one token: a tile of the group's heads (a power of two), 16 bytes a thread
    group = min(8, triton.next_power_of_2(max(lanes))) if static else 8
    return block_s, group, max(1, min(4, group * row_bytes // (32 * 16)))


class _Fixed(NamedTuple):
    """What a launch's arrays fix of it (their shapes and strides, the RoPE's pairs and the
    call's flags): its grid, the kernel's integer arguments after the angles' start (the arrays'
    strides among them), and its constants but the angles' own."""

    grid: int
    ints: tuple[Any, ...]
    options: dict[str, Any]


def _fixed(
    arrays: list[tuple[torch.Tensor, torch.Tensor]], pairs: int, flags: int, copy_tail: bool
) -> _Fixed:
    """The fixed part of a launch of these five-axis arrays, each x with elements, and outs."""
    pairs_p2 = triton.next_power_of_2(pairs)
    seqs = [x.shape[2] for x, _ in arrays]
    lanes = [x.shape[1] * x.shape[3] for x, _ in arrays]  # heads times trail
    x = arrays[0][0]
    row = (pairs_p2 if flags & HALF else 2 * pairs_p2) * x.element_size()
    block_s, group, warps = tiling(seqs, lanes, pairs_p2, row)
    programs = [
        x.shape[0] * triton.cdiv(n, group) * triton.cdiv(seq, block_s)
        for (x, _), n, seq in zip(arrays, lanes, seqs, strict=True)
    ]
    shapes = [(x.shape[1], x.shape[3], x.shape[2], *x.stride()[:4], *out.stride()[:4]) for x, out in arrays]
    width = x.shape[4]
    options = {
        "PAIRS": pairs, "PAIRS_P2": pairs_p2, "TAIL_P2": triton.next_power_of_2(max(1, width - 2 * pairs)),
        "HALF": bool(flags & HALF), "INVERSE": bool(flags & INVERSE), "SCALED": bool(flags & SCALED),
        "COPY_TAIL": copy_tail and width > 2 * pairs, "WIDE": x.dtype == torch.float64,
        "BF16": x.dtype == torch.bfloat16, "SPLIT": SPLIT_BITS, "MASK": (1 << SPLIT_BITS) - 1,
        "BLOCK_S": block_s, "HEADS": group, "TWO": len(arrays) == 2, "enable_fp_fusion": False,
        "num_warps": warps,
    }  # fmt: skip
    # a lone x's shape and strides stand in for y's too: its programs are all there are
    return _Fixed(sum(programs), (width, programs[0], *shapes[0], *shapes[-1]), options)


def _launch(
    arrays: list[tuple[torch.Tensor, torch.Tensor]], angles: Angles, *, fixed: _Fixed, direct: bool
) -> None:
    """Rotate each x into its out (x itself in place), one or two arrays with elements in one
    launch: the first array's programs, then the second's. The kernel reads the arrays'
    pointers, and their shapes and strides from ``fixed``: five-axis views, or (a kept recipe's
    launch) the arrays those views are of. ``direct``: an eager call launches the kernel itself,
    not through ``wrap_triton``, which the ops need for tracing. Under the interpreter every
    launch is direct: the ops are plain custom ops there, and torch 2.11's ``wrap_triton``
    refuses an interpreted kernel."""
    (x, out), (y, y_out) = arrays[0], arrays[-1]  # y is x again where it is alone
    pointers, si, sc = angle_arguments(angles, x)
    with _one_launch_at_a_time:
        (_rotate_kernel if direct or _INTERPRETED else wrap_triton(_rotate_kernel))[(fixed.grid,)](
            x, out, y, y_out, *pointers, angles.start, *fixed.ints, *si, *sc,  # x where the mode reads nothing
            MODE=angles.mode, MULTI=angles.streams is not None, **fixed.options,
        )  # fmt: skip


class _Recipe(NamedTuple):
    """What an eager call's arrays (their shapes and strides) fix of its run: which x is read
    through a contiguous copy and which out written through a dense buffer (strides that make
    no five-axis view), the arrays with elements, and the launch's fixed part (None: none has)."""

    copied: tuple[bool, ...]
    dense: tuple[bool, ...]
    live: tuple[int, ...]
    fixed: _Fixed | None


def _run(
    calls: list[tuple[torch.Tensor, torch.Tensor, int]], angles: Angles, direct: bool = False,
    kept: Memo[_Recipe] | None = None,
) -> None:  # fmt: skip
    """Rotate each x into its out (which may be x), of any strides, given as (x, out, x's
    sequence axis): one or two arrays of one dtype, in one launch (``direct``: see _launch).
    ``kept``: a direct launch's recipes by its arrays' shapes and strides, which the first call
    of a plan works out and the others look up."""
    key: Any = None
    recipe = None
    if kept is not None:
        key = [angles.pairs, angles.flags]
        for x, out, seq_axis in calls:
            key += (x.shape, x.stride(), out is x, out.stride(), seq_axis)
        key = tuple(key)
        recipe = kept.find(key)
    if recipe is None:
        recipe, arrays, copies = _worked_out(calls, angles)
        if kept is not None:
            kept.keep(key, recipe)
    else:
        arrays, copies = _by_recipe(recipe, calls)
    if recipe.fixed is not None:
        live = arrays if len(recipe.live) == len(arrays) else [arrays[i] for i in recipe.live]
        _launch(live, angles, fixed=recipe.fixed, direct=direct)
    for out, buffer in copies:
        out.copy_(buffer)


def _worked_out(
    calls: list[tuple[torch.Tensor, torch.Tensor, int]], angles: Angles
) -> tuple[_Recipe, list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The recipe of a call, with its five-axis arrays (views of x, of its copy, of out or of a
    dense buffer written in out's stead) and the (out, buffer) pairs to copy back."""
    arrays, copies, copied, dense = [], [], [], []
    for x, out, seq_axis in calls:
        out5 = _five(out, seq_axis)
        dense.append(out5 is None)
        if out5 is None:  # into a dense buffer, then copied through out's strides
            buffer = torch.empty_like(x, memory_format=torch.contiguous_format)
            copies.append((out, buffer))
            out5 = _five(buffer, seq_axis)
            assert out5 is not None
        x5, was_copied = _five_of(x, seq_axis)
        copied.append(was_copied)
        arrays.append((x5, out5))
    live = tuple(i for i, (x, _) in enumerate(arrays) if x.numel() != 0)
    fixed = None
    if live:
        # by identity, not by data pointer: a fake tensor has none
        in_place = not copies and all(x is out for x, out, _ in calls)
        fixed = _fixed([arrays[i] for i in live], angles.pairs, angles.flags, copy_tail=not in_place)
    return _Recipe(tuple(copied), tuple(dense), live, fixed), arrays, copies


def _by_recipe(
    recipe: _Recipe, calls: list[tuple[torch.Tensor, torch.Tensor, int]]
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """A later call's arrays by its plan's recipe: its own, whose five-axis views the recipe's
    strides describe (the kernel reads their pointers), or a contiguous copy of x and a dense
    buffer for out where the recipe says so; and the (out, buffer) pairs to copy back."""
    arrays, copies = [], []
    for (x, out, _), copied, dense in zip(calls, recipe.copied, recipe.dense, strict=True):
        if dense:
            buffer = torch.empty_like(x, memory_format=torch.contiguous_format)
            copies.append((out, buffer))
            out = buffer  # written in out's stead
        arrays.append((x.contiguous() if copied else x, out))
    return arrays, copies


# The ops share their arguments after the arrays: the call's Angles (its mode named "source":
# torch keeps "mode" for itself), then each array's sequence axis. ``rotate_pair`` rotates q and
# k of one call (one dtype, one set of angles) in one launch. The schema comes from the
# annotations (Optional, not "| None": torch's schema inference on Python 3.10 reads typing's form).
# Under the interpreter (the CPU test run) they are plain custom ops with fake implementations:
# there wrap_triton hands back the interpreted kernel, which would run on fake tensors.
_define: Any = torch.library.custom_op if _INTERPRETED else triton_op


@_define("anyrope::rotate", mutates_args=())
def _rotate(
    x: torch.Tensor, index: Optional[torch.Tensor], start: int, steps: Optional[torch.Tensor],  # noqa: UP045
    streams: Optional[torch.Tensor], cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],  # noqa: UP045
    source: int, pairs: int, flags: int, seq_axis: int,
) -> torch.Tensor:  # fmt: skip
    """x rotated into a new tensor of its shape, dtype and device."""
    out = torch.empty_like(x)
    _run([(x, out, seq_axis)], Angles(index, start, steps, streams, cos, sin, source, pairs, flags))
    return out


@_define("anyrope::rotate_", mutates_args={"x"})
def _rotate_inplace(
    x: torch.Tensor, index: Optional[torch.Tensor], start: int, steps: Optional[torch.Tensor],  # noqa: UP045
    streams: Optional[torch.Tensor], cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],  # noqa: UP045
    source: int, pairs: int, flags: int, seq_axis: int,
) -> None:  # fmt: skip
    """x rotated in place."""
    _run([(x, x, seq_axis)], Angles(index, start, steps, streams, cos, sin, source, pairs, flags))


@_define("anyrope::rotate_pair", mutates_args=())
def _rotate_pair(
    x: torch.Tensor, y: torch.Tensor, index: Optional[torch.Tensor], start: int,  # noqa: UP045
    steps: Optional[torch.Tensor], streams: Optional[torch.Tensor], cos: Optional[torch.Tensor],  # noqa: UP045
    sin: Optional[torch.Tensor], source: int, pairs: int, flags: int, x_axis: int, y_axis: int,  # noqa: UP045
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x and y rotated alike into new tensors, in one launch."""
    x_out, y_out = torch.empty_like(x), torch.empty_like(y)
    angles = Angles(index, start, steps, streams, cos, sin, source, pairs, flags)
    _run([(x, x_out, x_axis), (y, y_out, y_axis)], angles)
    return x_out, y_out


@_define("anyrope::rotate_pair_", mutates_args={"x", "y"})
def _rotate_pair_inplace(
    x: torch.Tensor, y: torch.Tensor, index: Optional[torch.Tensor], start: int,  # noqa: UP045
    steps: Optional[torch.Tensor], streams: Optional[torch.Tensor], cos: Optional[torch.Tensor],  # noqa: UP045
    sin: Optional[torch.Tensor], source: int, pairs: int, flags: int, x_axis: int, y_axis: int,  # noqa: UP045
) -> None:  # fmt: skip
    """x and y rotated alike in place, in one launch."""
    angles = Angles(index, start, steps, streams, cos, sin, source, pairs, flags)
    _run([(x, x, x_axis), (y, y, y_axis)], angles)


if _INTERPRETED:

    @_rotate.register_fake
    def _rotate_fake(x: torch.Tensor, *call: Any) -> torch.Tensor:  # noqa: ARG001 - the op's signature
        return torch.empty_like(x)

    @_rotate_inplace.register_fake
    def _rotate_inplace_fake(x: torch.Tensor, *call: Any) -> None:  # noqa: ARG001 - the op's signature
        return None

    @_rotate_pair.register_fake
    def _rotate_pair_fake(x: torch.Tensor, y: torch.Tensor, *call: Any) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ARG001
        return torch.empty_like(x), torch.empty_like(y)

    @_rotate_pair_inplace.register_fake
    def _rotate_pair_inplace_fake(x: torch.Tensor, y: torch.Tensor, *call: Any) -> None:  # noqa: ARG001
        return None


# A rotation is linear and orthogonal: its vector-Jacobian product is the inverse rotation,
# through the same op. Each op saves its angles and the call with the inverse flag.


def _setup_backward(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:  # noqa: ARG001
    arrays = 2 if len(inputs) == 13 else 1  # rotate_pair's inputs, else rotate's
    angles, axes = Angles(*inputs[arrays : arrays + 9]), inputs[arrays + 9 :]
    ctx.save_for_backward(angles.positions, angles.steps, angles.streams, angles.cos, angles.sin)
    ctx.call = (angles.start, angles.mode, angles.pairs, angles.flags ^ INVERSE, *axes)


def _inverse(ctx: Any, arrays: tuple[torch.Tensor, ...]) -> Any:
    index, steps, streams, cos, sin = ctx.saved_tensors
    start, mode, pairs, flags, *axes = ctx.call
    op = torch.ops.anyrope.rotate if len(arrays) == 1 else torch.ops.anyrope.rotate_pair
    return op(*arrays, index, start, steps, streams, cos, sin, mode, pairs, flags, *axes)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return (_inverse(ctx, (grad,)), *([None] * 10))


def _backward_pair(ctx: Any, grad_x: torch.Tensor, grad_y: torch.Tensor) -> tuple[Any, ...]:
    return (*_inverse(ctx, (grad_x, grad_y)), *([None] * 11))


torch.library.register_autograd("anyrope::rotate", _backward, setup_context=_setup_backward)
torch.library.register_autograd("anyrope::rotate_pair", _backward_pair, setup_context=_setup_backward)


def _flags(job: Any, fused: KernelAngles) -> int:
    flags = (HALF if job.layout == "half" else 0) | (INVERSE if job.inverse else 0)
    return flags | (SCALED if fused.scaled else 0)


def _angles(job: Any, fused: KernelAngles) -> Angles:
    return Angles(
        fused.index, fused.start, fused.steps, fused.streams, fused.cos, fused.sin, fused.mode, fused.pairs,
        _flags(job, fused),
    )  # fmt: skip


def prepare(job: Any) -> Any:
    """The launch of one job of an eager call: one that records no gradient launches the kernel
    itself (the op layer, which torch.compile, torch.export and autograd need, costs an eager
    call more than its launch); one that does goes through the ops. The direct launch keeps
    its recipe (see _run): a plan's calls share their arrays' shapes and strides."""
    axis, writes, compute = job.seq_axis, job.writes, job.compute
    if not job.ctx.grad:
        kept: Memo[_Recipe] = Memo(8)  # a plan's arrays have one shape and strides

        def direct(x: torch.Tensor, out: Any, source: Any) -> Any:
            angles = _angles(job, source.kernel_angles(compute))
            if writes == NEW:
                out = torch.empty_like(x)
            _run([(x, out, axis)], angles, direct=True, kept=kept)
            return out

        return direct
    return prepare_traced(job)


def prepare_traced(job: Any) -> Any:
    """The launch of one job through the ops: a traced call's, or one autograd records."""
    compute = job.compute

    def through_ops(x: torch.Tensor, out: Any, source: Any) -> Any:
        return _call_ops(job, x, out, source.kernel_angles(compute))

    return through_ops


def prepare_pair(q: Any, k: Any) -> Any:
    """The launch of q and k of one source, dtype, layout and destination kind (both new arrays,
    or both in place) in one kernel launch: an eager call's (see :func:`prepare`)."""
    x_axis, y_axis, new, compute = q.seq_axis, k.seq_axis, q.writes == NEW, q.compute
    if not q.ctx.grad:
        kept: Memo[_Recipe] = Memo(8)  # a plan's arrays have one shape and strides

        def direct(
            x: torch.Tensor, y: torch.Tensor, out_x: Any, out_y: Any, source: Any, _: Any
        ) -> tuple[Any, Any]:
            angles = _angles(q, source.kernel_angles(compute))
            if new:
                out_x, out_y = torch.empty_like(x), torch.empty_like(y)
            _run([(x, out_x, x_axis), (y, out_y, y_axis)], angles, direct=True, kept=kept)
            return out_x, out_y

        return direct
    return prepare_pair_traced(q, k)


def prepare_pair_traced(q: Any, k: Any) -> Any:
    """The launch of q and k in one kernel launch through the ops: a traced call's, or one
    autograd records."""
    x_axis, y_axis, new, compute = q.seq_axis, k.seq_axis, q.writes == NEW, q.compute

    def through_ops(x: torch.Tensor, y: torch.Tensor, out_x: Any, out_y: Any, source: Any, _: Any) -> Any:  # noqa: ARG001
        fused = source.kernel_angles(compute)
        angles = (fused.index, fused.start, fused.steps, fused.streams, fused.cos, fused.sin)
        call = (*angles, fused.mode, fused.pairs, _flags(q, fused), x_axis, y_axis)
        if new:
            return torch.ops.anyrope.rotate_pair(x, y, *call)
        torch.ops.anyrope.rotate_pair_(x, y, *call)
        return x, y

    return through_ops


def _call_ops(job: Any, x: torch.Tensor, out: Any, fused: KernelAngles) -> Any:
    """Run ``job`` through the ops: out of place, in place, or into ``out``."""
    angles = (fused.index, fused.start, fused.steps, fused.streams, fused.cos, fused.sin)
    call = (*angles, fused.mode, fused.pairs, _flags(job, fused), job.seq_axis)
    if job.writes == NEW:
        return torch.ops.anyrope.rotate(x, *call)
    if job.writes == IN_PLACE:
        torch.ops.anyrope.rotate_(x, *call)
        return x
    out.copy_(torch.ops.anyrope.rotate(x, *call))
    return out
