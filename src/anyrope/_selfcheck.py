"""``python -m anyrope``: find the installed array libraries and check RoPE on each of their devices.

Nothing is imported up front: a library is found with :func:`importlib.util.find_spec` and only
imported when its turn comes, so a broken install shows up as one failed row instead of a crash.
Results are compared with an oracle written in plain Python (``math`` only), so the check does
not lean on NumPy or on anyrope's own reference code.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import platform
import random
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from ._compat import array_namespace
from ._layout import to_layout
from ._registry import kernels
from ._rope import RoPE
from ._version import __version__

__all__ = ["BACKENDS", "Row", "rope_oracle", "run"]

Nested = list[Any]  # nested Python lists of floats, shape SHAPE
Status = Literal["ok", "FAIL", "skipped"]

#: (batch, heads, seq, head_dim) of the test input; small, so every backend answers in milliseconds.
SHAPE = (2, 3, 5, 8)
BASE = 10000.0
OFFSET = 5
PARTIAL = 4  # the partial-rotary case rotates half of each head
# Absolute, for inputs in [-1, 1] and outputs below sqrt(2): float32 and float64 round once; a
# 16-bit result and the oracle's, each rounded to the dtype, differ by up to two of its steps
# near sqrt(2) (float16: 2**-10 each; bfloat16: 2**-7 each, its inputs rounded too).
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 2.0**-9, "bfloat16": 2.0**-5}
CHECKS = ("oracle, half", "oracle, interleaved", "layout equivalence")


class Skip(Exception):
    """Raised by a probe when the library imports but has nothing to run on (e.g. no GPU)."""


@dataclass(frozen=True)
class Target:
    """One device of one library: how to make arrays there, and which dtypes it can do."""

    device: str
    make: Callable[[Nested, str], Any]  # (nested lists, dtype name) -> array on this device
    unsupported: dict[str, str] = field(default_factory=dict)  # dtype name -> why not
    scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


@dataclass(frozen=True)
class Backend:
    """An array library: the module that says it is installed, its distributions and its probe."""

    name: str
    module: str
    distributions: tuple[str, ...]
    probe: Callable[[], list[Target]]  # imports the library; raises Skip or any import error
    install: str


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    backend: str
    version: str
    device: str
    dtype: str
    check: str
    status: Status
    detail: str = ""

    @property
    def result(self) -> str:
        return f"{self.status} ({self.detail})" if self.detail else self.status


# --- the oracle -------------------------------------------------------------------------------


def sample(shape: Sequence[int] = SHAPE, seed: int = 0) -> Nested:
    """Fixed pseudo-random input as nested lists.

    Values are multiples of 1/1024 in [-1, 1], exact in float32, so the oracle sees the very
    numbers the backend holds whatever the dtype.
    """
    rng = random.Random(seed)

    def build(dims: Sequence[int]) -> Nested:
        if len(dims) == 1:
            return [rng.randint(-1024, 1024) / 1024 for _ in range(dims[0])]
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(shape)


def rope_oracle(x: Nested, *, rotary_dim: int, layout: str, offset: int = 0, base: float = BASE) -> Nested:
    """RoPE of a ``(batch, heads, seq, head_dim)`` nested list, straight from the definition.

    Pair i turns by ``p * base ** (-2i / rotary_dim)`` at position ``p = offset + s``; "half" pairs
    features (i, i + r/2), "interleaved" pairs (2i, 2i + 1); (a, b) -> (a cos - b sin, b cos + a sin).
    Features from ``rotary_dim`` on are copied unchanged.
    """
    half = rotary_dim // 2
    pairs = [(i, i + half) if layout == "half" else (2 * i, 2 * i + 1) for i in range(half)]
    theta = [base ** (-2 * i / rotary_dim) for i in range(half)]
    out: Nested = []
    for batch in x:
        out.append([])
        for head in batch:
            out[-1].append([])
            for s, vector in enumerate(head):
                rotated = list(vector)
                for (ia, ib), t in zip(pairs, theta, strict=True):
                    angle = (offset + s) * t
                    c, sn = math.cos(angle), math.sin(angle)
                    a, b = vector[ia], vector[ib]
                    rotated[ia], rotated[ib] = a * c - b * sn, b * c + a * sn
                out[-1][-1].append(rotated)
    return out


# --- the checks -------------------------------------------------------------------------------

Cases = list[tuple[int, int]]  # (rotary_dim, offset)
CASES: Cases = [(SHAPE[-1], 0), (PARTIAL, 0), (SHAPE[-1], OFFSET), (PARTIAL, OFFSET)]


def _describe(rotary_dim: int, offset: int) -> str:
    return f"rotary_dim={rotary_dim}, offset={offset}"


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest ``|a - b|``, computed by the arrays' own library; inf when the shapes differ."""
    if tuple(a.shape) != tuple(b.shape):
        return math.inf
    xp = array_namespace(a=a, b=b)
    if a.dtype != xp.float64:  # 16-bit differences in float32: exact, and every library has it
        a, b = xp.astype(a, xp.float32), xp.astype(b, xp.float32)
    return float(xp.max(xp.abs(a - b)))


def check_oracle(make: Callable[[Nested, str], Any], dtype: str, layout: str) -> tuple[float, str]:
    """Worst error of :class:`anyrope.RoPE` against :func:`rope_oracle`, and the case it occurred in."""
    data = sample()
    x = make(data, dtype)
    worst = (0.0, "")
    for rotary_dim, offset in CASES:
        rope = RoPE(SHAPE[-1], base=BASE, rotary_dim=rotary_dim, layout=layout)
        out = rope(x, offset=offset)
        if out.dtype != x.dtype:
            return math.inf, f"dtype {x.dtype} came back as {out.dtype}, {_describe(rotary_dim, offset)}"
        expected = make(rope_oracle(data, rotary_dim=rotary_dim, layout=layout, offset=offset), dtype)
        error = max_abs_diff(out, expected)
        if math.isnan(error):  # NaN compares False with everything: report it at once
            return error, _describe(rotary_dim, offset)
        if error > worst[0]:
            worst = (error, _describe(rotary_dim, offset))
    return worst


def check_layouts(make: Callable[[Nested, str], Any], dtype: str) -> tuple[float, str]:
    """Worst gap between rotating in "half" then permuting, and permuting then rotating in "interleaved"."""
    x = make(sample(), dtype)
    worst = (0.0, "")
    for rotary_dim, offset in CASES:
        half = RoPE(SHAPE[-1], base=BASE, rotary_dim=rotary_dim, layout="half")
        inter = RoPE(SHAPE[-1], base=BASE, rotary_dim=rotary_dim, layout="interleaved")
        left = to_layout(half(x, offset=offset), "half", "interleaved", rotary_dim=rotary_dim)
        right = inter(to_layout(x, "half", "interleaved", rotary_dim=rotary_dim), offset=offset)
        error = max_abs_diff(left, right)
        if math.isnan(error):
            return error, _describe(rotary_dim, offset)
        if error > worst[0]:
            worst = (error, _describe(rotary_dim, offset))
    return worst


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= 160 else text[:157] + "..."


def check_target(name: str, version: str, target: Target) -> Iterator[Row]:
    """Every check on every dtype of one device, as report rows."""
    for dtype, tolerance in TOLERANCE.items():
        if dtype in target.unsupported:
            yield Row(name, version, target.device, dtype, "all", "skipped", target.unsupported[dtype])
            continue
        for check in CHECKS:
            try:
                with target.scope():
                    if check == "layout equivalence":
                        error, case = check_layouts(target.make, dtype)
                    else:
                        error, case = check_oracle(target.make, dtype, check.removeprefix("oracle, "))
            except Exception as exc:  # noqa: BLE001 - a backend bug is a result to report, not a crash
                yield Row(name, version, target.device, dtype, check, "FAIL", _error_text(exc))
                continue
            if error <= tolerance:
                yield Row(name, version, target.device, dtype, check, "ok")
            else:
                yield Row(
                    name, version, target.device, dtype, check, "FAIL", f"max error {error:.3g} at {case}"
                )


# --- the backends -----------------------------------------------------------------------------
# Each probe imports its library and lists its devices. Arrays are made with the library's own
# constructor so that the checks exercise anyrope on arrays exactly as users would pass them.


def _numpy() -> list[Target]:
    import numpy as np

    return [
        Target(
            "cpu", lambda data, dtype: np.asarray(data, dtype=getattr(np, dtype)), {"bfloat16": _NO_BFLOAT16}
        )
    ]


_NO_BFLOAT16 = "no bfloat16 in this library"


def _dask() -> list[Target]:
    import numpy as np

    da: Any = importlib.import_module("dask.array")  # as Any: the lint environment lacks dask

    def make(data: Nested, dtype: str) -> Any:  # chunked, so the check crosses chunk borders
        return da.from_array(np.asarray(data, dtype=getattr(np, dtype)), chunks=(1, 2, 2, -1))

    return [Target("cpu", make, {"bfloat16": _NO_BFLOAT16})]


def _torch() -> list[Target]:
    import torch

    def target(device: str, unsupported: dict[str, str] | None = None) -> Target:
        def make(data: Nested, dtype: str) -> Any:
            return torch.tensor(data, dtype=getattr(torch, dtype), device=device)

        return Target(device, make, unsupported or {})

    targets = [target("cpu")]
    if torch.cuda.is_available():
        targets += [target(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        targets.append(target("mps", {"float64": "MPS has no float64"}))
    return targets


def _mlx() -> list[Target]:
    import mlx.core as mx

    def make(data: Nested, dtype: str) -> Any:
        return mx.array(data, dtype=getattr(mx, dtype))

    def target(device: Any, label: str, unsupported: dict[str, str] | None = None) -> Target:
        # MLX arrays live in unified memory; the device is where operations run, set per stream.
        return Target(label, make, unsupported or {}, lambda: mx.stream(device))

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
    import jax.numpy as jnp

    config: Any = jax.config  # untyped in JAX's stubs
    unsupported = (
        {}
        if config.read("jax_enable_x64")
        else {"float64": "JAX has float64 with x64 only (JAX_ENABLE_X64=1)"}
    )

    def target(device: Any) -> Target:
        def make(data: Nested, dtype: str) -> Any:
            return jax.device_put(jnp.asarray(data, dtype=getattr(jnp, dtype)), device)

        return Target(f"{device.platform}:{device.id}", make, unsupported)

    devices = jax.devices()
    if devices[0].platform == "cpu":  # CPU devices are one processor (e.g. XLA's forced count): one will do
        devices = devices[:1]
    return [target(device) for device in devices]


def _cupy() -> list[Target]:
    import cupy

    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver, no device: CuPy raises rather than returning 0
        raise Skip(f"no CUDA device ({_error_text(exc)})") from exc
    if count == 0:
        raise Skip("no CUDA device")

    def make(data: Nested, dtype: str) -> Any:
        return cupy.asarray(data, dtype=getattr(cupy, dtype))  # on the current device: see scope

    def target(index: int) -> Target:
        return Target(f"cuda:{index}", make, {"bfloat16": _NO_BFLOAT16}, lambda: cupy.cuda.Device(index))

    return [target(i) for i in range(count)]


def _array_api_strict() -> list[Target]:
    import array_api_strict as xp

    device = xp.__array_namespace_info__().default_device()

    def make(data: Nested, dtype: str) -> Any:
        return xp.asarray(data, dtype=getattr(xp, dtype), device=device)

    # str(device) is "array_api_strict.Device('CPU_DEVICE')": keep the name only.
    label = re.sub(r"^.*\('(.*)'\)$", r"\1", str(device))
    no_sixteen = "the standard has no 16-bit floats"
    return [Target(label, make, {"float16": no_sixteen, "bfloat16": no_sixteen})]


BACKENDS: tuple[Backend, ...] = (
    Backend("numpy", "numpy", ("numpy",), _numpy, 'pip install "anyrope[numpy]"'),
    Backend("torch", "torch", ("torch",), _torch, 'pip install "anyrope[torch]"'),
    # find_spec("mlx.core") would import the mlx package itself; the probe does that in a try.
    Backend("mlx", "mlx", ("mlx",), _mlx, 'pip install "anyrope[mlx]"'),
    Backend("jax", "jax", ("jax",), _jax, 'pip install "anyrope[jax]"'),
    Backend(
        "cupy",
        "cupy",
        ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"),
        _cupy,
        'pip install "anyrope[cupy]"',
    ),
    Backend("dask", "dask.array", ("dask",), _dask, 'pip install "anyrope[dask]"'),
    Backend(
        "array-api-strict",  # the name nox, pytest and backends/ use
        "array_api_strict",
        ("array-api-strict",),
        _array_api_strict,
        "pip install array-api-strict",
    ),
)


def is_installed(module: str) -> bool:
    """Whether ``module`` can be found, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module with no spec
        return False


def distribution_version(distributions: Sequence[str]) -> str:
    """The version of the first of ``distributions`` that is installed, or "unknown"."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def check_backend(backend: Backend) -> Iterator[Row]:
    """Import ``backend``, list its devices and check each; import errors become a FAIL row."""
    version = distribution_version(backend.distributions)
    try:
        targets = backend.probe()
    except Skip as reason:
        yield Row(backend.name, version, "-", "-", "devices", "skipped", str(reason))
        return
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever a broken install raises
        yield Row(backend.name, version, "-", "-", "import", "FAIL", _error_text(exc))
        return
    for target in targets:
        yield from check_target(backend.name, version, target)


# --- the report -------------------------------------------------------------------------------

HEADER = ("backend", "version", "device", "dtype", "check", "result")


class _Table:
    """Rows printed as they come (a crash mid-way still leaves what was checked), in fixed columns."""

    def __init__(self, out: TextIO, backends: Sequence[Backend]) -> None:
        self._out = out
        versions = [distribution_version(b.distributions) for b in backends]
        self._widths = (
            max([len(HEADER[0]), *(len(b.name) for b in backends)]),
            max([len(HEADER[1]), *(len(v) for v in versions)]),
            len("CPU_DEVICE"),
            len("bfloat16"),
            max(len(c) for c in CHECKS),
        )

    def _line(self, cells: Sequence[str]) -> None:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], self._widths, strict=True)]
        print("  ".join([*padded, cells[-1]]).rstrip(), file=self._out, flush=True)

    def header(self) -> None:
        self._line(HEADER)
        self._line(["-" * w for w in self._widths] + ["-" * len(HEADER[-1])])

    def row(self, row: Row) -> None:
        self._line((row.backend, row.version, row.device, row.dtype, row.check, row.result))


_HINTS = {"numba": 'pip install "anyrope[numba]"', "triton": "pip install triton"}


def fast_paths(installed: Sequence[Backend]) -> list[str]:
    """One line per fused kernel for the installed libraries: where it runs, and whether it can
    (what to install where it cannot)."""

    modules = {backend.module for backend in installed}
    lines = []
    for kernel in kernels()[:-1]:  # the generic kernel, last, runs wherever none of these does
        libraries = kernel.libraries & modules
        if not libraries:
            continue
        where = ", ".join(sorted(libraries)) + (
            f" on {', '.join(sorted(kernel.devices))}" if kernel.devices else ""
        )
        missing = [module for module in kernel.requires if not is_installed(module)]
        state = (
            "available" if not missing else "not available: " + "; ".join(_HINTS.get(m, m) for m in missing)
        )
        lines.append(f"  {kernel.name:<14} {where:<26} {state}")
    return lines


def run(backends: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Check every installed backend (or those named) and print a table of results.

    Parameters
    ----------
    backends : sequence of str, optional
        Names from :data:`BACKENDS` to check; all of them by default.
    out : text stream, optional
        Where the report goes; ``sys.stdout`` by default.

    Returns
    -------
    int
        The exit status: 0 when every check that ran passed, 1 when one failed or none could run.
    """
    out = sys.stdout if out is None else out
    chosen = [b for b in BACKENDS if backends is None or b.name in backends]
    installed = [b for b in chosen if is_installed(b.module)]
    missing = [b for b in chosen if b not in installed]
    print(f"anyrope {__version__}, Python {platform.python_version()} on {sys.platform}", file=out)
    if not installed:
        which = "No array library" if backends is None else "None of the chosen array libraries"
        print(f"{which} is installed, so there is nothing to check. Install one:", file=out)
        for backend in missing:
            print(f"    {backend.install:<32}  # {backend.name}", file=out)
        return 1
    print(file=out)
    table = _Table(out, installed)
    table.header()
    counts = dict.fromkeys(("ok", "FAIL", "skipped"), 0)
    for backend in installed:
        for row in check_backend(backend):
            table.row(row)
            counts[row.status] += 1
    print(file=out)
    lines = fast_paths(installed)
    if lines:
        print("fused kernels (the generic array-API code runs wherever none applies):", file=out)
        for line in lines:
            print(line, file=out)
        print(file=out)
    for backend in missing:
        print(f"not installed: {backend.name} ({backend.install})", file=out)
    print(f"{counts['ok']} checks passed, {counts['FAIL']} failed, {counts['skipped']} skipped", file=out)
    if counts["ok"] == 0 and counts["FAIL"] == 0:
        print("nothing could be checked: no installed library has a usable device", file=out)
        return 1
    return 1 if counts["FAIL"] else 0
