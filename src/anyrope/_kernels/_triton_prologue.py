"""The fused prologue for torch CUDA tensors: QK-norm, RoPE and the KV-cache write in one
Triton launch; imported on first use (it imports torch and triton).

q's programs come first, then k's: a program takes a block of tokens of one batch row in a
group of heads (one token: the group's heads as one tile), as the rotation kernel does
(:mod:`._triton`, whose angles it shares: :func:`._triton._turns`). Each head's features are
read once: their squares summed, normalised as the generic :class:`anyrope.QKNorm` does (the
same operations and roundings, ``rsqrt`` as torch's), rotated, written, and for k written again
at its place in the cache, where v's row goes too. Only the sum of squares differs: summed in
float64 in Triton's order, not torch's, it may move the inverse RMS by an ulp, so q and k are
within a few units in the last place of each head's largest value (one in 16-bit dtypes; the
tests' ``PROLOGUE_ULPS``), not bit for bit.

The places are read on the device (``cache_index``, positions) or formed from an int offset,
so nothing is read on the host; a place past the cache is not written (on the host such places
are refused before the launch).
"""

import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from .._angles import SPLIT_BITS
from .._fusion import ROUNDING_CODES, PrologueJob, PrologueLaunch
from .._kvcache import KERNEL_AXES
from .._memo import Memo
from .._pairs import five_axes
from ._triton import (
    _angles,
    _five,
    _five_of,
    _narrow,
    _one_launch_at_a_time,
    _tile,
    _turns,
    _widen,
    angle_arguments,
)

__all__ = ["prepare"]

NO_PLACES, RUN, INDEX = 0, 1, 2  # where k and v go: nowhere, rows from an int offset, the places given


@triton.jit
def _rounded(v, NARROW: tl.constexpr, BF16: tl.constexpr, STORE: tl.constexpr, COMPUTE: tl.constexpr):  # type: ignore[no-untyped-def]  # pragma: no cover
    """v rounded to the storage dtype and widened again, where that is narrower."""
    if NARROW:
        return _widen(_narrow(v, BF16, STORE), BF16, COMPUTE)
    return v


@triton.jit
def _normed(  # type: ignore[no-untyped-def]  # pragma: no cover
    x, r, w_at, w_ok, offset, ROUNDING: tl.constexpr, SHIFTED: tl.constexpr, NARROW: tl.constexpr,
    BF16: tl.constexpr, STORE: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Features ``x`` normalised by their rows' ``r`` and weighted (the weights at ``w_at``,
    where ``w_ok``) as QKNorm does, rounded where it rounds."""
    if ROUNDING == 0:
        return x
    h = x * r
    weight = _widen(tl.load(w_at, mask=w_ok, other=0.0), BF16, COMPUTE)
    if ROUNDING == 1:  # (weight + offset) in the weight's dtype, times h rounded to x's
        if SHIFTED:
            weight = _rounded(weight + offset, NARROW, BF16, STORE, COMPUTE)
        return _rounded(weight * _rounded(h, NARROW, BF16, STORE, COMPUTE), NARROW, BF16, STORE, COMPUTE)
    if SHIFTED:
        weight = offset + weight
    return _rounded(h * weight, NARROW, BF16, STORE, COMPUTE)


@triton.jit
def _sum_squares(x):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Each row's sum of squares in float64: float32's rounded once, nearly as the exact sum."""
    wide = x.to(tl.float64)
    return tl.sum(wide * wide, 1)


@triton.jit
def _prologue_rows(  # type: ignore[no-untyped-def]  # pragma: no cover
    x_rows, out_rows, w_rows, rows_ok, c, n, eps, offset, ck_rows, cv_rows, v_rows, write_ok, sck_dim, scv_dim,
    WIDTH: tl.constexpr, V_WIDTH: tl.constexpr, PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr,
    TAIL_P2: tl.constexpr, V_P2: tl.constexpr, HALF: tl.constexpr, ROUNDING: tl.constexpr,
    SHIFTED: tl.constexpr, NARROW: tl.constexpr, BF16: tl.constexpr, COMPUTE: tl.constexpr,
    CACHE: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """ROWS rows of features (tokens of a head, or heads of a token), each normalised, turned by
    its row of ``c`` and ``n`` and written to ``out_rows``; with CACHE, to ``ck_rows`` too, and
    v's rows to ``cv_rows``, where ``write_ok``."""
    STORE: tl.constexpr = out_rows.dtype.element_ty
    if HALF:  # pair j is (j, j + PAIRS)
        j = tl.arange(0, PAIRS_P2)[None, :]
        here = rows_ok[:, None] & (j < PAIRS)
        x1 = _widen(tl.load(x_rows + j, mask=here, other=0.0), BF16, COMPUTE)
        x2 = _widen(tl.load(x_rows + j + PAIRS, mask=here, other=0.0), BF16, COMPUTE)
    else:  # pair j is (2j, 2j + 1): contiguous rows split into pairs in registers
        j = tl.arange(0, 2 * PAIRS_P2)[None, :]
        here = rows_ok[:, None] & (j < 2 * PAIRS)
        row = _widen(tl.load(x_rows + j, mask=here, other=0.0), BF16, COMPUTE)
    if TAIL_P2 > 0:  # features past the rotated ones (partial rotary): normalised, not turned
        tail = 2 * PAIRS + tl.arange(0, TAIL_P2)[None, :]
        kept = rows_ok[:, None] & (tail < WIDTH)
        x3 = _widen(tl.load(x_rows + tail, mask=kept, other=0.0), BF16, COMPUTE)
    r = 1.0
    if ROUNDING != 0:
        if HALF:  # noqa: SIM108 - a constexpr branch: the other's names are not defined
            squares = _sum_squares(x1) + _sum_squares(x2)
        else:
            squares = _sum_squares(row)
        if TAIL_P2 > 0:
            squares += _sum_squares(x3)
        squares = squares.to(COMPUTE)
        if COMPUTE == tl.float64:  # noqa: SIM300 - a constexpr dtype
            mean = squares / WIDTH
        else:  # Triton's "/" divides approximately on a GPU
            mean = tl.div_rn(squares, tl.full(squares.shape, WIDTH, COMPUTE))
        r = tl.rsqrt(mean + eps)[:, None]
    if HALF:
        x1 = _normed(x1, r, w_rows + j, j < PAIRS, offset, ROUNDING, SHIFTED, NARROW, BF16, STORE, COMPUTE)
        x2 = _normed(
            x2, r, w_rows + j + PAIRS, j < PAIRS, offset, ROUNDING, SHIFTED, NARROW, BF16, STORE, COMPUTE
        )
        first = _narrow(x1 * c - x2 * n, BF16, STORE)
        second = _narrow(x2 * c + x1 * n, BF16, STORE)
        tl.store(out_rows + j, first, mask=here)
        tl.store(out_rows + j + PAIRS, second, mask=here)
        if CACHE:
            there = here & write_ok[:, None]
            tl.store(ck_rows + j * sck_dim, first, mask=there)
            tl.store(ck_rows + (j + PAIRS) * sck_dim, second, mask=there)
    else:
        row = _normed(
            row, r, w_rows + j, j < 2 * PAIRS, offset, ROUNDING, SHIFTED, NARROW, BF16, STORE, COMPUTE
        )
        x1, x2 = tl.split(tl.reshape(row, (ROWS, PAIRS_P2, 2)))
        turned = tl.reshape(tl.join(x1 * c - x2 * n, x2 * c + x1 * n), (ROWS, 2 * PAIRS_P2))
        turned = _narrow(turned, BF16, STORE)
        tl.store(out_rows + j, turned, mask=here)
        if CACHE:
            tl.store(ck_rows + j * sck_dim, turned, mask=here & write_ok[:, None])
    if TAIL_P2 > 0:
        x3 = _normed(
            x3, r, w_rows + tail, tail < WIDTH, offset, ROUNDING, SHIFTED, NARROW, BF16, STORE, COMPUTE
        )
        x3 = _narrow(x3, BF16, STORE)
        tl.store(out_rows + tail, x3, mask=kept)
        if CACHE:
            tl.store(ck_rows + tail * sck_dim, x3, mask=kept & write_ok[:, None])
    if CACHE:
        d = tl.arange(0, V_P2)[None, :]
        moved = write_ok[:, None] & (d < V_WIDTH)
        tl.store(cv_rows + d * scv_dim, tl.load(v_rows + d, mask=moved), mask=moved)


@triton.jit
def _prologue_block(  # type: ignore[no-untyped-def]  # pragma: no cover
    pid, x_ptr, out_ptr, w_ptr, sw, heads, trail, seq, sxb, sxh, sxs, sxt, sob, soh, sos, sot,
    v_ptr, svb, svh, svs, svt, ck_ptr, cv_ptr, sck_outer, sck_row, sck_head, sck_dim,
    scv_outer, scv_row, scv_head, scv_dim, place_ptr, place_start, sp_row, sp_seq, page_size, capacity,
    index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, si_stream, si_row, si_seq, sc_row, sc_seq,
    eps, offset,
    WIDTH: tl.constexpr, V_WIDTH: tl.constexpr, PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr,
    TAIL_P2: tl.constexpr, V_P2: tl.constexpr, MODE: tl.constexpr, MULTI: tl.constexpr, HALF: tl.constexpr,
    INVERSE: tl.constexpr, SCALED: tl.constexpr, WIDE: tl.constexpr, BF16: tl.constexpr, NARROW: tl.constexpr,
    SPLIT: tl.constexpr, MASK: tl.constexpr, ROUNDING: tl.constexpr, SHIFTED: tl.constexpr,
    PLACES: tl.constexpr, PAGED: tl.constexpr, BLOCK_S: tl.constexpr, HEADS: tl.constexpr,
):  # fmt: skip
    """Program ``pid`` of one array (k's where PLACES, which writes the cache): a block of
    tokens of one batch row, in a group of heads."""
    COMPUTE: tl.constexpr = tl.float64 if WIDE else tl.float32
    b, group, s, s_ok = _tile(pid, heads, trail, seq, BLOCK_S, HEADS)
    c, n = _turns(
        b, s, s_ok, index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, si_stream, si_row, si_seq, sc_row,
        sc_seq, PAIRS, PAIRS_P2, MODE, MULTI, INVERSE, SCALED, COMPUTE, SPLIT, MASK,
    )  # fmt: skip
    if PLACES == 1:  # RUN: an int offset's rows
        slot = place_start + s
    elif PLACES == 2:  # INDEX: the places given, on the device
        slot = tl.load(place_ptr + b * sp_row + s * sp_seq, mask=s_ok, other=-1).to(tl.int64)
    else:  # q's programs: no cache
        slot = s * 0 - 1
    write = s_ok & (slot >= 0) & (slot < capacity)
    slot = tl.where(write, slot, 0)
    if PAGED:
        outer = slot // page_size
        at = slot % page_size
    else:
        outer = b + 0 * slot
        at = slot
    cached = (outer * sck_outer + at * sck_row, outer * scv_outer + at * scv_row)
    if BLOCK_S == 1:  # one token (a decode step): the group's heads as one tile
        head = group * HEADS + tl.arange(0, HEADS)
        live = (head < heads * trail) & s_ok
        a = (head // trail).to(tl.int64)
        t = (head % trail).to(tl.int64)
        head = head.to(tl.int64)
        x_rows = x_ptr + (b * sxb + a * sxh + t * sxt + s * sxs)[:, None]
        out_rows = out_ptr + (b * sob + a * soh + t * sot + s * sos)[:, None]
        _prologue_rows(
            x_rows, out_rows, w_ptr + (tl.where(live, head, 0) * sw)[:, None], live, c, n, eps, offset,
            ck_ptr + (cached[0] + head * sck_head)[:, None], cv_ptr + (cached[1] + head * scv_head)[:, None],
            v_ptr + (b * svb + a * svh + t * svt + s * svs)[:, None], live & write, sck_dim, scv_dim,
            WIDTH, V_WIDTH, PAIRS, PAIRS_P2, TAIL_P2, V_P2, HALF, ROUNDING, SHIFTED, NARROW, BF16, COMPUTE,
            PLACES != 0, HEADS,
        )  # fmt: skip
    else:
        for h in range(HEADS):
            head = (group * HEADS + h).to(tl.int64)
            live = head < heads * trail
            a = head // trail
            t = head % trail
            rows_ok = s < tl.where(live, seq, 0)  # tokens of the sequence, none past the last head
            _prologue_rows(
                x_ptr + b * sxb + a * sxh + t * sxt + s[:, None] * sxs,
                out_ptr + b * sob + a * soh + t * sot + s[:, None] * sos, w_ptr + tl.where(live, head, 0) * sw, rows_ok, c, n,
                eps, offset, ck_ptr + (cached[0] + head * sck_head)[:, None],
                cv_ptr + (cached[1] + head * scv_head)[:, None], v_ptr + b * svb + a * svh + t * svt + s[:, None] * svs,
                rows_ok & write, sck_dim, scv_dim, WIDTH, V_WIDTH, PAIRS, PAIRS_P2, TAIL_P2, V_P2, HALF, ROUNDING,
                SHIFTED, NARROW, BF16, COMPUTE, PLACES != 0, BLOCK_S,
            )  # fmt: skip


@triton.jit
def _prologue_kernel(  # type: ignore[no-untyped-def]  # pragma: no cover
    q_ptr, q_out_ptr, wq_ptr, k_ptr, k_out_ptr, wk_ptr, v_ptr, ck_ptr, cv_ptr, place_ptr,
    index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, numbers_ptr,
    start, place_start, q_programs, page_size, capacity,
    heads, trail, seq, sqb, sqh, sqs, sqt, sob, soh, sos, sot, swq,
    k_heads, k_trail, skb, skh, sks, skt, skob, skoh, skos, skot, swk, svb, svh, svs, svt,
    sck_outer, sck_row, sck_head, sck_dim, scv_outer, scv_row, scv_head, scv_dim, sp_row, sp_seq,
    si_stream, si_row, si_seq, sc_row, sc_seq,
    WIDTH: tl.constexpr, V_WIDTH: tl.constexpr, PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr,
    TAIL_P2: tl.constexpr, V_P2: tl.constexpr, MODE: tl.constexpr, MULTI: tl.constexpr, HALF: tl.constexpr,
    INVERSE: tl.constexpr, SCALED: tl.constexpr, WIDE: tl.constexpr, BF16: tl.constexpr, NARROW: tl.constexpr,
    SPLIT: tl.constexpr, MASK: tl.constexpr, ROUNDING: tl.constexpr, SHIFTED: tl.constexpr,
    PLACES: tl.constexpr, PAGED: tl.constexpr, BLOCK_S: tl.constexpr, HEADS: tl.constexpr,
):  # fmt: skip
    """q's programs, then k's (which write the cache). ``numbers_ptr``: the norm's eps and
    weight offset in the compute dtype (a Python float argument would be float32)."""
    pid = tl.program_id(0)
    eps = tl.load(numbers_ptr)
    offset = tl.load(numbers_ptr + 1)
    if pid < q_programs:
        _prologue_block(
            pid, q_ptr, q_out_ptr, wq_ptr, swq, heads, trail, seq, sqb, sqh, sqs, sqt, sob, soh, sos, sot,
            v_ptr, svb, svh, svs, svt, ck_ptr, cv_ptr, sck_outer, sck_row, sck_head, sck_dim,
            scv_outer, scv_row, scv_head, scv_dim, place_ptr, place_start, sp_row, sp_seq, page_size, capacity,
            index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, si_stream, si_row, si_seq, sc_row, sc_seq,
            eps, offset, WIDTH, V_WIDTH, PAIRS, PAIRS_P2, TAIL_P2, V_P2, MODE, MULTI, HALF, INVERSE, SCALED, WIDE,
            BF16, NARROW, SPLIT, MASK, ROUNDING, SHIFTED, 0, PAGED, BLOCK_S, HEADS,
        )  # fmt: skip
    else:
        _prologue_block(
            pid - q_programs, k_ptr, k_out_ptr, wk_ptr, swk, k_heads, k_trail, seq, skb, skh, sks, skt,
            skob, skoh, skos, skot, v_ptr, svb, svh, svs, svt, ck_ptr, cv_ptr, sck_outer, sck_row, sck_head,
            sck_dim, scv_outer, scv_row, scv_head, scv_dim, place_ptr, place_start, sp_row, sp_seq, page_size,
            capacity, index_ptr, steps_ptr, streams_ptr, cos_ptr, sin_ptr, start, si_stream, si_row, si_seq,
            sc_row, sc_seq, eps, offset, WIDTH, V_WIDTH, PAIRS, PAIRS_P2, TAIL_P2, V_P2, MODE, MULTI, HALF,
            INVERSE, SCALED, WIDE, BF16, NARROW, SPLIT, MASK, ROUNDING, SHIFTED, PLACES, PAGED, BLOCK_S, HEADS,
        )  # fmt: skip


class _Views(NamedTuple):
    """What a prologue call's arrays' shapes and strides fix of its launch: which of q, k and v
    the kernel reads through a contiguous copy (strides that make no five-axis view of them);
    q's heads, trail, length and strides with its output's, k's alike but for its length, v's
    strides, and the cache's page size, capacity and strides along the kernel's axes."""

    q_copied: bool
    k_copied: bool
    v_copied: bool
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    stores: tuple[int, ...]


def tiles(seq: int, heads: int, features: int) -> tuple[int, int, int]:
    """A launch's block of tokens, group of heads and warps, for ``seq`` tokens, the most heads
    (times trail) of q and k, and a row's tile of ``features`` (the pairs' and the rest's, each
    padded to a power of two). A thread holds at most 8 features of a block's tile (16 of a decode
    step's tile of heads): past that ptxas spilled registers for sm_90 (tests/triton_aot.py)."""
    if seq == 1:  # a decode step: the group's heads as one tile
        group = min(8, triton.next_power_of_2(heads))
        return 1, group, min(8, max(1, group * features // (32 * 16)))
    warps = 8
    most = max(1, warps * 32 * 8 // features)  # tokens a block's tile may hold
    return min(triton.next_power_of_2(seq), 1 << (most.bit_length() - 1)), min(8, heads), warps


def prepare(job: PrologueJob) -> PrologueLaunch:
    """The launch of one kind of prologue call: what its signature fixes worked out here once
    (what its arrays' strides fix, by the first call with them); a call allocates its outputs,
    reads its angles and places, and launches once."""
    axis, compute, head_dim = job.seq_axis, job.compute, job.head_dim
    paged = bool(job.cache and job.cache.startswith("paged"))
    axes = KERNEL_AXES[job.cache] if job.cache else None
    v_width = job.shapes[2][-1] if job.shapes[2] else 1
    five = [five_axes(shape, axis) for shape in job.shapes[:2]]  # q's and k's
    heads = max(shape[1] * shape[3] for shape in five)
    fixed = {  # what the job fixes of the launch
        "WIDTH": head_dim, "V_WIDTH": v_width, "V_P2": triton.next_power_of_2(v_width),
        "HALF": job.layout == "half", "INVERSE": job.inverse, "WIDE": job.dtype == "float64",
        "BF16": job.dtype == "bfloat16", "NARROW": job.dtype in ("float16", "bfloat16"),
        "SPLIT": SPLIT_BITS, "MASK": (1 << SPLIT_BITS) - 1, "ROUNDING": ROUNDING_CODES[job.rounding],
        "PAGED": paged, "enable_fp_fusion": False,
    }  # fmt: skip
    numbers: dict[tuple[float, float, torch.device], torch.Tensor] = {}

    @functools.cache
    def shaped(pairs: int) -> tuple[dict[str, Any], list[int]]:
        """The launch's constants that the rotated pairs fix too (the RoPE's, the same every
        call of the job), and each array's programs."""
        pairs_p2, tail = triton.next_power_of_2(pairs), head_dim - 2 * pairs
        tail_p2 = triton.next_power_of_2(tail) if tail else 0
        block_s, group, warps = tiles(five[0][2], heads, 2 * pairs_p2 + tail_p2)
        programs = [b * triton.cdiv(h * t, group) * triton.cdiv(s, block_s) for b, h, s, t, _ in five]
        known = {"PAIRS": pairs, "PAIRS_P2": pairs_p2, "TAIL_P2": tail_p2, "BLOCK_S": block_s, "HEADS": group}
        return fixed | known | {"num_warps": warps}, programs

    def constants(norm: Any, like: torch.Tensor) -> torch.Tensor:
        """The norm's eps and offset as a tensor on x's device, made once per pair of values and
        device (the first call copies them there: warm a call before capturing it in a CUDA graph)."""
        key = (0.0, 0.0, like.device) if norm is None else (float(norm.eps), float(norm.offset), like.device)
        found = numbers.get(key)
        if found is None:
            found = numbers[key] = torch.tensor(key[:2], dtype=compute, device=like.device)
        return found

    def weights(weight: Any, like: torch.Tensor) -> tuple[torch.Tensor, int]:
        if weight is None:
            return like, 0
        rows = weight.reshape(-1, head_dim) if weight.ndim == 2 else weight.reshape(1, head_dim)
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        return rows, rows.stride(0) if rows.shape[0] > 1 else 0

    def views(q: Any, k: Any, v: Any, cache: Any, out_q: Any, out_k: Any) -> _Views:
        """What the arrays' shapes and strides fix of a launch (worked out by the first call with
        them): which of q, k and v are read through a contiguous copy, and the integers their
        five-axis views and the cache's kernel axes give."""
        arrays = (q, k, k if v is None else v)  # k stands in for v where nothing is written
        (q5, q_copied), (k5, k_copied), (v5, v_copied) = (_five_of(x, axis) for x in arrays)
        oq5, ok5 = _five(out_q, axis), _five(out_k, axis)  # 4-D: one more axis of 1, always a view
        assert oq5 is not None and ok5 is not None  # noqa: PT018 - both outputs, one fact
        if cache is None:
            stores: tuple[int, ...] = (1, 0, *(0,) * 8)  # page size, capacity, the cache's strides
        else:
            ck, cv = cache.k.permute(axes), cache.v.permute(axes)
            stores = (ck.shape[1] if paged else 1, cache.places, *ck.stride(), *cv.stride())
        return _Views(
            q_copied, k_copied, v_copied,
            (q5.shape[1], q5.shape[3], q5.shape[2], *q5.stride()[:4], *oq5.stride()[:4]),
            (k5.shape[1], k5.shape[3], *k5.stride()[:4], *ok5.stride()[:4]),
            tuple(v5.stride()[:4]), stores,
        )  # fmt: skip

    kept: Memo[_Views] = Memo(64)  # one entry per signature that shares the job's shapes

    def launch(
        q: Any, k: Any, v: Any, norm: Any, cache: Any, where: Any, host: Any, source: Any
    ) -> tuple[Any, Any]:
        fused = source.kernel_angles(compute)
        angles = _angles(job, fused)
        v = None if cache is None else v  # read only to be written
        # dense outputs whatever q's and k's strides: the kernel writes rows of contiguous features
        out_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        out_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        options, programs = shaped(fused.pairs)
        if not sum(programs):
            return out_q, out_k
        # The job fixes q's and k's shapes (and so the outputs' strides); the rest keys the views.
        key: Any = (q.stride(), k.stride())
        if v is not None:
            key += (v.shape, v.stride())
        if cache is not None:
            key += (cache.k.shape, cache.k.stride(), cache.v.shape, cache.v.stride())
        found = kept.find(key)
        if found is None:
            found = kept.keep(key, views(q, k, v, cache, out_q, out_k))
        # the arrays themselves, or their copies: the kernel reads pointers, the strides are found's
        q = q.contiguous() if found.q_copied else q
        k = k.contiguous() if found.k_copied else k
        v = k if v is None else v.contiguous() if found.v_copied else v
        pointers, si, sc = angle_arguments(angles, q)
        wq, swq = weights(None if norm is None else norm.q_weight, q)
        wk, swk = weights(None if norm is None else norm.k_weight, k)
        places, place_start, sp, mode = q, 0, (0, 0), NO_PLACES
        ck, cv = (k, k) if cache is None else (cache.k, cache.v)
        if cache is not None and where is None:  # an int offset's rows, known on the host
            mode, place_start = RUN, int(host[0, 0]) if host.size else 0
        elif cache is not None:
            mode, places = INDEX, where
            sp = (where.stride(0) if where.shape[0] > 1 else 0, where.stride(1))
        with _one_launch_at_a_time:
            _prologue_kernel[(sum(programs),)](
                q, out_q, wq, k, out_k, wk, v, ck, cv, places, *pointers, constants(norm, q),
                angles.start, place_start, programs[0], found.stores[0], found.stores[1], *found.q, swq,
                *found.k, swk, *found.v, *found.stores[2:], *sp, *si, *sc, MODE=angles.mode,
                MULTI=angles.streams is not None, SCALED=fused.scaled, SHIFTED=norm is not None and norm.offset != 0,
                PLACES=mode, **options,
            )  # fmt: skip
        return out_q, out_k

    return launch
