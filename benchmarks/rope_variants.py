"""The callables timed: anyrope's variants, the copy and the peers, built for one benchmark.

Each builder runs in the worker process, before the clock starts: compiled variants are
compiled and called twice there, so that their compile never lands in a timed value.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rope_cases import BASE, Bench, Case
from rope_runtimes import Runtime

Call = Callable[[], Any]


@dataclass
class Group:
    """The inputs shared by every variant of one (case, dtype, layout)."""

    rt: Runtime
    case: Case
    layout: str
    q: Any
    k: Any
    offsets: Any  # the decode batch's cache lengths as an integer array of the library, or None
    rope: Any  # anyrope.RoPE

    def positions(self) -> list[int] | list[list[int]]:
        """The positions of the case: one per token of q, or for decode one per row."""
        if self.case.offsets is not None:
            return [[offset] for offset in self.case.offsets]
        return list(range(self.case.offset, self.case.offset + self.case.dims[2]))


def make_group(rt: Runtime, case: Case, dtype: str, layout: str) -> Group:
    """q, k (seeded), the decode offsets on the device and an ``anyrope.RoPE`` of the case."""
    import anyrope

    q, k = rt.make(case.dims, dtype, 0), rt.make(case.dims, dtype, 1)
    offsets = rt.index(case.offsets) if case.offsets is not None else None
    return Group(rt, case, layout, q, k, offsets, anyrope.RoPE(case.dims[3], base=BASE, layout=layout))


def anyrope_call(g: Group) -> Call:
    """The call as users write it."""
    rope, q, k, offsets, offset = g.rope, g.q, g.k, g.offsets, g.case.offset
    if g.case.decode:
        return lambda: rope(q, k, offset=offsets)
    return lambda: rope(q, offset=offset)


def _generic(g: Group) -> Call:
    import anyrope

    call, finish = anyrope_call(g), g.rt.finish

    def generic() -> Any:
        with anyrope.use_fast_paths(False):
            result = call()
            finish(result)  # MLX evaluates lazily: inside the block, or it would not count
            return result

    return generic


def inplace_call(g: Group) -> Call:
    """``inplace=True`` on copies of the inputs (later calls rotate them again: same work)."""
    q, k, rope, offsets, offset = g.rt.copy(g.q), g.rt.copy(g.k), g.rope, g.offsets, g.case.offset
    if g.case.decode:
        return lambda: rope(q, k, offset=offsets, inplace=True)
    return lambda: rope(q, offset=offset, inplace=True)


def _through_compiler(g: Group, decode: Callable[..., Any], q_only: Callable[[Any], Any]) -> Call:
    """``decode(q, k, offsets)`` or ``q_only(q)`` through the library's compiler, the arrays as
    arguments: decode offsets are traced, as a model passes them."""
    assert g.rt.compile is not None
    args = (g.q, g.k, g.offsets) if g.case.decode else (g.q,)
    compiled = g.rt.compile(decode if g.case.decode else q_only)
    return lambda: compiled(*args)


def _compiled(g: Group) -> Call:
    """The call through the library's compiler."""
    rope, offset = g.rope, g.case.offset
    return _through_compiler(
        g, lambda q, k, offsets: rope(q, k, offset=offsets), lambda q: rope(q, offset=offset)
    )


def _exportable(g: Group, rotate: Callable[..., Any]) -> tuple[Any, tuple[Any, ...]]:
    """A torch module whose forward(q, k, offsets) is ``rotate``'s call of the case, and its
    inputs: decode offsets an input of the program, prefill's Python offset a constant."""
    torch, decode, offset = g.rt.module, g.case.decode, g.case.offset

    class Rotate(torch.nn.Module):  # type: ignore[misc, name-defined]  # torch is the runtime's module
        def forward(self, q: Any, k: Any, offsets: Any) -> Any:
            return rotate(q, k, offset=offsets) if decode else rotate(q, offset=offset)

    return Rotate().eval(), (g.q, g.k, g.offsets if decode else torch.zeros(1, dtype=torch.int64))


def _aot_inductor(g: Group) -> Call:
    """The call in a torch module, exported by ``torch.export`` and compiled ahead of time by
    AOTInductor, its package loaded and run (decode offsets an input of the program)."""
    import tempfile

    from torch._inductor import aoti_compile_and_package, aoti_load_package

    torch = g.rt.module
    module, inputs = _exportable(g, g.rope)
    with tempfile.TemporaryDirectory() as folder:  # the loaded package keeps what it needs
        program = torch.export.export(module, inputs)
        loaded = aoti_load_package(aoti_compile_and_package(program, package_path=folder + "/rope.pt2"))
    return lambda: loaded(*inputs)


def naive_formula(np: ModuleType, x: Any, positions: Any, layout: str, base: float = BASE) -> Any:
    """RoPE as a NumPy user writes it from the paper: frequencies, angles and tables in the call.

    ``positions`` has one entry per row of ``x``'s sequence axis (-2), or broadcasts against x's
    axes before the last (decode: ``(batch, 1, 1)``). The tables are cast to x's dtype, as such
    code does to keep float32 in float32.
    """
    d = x.shape[-1]
    inv_freq = base ** (-np.arange(0, d, 2) / d)
    angles = positions[..., None] * inv_freq
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return np.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    cos2, sin2 = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)  # rotate_half
    return x * cos2 + rotated * sin2


def _numpy_formula(g: Group) -> Call:
    np, q, layout, first, seq = g.rt.module, g.q, g.layout, g.case.offset, g.case.dims[2]
    return lambda: naive_formula(np, q, np.arange(first, first + seq), layout)


def _naive_jit(g: Group) -> Call:
    """numpy-formula's code on jax.numpy under jax.jit, positions a traced argument: RoPE as a JAX
    model without anyrope computes it."""
    assert g.rt.compile is not None
    jnp, layout = importlib.import_module("jax.numpy"), g.layout

    def rotate(x: Any, positions: Any) -> Any:
        return naive_formula(jnp, x, positions, layout)

    def decode(q: Any, k: Any, offsets: Any) -> tuple[Any, Any]:
        positions = offsets[:, None, None]  # a row's position, against its heads and its one token
        return rotate(q, positions), rotate(k, positions)

    if g.case.decode:
        compiled, q, k, offsets = g.rt.compile(decode), g.q, g.k, g.offsets
        return lambda: compiled(q, k, offsets)
    first, seq = g.case.offset, g.case.dims[2]
    one, q, positions = g.rt.compile(rotate), g.q, g.rt.index(list(range(first, first + seq)))
    return lambda: one(q, positions)


def _copy(g: Group) -> Call:
    copy, q, k = g.rt.copy, g.q, g.k
    if g.case.decode:
        return lambda: (copy(q), copy(k))
    return lambda: copy(q)


def _copy_compiled(g: Group) -> Call:
    """The compiled rows' roofline: the copy (q, or q and k) through the library's compiler."""
    assert g.rt.compile is not None
    copy, q, k = g.rt.copy, g.q, g.k
    if g.case.decode:
        both = g.rt.compile(lambda q, k: (copy(q), copy(k)))
        return lambda: both(q, k)
    one = g.rt.compile(copy)
    return lambda: one(q)


def _hf_tables(g: Group) -> tuple[ModuleType, Any, Any]:
    """transformers' Llama modeling module, its rotary module (plain RoPE) and the position ids."""
    modeling = importlib.import_module("transformers.models.llama.modeling_llama")
    torch, heads, head_dim = g.rt.module, g.case.dims[1], g.case.dims[3]
    config = modeling.LlamaConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, head_dim=head_dim,
        max_position_embeddings=8192, rope_theta=BASE,
    )  # fmt: skip
    rotary = modeling.LlamaRotaryEmbedding(config=config).to(g.rt.torch_device)
    ids = torch.tensor(g.positions(), device=g.rt.torch_device)
    return modeling, rotary, ids if g.case.decode else ids[None, :]


def _transformers_apply(g: Group) -> Call:
    modeling, rotary, ids = _hf_tables(g)
    apply, q, k = modeling.apply_rotary_pos_emb, g.q, g.k
    cos, sin = rotary(q, ids)  # the tables, outside the timing
    return lambda: apply(q, k, cos, sin)


def _transformers_full(g: Group) -> Call:
    modeling, rotary, ids = _hf_tables(g)
    apply, q, k = modeling.apply_rotary_pos_emb, g.q, g.k

    def full() -> Any:
        cos, sin = rotary(q, ids)
        return apply(q, k, cos, sin)

    return full


def _transformers_apply_compiled(g: Group) -> Call:
    """``torch.compile`` of transformers' formula on ready tables."""
    modeling, rotary, ids = _hf_tables(g)
    rotate_half, q, k = modeling.rotate_half, g.q, g.k

    def formula(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    cos, sin = rotary(q, ids)
    compiled = g.rt.module.compile(formula, dynamic=False)
    return lambda: compiled(q, k, cos, sin)


def _transformers_full_compiled(g: Group) -> Call:
    """What a compiled Llama runs: the rotary module's forward and apply_rotary_pos_emb, compiled
    as anyrope-compiled is, position ids a traced argument."""
    modeling, rotary, ids = _hf_tables(g)
    apply, q, k = modeling.apply_rotary_pos_emb, g.q, g.k

    def full(q: Any, k: Any, ids: Any) -> Any:
        cos, sin = rotary(q, ids)
        return apply(q, k, cos, sin)

    assert g.rt.compile is not None
    compiled = g.rt.compile(full)
    return lambda: compiled(q, k, ids)


def _rotary_embedding_torch(g: Group) -> Call:
    """lucidrains' rotary-embedding-torch, whose layout is the interleaved one."""
    ret = importlib.import_module("rotary_embedding_torch")
    torch, device, q, k, offset = g.rt.module, g.rt.torch_device, g.q, g.k, g.case.offset
    rot = ret.RotaryEmbedding(dim=g.case.dims[3], theta=BASE).to(device)
    if not g.case.decode:
        return lambda: rot.rotate_queries_or_keys(q, seq_dim=-2, offset=offset)
    # rotate_queries_or_keys takes one offset for the batch: per-row positions go through forward.
    positions = torch.tensor(g.case.offsets, device=device, dtype=torch.float32)[:, None]

    def per_row() -> Any:
        freqs = rot(positions)[:, None]  # (batch, 1, seq, dim) against (batch, heads, seq, dim)
        return ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)

    return per_row


def _onnx_runtime(g: Group, op: bool) -> Call:
    """The call in a torch module (``anyrope.layers.torch``) exported by ``torch.onnx.export``
    (opset 23) and run by ONNX Runtime on the CPU: as ONNX's RotaryEmbedding operator, or as
    anyrope's elementwise form (``onnx_op=False``). Decode offsets are an input of the model."""
    import warnings

    import anyrope
    from anyrope.layers.torch import RotaryEmbedding

    torch, onnxruntime = g.rt.module, importlib.import_module("onnxruntime")
    rope = anyrope.RoPE(g.case.dims[3], base=BASE, layout=g.layout, max_position=8192)
    module, inputs = _exportable(g, RotaryEmbedding(rope, onnx_op=None if op else False))
    with warnings.catch_warnings():  # torch's own, as it decomposes the program
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, inputs, dynamo=True, opset_version=23, verbose=False)
    model = program.model_proto
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]  # an input the graph does not read is dropped
    feeds = {name: x.numpy() for name, x in zip(("q", "k", "offsets"), inputs, strict=True) if name in names}
    return lambda: session.run(None, feeds)


def _mlx_fast(g: Group, compiled: bool = False) -> Call:
    """``mlx.core.fast.rope`` (``traditional=True`` is the interleaved layout), or under mx.compile."""
    mx, q, k, dims, first = g.rt.module, g.q, g.k, g.case.dims[3], g.case.offset
    traditional = g.layout == "interleaved"

    def rope(x: Any, offset: Any) -> Any:
        return mx.fast.rope(x, dims, traditional=traditional, base=BASE, scale=1.0, offset=offset)

    if compiled:
        return _through_compiler(
            g, lambda q, k, offsets: (rope(q, offsets), rope(k, offsets)), lambda q: rope(q, first)
        )
    if g.case.decode:
        offsets = g.offsets
        return lambda: (rope(q, offsets), rope(k, offsets))
    return lambda: rope(q, first)


BUILDERS: dict[str, Callable[[Group], Call]] = {
    "copy": _copy,
    "copy-compiled": _copy_compiled,
    "anyrope": anyrope_call,
    "anyrope-generic": _generic,
    "anyrope-inplace": inplace_call,
    "anyrope-compiled": _compiled,
    "anyrope-aoti": _aot_inductor,
    "anyrope-jit": _compiled,
    "anyrope-mx-compile": _compiled,
    "numpy-formula": _numpy_formula,
    "naive-jit": _naive_jit,
    "transformers-apply": _transformers_apply,
    "transformers-full": _transformers_full,
    "transformers-apply-compiled": _transformers_apply_compiled,
    "transformers-full-compiled": _transformers_full_compiled,
    "rotary-embedding-torch": _rotary_embedding_torch,
    "onnxruntime-op": lambda g: _onnx_runtime(g, op=True),
    "onnxruntime-elementwise": lambda g: _onnx_runtime(g, op=False),
    "mx.fast.rope": _mlx_fast,
    "mx.fast.rope-compiled": lambda g: _mlx_fast(g, compiled=True),
}
NOTES = {
    "copy-compiled": "the copy through the library's compiler (JAX's copy is jitted already)",
    "anyrope": "default call, fast paths on",
    "anyrope-generic": "inside use_fast_paths(False)",
    "anyrope-inplace": "inplace=True",
    "anyrope-compiled": "torch.compile(fullgraph=True) of the call (decode offsets traced)",
    "anyrope-aoti": "torch.export of the call, AOTInductor's package loaded and run (decode offsets an input)",
    "anyrope-jit": "jax.jit of the call (decode offsets traced)",
    "anyrope-mx-compile": "mx.compile of the call (decode offsets traced)",
    "numpy-formula": "base ** (-arange(0, d, 2) / d), angles, cos/sin, rotation, all in the call",
    "naive-jit": "jax.jit of numpy-formula's code on jax.numpy, positions traced",
    "transformers-apply": "apply_rotary_pos_emb, tables ready",
    "transformers-full": "LlamaRotaryEmbedding forward + apply_rotary_pos_emb",
    "transformers-apply-compiled": "torch.compile of transformers' formula, tables ready",
    "transformers-full-compiled": "torch.compile(fullgraph=True) of transformers-full, position ids traced",
    "rotary-embedding-torch": "rotate_queries_or_keys (decode: forward(positions) + apply_rotary_emb)",
    "onnxruntime-op": "torch.onnx.export (opset 23) of anyrope.layers.torch: ONNX's RotaryEmbedding op, in ONNX Runtime",
    "onnxruntime-elementwise": "the same export with onnx_op=False: anyrope's elementwise form, in ONNX Runtime",
    "mx.fast.rope": "traditional=True for interleaved; decode: an offset per row",
    "mx.fast.rope-compiled": "mx.compile of mx.fast.rope (decode offsets traced)",
}


def build(rt: Runtime, bench: Bench) -> Call:
    """The benchmark's callable, each call awaited (``rt.finish``), warmed up twice."""
    g = make_group(rt, bench.case, bench.dtype, bench.layout)
    call, finish = BUILDERS[bench.variant](g), rt.finish
    for _ in range(2):  # compiles, lazy tables; a compiled call may recompile once on its second call
        finish(call())
    return call
