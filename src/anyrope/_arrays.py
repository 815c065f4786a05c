"""Per-library array glue: whether a library is installed, what it is called, and how to make one
of its arrays on a device, read one back to NumPy and wait for its work to finish.

The self-check, the tests and the benchmarks all need these, so they live here once. The library
proper never does: it takes the arrays it is given. This module imports nothing at module level
but the standard library, neither an array library nor the rest of anyrope, so that the
benchmarks can load it from its file without importing anyrope (their first-call timings start
the clock before ``import anyrope``), and so that ``python -m anyrope`` finds what is installed
before importing any of it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

__all__ = ["LIBRARIES", "Library", "asarray", "is_installed", "synchronize", "to_numpy"]


def is_installed(module: str) -> bool:
    """Whether ``module`` can be found. Nothing is imported but, for a submodule, its parents."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing or broken parent package, or a module with no spec
        return False


@dataclass(frozen=True)
class Library:
    """One backend's library, under the names each part of the project knows it by."""

    backend: str  # the backends/ name, as nox, pytest and the self-check spell it
    module: str  # the module whose presence says it is installed (found, not imported)
    namespace: str  # its array namespace's name (``_compat.library_name``), as kernels declare it
    distributions: tuple[str, ...]  # the PyPI distributions that provide it, for its version
    install: str  # how a user installs it


LIBRARIES: dict[str, Library] = {
    library.backend: library
    for library in (
        Library("numpy", "numpy", "numpy", ("numpy",), 'pip install "anyrope[numpy]"'),
        Library("torch", "torch", "torch", ("torch",), 'pip install "anyrope[torch]"'),
        # find_spec("mlx.core") would import the mlx package itself; the self-check does that in a try.
        Library("mlx", "mlx", "mlx", ("mlx",), 'pip install "anyrope[mlx]"'),
        Library("jax", "jax", "jax.numpy", ("jax",), 'pip install "anyrope[jax]"'),
        Library(
            "cupy",
            "cupy",
            "cupy",
            ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"),
            'pip install "anyrope[cupy]"',
        ),
        Library("dask", "dask.array", "dask.array", ("dask",), 'pip install "anyrope[dask]"'),
        Library(
            "array-api-strict",
            "array_api_strict",
            "array_api_strict",
            ("array-api-strict",),
            "pip install array-api-strict",
        ),
    )
}


def asarray(backend: str, data: Any, dtype: str, device: Any = None) -> Any:
    """``data`` (a NumPy array or nested lists) as an array of ``backend`` in dtype ``dtype``.

    The array is made with the library's own constructor, as a user would make it, on ``device``
    (the library's object; None: its default, or the current device of CuPy and MLX, which
    their scopes set). Floating data goes to the device in float64, or float32 for the narrower
    dtypes, and is cast there: NumPy has no bfloat16. Dask arrays come in chunks of 2 along
    every axis but a floating array's features, so that work crosses chunk borders.
    """
    np = importlib.import_module("numpy")
    host = np.asarray(data)
    floating = np.dtype(dtype).kind == "f" if dtype != "bfloat16" else True
    if backend == "dask":
        da = importlib.import_module("dask.array")
        whole = floating and host.ndim >= 1
        chunks = tuple(-1 if whole and axis == host.ndim - 1 else 2 for axis in range(host.ndim))
        return da.from_array(host.astype(dtype), chunks=chunks or -1)
    wide = ("float64" if dtype == "float64" else "float32") if floating else dtype
    x = _put(backend, host.astype(wide), wide, device)
    return x if wide == dtype else _cast(backend, x, dtype)


def _put(backend: str, host: Any, dtype: str, device: Any) -> Any:
    """A NumPy array on ``device`` in its own dtype, ``dtype`` by name."""
    if backend == "numpy":
        return host
    if backend == "torch":
        torch = importlib.import_module("torch")
        return torch.asarray(host, dtype=getattr(torch, dtype), device=device)
    if backend == "mlx":
        mx = importlib.import_module("mlx.core")
        return mx.array(host, dtype=getattr(mx, dtype))
    if backend == "jax":
        jax, jnp = importlib.import_module("jax"), importlib.import_module("jax.numpy")
        x = jnp.asarray(host, dtype=getattr(jnp, dtype))
        return x if device is None else jax.device_put(x, device)
    if backend == "cupy":
        cupy = importlib.import_module("cupy")
        with device if device is not None else contextlib.nullcontext():
            return cupy.asarray(host, dtype=getattr(cupy, dtype))
    module = importlib.import_module(LIBRARIES[backend].namespace)  # array-api-strict
    return module.asarray(host, dtype=getattr(module, dtype), device=device)


def _cast(backend: str, x: Any, dtype: str) -> Any:
    if backend == "numpy":
        return x.astype(dtype)
    if backend == "torch":
        return x.to(getattr(importlib.import_module("torch"), dtype))
    if backend == "mlx":
        return x.astype(getattr(importlib.import_module("mlx.core"), dtype))
    if backend in ("jax", "cupy"):
        return x.astype(getattr(importlib.import_module(LIBRARIES[backend].namespace), dtype))
    module = importlib.import_module(LIBRARIES[backend].namespace)
    return module.astype(x, getattr(module, dtype))


def to_numpy(backend: str, x: Any) -> Any:
    """``x`` as a NumPy array on the host, in its own dtype (a dask array computed)."""
    np = importlib.import_module("numpy")
    if backend == "torch":
        return x.detach().cpu().numpy()
    if backend == "cupy":
        return x.get()
    if backend == "dask":
        return np.asarray(x.compute())
    if backend in ("mlx", "numpy", "jax"):
        return np.asarray(x)
    return np.from_dlpack(x)


def synchronize(backend: str, result: Any, device: Any = None) -> None:
    """Wait until ``result`` (an array, or a tuple of them) exists: lazy and asynchronous
    libraries return before their work is done. ``device``: torch's, which syncs on CUDA only."""
    if backend == "torch":
        if str(device).startswith("cuda"):
            importlib.import_module("torch").cuda.synchronize()
    elif backend == "mlx":
        importlib.import_module("mlx.core").eval(result)
    elif backend == "jax":
        importlib.import_module("jax").block_until_ready(result)
    elif backend == "cupy":
        importlib.import_module("cupy").cuda.get_current_stream().synchronize()
