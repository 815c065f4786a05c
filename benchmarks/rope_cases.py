"""What the benchmark times: backends, cases and variants, from static data and cheap checks.

pyperf runs the benchmark script again in every worker process and picks the benchmark by its
registration order, so this plan must come out the same in each process and cost nothing: it
imports no array library, only asks ``importlib.util.find_spec`` what is installed.

What is installed, and the per-library array glue the runtimes use, come from anyrope's own
``_arrays`` (the tests and the self-check use it too), loaded from its file: importing it as
``anyrope._arrays`` would import anyrope, whose import bench_first_call times.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

# tools/backend_toml.py, the one reader of backends/ (stdlib only): on the path for the scripts
# here and pyperf's workers (pytest puts tools/ there itself)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import backend_toml


def _load_arrays() -> ModuleType:
    """anyrope/_arrays.py of the anyrope that runs, without importing anyrope (it imports only the
    standard library until a function asks for an array library)."""
    found = importlib.util.find_spec("anyrope")  # a top-level package: found, not imported
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError("the benchmark times anyrope, which is not installed")
    path = Path(next(iter(found.submodule_search_locations))) / "_arrays.py"
    spec = importlib.util.spec_from_file_location("anyrope_arrays", path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"cannot load {path}")
    module = sys.modules["anyrope_arrays"] = importlib.util.module_from_spec(spec)  # for dataclasses
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from anyrope import _arrays as arrays
else:
    arrays = sys.modules.get("anyrope_arrays") or _load_arrays()

BASE = 10000.0
LAYOUTS = ("half", "interleaved")
SHAPES = ("prefill", "decode", "small")
DTYPE_ORDER = ("float32", "float16", "bfloat16")
SIZES = ("full", "quick", "tiny")  # tiny: the tests' smoke runs
SMALL_OFFSET = 5
SMALL_BUSY_CORES = 1
# (batch, heads, seq, head_dim) per size and shape; decode is one new token per sequence.
DIMS: dict[str, dict[str, tuple[int, int, int, int]]] = {
    "full": {"prefill": (1, 32, 4096, 128), "decode": (32, 32, 1, 128), "small": (1, 8, 16, 64)},
    "quick": {"prefill": (1, 8, 1024, 128), "decode": (32, 32, 1, 128), "small": (1, 8, 16, 64)},
    "tiny": {"prefill": (1, 2, 8, 128), "decode": (3, 2, 1, 128), "small": (1, 2, 4, 64)},
}
VARIANT_ORDER = (
    "copy",
    "copy-compiled",
    "anyrope",
    "anyrope-generic",
    "anyrope-inplace",
    "anyrope-compiled",
    "anyrope-aoti",
    "anyrope-jit",
    "anyrope-mx-compile",
    "numpy-formula",
    "naive-jit",
    "transformers-apply",
    "transformers-full",
    "transformers-apply-compiled",
    "transformers-full-compiled",
    "rotary-embedding-torch",
    "onnxruntime-op",
    "onnxruntime-elementwise",
    "mx.fast.rope",
    "mx.fast.rope-compiled",
)
# Per backend, the peer that "x ref" divides by, and whether it must be of the row's own layout
# (True) or is taken from the "half" layout, the only one it has (False).
REFERENCES = {"mx.fast.rope": True, "transformers-apply": False, "numpy-formula": True}
# The same for compiled rows' "x cpeer": the peer's whole call (tables from positions included)
# under the compiler that runs anyrope's.
COMPILED_REFERENCES = {"mx.fast.rope-compiled": True, "transformers-full-compiled": False, "naive-jit": True}
# Variants that run under a compiler; each backend's compiled copy (BackendSpec.compiled_copy) too.
COMPILED = frozenset({
    "copy-compiled", "anyrope-compiled", "anyrope-aoti", "anyrope-jit", "anyrope-mx-compile", "naive-jit",
    "transformers-apply-compiled", "transformers-full-compiled", "mx.fast.rope-compiled",
})  # fmt: skip

# Rows that benchmarks/bench_paired.py times again in one process, taking turns with the variant
# they are divided by: pairs of anyrope's own paths that a target compares and that can differ by
# less than a process's own spread (mx.compile and eager MLX run the same kernel; eager JAX runs
# a cached jitted form). (backend, variant) -> the variant it is divided by.
PAIRED = {("mlx", "anyrope-mx-compile"): "anyrope", ("jax", "anyrope"): "anyrope-jit"}


@dataclass(frozen=True)
class BackendSpec:
    """A benchmarked backend: the library it runs, its floating dtypes, and whether it needs a GPU."""

    name: str
    module: str
    dtypes: tuple[str, ...]
    copy: str  # the "copy" variant: one pass that reads and writes every element once
    gpu: bool = False
    compiler: str | None = None  # the variant of its whole-call compiler
    compiled_copy: str | None = None  # the variant that is compiled rows' roofline

    def is_compiled(self, variant: str) -> bool:
        """Whether the variant runs under the backend's compiler (its compiled copy included)."""
        return variant in COMPILED or variant == self.compiled_copy


# RoPE's own part of each benchmarked backend: the copy that is its roofline, the variant of its
# whole-call compiler, and the compiled copy that is the compiled rows' roofline. The rest (module,
# dtypes, devices) is read from backends/*/backend.toml, the data nox, the tests and the
# self-check share.
OWN = {
    "numpy": ("x.copy()", None, None),
    "torch": ("x.clone()", "anyrope-compiled", "copy-compiled"),
    "mlx": ("mx.eval(x * 1), one elementwise pass (immutable arrays)", "anyrope-mx-compile", "copy-compiled"),
    "jax": ("jax.jit(lambda x: x.copy()), a copy into a new buffer", "anyrope-jit", "copy"),  # jitted already
    "cupy": ("x.copy()", None, None),
}


def _backends() -> tuple[BackendSpec, ...]:
    """The benchmarked backends, CPU ones first; a backend with a "cuda" device adds NAME-cuda."""
    cpu: list[BackendSpec] = []
    gpu: list[BackendSpec] = []
    specs = backend_toml.load()
    for name, (copy, compiler, compiled_copy) in OWN.items():
        data = specs[name]
        dtypes = tuple(d for d in DTYPE_ORDER if d in data["dtypes"])  # float64 is not what models run
        only_gpu = bool(data.get("gpu-only", False))
        spec = BackendSpec(name, data["module"], dtypes, copy, only_gpu, compiler, compiled_copy)
        (gpu if only_gpu else cpu).append(spec)
        if not only_gpu and "cuda" in data["devices"]:
            gpu.append(dataclasses.replace(spec, name=f"{name}-cuda", gpu=True))
    return (*cpu, *gpu)


BACKENDS = _backends()
SPECS = {spec.name: spec for spec in BACKENDS}


def decode_offsets(batch: int) -> list[int]:
    """Cache lengths of the decode batch: one per sequence, ``1000 + 97 i``."""
    return [1000 + 97 * i for i in range(batch)]


@dataclass(frozen=True)
class Case:
    """One input shape: ``dims`` is ``(batch, heads, seq, head_dim)``."""

    name: str
    dims: tuple[int, int, int, int]

    @property
    def decode(self) -> bool:
        return self.name == "decode"

    @property
    def tensors(self) -> int:
        """Tensors that anyrope and the copy process per call: q, or q and k."""
        return 2 if self.decode else 1

    @property
    def offset(self) -> int:
        """The first position of q-only cases."""
        return SMALL_OFFSET if self.name == "small" else 0

    @property
    def busy(self) -> int:
        """Cores kept busy by a spinning helper process while the case is timed."""
        return SMALL_BUSY_CORES if self.name == "small" else 0

    @property
    def offsets(self) -> list[int] | None:
        """Per-row cache lengths for decode, None otherwise."""
        return decode_offsets(self.dims[0]) if self.decode else None

    @property
    def what(self) -> str:
        """The inputs, in words."""
        if self.offsets is not None:
            return f"q and k, one offset per row: {', '.join(map(str, self.offsets[:2]))}, ... (1000 + 97 i)"
        text = f"q from position {self.offset} (peers that take q and k get both)"
        if self.busy:
            text += f"; {self.busy} core kept busy by a spinning process"
        return text


def cases(size: str = "full") -> list[Case]:
    """The prefill, decode and small cases of one size ("full", "quick" or "tiny")."""
    if size not in DIMS:
        raise ValueError(f"size must be one of {', '.join(DIMS)}, got {size!r}")
    return [Case(name, DIMS[size][name]) for name in SHAPES]


@dataclass(frozen=True)
class Bench:
    """One timed callable: a variant of one (backend, case, dtype, layout); ``skip`` says why not."""

    backend: str
    case: Case
    dtype: str
    layout: str
    variant: str
    tensors: int
    skip: str = ""

    @property
    def name(self) -> str:
        """pyperf's name for it, unique in a run."""
        return f"{self.backend}/{self.case.name}/{self.dtype}/{self.layout}/{self.variant}"


def installed(module: str) -> bool:
    """Whether the module's top-level package can be found (nothing is imported)."""
    return arrays.is_installed(module.split(".")[0])


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


NO_GPU = "no NVIDIA GPU here (no nvidia-smi, no /dev/nvidia0)"


def backend_skip(name: str) -> str:
    """Why a backend cannot run here, or "" when it can."""
    spec = SPECS[name]
    if not installed(spec.module):
        return f"{spec.module.split('.')[0]} is not installed"
    if spec.gpu and not has_nvidia_gpu():
        return NO_GPU
    return ""


def _peer(module: str) -> str:
    return "" if installed(module) else f"{module} is not installed"


# torch.onnx.export of anyrope.layers.torch: as ONNX's RotaryEmbedding operator, and elementwise
ONNX_VARIANTS = ("onnxruntime-op", "onnxruntime-elementwise")


def _dtype_skip(variant: str, dtype: str) -> str:
    """Why a variant cannot take a dtype, or ""."""
    if variant in ONNX_VARIANTS and dtype == "bfloat16":
        return "NumPy has no bfloat16 arrays to feed ONNX Runtime"
    return ""


def variants_of(spec: BackendSpec, case: Case, layout: str) -> list[tuple[str, int, str]]:
    """(variant, tensors it processes, why it is skipped or "") for one case and layout."""
    n, library = case.tensors, spec.module.split(".")[0]
    found = [("copy", n, "")]
    if spec.compiled_copy not in (None, "copy"):
        found.append((spec.compiled_copy, n, ""))
    found += [("anyrope", n, ""), ("anyrope-generic", n, "")]
    immutable = f"{library.upper()} arrays are immutable" if library in ("mlx", "jax") else ""
    found.append(("anyrope-inplace", n, immutable))
    if spec.compiler:
        found.append((spec.compiler, n, ""))
    if library == "numpy" and case.name == "small":
        found.append(("numpy-formula", 1, ""))
    if library == "jax":
        found.append(("naive-jit", n, ""))
    if library == "torch" and layout == "half":
        why = _peer("transformers")
        found += [("transformers-apply", 2, why), ("transformers-full", 2, why)]
        if not why:
            found += [("transformers-apply-compiled", 2, ""), ("transformers-full-compiled", 2, "")]
    if library == "torch" and layout == "interleaved":
        found.append(("rotary-embedding-torch", n, _peer("rotary_embedding_torch")))
    if library == "torch" and not spec.gpu:  # exported: AOTInductor's package; ONNX Runtime's CPU kernels
        found.append(("anyrope-aoti", n, ""))
        found += [(variant, n, _peer("onnxruntime")) for variant in ONNX_VARIANTS]
    if library == "mlx":
        found += [("mx.fast.rope", n, ""), ("mx.fast.rope-compiled", n, "")]
    return found


def plan(
    size: str = "full",
    *,
    backends: list[str] | None = None,
    shapes: list[str] | None = None,
    dtypes: list[str] | None = None,
    layouts: list[str] | None = None,
    variants: list[str] | None = None,
) -> list[Bench]:
    """Every benchmark of a run, in a fixed order, the skipped ones included (with their reason).

    The filters keep only the named backends, shapes, dtypes, layouts and variants (None: all).
    """
    found = []
    for spec in BACKENDS:
        if backends is not None and spec.name not in backends:
            continue
        down = backend_skip(spec.name)
        for case in cases(size):
            if shapes is not None and case.name not in shapes:
                continue
            for dtype in spec.dtypes:
                if dtypes is not None and dtype not in dtypes:
                    continue
                for layout in LAYOUTS:
                    if layouts is not None and layout not in layouts:
                        continue
                    for variant, tensors, why in variants_of(spec, case, layout):
                        if variants is None or variant in variants:
                            skip = down or why or _dtype_skip(variant, dtype)
                            found.append(Bench(spec.name, case, dtype, layout, variant, tensors, skip))
    return found


def pairs(benches: Sequence[Bench]) -> list[tuple[Bench, Bench]]:
    """(row, the row it is divided by) for each benchmark of ``PAIRED`` whose partner of the same
    backend, case, dtype and layout is planned too, neither skipped; in the plan's order."""
    by_key = {(b.backend, b.case, b.dtype, b.layout, b.variant): b for b in benches}
    found = []
    for bench in benches:
        over = PAIRED.get((bench.backend, bench.variant))
        other = by_key.get((bench.backend, bench.case, bench.dtype, bench.layout, over or ""))
        if other is not None and not bench.skip and not other.skip:
            found.append((bench, other))
    return found
