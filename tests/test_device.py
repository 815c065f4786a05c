"""On a CUDA device: a call never reads a value back to the host, so it never waits for the GPU and
a captured CUDA graph replays it at new positions.

These run on the ``torch-cuda`` backend only (``pytest --backend torch-cuda``, or ``nox -s
tests-torch`` where torch sees a GPU) and skip elsewhere, saying so. Positions and offsets are
device tensors or Python ints here: a Python list of positions is copied to the device, which
torch counts as a synchronising copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

from harness import Backend

ROPES = {
    "plain": anyrope.RoPE(64),
    "partial interleaved": anyrope.RoPE(64, rotary_dim=32, layout="interleaved"),
    "dynamic": anyrope.RoPE(64, scaling=sc.DynamicNTK(2.0, 16)),
    "longrope": anyrope.RoPE(64, scaling=sc.LongRoPE([1.0 + i / 32 for i in range(32)], [2.0] * 32, 16)),
    "yarn": anyrope.RoPE(64, scaling=sc.YaRN(4.0, 16)),
}


# CUDA only: run with --backend torch-cuda on a machine with an NVIDIA GPU
pytestmark = pytest.mark.backends("torch-cuda")


@pytest.fixture
def cuda(backend: Backend) -> Any:
    import torch

    return torch


def _forms(torch: Any, device: Any) -> dict[str, Callable[[anyrope.RoPE, Any, Any], Any]]:
    rows = torch.tensor([3, 40], device=device)
    one = torch.tensor(9, device=device)
    flat = torch.tensor([5, 0, 70_000, 2], device=device)
    grid = torch.tensor([[0, 1, 2, 3], [-3, 17, 18, 19]], device=device, dtype=torch.int32)
    return {
        "int offset": lambda rope, q, k: rope(q, k, offset=7),
        "negative int offset": lambda rope, q, k: rope(q, k, offset=-7),
        "0-d offset": lambda rope, q, k: rope(q, k, offset=one),
        "per-row offsets": lambda rope, q, k: rope(q, k, offset=rows),
        "1-d positions": lambda rope, q, k: rope(q, k, positions=flat),
        "2-d positions": lambda rope, q, k: rope(q, k, positions=grid),
        "q only, seq_axis=-3": lambda rope, q, k: rope(q.transpose(1, 2), offset=rows, seq_axis=-3),
        "tables and apply": lambda rope, q, k: anyrope.apply(q, *rope.cos_sin(grid, like=q)),
        "rerotate": lambda rope, q, k: anyrope.rerotate(k, rope, rope.at_length(4096), positions=grid),
    }


@pytest.mark.parametrize("rope_name", list(ROPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_no_call_form_synchronises(cuda: Any, backend: Backend, rope_name: str, dtype: str) -> None:
    torch, rope = cuda, ROPES[rope_name]
    q = torch.randn(2, 8, 4, 64, device=backend.device, dtype=getattr(torch, dtype))
    k = torch.randn(2, 2, 4, 64, device=backend.device, dtype=getattr(torch, dtype))
    for name, form in _forms(torch, backend.device).items():
        form(rope, q, k)  # the first call makes the constant tables on the device, once
        torch.cuda.synchronize()
        try:
            with warnings.catch_warnings():  # torch warns that the mode is a prototype
                warnings.simplefilter("ignore", UserWarning)
                torch.cuda.set_sync_debug_mode("error")
            form(rope, q, k)
        except RuntimeError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        finally:  # the mode is process-wide: never left on for the next test
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("rope_name", list(ROPES))
def test_cuda_graph_replays_a_decode_step_at_new_positions(
    cuda: Any, backend: Backend, rope_name: str
) -> None:
    """Captured once with per-row offsets in a device tensor, replayed with new q, k and offsets
    (on both sides of the length thresholds of DynamicNTK and LongRoPE): equal to eager."""
    torch, rope = cuda, ROPES[rope_name]
    device = backend.device
    q = torch.randn(4, 8, 1, 64, device=device, dtype=torch.bfloat16)
    k = torch.randn(4, 2, 1, 64, device=device, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 3, 5, 9], device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(3):
            rope(q, k, offset=offsets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_q, out_k = rope(q, k, offset=offsets)
    rng = np.random.default_rng(0)
    for new_offsets in ([1, 2, 3, 4], [100, 7, 3_000, 65_536], [-2, 0, 15, 16]):
        q.copy_(torch.from_numpy(rng.standard_normal(q.shape)).to(q))
        k.copy_(torch.from_numpy(rng.standard_normal(k.shape)).to(k))
        offsets.copy_(torch.tensor(new_offsets))
        graph.replay()
        want_q, want_k = rope(q, k, offset=offsets)
        torch.testing.assert_close(out_q, want_q, rtol=0, atol=0)
        torch.testing.assert_close(out_k, want_k, rtol=0, atol=0)
