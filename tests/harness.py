"""The backends under test: read from backends/*/backend.toml, with per-library glue for tests.

Making arrays and reading them back is the per-library glue of ``anyrope._arrays``, which the
self-check and the benchmarks share; taking gradients and compiling are test-only here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from anyrope import _arrays

from backend_toml import load
from oracle import TOLERANCE

MODES = ("eager", "compiled", "dynamic")  # dynamic: torch.compile with dynamic shapes


SPECS = load()


def target_ids() -> dict[str, tuple[str, str]]:
    """Every testable id -> (backend name, device kind): "torch", "torch-cuda", "mlx", ..."""
    ids = {}
    for name, spec in SPECS.items():
        devices = spec["devices"]
        ids[name] = (name, devices[0])
        for device in devices[1:]:
            ids[f"{name}-{device}"] = (name, device)
    return ids


def deviations_of(target: str) -> dict[str, dict[str, Any]]:
    """The known deviations of one target: its backend's, less those that name other devices
    (``devices = ["cuda"]``: on CUDA alone)."""
    name, kind = target_ids()[target]
    found: dict[str, dict[str, Any]] = SPECS[name].get("deviations", {})
    return {feature: d for feature, d in found.items() if kind in d.get("devices", [kind])}


def installed(name: str) -> bool:
    return _arrays.is_installed(SPECS[name]["module"])


def default_ids() -> list[str]:
    """Every installed backend on its first device, GPU-only ones excepted."""
    return [name for name, spec in SPECS.items() if not spec.get("gpu-only") and installed(name)]


def _probe(code: str) -> bool:
    """Run a backend.toml probe (Python that prints True or False) in this process."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(code, {})  # noqa: S102 - the project's own data
    return "True" in buffer.getvalue()


@dataclass
class Backend:
    """One library on one device, as the tests see it."""

    id: str
    name: str
    device_kind: str
    xp: Any
    device: Any
    dtypes: list[str]
    autograd: bool
    compilers: list[str] = field(default_factory=list)
    deviations: dict[str, dict[str, str]] = field(default_factory=dict)

    def dtype(self, name: str) -> Any:
        if self.name == "dask":  # NumPy's dtypes (the standard's namespace has no float16)
            return np.dtype(name)
        return getattr(self.xp, name)

    @property
    def host_values(self) -> bool:
        """Whether anyrope reads this backend's integer values on the host (NumPy arrays, CPU torch
        tensors outside tracing): there host-known checks and cached rows apply."""
        return self.name == "numpy" or (self.name == "torch" and self.device_kind == "cpu")

    @property
    def index(self) -> str:
        """The widest integer dtype: int32 for JAX without x64."""
        return "int64" if self.name != "jax" or "float64" in self.dtypes else "int32"

    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """A NumPy array (or nested list) on this backend, in ``dtype`` (default: a's own)."""
        a = np.asarray(a)
        if dtype is None:
            dtype = str(a.dtype)
            if dtype == "int64":
                dtype = self.index
        return _arrays.asarray(self.name, a, dtype, self.device)

    def to_numpy(self, x: Any) -> np.ndarray:
        """A backend array as float64/int NumPy (16-bit floats widened exactly)."""
        xp = self.xp
        if xp.isdtype(x.dtype, "real floating") and x.dtype != self.dtype("float64"):
            x = xp.astype(x, xp.float32)
        return _arrays.to_numpy(self.name, x)  # type: ignore[no-any-return]

    def vjp(self, fn: Callable[[Any], Any], x: Any, cotangent: Any) -> Any:
        """The vector-Jacobian product of ``fn`` at ``x`` with ``cotangent``."""
        if self.name == "torch":
            x = x.detach().clone().requires_grad_(True)
            fn(x).backward(cotangent)
            return x.grad
        if self.name == "mlx":
            mx = importlib.import_module("mlx.core")
            _, (grad,) = mx.vjp(lambda t: fn(t), [x], [cotangent])
            return grad
        if self.name == "jax":
            jax = importlib.import_module("jax")
            _, pullback = jax.vjp(fn, x)
            return pullback(cotangent)[0]
        raise NotImplementedError(f"{self.name} has no autograd")

    def compile(self, fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
        """``fn`` as ``mode`` runs it: eager, compiled (the backend's compiler) or, for torch, compiled
        with dynamic shapes. Array arguments are traced; closed-over Python values are constants.

        torch's static mode runs inductor, so values come from generated code; the dynamic mode
        traces with symbolic shapes (dynamo and AOT autograd over fake tensors, which is where
        guards and reads of values would break) and runs the traced graph, which keeps a suite of
        hundreds of compilations within minutes on two cores."""
        if mode == "eager":
            return fn
        if self.name == "torch":
            import torch

            backend = "aot_eager" if mode == "dynamic" else "inductor"
            return torch.compile(fn, fullgraph=True, dynamic=mode == "dynamic", backend=backend)  # type: ignore[no-any-return]
        if mode == "dynamic":
            pytest.skip(f"dynamic shapes are torch.compile's ({self.name} traces per shape)")
        if self.name == "jax":
            return importlib.import_module("jax").jit(fn)  # type: ignore[no-any-return]
        if self.name == "mlx":
            return importlib.import_module("mlx.core").compile(fn)  # type: ignore[no-any-return]
        pytest.skip(f"{self.name} has no compiler")


def make_backend(target: str) -> Backend:
    """Import and set up one target id; raises ``LookupError`` with the reason if unavailable."""
    import array_api_compat

    name, kind = target_ids()[target]
    spec = SPECS[name]
    if not installed(name):
        raise LookupError(f"{name} is not installed ({spec['user-install']})")
    module = importlib.import_module(spec["module"])
    device: Any = None
    if name == "torch":
        if kind == "cuda" and not module.cuda.is_available():
            raise LookupError("torch has no CUDA device here")
        device = module.device("cuda" if kind == "cuda" else "cpu")
    elif name == "cupy":
        try:
            count = module.cuda.runtime.getDeviceCount()
        except module.cuda.runtime.CUDARuntimeError as exc:
            raise LookupError(f"cupy cannot reach a CUDA device: {exc}") from None
        if not count:
            raise LookupError("cupy sees no CUDA device")
    probe = _arrays.asarray(name, [0.0], "float32", device)
    from anyrope._compat import array_namespace, device_of

    xp = array_namespace(x=probe)
    if device is None:
        device = device_of(xp, probe)
    assert array_api_compat.is_array_api_obj(probe)
    probes = spec.get("probe", {})
    dtypes = [d for d in spec["dtypes"] if d not in probes or _probe(probes[d])]
    return Backend(
        id=target,
        name=name,
        device_kind=kind,
        xp=xp,
        device=device,
        dtypes=dtypes,
        autograd=bool(spec.get("autograd")),
        compilers=list(spec.get("compilers", [])),
        deviations=deviations_of(target),
    )


def assert_same(backend: Backend, actual: Any, expected: Any, dtype: str, *, compiled: bool = False) -> None:
    """Two forms of one rotation agree bit for bit, or to the dtype's rounding where the backend
    declares the "bitwise-forms" deviation (a compiler that fuses each form its own way), or,
    for a compiled call against the eager one, "bitwise-compiled"."""
    want = backend.to_numpy(expected)
    if "bitwise-forms" in backend.deviations or (compiled and "bitwise-compiled" in backend.deviations):
        assert_close(backend, actual, want, dtype)
    else:
        np.testing.assert_array_equal(backend.to_numpy(actual), want)


# How far a fused prologue that sums a head's squares in an order of its own (Triton's: see
# anyrope._kernels._triton_prologue) may be from the steps apart, in units in the last place of
# each head's largest value: its inverse RMS may be an ulp or so off torch's, then every feature
# is scaled by it and rounded, and the rotation adds two such features. 16-bit dtypes round the
# difference away but for one ulp.
PROLOGUE_ULPS = {"float16": 1, "bfloat16": 1, "float32": 4, "float64": 4}


def canary_cache(
    backend: Backend,
    layout: str,
    dtype: str,
    head_dim: int,
    *,
    batch: int,
    kv_heads: int,
    rows: int,
    canary: float,
) -> Any:
    """An anyrope.KVCache of k and v filled with ``canary``: ``rows`` rows per batch row, or
    (paged) 8 pages of 4 slots."""
    import anyrope

    shape = {
        "bhsd": (batch, kv_heads, rows, head_dim), "bshd": (batch, rows, kv_heads, head_dim),
        "paged_nhd": (8, 4, kv_heads, head_dim), "paged_hnd": (8, kv_heads, 4, head_dim),
    }[layout]  # fmt: skip
    full = np.full(shape, canary)
    return anyrope.KVCache(backend.asarray(full, dtype), backend.asarray(full, dtype), layout=layout)


def prologue_arrays(
    backend: Backend, rng: np.random.Generator, dtype: str, head_dim: int, *, rounding: str | None,
    offset: float, per_head: bool, seq_axis: int, shape: tuple[int, int, int, int],
) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """q, k and v of a prologue call, ``shape`` ``(batch, heads, kv_heads, seq)``, laid out by
    ``seq_axis``, of three times standard normal values; and a QKNorm of random weights (one
    row per k head where ``per_head``), or None without a ``rounding``."""
    import anyrope

    batch, heads, kv_heads, seq = shape

    def axes(h: int) -> tuple[int, ...]:
        return (batch, h, seq, head_dim) if seq_axis == -2 else (batch, seq, h, head_dim)

    q, k, v = (backend.asarray(3 * rng.standard_normal(axes(h)), dtype) for h in (heads, kv_heads, kv_heads))
    if rounding is None:
        return q, k, v, None
    k_weight = rng.standard_normal((kv_heads, head_dim) if per_head else (head_dim,))
    norm = anyrope.QKNorm(
        backend.asarray(rng.standard_normal(head_dim), dtype), backend.asarray(k_weight, dtype),
        eps=1e-6, offset=offset, rounding=rounding,
    )  # fmt: skip
    return q, k, v, norm


def skip_unless_it_runs(backend: Backend, what: str, devices: frozenset[str], available: bool) -> Backend:
    """The backend, for a kernel declared for ``devices`` (Triton's: CUDA, and the CPU under its
    interpreter); the test skipped elsewhere, or where its library is not installed."""
    from anyrope._compat import environment

    device_type = environment(backend.xp, backend.device).device_type
    if device_type not in devices:
        pytest.skip(f"{what} runs on {device_type} only under TRITON_INTERPRET=1")
    if not available:
        pytest.skip("triton is not installed")
    return backend


def count_prologue_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time anyrope.prologue checks a call's arguments in full
    (its first call of a signature; kept calls check only their values)."""
    from anyrope import _prologue

    checks: list[int] = []
    checked = _prologue._checked

    def counted(*args: Any) -> Any:
        checks.append(1)
        return checked(*args)

    monkeypatch.setattr(_prologue, "_checked", counted)
    return checks


def prologue_exact(library: str, device_type: str) -> bool:
    """Whether anyrope.prologue's calls of this library and device equal their steps apart bit
    for bit: not where a fusion declared inexact takes them."""
    from anyrope._kernels import FUSIONS

    return not any(
        not f.exact and f.available and library in f.libraries and device_type in f.devices for f in FUSIONS
    )


def assert_prologue_same(got: np.ndarray, want: np.ndarray, dtype: str, *, exact: bool) -> None:
    """A prologue's q or k (host arrays, 16-bit floats widened to float32) as its steps apart's:
    bit for bit where ``exact``, else within PROLOGUE_ULPS of each head's largest value."""
    if exact:
        np.testing.assert_array_equal(got, want)
        return
    wide = np.asarray(want, dtype=np.float64)
    largest = np.max(np.abs(wide), axis=-1, keepdims=True)
    bits = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}[dtype]
    ulp = np.exp2(np.floor(np.log2(np.maximum(largest, np.finfo(np.float64).tiny))) - bits)
    err = np.abs(np.asarray(got, dtype=np.float64) - wide) / ulp
    assert float(err.max(initial=0.0)) <= PROLOGUE_ULPS[dtype], f"{dtype}: {err.max():.3g} ulps"


def assert_close(
    backend: Backend, actual: Any, expected: np.ndarray, dtype: str, *, scale: float | None = None
) -> None:
    """``actual`` (a backend array) within the dtype's tolerance of the float64 ``expected``."""
    got = backend.to_numpy(actual).astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"shape {got.shape} != {expected.shape}"
    size = scale if scale is not None else max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    err = float(np.max(np.abs(got - expected), initial=0.0))
    assert err <= TOLERANCE[dtype] * size, f"{dtype}: max error {err:.3g} > {TOLERANCE[dtype] * size:.3g}"


def compiled_nodes(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None) -> list[Any]:
    """The operator nodes (``call_function``) of the forward graph that AOTAutograd traces for
    inductor from what torch.compile captures of ``fn(*args)``: a call that dynamo hands on
    whole (see anyrope._torch_ops.hand_on) is traced there, so its operators are these, not
    dynamo's."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    seen: list[Any] = []

    def forward(graph: Any, example_inputs: Any) -> Any:
        seen.extend(node for node in graph.graph.nodes if node.op == "call_function")
        return make_boxed_func(graph.forward)

    def capture(graph: Any, example_inputs: Any) -> Any:
        return aot_module_simplified(graph, example_inputs, fw_compiler=forward)

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True, dynamic=dynamic)(*args)
    return seen


def compiled_ops(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None) -> list[str]:
    """The names of :func:`compiled_nodes`' operators."""
    return [str(node.target) for node in compiled_nodes(fn, *args, dynamic=dynamic)]
