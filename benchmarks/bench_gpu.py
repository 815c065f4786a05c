"""The GPU benchmark: anyrope's CUDA kernels against a copy of the same bytes and against the peers.

    python benchmarks/bench_gpu.py --out bench-results     # on a machine with an NVIDIA GPU
    python benchmarks/bench_gpu.py --size tiny --device cpu  # a smoke run of the logic, anywhere

``nox -s bench`` runs it after the pyperf benchmark where it finds a GPU. One process, on purpose:
every variant of a case is timed in the same rounds, interleaved (variant A, B, C, then again), so
that clock and thermal drift fall on all of them alike, and the reported number of each is the
median over the rounds. A round times a loop of back-to-back calls with CUDA events, launch
overhead included: for the decode step, latency per call is what a serving loop pays.

What each row takes:
- prefill: q and k from position 0; a peer that needs tables is given them ready (built outside
  the timing, as a model builds them once per forward and shares them between layers);
- decode: one token per sequence, each sequence at its own cache length, the positions in a
  device array (no host read: a serving loop keeps them there).

The copy is one pass over the same bytes as an out-of-place rotation (read q and k, write two new
arrays): its time is the roofline, and "of copy" is copy time over the variant's time.
Each variant's result is compared with anyrope's before it is timed (max |difference|, listed):
a peer whose output disagrees is reported so, not silently timed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rope_runtimes import device_events

BASE = 10000.0
DTYPES = ("bfloat16", "float16", "float32")
LAYOUTS = ("half", "interleaved")
# (q dims, k dims) as (batch, heads, seq, head_dim); decode: one token, per-row cache lengths
SIZES = {
    "full": {
        "prefill": ((4, 32, 4096, 128), (4, 32, 4096, 128)),
        "prefill-gqa": ((4, 32, 4096, 128), (4, 8, 4096, 128)),
        "decode": ((256, 32, 1, 128), (256, 8, 1, 128)),
    },
    # one layer of one model step, the shapes of issue 24's compiled figures: latency, not bandwidth
    "step": {
        "prefill-gqa": ((1, 32, 4096, 128), (1, 8, 4096, 128)),
        "decode": ((32, 32, 1, 128), (32, 8, 1, 128)),
    },
    "tiny": {
        "prefill": ((1, 4, 64, 128), (1, 4, 64, 128)),
        "prefill-gqa": ((1, 4, 64, 128), (1, 2, 64, 128)),
        "decode": ((8, 4, 1, 128), (8, 2, 1, 128)),
    },
}
# the variants torch.compile and AOTInductor compile (each takes seconds): in these dtypes only
COMPILED_DTYPES = ("bfloat16", "float32")

Call = Callable[[], Any]


def cache_lengths(batch: int) -> list[int]:
    """Each sequence's cache length in the decode step: 1000 + 97 i."""
    return [1000 + 97 * i for i in range(batch)]


@dataclass
class Row:
    """One timed variant of one case."""

    backend: str
    case: str
    dtype: str
    layout: str
    variant: str
    seconds: list[float] = field(default_factory=list)
    diff: float | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")


def _import(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a peer that does not import here (missing, or broken against this torch)
        return None


def _load_file(name: str, path: Path) -> Any | None:
    """A peer's single module, loaded from its file (flash-attn's Triton rotary: its package's
    __init__ needs the compiled CUDA extension, which the rotary kernel does not)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - a peer file that does not load here
        return None
    return module


def _flash_attn_rotary() -> Any | None:
    found = _import("flash_attn.ops.triton.rotary")
    if found is not None:
        return found
    for entry in sys.path:  # a copy of the one file, named as below, on the path
        path = Path(entry) / "flash_attn_triton_rotary.py"
        if path.is_file():
            return _load_file("flash_attn_triton_rotary", path)
    return None


class Timer:
    """Times a loop of calls on one library's device, and says how many calls fill ``target`` s."""

    def __init__(self, library: str, device: str, target: float) -> None:
        self.target = target
        self._events = _device_timer(library, device)

    def _loop(self, call: Call, loops: int) -> float:
        if self._events is not None:  # the device's own events around the loop (rope_runtimes')
            return self._events(call, _block, loops) / loops
        # JAX (asynchronous dispatch: wait for the last result) and CPU torch (the smoke run)
        result = None
        begin = time.perf_counter()
        for _ in range(loops):
            result = call()
        _block(result)
        return (time.perf_counter() - begin) / loops

    def loops_for(self, call: Call) -> int:
        for _ in range(3):  # warm-up: compiles, autotunes, allocator pools
            _block(call())
        once = max(self._loop(call, 3), 1e-7)
        return max(3, min(10_000, int(self.target / once)))

    def time(self, call: Call, loops: int) -> float:
        return self._loop(call, loops)


def _device_timer(library: str, device: str) -> Callable[[Call, Callable[[Any], None], int], float] | None:
    """rope_runtimes' CUDA-event timer for torch CUDA and CuPy; None elsewhere."""
    if library == "torch" and device == "cuda":
        torch = importlib.import_module("torch")
        return device_events(
            lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize,
            lambda start, end: start.elapsed_time(end),
        )  # fmt: skip
    if library == "cupy":
        cupy = importlib.import_module("cupy")
        return device_events(cupy.cuda.Event, cupy.cuda.Device().synchronize, cupy.cuda.get_elapsed_time)
    return None


def _block(result: Any) -> None:
    for item in result if isinstance(result, (tuple, list)) else (result,):
        if hasattr(item, "block_until_ready"):
            item.block_until_ready()


def _max_diff(np: Any, got: Any, want: Any, to_numpy: Callable[[Any], Any]) -> float:
    pairs = zip(got, want, strict=True) if isinstance(want, tuple) else ((got, want),)
    worst = 0.0
    for a, b in pairs:
        a64, b64 = to_numpy(a).astype(np.float64), to_numpy(b).astype(np.float64)
        if a64.shape != b64.shape:
            raise ValueError(f"shape {a64.shape} != {b64.shape}")
        worst = max(worst, float(np.max(np.abs(a64 - b64))))
    return worst


# ---------------------------------------------------------------- torch (CUDA: the Triton kernel)


def torch_variants(
    case: str, dims: tuple[Any, Any], dtype: str, layout: str, device: str, aoti: bool = False
) -> dict[str, Any]:
    """name -> (call, result-for-comparison or None, note) for every torch variant of one case."""
    import torch

    import anyrope

    decode = case == "decode"
    qd, kd = dims
    gen = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, dtype)

    def randn(d: tuple[int, ...]) -> Any:
        return torch.randn(*d, generator=gen, device=device, dtype=torch.float32).to(dt)

    q, k = randn(qd), randn(kd)
    # the (batch, seq, heads, head_dim) buffers models project into; the peers that want them
    q_bshd, k_bshd = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    rope = anyrope.RoPE(qd[3], base=BASE, layout=layout)
    seq = qd[2]
    offsets: Any = torch.tensor(cache_lengths(qd[0]), device=device) if decode else 0
    ids = offsets[:, None] if decode else torch.arange(seq, device=device)[None, :]

    def ours() -> Any:
        return rope(q, k, offset=offsets)

    reference = ours()
    found: dict[str, Any] = {
        "copy": (lambda: (q.clone(), k.clone()), None, "q.clone(), k.clone()"),
        "anyrope": (ours, reference, "rope(q, k, offset=...)"),
    }
    q2, k2 = q.clone(), k.clone()
    found["anyrope-inplace"] = (lambda: rope(q2, k2, offset=offsets, inplace=True), None, "inplace=True")

    def bshd() -> Any:
        return rope(q_bshd, k_bshd, offset=offsets, seq_axis=-3)

    found["anyrope-bshd"] = (
        bshd,
        tuple(t.transpose(1, 2) for t in bshd()),
        "on (batch, seq, heads, dim) buffers, seq_axis=-3",
    )
    if dtype in COMPILED_DTYPES and device == "cuda":
        copy = torch.compile(lambda q, k: (q.clone(), k.clone()), fullgraph=True)
        found["copy-compiled"] = (lambda: copy(q, k), None, "torch.compile of q.clone(), k.clone()")
        compiled = torch.compile(lambda q, k, o: rope(q, k, offset=o), fullgraph=True)
        found["anyrope-compiled"] = (
            lambda: compiled(q, k, offsets),
            reference,
            "torch.compile(fullgraph=True)",
        )
        if aoti and layout == "half":  # the exported program is the generic code in either layout
            loaded = _aot_inductor(torch, rope, q, k, offsets)
            found["anyrope-aoti"] = (loaded, loaded(), "torch.export, AOTInductor's package loaded")
    if decode and device == "cuda":
        found["anyrope-graph"] = (_graphed(torch, ours), reference, "one CUDA graph replay")

    try:
        _torch_peers(found, torch, q, k, q_bshd, k_bshd, ids, offsets, qd, kd, dtype, layout, device)
    except Exception as exc:  # noqa: BLE001 - a peer whose API moved: its rows say so, the others run
        found["peers"] = (None, None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    return found


def _torch_peers(
    found: dict[str, Any], torch: Any, q: Any, k: Any, q_bshd: Any, k_bshd: Any, ids: Any, offsets: Any,
    qd: Any, kd: Any, dtype: str, layout: str, device: str,
) -> None:  # fmt: skip
    decode = not isinstance(offsets, int)
    dt = getattr(torch, dtype)
    seq = qd[2]
    positions = torch.arange(int(ids.max()) + 1 if decode else seq, device=device)
    inv_freq = 1.0 / (BASE ** (torch.arange(0, qd[3], 2, device=device, dtype=torch.float32) / qd[3]))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (positions, pairs), float32 as the peers do
    half_cos, half_sin = freqs.cos().to(dt), freqs.sin().to(dt)  # flash-attn's (positions, dim / 2)
    modeling = _import("transformers.models.llama.modeling_llama")
    if modeling is not None and layout == "half":
        config = modeling.LlamaConfig(
            hidden_size=qd[1] * qd[3], num_attention_heads=qd[1], num_key_value_heads=kd[1],
            head_dim=qd[3], max_position_embeddings=8192, rope_theta=BASE,
        )  # fmt: skip
        rotary = modeling.LlamaRotaryEmbedding(config=config).to(device)
        apply = modeling.apply_rotary_pos_emb
        cos, sin = rotary(q, ids)

        def full() -> Any:
            c, s = rotary(q, ids)
            return apply(q, k, c, s)

        found["transformers-apply"] = (lambda: apply(q, k, cos, sin), apply(q, k, cos, sin), "tables given")
        found["transformers-full"] = (full, full(), "rotary_emb(x, position_ids) + apply")
        if dtype in COMPILED_DTYPES and device == "cuda":
            hf_compiled = torch.compile(full, fullgraph=True)
            found["transformers-compiled"] = (hf_compiled, hf_compiled(), "torch.compile of the two")
        liger = _import("liger_kernel.ops.rope")
        if liger is not None and device == "cuda":
            lq, lk = q_bshd.clone().transpose(1, 2), k_bshd.clone().transpose(1, 2)  # in place, as in models
            fn = liger.LigerRopeFunction.apply
            found["liger-kernel"] = (
                lambda: fn(lq, lk, cos, sin),
                _liger_result(fn, q_bshd, k_bshd, cos, sin),
                "in place on (b, s, h, d) buffers, tables given",
            )
    infer = _import("flashinfer.rope") if device == "cuda" else None
    if infer is not None:  # ragged (tokens, heads, head_dim): the (b, s, h, d) buffers flattened
        fq, fk = q_bshd.reshape(-1, qd[1], qd[3]), k_bshd.reshape(-1, kd[1], kd[3])
        token_ids = ids.expand(qd[0], seq).reshape(-1).to(torch.int32)  # a position per token

        def infer_call() -> Any:
            return infer.apply_rope_pos_ids(
                fq, fk, token_ids, interleave=layout == "interleaved", rope_theta=BASE
            )

        got = infer_call()
        found["flashinfer"] = (
            infer_call,
            tuple(t.reshape(qd[0], seq, -1, qd[3]).transpose(1, 2) for t in got),
            "apply_rope_pos_ids, angles in the kernel, (tokens, h, d)",
        )
    flash = _flash_attn_rotary() if device == "cuda" else None
    if flash is not None:
        rows = offsets.to(torch.int32) if decode else 0
        inter = layout == "interleaved"

        def flash_call() -> Any:
            return (
                flash.apply_rotary(q_bshd, half_cos, half_sin, seqlen_offsets=rows, interleaved=inter),
                flash.apply_rotary(k_bshd, half_cos, half_sin, seqlen_offsets=rows, interleaved=inter),
            )

        got = flash_call()
        found["flash-attn"] = (
            flash_call, tuple(t.transpose(1, 2) for t in got), "apply_rotary (Triton), tables given, (b, s, h, d)"
        )  # fmt: skip


def _aot_inductor(torch: Any, rope: Any, q: Any, k: Any, offsets: Any) -> Call:
    """The call in a module, exported and compiled ahead of time by AOTInductor, its package
    loaded: what a model served from a ``.pt2`` file runs (decode offsets an input)."""
    import tempfile

    from torch._inductor import aoti_compile_and_package, aoti_load_package

    decode = not isinstance(offsets, int)

    class Rotate(torch.nn.Module):  # type: ignore[misc]
        def forward(self, q: Any, k: Any, *rows: Any) -> Any:
            return rope(q, k, offset=rows[0] if decode else 0)

    inputs = (q, k, offsets) if decode else (q, k)
    with tempfile.TemporaryDirectory() as folder:  # the loaded package keeps what it needs
        program = torch.export.export(Rotate(), inputs)
        loaded = aoti_load_package(aoti_compile_and_package(program, package_path=folder + "/rope.pt2"))
    return lambda: loaded(*inputs)


def _liger_result(fn: Any, q_bshd: Any, k_bshd: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    q, k = q_bshd.clone().transpose(1, 2), k_bshd.clone().transpose(1, 2)
    out = fn(q, k, cos, sin)
    return out[0], out[1]


def _graphed(torch: Any, call: Call) -> Call:
    """``call`` captured once in a CUDA graph: the replay is the GPU's time alone."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    replay: Call = graph.replay
    return replay


# ---------------------------------------------------------------- CuPy (the CUDA C++ kernel), JAX


def cupy_variants(case: str, dims: tuple[Any, Any], dtype: str, layout: str) -> dict[str, Any]:
    import cupy

    import anyrope

    if dtype == "bfloat16":
        return {}
    rng = cupy.random.default_rng(0)
    q, k = (rng.standard_normal(d, dtype=cupy.float32).astype(dtype) for d in dims)
    rope = anyrope.RoPE(dims[0][3], base=BASE, layout=layout)
    offsets = cupy.asarray(cache_lengths(dims[0][0])) if case == "decode" else 0

    def ours() -> Any:
        return rope(q, k, offset=offsets)

    return {
        "copy": (lambda: (q.copy(), k.copy()), None, "q.copy(), k.copy()"),
        "anyrope": (ours, ours(), "rope(q, k, offset=...)"),
    }


def jax_variants(case: str, dims: tuple[Any, Any], dtype: str, layout: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import anyrope

    gpu = jax.devices("gpu")[0]
    keys = jax.random.split(jax.random.key(0))
    q, k = (
        jax.device_put(jax.random.normal(key, d, dtype=jnp.float32).astype(getattr(jnp, dtype)), gpu)
        for key, d in zip(keys, dims, strict=True)
    )
    rope = anyrope.RoPE(dims[0][3], base=BASE, layout=layout)
    offsets = jax.device_put(jnp.asarray(cache_lengths(dims[0][0])), gpu) if case == "decode" else 0
    jitted = jax.jit(lambda q, k, o: rope(q, k, offset=o))
    copy = jax.jit(lambda q, k: (q.copy(), k.copy()))
    found = {
        "copy": (lambda: copy(q, k), None, "jax.jit of q.copy(), k.copy()"),
        "anyrope-jit": (lambda: jitted(q, k, offsets), jitted(q, k, offsets), "jax.jit(rope)"),
    }
    if case == "decode":
        found["anyrope"] = (lambda: rope(q, k, offset=offsets), None, "eager")
    return found


# ---------------------------------------------------------------- the run


def _variants(
    backend: str, case: str, dims: Any, dtype: str, layout: str, device: str, aoti: bool
) -> dict[str, Any]:
    if backend == "torch":
        return torch_variants(case, dims, dtype, layout, device, aoti)
    if backend == "cupy":
        return cupy_variants(case, dims, dtype, layout)
    return jax_variants(case, dims, dtype, layout)


def _to_numpy(backend: str) -> Callable[[Any], Any]:
    import numpy as np

    if backend == "torch":
        return lambda t: t.detach().float().cpu().numpy()
    if backend == "cupy":
        return lambda t: t.get()
    return lambda t: np.asarray(t.astype("float32"))


def run_case(
    backend: str,
    case: str,
    dims: Any,
    dtype: str,
    layout: str,
    device: str,
    rounds: int,
    target: float,
    aoti: bool = False,
) -> list[Row]:
    import numpy as np

    timer = Timer(backend, device, target)
    name = f"{backend}-{device}" if backend == "torch" else backend
    rows, timed = [], []
    reference = None  # anyrope's result (eager, or jitted on JAX): what every other result is held to
    for variant, (call, result, note) in _variants(backend, case, dims, dtype, layout, device, aoti).items():
        row = Row(name, case, dtype, layout, variant, note=note)
        rows.append(row)
        if call is None:
            continue
        try:
            if variant in ("anyrope", "anyrope-jit") and reference is None:
                reference = result
            elif result is not None and reference is not None:
                row.diff = _max_diff(np, result, reference, _to_numpy(backend))
            timed.append((row, call, timer.loops_for(call)))
        except Exception as exc:  # noqa: BLE001 - one broken peer costs its own row only
            row.note = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    for _ in range(rounds):
        for row, call, loops in timed:
            row.seconds.append(timer.time(call, loops))
    return rows


def _device_name(backend: str, device: str) -> str:
    if backend == "torch" and device == "cuda":
        import torch

        return str(torch.cuda.get_device_name())
    return device


def _versions(backend: str) -> str:
    """The versions a GPU figure depends on: the library's, its compiler's and the peers'."""
    names = {
        "torch": ("torch", "triton", "transformers", "flashinfer"),
        "cupy": ("cupy",),
        "jax": ("jax", "jaxlib"),
    }[backend]
    modules = {name: _import(name) for name in names}
    return ", ".join(f"{n} {getattr(m, '__version__', '?')}" if m else f"no {n}" for n, m in modules.items())


def report(rows: list[Row]) -> str:
    """A Markdown table per backend and case: median time, share of the copy, peers' ratio."""
    out = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.backend, row.case), []).append(row)
    for (backend, case), found in groups.items():
        out.append(f"\n### {backend}, {case}\n")
        out.append("| dtype | layout | variant | median | of copy | max abs diff vs anyrope | note |")
        out.append("| --- | --- | --- | ---: | ---: | ---: | --- |")
        for row in found:
            copy = next(
                (r for r in found if r.dtype == row.dtype and r.layout == row.layout and r.variant == "copy"),
                None,
            )
            share = f"{copy.median / row.median:.0%}" if copy and row.seconds and copy.seconds else ""
            time_text = f"{row.median * 1e6:.1f} us" if row.seconds else "-"
            diff = "" if row.diff is None else f"{row.diff:.2g}"
            out.append(
                f"| {row.dtype} | {row.layout} | {row.variant} | {time_text} | {share} | {diff} | {row.note} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/bench_gpu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of torch")
    parser.add_argument("--backend", action="append", choices=("torch", "cupy", "jax"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target", type=float, default=0.02, help="seconds per timed loop")
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--case", action="append", choices=tuple(SIZES["full"]))
    parser.add_argument(
        "--aoti",
        action="store_true",
        help="also time AOTInductor packages (torch 2.11's loader segfaulted on an H200 for any CUDA package)",
    )
    args = parser.parse_args(argv)
    backends = args.backend or (["torch"] if args.device == "cpu" else ["torch", "cupy", "jax"])
    rows: list[Row] = []
    header = []
    for backend in backends:
        if backend != "torch" and _import(backend) is None:
            header.append(f"{backend}: not installed, skipped")
            continue
        header.append(f"{backend}: {_device_name(backend, args.device)} ({_versions(backend)})")
        for case, dims in SIZES[args.size].items():
            if args.case and case not in args.case:
                continue
            for dtype in args.dtype or DTYPES:
                for layout in LAYOUTS:
                    found = run_case(
                        backend,
                        case,
                        dims,
                        dtype,
                        layout,
                        args.device,
                        args.rounds,
                        args.target,
                        args.aoti,
                    )
                    rows.extend(found)
                    print(report(found), flush=True)
    text = "\n".join(header) + "\n" + report(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.md").write_text(text)
    (args.out / "gpu.json").write_text(
        json.dumps([{**row.__dict__, "median": row.median} for row in rows], indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
