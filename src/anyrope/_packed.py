"""Positions of packed variable-length batches, whose sequences lie end to end along one token
axis with sequence ``i`` starting at ``cu_seqlens[i]``: flash-attn's ``cu_seqlens`` layout, and
flashinfer's ragged one (``apply_rope(q, k, indptr, offsets)``: ``indptr`` is ``cu_seqlens``).

The positions are formed on the device from shapes alone, so the function traces under
``torch.compile(fullgraph=True)``, ``jax.jit`` and ``mx.compile``; values are read on the host
only to check them, and only where they already live there.
"""

from __future__ import annotations

from typing import Any

from ._args import check_int
from ._compat import host_array, is_array, take_rows
from ._context import call_context
from ._dtypes import isdtype

__all__ = ["packed_positions"]


def packed_positions(cu_seqlens: Any, total: int, *, offsets: Any = None) -> Any:
    """The position of each token of a packed batch: ``t - cu_seqlens[i] + offsets[i]`` for token
    ``t`` of sequence ``i`` (``cu_seqlens[i] <= t < cu_seqlens[i + 1]``), 0 for padding.

    Parameters
    ----------
    cu_seqlens : array
        Cumulative sequence lengths, 1-d of integer dtype and shape ``(num_seqs + 1,)``: 0, then
        the end of each sequence (flash-attn's ``cu_seqlens``). Empty sequences are allowed. The
        values must start at 0, never decrease and end at most at ``total``; this is checked
        where they are on the host (NumPy arrays, CPU torch tensors outside tracing) and is the
        caller's promise elsewhere (other values give unspecified positions, never an error).
    total : int
        Tokens in the packed buffer (its sequence axis' length), at least ``cu_seqlens[-1]``.
    offsets : int or array, optional
        Where each sequence starts counting: one int or 0-d integer array for every sequence, or
        a ``(num_seqs,)`` integer array, one per sequence (chunked prefill, or decoding into a KV
        cache that already holds ``offsets[i]`` tokens of sequence ``i``). Default 0.

    Returns
    -------
    array
        Shape ``(total,)``, in ``cu_seqlens``' library and on its device, of the integer dtype
        positions are formed in (int64; int32 for JAX without x64). Feed it to
        ``RoPE(...)(q, k, positions=..., seq_axis=-3)`` for ``q`` of shape
        ``(total, heads, head_dim)``: the same angles as rotating each sequence on its own with
        ``offset=offsets[i]``.

    Notes
    -----
    **Padding.** Tokens at or past ``cu_seqlens[-1]`` (a buffer padded to a fixed size) get
    position 0, so RoPE leaves them unchanged whatever ``offsets`` say. flash-attn's
    ``apply_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen)`` launches one program per
    sequence and never touches those rows: with ``inplace=True`` they stay as they were (the same
    as position 0 here); out of place they hold whatever ``torch.empty_like`` left there.

    **Against flash-attn otherwise.** Its token ``t`` of sequence ``i`` reads row
    ``t - cu_seqlens[i] + seqlen_offsets[i]`` of the given ``cos``/``sin``: the same position as
    here, whose angles RoPE forms for any position. Where flash-attn's row lies past its table it
    loads cos 1 and sin 0 (no rotation), and tokens of a sequence longer than ``max_seqlen`` are
    never written; here neither limit exists. flash-attn takes ``seqlen_offsets`` as an int or a
    ``(batch,)`` int32/int64 tensor, like ``offsets`` (which may also be 0-d, and of any integer
    dtype). flashinfer's ``apply_rope(q, k, indptr, offsets)`` gives the same positions, with
    ``indptr`` for ``cu_seqlens`` and no padding (``indptr[-1]`` is the token count).

    **How.** The sequence of each token is found by ``searchsorted`` over the sequence ends
    (the 2023.12 standard's; NumPy, PyTorch, JAX, CuPy, array-api-strict and recent MLX have
    it), in ``O(total log num_seqs)`` work and ``O(total)`` memory. A namespace without it (an
    older MLX) counts the ends at or before each token instead, which holds a
    ``(total, num_seqs)`` boolean array at once.

    Examples
    --------
    >>> import numpy as np
    >>> from anyrope import packed_positions
    >>> cu_seqlens = np.array([0, 3, 3, 5])  # sequences of 3, 0 and 2 tokens
    >>> packed_positions(cu_seqlens, 7)  # two tokens of padding at the end
    array([0, 1, 2, 0, 1, 0, 0])
    >>> packed_positions(cu_seqlens, 5, offsets=np.array([10, 20, 30]))
    array([10, 11, 12, 30, 31])
    """
    array_offsets = offsets if is_array(offsets) else None
    ctx = call_context(("cu_seqlens", cu_seqlens), ("offsets", array_offsets), grad_of=())
    xp, env, device, traced = ctx.xp, ctx.env, ctx.device, ctx.traced
    _check_cu_seqlens(xp, cu_seqlens)
    num_seqs = cu_seqlens.shape[0] - 1
    total = _count(total, env.index_bits, traced)
    start = _offset(xp, offsets, num_seqs, total, env.index_bits, traced)
    known = host_array(xp, cu_seqlens, traced)
    if known is not None:
        _check_values(known, total)
    if array_offsets is not None:
        _check_offsets(host_array(xp, array_offsets, traced), total, env.index_bits)

    index = env.index
    bounds = cu_seqlens if cu_seqlens.dtype == index else xp.astype(cu_seqlens, index)
    tokens = xp.arange(total, dtype=index, device=device)
    sequence = _sequence_of(xp, bounds, tokens, index)  # in [0, num_seqs]; num_seqs: padding
    if array_offsets is not None:
        start = start if start.dtype == index else xp.astype(start, index)
    # One gather: each sequence's shift from token index to position, and a spare entry that
    # padding tokens read (their position is replaced below).
    shift = xp.concat([start - bounds[:-1], xp.zeros((1,), dtype=index, device=device)])
    positions = tokens + take_rows(xp, shift, sequence)
    return xp.where(sequence < num_seqs, positions, xp.zeros_like(positions))


def _check_cu_seqlens(xp: Any, cu_seqlens: Any) -> None:
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(
            f"cu_seqlens must be 1-d with num_seqs + 1 entries (0, then each sequence's end), got shape "
            f"{tuple(cu_seqlens.shape)}"
        )
    if not isdtype(xp, cu_seqlens.dtype, "integral"):
        raise TypeError(
            f"cu_seqlens must be an integer array, got dtype {cu_seqlens.dtype}; cast it to int32 or int64"
        )


def _count(total: Any, bits: int, traced: bool) -> Any:
    """``total`` checked. While dynamo traces, a size (``q.shape[0]``) is a symbolic int whose
    type reads as int: it is taken as it is, since comparing it would add guards on its value."""
    if traced and type(total) is int:
        return total
    total = check_int(total, "total", low=0, why=" (the packed buffer's length along its token axis)")
    if total >= 2 ** (bits - 1):
        raise ValueError(f"total={total} does not fit in {bits}-bit positions")
    return total


def _offset(xp: Any, offsets: Any, num_seqs: int, total: Any, bits: int, traced: bool) -> Any:
    """``offsets`` checked: a Python int (0 for None) or the integer array itself."""
    if offsets is None:
        return 0
    if is_array(offsets):
        if not isdtype(xp, offsets.dtype, "integral"):
            raise TypeError(f"offsets must be an integer array, got dtype {offsets.dtype}")
        if offsets.ndim > 1 or (offsets.ndim == 1 and offsets.shape[0] != num_seqs):
            raise ValueError(
                f"offsets of shape {tuple(offsets.shape)} do not fit {num_seqs} sequences (cu_seqlens has "
                f"{num_seqs + 1} entries): give one offset, or shape ({num_seqs},), one per sequence"
            )
        return offsets
    if type(offsets) is int:  # first: a symbolic int reads as one while dynamo traces
        offset = offsets
    elif isinstance(offsets, bool) or not hasattr(offsets, "__index__"):
        raise TypeError(
            f"offsets must be an int or an integer array (0-d, or one per sequence), not "
            f"{type(offsets).__name__}"
        )
    else:
        offset = check_int(offsets, "offsets")  # NumPy integers
    if traced:  # no comparison: it would add a guard on a symbolic value
        return offset
    bound, last = 2 ** (bits - 1), offset + max(total - 1, 0)
    if offset < -bound or last >= bound:
        raise ValueError(f"offsets={offset} does not fit in {bits}-bit positions over {total} tokens")
    return offset


def _check_values(known: Any, total: int) -> None:
    """Host-side checks of cu_seqlens' values (a NumPy view)."""
    if known[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {known[0]}")
    falling = (known[1:] < known[:-1]).nonzero()[0]
    if falling.size:
        i = int(falling[0])
        raise ValueError(
            f"cu_seqlens must not decrease (they are cumulative lengths), but cu_seqlens[{i}]={known[i]} > "
            f"cu_seqlens[{i + 1}]={known[i + 1]}"
        )
    if known[-1] > total:
        raise ValueError(
            f"cu_seqlens ends at {known[-1]}, past total={total}: the sequences hold {known[-1]} tokens, so "
            "total (the packed buffer's length) must be at least that"
        )


def _check_offsets(known: Any, total: int, bits: int) -> None:
    """Host-known offsets (a NumPy view, or None) must keep every position within the index dtype."""
    if known is None or not known.size or not total:
        return
    low, high = int(known.min()), int(known.max())
    bound = 2 ** (bits - 1)
    if low < -bound or high + total - 1 >= bound:
        raise ValueError(
            f"offsets from {low} to {high} put positions past the {bits}-bit integers they are formed in "
            f"over total={total} tokens (they would wrap around); give offsets below {bound - total + 1}"
        )


def _sequence_of(xp: Any, bounds: Any, tokens: Any, index: Any) -> Any:
    """Which sequence each token belongs to: how many sequence ends lie at or before it.

    Counted in all of ``bounds`` (0 first, which every token passes) and one taken off, not in
    the ends ``bounds[1:]``: inductor searched a sliced sequence from its buffer's start, off by
    one without a word (pytorch/pytorch#182343, seen with torch 2.11 on CUDA)."""
    searchsorted = getattr(xp, "searchsorted", None)
    if searchsorted is not None:
        found = searchsorted(bounds, tokens, side="right")
    else:  # (total, num_seqs + 1) booleans: only for namespaces without searchsorted
        found = xp.sum(xp.astype(tokens[:, None] >= bounds[None, :], index), axis=1)
    return (found if found.dtype == index else xp.astype(found, index)) - 1
