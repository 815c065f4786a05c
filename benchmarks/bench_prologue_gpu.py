"""The attention prologue's GPU targets (issue 56), for a lent GPU (benchmarks/gpu_session.sh):

    python benchmarks/bench_prologue_gpu.py --out gpu-out      # on a CUDA machine
    TRITON_INTERPRET=1 python benchmarks/bench_prologue_gpu.py --device cpu --quick   # a dry run

For decode (q 32x32x1x128, k and v 32x8x1x128) and prefill (q 1x32x2048x128, GQA 8), bfloat16,
a contiguous cache of 4096 rows at offset 1000, it times, in alternating rounds with CUDA events:
the fused call (``anyrope.prologue``, the Triton fusion), its steps apart (``use_fast_paths(False)``:
norm, rope, cache write), and a copy of the same bytes (q, k and v read, q and k written, k and v
written into the cache: four ``copy_`` launches). It writes ``prologue-gpu.json`` and prints, with
the device's name: the fused call's speed-up over the steps apart (target >= 1.6 at decode), and
the copy's time over the fused call's (the share of copy bandwidth: target >= 0.8 at prefill).
Then the same three calls for one sequence of 1 to 8192 tokens (the "sweep" rows, fewer rounds):
the fused call should never be slower than its steps apart at any token count, and the last line
says the least speed-up found.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

CASES = {"decode": (32, 32, 8, 1), "prefill": (1, 32, 8, 2048)}  # batch, heads, kv heads, tokens
SWEEP = (1, 16, 128, 512, 8192)  # one sequence's tokens: each a tile of its own, compiled once
HEAD_DIM, ROWS, OFFSET = 128, 4096, 1000


def _timer(torch: Any, device: str) -> Any:
    """Seconds per call of ``fn`` over ``loops`` back-to-back calls: CUDA events on a GPU."""

    def cuda(fn: Any, loops: int) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(loops):
            fn()
        end.record()
        torch.cuda.synchronize()
        return float(begin.elapsed_time(end)) / 1e3 / loops

    def host(fn: Any, loops: int) -> float:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        return (time.perf_counter() - start) / loops

    return cuda if device == "cuda" else host


def run(device: str, quick: bool) -> dict[str, Any]:
    import torch

    import anyrope

    timer = _timer(torch, device)
    rounds, loops = (2, 2) if quick else (15, 50)
    cases = dict(CASES) | {f"sweep-{n}": (1, 32, 8, n) for n in SWEEP}
    found: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "torch": torch.__version__,
        "cases": {},
    }
    for case, (batch, heads, kv_heads, seq) in cases.items():
        if quick:
            batch, heads, kv_heads, seq = min(batch, 2), 4, 2, min(seq, 8)
        swept = case.startswith("sweep")
        found["cases"][case] = _case(
            torch, anyrope, device, (batch, heads, kv_heads, seq), timer,
            max(2, rounds // 2) if swept else rounds, max(2, loops // 2) if swept else loops,
        )  # fmt: skip
    speedups = [row["fused_over_apart_speedup"] for row in found["cases"].values()]
    found["least_speedup"] = min(speedups)
    return found


def _case(
    torch: Any, anyrope: Any, device: str, dims: tuple[int, ...], timer: Any, rounds: int, loops: int
) -> dict[str, Any]:
    batch, heads, kv_heads, seq = dims

    def make(*shape: int) -> Any:
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    q, k, v = (
        make(batch, heads, seq, HEAD_DIM),
        make(batch, kv_heads, seq, HEAD_DIM),
        make(batch, kv_heads, seq, HEAD_DIM),
    )
    weight = 1 + 0.1 * make(HEAD_DIM)
    norm, rope = anyrope.QKNorm(weight, weight), anyrope.RoPE(HEAD_DIM)
    cache = anyrope.KVCache(make(batch, kv_heads, ROWS, HEAD_DIM), make(batch, kv_heads, ROWS, HEAD_DIM))
    outs = [torch.empty_like(q), torch.empty_like(k)]
    rows = slice(OFFSET, OFFSET + seq)
    call = {"rope": rope, "norm": norm, "cache": cache, "offset": OFFSET}

    def fused() -> Any:
        return anyrope.prologue(q, k, v, **call)

    def apart() -> Any:
        with anyrope.use_fast_paths(False):
            return anyrope.prologue(q, k, v, **call)

    def copy() -> None:
        outs[0].copy_(q)
        outs[1].copy_(k)
        cache.k[:, :, rows].copy_(k)
        cache.v[:, :, rows].copy_(v)

    calls = {"fused": fused, "apart": apart, "copy": copy}
    for fn in calls.values():  # warm: compile, keep the plans
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(timer(fn, loops))
    median = {name: statistics.median(values) for name, values in times.items()}
    moved = sum(x.numel() * x.element_size() for x in (q, k, v, q, k, k, v))
    return {
        "explain": anyrope.explain_prologue(q, k, v, **call), "seconds": median, "bytes": moved,
        "fused_over_apart_speedup": median["apart"] / median["fused"],
        "copy_share": median["copy"] / median["fused"],
        "fused_bandwidth_GBps": moved / median["fused"] / 1e9,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds: a dry run")
    parser.add_argument("--out", type=Path, default=None, help="write prologue-gpu.json into this folder")
    args = parser.parse_args()
    found = run(args.device, args.quick)
    print(found["device"], "torch", found["torch"])
    for case, row in found["cases"].items():
        print(
            f"{case}: fused {row['seconds']['fused'] * 1e6:.1f} us, steps apart {row['seconds']['apart'] * 1e6:.1f} us "
            f"(x{row['fused_over_apart_speedup']:.2f}), copy {row['seconds']['copy'] * 1e6:.1f} us "
            f"(share {row['copy_share']:.2f}, {row['fused_bandwidth_GBps']:.0f} GB/s); {row['explain'][:40]}"
        )
    print(f"least speed-up over the steps apart, every case: x{found['least_speedup']:.2f} (target: >= 1)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prologue-gpu.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
