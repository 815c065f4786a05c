"""The KV cache the attention prologue writes k and v into: contiguous per batch row, or paged.

Each token's k and v go to one place: its row (contiguous caches, by default the token's
position) or its flat slot (paged caches: ``page * page_size + offset``), a negative one
meaning "skip" (padding). The write is one scatter per cache, indexed by three broadcast
integer arrays (batch row or page, head, row or offset) so that every library takes it alike:
NumPy, CuPy, PyTorch and MLX write in place, JAX returns new arrays. Skipped tokens are written
too, where no value reads can tell them apart on the host: each is sent to the place of the
call's first written token with that token's values (or, if none is written, to the first
place with the values already there), so the scatter holds only identical duplicates.
"""

from __future__ import annotations

import numbers
from typing import Any

from ._args import shown
from ._compat import (
    check_same_device,
    check_writeable,
    device_of,
    environment,
    host_array,
    is_traced,
    library_name,
    namespace_and_library,
)
from ._dtypes import isdtype

__all__ = ["KERNEL_AXES", "LAYOUTS", "KVCache", "write"]

#: The cache layouts: (batch, heads, rows, dim), (batch, rows, heads, dim), and paged ones,
#: (pages, page_size, heads, dim) and (pages, heads, page_size, dim), addressed by a flat slot.
LAYOUTS = ("bhsd", "bshd", "paged_nhd", "paged_hnd")
_HEAD_AXIS = {"bhsd": 1, "bshd": 2, "paged_nhd": 2, "paged_hnd": 1}
#: Each layout's axes in the order the fused kernels index a cache: (batch row or page, row or
#: offset, head, dim).
KERNEL_AXES = {
    "bhsd": (0, 2, 1, 3),
    "bshd": (0, 1, 2, 3),
    "paged_nhd": (0, 1, 2, 3),
    "paged_hnd": (0, 2, 1, 3),
}
_WRITERS = ("numpy", "cupy", "torch", "mlx", "jax.numpy")  # the libraries that write by index


class KVCache:
    """The key and value caches of one attention layer, which :func:`anyrope.prologue` writes
    each token's rotated k and its v into.

    Parameters
    ----------
    k, v : array
        The caches, of one library, in k's and v's dtypes (v's last axis may differ from k's);
        strided views are written in place where the library writes in place.
    layout : {"bhsd", "bshd", "paged_nhd", "paged_hnd"}
        ``(batch, heads, rows, dim)`` and ``(batch, rows, heads, dim)``: a token of batch row
        b goes to row r of b (by default its position); ``(pages, page_size, heads, dim)`` and
        ``(pages, heads, page_size, dim)``: a token goes to its flat slot
        ``page * page_size + offset`` (``cache_index``).

    Notes
    -----
    A negative place, given or a position, skips its token (padding). Places past the cache are
    refused, with nothing written, where their values are on the host (NumPy, CPU tensors
    outside a compiler); elsewhere (GPUs, JAX, MLX, a compiler's trace) nothing reads them
    there, and such a place skips its token as a negative one does.
    """

    def __init__(self, k: Any, v: Any, *, layout: str = "bhsd") -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout={shown(layout)} must be one of {', '.join(map(repr, LAYOUTS))}")
        xp, library = namespace_and_library(("cache.k", k), ("cache.v", v))
        if library not in _WRITERS:
            raise TypeError(
                f"a KVCache is written by index, which {library} arrays do not take (the array API "
                f"standard leaves index assignment out); use {', '.join(_WRITERS[:-1])} or JAX arrays"
            )
        for arg, cache in (("k", k), ("v", v)):
            if len(cache.shape) != 4:
                raise ValueError(
                    f"the cache's {arg} must have 4 axes ({_axes(layout)}), not shape {tuple(cache.shape)}"
                )
        if tuple(k.shape[:3]) != tuple(v.shape[:3]):
            raise ValueError(
                f"the cache's k has shape {tuple(k.shape)} and v {tuple(v.shape)}: they must agree but "
                "for their last axis"
            )
        check_same_device(xp, device_of(xp, k), "cache.k", **{"cache.v": v})
        self.k, self.v, self.layout = k, v, layout

    def __repr__(self) -> str:
        return f"KVCache(k {tuple(self.k.shape)}, v {tuple(self.v.shape)}, layout={self.layout!r})"

    @property
    def paged(self) -> bool:
        return self.layout.startswith("paged")

    @property
    def heads(self) -> int:
        return int(self.k.shape[_HEAD_AXIS[self.layout]])

    @property
    def places(self) -> int:
        """Rows per batch row (contiguous), or slots (paged)."""
        shape = self.k.shape
        if self.layout == "bhsd":
            return int(shape[2])
        if self.layout == "bshd":
            return int(shape[1])
        return int(shape[0]) * int(shape[1 if self.layout == "paged_nhd" else 2])


def _axes(layout: str) -> str:
    return {
        "bhsd": "batch, heads, rows, dim", "bshd": "batch, rows, heads, dim",
        "paged_nhd": "pages, page_size, heads, dim", "paged_hnd": "pages, heads, page_size, dim",
    }[layout]  # fmt: skip


def check(cache: KVCache, k: Any, v: Any, seq_axis: int) -> Any:
    """The cache takes this call's k and v: one library, device and dtypes, k's heads and dims,
    contiguous caches k's batch; before anything is computed. Their namespace."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be an anyrope.KVCache or None, not {type(cache).__name__}")
    if k is None or v is None:
        raise ValueError("cache= writes k and v: pass both")
    xp, _ = namespace_and_library(("k", k), ("v", v), ("cache.k", cache.k), ("cache.v", cache.v))
    check_same_device(xp, device_of(xp, k), "k", **{"cache.k": cache.k, "cache.v": cache.v})
    if len(k.shape) != 4 or seq_axis not in (-2, -3):
        raise ValueError(
            f"cache= takes k and v as (batch, heads, seq, head_dim) with seq_axis=-2 or (batch, seq, "
            f"heads, head_dim) with seq_axis=-3, not k of shape {tuple(k.shape)} with seq_axis={seq_axis}"
        )
    heads = k.shape[1 if seq_axis == -2 else 2]
    for arg, x, stored in (("k", k, cache.k), ("v", v, cache.v)):
        if stored.dtype != x.dtype:
            raise TypeError(
                f"the cache's {arg} is {stored.dtype} but {arg} is {x.dtype}: pass a cache of {arg}'s dtype"
            )
        if stored.shape[-1] != x.shape[-1] or cache.heads != heads:
            raise ValueError(
                f"the cache's {arg} of shape {tuple(stored.shape)} ({_axes(cache.layout)}) cannot hold {arg} "
                f"of shape {tuple(x.shape)}: {heads} heads of {x.shape[-1]} features"
            )
    if not cache.paged and cache.k.shape[0] != k.shape[0]:
        raise ValueError(
            f"the cache's batch of {cache.k.shape[0]} rows differs from k's {k.shape[0]}: a contiguous "
            "cache holds one row of its batch per row of k"
        )
    _check_writes(cache, xp)
    return xp


def _check_writes(cache: KVCache, xp: Any) -> None:
    """The cache's arrays may be written in place, both checked before either is written: not
    read-only, no stride-0 views, no torch leaf that requires grad (autograd refuses to write
    one, and would write k's before refusing v's)."""
    if library_name(xp) in _RETURNED:
        return
    traced = is_traced(xp, cache.k, cache.v)
    for arg, stored in (("cache.k", cache.k), ("cache.v", cache.v)):
        check_writeable(xp, stored, arg, "the cache write", traced)
        if getattr(stored, "requires_grad", False) and stored.is_leaf:
            raise ValueError(
                f"{arg} is a leaf tensor that requires grad (a parameter), which torch does not write "
                f"in place: pass {arg}.detach() (a cache holds values)"
            )


def writes_form(cache: KVCache) -> tuple[Any, ...]:
    """What :func:`_check_writes` reads of the cache's arrays that their part of a call's
    signature (shapes, strides, requires_grad) leaves out: NumPy's read-only flag and torch's
    leaf flag. A kept plan's calls, which skip the checks, hold it in their key."""
    return tuple(
        (getattr(getattr(x, "flags", None), "writeable", None), getattr(x, "is_leaf", None))
        for x in (cache.k, cache.v)
    )


# The libraries whose cache writes make new arrays, one way or another (JAX's .at[].set, MLX's
# item assignment replaces an array's buffer): nothing of theirs is refused for being written.
_RETURNED = frozenset({"jax.numpy", "mlx"})


def places(
    cache: KVCache,
    xp: Any,
    k: Any,
    seq_axis: int,
    cache_index: Any,
    positions: Any,
    offset: Any,
    multi_axis: bool,
) -> tuple[Any, Any]:
    """Each token's place, shape (batch or 1, seq), a device array of k's library, from
    ``cache_index``, or for a contiguous cache by default the positions (``offset + arange(seq)``
    where only an offset is given); and its NumPy copy where the values are on the host (else
    None), checked there against the cache's size."""
    batch, seq = k.shape[0], k.shape[-2 if seq_axis == -2 else -3]
    device = device_of(xp, k)
    whole = False
    if cache_index is not None:
        found, arg = _integers(xp, k, cache_index, device, "cache_index"), "cache_index"
    elif cache.paged:
        raise ValueError("a paged cache needs cache_index: each token's flat slot, page * page_size + offset")
    elif multi_axis:
        raise ValueError(
            "a rope with several position streams (M-RoPE, axial) has no cache row per position: pass "
            "cache_index, each token's row"
        )
    elif positions is not None:
        found, arg = _integers(xp, k, positions, device, "positions"), "positions"
    else:
        whole = isinstance(offset, numbers.Integral)  # Python's and NumPy's ints
        start = int(offset) if whole else _integers(xp, k, offset, device, "offset")
        steps = xp.arange(seq, dtype=_index_dtype(xp, k, device), device=device)
        found = steps[None, :] + (start if whole else xp.reshape(start, (-1, 1)))
        arg = "offset"
    given = tuple(found.shape)  # as the caller gave it (an offset's: below, where it is wrong)
    if len(found.shape) == 1:
        found = found[None, :]
    if len(found.shape) != 2 or found.shape[-1] != seq or found.shape[0] not in (1, batch):
        if arg == "offset":
            given = tuple(_integers(xp, k, offset, device, arg).shape)
        raise ValueError(
            f"{arg} of shape {given} names no place per token: k has {batch} rows of {seq} "
            f"tokens, so give {'an int or (batch,)' if arg == 'offset' else '(seq,) or (batch, seq)'}"
        )
    if cache.paged and found.shape[0] != batch and batch != 1:
        raise ValueError(
            f"cache_index of shape {given} would send every row of k to the same slots: give (batch, seq)"
        )
    traced = is_traced(xp, found)
    host = host_array(xp, found, traced)
    if host is None and whole and not traced and library_name(xp) in _WRITTEN_IN_PLACE:
        host = _offset_rows(int(offset), seq)
    if host is not None and host.size:
        _check_reach(cache, int(host.max()), arg)
    return found, host


# The libraries whose caches are written in place: for them an int offset's rows, which are
# host values whatever device holds k, take the write that reads nothing of the cache (with a
# read in its graph, MLX cannot update the cache's buffer in place and copies all of it).
_WRITTEN_IN_PLACE = frozenset({"numpy", "torch", "mlx", "cupy"})


def _offset_rows(offset: int, seq: int) -> Any:
    import numpy as np  # host values: every library here reads NumPy's

    return np.arange(offset, offset + seq, dtype=np.int64)[None, :]


def kept_places(
    cache: KVCache, xp: Any, k: Any, seq_axis: int, cache_index: Any, positions: Any, offset: Any,
    multi_axis: bool,
) -> tuple[Any, Any]:  # fmt: skip
    """:func:`places` for a call whose arguments were checked but for their values (a kept
    plan's): where an int offset alone gives a contiguous cache's rows (every decode step's
    form), None and those rows, made and checked on the host without an array of k's library."""
    offset_alone = cache_index is None and positions is None and type(offset) is int
    if offset_alone and not cache.paged and not multi_axis:
        seq = k.shape[-2 if seq_axis == -2 else -3]
        if seq:
            _check_reach(cache, offset + seq - 1, "offset")
        return None, _offset_rows(offset, seq)
    return places(cache, xp, k, seq_axis, cache_index, positions, offset, multi_axis)


def _check_reach(cache: KVCache, last: int, arg: str) -> None:
    if last >= cache.places:
        where = "slots" if cache.paged else "rows"
        raise ValueError(
            f"{arg} reaches {last}, past the cache's {cache.places} {where} ({_axes(cache.layout)}); "
            "nothing was written"
        )


def _integers(xp: Any, k: Any, value: Any, device: Any, arg: str) -> Any:
    """``value`` as an integer array of k's library (Python ints and sequences made into one)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        namespace_and_library(("k", k), (arg, value))
        if not isdtype(xp, value.dtype, "integral"):
            raise TypeError(f"{arg} must hold integers, not {value.dtype}")
        return value
    return xp.asarray(value, dtype=_index_dtype(xp, k, device), device=device)


def _index_dtype(xp: Any, k: Any, device: Any) -> Any:
    """The widest integer dtype on k's device (int32 for JAX without x64), read from no memo
    while k is traced (dynamo before torch 2.13 cannot hash a device)."""
    return environment(xp, device, traced=is_traced(xp, k)).index


def write(cache: KVCache, xp: Any, k: Any, v: Any, seq_axis: int, where: Any, host: Any) -> KVCache:
    """k (rotated) and v written at each token's place (``where``, and ``host``, its host copy
    or None: see :func:`places`); the cache itself where the library writes in place, else
    (JAX) a new one."""
    start = None if host is None or cache.paged else _one_run(host)
    if start is not None:  # every batch row's tokens to rows start, start + 1, ...: a slice
        return _write_run(cache, xp, k, v, seq_axis, start)
    if seq_axis == -2:  # tokens first: (batch, seq, heads, dim)
        k, v = xp.permute_dims(k, (0, 2, 1, 3)), xp.permute_dims(v, (0, 2, 1, 3))
    batch, seq, heads = k.shape[0], k.shape[1], k.shape[2]
    tokens = batch * seq
    if tokens == 0:  # nothing to write (and no first token to send skipped ones to)
        return cache
    device = device_of(xp, k)
    dtype = _index_dtype(xp, k, device)
    rows = xp.reshape(xp.astype(xp.broadcast_to(where, (batch, seq)), dtype), (tokens,))
    owners = xp.arange(batch, dtype=dtype, device=device)[:, None]
    owner = xp.reshape(xp.broadcast_to(owners, (batch, seq)), (tokens,))
    tokens_k = xp.reshape(k, (tokens, heads, k.shape[3]))
    tokens_v = xp.reshape(v, (tokens, heads, v.shape[3]))
    if host is not None:  # the places read on the host: the written tokens alone, picked there
        import numpy as np  # the host copy is NumPy's

        kept = np.broadcast_to(host, (batch, seq)).reshape(-1) >= 0
        if not bool(kept.all()):
            picked = xp.asarray([int(i) for i in np.flatnonzero(kept)], dtype=dtype, device=device)
            rows, owner = xp.take(rows, picked), xp.take(owner, picked)
            tokens_k, tokens_v = xp.take(tokens_k, picked, axis=0), xp.take(tokens_v, picked, axis=0)
        at = _index(cache, xp, owner, rows, heads, dtype, device)
        cache.k[at] = tokens_k
        cache.v[at] = tokens_v
        return cache
    # skipped tokens (negative places, and places past the cache, which no host check saw: a
    # scatter would meet them as JAX drops them, torch asserts on the device, MLX writes out of
    # bounds) take the first written token's place and values
    written = (rows >= 0) & (rows < cache.places)
    first = xp.argmax(xp.astype(written, xp.int32))[None]
    anything = xp.any(written)
    rows = xp.where(written, rows, xp.where(anything, xp.take(rows, first), 0))
    owner = xp.where(written, owner, xp.where(anything, xp.take(owner, first), 0))
    at = _index(cache, xp, owner, rows, heads, dtype, device)
    kept = written[:, None, None]
    new_k = xp.where(kept, tokens_k, xp.where(anything, xp.take(tokens_k, first, axis=0), cache.k[at]))
    new_v = xp.where(kept, tokens_v, xp.where(anything, xp.take(tokens_v, first, axis=0), cache.v[at]))
    if library_name(xp) == "jax.numpy":
        return KVCache(cache.k.at[at].set(new_k), cache.v.at[at].set(new_v), layout=cache.layout)
    if library_name(xp) == "mlx":
        _evaluate_reads(at, new_k, new_v)
    cache.k[at] = new_k
    cache.v[at] = new_v
    return cache


def _evaluate_reads(*arrays: Any) -> None:
    """MLX writes a cache's buffer in place only where the scatter is the last to read it; the
    values written read it too (the old values of skipped tokens' places), so an eager write
    copies the whole cache (0.5 s a decode step with 4096 rows). Evaluated first, they leave the
    scatter its only reader. Under mx.compile MLX refuses the evaluation, and the compiled graph
    is its own."""
    import mlx.core as mx  # the arrays are MLX's

    try:
        mx.eval(*arrays)
    except ValueError as error:
        if "function transformations" not in str(error):
            raise


def _one_run(host: Any) -> int | None:
    """The first row where every batch row's tokens go to consecutive rows from one (not
    negative) start, as a decode step's or a prefill's offset sends them; else None."""
    import numpy as np  # the host copy is NumPy's

    if host.size == 0 or int(host[0, 0]) < 0:
        return None
    start = int(host[0, 0])
    same = np.arange(start, start + host.shape[1])
    return start if bool((host == same).all()) else None


def _write_run(cache: KVCache, xp: Any, k: Any, v: Any, seq_axis: int, start: int) -> KVCache:
    """k and v written to rows ``start, start + 1, ...`` of a contiguous cache by slicing (the
    cheapest write there is, in place on every library that writes in place)."""
    rows = slice(start, start + k.shape[-2 if seq_axis == -2 else -3])
    heads_first = cache.layout == "bhsd"
    if heads_first != (seq_axis == -2):  # k and v into the cache's order of heads and tokens
        k, v = xp.permute_dims(k, (0, 2, 1, 3)), xp.permute_dims(v, (0, 2, 1, 3))
    at = (slice(None), slice(None), rows) if heads_first else (slice(None), rows)
    cache.k[at] = k
    cache.v[at] = v
    return cache


def _index(
    cache: KVCache, xp: Any, owner: Any, rows: Any, heads: int, dtype: Any, device: Any
) -> tuple[Any, Any, Any]:
    """Three integer arrays broadcasting to (tokens, heads) that address every token's head in
    the cache (its last axis, the features, whole)."""
    head = xp.arange(heads, dtype=dtype, device=device)[None, :]
    if cache.paged:
        size = cache.k.shape[1 if cache.layout == "paged_nhd" else 2]
        page, at = (rows // size)[:, None], (rows % size)[:, None]
        return (page, at, head) if cache.layout == "paged_nhd" else (page, head, at)
    batch, at = owner[:, None], rows[:, None]
    return (batch, head, at) if cache.layout == "bhsd" else (batch, at, head)
