"""What a call costs beside its arithmetic: Python calls per call, tiny calls, a decode step's layers.

    python benchmarks/bench_overhead.py --out overhead.json
    python benchmarks/bench_overhead.py --blocks 4 --out overhead.json    # fewer pairs of blocks

Where the arrays are small, a call's time is its Python: argument checks, the plan lookup, the
launch. The pyperf rows time such calls among many others; this script holds them to targets of
their own (``ROWS``), each measured in this one process on warm calls:

- python calls: the Python function calls of one warm call (``cProfile``, builtins not counted,
  ``RoPE.__call__`` itself counted), on NumPy, torch CPU and the Triton path up to its launch
  (in a child process under ``TRITON_INTERPRET=1``, Triton's CPU interpreter, which torch's CPU
  tensors then take; the launch is a stub while the call is counted);
- x numpy formula: ``rope(q, offset=5)`` on a small q, NumPy and torch CPU, over the NumPy
  user's formula on the same values (``rope_variants.naive_formula``);
- x transformers: an 8-layer decode step, ``anyrope.layers.torch.RotaryEmbedding`` in each layer,
  over transformers' Llama code (its tables formed once per step, ``apply_rotary_pos_emb`` in
  each layer).

The ratios are timed as bench_paired.py times a pair (``bench_paired.alternate``), torch under
``torch.inference_mode`` as the pyperf rows run it. A row that cannot run here is skipped with
the reason; one that fails is an error row, and the others still run. benchmarks/run.py runs
this script in a process of its own and the report reads ``OUT/overhead.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib
import json
import os
import pstats
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rope_cases
from bench_paired import BLOCK_SECONDS, BLOCKS, Call, alternate
from rope_runtimes import Runtime, make_runtime

Record = dict[str, Any]
WARM_CALLS = 20  # before a call is counted: caches, plans and (under Triton's interpreter) the kernel
Q_DIMS, K_DIMS = (1, 8, 16, 64), (1, 2, 16, 64)  # the counted and tiny calls (the "small" case's q)
OFFSET = rope_cases.SMALL_OFFSET
LAYERS, DECODE_Q, DECODE_K = 8, (4, 8, 1, 64), (4, 2, 1, 64)  # a decode step: one token per sequence


@dataclass(frozen=True)
class Row:
    """One row of the table: what it measures, on what, which call, and the most its value may be."""

    measure: str
    backend: str
    call: str
    target: float


QUERY, PAIR = "rope(q, offset=5)", "rope(q, k, positions=p)"
STEP = f"{LAYERS} layers x rotary(q, k, positions=pos)"
# Every row, in the table's order, with its target: the one place the targets are written.
ROWS = {
    "calls/numpy/q": Row("python calls", "numpy", QUERY, 30),
    "calls/numpy/q,k": Row("python calls", "numpy", PAIR, 30),
    "calls/numpy-blocked/q": Row("python calls", "numpy-blocked", QUERY, 30),
    "calls/numpy-blocked/q,k": Row("python calls", "numpy-blocked", PAIR, 30),
    "calls/torch/q": Row("python calls", "torch", QUERY, 30),
    "calls/torch/q,k": Row("python calls", "torch", PAIR, 30),
    "calls/triton/q": Row("python calls", "triton", QUERY, 40),
    "calls/triton/q,k": Row("python calls", "triton", PAIR, 40),
    "tiny/numpy": Row("x numpy formula", "numpy", QUERY, 0.6),
    "tiny/torch": Row("x numpy formula", "torch", QUERY, 0.8),
    "decode/torch": Row("x transformers", "torch", STEP, 1.0),
}
COUNTED = ("q", "q,k")  # the counted calls, QUERY and PAIR, per backend
NOTES = (  # what the report says the rows are
    "python calls: the Python function calls of one warm call (cProfile, builtins not counted,",
    f"RoPE.__call__ counted); q {Q_DIMS} and k {K_DIMS} float32, p = arange({Q_DIMS[2]}); triton: torch",
    'CPU tensors under TRITON_INTERPRET=1 in use_fast_paths("triton"), counted up to the launch (a stub);',
    'numpy-blocked: NumPy in use_fast_paths("numpy-blocked"), the kernel NumPy takes where numba is absent.',
    "x numpy formula: the call's time over the NumPy formula's (numpy-formula) on the same q.",
    f"x transformers: a decode step ({LAYERS} layers, q {DECODE_Q}, k {DECODE_K}, positions 1000 + 97 i),",
    "anyrope.layers.torch.RotaryEmbedding in each layer, over transformers' LlamaRotaryEmbedding once a",
    "step and apply_rotary_pos_emb in each layer.",
    "Ratios: both in one process, in pairs of blocks of the same number of calls taking turns (A B, then",
    "B A); value: the median over the pairs of blocks (q1-q3); us, over us: median microseconds per call,",
    "or per layer, of the row and of what it is divided by. target: the most the value may be.",
)


def value(row: Record) -> float:
    """What the target bounds: the Python calls, or the ratio's median."""
    return float(row["calls"] if "calls" in row else row["ratio"])


def held(row: Record) -> bool | None:
    """Whether a row's value is within its target (None: the row has no value)."""
    return value(row) <= ROWS[row["id"]].target if row.get("status") == "ok" else None


def shown(row: Record) -> str:
    """The row's value as the table shows it: calls, or the ratio with its quartiles; else its status."""
    if row.get("status") != "ok":
        return str(row.get("status"))
    if "calls" in row:
        return str(row["calls"])
    return f"{row['ratio']:.2f} ({row['ratio_p25']:.2f}-{row['ratio_p75']:.2f})"


def verdict(rows: list[Record], within: Callable[[Record], bool | None] = held) -> str:
    """How many measured rows held their targets (``within``: whether a row did), and which missed."""
    ran = [row for row in rows if row.get("status") == "ok"]
    missed = [row["id"] for row in ran if not within(row)]
    text = f"{len(ran) - len(missed)} of {len(ran)} measured rows held their targets"
    return text + (f"; missed: {', '.join(missed)}" if missed else "")


def _row(name: str, **fields: Any) -> Record:
    row = ROWS[name]
    return {"id": name, "measure": row.measure, "backend": row.backend, "call": row.call, **fields}


def _missing(*modules: str) -> str:
    """Why the rows that need ``modules`` cannot run here, or ""."""
    return next((f"{m} is not installed" for m in modules if not rope_cases.installed(m)), "")


def python_calls(
    call: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    around: Callable[[], Any] | None = None,
) -> int:
    """The Python function calls of one warm ``call(*args, **kwargs)``, itself included: the sum of
    cProfile's call counts (builtins and C functions are not counted). ``around``: a context
    manager entered for the counted call only, after the warm-up."""
    for _ in range(WARM_CALLS):
        call(*args, **kwargs)
    profiler = cProfile.Profile(builtins=False)
    with around() if around else contextlib.nullcontext():
        profiler.runcall(call, *args, **kwargs)
    stats: dict[Any, tuple[Any, ...]] = vars(pstats.Stats(profiler))["stats"]  # function -> (calls, ...)
    return sum(int(entry[1]) for entry in stats.values())  # all its calls, recursive ones included


def _inputs(library: str) -> tuple[Any, Any, Any]:
    """q and k (seeded float32, the same values in NumPy and torch) and p = arange(16)."""
    np = importlib.import_module("numpy")
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal(dims, dtype=np.float32) for dims in (Q_DIMS, K_DIMS))
    if library == "numpy":
        return q, k, np.arange(Q_DIMS[2])
    torch = importlib.import_module("torch")
    return torch.from_numpy(q), torch.from_numpy(k), torch.arange(Q_DIMS[2])


class _StubKernel:
    """Stands in for the Triton kernel: ``kernel[grid](...)`` appends to ``launches``."""

    def __init__(self, launches: list[int]) -> None:
        self.launches = launches

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *_, **__: self.launches.append(1)


@contextlib.contextmanager
def _no_launch(launches: list[int]) -> Iterator[None]:
    """The Triton kernel replaced by a stub that appends to ``launches``: the call is counted up
    to the kernel's launch, the work that readies it (its arguments) included."""
    from anyrope._kernels import _triton

    kernel = _triton._rotate_kernel
    _triton._rotate_kernel = _StubKernel(launches)
    try:
        yield
    finally:
        _triton._rotate_kernel = kernel


def count_rows(backend: str) -> list[Record]:
    """The counted calls on ``backend``: "numpy" (numba's kernel where numba is installed),
    "numpy-blocked" (NumPy's kernel without numba, forced), "torch" (CPU), or "triton" (torch CPU
    tensors in ``use_fast_paths("triton")``, which needs ``TRITON_INTERPRET=1`` set before anyrope
    is imported)."""
    needs = {
        "numpy": ["numpy"],
        "numpy-blocked": ["numpy"],
        "torch": ["torch"],
        "triton": ["torch", "triton"],
    }
    why = _missing(*needs[backend])
    if why:
        return [_row(f"calls/{backend}/{which}", status="skipped", detail=why) for which in COUNTED]
    import anyrope

    rope = anyrope.RoPE(Q_DIMS[3])
    q, k, p = _inputs("torch" if backend in ("torch", "triton") else "numpy")
    calls = {"q": ((q,), {"offset": OFFSET}), "q,k": ((q, k), {"positions": p})}
    rows: list[Record] = []
    launches: list[int] = []
    stub = functools.partial(_no_launch, launches) if backend == "triton" else None
    forced = backend if backend in ("numpy-blocked", "triton") else None
    with anyrope.use_fast_paths(forced) if forced else contextlib.nullcontext():
        for which, (args, kwargs) in calls.items():
            name = f"calls/{backend}/{which}"
            launches.clear()
            rows.append(_row(name, status="ok", calls=python_calls(rope, args, kwargs, stub)))
            if stub and len(launches) != 1:  # the count would not have reached the launch
                raise RuntimeError(
                    f"{ROWS[name].call} launched the Triton kernel {len(launches)} times, not once"
                )
    return rows


def triton_rows() -> list[Record]:
    """``count_rows("triton")`` in a child process with ``TRITON_INTERPRET=1``."""
    why = _missing("torch", "triton")
    if why:
        return count_rows("triton")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--count", "triton"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise RuntimeError(f"the TRITON_INTERPRET=1 process failed: {lines[-1]}")
    rows: list[Record] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def _timed(name: str, rt: Runtime, a: Call, b: Call, blocks: int, block_s: float) -> Record:
    """A row of ``a``'s time over ``b``'s, timed in alternating blocks as ``rt`` times its calls,
    with each one's median microseconds per call, or per layer for the decode step."""
    timed = alternate(a, b, lambda call, loops: rt.time_loops(call, rt.finish, loops), blocks, block_s)
    per = LAYERS if name.startswith("decode/") else 1
    return _row(
        name, status="ok", **timed, per="layer" if per > 1 else "call",
        us=timed["median_s"] / per * 1e6, over_us=timed["over_median_s"] / per * 1e6,
    )  # fmt: skip


def _agree(name: str, got: Any, want: Any, atol: float) -> None:
    """Refuse to time two calls that do not compute the same."""
    np = importlib.import_module("numpy")
    worst = float(np.max(np.abs(np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64))))
    if not worst <= atol:
        raise RuntimeError(f"{name}: anyrope and the peer differ by {worst:.3g} (more than {atol:g})")


def tiny_rows(blocks: int = BLOCKS, block_s: float = BLOCK_SECONDS) -> list[Record]:
    """``rope(q, offset=5)`` on NumPy and on torch CPU (q of the same values), each over the NumPy
    user's formula on NumPy's q."""
    import anyrope

    from rope_variants import naive_formula

    np = importlib.import_module("numpy")
    rope, (q, _, _) = anyrope.RoPE(Q_DIMS[3]), _inputs("numpy")
    positions = np.arange(OFFSET, OFFSET + Q_DIMS[2])

    def formula() -> Any:
        return naive_formula(np, q, positions, "half")

    rows = []
    for library in ("numpy", "torch"):
        name, why = f"tiny/{library}", _missing(library)
        if why:
            rows.append(_row(name, status="skipped", detail=why))
            continue
        rt, call = make_runtime(library), functools.partial(rope, _inputs(library)[0], offset=OFFSET)
        with rt.scope():
            _agree(name, call(), formula(), 1e-5)
            rows.append(_timed(name, rt, call, formula, blocks, block_s))
    return rows


def decode_row(blocks: int = BLOCKS, block_s: float = BLOCK_SECONDS) -> Record:
    """An 8-layer decode step: anyrope's torch layer in each layer, over transformers' Llama code."""
    why = _missing("torch", "transformers")
    if why:
        return _row("decode/torch", status="skipped", detail=why)
    from anyrope.layers.torch import RotaryEmbedding

    torch = importlib.import_module("torch")
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(DECODE_Q, generator=gen) for _ in range(LAYERS)]
    ks = [torch.randn(DECODE_K, generator=gen) for _ in range(LAYERS)]
    pos = torch.tensor([[offset] for offset in rope_cases.decode_offsets(DECODE_Q[0])])  # (batch, 1)
    rotaries = [RotaryEmbedding(DECODE_Q[3], base=rope_cases.BASE) for _ in range(LAYERS)]
    config = llama.LlamaConfig(
        hidden_size=DECODE_Q[1] * DECODE_Q[3], num_attention_heads=DECODE_Q[1], num_key_value_heads=DECODE_K[1],
        head_dim=DECODE_Q[3], rope_theta=rope_cases.BASE, max_position_embeddings=8192,
    )  # fmt: skip
    rotary_emb, apply = llama.LlamaRotaryEmbedding(config=config), llama.apply_rotary_pos_emb

    def anyrope_step() -> list[Any]:
        return [rotary(q, k, positions=pos) for rotary, q, k in zip(rotaries, qs, ks, strict=True)]

    def transformers_step() -> list[Any]:
        cos, sin = rotary_emb(qs[0], pos)
        return [apply(q, k, cos, sin) for q, k in zip(qs, ks, strict=True)]

    rt = make_runtime("torch")
    with rt.scope():
        # float32 tables at positions near 1300: a few 1e-4 apart
        _agree("decode/torch", torch.stack([torch.cat(qk, 1) for qk in anyrope_step()]),
               torch.stack([torch.cat(qk, 1) for qk in transformers_step()]), 1e-3)  # fmt: skip
        return _timed("decode/torch", rt, anyrope_step, transformers_step, blocks, block_s)


def _guarded(names: list[str], measure: Callable[[], list[Record]]) -> list[Record]:
    """``measure()``'s rows, or an error row for each of ``names`` saying why it failed."""
    try:
        return measure()
    except Exception as error:  # noqa: BLE001 - a failure costs its rows, not the others'
        traceback.print_exc()
        why = f"{type(error).__name__}: {error}"[:200]
        return [_row(name, status="error", detail=why) for name in names]


def measure(blocks: int = BLOCKS, block_s: float = BLOCK_SECONDS) -> Record:
    """Every row of ``ROWS``, measured or saying why not: overhead.json's record."""
    if blocks < 1 or block_s <= 0:
        raise ValueError(f"blocks must be >= 1 and block_s > 0, got {blocks} and {block_s}")
    rows = []
    for backend in ("numpy", "numpy-blocked", "torch"):
        rows += _guarded([f"calls/{backend}/{w}" for w in COUNTED], functools.partial(count_rows, backend))
    rows += _guarded([f"calls/triton/{w}" for w in COUNTED], triton_rows)
    rows += _guarded(["tiny/numpy", "tiny/torch"], lambda: tiny_rows(blocks, block_s))
    rows += _guarded(["decode/torch"], lambda: [decode_row(blocks, block_s)])
    return {"status": "ok", "blocks": blocks, "block_s": block_s, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/bench_overhead.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--blocks", type=int, default=BLOCKS, help="pairs of blocks a ratio (default: %(default)s)"
    )
    parser.add_argument(
        "--block-seconds",
        type=float,
        default=BLOCK_SECONDS,
        help="least time a block takes (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, help="the record, as JSON")
    parser.add_argument(
        "--count",
        choices=["numpy", "numpy-blocked", "torch", "triton"],
        help="only count one backend's calls, as JSON on stdout",
    )
    args = parser.parse_args(argv)
    if args.count:
        print(json.dumps(count_rows(args.count)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    record = measure(args.blocks, args.block_seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for row in record["rows"]:
        print(f"overhead {row['id']}: {shown(row)}" + (f" ({row['detail']})" if "detail" in row else ""))
    print(f"overhead: {verdict(record['rows'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
