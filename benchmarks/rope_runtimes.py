"""How each array library makes arrays, copies them, finishes its work and is timed.

Imported only in pyperf's worker processes, and each library only by its own maker. Index
arrays and waiting for a result are anyrope's per-library glue (``rope_cases.arrays``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anyrope import _arrays as arrays
else:  # loaded from its file, without importing anyrope: see rope_cases
    from rope_cases import arrays

Call = Callable[[], Any]


def _wall_clock(call: Call, finish: Callable[[Any], None], loops: int) -> float:
    """Seconds for ``loops`` calls, each awaited (lazy and asynchronous libraries included)."""
    start = time.perf_counter()
    for _ in range(loops):
        finish(call())
    return time.perf_counter() - start


@dataclass(frozen=True)
class Runtime:
    """What the benchmark needs from an array library, behind one interface."""

    name: str
    library: str
    module: ModuleType
    make: Callable[[tuple[int, ...], str, int], Any]  # (dims, dtype, seed) -> array
    index: Callable[[Any], Any]  # nested ints -> an integer array on the device
    copy: Callable[[Any], Any]  # one pass over x (rope_cases.BackendSpec.copy says which)
    finish: Callable[[Any], None] = lambda _result: None  # wait for the result to exist
    scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
    compile_note: str = ""
    torch_device: str | None = None  # for the torch peers
    # seconds for `loops` calls; GPU runtimes time with device events instead of the wall clock
    time_loops: Callable[[Call, Callable[[Any], None], int], float] = _wall_clock


def _numpy() -> Runtime:
    np = importlib.import_module("numpy")

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        return np.random.default_rng(seed).standard_normal(dims, dtype=np.float32).astype(dtype)

    return Runtime(
        "numpy", "numpy", np, make, index=lambda values: arrays.asarray("numpy", values, "int64"),
        copy=lambda x: x.copy(),
    )  # fmt: skip


def device_events(
    new_event: Callable[[], Any], synchronize: Callable[[], None], elapsed_ms: Callable[[Any, Any], float]
) -> Callable[[Call, Callable[[Any], None], int], float]:
    """A ``time_loops`` that times the device's work with two events, not the host's wall clock."""

    def time_loops(call: Call, _finish: Callable[[Any], None], loops: int) -> float:
        start, end = new_event(), new_event()
        synchronize()
        start.record()
        for _ in range(loops):
            call()
        end.record()
        end.synchronize()
        return float(elapsed_ms(start, end)) / 1e3

    return time_loops


def _torch(device: str) -> Runtime:
    # Inductor otherwise starts a pool of compile subprocesses after a compile, and their start-up
    # (each imports torch) takes the CPUs from the timings that follow on a small machine.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    torch = importlib.import_module("torch")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(*dims, generator=gen, device=device, dtype=torch.float32)
        return x.to(getattr(torch, dtype))

    return Runtime(
        "torch-cuda" if device == "cuda" else "torch", "torch", torch, make,
        index=lambda values: arrays.asarray("torch", values, "int64", device),
        copy=lambda x: x.clone(), finish=lambda result: arrays.synchronize("torch", result, device),
        scope=torch.inference_mode,
        compile=lambda fn: torch.compile(fn, fullgraph=True), compile_note="torch.compile(fullgraph=True)",
        torch_device=device, time_loops=device_events(
            lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize,
            lambda start, end: start.elapsed_time(end),
        ) if device == "cuda" else _wall_clock,
    )  # fmt: skip


def _mlx() -> Runtime:
    mx = importlib.import_module("mlx.core")

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        x = mx.random.normal(dims, key=mx.random.key(seed)).astype(getattr(mx, dtype))
        mx.eval(x)
        return x

    return Runtime(
        "mlx", "mlx", mx, make, index=lambda values: arrays.asarray("mlx", values, "int32"),
        copy=lambda x: x * 1, finish=lambda result: arrays.synchronize("mlx", result),
        compile=mx.compile, compile_note="mx.compile",
    )  # fmt: skip


def _jax() -> Runtime:
    jax = importlib.import_module("jax")
    jnp = importlib.import_module("jax.numpy")
    cpu = jax.devices("cpu")[0]

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        x = jax.random.normal(jax.random.key(seed), dims, dtype=jnp.float32).astype(getattr(jnp, dtype))
        return jax.device_put(x, cpu).block_until_ready()

    # One compiled XLA copy into a new buffer (a fresh buffer pointer each call, at about a
    # bandwidth-bound time): the eager jnp.array(x, copy=True) adds a dispatch to the same copy.
    return Runtime(
        "jax", "jax", jax, make,
        # int32: without x64 (JAX's default) an int64 request is truncated to int32, with a warning
        index=lambda values: arrays.asarray("jax", values, "int32", cpu),
        copy=jax.jit(lambda x: x.copy()),
        finish=lambda result: arrays.synchronize("jax", result), scope=lambda: jax.default_device(cpu),
        compile=jax.jit, compile_note="jax.jit",
    )  # fmt: skip


def _cupy() -> Runtime:
    cupy = importlib.import_module("cupy")
    if int(cupy.cuda.runtime.getDeviceCount()) == 0:
        raise RuntimeError("CuPy finds no CUDA device")

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        return cupy.random.default_rng(seed).standard_normal(dims, dtype=cupy.float32).astype(dtype)

    def synchronize() -> None:
        arrays.synchronize("cupy", None)

    return Runtime(
        "cupy", "cupy", cupy, make, index=lambda values: arrays.asarray("cupy", values, "int64"),
        copy=lambda x: x.copy(),
        finish=lambda _result: synchronize(),
        time_loops=device_events(cupy.cuda.Event, synchronize, cupy.cuda.get_elapsed_time),
    )  # fmt: skip


MAKERS: dict[str, Callable[[], Runtime]] = {
    "numpy": _numpy,
    "torch": lambda: _torch("cpu"),
    "torch-cuda": lambda: _torch("cuda"),
    "mlx": _mlx,
    "jax": _jax,
    "cupy": _cupy,
}


def make_runtime(name: str) -> Runtime:
    """Import the backend's library and describe it."""
    if name not in MAKERS:
        raise ValueError(f"backend must be one of {', '.join(MAKERS)}, got {name!r}")
    return MAKERS[name]()
