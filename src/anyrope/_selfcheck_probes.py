"""The self-check's backends: for each array library, a probe that imports it and lists the
devices to check it on.

Nothing is imported up front: a library is found with :func:`importlib.util.find_spec` (see
``_arrays.is_installed``) and its probe imports it only when its turn comes, so a broken install
shows up as one failed row instead of a crash. Arrays are made by the per-library glue of
``_arrays``, with the library's own constructor, so that the checks exercise anyrope on arrays
exactly as users would pass them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ._arrays import LIBRARIES, asarray
from ._selfcheck_checks import Nested, Target, error_text

__all__ = ["BACKENDS", "Backend", "Skip", "distribution_version"]


class Skip(Exception):
    """Raised by a probe when the library imports but has nothing to run on (e.g. no GPU)."""


@dataclass(frozen=True)
class Backend:
    """An array library: the module that says it is installed, its distributions and its probe."""

    name: str
    module: str
    distributions: tuple[str, ...]
    probe: Callable[[], list[Target]]  # imports the library; raises Skip or any import error
    install: str
    namespace: str  # the name kernels declare it by


def _maker(backend: str, device: Any = None) -> Callable[[Nested, str], Any]:
    """(nested lists, dtype name) -> an array of ``backend`` on ``device``."""
    return partial(asarray, backend, device=device)


_NO_BFLOAT16 = "no bfloat16 in this library"


def _numpy() -> list[Target]:
    importlib.import_module("numpy")
    return [Target("cpu", _maker("numpy"), {"bfloat16": _NO_BFLOAT16})]


def _dask() -> list[Target]:
    importlib.import_module("dask.array")
    return [Target("cpu", _maker("dask"), {"bfloat16": _NO_BFLOAT16})]  # chunked: see asarray


def _torch() -> list[Target]:
    import torch

    def target(device: str, unsupported: dict[str, str] | None = None) -> Target:
        return Target(device, _maker("torch", device), unsupported or {})

    targets = [target("cpu")]
    if torch.cuda.is_available():
        targets += [target(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        targets.append(target("mps", {"float64": "MPS has no float64"}))
    return targets


def _mlx() -> list[Target]:
    import mlx.core as mx

    def target(device: Any, label: str, unsupported: dict[str, str] | None = None) -> Target:
        # MLX arrays live in unified memory; the device is where operations run, set per stream.
        return Target(label, _maker("mlx"), unsupported or {}, lambda: mx.stream(device))

    targets = [target(mx.cpu, "cpu")]
    if _mlx_gpu_available(mx):
        targets.append(target(mx.gpu, "gpu", {"float64": "MLX GPUs have no float64"}))
    return targets


def _mlx_gpu_available(mx: Any) -> bool:
    # mx.is_available covers Metal and CUDA builds; older releases only have mx.metal.is_available.
    try:
        if hasattr(mx, "is_available"):
            return bool(mx.is_available(mx.gpu))
        return bool(mx.metal.is_available())
    except Exception:  # noqa: BLE001 - a GPU that cannot even be queried is no GPU to check
        return False


def _jax() -> list[Target]:
    import jax

    config: Any = jax.config  # untyped in JAX's stubs
    unsupported = (
        {}
        if config.read("jax_enable_x64")
        else {"float64": "JAX has float64 with x64 only (JAX_ENABLE_X64=1)"}
    )
    devices = jax.devices()
    if devices[0].platform == "cpu":  # CPU devices are one processor (e.g. XLA's forced count): one will do
        devices = devices[:1]
    return [Target(f"{d.platform}:{d.id}", _maker("jax", d), unsupported) for d in devices]


def _cupy() -> list[Target]:
    cupy: Any = importlib.import_module("cupy")  # as Any: the lint environment lacks cupy

    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver, no device: CuPy raises rather than returning 0
        raise Skip(f"no CUDA device ({error_text(exc)})") from exc
    if count == 0:
        raise Skip("no CUDA device")

    def target(index: int) -> Target:  # arrays on the current device: see scope
        return Target(
            f"cuda:{index}", _maker("cupy"), {"bfloat16": _NO_BFLOAT16}, lambda: cupy.cuda.Device(index)
        )

    return [target(i) for i in range(count)]


def _array_api_strict() -> list[Target]:
    import array_api_strict as xp

    device = xp.__array_namespace_info__().default_device()
    # str(device) is "array_api_strict.Device('CPU_DEVICE')": keep the name only.
    label = re.sub(r"^.*\('(.*)'\)$", r"\1", str(device))
    no_sixteen = "the standard has no 16-bit floats"
    return [
        Target(label, _maker("array-api-strict", device), {"float16": no_sixteen, "bfloat16": no_sixteen})
    ]


_PROBES: dict[str, Callable[[], list[Target]]] = {
    "numpy": _numpy,
    "torch": _torch,
    "mlx": _mlx,
    "jax": _jax,
    "cupy": _cupy,
    "dask": _dask,
    "array-api-strict": _array_api_strict,  # the name nox, pytest and backends/ use
}

BACKENDS: tuple[Backend, ...] = tuple(
    Backend(name, lib.module, lib.distributions, probe, lib.install, lib.namespace)
    for name, probe in _PROBES.items()
    for lib in (LIBRARIES[name],)
)


def distribution_version(distributions: Sequence[str]) -> str:
    """The version of the first of ``distributions`` that is installed, or "unknown"."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"
