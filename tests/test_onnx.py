"""torch models that rotate with anyrope.layers.torch.RotaryEmbedding, exported with
``torch.onnx.export(..., dynamo=True)`` (opset 23) and run in ONNX Runtime.

Where the standard ``RotaryEmbedding`` op expresses a call, the graph holds one such node per
rotated tensor and no trigonometry; elsewhere it holds anyrope's elementwise form. Both equal
eager, at the exported shapes and at others.
"""

from __future__ import annotations

import collections
import contextlib
import re
import warnings
from typing import Any

import numpy as np
import pytest

import anyrope
from anyrope import scaling as sc

import oracle

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")  # torch.onnx.export(dynamo=True) translates through it
from anyrope.layers.torch import RotaryEmbedding  # after the skips: it imports torch

# the exporter's renaming of dynamic axes warns whenever one Dim names axes of several inputs
pytestmark = pytest.mark.filterwarnings("ignore:# The axis name:UserWarning")

HEAD_DIM = 32


class Rotate(torch.nn.Module):
    """q and k through the layer; ``form`` names the position argument, given as a tensor input."""

    def __init__(self, layer: Any, form: str | None = None, seq_axis: int = -2) -> None:
        super().__init__()
        self.layer, self.form, self.seq_axis = layer, form, seq_axis

    def forward(self, q: Any, k: Any, where: Any = None) -> Any:
        given = {self.form: where} if self.form else {}
        return self.layer(q, k, seq_axis=self.seq_axis, **given)


def exported(module: Any, inputs: tuple[Any, ...], dynamic: Any = None) -> Any:
    program = torch.onnx.export(
        module.eval(), inputs, dynamo=True, opset_version=23, dynamic_shapes=dynamic, verbose=False
    )
    return program.model_proto


def op_counts(model: Any) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in model.graph.node)


def run(model: Any, inputs: tuple[Any, ...]) -> list[Any]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})


def assert_equals_eager(got: list[Any], want: Any, dtype: str = "float32") -> None:
    """ONNX Runtime's results against eager ones: both round the same exact float64 tables once
    and rotate in float32, so they differ by the rounding of a few products and sums (float32's
    tolerance of the oracle; 16-bit results by half an ulp of the dtype, once rounded)."""
    for out, expected in zip(got, want, strict=True):
        expected = expected.double().numpy()
        scale = max(1.0, float(np.abs(expected).max()))
        assert out.shape == expected.shape
        assert float(np.abs(out.astype(np.float64) - expected).max()) <= oracle.TOLERANCE[dtype] * scale


def inputs_of(batch: int, seq: int, seq_axis: int = -2, dtype: Any = None) -> tuple[Any, Any]:
    dtype = dtype or torch.float32
    q, k = torch.randn(batch, 4, seq, HEAD_DIM), torch.randn(batch, 2, seq, HEAD_DIM)
    if seq_axis == -3:
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    elif seq_axis == "3-d":
        q, k = q[:, 0], k[:, 0]
    return q.to(dtype), k.to(dtype)


STANDARD = {
    "plain": anyrope.RoPE(HEAD_DIM, max_position=2048),
    "interleaved": anyrope.RoPE(HEAD_DIM, layout="interleaved", max_position=2048),
    "partial half": anyrope.RoPE(HEAD_DIM, rotary_dim=16, max_position=2048),
    "partial interleaved clockwise": anyrope.RoPE(
        HEAD_DIM, rotary_dim=24, layout="interleaved", clockwise=True, max_position=2048
    ),
    # scaled frequencies and an attention factor the caches carry
    "yarn": anyrope.RoPE(HEAD_DIM, base=1e6, scaling=sc.YaRN(4.0, 512), max_position=2048),
    "dynamic ntk at a fixed length": anyrope.RoPE(
        HEAD_DIM, scaling=sc.DynamicNTK(2.0, 512), max_position=2048
    ).at_length(2048),
}
FORMS: dict[str, tuple[str | None, Any]] = {
    "offset 0": (None, None),
    "offset per row": ("offset", lambda batch, seq: torch.tensor([3, 1000, 0])[:batch]),
    "positions (batch, seq)": ("positions", lambda batch, seq: torch.randint(0, 2048, (batch, seq))),
    "positions (seq,)": ("positions", lambda batch, seq: torch.arange(seq).flip(0) + 7),
}
BATCH, SEQ = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=2048)
WHERE_DIMS = {
    "offset per row": {0: BATCH},
    "positions (batch, seq)": {0: BATCH, 1: SEQ},
    "positions (seq,)": {0: SEQ},
}
CASES = [
    ("plain", "offset 0", -2),
    ("plain", "offset per row", -3),
    ("plain", "positions (seq,)", "3-d"),
    ("interleaved", "positions (batch, seq)", -2),
    ("interleaved", "offset per row", "3-d"),
    ("partial half", "positions (batch, seq)", -3),
    ("partial interleaved clockwise", "offset per row", -2),
    ("yarn", "positions (batch, seq)", -2),
    ("dynamic ntk at a fixed length", "offset 0", -3),
]


@pytest.mark.parametrize(("rope_name", "form", "layout"), CASES)
def test_standard_op_where_it_expresses_the_call(rope_name: str, form: str, layout: Any) -> None:
    """One RotaryEmbedding node per tensor, no trigonometry in the graph, equal to eager at the
    exported shape and at another batch and length (dynamic shapes)."""
    rope, (arg, make) = STANDARD[rope_name], FORMS[form]
    seq_axis = -2 if layout == "3-d" else layout
    module = Rotate(RotaryEmbedding(rope), arg, seq_axis)
    seq_dim = 1 if seq_axis == -3 or layout == "3-d" else 2
    example = (*inputs_of(2, 5, layout), *([make(2, 5)] if arg else []))
    dims = {"q": {0: BATCH, seq_dim: SEQ}, "k": {0: BATCH, seq_dim: SEQ}}
    if arg:
        dims["where"] = WHERE_DIMS[form]
    model = exported(module, example, dims)
    counts = op_counts(model)
    assert counts["RotaryEmbedding"] == 2, counts
    assert not {"Cos", "Sin"} & set(counts), counts
    for batch, seq in ((2, 5), (3, 11)):
        inputs = (*inputs_of(batch, seq, layout), *([make(batch, seq)] if arg else []))
        assert_equals_eager(run(model, inputs), module(*inputs))


def test_one_pair_of_caches_for_every_layer() -> None:
    """Layers that rotate alike share the caches: the model stores them once."""
    rope = STANDARD["plain"]

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = RotaryEmbedding(rope), RotaryEmbedding(HEAD_DIM, max_position=2048)

        def forward(self, q: Any, k: Any) -> Any:
            return self.second(*self.first(q, k), offset=7)

    model = exported(Two(), inputs_of(2, 5))
    assert op_counts(model)["RotaryEmbedding"] == 4
    caches = [i for i in model.graph.initializer if list(i.dims) == [2048, HEAD_DIM // 2]]
    assert len(caches) == 2


def test_16_bit_arrays_rotate_in_float32() -> None:
    rope = STANDARD["interleaved"]
    module = Rotate(RotaryEmbedding(rope), "offset")
    inputs = (*inputs_of(2, 5, dtype=torch.float16), torch.tensor([0, 1500]))
    model = exported(module, inputs)
    assert op_counts(model)["RotaryEmbedding"] == 2
    assert_equals_eager(run(model, inputs), module(*inputs), "float16")


def test_positions_past_the_caches_are_refused_by_onnx_runtime() -> None:
    rope = anyrope.RoPE(HEAD_DIM, max_position=16)
    module = Rotate(RotaryEmbedding(rope), "offset")
    model = exported(module, (*inputs_of(2, 5), torch.tensor([0, 3])))
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="out of range"):
        run(model, (*inputs_of(2, 5), torch.tensor([0, 12])))


FALLBACKS = {
    "xpos": (anyrope.RoPE(HEAD_DIM, xpos_scale_base=512.0, max_position=2048), "offset", (2, 5)),
    "m-rope": (anyrope.RoPE(HEAD_DIM, mrope_section=[8, 4, 4], max_position=2048), "positions", (3, 2, 5)),
    "axial": (anyrope.RoPE(HEAD_DIM, axial=2, max_position=2048), "positions", (2, 2, 5)),
    "dynamic ntk": (anyrope.RoPE(HEAD_DIM, scaling=sc.DynamicNTK(2.0, 8)), "positions", (2, 5)),
    "no max_position": (anyrope.RoPE(HEAD_DIM), "offset", (2,)),
    "onnx_op=False": (STANDARD["plain"], "offset", (2,)),
}


def _warns_of_max_position(expected: bool) -> Any:
    """The block warns that a layer exports elementwise for want of max_position (``expected``), or
    does not (the suite turns any other warning into an error)."""
    return pytest.warns(UserWarning, match="Pass max_position=") if expected else contextlib.nullcontext()


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_elementwise_form_elsewhere(name: str) -> None:
    """Where the op cannot express the rotation, anyrope's own form: no RotaryEmbedding node, and
    ONNX Runtime's result is eager's."""
    rope, arg, shape = FALLBACKS[name]
    layer = RotaryEmbedding(rope, onnx_op=False if name == "onnx_op=False" else None)
    module = Rotate(layer, arg)
    where = torch.randint(0, 40, shape) if arg == "positions" else torch.tensor([3, 30])
    inputs = (*inputs_of(2, 5), where)
    # torch-triton: Triton's interpreter makes its op a CPU kernel
    with anyrope.use_fast_paths(False), _warns_of_max_position(name == "no max_position"):
        model = exported(module, inputs)
    counts = op_counts(model)
    assert "RotaryEmbedding" not in counts, counts
    assert counts["Cos"] >= 1, counts
    assert "ScatterND" not in counts, counts  # ONNX runtimes form each node once: no scatter of the tables
    assert_equals_eager(run(model, inputs), module(*inputs))


def test_float64_and_other_shapes_export_elementwise() -> None:
    module = Rotate(RotaryEmbedding(STANDARD["plain"]))
    inputs = inputs_of(2, 5, dtype=torch.float64)
    model = exported(module, inputs)
    assert "RotaryEmbedding" not in op_counts(model)
    assert_equals_eager(run(model, inputs), module(*inputs), "float64")
    five = (torch.randn(2, 3, 4, 5, HEAD_DIM), torch.randn(2, 3, 4, 5, HEAD_DIM))
    model = exported(module, five)
    assert "RotaryEmbedding" not in op_counts(model)
    assert_equals_eager(run(model, five), module(*five))


BAD = {
    "positions of another length": ("positions", torch.arange(4)),
    "positions of another batch": ("positions", torch.zeros(3, 5, dtype=torch.int64)),
    "float positions": ("positions", torch.zeros(5)),
    "offsets of another batch": ("offset", torch.tensor([1, 2, 3])),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_input_raises_ropes_error_while_exporting(bad: str) -> None:
    """The op's path checks the call as ``rope(...)`` does: its error, naming the argument, is
    the one torch.onnx.export reports."""
    rope = STANDARD["plain"]
    arg, where = BAD[bad]
    q, k = inputs_of(2, 5)
    with pytest.raises((TypeError, ValueError)) as expected:
        rope(q, k, **{arg: where})
    with pytest.raises(torch.onnx.OnnxExporterError, match=re.escape(str(expected.value))):
        exported(Rotate(RotaryEmbedding(rope), arg), (q, k, where))


def test_a_layer_without_max_position_warns_once_while_exporting() -> None:
    """Issue 57: a layer whose RoPE lacks max_position exported dozens of elementwise nodes where
    the standard op would serve, without a word. Each such layer now says so once, naming itself,
    why, and what to pass; layers the op serves, onnx_op=False and rotations the op cannot
    express (xPos) say nothing, and neither does an eager call."""

    class Layers(torch.nn.Module):
        def __init__(self, *layers: Any) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(layers)

        def forward(self, q: Any, k: Any) -> Any:
            for layer in self.layers:
                q, k = layer(q, k, offset=3)
            return q, k

    bare, other = RotaryEmbedding(HEAD_DIM, layout="interleaved"), RotaryEmbedding(HEAD_DIM, base=500.0)
    quiet = [
        RotaryEmbedding(HEAD_DIM, max_position=2048),
        RotaryEmbedding(HEAD_DIM, onnx_op=False),
        RotaryEmbedding(HEAD_DIM, xpos_scale_base=512.0),
    ]
    inputs = inputs_of(2, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eager calls: nothing to say
        Layers(bare, other)(*inputs)
    with pytest.warns(UserWarning, match="Pass max_position=") as caught:
        model = exported(Layers(bare, bare, other, *quiet), inputs)
    said = [str(w.message) for w in caught if "max_position" in str(w.message)]
    assert len(said) == 2, said  # bare once, though called twice and traced by every try of the exporter
    assert any(repr(bare) in message for message in said), said
    assert any(repr(other) in message for message in said), said
    for message in said:
        assert "elementwise" in message, message
        assert "RotaryEmbedding operator" in message, message
        assert "Pass max_position=" in message, message
    assert op_counts(model)["RotaryEmbedding"] == 2  # the layer with max_position: q and k
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        exported(Layers(bare, other), inputs)
    assert not [w for w in again if "max_position" in str(w.message)]  # each layer said it once already
