"""The attention prologue's targets: the fused call over its steps apart, and over transformers.

    python benchmarks/bench_prologue.py --out prologue.json
    python benchmarks/bench_prologue.py --blocks 4 --out prologue.json   # fewer pairs of blocks

Each row times ``anyrope.prologue(q, k, v, rope=, norm=, cache=, offset=)`` (QK-norm, RoPE and the
KV-cache write; the fused kernel where one takes the call, as ``explain_prologue`` says) against
one composition, both in this process, in alternating blocks (``bench_paired.alternate``), after
checking that both compute the same q, k and cache:

- x steps apart: anyrope's own steps, ``norm.q``, ``norm.k``, ``rope(q, k)``, then the cache rows
  assigned by slicing (the cheapest write there is);
- x transformers: transformers' composition, as its Qwen3 attention runs it: ``Qwen3RMSNorm`` on q
  and k, ``apply_rotary_pos_emb`` with the step's cos and sin (formed once a step, outside the
  timed call, as the model shares them across layers), and ``index_copy_`` into the cache, as
  its static cache writes;
- x mlx fast ops: MLX's own ops, ``mx.fast.rms_norm`` and ``mx.fast.rope`` on q and k, and the
  cache rows assigned by slicing (the issue's MLX target: no slower than these).

Cases (float32, a contiguous ``(batch, kv_heads, 4096, head_dim)`` cache, offset 1000):
decode, q 32x32x1x128 and k, v 32x8x1x128; prefill, q 1x32x2048x128 and k, v 1x8x2048x128 (GQA 8).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_overhead import verdict
from bench_paired import BLOCK_SECONDS, BLOCKS, alternate
from rope_runtimes import make_runtime

Record = dict[str, Any]
HEAD_DIM, CACHE_ROWS, OFFSET, EPS = 128, 4096, 1000, 1e-6
CASES = {"decode": (32, 32, 8, 1), "prefill": (1, 32, 8, 2048)}  # batch, heads, kv heads, tokens


@dataclass(frozen=True)
class Row:
    measure: str
    backend: str
    case: str
    target: float


# Every row, in the table's order, with its target: the one place the targets are written.
ROWS = {
    "prologue/numpy/decode": Row("x steps apart", "numpy", "decode", 0.6),
    "prologue/numpy/prefill": Row("x steps apart", "numpy", "prefill", 0.6),
    "prologue/torch/decode": Row("x steps apart", "torch", "decode", 0.6),
    "prologue/torch/prefill": Row("x steps apart", "torch", "prefill", 0.6),
    "prologue-hf/torch/decode": Row("x transformers", "torch", "decode", 0.5),
    "prologue-hf/torch/prefill": Row("x transformers", "torch", "prefill", 0.5),
    "prologue-fast/mlx/decode": Row("x mlx fast ops", "mlx", "decode", 1.0),
    "prologue-fast/mlx/prefill": Row("x mlx fast ops", "mlx", "prefill", 1.0),
}


NOTES = (  # what the report says the rows are
    "The attention prologue: anyrope.prologue(q, k, v, rope=, norm=, cache=, offset=1000), QK-norm, RoPE and",
    f"the KV-cache write (float32, head_dim {HEAD_DIM}, a contiguous (batch, kv_heads, {CACHE_ROWS}, head_dim) cache);",
    "decode: q 32x32x1x128, k and v 32x8x1x128; prefill: q 1x32x2048x128, k and v 1x8x2048x128 (GQA 8).",
    "x steps apart: over norm.q, norm.k, rope(q, k) and the cache rows assigned by slicing (equal bit for bit);",
    "x transformers: over Qwen3's composition (Qwen3RMSNorm on q and k, apply_rotary_pos_emb with the",
    "step's cos and sin, index_copy_ into the cache); x mlx fast ops: over mx.fast.rms_norm and mx.fast.rope",
    "on q and k and the cache rows assigned by slicing. path: what explain_prologue says takes the call.",
    "Ratios as in the call-overhead table: pairs of blocks taking turns in one process, the median over",
    "the pairs (q1-q3); us, over us: median microseconds per call of the row and of what it is divided by.",
)


def held(row: Record) -> bool | None:
    """Whether a row's ratio is within its target (None: the row has no ratio)."""
    return row["ratio"] <= ROWS[row["id"]].target if row.get("status") == "ok" else None


def _arrays(library: str, case: str) -> dict[str, Any]:
    np = importlib.import_module("numpy")
    batch, heads, kv_heads, tokens = CASES[case]
    rng = np.random.default_rng(0)
    made = {
        "q": rng.standard_normal((batch, heads, tokens, HEAD_DIM), dtype=np.float32),
        "k": rng.standard_normal((batch, kv_heads, tokens, HEAD_DIM), dtype=np.float32),
        "v": rng.standard_normal((batch, kv_heads, tokens, HEAD_DIM), dtype=np.float32),
        "q_weight": (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32),
        "k_weight": (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32),
    }
    if library == "torch":
        torch = importlib.import_module("torch")
        made = {name: torch.from_numpy(value) for name, value in made.items()}
    elif library == "mlx":
        mx = importlib.import_module("mlx.core")
        made = {name: mx.array(value) for name, value in made.items()}
    return made


def _cache(library: str, case: str) -> Any:
    import anyrope

    np = importlib.import_module("numpy")
    batch, _, kv_heads, _ = CASES[case]
    shape = (batch, kv_heads, CACHE_ROWS, HEAD_DIM)
    if library == "torch":
        torch = importlib.import_module("torch")
        return anyrope.KVCache(torch.zeros(shape), torch.zeros(shape))
    if library == "mlx":
        mx = importlib.import_module("mlx.core")
        return anyrope.KVCache(mx.zeros(shape), mx.zeros(shape))
    return anyrope.KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def _same(name: str, got: Any, want: Any, atol: float) -> None:
    """Refuse to time two calls that do not compute the same q, k and caches: bit for bit
    (``atol`` 0), or within ``atol``."""
    np = importlib.import_module("numpy")
    for a, b in zip(got, want, strict=True):
        worst = float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))
        if not worst <= atol:
            raise RuntimeError(f"{name}: the prologue and what it is timed against differ by {worst:.3g}")


def measure_row(name: str, blocks: int, block_s: float) -> Record:
    import anyrope

    row = ROWS[name]
    try:
        runtime = make_runtime(row.backend)
    except ImportError as error:
        return {"id": name, "status": "skipped", "detail": str(error)}
    arrays = _arrays(row.backend, row.case)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    rope = anyrope.RoPE(HEAD_DIM)
    norm = anyrope.QKNorm(arrays["q_weight"], arrays["k_weight"], eps=EPS)
    fused_cache, other_cache = _cache(row.backend, row.case), _cache(row.backend, row.case)
    tokens = CASES[row.case][3]

    # Each call returns what it wrote, the caches too: a lazy library (MLX) evaluates all of it.
    def fused() -> Any:
        out = anyrope.prologue(q, k, v, rope=rope, norm=norm, cache=fused_cache, offset=OFFSET)
        return out.q, out.k, fused_cache.k, fused_cache.v

    if row.measure == "x steps apart":

        def other() -> Any:
            rotated_q, rotated_k = rope(norm.q(q), norm.k(k), offset=OFFSET)
            other_cache.k[:, :, OFFSET : OFFSET + tokens] = rotated_k
            other_cache.v[:, :, OFFSET : OFFSET + tokens] = v
            return rotated_q, rotated_k, other_cache.k, other_cache.v

    elif row.measure == "x mlx fast ops":
        other = _mlx_fast(arrays, other_cache, tokens)
    else:
        other = _transformers(arrays, other_cache, tokens)
    with runtime.scope():
        # transformers and MLX's fast ops form their angles in float32: a few 1e-4 apart near 1000
        _same(name, fused(), other(), 0.0 if row.measure == "x steps apart" else 2e-3)
        said = anyrope.explain_prologue(q, k, v, rope=rope, norm=norm, cache=fused_cache, offset=OFFSET)
        timed = alternate(fused, other, lambda call, loops: runtime.time_loops(call, runtime.finish, loops),
                          blocks, block_s)  # fmt: skip
    return {
        "id": name, "status": "ok", "measure": row.measure, "backend": row.backend, "case": row.case,
        "target": row.target, "path": said.split(" (")[0],
        "us": timed["median_s"] * 1e6, "over_us": timed["over_median_s"] * 1e6, **timed,
    }  # fmt: skip


def _mlx_fast(arrays: dict[str, Any], cache: Any, tokens: int) -> Any:
    """MLX's own fast ops, one call each: ``mx.fast.rms_norm`` on q and k, ``mx.fast.rope`` on
    both, and the cache rows assigned by slicing."""
    mx = importlib.import_module("mlx.core")
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    q_weight, k_weight = arrays["q_weight"], arrays["k_weight"]

    def step() -> Any:
        rotated_q = mx.fast.rope(mx.fast.rms_norm(q, q_weight, EPS), HEAD_DIM, traditional=False,
                                 base=10000.0, scale=1.0, offset=OFFSET)  # fmt: skip
        rotated_k = mx.fast.rope(mx.fast.rms_norm(k, k_weight, EPS), HEAD_DIM, traditional=False,
                                 base=10000.0, scale=1.0, offset=OFFSET)  # fmt: skip
        cache.k[:, :, OFFSET : OFFSET + tokens] = rotated_k
        cache.v[:, :, OFFSET : OFFSET + tokens] = v
        return rotated_q, rotated_k, cache.k, cache.v

    return step


def _transformers(arrays: dict[str, Any], cache: Any, tokens: int) -> Any:
    """transformers' Qwen3 composition: its RMSNorm modules, apply_rotary_pos_emb, index_copy_."""
    torch = importlib.import_module("torch")
    qwen3 = importlib.import_module("transformers.models.qwen3.modeling_qwen3")
    config = qwen3.Qwen3Config(
        hidden_size=32 * HEAD_DIM, num_attention_heads=32, num_key_value_heads=8, head_dim=HEAD_DIM,
        rms_norm_eps=EPS, max_position_embeddings=8192, rope_theta=10000.0,
    )  # fmt: skip
    q_norm, k_norm = qwen3.Qwen3RMSNorm(HEAD_DIM, eps=EPS), qwen3.Qwen3RMSNorm(HEAD_DIM, eps=EPS)
    with torch.no_grad():
        q_norm.weight.copy_(arrays["q_weight"])
        k_norm.weight.copy_(arrays["k_weight"])
    positions = torch.arange(OFFSET, OFFSET + tokens)
    cos, sin = qwen3.Qwen3RotaryEmbedding(config=config)(arrays["q"], positions[None, :])
    q, k, v = arrays["q"], arrays["k"], arrays["v"]

    def step() -> Any:
        with torch.no_grad():
            rotated_q, rotated_k = qwen3.apply_rotary_pos_emb(q_norm(q), k_norm(k), cos, sin)
            cache.k.index_copy_(2, positions, rotated_k)
            cache.v.index_copy_(2, positions, v)
        return rotated_q, rotated_k, cache.k, cache.v

    return step


def _machine() -> Record:
    """Where the rows were timed: the platform, the CPU, Python and the libraries' versions."""
    import importlib.metadata
    import os
    import platform

    versions = {}
    for dist in ("anyrope", "numpy", "numba", "torch", "mlx", "transformers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    cpu = platform.processor()
    with contextlib.suppress(OSError):  # Linux names the model here; platform.processor() often not
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
    return {
        "platform": platform.platform(), "cpu_model_name": cpu, "cpu_count": os.cpu_count(),
        "python_version": platform.python_version(), "versions": versions,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/bench_prologue.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--blocks", type=int, default=BLOCKS, help="pairs of blocks a ratio (default: %(default)s)"
    )
    parser.add_argument("--block-seconds", type=float, default=BLOCK_SECONDS, help="default: %(default)s")
    parser.add_argument("--out", type=Path, required=True, help="the record, as JSON")
    args = parser.parse_args(argv)
    if args.blocks < 1:
        raise ValueError(f"--blocks must be at least 1, got {args.blocks}")
    rows = []
    for name in ROWS:
        try:
            rows.append(measure_row(name, args.blocks, args.block_seconds))
        except Exception as error:  # noqa: BLE001 - a failure costs its row, not the others'
            rows.append({"id": name, "status": "error", "detail": f"{type(error).__name__}: {error}"[:200]})
        row = rows[-1]
        if row["status"] == "ok":
            print(f"{name}: {row['ratio']:.2f} ({row['ratio_p25']:.2f}-{row['ratio_p75']:.2f}) "
                  f"{row['us']:.0f} us over {row['over_us']:.0f} us, target {row['target']}, {row['path']}",
                  flush=True)  # fmt: skip
        else:
            print(f"{name}: {row['status']} ({row.get('detail', '')})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "status": "ok", "blocks": args.blocks, "block_s": args.block_seconds, "machine": _machine(),
        "rows": rows,
    }  # fmt: skip
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"prologue: {verdict(rows, held)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
