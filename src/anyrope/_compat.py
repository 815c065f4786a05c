"""Array-library dispatch: which namespace an array belongs to, what its device can do, and
whether its values may be read on the host.

Every backend goes through array-api-compat, which recognises NumPy, PyTorch, CuPy, JAX and Dask
through ``sys.modules`` (so nothing is imported here) and falls back to ``__array_namespace__``.
MLX arrives through that fallback and is wrapped by :mod:`._mlx`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import array_api_compat

from ._mlx import MLXNamespace, mlx_namespace

__all__ = [
    "Environment",
    "array_namespace",
    "compute_dtype",
    "device_of",
    "dtype_name",
    "environment",
    "host_array",
    "int_info",
    "is_library",
    "is_mlx_namespace",
    "is_traced",
    "is_writeable",
    "isdtype",
    "library_name",
    "materialize",
    "take_rows",
]


def is_mlx_namespace(xp: Any) -> bool:
    return isinstance(xp, MLXNamespace)


def is_library(xp: Any, name: str) -> bool:
    """Whether ``xp`` is the namespace of library ``name`` ("numpy", "torch", "jax.numpy", "cupy",
    "mlx", ...). A name check rather than array-api-compat's cached tests, which dynamo warns about."""
    return library_name(xp) == name


def library_name(xp: Any) -> str:
    """A short, user-facing name for an array namespace ("numpy", "torch", "mlx", "jax.numpy", ...)."""
    if isinstance(xp, MLXNamespace):
        return "mlx"
    name = getattr(xp, "__name__", type(xp).__name__)
    return str(name).removeprefix("array_api_compat.")


# An array's namespace depends only on its type: look each type up once. This keeps dispatch
# to a dict lookup on the decode path, where array-api-compat's general checks cost 10 us each.
_by_type: dict[type, tuple[Any, str]] = {}


def _namespace_of(arg: str, value: Any) -> tuple[Any, str]:
    kind = type(value)
    found = _by_type.get(kind)
    if found is None:
        try:
            xp = _torch_namespace(kind) or array_api_compat.array_namespace(value)
        except TypeError:
            raise TypeError(
                f"{arg} must be an array of a supported library (NumPy, PyTorch, CuPy, MLX, JAX or any "
                f"array-API library), not {kind.__name__}"
            ) from None
        shim = mlx_namespace(xp) if getattr(xp, "__name__", "") == "mlx.core" else xp
        found = (shim, library_name(shim))
        if not library_name(shim).startswith("dask"):  # dask's namespace follows its chunk type
            _by_type[kind] = found
    return found


def _torch_namespace(kind: type) -> Any:
    """array-api-compat's torch namespace, imported plainly: a first call may come while dynamo
    traces, and dynamo warns of array-api-compat's cached type lookup."""
    if kind.__module__.partition(".")[0] != "torch":
        return None
    import array_api_compat.torch as namespace

    return namespace


def is_array(value: Any) -> bool:
    # Types already seen as arrays answer from the namespace cache (a dict lookup); Python values
    # never reach array-api-compat's check (cached inside, which dynamo warns about).
    if type(value) in _by_type:
        return True
    if value is None or isinstance(value, (list, tuple, int, float, str, bytes)):
        return False
    if type(value).__module__.partition(".")[0] == "torch":  # the first tensor may come while dynamo traces
        return hasattr(value, "dtype") and hasattr(value, "shape")
    return bool(array_api_compat.is_array_api_obj(value))


def array_namespace(**named: Any) -> Any:
    """The namespace shared by the named arrays; ``None`` values are ignored.

    The keyword names are the caller's argument names, so a mismatch can say which argument
    came from which library.
    """
    first: tuple[str, Any, str] | None = None
    for arg, value in named.items():
        if value is None:
            continue
        xp, lib = _namespace_of(arg, value)
        if first is None:
            first = (arg, xp, lib)
        elif lib != first[2]:
            raise TypeError(
                f"{first[0]} is a {first[2]} array but {arg} is a {lib} array; pass arrays "
                f"of one library (convert with {first[2]}'s asarray or from_dlpack)"
            )
    if first is None:
        raise TypeError("no array was given")
    return first[1]


def device_of(xp: Any, x: Any) -> Any:
    """The device of ``x``; MLX arrays live in unified memory, so the default device's name stands in."""
    if isinstance(xp, MLXNamespace):
        return str(xp.default_device())  # a fresh Device object each call: keep a stable label
    device = getattr(x, "device", None)  # the standard's attribute; NumPy < 2 lacks it
    return device if device is not None else array_api_compat.device(x)


@dataclass(frozen=True)
class Environment:
    """What one library on one device offers the angle and position code.

    ``float64``: float64 arithmetic works on the device. ``angles``: how narrow (float32 and
    smaller) tables are formed, "float64" (the device's own float64 cos and sin, then a cast) or
    "digits" (exact host tables combined in float32 on the device, see :mod:`._angles`).
    ``index``: the widest integer dtype there (int32 for JAX without x64).
    """

    library: str
    device_type: str
    float64: bool
    angles: str
    index: Any
    index_bits: int


_environments: dict[tuple[Any, ...], Environment] = {}


def environment(xp: Any, device: Any) -> Environment:
    jax_x64 = is_library(xp, "jax.numpy") and _jax_x64()
    key = (library_name(xp), _hashable(device), jax_x64)
    found = _environments.get(key)
    if found is None:
        found = _environments.setdefault(key, _probe(xp, device, jax_x64))
    return found


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
    return Environment(library, kind, wide, angles, getattr(xp, f"int{bits}"), bits)


def _jax_x64() -> bool:
    import jax  # already imported: the array came from it

    config: Any = jax.config  # untyped in JAX's stubs
    return bool(config.read("jax_enable_x64"))


def _hashable(value: Any) -> Any:
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


def is_traced(xp: Any, x: Any) -> bool:
    """Whether ``x`` is being traced or compiled, or holds no values: then nothing may read them.

    torch: dynamo, ``torch.jit`` tracing, meta and fake tensors, functorch transforms and tensor
    subclasses; JAX: tracers. MLX cannot tell from an array whether ``mx.compile`` is tracing, so
    MLX arrays are never read at all.
    """
    library = library_name(xp)
    if library == "torch":
        return _torch_traced(x)
    if library == "jax.numpy":
        import jax

        return isinstance(x, jax.core.Tracer)
    return False


def _torch_traced(x: Any) -> bool:
    import torch

    jit: Any = torch.jit  # is_tracing is untyped in torch's stubs
    if torch.compiler.is_compiling() or jit.is_tracing():
        return True
    if x.device.type == "meta":
        return True
    if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
        return True  # FakeTensor, FunctionalTensor, DTensor, ...: values are not ours to read
    return bool(torch._C._functorch.is_functorch_wrapped_tensor(x))


def host_array(xp: Any, x: Any) -> Any:
    """``x`` as a NumPy array sharing its memory where its values may be read on the host, else None.

    Host-resident: NumPy arrays, and CPU torch tensors outside tracing. Everything else (GPUs,
    JAX, MLX, lazy arrays) is read only through shapes, dtypes and devices.
    """
    library = library_name(xp)
    if library == "numpy":
        return x
    if library == "torch" and x.device.type == "cpu" and not _torch_traced(x):
        return x.detach().numpy()
    return None


def is_writeable(xp: Any, x: Any) -> bool:
    """Whether ``x`` may be written in place (NumPy's read-only flag; JAX and MLX never)."""
    library = library_name(xp)
    if library == "numpy":
        return bool(x.flags.writeable)
    return library not in ("jax.numpy", "mlx")


def materialize(xp: Any, *arrays: Any) -> None:
    """Finish computing lazy arrays before they are shared between threads (MLX evaluates lazily,
    and one graph evaluated from several threads at once gives wrong values)."""
    if isinstance(xp, MLXNamespace):
        xp.eval(*arrays)


def take_rows(xp: Any, table: Any, indices: Any) -> Any:
    """``xp.take(table, indices, axis=0)`` for 1-D indices that are in range by construction.

    array-api-compat's torch ``take`` also wraps negative indices, which costs a third of a
    decode step; these never are, so torch gets ``index_select`` directly.
    """
    if is_library(xp, "torch"):
        return table.index_select(0, indices)
    return xp.take(table, indices, axis=0)


# Facts about dtypes, remembered per dtype: they never change, and asking the library costs
# microseconds a decode step notices. Keyed by the dtype's type first (dtypes of two libraries are
# never compared). While dynamo traces, the memo is skipped: it cannot hash every dtype object.
_dtype_facts: dict[tuple[str, type, Any], Any] = {}


def _dtype_fact(xp: Any, what: str, dtype: Any, compute: Callable[[], Any]) -> Any:
    if is_library(xp, "torch") and _torch_compiling():
        return compute()
    key = (what, type(dtype), dtype)
    found = _dtype_facts.get(key)
    if found is None:
        found = _dtype_facts[key] = compute()
    return found


def _torch_compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def isdtype(xp: Any, dtype: Any, kind: str) -> bool:
    """``xp.isdtype``, remembered."""
    return bool(_dtype_fact(xp, kind, dtype, lambda: xp.isdtype(dtype, kind)))


def float_bits(xp: Any, dtype: Any) -> int:
    """The width of a floating dtype in bits (64 for NumPy's big-endian float64 too)."""
    return int(_dtype_fact(xp, "float bits", dtype, lambda: xp.finfo(dtype).bits))


def int_info(xp: Any, dtype: Any) -> tuple[int, bool]:
    """(bits, signed) of an integer dtype (from ``iinfo``'s bounds: MLX's has no ``bits``)."""

    def compute() -> tuple[int, bool]:
        info = xp.iinfo(dtype)
        signed = int(info.min) < 0
        return int(info.max).bit_length() + signed, signed

    return _dtype_fact(xp, "int info", dtype, compute)  # type: ignore[no-any-return]


def dtype_name(xp: Any, dtype: Any) -> str:
    """ "float32", "bfloat16", ...; NumPy's non-native byte orders keep their mark (">f8")."""

    def compute() -> str:
        if getattr(dtype, "isnative", True) is False:
            return str(dtype)
        return str(getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1])

    return str(_dtype_fact(xp, "name", dtype, compute))


def compute_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype RoPE arithmetic runs in: float64 for 64-bit floats, float32 for everything narrower."""
    return xp.float64 if float_bits(xp, dtype) == 64 else xp.float32
