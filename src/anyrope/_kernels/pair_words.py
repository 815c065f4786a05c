"""Interleaved pairs under torch.compile, each pair read and written as one machine word.

Inductor's code for the generic rotation of interleaved pairs is a scalar loop: the two turned
halves are stored at stride 2, which its CPU vectoriser does not take (and in bfloat16 every
element is then rounded one at a time). Seen as integers, the pairs are contiguous words, and
both halves come out of a word with integer operations: a float32 pair is an int64 word, its
halves its low and high 32 bits; a bfloat16 pair is an int32 word, and a bfloat16 is the top
half of a float32, so widening is a shift and a mask, and rounding back to nearest even is c10's
own formula, ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``, with NaN as 0x7FC0. Every operation is
then elementwise on contiguous words, and inductor vectorises the loop: a decode step takes the
half-split layout's time. The arithmetic is the generic kernel's, in the same order, so the
result is the same bit for bit.

Eagerly torch runs each of these operations on its own, slower than the generic code: the kernel
declares ``eager=False``.
"""

from __future__ import annotations

import sys
from typing import Any

from .._job import NEW, Job, Launch
from .._pairs import broadcast_table

__all__ = ["prepare"]

_NAN = 0x7FC0  # the quiet NaN c10 rounds every NaN to
_LITTLE = sys.byteorder == "little"  # pair (a, b) has a in the low half of its word


def _bfloat16_halves(torch: Any, words: Any) -> tuple[Any, Any]:
    return (words << 16).view(torch.float32), (words & -65536).view(torch.float32)  # -65536: 0xFFFF0000


def _rounded(torch: Any, value: Any) -> Any:
    """float32 ``value`` rounded to nearest even bfloat16, in the low 16 bits of an int32."""
    bits = value.view(torch.int32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    return torch.where(value != value, _NAN, rounded)  # noqa: PLR0124 - NaN is unequal to itself


def _bfloat16_word(torch: Any, low: Any, high: Any) -> Any:
    return (_rounded(torch, low) & 0xFFFF) | (_rounded(torch, high) << 16)


def _float32_halves(torch: Any, words: Any) -> tuple[Any, Any]:
    return words.to(torch.int32).view(torch.float32), (words >> 32).to(torch.int32).view(torch.float32)


def _float32_word(torch: Any, low: Any, high: Any) -> Any:
    as_int64 = [half.view(torch.int32).to(torch.int64) for half in (low, high)]
    return (as_int64[0] & 0xFFFFFFFF) | (as_int64[1] << 32)


def prepare(job: Job) -> Launch:
    return lambda x, out, source: _run(job, x, out, source)


def _run(job: Job, x: Any, out: Any, source: Any) -> Any:
    import torch

    xp = job.ctx.xp
    word, halves, join = (
        (torch.int32, _bfloat16_halves, _bfloat16_word)
        if x.dtype == torch.bfloat16
        else (torch.int64, _float32_halves, _float32_word)
    )
    cos, sin = source.tables(job.seq, job.compute)
    cos = broadcast_table(xp, cos, x.ndim, job.seq_axis)
    sin = broadcast_table(xp, sin, x.ndim, job.seq_axis)
    rotary_dim = 2 * cos.shape[-1]
    part = x if rotary_dim == x.shape[-1] else x[..., :rotary_dim]
    low, high = halves(torch, part.contiguous().view(word))  # (..., pairs): a word per pair
    a, b = (low, high) if _LITTLE else (high, low)
    if job.inverse:
        new_a, new_b = a * cos + b * sin, b * cos - a * sin
    else:
        new_a, new_b = a * cos - b * sin, b * cos + a * sin
    turned = (join(torch, new_a, new_b) if _LITTLE else join(torch, new_b, new_a)).view(x.dtype)
    result = turned if rotary_dim == x.shape[-1] else torch.cat([turned, x[..., rotary_dim:]], dim=-1)
    if job.writes == NEW:
        return result
    out[...] = result  # in place: the result is complete before anything is written
    return out
