"""``python -m anyrope bench``: time anyrope against a plain copy and against other RoPE implementations.

The driver runs one worker process per backend (``python -m anyrope bench --worker NAME``), so
that one library's threads, allocator and JIT caches never colour another's numbers. Each worker
times, for three cases, every dtype of its library and both layouts:

``prefill``   q only, positions ``0 .. seq - 1``
``decode``    q and k of one new token per sequence, one cache length per row
``small``     q only, ``(1, 8, 16, 64)`` from position 5, while a helper process keeps one core
              busy: the per-call overhead of a small call on a machine that is not idle

and these variants:

``anyrope``            the default call (per-backend fast paths on)
``anyrope-generic``    the same call inside ``anyrope.use_fast_paths(False)``
``anyrope-inplace``    only where the API offers one (``out=`` or ``inplace=``)
``anyrope-compiled``   torch: ``torch.compile(fullgraph=True)`` of the call (decode offsets as a tensor)
``anyrope-jit``        JAX: ``jax.jit`` of the call (decode offsets as a traced int32 array)
``copy``               one elementwise pass over the input: the memory-bandwidth roofline
peers                  transformers, ``torch.compile`` of its formula, rotary-embedding-torch,
                       ``mlx.core.fast.rope``, wherever installed; for NumPy's small case
                       ``numpy-formula``, the textbook formula computed inside the call

Variants of one (shape, dtype, layout) are timed in interleaved rounds, so that a noisy neighbour
slows all of them alike; medians are reported with ratios to the same run's copy (and to a
reference peer), which carry over between machines far better than absolute times on a CPU.
Compiled variants are compiled and warmed up outside the timing.

Each CPU backend's worker also measures the first call in a fresh process: ``import anyrope``,
``RoPE(128)`` and the first call (and the first ``torch.compile`` or ``jax.jit`` call), against
the median of later calls.

The driver merges the workers' JSON, prints a table, writes JSON and, with matplotlib, a plot.
Nothing here imports an array library at module level: each is imported in its worker.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

__all__ = [
    "BACKENDS",
    "Case",
    "add_ratios",
    "busy_cores",
    "first_call",
    "format_table",
    "machine_info",
    "main",
    "merge",
    "naive_formula",
    "plan_cases",
    "run_backend",
]

SCHEMA = 2  # 2: the "small" case, busy_cores in records, first_call
LAYOUTS = ("half", "interleaved")
SHAPES = ("prefill", "decode", "small")
BASE = 10000.0
PREFILL = (1, 32, 4096, 128)  # (batch, heads, seq, head_dim)
PREFILL_QUICK = (1, 8, 1024, 128)
DECODE = (32, 32, 1, 128)  # 32 sequences of one new token each, at different cache lengths
SMALL = (1, 8, 16, 64)  # a short chunk of a small model: the call's overhead, not bandwidth
SMALL_OFFSET = 5
SMALL_BUSY_CORES = 1
FIRST_CALL_DIMS = PREFILL_QUICK
FIRST_CALL_WARM = 10  # later calls whose median is the warm time
FIRST_CALL_TIMEOUT_S = 300.0
REPEAT, REPEAT_QUICK = 15, 5
DECODE_REPEAT, DECODE_REPEAT_QUICK = 200, 50
DECODE_SAMPLE_S = 1e-3  # a decode sample loops the call until it takes at least this long
GROUP_BUDGET_S = 60.0  # stop the rounds of one (shape, dtype, layout) after this, once 3 are in
EVENT = "@@anyrope-bench "  # prefix of the progress lines a worker writes to stdout
VARIANT_ORDER = (
    "copy",
    "anyrope",
    "anyrope-generic",
    "anyrope-inplace",
    "anyrope-compiled",
    "anyrope-jit",
    "numpy-formula",
    "transformers-apply",
    "transformers-full",
    "transformers-compiled",
    "rotary-embedding-torch",
    "mx.fast.rope",
)
# Per backend, the peer that "x ref" divides by, and whether it must be of the row's own layout
# (True) or is taken from the "half" layout, the only one it has (False).
REFERENCES = {"mx.fast.rope": True, "transformers-apply": False, "numpy-formula": True}

Record = dict[str, Any]


def decode_offsets(batch: int) -> list[int]:
    """Cache lengths of the decode batch: one per sequence, ``1000 + 97 i``."""
    return [1000 + 97 * i for i in range(batch)]


@dataclass(frozen=True)
class BackendSpec:
    """A benchmarked backend: the library it runs, its floating dtypes, and whether it needs a GPU."""

    name: str
    module: str
    dtypes: tuple[str, ...]
    gpu: bool = False


BACKENDS = (
    BackendSpec("numpy", "numpy", ("float32", "float16")),
    BackendSpec("torch", "torch", ("float32", "float16", "bfloat16")),
    BackendSpec("mlx", "mlx.core", ("float32", "float16", "bfloat16")),
    BackendSpec("jax", "jax", ("float32", "bfloat16", "float16")),
    BackendSpec("torch-cuda", "torch", ("float32", "float16", "bfloat16"), gpu=True),
    BackendSpec("cupy", "cupy", ("float32", "float16"), gpu=True),
)
_SPECS = {spec.name: spec for spec in BACKENDS}


@dataclass(frozen=True)
class Case:
    """One input shape and how to time it.

    Parameters
    ----------
    name : str
        "prefill" or "small" (q only, positions ``offset .. offset + seq - 1``), or "decode"
        (q and k, one offset per row).
    dims : tuple of int
        ``(batch, heads, seq, head_dim)``.
    repeat : int
        Samples per variant; the median is reported.
    sample_s : float
        A sample repeats the call until it lasts this long (0: one call per sample).
    offset : int
        The first position of q-only cases.
    busy : int
        Cores kept busy by spinning helper processes while the case's groups run.
    """

    name: str
    dims: tuple[int, int, int, int]
    repeat: int
    sample_s: float = 0.0
    offset: int = 0
    busy: int = 0

    @property
    def tensors(self) -> int:
        """Tensors that anyrope and the copy process per call: q, or q and k."""
        return 2 if self.name == "decode" else 1

    @property
    def head_dim(self) -> int:
        """The last axis of q: what the case's RoPE rotates."""
        return self.dims[3]

    @property
    def what(self) -> str:
        """The inputs, in words."""
        if self.offsets is not None:
            return f"q and k, one offset per row: {', '.join(map(str, self.offsets[:2]))}, ... (1000 + 97 i)"
        text = f"q from position {self.offset} (peers that take q and k get both)"
        if self.busy:
            text += f"; {self.busy} core{'s' if self.busy > 1 else ''} kept busy by a spinning process"
        return text

    @property
    def offsets(self) -> list[int] | None:
        """Per-row cache lengths for decode, None for prefill (offset 0)."""
        return decode_offsets(self.dims[0]) if self.name == "decode" else None


def plan_cases(
    *, quick: bool = False, repeat: int | None = None, decode_repeat: int | None = None
) -> list[Case]:
    """The prefill, decode and small cases of a run.

    Parameters
    ----------
    quick : bool
        Smaller prefill shape and fewer samples, for CI-sized runs.
    repeat, decode_repeat : int, optional
        Samples per variant for prefill, and for decode and small (both small calls); defaults
        15 and 200 (5 and 50 when quick).
    """
    prefill_repeat = repeat if repeat is not None else (REPEAT_QUICK if quick else REPEAT)
    decode = decode_repeat if decode_repeat is not None else (DECODE_REPEAT_QUICK if quick else DECODE_REPEAT)
    return [
        Case("prefill", PREFILL_QUICK if quick else PREFILL, prefill_repeat),
        Case("decode", DECODE, decode, DECODE_SAMPLE_S),
        Case("small", SMALL, decode, DECODE_SAMPLE_S, offset=SMALL_OFFSET, busy=SMALL_BUSY_CORES),
    ]


# --- runtimes: how each library makes arrays, copies them and finishes work ---------------------


@dataclass(frozen=True)
class Compiler:
    """A library's compiler of whole calls: the variant it makes and how."""

    variant: str  # "anyrope-compiled", "anyrope-jit"
    compile: Callable[[Callable[..., Any]], Callable[..., Any]]
    note: str


@dataclass
class Runtime:
    """What the worker needs from an array library, behind one interface."""

    name: str
    library: str
    module: ModuleType
    device: str
    make: Callable[[tuple[int, ...], str, int], Any]  # (dims, dtype, seed) -> array
    index: Callable[[Any], Any]  # nested ints -> an integer array on the device
    copy: Callable[[Any], Any]
    copy_note: str
    finish: Callable[[Any], None] = lambda _result: None  # wait for the result to exist
    scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    compiler: Compiler | None = None
    reset: Callable[[], None] = lambda: None  # before each group: drop the previous one's compiles
    torch_device: str | None = None  # for the torch peers
    info: dict[str, Any] = field(default_factory=dict)


class Unavailable(Exception):
    """The backend's library imports but has nothing to run on (e.g. no GPU)."""


def _numpy_runtime() -> Runtime:
    np = importlib.import_module("numpy")

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        return np.random.default_rng(seed).standard_normal(dims, dtype=np.float32).astype(dtype)

    return Runtime(
        "numpy", "numpy", np, "cpu", make,
        index=lambda values: np.asarray(values, dtype=np.int64),
        copy=lambda x: x.copy(), copy_note="x.copy()",
    )  # fmt: skip


def _torch_runtime(device: str) -> Runtime:
    # Inductor otherwise starts a pool of compile subprocesses after a compile, and their start-up
    # (each imports torch) takes the CPUs from the timings that follow on a small machine.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    torch = importlib.import_module("torch")
    if device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("torch sees no CUDA device")
    label = torch.cuda.get_device_name() if device == "cuda" else "cpu"

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(*dims, generator=gen, device=device, dtype=torch.float32)
        return x.to(getattr(torch, dtype))

    def finish(_result: Any) -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def reset() -> None:
        # Every group's RoPE is a new object, so each group recompiles the same code: without a
        # reset, dynamo's recompile limit would send later groups' compiled calls back to eager.
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()

    compiler = Compiler(
        "anyrope-compiled", lambda fn: torch.compile(fn, fullgraph=True), "torch.compile(fullgraph=True)"
    )
    return Runtime(
        "torch-cuda" if device == "cuda" else "torch", "torch", torch, label, make,
        index=lambda values: torch.tensor(values, dtype=torch.int64, device=device),
        copy=lambda x: x.clone(), copy_note="x.clone()", finish=finish, scope=torch.inference_mode,
        compiler=compiler, reset=reset, torch_device=device, info={
            "torch_threads": torch.get_num_threads(),
            "TORCHINDUCTOR_COMPILE_THREADS": os.environ["TORCHINDUCTOR_COMPILE_THREADS"],
        },
    )  # fmt: skip


def _mlx_runtime() -> Runtime:
    mx = importlib.import_module("mlx.core")

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        x = mx.random.normal(dims, key=mx.random.key(seed)).astype(getattr(mx, dtype))
        mx.eval(x)
        return x

    return Runtime(
        "mlx", "mlx", mx, _mlx_device(mx), make,
        index=lambda values: mx.array(values),
        copy=lambda x: x * 1, copy_note="mx.eval(x * 1), one elementwise pass (MLX arrays are immutable)",
        finish=mx.eval,
    )  # fmt: skip


def _mlx_device(mx: Any) -> str:
    device = mx.default_device()
    label = str(getattr(device.type, "name", device))
    with contextlib.suppress(Exception):  # device_info is recent, and says more on Apple GPUs
        name = mx.device_info().get("device_name")
        if name:
            label = f"{label} ({name})"
    return label


def _jax_runtime() -> Runtime:
    jax = importlib.import_module("jax")
    jnp = importlib.import_module("jax.numpy")
    cpu = jax.devices("cpu")[0]

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        x = jax.random.normal(jax.random.key(seed), dims, dtype=jnp.float32).astype(getattr(jnp, dtype))
        return jax.device_put(x, cpu).block_until_ready()

    # One compiled XLA copy into a new buffer (a fresh buffer pointer each call, at about a
    # bandwidth-bound time): the eager jnp.array(x, copy=True) adds a dispatch to the same copy.
    copy = jax.jit(lambda x: x.copy())
    return Runtime(
        "jax", "jax", jax, "cpu", make,
        # int32: without x64 (JAX's default) an int64 request is truncated to int32, with a warning
        index=lambda values: jax.device_put(jnp.asarray(values, dtype=jnp.int32), cpu),
        copy=copy, copy_note="jax.jit(lambda x: x.copy()), a copy into a new buffer",
        finish=jax.block_until_ready, scope=lambda: jax.default_device(cpu),
        compiler=Compiler("anyrope-jit", jax.jit, "jax.jit"),
        info={"jax_enable_x64": bool(jax.config.read("jax_enable_x64"))},
    )  # fmt: skip


def _cupy_runtime() -> Runtime:
    cupy = importlib.import_module("cupy")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver: CuPy raises instead of returning 0
        raise Unavailable(f"CuPy finds no CUDA device ({type(exc).__name__})") from exc
    if count == 0:
        raise Unavailable("CuPy finds no CUDA device")
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def make(dims: tuple[int, ...], dtype: str, seed: int) -> Any:
        return cupy.random.default_rng(seed).standard_normal(dims, dtype=cupy.float32).astype(dtype)

    return Runtime(
        "cupy", "cupy", cupy, name, make,
        index=lambda values: cupy.asarray(values, dtype=cupy.int64),
        copy=lambda x: x.copy(), copy_note="x.copy()",
        finish=lambda _result: cupy.cuda.get_current_stream().synchronize(),
    )  # fmt: skip


def make_runtime(name: str) -> Runtime:
    """Import the backend's library and describe it; raises :class:`Unavailable` without a device."""
    makers: dict[str, Callable[[], Runtime]] = {
        "numpy": _numpy_runtime,
        "torch": lambda: _torch_runtime("cpu"),
        "torch-cuda": lambda: _torch_runtime("cuda"),
        "mlx": _mlx_runtime,
        "jax": _jax_runtime,
        "cupy": _cupy_runtime,
    }
    return makers[name]()


# --- variants: the callables timed for one (case, dtype, layout) ---------------------------------


@dataclass(frozen=True)
class Variant:
    """A callable to time, or the reason it is not timed (``call`` None)."""

    name: str
    call: Callable[[], Any] | None
    tensors: int
    note: str = ""


@dataclass
class Group:
    """The inputs shared by every variant of one (case, dtype, layout)."""

    rt: Runtime
    case: Case
    dtype: str
    layout: str
    q: Any
    k: Any
    offsets: Any  # the decode batch's cache lengths as an integer array of the library, or None
    rope: Any  # anyrope.RoPE

    @property
    def decode(self) -> bool:
        return self.case.name == "decode"

    @property
    def head_dim(self) -> int:
        return self.case.head_dim

    def positions(self) -> list[int] | list[list[int]]:
        """The positions of the case: one per token of q, or for decode one per row."""
        if self.decode:
            return [[offset] for offset in self.case.offsets or []]
        return list(range(self.case.offset, self.case.offset + self.case.dims[2]))


def _skip(name: str, why: str, tensors: int = 1) -> Variant:
    return Variant(name, None, tensors, why)


def _fast_paths_off() -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
    """``anyrope.use_fast_paths(False)`` as a factory, or None in an anyrope without fast paths."""
    import anyrope

    use = getattr(anyrope, "use_fast_paths", None)
    if use is None:
        try:
            use = importlib.import_module("anyrope._fast").use_fast_paths
        except (ImportError, AttributeError):
            return None
    return lambda: use(False)


def _anyrope_call(g: Group) -> Callable[[], Any]:
    rope, q, k, offsets, offset = g.rope, g.q, g.k, g.offsets, g.case.offset
    if g.decode:
        return lambda: rope(q, k, offset=offsets)
    if offset:
        return lambda: rope(q, offset=offset)
    return lambda: rope(q)


def anyrope_variants(g: Group) -> Iterator[Variant]:
    """anyrope as users call it (fast paths on), on the generic path, and in place if it can."""
    call, n = _anyrope_call(g), g.case.tensors
    yield Variant("anyrope", call, n, "default call, fast paths on")
    off = _fast_paths_off()
    if off is None:
        yield _skip("anyrope-generic", "this anyrope has no use_fast_paths", n)
    else:

        def generic() -> Any:
            with off():
                result = call()
                g.rt.finish(result)  # MLX evaluates lazily: inside the block, or it would not count
                return result

        yield Variant("anyrope-generic", generic, n, "inside use_fast_paths(False)")
    yield _inplace_variant(g)


def _inplace_variant(g: Group) -> Variant:
    import anyrope

    n = g.case.tensors
    if g.rt.library in ("mlx", "jax"):
        return _skip("anyrope-inplace", f"{g.rt.library.upper()} arrays are immutable", n)
    if "inplace" in inspect.signature(anyrope.RoPE.__call__).parameters:
        q, k, rope, offsets, offset = g.rt.copy(g.q), g.rt.copy(g.k), g.rope, g.offsets, g.case.offset
        if g.decode:
            return Variant(
                "anyrope-inplace", lambda: rope(q, k, offset=offsets, inplace=True), n, "inplace=True"
            )
        return Variant("anyrope-inplace", lambda: rope(q, offset=offset, inplace=True), n, "inplace=True")
    if "out" in inspect.signature(anyrope.apply).parameters:
        return _apply_out_variant(g)
    return _skip("anyrope-inplace", "no in-place API (no out= on anyrope.apply, no inplace= on RoPE)", n)


def _apply_out_variant(g: Group) -> Variant:
    import anyrope

    positions = g.rt.index(g.positions())
    cos, sin = g.rope.cos_sin(positions, like=g.q)  # tables outside the timing
    layout = g.layout
    inputs = [g.q, g.k] if g.decode else [g.q]
    outs = [g.rt.copy(x) for x in inputs]

    def call() -> Any:
        return [anyrope.apply(x, cos, sin, layout=layout, out=o) for x, o in zip(inputs, outs, strict=True)]

    return Variant("anyrope-inplace", call, len(inputs), "anyrope.apply(..., out=), tables precomputed")


def compiled_anyrope_variant(g: Group) -> Iterator[Variant]:
    """The anyrope call through the library's compiler (torch.compile, jax.jit), warmed up untimed.

    Arrays are the compiled function's inputs, the decode offsets included (an integer array,
    traced), as a model compiled around the call would pass them.
    """
    compiler = g.rt.compiler
    if compiler is None:
        return
    rope, offset, n = g.rope, g.case.offset, g.case.tensors

    def decode(q: Any, k: Any, offsets: Any) -> Any:
        return rope(q, k, offset=offsets)

    def q_only(q: Any) -> Any:
        return rope(q, offset=offset) if offset else rope(q)

    fn: Callable[..., Any] = decode if g.decode else q_only
    args = (g.q, g.k, g.offsets) if g.decode else (g.q,)
    note = ", offsets traced" if g.decode else ""
    try:
        compiled = compiler.compile(fn)
        for _ in range(2):  # the second call may recompile once, when the first filled a memo
            g.rt.finish(compiled(*args))
    except Exception as exc:  # noqa: BLE001 - no compiler, unsupported dtype: a skip with its reason
        yield _skip(compiler.variant, f"{compiler.note} failed: {_short(exc)}", n)
        return
    yield Variant(compiler.variant, lambda: compiled(*args), n, f"{compiler.note} of the call{note}")


def naive_formula(np: ModuleType, x: Any, positions: Any, layout: str, base: float = BASE) -> Any:
    """RoPE as a NumPy user writes it from the paper: frequencies, angles and tables in the call.

    ``positions`` has one entry per row of ``x``'s sequence axis (-2). The tables are cast to
    x's dtype, as such code does to keep float32 in float32.
    """
    d = x.shape[-1]
    inv_freq = base ** (-np.arange(0, d, 2) / d)
    angles = positions[:, None] * inv_freq
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return np.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    cos2, sin2 = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)  # rotate_half
    return x * cos2 + rotated * sin2


def numpy_formula_variant(g: Group) -> Iterator[Variant]:
    """The naive NumPy formula, the reference of NumPy's small case (a call that small is mostly
    overhead, and this is what anyrope's overhead must beat)."""
    if g.rt.library != "numpy" or g.case.name != "small":
        return
    np, q, layout, first, seq = g.rt.module, g.q, g.layout, g.case.offset, g.case.dims[2]
    yield Variant(
        "numpy-formula",
        lambda: naive_formula(np, q, np.arange(first, first + seq), layout),
        1,
        "base ** (-arange(0, d, 2) / d), angles, cos/sin, x * cos + rotate(x) * sin, all in the call",
    )


def copy_variant(g: Group) -> Iterator[Variant]:
    """The roofline: one pass that reads and writes every element once."""
    copy, q, k = g.rt.copy, g.q, g.k
    if g.decode:
        yield Variant("copy", lambda: (copy(q), copy(k)), 2, g.rt.copy_note)
    else:
        yield Variant("copy", lambda: copy(q), 1, g.rt.copy_note)


def _optional(module: str) -> ModuleType | str:
    """The module, or why it cannot be used."""
    try:
        found = importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"{module.split('.')[0]} is not installed"
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install is a skip with its reason
        return f"{module} fails to import: {_short(exc)}"


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= 160 else text[:157] + "..."


def _hf_tables(g: Group, modeling: ModuleType) -> tuple[Any, Any]:
    """transformers' rotary module (Llama's, plain RoPE) and the position ids of the case."""
    torch = g.rt.module
    config = modeling.LlamaConfig(
        hidden_size=g.case.dims[1] * g.head_dim, num_attention_heads=g.case.dims[1], head_dim=g.head_dim,
        max_position_embeddings=8192, rope_theta=BASE,
    )  # fmt: skip
    rotary = modeling.LlamaRotaryEmbedding(config=config).to(g.rt.torch_device)
    position_ids = torch.tensor(g.positions(), device=g.rt.torch_device)
    return rotary, position_ids if g.decode else position_ids[None, :]


def transformers_variants(g: Group) -> Iterator[Variant]:
    """transformers' ``apply_rotary_pos_emb`` on ready tables, and with its rotary module's forward."""
    if g.rt.library != "torch" or g.layout != "half":
        return
    modeling = _optional("transformers.models.llama.modeling_llama")
    if isinstance(modeling, str):
        yield _skip("transformers-apply", modeling, 2)
        return
    rotary, position_ids = _hf_tables(g, modeling)
    apply, q, k = modeling.apply_rotary_pos_emb, g.q, g.k
    cos, sin = rotary(q, position_ids)  # the tables, outside the timing

    def full() -> Any:
        c, s = rotary(q, position_ids)
        return apply(q, k, c, s)

    yield Variant(
        "transformers-apply", lambda: apply(q, k, cos, sin), 2, "apply_rotary_pos_emb, tables ready"
    )
    yield Variant("transformers-full", full, 2, "LlamaRotaryEmbedding forward + apply_rotary_pos_emb")


def compiled_variant(g: Group) -> Iterator[Variant]:
    """``torch.compile`` of transformers' formula, compiled and warmed up outside the timing."""
    if g.rt.library != "torch" or g.layout != "half":
        return
    modeling = _optional("transformers.models.llama.modeling_llama")
    if isinstance(modeling, str):
        return  # said once, by transformers_variants
    torch, rotate_half = g.rt.module, modeling.rotate_half

    def formula(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    rotary, position_ids = _hf_tables(g, modeling)
    q, k = g.q, g.k
    cos, sin = rotary(q, position_ids)
    try:
        compiled = torch.compile(formula, dynamic=False)
        for _ in range(2):
            compiled(q, k, cos, sin)
        g.rt.finish(None)
    except Exception as exc:  # noqa: BLE001 - no compiler, unsupported dtype: a skip with its reason
        yield _skip("transformers-compiled", f"torch.compile failed: {_short(exc)}", 2)
        return
    yield Variant("transformers-compiled", lambda: compiled(q, k, cos, sin), 2, "torch.compile(formula)")


def rotary_embedding_torch_variant(g: Group) -> Iterator[Variant]:
    """lucidrains' rotary-embedding-torch, whose layout is the interleaved one."""
    if g.rt.library != "torch" or g.layout != "interleaved":
        return
    ret = _optional("rotary_embedding_torch")
    if isinstance(ret, str):
        yield _skip("rotary-embedding-torch", ret)
        return
    torch = g.rt.module
    rot = ret.RotaryEmbedding(dim=g.head_dim, theta=BASE).to(g.rt.torch_device)
    q, k, offset = g.q, g.k, g.case.offset
    if not g.decode:
        yield Variant("rotary-embedding-torch",
                      lambda: rot.rotate_queries_or_keys(q, seq_dim=-2, offset=offset), 1,
                      "rotate_queries_or_keys (frequencies cached)")  # fmt: skip
        return
    # rotate_queries_or_keys takes one offset for the batch: per-row positions go through forward.
    positions = torch.tensor(g.case.offsets, device=g.rt.torch_device, dtype=torch.float32)[:, None]

    def per_row() -> Any:
        freqs = rot(positions)[:, None]  # (batch, 1, seq, dim) against (batch, heads, seq, dim)
        return ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)

    yield Variant("rotary-embedding-torch", per_row, 2, "forward(positions) + apply_rotary_emb per row")


def mlx_fast_variant(g: Group) -> Iterator[Variant]:
    """``mlx.core.fast.rope``, MLX's fused kernel (``traditional=True`` is the interleaved layout)."""
    if g.rt.library != "mlx":
        return
    mx, q, k, dims, first = g.rt.module, g.q, g.k, g.head_dim, g.case.offset
    traditional = g.layout == "interleaved"

    def rope(x: Any, offset: Any) -> Any:
        return mx.fast.rope(x, dims, traditional=traditional, base=BASE, scale=1.0, offset=offset)

    if not g.decode:
        yield Variant("mx.fast.rope", lambda: rope(q, first), 1, f"traditional={traditional}")
        return
    offsets = g.offsets
    try:
        mx.eval(rope(q, offsets))
    except Exception as exc:  # noqa: BLE001 - older MLX: one offset for the whole batch
        yield _skip("mx.fast.rope", f"no per-row offsets in this MLX ({_short(exc)})", 2)
        return
    yield Variant("mx.fast.rope", lambda: (rope(q, offsets), rope(k, offsets)), 2,
                  f"traditional={traditional}, offset per row")  # fmt: skip


BUILDERS: tuple[Callable[[Group], Iterable[Variant]], ...] = (
    copy_variant,
    anyrope_variants,
    compiled_anyrope_variant,
    numpy_formula_variant,
    transformers_variants,
    compiled_variant,
    rotary_embedding_torch_variant,
    mlx_fast_variant,
)


# --- timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median and spread of the samples."""

    median_s: float
    min_s: float
    p25_s: float
    p75_s: float
    samples: int
    number: int  # calls per sample


def _calibrate(call: Callable[[], Any], sample_s: float) -> int:
    """Calls per sample so that one sample lasts at least ``sample_s`` (1 for slow calls)."""
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    if sample_s <= 0 or once >= sample_s:
        return 1
    return min(10_000, math.ceil(sample_s / max(once, 1e-9)))


def measure(
    calls: dict[str, Callable[[], Any]],
    *,
    repeat: int,
    sample_s: float = 0.0,
    warmup: int = 2,
    budget_s: float = GROUP_BUDGET_S,
) -> dict[str, Timing | BaseException]:
    """Time each callable ``repeat`` times, in interleaved rounds; the failures come back as exceptions.

    Each callable is first called ``warmup`` times (caches, JIT, lazy tables) and calibrated;
    then every round times each once, in an order rotated from round to round. Rounds stop
    early once ``budget_s`` has passed and three are in.
    """
    results: dict[str, Timing | BaseException] = {}
    numbers: dict[str, int] = {}
    for name, call in calls.items():
        try:
            for _ in range(max(0, warmup - 1)):
                call()
            numbers[name] = _calibrate(call, sample_s)
        except Exception as exc:  # noqa: BLE001 - reported in the row of its variant
            results[name] = exc
    samples: dict[str, list[float]] = {name: [] for name in numbers}
    start = time.perf_counter()
    for r in range(repeat):
        live = [name for name in numbers if name not in results]
        if not live or (r >= 3 and time.perf_counter() - start > budget_s):
            break
        shift = r % len(live)
        for name in live[shift:] + live[:shift]:
            try:
                samples[name].append(_sample(calls[name], numbers[name]))
            except Exception as exc:  # noqa: BLE001
                results[name] = exc
    for name, values in samples.items():
        if name not in results and values:
            results[name] = _timing(values, numbers[name])
    return results


def _sample(call: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - start) / number


def _timing(values: list[float], number: int) -> Timing:
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return Timing(statistics.median(ordered), ordered[0], quartiles[0], quartiles[2], len(ordered), number)


# --- the busy core ----------------------------------------------------------------------------

# Pure Python spinning; it checks every few milliseconds that its parent lives, so that a worker
# killed outright does not leave it spinning.
SPIN = """\
import os
parent = os.getppid()
print("spinning", flush=True)
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


@contextlib.contextmanager
def busy_cores(count: int = 1) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` helper processes, each spinning on a core for the duration of the block.

    They are spinning when the block starts (each has said so), and are killed and reaped when
    it ends, however it ends.
    """
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


# --- the worker -------------------------------------------------------------------------------


def _group(rt: Runtime, case: Case, dtype: str, layout: str) -> Group:
    import anyrope

    q = rt.make(case.dims, dtype, 0)
    k = rt.make(case.dims, dtype, 1)
    offsets = rt.index(case.offsets) if case.offsets is not None else None
    rope = anyrope.RoPE(case.head_dim, base=BASE, layout=layout)
    return Group(rt, case, dtype, layout, q, k, offsets, rope)


def _timed(rt: Runtime, call: Callable[[], Any]) -> Callable[[], None]:
    finish = rt.finish
    return lambda: finish(call())


def bench_group(
    rt: Runtime, case: Case, dtype: str, layout: str, *, budget_s: float = GROUP_BUDGET_S
) -> list[Record]:
    """Every variant of one (case, dtype, layout), as records."""
    base: Record = {
        "backend": rt.name, "device": rt.device, "shape": case.name, "dims": list(case.dims),
        "dtype": dtype, "layout": layout, "busy_cores": case.busy,
    }  # fmt: skip
    rt.reset()
    with contextlib.ExitStack() as stack:
        if case.busy:
            stack.enter_context(busy_cores(case.busy))
        stack.enter_context(rt.scope())
        g = _group(rt, case, dtype, layout)
        variants: list[Variant] = []
        for build in BUILDERS:
            try:
                variants.extend(build(g))
            except Exception as exc:  # noqa: BLE001 - a peer that breaks is one row, not a crash
                variants.append(_skip(build.__name__, f"setup failed: {_short(exc)}"))
        calls = {v.name: _timed(rt, v.call) for v in variants if v.call is not None}
        timings = measure(calls, repeat=case.repeat, sample_s=case.sample_s, budget_s=budget_s)
    return [_record(base, v, timings.get(v.name)) for v in variants]


def _record(base: Record, variant: Variant, timing: Timing | BaseException | None) -> Record:
    record: Record = {**base, "variant": variant.name, "tensors": variant.tensors, "note": variant.note}
    if isinstance(timing, Timing):
        record.update(status="ok", median_s=timing.median_s, min_s=timing.min_s, p25_s=timing.p25_s,
                      p75_s=timing.p75_s, samples=timing.samples, number=timing.number)  # fmt: skip
    elif isinstance(timing, BaseException):
        record.update(status="error", detail=_short(timing))
    else:
        record.update(status="skipped", detail=variant.note)
    return record


def run_backend(
    name: str,
    cases: Sequence[Case],
    *,
    dtypes: Sequence[str] | None = None,
    layouts: Sequence[str] = LAYOUTS,
    budget_s: float = GROUP_BUDGET_S,
    progress: Callable[[str, str], None] | None = None,
    first: bool = False,
) -> Record:
    """Benchmark one backend in this process; returns its part of the report.

    Parameters
    ----------
    name : str
        A name from :data:`BACKENDS`.
    cases : sequence of Case
        What to time (see :func:`plan_cases`).
    dtypes : sequence of str, optional
        A subset of the backend's dtypes; default all.
    layouts : sequence of str
        "half" and/or "interleaved".
    budget_s : float
        Seconds after which one group's rounds stop (once three are in).
    progress : callable, optional
        Called with ("start" or "done", a label) around each (case, dtype, layout), and with
        "start" before the first-call measurement.
    first : bool
        Measure the first call in a fresh process too (:func:`first_call`), before the cases.

    Returns
    -------
    dict
        ``backend``, ``device``, ``status`` ("ok" or "skipped" with ``detail``), ``copy``, ``info``,
        ``results`` (one record per variant), and with ``first`` ``first_call`` (its records).
    """
    spec = _SPECS[name]
    part: Record = {"backend": name, "status": "ok", "results": []}
    try:
        rt = make_runtime(name)
    except Unavailable as exc:
        return {**part, "status": "skipped", "detail": str(exc)}
    part.update(device=rt.device, copy=rt.copy_note, info=rt.info)
    if first:
        if progress is not None:
            progress("start", f"{name} first call")
        part["first_call"] = first_call(name)
    for case in cases:
        for dtype in dtypes or spec.dtypes:
            for layout in layouts:
                label = f"{name} {case.name} {dtype} {layout}"
                if progress is not None:
                    progress("start", label)
                part["results"].extend(bench_group(rt, case, dtype, layout, budget_s=budget_s))
                if progress is not None:
                    progress("done", label)
    return part


def _emit(kind: str, label: str) -> None:
    print(EVENT + json.dumps({"event": kind, "label": label}), flush=True)


def worker_main(
    name: str, json_out: Path, cases: Sequence[Case], budget_s: float, *, first: bool = True
) -> int:
    """The body of ``bench --worker NAME``: run one backend and write its part as JSON.

    ``first``: also measure the first call, on CPU backends.
    """
    part = run_backend(name, cases, budget_s=budget_s, progress=_emit, first=first and not _SPECS[name].gpu)
    json_out.write_text(json.dumps(part, indent=1))
    return 0


# --- the first call ---------------------------------------------------------------------------

FIRST_MARK = "@@anyrope-first-call "  # prefix of the child's line of results
# The child loads this file by its path, as a module outside the anyrope package: importing
# anyrope._bench would import anyrope, whose import the first call must include.
_FIRST_CHILD = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('_anyrope_bench_child', sys.argv[1]); "
    "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module; "
    "spec.loader.exec_module(module); sys.exit(module.first_call_child(sys.argv[2:]))"
)


def first_call(
    name: str,
    *,
    dims: tuple[int, int, int, int] = FIRST_CALL_DIMS,
    warm: int = FIRST_CALL_WARM,
    timeout_s: float = FIRST_CALL_TIMEOUT_S,
) -> list[Record]:
    """The first call's latency in a fresh process, against the median of later calls.

    The child imports the backend's library and makes a float32 q of ``dims`` before the clock
    starts; the first call's time then includes ``import anyrope``, ``RoPE(head_dim)`` and
    ``rope(q)``. Where the library has a compiler (torch.compile, jax.jit), its first call of
    ``rope(q)`` is timed next, compile included.

    Returns
    -------
    list of dict
        One record per variant: ``status`` "ok" with ``first_s``, ``warm_s`` (median of ``warm``
        later calls), ``second_s``, ``first_over_warm``; or "error"/"skipped" with ``detail``.
    """
    base: Record = {"backend": name, "dims": list(dims), "dtype": "float32"}
    argv = [sys.executable, "-c", _FIRST_CHILD, __file__, name, json.dumps({"dims": dims, "warm": warm})]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return [
            {**base, "variant": "anyrope", "status": "error", "detail": f"timed out after {timeout_s:g} s"}
        ]
    found = [line for line in done.stdout.splitlines() if line.startswith(FIRST_MARK)]
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        detail = f"the fresh process exited with {done.returncode}: {last}"[:200]
        return [{**base, "variant": "anyrope", "status": "error", "detail": detail}]
    return [{**base, **record} for record in json.loads(found[-1][len(FIRST_MARK) :])]


def first_call_child(argv: Sequence[str]) -> int:
    """The fresh process of :func:`first_call`: ``argv`` is the backend and its parameters as JSON."""
    params = json.loads(argv[1])
    dims = tuple(params["dims"])
    records = _first_calls(make_runtime(argv[0]), (dims[0], dims[1], dims[2], dims[3]), int(params["warm"]))
    print(FIRST_MARK + json.dumps(records), flush=True)
    return 0


def _first_calls(rt: Runtime, dims: tuple[int, int, int, int], warm: int) -> list[Record]:
    with rt.scope():
        q = rt.make(dims, "float32", 0)
        rt.finish(q)
        start = time.perf_counter()
        anyrope = importlib.import_module("anyrope")
        rope = anyrope.RoPE(dims[3], base=BASE)
        rt.finish(rope(q))
        first = time.perf_counter() - start
        records = [
            _first_record("anyrope", "import anyrope + RoPE + rope(q)", first, rt, lambda: rope(q), warm)
        ]
        if rt.compiler is not None:
            records.append(_first_compiled(rt, rt.compiler, lambda x: rope(x), q, warm))
    return records


def _first_compiled(rt: Runtime, compiler: Compiler, fn: Callable[[Any], Any], q: Any, warm: int) -> Record:
    start = time.perf_counter()
    try:
        compiled = compiler.compile(fn)
        rt.finish(compiled(q))
    except Exception as exc:  # noqa: BLE001 - no compiler here: a skip with its reason
        return {
            "variant": compiler.variant,
            "status": "skipped",
            "detail": f"{compiler.note} failed: {_short(exc)}",
        }
    first = time.perf_counter() - start
    note = f"{compiler.note} of lambda q: rope(q), compile included"
    return _first_record(compiler.variant, note, first, rt, lambda: compiled(q), warm)


def _first_record(
    variant: str, note: str, first: float, rt: Runtime, call: Callable[[], Any], warm: int
) -> Record:
    later = []
    for _ in range(max(1, warm)):
        start = time.perf_counter()
        rt.finish(call())
        later.append(time.perf_counter() - start)
    median = statistics.median(later)
    return {
        "variant": variant, "status": "ok", "note": note, "first_s": first, "second_s": later[0],
        "warm_s": median, "warm_calls": len(later), "first_over_warm": first / median,
    }  # fmt: skip


# --- the report -------------------------------------------------------------------------------


def _per_tensor(record: Record) -> float:
    return float(record["median_s"]) / int(record["tensors"])


def add_ratios(results: Sequence[Record]) -> list[Record]:
    """The records with ``x_copy`` and, where a reference peer ran, ``ref`` and ``x_ref``.

    Ratios are of time per tensor (a call on q and k counts twice), against the same backend,
    shape and dtype: ``copy`` of the same layout, and the reference of :data:`REFERENCES`.
    """
    ok = {
        (r["backend"], r["shape"], r["dtype"], r["layout"], r["variant"]): r
        for r in results
        if r.get("status") == "ok"
    }
    out = []
    for record in results:
        record = dict(record)
        if record.get("status") == "ok":
            key = (record["backend"], record["shape"], record["dtype"])
            copy = ok.get((*key, record["layout"], "copy"))
            record["x_copy"] = _per_tensor(record) / _per_tensor(copy) if copy else None
            for ref_name, same_layout in REFERENCES.items():
                ref_layout = record["layout"] if same_layout else "half"
                ref = ok.get((*key, ref_layout, ref_name))
                if ref is not None:
                    suffix = "" if ref_layout == record["layout"] else f" ({ref_layout})"
                    record["ref"] = ref_name + suffix
                    record["x_ref"] = _per_tensor(record) / _per_tensor(ref)
                    break
        out.append(record)
    return out


def _versions() -> dict[str, str]:
    found = {}
    for dist in ("anyrope", "array-api-compat", "numpy", "torch", "mlx", "jax", "jaxlib", "cupy-cuda12x",
                 "numba", "transformers", "rotary-embedding-torch", "matplotlib"):  # fmt: skip
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[dist] = importlib.metadata.version(dist)
    return found


def _processor() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info() -> Record:
    """Where the run happened: platform, processor, CPUs, Python and library versions."""
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(affinity(0)) if affinity is not None else os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": _versions(),
    }


def merge(parts: Sequence[Record], *, machine: Record, config: Record) -> Record:
    """One report from the workers' parts: machine, config, each backend's header, all results,
    and the first-call records."""
    lists = ("results", "first_call")
    backends = {p["backend"]: {k: v for k, v in p.items() if k not in lists} for p in parts}
    results = [r for p in parts for r in p.get("results", [])]
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "config": config,
        "backends": backends,
        "results": add_ratios(results),
        "first_call": [r for p in parts for r in p.get("first_call", [])],
    }


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}" if ms >= 1 else f"{ms:.4f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


COLUMNS = ("backend", "shape", "dtype", "layout", "variant", "in", "median ms", "x copy", "x ref")


def _row(r: Record) -> list[str]:
    ran = r.get("status") == "ok"
    return [
        r["backend"], r["shape"], r["dtype"], r["layout"], r["variant"],
        "q,k" if r["tensors"] == 2 else "q",
        _ms(r["median_s"]) if ran else str(r.get("status")),
        _ratio(r.get("x_copy")), _ratio(r.get("x_ref")),
    ]  # fmt: skip


def _order(r: Record) -> tuple[int, ...]:
    backends = [b.name for b in BACKENDS]
    variant = VARIANT_ORDER.index(r["variant"]) if r["variant"] in VARIANT_ORDER else len(VARIANT_ORDER)
    return (
        backends.index(r["backend"]) if r["backend"] in backends else len(backends),
        SHAPES.index(r["shape"]) if r["shape"] in SHAPES else len(SHAPES),
        ["float32", "float16", "bfloat16"].index(r["dtype"])
        if r["dtype"] in ("float32", "float16", "bfloat16")
        else 3,
        LAYOUTS.index(r["layout"]) if r["layout"] in LAYOUTS else 2,
        variant,
    )


def _columns(
    header: Sequence[str], rows: Sequence[list[str]], numeric: Iterable[str], group: int = 2
) -> list[str]:
    """Aligned lines: the header, a rule, and the rows, a blank line wherever the first ``group``
    cells change."""
    cells = [list(header), *rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    right = {header.index(c) for c in numeric}

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [line(cells[0]), "  ".join("-" * w for w in widths)]
    previous: list[str] | None = None
    for row in cells[1:]:
        if previous is not None and row[:group] != previous:
            lines.append("")
        previous = row[:group]
        lines.append(line(row))
    return lines


FIRST_COLUMNS = ("backend", "variant", "first s", "warm ms", "first/warm")


def _first_row(r: Record) -> list[str]:
    if r.get("status") != "ok":
        return [r["backend"], r["variant"], str(r.get("status")), "", ""]
    return [
        r["backend"],
        r["variant"],
        f"{r['first_s']:.3f}",
        _ms(r["warm_s"]),
        f"{r['first_over_warm']:.0f}",
    ]


def format_table(report: Record) -> str:
    """The report as a text table (timed and failed rows; skips are listed below it), the
    first-call table, and notes."""
    rows = sorted((r for r in report["results"] if r.get("status") != "skipped"), key=_order)
    lines = _columns(COLUMNS, [_row(r) for r in rows], ("median ms", "x copy", "x ref"))
    first = report.get("first_call", [])
    if first:
        backends = [b.name for b in BACKENDS]
        first = sorted(first, key=lambda r: backends.index(r["backend"]) if r["backend"] in backends else 99)
        lines += ["", *_columns(FIRST_COLUMNS, [_first_row(r) for r in first], FIRST_COLUMNS[2:], 1)]
    return "\n".join([*lines, "", *_notes(report)])


def _notes(report: Record) -> list[str]:
    config = report.get("config", {})
    notes = [
        "median ms: median time of one call; x copy: time per tensor / the backend's copy per tensor",
        "(same shape, dtype, layout); x ref: time per tensor / the reference peer's (named below;",
        "(half) where the reference has only the half layout).",
        "in: q = the call rotates q only; q,k = q and k (prefill peers that take both get both).",
    ]
    for name, case in config.get("cases", {}).items():
        notes.append(f"{name}: (batch, heads, seq, head_dim) = {tuple(case['dims'])}, {case['what']}")
        if case.get("busy_cores"):
            notes.append(
                f"{name}: timed with {case['busy_cores']} core(s) busy: a helper process spinning in pure"
                " Python ran from before the group's setup until after its last round"
            )
    notes += _targets(report)
    first = report.get("first_call", [])
    if first:
        notes += [
            "first call: in a fresh process per CPU backend, once the library is imported and a float32 q",
            f"of {tuple(first[0]['dims'])} made: import anyrope + RoPE + rope(q); then the first call of",
            "the compiled rope(q) (torch.compile(fullgraph=True), jax.jit), compile included;",
            "warm ms: median of later calls; first/warm: their ratio.",
        ]
        for r in first:
            if r.get("status") != "ok":
                notes.append(
                    f"{r['backend']} {r['variant']} first call: {r['status']} ({r.get('detail', '')})"
                )
    for name, backend in report.get("backends", {}).items():
        if backend.get("status") != "ok":
            notes.append(f"{name}: {backend.get('status')} ({backend.get('detail', '')})")
            continue
        refs = {r["ref"] for r in report["results"] if r["backend"] == name and r.get("ref")}
        ref = f"; x ref against {' / '.join(sorted({r.split(' (')[0] for r in refs}))}" if refs else ""
        if any(" (" in r for r in refs):
            ref += " (its half layout's time for the other layout)"
        notes.append(f"{name}: device {backend.get('device')}; copy = {backend.get('copy')}{ref}")
    seen = set()
    for r in report["results"]:
        if r.get("status") in ("skipped", "error"):
            text = f"{r['backend']} {r['variant']}: {r['status']} ({r.get('detail', '')})"
            if text not in seen:
                seen.add(text)
                notes.append(text)
    return notes


def _targets(report: Record) -> list[str]:
    """The small case's target on NumPy: anyrope's call no slower than the naive formula."""
    rows = [
        r
        for r in report["results"]
        if r["backend"] == "numpy" and r["shape"] == "small" and r["variant"] == "anyrope" and r.get("x_ref")
    ]
    if not rows:
        return []
    found = ", ".join(f"{r['dtype']} {r['layout']} {r['x_ref']:.2f}" for r in sorted(rows, key=_order))
    met = all(r["x_ref"] <= 1.0 for r in rows)
    return [
        f"target, numpy small: anyrope <= numpy-formula (x ref <= 1): {found}: {'met' if met else 'not met'}"
    ]


# --- the plot ---------------------------------------------------------------------------------


def plot(report: Record, path: Path) -> str | None:
    """Bars of "x copy" per variant, float32, one row of panels per case, one panel per backend.

    Returns None when written, else why not (matplotlib missing, nothing to draw).
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    rows = [
        r
        for r in report["results"]
        if r.get("status") == "ok" and r["dtype"] == "float32" and r.get("x_copy")
    ]
    backends = [b.name for b in BACKENDS if any(r["backend"] == b.name for r in rows)]
    shapes = [s for s in SHAPES if any(r["shape"] == s for r in rows)]
    if not backends or not shapes:
        return "no float32 results to plot"
    fig, axes = plt.subplots(
        len(shapes), len(backends), figsize=(4.2 * len(backends) + 1, 3.6 * len(shapes)), squeeze=False
    )
    for i, shape in enumerate(shapes):
        for j, backend in enumerate(backends):
            _panel(
                axes[i][j],
                [r for r in rows if r["shape"] == shape and r["backend"] == backend],
                shape,
                backend,
            )
    legend: dict[str, Any] = {}  # label -> handle, once per layout
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        legend.update(zip(labels, handles, strict=True))
    fig.legend(legend.values(), legend.keys(), loc="upper right", fontsize=8, title="layout")
    fig.suptitle(_plot_title(report), fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def _panel(ax: Any, rows: list[Record], shape: str, backend: str) -> None:
    """One backend's bars: a pair per variant (half, interleaved), one where it has one layout."""
    if not rows:  # a backend that timed nothing of this case, e.g. after an error
        ax.set_title(f"{backend}, {shape}: no float32 results", fontsize=9)
        ax.set_axis_off()
        return
    variants = [v for v in VARIANT_ORDER if v != "copy" and any(r["variant"] == v for r in rows)]
    width = 0.8 / len(LAYOUTS)
    colors = {"half": "tab:blue", "interleaved": "tab:orange"}
    for x, variant in enumerate(variants):
        found = [r for layout in LAYOUTS for r in rows if r["variant"] == variant and r["layout"] == layout]
        for i, r in enumerate(found):
            offset = (i - (len(found) - 1) / 2) * width
            bars = ax.bar(x + offset, r["x_copy"], width, color=colors.get(r["layout"]), label=r["layout"])
            ax.bar_label(bars, fmt="{:.3g}", fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    values = [r["x_copy"] for r in rows if r["variant"] != "copy"]
    if values and max(values) / max(min(values), 1e-12) > 20:
        ax.set_yscale("log")
        ticker = importlib.import_module("matplotlib.ticker")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(  # 2 and 5 times a power of ten only: the rest would crowd
            ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
        )
        ax.tick_params(axis="y", which="minor", labelsize=6)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
    busy = rows[0].get("busy_cores", 0)
    where = f", {busy} core{'s' if busy > 1 else ''} busy" if busy else ""
    ax.set_title(f"{backend} on {rows[0]['device']}, {shape}{where}", fontsize=9)
    ax.set_ylabel("time / copy (lower is better)", fontsize=8)


def _plot_title(report: Record) -> str:
    machine = report.get("machine", {})
    cases = report.get("config", {}).get("cases", {})
    dims = ", ".join(f"{n} {tuple(c['dims'])}" for n, c in cases.items())
    version = machine.get("versions", {}).get("anyrope", "")
    where = f"{machine.get('processor', '')}, {machine.get('cpus_usable')} CPUs usable"
    return (
        f"anyrope {version}: float32 time per tensor / copy; {dims}\n{where}, {machine.get('platform', '')}"
    )


# --- the driver -------------------------------------------------------------------------------


def _has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def default_backends() -> list[str]:
    """The installed backends; the GPU ones only where an NVIDIA GPU shows."""
    gpu = _has_nvidia_gpu()
    return [b.name for b in BACKENDS if _installed(b.module) and (gpu or not b.gpu)]


class Progress:
    """A progress bar on stderr: tqdm where installed, else a plain text one."""

    def __init__(self, total: int, stream: TextIO | None = None, *, use_tqdm: bool = True) -> None:
        self.total, self.done, self.label = total, 0, ""
        self.stream = sys.stderr if stream is None else stream
        self.start = time.perf_counter()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._tqdm: Any = None
        if use_tqdm and self._tty:  # in a log, plain lines read better than tqdm's carriage returns
            with contextlib.suppress(ImportError):
                tqdm = importlib.import_module("tqdm")
                self._tqdm = tqdm.tqdm(total=total, file=self.stream, unit="case", dynamic_ncols=True)

    def update(self, label: str, advance: int = 0) -> None:
        """Show ``label`` as the work in hand, and move on by ``advance`` steps."""
        self.label = label
        self.done = min(self.total, self.done + advance)
        if self._tqdm is not None:
            self._tqdm.set_description_str(label, refresh=False)
            self._tqdm.update(advance)
            return
        if advance == 0 and not self._tty:
            return  # in a log, one line per finished step
        width = 30
        filled = width * self.done // max(self.total, 1)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self._elapsed()} {label}"
        if self._tty:
            self.stream.write("\r" + bar.ljust(100)[:120])
        else:
            self.stream.write(bar + "\n")
        self.stream.flush()

    def _elapsed(self) -> str:
        seconds = int(time.perf_counter() - self.start)
        return f"{seconds // 60}:{seconds % 60:02d}"

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._tty:
            self.stream.write("\n")
            self.stream.flush()


def _steps(name: str, cases: Sequence[Case]) -> int:
    return len(cases) * len(_SPECS[name].dtypes) * len(LAYOUTS)


def _worker_argv(name: str, json_out: Path, args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "anyrope", "bench", "--worker", name, "--json-out", str(json_out)]
    if args.quick:
        argv.append("--quick")
    if args.repeat is not None:
        argv += ["--repeat", str(args.repeat)]
    if args.decode_repeat is not None:
        argv += ["--decode-repeat", str(args.decode_repeat)]
    if args.no_first_call:
        argv.append("--no-first-call")
    return [*argv, "--group-budget", str(args.group_budget)]


def launch(name: str, args: argparse.Namespace, progress: Progress, log: Path, steps: int) -> Record:
    """Run one backend's worker process, following its progress; returns its part.

    The worker's progress events move the bar; everything else it prints goes to ``log``.
    """
    if not _installed(_SPECS[name].module):
        progress.update(f"{name}: not installed", steps)
        return {"backend": name, "status": "skipped", "detail": f"{_SPECS[name].module} is not installed"}
    with tempfile.TemporaryDirectory() as tmp:
        json_out = Path(tmp) / "part.json"
        with log.open("w") as log_file:
            advanced, status = _follow(_worker_argv(name, json_out, args), progress, log_file)
        progress.update(f"{name}: finished", max(0, steps - advanced))
        if status != 0 or not json_out.exists():
            return {"backend": name, "status": "error", "detail": f"worker exited with {status}; see {log}"}
        part: Record = json.loads(json_out.read_text())
        return part


def _follow(argv: list[str], progress: Progress, log: TextIO) -> tuple[int, int]:
    """Run ``argv``; returns the steps its events finished and its exit status."""
    advanced = 0
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith(EVENT):
                log.write(line)
                continue
            event = json.loads(line[len(EVENT) :])
            step = 1 if event["event"] == "done" else 0
            advanced += step
            progress.update(event["label"], step)
    return advanced, proc.returncode


def _config(args: argparse.Namespace, cases: Sequence[Case]) -> Record:
    return {
        "quick": bool(args.quick),
        "cases": {
            c.name: {
                "dims": list(c.dims),
                "repeat": c.repeat,
                "sample_s": c.sample_s,
                "offset": c.offset,
                "busy_cores": c.busy,
                "what": c.what,
            }
            for c in cases
        },
        "first_call": not args.no_first_call,
        "group_budget_s": args.group_budget,
        "argv": sys.argv[1:],
    }


def driver_main(args: argparse.Namespace) -> int:
    """The body of ``bench``: run every chosen backend's worker, then report."""
    cases = plan_cases(quick=args.quick, repeat=args.repeat, decode_repeat=args.decode_repeat)
    names = args.backends or default_backends()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = sum(_steps(n, cases) for n in names)
    print(f"anyrope bench: {', '.join(names)}; {len(cases)} shapes, logs in {out}", file=sys.stderr)
    progress = Progress(total)
    parts = []
    try:
        for name in names:
            parts.append(launch(name, args, progress, out / f"worker-{name}.log", _steps(name, cases)))
    finally:
        progress.close()
    report = merge(parts, machine=machine_info(), config=_config(args, cases))
    table = format_table(report)
    print(table)
    json_path = Path(args.json) if args.json else out / "bench.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1))
    (out / "bench.txt").write_text(table + "\n")
    print(f"\nwrote {json_path} and {out / 'bench.txt'}")
    if not args.no_plot:
        why = plot(report, out / "bench.png")
        print(f"wrote {out / 'bench.png'}" if why is None else f"no plot: {why}")
    failed = [p["backend"] for p in parts if p.get("status") == "error"]
    failed += sorted({r["backend"] for r in report["results"] if r.get("status") == "error"})
    ran = any(r.get("status") == "ok" for r in report["results"])
    if failed:
        print(f"errors in: {', '.join(dict.fromkeys(failed))}", file=sys.stderr)
    if not ran:
        print("nothing was timed: no chosen backend is installed and usable", file=sys.stderr)
    return 0 if ran and not failed else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options, on an argparse parser."""
    names = [b.name for b in BACKENDS]
    add = parser.add_argument
    add(
        "-b",
        "--backend",
        dest="backends",
        action="append",
        choices=names,
        help="benchmark only this backend (repeatable); default: the installed ones (GPU ones on a GPU)",
    )
    add(
        "--quick",
        action="store_true",
        help=f"small shapes and few samples (prefill {PREFILL_QUICK}), for CI-sized runs",
    )
    add(
        "--repeat",
        type=_positive,
        metavar="N",
        help=f"samples per variant for prefill (default {REPEAT}, {REPEAT_QUICK} with --quick)",
    )
    add(
        "--decode-repeat",
        type=_positive,
        metavar="N",
        help=f"samples per variant for decode and small (default {DECODE_REPEAT}, "
        f"{DECODE_REPEAT_QUICK} with --quick)",
    )
    add(
        "--no-first-call",
        action="store_true",
        help="do not time the first call in a fresh process (CPU backends; about 5 to 30 s each)",
    )
    add(
        "--out",
        default="bench-results",
        metavar="DIR",
        help="folder for bench.json, bench.txt, bench.png and the workers' logs (default: %(default)s)",
    )
    add("--json", metavar="PATH", help="write the JSON report here instead of DIR/bench.json")
    add("--no-plot", action="store_true", help="do not draw DIR/bench.png")
    add("--group-budget", type=float, default=GROUP_BUDGET_S, metavar="SECONDS", help=argparse.SUPPRESS)
    add("--worker", choices=names, help=argparse.SUPPRESS)  # run one backend, in this process
    add("--json-out", type=Path, help=argparse.SUPPRESS)  # where the worker writes its part


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(args: argparse.Namespace) -> int:
    """Run ``bench`` from parsed arguments: the driver, or with ``--worker`` one backend's worker."""
    if args.worker:
        if args.json_out is None:
            print("--worker needs --json-out", file=sys.stderr)
            return 2
        cases = plan_cases(quick=args.quick, repeat=args.repeat, decode_repeat=args.decode_repeat)
        return worker_main(args.worker, args.json_out, cases, args.group_budget, first=not args.no_first_call)
    return driver_main(args)
