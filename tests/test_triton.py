"""The Triton kernel beyond the shared kernel tests (tests/test_kernels.py): its torch custom ops,
compiled without a graph break, captured in a CUDA graph, on strided and unusual inputs, and
the calls it leaves to the generic kernel.

It runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
``nox -s tests-torch-triton``); elsewhere these tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope.scaling import DynamicNTK

from harness import Backend, assert_close, compiled_ops, skip_unless_it_runs

TRITON = next(k for k in anyrope.kernels() if k.name == "triton")
pytestmark = pytest.mark.backends("torch")  # the tests that take a backend: the kernel's library


@pytest.fixture
def torch_backend(backend: Backend) -> Backend:
    return skip_unless_it_runs(backend, "the Triton kernel", TRITON.devices, TRITON.available)


def _tensor(backend: Backend, shape: tuple[int, ...], dtype: str = "float32", seed: int = 0) -> Any:
    return backend.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _both(call: Any) -> tuple[Any, Any]:
    with anyrope.use_fast_paths("triton"):
        fast = call()
    with anyrope.use_fast_paths(False):
        generic = call()
    return fast, generic


def test_custom_ops_pass_opcheck(torch_backend: Backend) -> None:
    """Schemas, fake (meta) implementations, autograd registration and AOT dispatch."""
    import torch

    from anyrope._kernels import _triton

    x = _tensor(torch_backend, (2, 3, 5, 16)).requires_grad_()
    steps = torch.tensor(
        [[1.0, 0.1, 0.01, 0.001], [0.5, 0.05, 0.005, 0.0005], [0.2, 0.02, 0.002, 0.0002], [1.0] * 4],
        dtype=torch.float64,
        device=x.device,
    )
    positions = torch.arange(10, dtype=torch.int64, device=x.device).reshape(2, 5)[None]
    args = (positions, 0, steps, None, None, None, 2, 4, _triton.HALF, -2)
    torch.library.opcheck(torch.ops.anyrope.rotate.default, (x, *args))
    torch.library.opcheck(torch.ops.anyrope.rotate_.default, (x.detach().clone(), *args))
    y = _tensor(torch_backend, (2, 5, 1, 16), seed=1).requires_grad_()  # its own sequence axis
    pair = (x, y, *args[:-1], -2, -3)
    torch.library.opcheck(torch.ops.anyrope.rotate_pair.default, pair)
    torch.library.opcheck(
        torch.ops.anyrope.rotate_pair_.default, (x.detach().clone(), y.detach().clone(), *pair[2:])
    )


def test_compiled_without_graph_break(torch_backend: Backend) -> None:
    """torch.compile(fullgraph=True) traces the op itself (not the generic formula) for q and k,
    with positions as a tensor and an int offset."""
    import torch

    rope = anyrope.RoPE(32, rotary_dim=24)
    q, k = _tensor(torch_backend, (2, 4, 7, 32)), _tensor(torch_backend, (2, 2, 7, 32), seed=1)
    positions = torch_backend.asarray(np.arange(14).reshape(2, 7) * 37)

    def both(q: Any, k: Any, p: Any) -> Any:
        return rope(q, k, positions=p), rope(q, offset=5)

    with anyrope.use_fast_paths("triton"):
        seen = compiled_ops(both, q, k, positions)
        torch._dynamo.reset()
        (got_q, got_k), shifted = torch.compile(both, fullgraph=True)(q, k, positions)
    ops = [target.removesuffix(".default") for target in seen if target.startswith("anyrope.rotate")]
    assert ops == ["anyrope.rotate_pair", "anyrope.rotate"], seen  # q and k together, then q
    (want_q, want_k), want_shifted = _both(lambda: both(q, k, positions))[1]
    for got, want in ((got_q, want_q), (got_k, want_k), (shifted, want_shifted)):
        assert torch.equal(got, want)


def test_q_and_k_in_one_launch(torch_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """q and k of one call share one launch: heads, sequence axes, lengths and strides of their
    own, in place, partial rotary, gradients; q and k of different dtypes take one launch each."""
    import torch

    from anyrope._kernels import _triton

    launches: list[int] = []
    launch = _triton._launch
    monkeypatch.setattr(
        _triton, "_launch", lambda arrays, *a, **kw: (launches.append(len(arrays)), launch(arrays, *a, **kw))
    )
    rope = anyrope.RoPE(32, rotary_dim=24, layout="interleaved")
    q = _tensor(torch_backend, (3, 5, 9, 32))
    k = _tensor(torch_backend, (3, 9, 2, 32), seed=1)[:, :7].transpose(1, 2)  # (3, 2, 7, 32), strided
    positions = torch_backend.asarray(np.arange(27).reshape(3, 9) * 41)
    calls = {
        "offsets": lambda: rope(q, k, offset=[4, 0, 9]),
        "positions": lambda: rope(q[:, :, 2:], k, positions=positions[:, :7]),
        "seq axes": lambda: rope(q.transpose(1, 2), k.transpose(1, 2), offset=3, seq_axis=-3),
        "in place": lambda: rope(q.clone(), k.clone(), offset=[4, 0, 9], inplace=True),
    }
    for name, call in calls.items():
        launches.clear()
        fast, generic = _both(call)
        assert launches == [2], name
        for got, want in zip(fast, generic, strict=True):
            assert torch.equal(got, want), name
    launches.clear()
    with anyrope.use_fast_paths("triton"):
        rope(q, k.double(), offset=2)
    assert launches == [1, 1]
    q_grad, k_grad = q.clone().requires_grad_(), k.clone().requires_grad_()
    with anyrope.use_fast_paths("triton"):
        got_q, got_k = rope(q_grad, k_grad, offset=[4, 0, 9])
        (got_q.square().sum() + 3 * got_k.sum()).backward()
    want_q, want_k = q.clone().requires_grad_(), k.clone().requires_grad_()
    with anyrope.use_fast_paths(False):
        generic_q, generic_k = rope(want_q, want_k, offset=[4, 0, 9])
        (generic_q.square().sum() + 3 * generic_k.sum()).backward()
    # the generic gradient rounds through other operations: float32's few-ulp agreement
    torch.testing.assert_close(q_grad.grad, want_q.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_grad.grad, want_k.grad, rtol=1e-6, atol=1e-6)


def test_strided_inputs(torch_backend: Backend) -> None:
    """q as (batch, heads, seq, head_dim) views of (batch, seq, heads, head_dim) and of a fused
    qkv projection; in place through strides the kernel cannot view as its five axes."""
    import torch

    rope = anyrope.RoPE(16, layout="interleaved")
    stored = _tensor(torch_backend, (2, 9, 4, 16))
    q = stored.transpose(1, 2)  # not contiguous
    qkv = _tensor(torch_backend, (2, 9, 3, 4, 16), seed=2)
    from_qkv = qkv[:, :, 0].transpose(1, 2)
    for x in (q, from_qkv):
        fast, generic = _both(lambda x=x: rope(x, offset=[2, 7]))
        assert torch.equal(fast, generic)
    twisted = _tensor(torch_backend, (4, 9, 2, 16), seed=3).permute(
        2, 0, 1, 3
    )  # (2, 4, 9, 16), batch strided
    want = _both(lambda: rope(twisted.clone(), offset=[2, 7]))[1]
    with anyrope.use_fast_paths("triton"):
        got = rope(twisted, offset=[2, 7], inplace=True)
    assert got is twisted
    assert torch.equal(twisted, want)


def test_many_heads_and_tokens(torch_backend: Backend) -> None:
    """Several token blocks, and a last group of heads that is not full (11 heads in groups of 8)."""
    import torch

    rope = anyrope.RoPE(128)
    x = _tensor(torch_backend, (1, 11, 70, 128), "bfloat16")
    for call in ({"offset": 3}, {"positions": torch_backend.asarray(np.arange(70)[::-1].copy())}):
        fast, generic = _both(lambda call=call: rope(x, **call))
        assert torch.equal(fast, generic)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32"])
def test_narrow_position_dtypes(torch_backend: Backend, dtype: str) -> None:
    import torch

    rope = anyrope.RoPE(16)
    x = _tensor(torch_backend, (2, 3, 6, 16))
    positions = torch.tensor([[250, 0, 7, 3, 255, 1], [9, 8, 7, 6, 5, 4]], dtype=getattr(torch, dtype))
    fast, generic = _both(lambda: rope(x, positions=positions.to(x.device)))
    assert torch.equal(fast, generic)


def test_declares_what_it_cannot_form(torch_backend: Backend) -> None:
    """xPos, and DynamicNTK choosing its frequencies on the device, are outside the Triton
    kernel's declaration: they go to the generic kernel by default, and forced, the kernel is
    refused before any work, naming what the call has."""
    import torch

    x = _tensor(torch_backend, (2, 3, 6, 16))
    xpos = anyrope.RoPE(16, xpos_scale_base=512.0)
    dynamic = anyrope.RoPE(16, scaling=DynamicNTK(2.0, original_max_position=4))

    def traced_dynamic(x: Any, p: Any) -> Any:
        return dynamic(x, positions=p)

    positions = torch_backend.asarray(np.arange(6))
    q, _k = xpos(x, x)
    with anyrope.use_fast_paths(False):
        want_q, _ = xpos(x, x)
        want_dynamic = dynamic(x, positions=positions)
    assert torch.equal(q, want_q)
    assert torch.equal(
        torch.compile(traced_dynamic, fullgraph=True, backend="aot_eager")(x, positions), want_dynamic
    )
    with (
        pytest.raises(ValueError, match="kernel 'triton' cannot rotate q here: positions from xpos"),
        anyrope.use_fast_paths("triton"),
    ):
        xpos(x, x)


def test_cuda_graph_replays_new_positions(torch_backend: Backend) -> None:
    """Captured once, replayed with other positions written into the same tensor: no host copy,
    no sync inside."""
    import torch

    if torch_backend.device_kind != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    rope = anyrope.RoPE(64)
    x = _tensor(torch_backend, (4, 8, 1, 64), "bfloat16")
    offsets = torch.tensor([0, 5, 9, 100], device=x.device)
    with anyrope.use_fast_paths("triton"):
        rope(x, offset=offsets)  # warm: compile the kernel, cache the constants
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = rope(x, offset=offsets)
    for new in ([1, 2, 3, 4], [4096, 0, 77, 123456]):
        offsets.copy_(torch.tensor(new))
        graph.replay()
        with anyrope.use_fast_paths(False):
            assert torch.equal(out, rope(x, offset=offsets))


def _compile_script(name: str, *args: str) -> str:
    """Run one of the scripts that compile the kernel for NVIDIA GPUs here (no GPU, no
    interpreter); its stdout."""
    if not TRITON.available:
        pytest.skip("triton is not installed")
    command = [sys.executable, str(Path(__file__).with_name(name)), *args]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"  # silences Triton 3.9's notice; the launch sets it anyway
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_kernel_compiles_for_nvidia_gpus() -> None:
    """What the interpreter cannot check: the kernel through Triton's compiler and ptxas, for
    A100 and H100, in each angle mode and dtype, and which tensors its launches write as
    inductor reads them; and the fused prologue's kernel in each dtype, angle mode, norm rounding
    and kind of places, tiled as its launches are, spilling no registers (tests/triton_aot.py)."""
    out = _compile_script("triton_aot.py")
    built, read, compared, prologues = out.split()
    assert (built, read, compared) == ("14", "3", "2")  # kernels built, launches read, layouts compared
    assert prologues == "6"  # the prologue's launches built


def test_kernel_report_for_the_gpu_benchmark(tmp_path: Path) -> None:
    """Issue 55's proof on the CPU machine (tests/triton_report.py): each kernel the GPU
    benchmark's anyrope rows launch, compiled for sm_90 as the launch specialises it, with its
    registers, spills and global loads and stores by width. Asserted: what holds and must keep
    holding: no kernel spills; every launch, prefill and decode, reads q and k and writes its
    outputs in 128-bit accesses in both layouts and every dtype; prefill, at its host-known
    offset, reads the kept table's rows so too. The rest is printed (``pytest -s``): decode
    forms its float64 angles in the kernel."""
    import bench_gpu

    report = tmp_path / "report.json"
    print(_compile_script("triton_report.py", "--json", str(report)))
    found = json.loads(report.read_text())
    kernels, rows = found["kernels"], found["launches"]
    runs = {(r["size"], r["case"], r["dtype"], r["layout"], r["variant"]) for r in rows}
    variants = ("anyrope", "anyrope-inplace", "anyrope-bshd")  # its eager rows: the kernel launched as is
    assert runs == {
        (size, case, dtype, layout, variant)
        for size in ("full", "step")
        for case in bench_gpu.SIZES[size]
        for dtype in bench_gpu.DTYPES
        for layout in bench_gpu.LAYOUTS
        for variant in variants
    }
    for kernel in kernels:
        assert 0 < kernel["registers"] <= 255, kernel
        assert "? load" not in kernel["widths"], kernel  # each access traced to its array
        assert "? store" not in kernel["widths"], kernel
        assert kernel["widths"]["x load"], kernel
        assert kernel["widths"]["out store"], kernel
    for row in rows:
        kernel = kernels[row["kernel"]]
        assert kernel["spill_stores"] == kernel["spill_loads"] == 0, (row, kernel)
        wide = (
            ("x load", "out store", "tables load")
            if row["case"].startswith("prefill")
            else ("x load", "out store")
        )
        for access in wide:
            assert set(kernel["widths"][access]) == {"128"}, (row, access, kernel["widths"])


def test_per_row_offsets_past_int64_turn_by_their_own_angles(
    torch_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-row offsets nothing reads (a GPU's) whose last positions pass int64 (issue 57): the
    kernel forms ``starts[b] + s``, which wraps, and gives those positions ``2**64`` back, as the
    generic path does (anyrope._positions.ArrayOffset.wrapped): the rotation by the true positions."""
    import torch

    from anyrope import _positions

    monkeypatch.setattr(_positions, "host_array", lambda *_: None)  # as on a GPU: never read
    rope = anyrope.RoPE(16)
    x = _tensor(torch_backend, (2, 3, 4, 16))
    starts = np.array([2**63 - 2, 0], dtype=np.int64)
    fast, generic = _both(lambda: rope(x, offset=torch.tensor(starts, device=x.device)))
    assert torch.equal(fast, generic)
    positions = starts.astype(np.uint64)[:, None] + np.arange(4, dtype=np.uint64)
    want = rope(torch_backend.to_numpy(x).astype(np.float64), positions=positions)
    assert_close(torch_backend, fast, want, "float32")


# Operators that allocate or re-describe memory (no device work): what an eager call may run
# besides its one launch.
_NO_DEVICE_WORK = {
    "empty_like", "empty", "new_empty", "empty_strided", "view", "_unsafe_view", "unsqueeze", "squeeze",
    "expand", "as_strided", "permute", "transpose", "t", "slice", "select", "alias", "detach",
}  # fmt: skip


def test_an_eager_call_is_one_launch(torch_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated eager call that records no gradient (its plan kept) makes one kernel launch
    and no other device operation than allocating its outputs (issue 55): no op layer, no
    table, no copy of the positions; every operator torch dispatches is counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from anyrope._kernels import _triton

    class Operators(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    launches: list[int] = []
    monkeypatch.setattr(_triton, "_launch", lambda arrays, *_, **__: launches.append(len(arrays)))
    rope = anyrope.RoPE(64)
    q, k = _tensor(torch_backend, (4, 8, 1, 64)), _tensor(torch_backend, (4, 2, 1, 64), seed=1)
    starts = torch_backend.asarray(np.array([3, 40, 5, 6]))
    positions = torch_backend.asarray(np.array([[3], [40], [5], [6]]))
    calls = {
        "offset": lambda: rope(q, k, offset=5),
        "per-row offsets": lambda: rope(q, k, offset=starts),
        "positions": lambda: rope(q, k, positions=positions),
        "q alone": lambda: rope(q, offset=7),
        "in place": lambda: rope(q, k, offset=starts, inplace=True),
    }
    with anyrope.use_fast_paths("triton"):
        for name, call in calls.items():
            call()  # makes the plan
            launches.clear()
            with Operators() as seen:
                call()
            assert launches == [2 if name != "q alone" else 1], name
            assert set(seen.names) <= _NO_DEVICE_WORK, (name, seen.names)
            made = [op for op in seen.names if op.startswith(("empty", "new_empty"))]
            assert len(made) == (0 if name == "in place" else 1 if name == "q alone" else 2), (name, made)


def test_kept_calls_launch_by_the_first_call_s_recipe(
    torch_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan's first eager call works out its launch from its arrays' shapes and strides; the
    later ones hand the kernel their own arrays by that recipe, each with new values and offsets
    and equal to the generic path bit for bit: strided views, features apart (read through a
    contiguous copy), in place into such a view (written through a dense buffer), q alone, and a
    k of no heads (not launched)."""
    import torch

    from anyrope._kernels import _triton

    worked: list[int] = []
    fixed = _triton._fixed
    monkeypatch.setattr(_triton, "_fixed", lambda *a, **kw: (worked.append(1), fixed(*a, **kw))[1])
    rope = anyrope.RoPE(32, rotary_dim=24, layout="interleaved")

    def arrays(seed: int) -> tuple[Any, Any]:
        whole = _tensor(torch_backend, (3, 9, 4, 64), seed=seed)
        return whole[:, :7, :, :32].transpose(1, 2), whole[:, :7, :2, ::2].transpose(1, 2)  # (3, 4|2, 7, 32)

    cases = {
        "strided": lambda q, k, at: rope(q, k, offset=at),
        "features apart": lambda q, k, at: rope(k, q, offset=at),
        "in place": lambda q, k, at: rope(q.clone(), k.clone(), offset=at, inplace=True),
        "in place, features apart": lambda q, k, at: rope(k, offset=at, inplace=True),
        "q alone": lambda q, k, at: rope(q, offset=at),
        "k of no heads": lambda q, k, at: rope(q, k[:, :0], offset=at),
    }
    for name, call in cases.items():
        worked.clear()
        for seed in range(3):
            at = torch_backend.asarray(np.array([4, 0, 9]) + 100 * seed)
            with anyrope.use_fast_paths("triton"):
                fast = call(*arrays(seed), at)
            with anyrope.use_fast_paths(False):
                generic = call(*arrays(seed), at)
            for got, want in zip(torch.atleast_1d(fast), torch.atleast_1d(generic), strict=True):
                assert torch.equal(got, want), (name, seed)
        assert worked == [1], name  # worked out once, by the plan's first call


def test_an_int_offset_reads_the_kept_table_in_place(
    torch_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At an int offset whose rows the cached prefix table holds (every prefill), the kernel
    reads those rows in place and forms no angle (issue 55: the float64 angles spilled); a
    call captured into a CUDA graph forms them in the kernel, since the table may regrow and
    free what a replay would read. The same result, bit for bit, either way and as the
    generic path's."""
    import torch

    from anyrope import _tables
    from anyrope._kernel_angles import OFFSET, TABLES
    from anyrope._kernels import _triton
    from anyrope.scaling import YaRN

    modes: list[int] = []
    launch = _triton._launch
    monkeypatch.setattr(
        _triton,
        "_launch",
        lambda arrays, angles, **kw: (modes.append(angles.mode), launch(arrays, angles, **kw)),
    )
    rope = anyrope.RoPE(32, rotary_dim=24, scaling=YaRN(4.0, original_max_position=16))
    q, k = _tensor(torch_backend, (2, 4, 9, 32)), _tensor(torch_backend, (2, 2, 5, 32), seed=1)
    fast, generic = _both(lambda: rope(q, k, offset=40))
    assert modes == [TABLES]
    for got, want in zip(fast, generic, strict=True):
        assert torch.equal(got, want)
    monkeypatch.setattr(_tables, "graph_capturing", lambda *_: True)
    modes.clear()
    with anyrope.use_fast_paths("triton"):
        captured = rope(q, k, offset=40)
    assert modes == [OFFSET]
    for got, want in zip(captured, generic, strict=True):
        assert torch.equal(got, want)
