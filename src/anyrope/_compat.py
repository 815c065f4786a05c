"""Array-library dispatch: which namespace an array belongs to, what its device can do, and
whether its values may be read on the host.

Every backend goes through array-api-compat, which recognises NumPy, PyTorch, CuPy, JAX and Dask
through ``sys.modules`` (so nothing is imported here) and falls back to ``__array_namespace__``.
MLX arrives through that fallback and is wrapped by :mod:`._mlx`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast

import array_api_compat

from ._memo import Memo
from ._mlx import MLXNamespace, mlx_namespace

__all__ = [
    "Environment",
    "array_namespace",
    "check_same_device",
    "check_writeable",
    "device_of",
    "dynamo_hands_on",
    "environment",
    "host_array",
    "is_library",
    "is_mlx_namespace",
    "is_traced",
    "is_writeable",
    "library_name",
    "materialize",
    "rsqrt",
    "take_rows",
]


def is_mlx_namespace(xp: Any) -> bool:
    return isinstance(xp, MLXNamespace)


def is_library(xp: Any, name: str) -> bool:
    """Whether ``xp`` is the namespace of library ``name`` ("numpy", "torch", "jax.numpy", "cupy",
    "mlx", ...). A name check rather than array-api-compat's cached tests, which dynamo warns about."""
    return library_name(xp) == name


def library_name(xp: Any) -> str:
    """A short, user-facing name for an array namespace ("numpy", "torch", "mlx", "jax.numpy", ...).

    Read from the namespace each time: dynamo cannot use a module as a dictionary key."""
    if isinstance(xp, MLXNamespace):
        return "mlx"
    return str(getattr(xp, "__name__", type(xp).__name__)).removeprefix("array_api_compat.")


# An array's namespace depends only on its type: look each type up once. This keeps dispatch
# to a dict lookup on the decode path, where array-api-compat's general checks cost far more.
_by_type: Memo[tuple[Any, str]] = Memo()  # keyed by type objects


def _namespace_of(arg: str, value: Any) -> tuple[Any, str]:
    kind = type(value)
    if _is_torch_type(kind):  # before any memo: see torch_compiling
        return _torch_namespace(), "torch"
    found = _by_type.find(kind)
    if found is None:
        try:
            xp = array_api_compat.array_namespace(value)
        except TypeError:
            raise TypeError(
                f"{arg} must be an array of a supported library (NumPy, PyTorch, CuPy, MLX, JAX or any "
                f"array-API library), not {kind.__name__}"
            ) from None
        shim = mlx_namespace(xp) if getattr(xp, "__name__", "") == "mlx.core" else xp
        found = (shim, library_name(shim))
        if not library_name(shim).startswith("dask"):  # dask's namespace follows its chunk type
            _by_type.keep(kind, found)
    return found


def _is_torch_type(kind: type) -> bool:
    module = kind.__module__
    # tensors and parameters first: dynamo compares their module's name, but cannot trace
    # str.partition on a Parameter's (a QKNorm of a model's weights in a compiled forward)
    return module in ("torch", "torch.nn.parameter") or module.partition(".")[0] == "torch"


def _torch_namespace() -> Any:
    """array-api-compat's torch namespace, imported plainly: dynamo warns of array-api-compat's
    cached type lookup."""
    import array_api_compat.torch as namespace

    return namespace


def torch_compiling(value: Any) -> bool:
    """Whether ``value`` is a torch object and dynamo is tracing.

    While it traces, anyrope reads none of its process-wide memos (namespaces, dtype facts,
    environments, call plans, kernel choices, tables): dynamo would guard the compiled graph on
    their contents, and any later entry, for another library or dtype, would recompile it. So
    this asks no memo itself: the value's type, then torch."""
    if not _is_torch_type(type(value)):
        return False
    import torch

    return bool(torch.compiler.is_compiling())


def dynamo_hands_on(value: Any) -> bool:
    """Whether ``value`` is a torch object and dynamo traces a call that it can hand whole to
    AOTAutograd (:func:`anyrope._torch_ops.hand_on`), asked as :func:`torch_compiling` asks."""
    if not _is_torch_type(type(value)):
        return False
    import torch

    if not torch.compiler.is_dynamo_compiling() or not hasattr(torch.library, "register_fake"):  # torch < 2.4
        return False
    from ._torch_ops import hands_on

    return hands_on()


def is_array(value: Any) -> bool:
    # Python values never reach array-api-compat's check (cached inside, which dynamo warns
    # about); torch types are told by their module, before the namespace memo.
    if value is None or isinstance(value, (list, tuple, int, float, str, bytes)):
        return False
    kind = type(value)
    if _is_torch_type(kind):
        return hasattr(value, "dtype") and hasattr(value, "shape")
    return _by_type.find(kind) is not None or bool(array_api_compat.is_array_api_obj(value))


def array_namespace(**named: Any) -> Any:
    """The namespace shared by the named arrays; ``None`` values are ignored.

    The keyword names are the caller's argument names, so a mismatch can say which argument
    came from which library.
    """
    present = [(arg, value) for arg, value in named.items() if value is not None]
    if not present:
        raise TypeError("no array was given")
    return namespace_and_library(*present)[0]


def namespace_and_library(first: tuple[str, Any], *others: tuple[str, Any]) -> tuple[Any, str]:
    """The namespace of ``first``'s array and its library name, after checking that every other
    (argument name, array) pair is of the same library."""
    xp, library = _namespace_of(*first)
    for arg, value in others:
        if library == "torch" and type(value).__module__ == "numpy":
            # named here, not by _namespace_of: dynamo cannot split a wrapped NumPy array's
            # module name, nor, before torch 2.13, read the type memo
            other = "numpy"
        else:
            other = _namespace_of(arg, value)[1]
        if other != library:
            raise TypeError(
                f"{first[0]} is a {library} array but {arg} is a {other} array; pass arrays "
                f"of one library (convert with {library}'s asarray or from_dlpack)"
            )
    return xp, library


def device_of(xp: Any, x: Any) -> Any:
    """The device of ``x``; MLX arrays live in unified memory, so the default device's name stands in.

    A JAX array sharded over several devices has a sharding for its device; what a call makes
    beside it (positions, constant tables) is then replicated over the same devices, so it
    combines with every shard where that shard lives, with no communication."""
    if isinstance(xp, MLXNamespace):
        return str(xp.default_device())  # a fresh Device object each call: keep a stable label
    device = getattr(x, "device", None)  # the standard's attribute; NumPy < 2 lacks it
    if device is None:
        return array_api_compat.device(x)
    if library_name(xp) == "jax.numpy" and hasattr(device, "spec") and hasattr(device, "mesh"):
        shardings = _jax_sharding()
        return shardings.NamedSharding(device.mesh, shardings.PartitionSpec())
    return device


def _jax_sharding() -> Any:
    import importlib

    return importlib.import_module("jax.sharding")  # as Any: the lint environment lacks JAX


@dataclass(frozen=True, eq=False)
class Environment:
    """What one library on one device offers the angle and position code; one object per
    library, device (and JAX x64 setting), compared by identity (it keys cached tables).

    ``float64``: float64 arithmetic works on the device. ``angles``: how narrow (float32 and
    smaller) tables are formed, "float64" (the device's own float64 cos and sin, then a cast) or
    "digits" (exact host tables combined in float32 on the device, see :mod:`._angles`).
    ``index``: the widest integer dtype there (int32 for JAX without x64). ``lazy``: arrays are
    graphs computed later (Dask), so tables are not kept: gathering rows of a kept table by
    lazy positions would leave chunks of unknown size.
    """

    library: str
    device_type: str
    float64: bool
    angles: str
    index: Any
    index_bits: int
    device: Any
    lazy: bool = False


_environments: Memo[Environment] = Memo()


def environment(xp: Any, device: Any, *, traced: bool = False) -> Environment:
    """The environment of a library on a device: one object per library, device and JAX x64
    setting, remembered (but made afresh while a call is traced, which reads no memo)."""
    library = library_name(xp)
    jax_x64 = library == "jax.numpy" and _jax_x64()
    if traced:  # no key either: dynamo cannot trace hash() of a CUDA device
        return _probe(xp, device, jax_x64)
    return _environments.get((library, _hashable(device), jax_x64), lambda: _probe(xp, device, jax_x64))


def _probe(xp: Any, device: Any, jax_x64: bool) -> Environment:
    library = library_name(xp)
    kind = str(getattr(device, "type", None) or getattr(device, "platform", None) or "cpu")
    if library == "cupy":
        kind = "cuda"
    elif isinstance(xp, MLXNamespace):
        kind = "gpu" if "gpu" in str(device).lower() else "cpu"
    wide = hasattr(xp, "float64")
    if library == "jax.numpy":
        wide = jax_x64
    elif library == "torch" and kind == "mps":
        wide = False
    bits = 32 if library == "jax.numpy" and not jax_x64 else 64
    # MLX does float64 on its CPU stream only, and its float64 cos and sin are float32-accurate:
    # exact host tables combined on the device serve every MLX device alike.
    angles = "float64" if wide and not isinstance(xp, MLXNamespace) else "digits"
    lazy = library == "dask.array"
    return Environment(library, kind, wide, angles, getattr(xp, f"int{bits}"), bits, device, lazy)


def _jax_x64() -> bool:
    import jax  # already imported: the array came from it

    config: Any = jax.config  # untyped in JAX's stubs
    return bool(config.read("jax_enable_x64"))


def _hashable(value: Any) -> Any:
    if type(value) is str:
        return value
    try:
        hash(value)
    except TypeError:
        return str(value)
    return value


def float64_scope(xp: Any) -> contextlib.AbstractContextManager[Any]:
    """Where float64 arithmetic runs: MLX's CPU stream (its GPU has no float64), else anywhere."""
    if isinstance(xp, MLXNamespace):
        return cast("contextlib.AbstractContextManager[Any]", xp.stream(xp.cpu))
    return contextlib.nullcontext()


def is_traced(xp: Any, *arrays: Any) -> bool:
    """Whether any of ``arrays`` is being traced or compiled, or holds no values: then nothing may
    read them (``None`` entries are skipped).

    torch: dynamo, ``torch.jit`` tracing, meta and fake tensors, functorch transforms and tensor
    subclasses; JAX: tracers. MLX cannot tell from an array whether ``mx.compile`` is tracing, so
    MLX arrays are never read at all.
    """
    library = library_name(xp)
    if library == "torch":
        import torch

        jit: Any = torch.jit  # is_tracing is untyped in torch's stubs
        if torch.compiler.is_compiling() or jit.is_tracing():
            return True
        plain, wrapped = (torch.Tensor, torch.nn.Parameter), torch._C._functorch.is_functorch_wrapped_tensor
        # FakeTensor, FunctionalTensor, DTensor...; meta tensors; vmap and grad wrappers
        return any(x is not None and (type(x) not in plain or x.is_meta or wrapped(x)) for x in arrays)
    if library == "jax.numpy":
        import jax

        return any(isinstance(x, jax.core.Tracer) for x in arrays)
    return False


def host_array(xp: Any, x: Any, traced: bool) -> Any:
    """``x`` as a NumPy array sharing its memory where its values may be read on the host, else None.

    Host-resident: NumPy arrays, and CPU torch tensors outside tracing (``traced``: the call is).
    Everything else (GPUs, JAX, MLX, lazy arrays) is read only through shapes, dtypes and devices.
    """
    library = library_name(xp)
    if library == "numpy":
        return x
    if library == "torch" and not traced and x.device.type == "cpu":
        return (x.detach() if x.requires_grad else x).numpy()
    return None


# Libraries whose arrays need no device check: NumPy has one device, MLX unified memory, JAX
# arrays may be sharded (positions sharded like their tokens) and moves them itself, Dask follows its chunks.
_ONE_DEVICE = frozenset({"numpy", "mlx", "jax.numpy", "dask.array"})


def check_same_device(xp: Any, device: Any, owner: str, **named: Any) -> None:
    """Every named array (``None`` skipped) on ``device``, where ``owner`` is, or a ValueError naming
    it and the fix, before any work: the library's own error would name neither argument."""
    if library_name(xp) in _ONE_DEVICE:
        return
    for arg, value in named.items():
        where = getattr(value, "device", None)
        if value is not None and where is not None and where != device:
            raise ValueError(
                f"{arg} is on {where}, {owner} on {device}; move {arg} to {device} first (torch: "
                f"{arg}.to(device); array API: xp.asarray({arg}, device=device))"
            )


def check_writeable(xp: Any, x: Any, arg: str, how: str, traced: bool) -> None:
    """``x`` may be written in place, one element at a time: not read-only, and no two elements at
    one address (a stride-0 view from ``expand`` or ``broadcast_to``), which the rotation would
    write twice or the library refuse halfway through."""
    if not is_writeable(xp, x):
        raise ValueError(f"{arg} is read-only; {how} would write into it: pass a writable copy")
    if not traced and _repeats_elements(xp, x):
        raise ValueError(
            f"{arg} has a stride-0 axis (a view from expand or broadcast_to: one element stands for "
            f"several), so {how} cannot write into it; pass a copy ({arg}.contiguous() or {arg}.copy()) "
            f"or drop {how.rstrip('=')}"
        )


def features_innermost(xp: Any, x: Any) -> bool:
    """Whether ``x``'s last axis is its innermost in memory: every other axis of more than one
    element steps over a whole row of it (True for libraries without strides). A library sums
    such rows in its own order for rows (NumPy's pairwise sums, torch's vectors); it may sum
    rows of other layouts (a transposed view, a stride-0 axis) in another."""
    strides, shape = _element_strides(xp, x), tuple(x.shape)
    if not strides or not shape:
        return True
    row = abs(strides[-1]) * shape[-1]
    if shape[-1] > 1 and strides[-1] == 0:
        return False
    return all(size <= 1 or abs(step) >= row for step, size in zip(strides[:-1], shape[:-1], strict=True))


def _repeats_elements(xp: Any, x: Any) -> bool:
    """Whether two of ``x``'s elements share an address: an axis of length > 1 with stride 0. An
    array with no elements has none to share (NumPy 2 gives empty arrays zero strides)."""
    if 0 in tuple(x.shape):
        return False
    strides = _element_strides(xp, x) or ()
    return any(stride == 0 and size > 1 for stride, size in zip(strides, x.shape, strict=False))


def _element_strides(xp: Any, x: Any) -> tuple[int, ...] | None:
    """``x``'s strides in elements: torch's, NumPy's and CuPy's (whose views come from expand and
    broadcast_to too); None for arrays without strides (JAX, MLX, Dask)."""
    if library_name(xp) == "torch":
        return tuple(x.stride())
    found = getattr(x, "strides", None)
    return None if found is None else tuple(step // x.itemsize for step in found)


def is_writeable(xp: Any, x: Any) -> bool:
    """Whether ``x`` may be written in place (NumPy's read-only flag; JAX and MLX never)."""
    library = library_name(xp)
    if library == "numpy":
        return bool(x.flags.writeable)
    return library not in ("jax.numpy", "mlx")


def is_c_contiguous(xp: Any, x: Any) -> bool:
    """Whether ``x`` is laid out densely in row-major order (arrays that cannot be written in
    place never reach this)."""
    library = library_name(xp)
    if library == "torch":
        return bool(x.is_contiguous())
    flags = getattr(x, "flags", None)  # NumPy, CuPy
    return flags is None or bool(flags.c_contiguous)


def materialize(xp: Any, *arrays: Any) -> None:
    """Finish computing lazy arrays before they are shared between threads (MLX evaluates lazily,
    and one graph evaluated from several threads at once gives wrong values)."""
    if isinstance(xp, MLXNamespace):
        xp.eval(*arrays)


def rsqrt(xp: Any, x: Any) -> Any:
    """``1 / sqrt(x)`` by the library's own reciprocal square root where it has one (torch,
    JAX's ``lax``, MLX), as the models written for it call it: torch's differs from
    ``1 / sqrt`` in the last bit on a CPU. Elsewhere the standard's two operations."""
    name = library_name(xp)
    if name in ("torch", "mlx"):
        return xp.rsqrt(x)
    if name == "jax.numpy":
        from jax import lax  # imports jax: the array came from it

        return lax.rsqrt(x)
    return 1 / xp.sqrt(x)


def take_rows(xp: Any, table: Any, indices: Any) -> Any:
    """``xp.take(table, indices, axis=0)`` for 1-D indices that are in range by construction.

    array-api-compat's torch ``take`` also wraps negative indices, which costs a third of a
    decode step; these never are, so torch gets ``index_select`` directly.
    """
    if is_library(xp, "torch"):
        return table.index_select(0, indices)
    if is_library(xp, "jax.numpy"):
        return _jax_take_rows(xp, table, indices)
    return xp.take(table, indices, axis=0)


def _jax_take_rows(xp: Any, table: Any, indices: Any) -> Any:
    """Under an explicitly sharded mesh JAX asks where a gather's result lives: with its indices
    (rows of a replicated table, gathered where each index is, with no communication)."""
    import jax

    typeof: Any = getattr(jax, "typeof", None)  # JAX >= 0.6
    sharding: Any = getattr(typeof(indices), "sharding", None) if typeof is not None else None
    spec = getattr(sharding, "spec", None)
    if spec is None or all(part is None for part in spec):
        return xp.take(table, indices, axis=0)
    shardings = _jax_sharding()
    rows = shardings.NamedSharding(sharding.mesh, shardings.PartitionSpec(*spec, None))
    return table.at[indices].get(out_sharding=rows)
