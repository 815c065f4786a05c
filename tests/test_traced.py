"""Traced and compiled execution beyond the conformance axis: what tracers see, and what they cost.

torch: meta and fake tensors (no values at all), ``torch.export``, no graph break in any call
form, and decoding with an int offset compiles at most twice. JAX: ``vmap`` and ``grad``. MLX:
``mx.compile`` builds an eager call's graph.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

import oracle
from harness import Backend, assert_close, compiled_nodes, compiled_ops, make_backend

CALLS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "int offset": lambda rope, q, k: rope(q, k, offset=3),
    "negative offset": lambda rope, q, k: rope(q, k, offset=-3),
    "per-row offsets (list)": lambda rope, q, k: rope(q, k, offset=[0, 5]),
    "positions (list)": lambda rope, q, k: rope(q, k, positions=[4, 0, 7, 7, 2]),
    "q only": lambda rope, q, k: rope(q, seq_axis=-2),
}
ROPES = {
    "plain": anyrope.RoPE(8),
    "partial interleaved": anyrope.RoPE(8, rotary_dim=4, layout="interleaved"),
    "dynamic": anyrope.RoPE(8, scaling=sc.DynamicNTK(2.0, 4)),
    "longrope": anyrope.RoPE(
        8, scaling=sc.LongRoPE([1.0, 2.0, 2.5, 3.0], [3.0, 4.0, 5.0, 6.0], 4), max_position=16
    ),
    # PhiMoE: the attention factor changes at the threshold too
    "longrope mscales": anyrope.RoPE(
        8, scaling=sc.LongRoPE([1.0, 2.0, 2.5, 3.0], [3.0, 4.0, 5.0, 6.0], 4, 4.0, 1.1, 1.3)
    ),
    "yarn": anyrope.RoPE(8, scaling=sc.YaRN(4.0, 4)),
}


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def other_libraries_called() -> None:
    """Every other installed library called first: dynamo reads anyrope's per-process memos while
    it traces, and must meet none of their dtypes or devices there (it cannot hash MLX's)."""
    import importlib

    from anyrope._arrays import is_installed

    for module in ("numpy", "mlx.core", "jax.numpy", "array_api_strict"):
        if is_installed(module):
            xp = importlib.import_module(module)
            for dtype in ("float32", "float16"):
                if hasattr(xp, dtype):
                    x = xp.ones((2, 3, 8), dtype=getattr(xp, dtype))
                    anyrope.RoPE(8)(x, x, offset=[1, 2])


@pytest.mark.parametrize("rope_name", list(ROPES))
@pytest.mark.parametrize("call", list(CALLS))
def test_no_graph_break_in_any_call_form(
    torch: Any, other_libraries_called: None, rope_name: str, call: str
) -> None:
    rope, form = ROPES[rope_name], CALLS[call]
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda q, k: form(rope, q, k))(q, k)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("rope_name", list(ROPES))
def test_positions_as_tensors_trace_in_one_graph(
    torch: Any, other_libraries_called: None, rope_name: str
) -> None:
    rope = ROPES[rope_name]
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    for extra in (
        {"positions": torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])},
        {"offset": torch.tensor([2, -4])},
    ):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(lambda q, k, e=extra: rope(q, k, **e))(q, k)
        assert explained.graph_break_count == 0, explained.break_reasons


def test_meta_tensors(torch: Any) -> None:
    """No values exist on the meta device: every call form must go by shapes alone."""
    for rope in ROPES.values():
        q = torch.empty(2, 4, 5, 8, device="meta", dtype=torch.bfloat16)
        for extra in (
            {"offset": 7},
            {"offset": torch.empty(2, dtype=torch.int64, device="meta")},
            {"positions": torch.empty(2, 5, dtype=torch.int32, device="meta")},
        ):
            out = rope(q, q, **extra)
            assert all(o.device.type == "meta" and o.shape == q.shape and o.dtype == q.dtype for o in out)


def test_fake_tensors(torch: Any) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    rope = ROPES["dynamic"]
    with FakeTensorMode() as mode:
        q = mode.from_tensor(torch.randn(2, 4, 5, 8))
        positions = mode.from_tensor(torch.arange(10).reshape(2, 5))
        out = rope(q, positions=positions)
    assert out.shape == (2, 4, 5, 8)
    assert type(out).__name__ == "FakeTensor"


def test_torch_export_of_a_module(torch: Any) -> None:
    rope = anyrope.RoPE(16, rotary_dim=8, scaling=sc.LongRoPE([1.0, 1.5, 2.0, 2.5], [3.0, 3.5, 4.0, 4.5], 32))

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 32)

        def forward(self, hidden: Any, positions: Any) -> Any:
            q, k = self.proj(hidden).reshape(*hidden.shape[:-1], 2, 16).unbind(-2)
            q, k = rope(q[:, None], k[:, None], positions=positions)
            return (q * k).sum(-1)

    module = Attention()
    hidden, positions = torch.randn(2, 6, 16), torch.tensor([[0, 1, 2, 3, 4, 5], [30, 31, 32, 33, 34, 35]])
    exported = torch.export.export(module, (hidden, positions))
    torch.testing.assert_close(exported.module()(hidden, positions), module(hidden, positions))
    later = torch.tensor([[40, 41, 42, 43, 44, 45], [0, 1, 2, 3, 4, 5]])  # past LongRoPE's threshold
    torch.testing.assert_close(exported.module()(hidden, later), module(hidden, later))


@functools.cache
def _aot_inductor_cannot_load_on_cuda() -> str:
    """Why torch's AOTInductor loads no CUDA package on this install, or "" where it does. Asked
    of a two-operator module in a child process: torch 2.11 (CUDA 13) on an H200 segfaulted in
    its package loader for every CUDA package, anyrope's or not, which would end the test run."""
    import subprocess
    import sys

    child = """if True:
        import tempfile, torch
        from torch._inductor import aoti_compile_and_package, aoti_load_package
        class Twice(torch.nn.Module):
            def forward(self, x):
                return x.sin() * 2
        x = torch.randn(8, device="cuda")
        with tempfile.TemporaryDirectory() as folder:
            package = aoti_compile_and_package(torch.export.export(Twice(), (x,)), package_path=folder + "/t.pt2")
            torch.testing.assert_close(aoti_load_package(package)(x), Twice()(x))
    """
    done = subprocess.run(
        [sys.executable, "-c", child], check=False, capture_output=True, text=True, timeout=900
    )
    if done.returncode == 0:
        return ""
    import torch

    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"torch {torch.__version__}'s AOTInductor cannot load a CUDA package here (exit {done.returncode}: {last})"


# raised by torch's own package loader as it unpickles the program's tree specs
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_aot_inductor_package_of_a_module(torch: Any, tmp_path: Any, device: str) -> None:
    """torch.export with dynamic batch and sequence, AOTInductor's package: it loads, runs at
    other shapes than the example's and equals eager. On the CPU bit for bit (the same generic
    arithmetic); on CUDA, where eager runs the Triton kernel and the package inductor's own
    kernels, within float32's tolerance of the float64 oracle."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        if why := _aot_inductor_cannot_load_on_cuda():
            pytest.skip(why)
    rope = anyrope.RoPE(32, layout="interleaved", rotary_dim=24)

    class Rotate(torch.nn.Module):
        def forward(self, q: Any, k: Any, positions: Any) -> Any:
            return rope(q, k, positions=positions, seq_axis=-3)

    def inputs(batch: int, seq: int) -> tuple[Any, Any, Any]:
        positions = torch.arange(seq).expand(batch, seq) + 1000 * torch.arange(batch)[:, None]
        made = torch.randn(batch, seq, 4, 32), torch.randn(batch, seq, 2, 32), positions
        return tuple(t.to(device) for t in made)

    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=4096)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: seq})
    exported = torch.export.export(Rotate(), inputs(2, 5), dynamic_shapes=shapes)
    # standard operators only, also where the Triton kernel takes the eager call (torch-triton, CUDA)
    operators = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert not [name for name in operators if "anyrope" in name], operators
    package = aoti_compile_and_package(exported, package_path=str(tmp_path / "rotate.pt2"))
    loaded = aoti_load_package(package)
    for batch_size, length in ((2, 5), (3, 17), (1, 1)):  # (1, 1): a decode step
        q, k, positions = inputs(batch_size, length)
        got = loaded(q, k, positions)
        for out, x, want in zip(got, (q, k), rope(q, k, positions=positions, seq_axis=-3), strict=True):
            assert out.device == x.device
            if device == "cpu":
                torch.testing.assert_close(out, want, rtol=0, atol=0)
            else:
                truth = oracle.rotate(
                    x.cpu().numpy(), positions.cpu().numpy(), layout="interleaved", rotary_dim=24, seq_axis=-3
                )
                assert_close(make_backend("torch-cuda"), out, truth, "float32")


def test_decoding_with_an_int_offset_compiles_at_most_twice(torch: Any) -> None:
    """The first step specialises on its offset, the second makes it symbolic; then no more."""
    compilations = 0

    def counting(graph: Any, example_inputs: Any) -> Any:
        nonlocal compilations
        compilations += 1
        return graph.forward

    rope = anyrope.RoPE(64, scaling=sc.DynamicNTK(2.0, 16))
    torch._dynamo.reset()
    step = torch.compile(lambda q, k, n: rope(q, k, offset=n), backend=counting, fullgraph=True)
    q, k = torch.randn(4, 8, 1, 64), torch.randn(4, 2, 1, 64)
    for n in range(64):
        got_q, _ = step(q, k, n)
        if n in (0, 1, 15, 16, 63):  # both sides of DynamicNTK's threshold
            torch.testing.assert_close(got_q, rope(q, offset=n), rtol=0, atol=1e-6)
    assert compilations <= 2


DYNAMIC_FORMS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "positions, seq_axis=-3": lambda rope, q, n: rope(q, positions=n.arange(q.shape[1]), seq_axis=-3),
    "per-row positions, seq_axis=-3": lambda rope, q, n: rope(
        q, positions=n.arange(q.shape[1]).expand(q.shape[0], -1) + 3, seq_axis=-3
    ),
    "per-row offsets": lambda rope, q, n: rope(q, offset=n.arange(q.shape[0]) * 5),
    "q and k, no positions": lambda rope, q, n: rope(q, q[..., :2, :], seq_axis=-3)[1],
}


@pytest.mark.parametrize("form", list(DYNAMIC_FORMS))
def test_dynamic_shapes_compile_once_for_every_length(torch: Any, form: str) -> None:
    """``torch.compile(dynamic=True)`` compiles a call once for every batch size and sequence length
    (from 2 up: torch itself specialises sizes 0 and 1)."""
    compilations = 0

    def counting(graph: Any, example_inputs: Any) -> Any:
        nonlocal compilations
        compilations += 1
        return graph.forward

    rope, call = anyrope.RoPE(16), DYNAMIC_FORMS[form]
    torch._dynamo.reset()
    step = torch.compile(lambda q: call(rope, q, torch), backend=counting, dynamic=True, fullgraph=True)
    for batch, seq in ((2, 5), (3, 7), (2, 12), (4, 2)):
        q = torch.randn(batch, seq, 4, 16)
        torch.testing.assert_close(step(q), call(rope, q, torch), rtol=0, atol=0)
    assert compilations == 1


def test_a_compiled_call_reads_no_memo(torch: Any) -> None:
    """While dynamo traces, anyrope reads none of its per-process memos: dynamo would guard the
    graph on them, and a later entry (a new dtype, another library) would recompile it."""
    compilations = 0

    def counting(graph: Any, example_inputs: Any) -> Any:
        nonlocal compilations
        compilations += 1
        return graph.forward

    anyrope.table_cache.clear()
    rope = anyrope.RoPE(8, scaling=sc.LongRoPE([1.0, 2.0, 2.5, 3.0], [3.0, 4.0, 5.0, 6.0], 4))
    torch._dynamo.reset()
    step = torch.compile(lambda q, p: rope(q, positions=p), backend=counting, fullgraph=True)
    q, positions = torch.randn(2, 3, 8), torch.tensor([1, 2, 9])
    step(q, positions)
    step(q, positions)
    assert compilations == 1
    for dtype in (torch.float16, torch.float64, torch.bfloat16):  # new dtypes, plans and tables
        rope(torch.ones(2, 3, 8, dtype=dtype), offset=[1, 2])
        anyrope.RoPE(8)(torch.ones(2, 3, 8, dtype=dtype), positions=[4, 5, 6])
    from anyrope._arrays import is_installed

    if is_installed("numpy"):  # another library's types and dtypes
        import numpy as np

        rope(np.ones((2, 3, 8), dtype=np.float32), offset=3)
    torch.testing.assert_close(step(q, positions), rope(q, positions=positions), rtol=0, atol=1e-6)
    assert compilations == 1


# Code a call traced by dynamo step by step reads, which a call handed on whole leaves unguarded
INNER_MODULES = (
    "_angles",
    "_exact",
    "_frequencies",
    "_tables",
    "_kernel_angles",
    "_job",
    "_pairs",
    "_kernels",
)


def _guards(torch: Any, fn: Callable[..., Any], *args: Any) -> list[str]:
    """The names of what dynamo guards for ``fn(*args)``, compiled by inductor."""
    names: list[str] = []

    def keep_all(entries: list[Any]) -> list[bool]:
        names.extend(entry.name for entry in entries)
        return [True] * len(entries)

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, options={"guard_filter_fn": keep_all})(*args)
    return names


HANDED_ON_FORMS: dict[str, Callable[[Any, Any, Any, Any], Any]] = {
    "offsets": lambda rope, q, k, n: rope(q, k, offset=n.arange(q.shape[0]) * 97 + 1000),
    "positions": lambda rope, q, k, n: rope(q, k, positions=n.arange(q.shape[2]).expand(q.shape[0], -1) + 5),
    "offset 0": lambda rope, q, k, n: rope(q, k),
}


@pytest.mark.parametrize("form", list(HANDED_ON_FORMS))
def test_compiled_calls_are_handed_on_whole(torch: Any, form: str) -> None:
    """Under torch.compile a call of tensors, at tensor positions or offsets or offset 0, reaches
    dynamo's graph as one opaque call that AOTAutograd traces (torch._dynamo.nonstrict_trace):
    dynamo guards none of anyrope's table, angle or kernel code (each guard is evaluated before
    every compiled call), and inductor still gets the kept tables and the same result bit for bit."""
    from anyrope import _torch_ops

    if not _torch_ops.hands_on():
        pytest.skip(
            "torch < 2.7 has no nonstrict_trace, and before 2.12 dynamo cannot tell torch.compile "
            "from torch.export: calls are traced step by step"
        )
    rope = anyrope.RoPE(16, layout="interleaved", scaling=sc.YaRN(4.0, 4))
    q, k = torch.randn(3, 4, 2, 16), torch.randn(3, 1, 2, 16)
    call = functools.partial(HANDED_ON_FORMS[form], rope, n=torch)
    inner = [name for name in _guards(torch, call, q, k) if any(m in name for m in INNER_MODULES)]
    assert not inner, inner
    with anyrope.use_fast_paths(False):  # the generic path: the Triton kernel forms no tables
        ops = compiled_ops(call, q, k)
    assert sum("keep_tables" in op for op in ops) == (0 if form == "offset 0" else 1), ops
    torch._dynamo.reset()
    for got, want in zip(torch.compile(call, fullgraph=True)(q, k), call(q, k), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_strict_export_traces_calls_step_by_step(torch: Any) -> None:
    """torch.export's strict mode runs dynamo too, but cannot export a call handed on whole: there
    calls are traced step by step, and the exported program equals the eager call. It records
    what the default (non-strict) export records, fused kernels on: standard operators only, the
    same constants (where torch tells strict export from torch.compile, 2.12 on)."""
    from anyrope import _torch_ops

    rope = anyrope.RoPE(16, layout="interleaved", scaling=sc.YaRN(4.0, 4))

    class Rotate(torch.nn.Module):  # type: ignore[misc, name-defined]
        def forward(self, q: Any, k: Any, p: Any) -> Any:
            return rope(q, k, positions=p)

    def program(strict: bool) -> tuple[list[str], dict[str, tuple[int, ...]]]:
        exported = torch.export.export(Rotate(), (q, k, positions), strict=strict)
        for got, want in zip(
            exported.module()(q, k, positions), rope(q, k, positions=positions), strict=True
        ):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
        return targets, {name: tuple(c.shape) for name, c in exported.constants.items()}

    q, k, positions = torch.randn(2, 4, 5, 16), torch.randn(2, 1, 5, 16), torch.arange(5).expand(2, 5)
    with anyrope.use_fast_paths(False):
        program(strict=True)
    if not _torch_ops._EXPORTING_TOLD:
        pytest.skip(
            "torch < 2.12 answers is_exporting() True under torch.compile: strict exports take its choices"
        )
    assert not _torch_ops.strict_exports()  # asked eagerly
    strict = program(strict=True)
    assert strict == program(strict=False)
    assert not [target for target in strict[0] if "anyrope" in target], strict[0]


def test_compiled_calls_that_raise_say_why(torch: Any) -> None:
    """A call handed on whole that raises while dynamo runs it is traced again step by step, so
    dynamo reports anyrope's own error, not an unsupported output of nonstrict_trace."""
    rope = anyrope.RoPE(16)
    q, positions = torch.randn(2, 4, 5, 16), torch.arange(4)  # 4 positions for 5 tokens
    torch._dynamo.reset()
    with pytest.raises((ValueError, torch._dynamo.exc.Unsupported), match="positions"):
        torch.compile(lambda q, p: rope(q, positions=p), fullgraph=True)(q, positions)
    torch._dynamo.reset()
    with pytest.raises((ValueError, torch._dynamo.exc.Unsupported), match="not both"):
        torch.compile(lambda q, p: rope(q, positions=p, offset=p[:2]), fullgraph=True)(q, torch.arange(5))


@pytest.mark.parametrize("rope_name", ["plain", "dynamic", "yarn"])
def test_compiled_calls_form_their_tables_once(torch: Any, rope_name: str) -> None:
    """Under torch.compile the tables pass once through anyrope::keep_tables, which inductor
    cannot fuse into the rotation (else it forms the angles again for every head); q and k share
    them. A compiled CPU call still equals the eager one bit for bit."""
    rope = ROPES[rope_name]
    q, k, positions = (
        torch.randn(2, 4, 5, 8),
        torch.randn(2, 2, 5, 8),
        torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]]),
    )
    with anyrope.use_fast_paths(False):  # the generic path: on CUDA the Triton kernel forms no tables
        ops = compiled_ops(lambda q, k, p: rope(q, k, positions=p), q, k, positions)
        assert sum("keep_tables" in op for op in ops) == 1, ops
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, p: rope(q, k, positions=p), fullgraph=True)(q, k, positions)
        for got, want in zip(compiled, rope(q, k, positions=positions), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_compiled_calls_at_an_int_offset_read_the_kept_tables(torch: Any) -> None:
    """At an int offset, a compiled call reads rows of the prefix table eager calls keep, fetched
    while dynamo traces, and forms no angles (no cos or sin in its graph); past the rows fetched,
    or under ``dynamic=True``, it forms its own. Every form equals the eager call bit for bit."""
    from anyrope._tables import TRACED_ROWS

    rope = anyrope.RoPE(16, layout="interleaved")
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 1, 6, 16)

    def formed(ops: list[str]) -> bool:  # torch.cos, Tensor.cos, aten.cos... in the graph
        return any(re.search(r"\b(cos|sin)\b", op) for op in ops)

    with anyrope.use_fast_paths(False):  # the generic path: on CUDA the Triton kernel forms no tables
        for offset, forms in ((0, False), (1000, False), (TRACED_ROWS - 6, False), (TRACED_ROWS - 5, True)):
            assert formed(compiled_ops(lambda q, k, n=offset: rope(q, k, offset=n), q, k)) == forms, offset
            torch._dynamo.reset()
            got = torch.compile(lambda q, k, n=offset: rope(q, k, offset=n), fullgraph=True)(q, k)
            for got_x, want in zip(got, rope(q, k, offset=offset), strict=True):
                torch.testing.assert_close(got_x, want, rtol=0, atol=0)
        torch._dynamo.reset()
        dynamic = torch.compile(lambda q, k, n: rope(q, k, offset=n), fullgraph=True, dynamic=True)
        for n, length in ((0, 6), (77, 3)):
            for got_x, want in zip(
                dynamic(q[:, :, :length], k[:, :, :length], n),
                rope(q[:, :, :length], k[:, :, :length], offset=n),
                strict=True,
            ):
                torch.testing.assert_close(got_x, want, rtol=0, atol=0)


def _skip_unless_numba_takes_the_cpu() -> None:
    """Skip where numba is not installed, or where Triton's interpreter (TRITON_INTERPRET=1 with
    triton installed) takes CPU tensors: the registry then chooses Triton before numba."""
    kernels = {k.name: k for k in anyrope.kernels()}
    if not kernels["numba"].available:
        pytest.skip("numba is not installed")
    if kernels["triton"].available and "cpu" in kernels["triton"].devices:
        pytest.skip("Triton's interpreter takes CPU tensors here, before numba")


def test_compiled_cpu_calls_run_the_numba_kernel_as_an_operator(torch: Any) -> None:
    """Where numba is installed, a compiled CPU call rotates q and k through the numba kernel's
    operator (inductor's own loop is 2x a copy for interleaved 16-bit pairs, numba's half of
    one), on the tables formed once; it equals the eager call bit for bit, gradients too."""
    _skip_unless_numba_takes_the_cpu()
    rope = anyrope.RoPE(16, layout="interleaved", rotary_dim=12)
    q, k, offsets = torch.randn(2, 4, 6, 16), torch.randn(2, 1, 6, 16), torch.tensor([3, 900])
    ops = compiled_ops(lambda q, k, o: rope(q, k, offset=o), q, k, offsets)
    assert sum("numba_rotate" in op for op in ops) == 2, ops  # q and k
    assert sum("keep_tables" in op for op in ops) == 1, ops
    torch._dynamo.reset()
    leaf = q.clone().requires_grad_()
    compiled = torch.compile(lambda q, k, o: rope(q, k, offset=o), fullgraph=True)
    got = compiled(leaf, k, offsets)
    want = rope(q, k, offset=offsets)
    for got_x, want_x in zip(got, want, strict=True):
        torch.testing.assert_close(got_x, want_x, rtol=0, atol=0)
    upstream = torch.randn_like(q)
    (grad,) = torch.autograd.grad(got[0], leaf, upstream)
    # the gradient of a rotation is the inverse rotation
    torch.testing.assert_close(grad, rope(upstream, offset=offsets, inverse=True), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_compiled_numba_calls_read_one_side_by_side_table_for_q_and_k(torch: Any, layout: str) -> None:
    """Under torch.compile the numba operator of q and the one of k read the same table of cos
    and sin side by side. At an int offset inside the kept rows that is the rows of the table
    eager calls keep, fetched while dynamo traces: the graph forms no angles and stacks nothing,
    whether dynamo hands the call on (offset 0) or not. Past them, and for tensor offsets, the
    call's tables are put side by side once in the graph. Every form equals the eager call bit
    for bit."""
    _skip_unless_numba_takes_the_cpu()
    from anyrope._tables import TRACED_ROWS

    rope = anyrope.RoPE(16, layout=layout)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 1, 6, 16)
    offsets = torch.tensor([3, 900])
    cases = [(n, True) for n in (0, 1000, TRACED_ROWS - 6)] + [(TRACED_ROWS - 5, False), (offsets, False)]
    for offset, kept in cases:
        nodes = compiled_nodes(lambda q, k, n: rope(q, k, offset=n), q, k, offset)
        rotations = [node for node in nodes if "numba_rotate" in str(node.target)]
        assert len(rotations) == 2, (offset, nodes)
        assert rotations[0].args[1] is rotations[1].args[1], (offset, nodes)  # one table
        formed = [node for node in nodes if re.search(r"\b(cos|sin|stack)\b", str(node.target))]
        assert not formed if kept else formed, (offset, nodes)
        torch._dynamo.reset()
        got = torch.compile(lambda q, k, n: rope(q, k, offset=n), fullgraph=True)(q, k, offset)
        for got_x, want in zip(got, rope(q, k, offset=offset), strict=True):
            torch.testing.assert_close(got_x, want, rtol=0, atol=0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_decode_steps_keep_to_inductors_code(torch: Any, dynamic: bool) -> None:
    """A compiled call of one token per sequence (a decode step) is inductor's own code, not the
    numba operator, whose fixed cost is more than that rotation; decided from the shape, so a
    dynamic graph of longer calls keeps the operator. Forcing numba there raises before any work."""
    _skip_unless_numba_takes_the_cpu()
    rope = anyrope.RoPE(16, layout="interleaved", rotary_dim=12)
    q, k, offsets = torch.randn(3, 4, 1, 16), torch.randn(3, 1, 1, 16), torch.tensor([3, 900, 7])
    ops = compiled_ops(lambda q, k, o: rope(q, k, offset=o), q, k, offsets, dynamic=dynamic)
    assert not [op for op in ops if "numba_rotate" in op], ops
    assert sum("keep_tables" in op for op in ops) == 1, ops  # tables still formed once per call
    longer = (torch.randn(3, 4, 5, 16), torch.randn(3, 1, 5, 16), offsets)
    ops = compiled_ops(lambda q, k, o: rope(q, k, offset=o), *longer, dynamic=dynamic)
    assert sum("numba_rotate" in op for op in ops) == 2, ops
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, o: rope(q, k, offset=o), fullgraph=True, dynamic=dynamic)
    for got, want in zip(compiled(q, k, offsets), rope(q, k, offset=offsets), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch._dynamo.reset()
    # dynamo reports the ValueError raised while it traces as an error of its own, quoting it
    refusal = "kernel 'numba' cannot rotate q here: no traced calls of one token per sequence"
    with (
        anyrope.use_fast_paths("numba"),
        pytest.raises((ValueError, torch._dynamo.exc.Unsupported), match=refusal),
    ):
        torch.compile(lambda q: rope(q, offset=offsets), fullgraph=True)(q)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_interleaved_pairs_turn_as_words(torch: Any, dtype: str, dynamic: bool) -> None:
    """Under torch.compile on a CPU, interleaved float32 and bfloat16 pairs are turned as integer
    words (the pair-words kernel: bitwise operators in the graph), a decode step included, and the
    result is the generic code's eager one bit for bit: NaN, infinities, overflow to infinity,
    large finite values, subnormals and signed zeros among the inputs; inverse and in place too."""
    rope = anyrope.RoPE(16, layout="interleaved", rotary_dim=12)
    special = [float("nan"), float("inf"), -float("inf"), 3.3895e38, -3.3895e38, 1e-40, -0.0, 0.0]
    q = torch.randn(3, 4, 1, 16, generator=torch.Generator().manual_seed(7)).to(getattr(torch, dtype))
    q.view(-1)[: len(special) * 5 : 5] = torch.tensor(special, dtype=q.dtype)
    k, offsets = torch.randn(3, 2, 1, 16).to(q.dtype), torch.tensor([3, 900, 70000])

    def calls(q: Any, k: Any, o: Any) -> tuple[Any, ...]:
        return (*rope(q, k, offset=o), rope(q, offset=o, inverse=True))

    def as_words(ops: list[str]) -> bool:
        return any("bitwise_and" in op or "and_" in op for op in ops)

    triton = {k.name: k for k in anyrope.kernels()}["triton"]
    if not (triton.available and "cpu" in triton.devices):  # else Triton's interpreter comes first
        assert as_words(compiled_ops(calls, q, k, offsets, dynamic=dynamic))
    with anyrope.use_fast_paths(False):
        want = calls(q, k, offsets)
    with anyrope.use_fast_paths("pair-words"):
        assert as_words(compiled_ops(calls, q, k, offsets, dynamic=dynamic))
        torch._dynamo.reset()
        compiled = torch.compile(calls, fullgraph=True, dynamic=dynamic)
        for got, expected in zip(compiled(q, k, offsets), want, strict=True):
            np.testing.assert_array_equal(got.float().numpy(), expected.float().numpy())
        target = q.clone()
        in_place = torch.compile(
            lambda x, o: rope(x, offset=o, inplace=True), fullgraph=True, dynamic=dynamic
        )
        in_place(target, offsets)
        np.testing.assert_array_equal(target.float().numpy(), want[0].float().numpy())
    with (
        anyrope.use_fast_paths("pair-words"),
        pytest.raises(ValueError, match="kernel 'pair-words' cannot rotate q here: no eager calls"),
    ):
        rope(q, offset=offsets)


def test_exported_programs_keep_to_standard_operators(torch: Any) -> None:
    """torch.export sees no anyrope operator on the generic path: ONNX and AOTInductor runtimes know
    every operator of the program."""
    rope = ROPES["plain"]
    q, positions = torch.randn(2, 4, 5, 8), torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])

    class Rotate(torch.nn.Module):
        def forward(self, q: Any, positions: Any) -> Any:
            return rope(q, positions=positions)

    with anyrope.use_fast_paths(False):  # a fused kernel is an operator of its own (the Triton op)
        exported = torch.export.export(Rotate(), (q, positions))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert not [t for t in targets if "anyrope" in t], targets
    torch.testing.assert_close(exported.module()(q, positions), rope(q, positions=positions), rtol=0, atol=0)


def test_exported_programs_form_their_tables_once(torch: Any) -> None:
    """torch.export scatters the tables into a buffer of their own, a standard operator that
    inductor (AOTInductor's too) writes to memory before the rotation reads it, so the angles are
    not formed again for every head: one cos and one sin for q and k, one scatter. The program
    equals the eager call bit for bit."""
    rope = ROPES["plain"]
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])

    class Rotate(torch.nn.Module):
        def forward(self, q: Any, k: Any, positions: Any) -> Any:
            return rope(q, k, positions=positions)

    with anyrope.use_fast_paths(False):  # the generic path: on CUDA the Triton kernel forms no tables
        exported = torch.export.export(Rotate(), (q, k, positions))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert [targets.count(name) for name in ("aten.cos.default", "aten.sin.default")] == [1, 1], targets
    assert targets.count("aten.index_put.default") == 1, targets
    for got, want in zip(exported.module()(q, k, positions), rope(q, k, positions=positions), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_eager_jax_calls_run_as_one_jitted_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager JAX call runs as one jax.jit call, traced once for all decode steps (offsets, ints
    included, are traced), with the float64 oracle's results. Lists take the eager path. The RoPE
    still pickles: it holds no jitted function."""
    import pickle

    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from anyrope import _call

    traces = 0
    traced_call = _call.rope_call

    def counting(*args: Any) -> Any:
        nonlocal traces
        traces += 1
        return traced_call(*args)

    def check(got: Any, x: Any, positions: Any) -> None:
        want = oracle.rotate(x, positions, layout="interleaved")
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-6, rtol=0)

    monkeypatch.setattr(_call, "rope_call", counting)  # what the jitted function calls as it traces
    rope = anyrope.RoPE(16, layout="interleaved")
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((3, 4, 1, 16)), rng.standard_normal((3, 2, 1, 16))
    qj, kj = jnp.asarray(q, dtype=jnp.float32), jnp.asarray(k, dtype=jnp.float32)
    starts = np.array([0, 97, 2**20])
    for step in (0, 1, 2, 1000):
        got_q, got_k = rope(qj, kj, offset=jnp.asarray(starts + step))
        check(got_q, q, (starts + step)[:, None])
        check(got_k, k, (starts + step)[:, None])
    assert traces == 1
    for step in (5, 6, 2**29):
        check(rope(qj, offset=step), q, np.array([step]))
    assert traces == 2  # once more: q alone, an int offset
    rope(qj, offset=[1, 2, 3])  # a list: the eager path
    assert traces == 2
    pickle.loads(pickle.dumps(rope))


def test_jax_vmap_and_grad() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rope = anyrope.RoPE(8, layout="interleaved")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5, 8)), dtype=jnp.float32)
    offsets = jnp.asarray([0, 7, -2])
    mapped = jax.vmap(lambda row, o: rope(row, offset=o))(x, offsets)
    want = oracle.rotate(np.asarray(x), np.asarray(offsets)[:, None] + np.arange(5), layout="interleaved")
    np.testing.assert_allclose(np.asarray(mapped), want, rtol=0, atol=1e-6)
    grad = jax.jit(jax.grad(lambda t: rope(t, offset=4).sum()))(x)
    ones = np.ones((3, 5, 8))
    np.testing.assert_allclose(
        np.asarray(grad),
        oracle.rotate(ones, np.arange(4, 9), layout="interleaved", inverse=True),
        rtol=0,
        atol=1e-6,
    )


def test_compiled_table_forms_match_eager(backend: Backend, mode: str) -> None:
    """``cos_sin`` and ``rerotate`` under the compiler too."""
    rope = anyrope.RoPE(16)
    new = anyrope.RoPE(16, base=500.0)
    positions = backend.asarray(np.array([[0, 3, 1000], [-5, 2**20, 7]]))
    like = backend.asarray(np.zeros(1), "float32")
    cos, sin = backend.compile(lambda p, l: rope.cos_sin(p, like=l), mode)(positions, like)
    want_cos, want_sin = oracle.cos_sin(backend.to_numpy(positions), 16)
    assert_close(backend, cos, want_cos, "float32")
    assert_close(backend, sin, want_sin, "float32")
    k = backend.asarray(np.random.default_rng(1).standard_normal((2, 2, 3, 16)), "float32")
    moved = backend.compile(
        lambda k, p: anyrope.rerotate(rope(k, positions=p), rope, new, positions=p), mode
    )(k, positions)
    assert_close(backend, moved, backend.to_numpy(new(k, positions=positions)), "float32")


@pytest.mark.backends("mlx")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mx_compile_builds_the_graph_of_an_eager_call(backend: Backend, layout: str) -> None:
    """Under ``mx.compile`` a call at an int offset builds the graph an eager call builds, node
    for node: views of x and of the cached rows, and one compiled kernel; nothing forms or
    stacks tables per call. (Issue 24's "mx.compile no slower than eager" rests on this: the
    two differ only in the Python of the call.)"""
    import io

    import mlx.core as mx

    rope = anyrope.RoPE(32, layout=layout)
    q = backend.asarray(np.random.default_rng(4).standard_normal((1, 4, 16, 32)), "bfloat16")
    mx.eval(q)  # its conversion is no node of the call

    def nodes(out: Any) -> list[str]:
        drawn = io.StringIO()
        mx.export_to_dot(drawn, out)
        return sorted(re.findall(r'label ="(\w+)"', drawn.getvalue()))

    eager = rope(q, offset=3)
    compiled = mx.compile(lambda x: rope(x, offset=3))(q)
    assert nodes(compiled) == nodes(eager)
    kernels = [name for name in nodes(eager) if name.startswith("Compiled")]
    assert len(kernels) == 1
    assert set(nodes(eager)) - set(kernels) <= {"Reshape", "ExpandDims", "Slice"}
    np.testing.assert_array_equal(backend.to_numpy(compiled), backend.to_numpy(eager))
