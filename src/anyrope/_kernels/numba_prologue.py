"""The fused prologue for NumPy arrays and CPU tensors: QK-norm, RoPE and the KV-cache write in
one numba call (:mod:`._jit_prologue`).

:func:`prepare` works out once per :class:`anyrope._fusion.PrologueJob` what the call's
signature fixes (the compiled kernel, the five-axis shapes, how each array is seen as NumPy's,
the cache's axes); a call then only views its arrays, reads its table rows and launches. The
angles are the rotation kernel's (:mod:`.numba_cpu`): the cached prefix table's rows where the
positions are host-known and inside it, else the call's own tables side by side.
"""

from __future__ import annotations

import functools
from typing import Any

from .._fusion import ROUNDING_CODES, PrologueJob, PrologueLaunch
from .._kvcache import KERNEL_AXES
from .._pairs import five_axes
from .._qknorm import QKNorm
from . import _numba
from ._numba_run import STORAGE, host_view, rows_of

__all__ = ["LONGEST_HEAD", "prepare", "refuses"]

#: The most features a head may have where the kernel normalises it: its sum of squares is
#: NumPy's pairwise summation unrolled three levels deep (``_jit_prologue.LONGEST``).
LONGEST_HEAD = 1024


def refuses(job: PrologueJob) -> str | None:
    """Why the kernel's norm would not equal the library's own here, or None: its sum of squares
    is probed against the library's (see :func:`sum_order`)."""
    if sum_order(job.library, job.head_dim, _name(job.compute)) is not None:
        return None
    return f"norms of {job.head_dim} features, whose squares {job.library} sums here in an order the kernel does not know"


# The orders the kernel sums squares in: NumPy's pairwise (0), or torch's over vectors of so many lanes.
_ORDERS = {"numpy": (0,), "torch": (8, 16, 4, 0)}


@functools.lru_cache(maxsize=64)
def sum_order(library: str, head_dim: int, compute: str) -> int | None:
    """The order, of those the kernel knows, in which the library sums a head's squares on this
    machine (its SIMD width decides torch's), found by probing: the kernel's normalised rows equal
    to the generic :class:`anyrope.QKNorm`'s bit for bit, on rows of random values; None if none
    is. Found once per library, head size and compute dtype."""
    import numpy as np

    from . import _jit, _jit_prologue

    probe = np.random.default_rng(0).standard_normal((256, head_dim)).astype(compute) * 3
    eps = 1e-6
    if library == "torch":
        import torch

        ones: Any = torch.ones(head_dim, dtype=getattr(torch, compute))
        given: Any = torch.from_numpy(probe)
    else:
        ones, given = np.ones(head_dim, dtype=compute), probe
    want = QKNorm(ones, ones, eps=eps, rounding="after_weight").q(given[:, None, :], seq_axis=-2)
    want = np.asarray(want[:, 0, :] if library == "numpy" else want[:, 0, :].numpy())
    at = np.array(_jit_prologue.leaves(min(head_dim, LONGEST_HEAD)), dtype=np.int64)
    for lanes in _ORDERS.get(library, ()):
        if lanes == 0 and head_dim > LONGEST_HEAD:
            continue
        r = _jit_prologue.inverse_rms(probe, at, lanes, eps, library == "numpy", _jit.FLOAT).astype(compute)
        if np.array_equal(probe * r[:, None], want):
            return lanes
    return None


def prepare(job: PrologueJob) -> PrologueLaunch:
    import numpy as np

    from . import _jit_prologue

    kind = STORAGE.get(job.dtype, "float")
    bits = kind != "float"
    numpy = job.library == "numpy"
    kernel = _numba.prologue_kernel(job.layout, kind, ROUNDING_CODES[job.rounding])
    wide = "64" in str(job.compute)
    sign = (np.float64 if wide else np.float32)(-1.0 if job.inverse else 1.0)
    host_dtype = np.int16 if bits else np.float64 if job.dtype == "float64" else np.float32
    q_shape, k_shape, _ = job.shapes
    forms = [five_axes(shape, job.seq_axis) for shape in job.shapes if shape]
    batch, seq = forms[1][0], forms[1][2]
    axes, paged = (KERNEL_AXES[job.cache], job.cache.startswith("paged")) if job.cache else ((), False)
    count, wide_mean = float(job.head_dim), numpy  # np.mean divides in float64 (see _jit_prologue)
    lanes = sum_order(job.library, job.head_dim, _name(job.compute)) or 0
    tree = np.array(_jit_prologue.leaves(min(job.head_dim, LONGEST_HEAD)), dtype=np.int64)
    view: Any = host_view if bits or not numpy else _same
    wrap = _wrapper(numpy, bits, job.dtype)
    no_places = np.full((1, seq), -1, dtype=np.int64)
    no_cache: Any = np.empty((0, 1, 1, 1), dtype=host_dtype)
    no_values: Any = np.empty((0, 1, 1, 1, 1), dtype=host_dtype)
    contiguous = np.ascontiguousarray

    def weights(weight: Any) -> Any:
        found = contiguous(view(weight))
        return found.reshape(-1 if found.ndim == 2 else 1, job.head_dim)

    def places(host: Any) -> Any:
        """Each token's place as the kernel reads them: (1 or batch, seq) int64, -1 to skip."""
        found = contiguous(host, dtype=np.int64)
        if found.ndim == 2 and found.shape[1] == seq and found.shape[0] in (1, batch):
            return found
        return contiguous(np.broadcast_to(found, (batch, seq)))

    def launch(
        q: Any,
        k: Any,
        v: Any,
        norm: Any,
        cache: Any,
        where: Any,  # noqa: ARG001 - the device places: this kernel reads the host's
        host: Any,
        source: Any,
    ) -> tuple[Any, Any]:
        found = source.lookup(seq, job.compute)
        table, rows = found if found is not None else rows_of(source.ctx.xp, *source.tables(seq, job.compute))
        table = contiguous(table if numpy else table.numpy())
        q_weight, k_weight = weights(norm.q_weight), weights(norm.k_weight)  # a norm: needs_norm
        if cache is None:
            values, cache_k, cache_v = no_values, no_cache, no_cache
            at, page = no_places, 0
        else:
            values = contiguous(view(v)).reshape(forms[2])
            cache_k = view(cache.k).transpose(axes)
            cache_v = view(cache.v).transpose(axes)
            at = places(host)
            page = cache.k.shape[1 if job.cache == "paged_nhd" else 2] if paged else 0
        out_q, out_k = np.empty(q_shape, dtype=host_dtype), np.empty(k_shape, dtype=host_dtype)
        kernel(
            contiguous(view(q)).reshape(forms[0]), out_q.reshape(forms[0]), q_weight,
            contiguous(view(k)).reshape(forms[1]), out_k.reshape(forms[1]), k_weight,
            values, cache_k, cache_v, at, page, table, rows, sign, norm.eps, count, tree, lanes, wide_mean,
            norm.offset,
        )  # fmt: skip
        return wrap(out_q), wrap(out_k)

    return launch


def _name(dtype: Any) -> str:
    """A NumPy or torch dtype's name, as NumPy spells it."""
    import numpy as np

    text = str(dtype)
    return text.removeprefix("torch.") if text.startswith("torch.") else np.dtype(dtype).name


def _wrapper(numpy: bool, bits: bool, dtype: str) -> Any:
    """How the kernel's NumPy output buffer becomes the result, sharing its memory."""
    if numpy:
        return (lambda buffer: buffer.view(dtype)) if bits else _same
    import torch

    if not bits:
        return torch.from_numpy
    wanted = getattr(torch, dtype)
    return lambda buffer: torch.from_numpy(buffer).view(wanted)


def _same(x: Any) -> Any:
    return x
