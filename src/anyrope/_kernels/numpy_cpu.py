"""NumPy without numba: the best pure-NumPy form per layout, each one pass over memory.

"interleaved" is one complex multiply on a complex view of x (pairs are adjacent floats, i.e.
complex numbers); "half" runs the six elementwise steps in cache-sized blocks with preallocated
outputs, so x is read from memory about once.

A plan's launch does only value work: what the signature fixes (x's five-axis view, the blocks,
whether the destination is x) is worked out on its first call and kept; each call gathers its
rows of the cached prefix table once for q and k, and every other step is a NumPy builtin.
"""

from __future__ import annotations

from typing import Any

from .._job import IN_PLACE, INTO, Job, Launch, PairLaunch, offers, turn_alike
from .._pairs import five_axes

__all__ = ["prepare_blocked", "prepare_complex", "prepare_pair_blocked", "prepare_pair_complex"]

_BLOCK_BYTES = 1 << 18  # blocks of about 256 KiB stay in L2 through the six steps


def prepare_complex(job: Job) -> Launch:
    fetch, turn = _phase_of(job), _complex(job)
    return lambda x, out, source: turn(x, out, fetch(source))


def prepare_blocked(job: Job) -> Launch:
    fetch, turn = _cos_sin_of(job), _blocked(job)
    return lambda x, out, source: turn(x, out, *fetch(source))


def prepare_pair_complex(q: Job, k: Job) -> PairLaunch | None:
    """q and k from one gathered phase table, where they turn alike over one length."""
    if q.seq != k.seq or not turn_alike(q, k):
        return None
    fetch, turn_q, turn_k = _phase_of(q), _complex(q), _complex(k)

    def launch(x: Any, y: Any, out_x: Any, out_y: Any, source: Any, _: Any) -> tuple[Any, Any]:
        phase = fetch(source)
        return turn_q(x, out_x, phase), turn_k(y, out_y, phase)

    return launch


def prepare_pair_blocked(q: Job, k: Job) -> PairLaunch | None:
    """q and k from one gathered pair of tables, where they turn alike over one length."""
    if q.seq != k.seq or not turn_alike(q, k):
        return None
    fetch, turn_q, turn_k = _cos_sin_of(q), _blocked(q), _blocked(k)

    def launch(x: Any, y: Any, out_x: Any, out_y: Any, source: Any, _: Any) -> tuple[Any, Any]:
        cos, sin = fetch(source)
        return turn_q(x, out_x, cos, sin), turn_k(y, out_y, cos, sin)

    return launch


def _cos_sin_of(job: Job) -> Any:
    """``fetch(source)``: C-contiguous (rows, seq, pairs) cos and sin in x's dtype (declared:
    float32 or float64 x): the cached prefix table's rows at host-known positions inside it,
    gathered (one copy, never the cached table itself), else the source's own tables."""
    import numpy as np

    seq, compute, lookup = job.seq, job.compute, offers(job, "lookup")

    def fetch(source: Any) -> tuple[Any, Any]:
        found = source.lookup(seq, compute) if lookup else None
        if found is not None:
            table, rows = found  # cos and sin side by side: [c0, s0, c1, s1, ...]
            return table[rows, 0::2], table[rows, 1::2]
        cos, sin = source.tables(seq, compute)
        if cos.ndim == 2:
            cos, sin = cos[None], sin[None]
        return np.ascontiguousarray(cos), np.ascontiguousarray(sin)

    return fetch


def _phase_of(job: Job) -> Any:
    """``fetch(source)``: the (rows, seq, pairs) complex phases cos + i sin (their conjugates for
    an inverse turn), from the same rows as :func:`_cos_sin_of`."""
    import numpy as np

    seq, compute, lookup, inverse = job.seq, job.compute, offers(job, "lookup"), job.inverse
    ctype = np.complex64 if np.dtype(compute) == np.float32 else np.complex128

    def fetch(source: Any) -> Any:
        found = source.lookup(seq, compute) if lookup else None
        if found is not None:
            table, rows = found
            phase = table[rows].view(ctype)  # side-by-side (cos, sin) pairs are complex numbers
        else:
            cos, sin = source.tables(seq, compute)
            phase = np.empty(cos.shape, dtype=ctype)
            phase.real, phase.imag = cos, sin
            if phase.ndim == 2:
                phase = phase[None]
        if inverse:
            np.conjugate(phase, out=phase)  # a gathered or new array, never the cached table
        return phase

    return fetch


def _five_axes_of(job: Job) -> Any:
    """``axes(rows)``: the job's (batch, lead, seq, trail, head_dim) view shape with tables of
    ``rows`` rows; the signature fixes it, so it is worked out once per row count."""
    shapes: dict[int, tuple[int, int, int, int, int]] = {}

    def axes(rows: int) -> tuple[int, int, int, int, int]:
        found = shapes.get(rows)
        if found is None:
            found = shapes[rows] = five_axes(job.shape, job.seq_axis, batched=rows > 1)
        return found

    return axes


def _complex(job: Job) -> Any:
    """``turn(x, out, phase)``: x times its phases into ``out`` (None: a new array)."""
    import numpy as np

    shape, separate, axes = job.shape, job.writes != IN_PLACE, _five_axes_of(job)

    def turn(x: Any, out: Any, phase: Any) -> Any:
        result = np.empty(shape, dtype=x.dtype) if out is None else out
        shape5 = axes(phase.shape[0])
        source, target = np.ascontiguousarray(x).reshape(shape5), result.reshape(shape5)
        ctype, pairs = phase.dtype, phase.shape[-1]
        np.multiply(
            source.view(ctype)[..., :pairs],
            phase[:, None, :, None, :],
            out=target.view(ctype)[..., :pairs],
        )
        if separate and 2 * pairs < shape5[-1]:
            target[..., 2 * pairs :] = source[..., 2 * pairs :]
        return result

    return turn


def _blocked(job: Job) -> Any:
    """``turn(x, out, cos, sin)``: the half layout's rotation into ``out`` (None: a new array),
    in blocks; in place, each block's first half is kept aside before it is overwritten."""
    import numpy as np

    shape, inverse, writes, axes = job.shape, job.inverse, job.writes, _five_axes_of(job)
    first_step, second_step = (np.add, np.subtract) if inverse else (np.subtract, np.add)
    plans: dict[tuple[int, int, int], tuple[tuple[int, int], list[tuple[Any, ...]]]] = {}

    def blocks(rows: int, pairs: int, itemsize: int) -> tuple[tuple[int, int], list[tuple[Any, ...]]]:
        """The largest block's (leads, tokens) and each block's indices: (x's first half, second
        half, the rest, the tables' rows, the block's (leads, tokens)), kept per table shape.
        A block is some tokens of one lead, or, where a whole sequence fits, several leads'."""
        batch, lead, seq, trail, width = axes(rows)
        per_token = max(1, trail * width * itemsize)
        step = max(1, min(seq, _BLOCK_BYTES // per_token))
        leads = max(1, min(lead, _BLOCK_BYTES // (per_token * max(1, seq)))) if step == seq else 1
        found = []
        for b in range(batch):
            for a in range(0, lead, leads):
                group = slice(a, min(lead, a + leads))
                for start in range(0, seq, step):
                    tokens = slice(start, min(seq, start + step))
                    found.append((
                        (b, group, tokens, slice(None), slice(0, pairs)),
                        (b, group, tokens, slice(None), slice(pairs, 2 * pairs)),
                        (b, group, tokens, slice(None), slice(2 * pairs, None)),
                        (b if rows > 1 else 0, None, tokens, None, slice(None)),
                        (group.stop - a, tokens.stop - start),
                    ))  # fmt: skip
        made = plans[rows, pairs, itemsize] = ((leads, step), found)
        return made

    def turn(x: Any, out: Any, cos: Any, sin: Any) -> Any:
        result = np.empty(shape, dtype=x.dtype) if out is None else out
        rows, pairs = cos.shape[0], cos.shape[-1]
        found = plans.get((rows, pairs, x.itemsize))
        (leads, step), each = blocks(rows, pairs, x.itemsize) if found is None else found
        shape5 = axes(rows)
        x5, out5 = np.ascontiguousarray(x).reshape(shape5), result.reshape(shape5)
        tmp = np.empty((leads, step, shape5[3], pairs), dtype=x.dtype)
        # out= may be a view of x (apply's out=x[...]): told apart like x itself
        separate = writes != IN_PLACE and (writes != INTO or not np.shares_memory(x, result))
        keep = None if separate else np.empty(tmp.shape, dtype=x.dtype)
        rest = separate and 2 * pairs < shape5[-1]
        for first_at, second_at, rest_at, table_at, (m, n) in each:
            c, s, t = cos[table_at], sin[table_at], tmp[:m, :n]
            first, second = x5[first_at], x5[second_at]
            new_first, new_second = out5[first_at], out5[second_at]
            if keep is not None:
                kept = keep[:m, :n]
                kept[...] = first
                first = kept
            np.multiply(first, c, out=new_first)
            np.multiply(second, s, out=t)
            first_step(new_first, t, out=new_first)
            np.multiply(first, s, out=t)
            np.multiply(second, c, out=new_second)
            second_step(new_second, t, out=new_second)
            if rest:
                out5[rest_at] = x5[rest_at]
        return result

    return turn
