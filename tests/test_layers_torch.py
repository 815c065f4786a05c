"""anyrope.layers.torch.RotaryEmbedding: the call of ``rope(...)`` as a torch module, and the
module's lifecycle: nothing to save or cast, meta-device initialisation, pickling, deep copies,
torch.compile, torch.export, and training with gradients equal to eager ones.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

import anyrope

import oracle

torch = pytest.importorskip("torch")
from anyrope.layers.torch import RotaryEmbedding  # after the skip: it imports torch

HEAD_DIM = 16
FAR = 10**6  # a position where a table rounded to 16 bits turns pairs by radians, not ulps


def _error(got: Any, want: np.ndarray) -> float:
    """Largest error relative to the largest |value| (at least 1), as oracle.TOLERANCE counts it."""
    want = np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got.detach().double().numpy() - want).max()) / scale


class Attention(torch.nn.Module):
    """A tiny attention block: projections, the rotation, scaled dot-product attention."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.rotary = RotaryEmbedding(width // heads, base=500.0)

    def forward(self, x: Any, offset: Any = 0) -> Any:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).reshape(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.rotary(q, k, offset=offset)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, seq, width))


def test_holds_no_state_and_shows_its_rope() -> None:
    rope = anyrope.RoPE(HEAD_DIM, base=500000.0, layout="interleaved")
    layer = RotaryEmbedding(rope)
    assert layer.rope is rope
    assert layer.state_dict() == {}
    assert not list(layer.parameters())
    assert not list(layer.buffers())
    assert repr(layer) == f"RotaryEmbedding({rope!r})"
    built = RotaryEmbedding(HEAD_DIM, base=500000.0, layout="interleaved", onnx_op=False)
    assert repr(built) == f"RotaryEmbedding({rope!r}, onnx_op=False)"
    assert Attention().state_dict().keys() == {"qkv.weight", "qkv.bias", "out.weight", "out.bias"}


def test_from_hf_config() -> None:
    config = {
        "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 500000.0, "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    }  # fmt: skip
    layer = RotaryEmbedding.from_hf_config(config, layout="interleaved", onnx_op=True)
    assert repr(layer.rope) == repr(anyrope.RoPE.from_hf_config(config, layout="interleaved"))
    assert layer.onnx_op is True


CALLS = {
    "default": {},
    "offset": {"offset": 7},
    "negative offset": {"offset": -3},
    "offsets per row (list)": {"offset": [0, 9]},
    "offsets per row (tensor)": {"offset": torch.tensor([4, 100])},
    "positions (seq,)": {"positions": torch.tensor([5, 0, 3, 3, 9])},
    "positions (batch, seq)": {"positions": torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])},
}


@pytest.mark.parametrize("seq_axis", [-2, -3])
@pytest.mark.parametrize("call", list(CALLS))
def test_calls_equal_rope(call: str, seq_axis: int) -> None:
    """Every position form of ``rope(...)``, q alone and q with k: the very same result."""
    rope = anyrope.RoPE(HEAD_DIM, rotary_dim=12, layout="interleaved")
    layer = RotaryEmbedding(rope)
    shape = (2, 3, 5, HEAD_DIM) if seq_axis == -2 else (2, 5, 3, HEAD_DIM)
    q, k = torch.randn(shape), torch.randn(shape)
    kwargs = {**CALLS[call], "seq_axis": seq_axis}
    assert torch.equal(layer(q, **kwargs), rope(q, **kwargs))
    for got, want in zip(layer(q, k, **kwargs), rope(q, k, **kwargs), strict=True):
        assert torch.equal(got, want)


BAD_CALLS = {
    "last axis not head_dim": ((torch.ones(1, 2, 5, 12),), {}),
    "positions of another length": ((torch.ones(1, 2, 5, HEAD_DIM),), {"positions": torch.arange(4)}),
    "positions of three axes": ((torch.ones(1, 2, 5, HEAD_DIM),), {"positions": torch.zeros(1, 1, 5, dtype=torch.int64)}),
    "positions of another batch": ((torch.ones(2, 2, 5, HEAD_DIM),), {"positions": torch.zeros(3, 5, dtype=torch.int64)}),
    "float positions": ((torch.ones(1, 2, 5, HEAD_DIM),), {"positions": torch.zeros(5)}),
    "positions and offset": ((torch.ones(1, 2, 5, HEAD_DIM),), {"positions": [0, 1, 2, 3, 4], "offset": 2}),
    "offsets of another batch": ((torch.ones(2, 2, 5, HEAD_DIM),), {"offset": [1, 2, 3]}),
    "seq_axis past the array": ((torch.ones(2, 5, HEAD_DIM),), {"seq_axis": -4}),
    "seq_axis of the features": ((torch.ones(2, 5, HEAD_DIM),), {"seq_axis": -1}),
    "integer q": ((torch.ones(1, 2, 5, HEAD_DIM, dtype=torch.int32),), {}),
    "k of another width": ((torch.ones(1, 2, 5, HEAD_DIM), torch.ones(1, 2, 5, 8)), {}),
}  # fmt: skip


@pytest.mark.parametrize("bad", list(BAD_CALLS))
def test_bad_calls_raise_ropes_errors(bad: str) -> None:
    """The layer raises exactly what ``rope(...)`` raises, naming the argument."""
    rope = anyrope.RoPE(HEAD_DIM)
    args, kwargs = BAD_CALLS[bad]
    with pytest.raises((TypeError, ValueError)) as expected:
        rope(*args, **kwargs)
    with pytest.raises(expected.type) as raised:
        RotaryEmbedding(rope)(*args, **kwargs)
    assert str(raised.value) == str(expected.value)


def test_bad_signatures_and_arguments_name_what_is_wrong() -> None:
    layer, q = RotaryEmbedding(HEAD_DIM), torch.ones(1, 2, 5, HEAD_DIM)
    with pytest.raises(TypeError, match="positional"):
        layer(q, q, torch.arange(5))  # positions must be given by name, as with rope(...)
    with pytest.raises(TypeError, match="'position'"):
        layer(q, position=torch.arange(5))
    with pytest.raises(TypeError, match="not both: got a RoPE and base"):
        RotaryEmbedding(anyrope.RoPE(HEAD_DIM), base=10.0)
    with pytest.raises(TypeError, match=r"rope must be an anyrope\.RoPE or head_dim"):
        RotaryEmbedding("16")
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(15)
    with pytest.raises(TypeError, match="'bsae'"):
        RotaryEmbedding(HEAD_DIM, bsae=10.0)
    with pytest.raises(TypeError, match="onnx_op must be None, True or False"):
        RotaryEmbedding(HEAD_DIM, onnx_op="yes")
    with pytest.raises(ValueError, match=r"onnx_op=True, but .* without max_position"):
        RotaryEmbedding(HEAD_DIM, onnx_op=True)


@pytest.mark.parametrize("cast", ["bfloat16", "half"])
def test_exact_far_out_after_casting_the_model(cast: str) -> None:
    """model.to(torch.bfloat16) / .half() cast weights, and nothing of the rotation: at position
    10**6 it stays within the 16-bit dtype's rounding of the float64 oracle (and, cast back,
    within float32's), where a 16-bit copy of the frequencies misses by whole radians."""
    torch.manual_seed(0)
    model = Attention()
    model = model.to(torch.bfloat16) if cast == "bfloat16" else model.half()
    dtype = "bfloat16" if cast == "bfloat16" else "float16"
    q = torch.randn(1, 2, 4, HEAD_DIM).to(getattr(torch, dtype))
    positions = np.arange(FAR, FAR + 4)
    want = oracle.rotate(q.double().numpy(), positions, base=500.0)
    assert _error(model.rotary(q, offset=FAR), want) <= oracle.TOLERANCE[dtype]
    model.float()
    assert _error(model.rotary(q.float(), offset=FAR), want) <= oracle.TOLERANCE["float32"]
    # The check's power: frequencies rounded to the dtype, as a cast registered buffer is, fail it.
    rounded = torch.tensor(oracle.inv_freq(HEAD_DIM, 500.0)).to(getattr(torch, dtype)).double().numpy()
    stale = oracle.rotate(q.double().numpy(), positions, frequencies=rounded)
    assert _error(torch.from_numpy(stale), want) > 10 * oracle.TOLERANCE[dtype]


def test_meta_device_initialisation_then_to_empty() -> None:
    """Built on the meta device, materialised with to_empty and loaded: the outputs of a model
    built on the CPU, bit for bit, and exact far out (nothing of the rotation was uninitialised)."""
    torch.manual_seed(0)
    reference = Attention()
    with torch.device("meta"):
        model = Attention()
    assert model.rotary(torch.ones(1, 2, 3, HEAD_DIM, device="meta")).device.type == "meta"
    model.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict())
    x = torch.randn(2, 6, 32)
    assert torch.equal(model(x, offset=FAR), reference(x, offset=FAR))
    q = torch.randn(1, 2, 3, HEAD_DIM)
    want = oracle.rotate(q.double().numpy(), np.arange(FAR, FAR + 3), base=500.0)
    assert _error(model.rotary(q, offset=FAR), want) <= oracle.TOLERANCE["float32"]


def test_pickles_and_deep_copies() -> None:
    model = Attention()
    x = torch.randn(2, 6, 32)
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert repr(twin.rotary) == repr(model.rotary)
        assert torch.equal(twin(x, offset=3), model(x, offset=3))


def _close_to_oracle(got: Any, q: Any, positions: Any) -> None:
    want = oracle.rotate(q.double().numpy(), np.asarray(positions), base=500.0)
    assert _error(got, want) <= oracle.TOLERANCE["float32"]


def test_compiles_in_one_graph() -> None:
    """torch.compile(fullgraph=True) of every position form: no graph break, the oracle's result."""
    torch._dynamo.reset()
    layer = RotaryEmbedding(HEAD_DIM, base=500.0)
    compiled = torch.compile(layer, fullgraph=True)
    q = torch.randn(2, 3, 5, HEAD_DIM)
    _close_to_oracle(compiled(q, offset=FAR), q, np.arange(FAR, FAR + 5))
    offsets = torch.tensor([7, FAR])
    _close_to_oracle(compiled(q, offset=offsets), q, offsets.numpy()[:, None] + np.arange(5))
    positions = torch.tensor([[4, 3, 2, 1, 0], [9, 9, 9, 9, 9]])
    _close_to_oracle(compiled(q, positions=positions), q, positions.numpy())


def test_torch_export_with_dynamic_shapes() -> None:
    model = Attention().eval()
    x, positions = torch.randn(2, 6, 32), torch.tensor([3, 100])
    batch, seq = torch.export.Dim("batch", min=2, max=64), torch.export.Dim("seq", min=2, max=1024)
    with anyrope.use_fast_paths(False):  # torch-triton: Triton's interpreter makes its op a CPU kernel
        exported = torch.export.export(model, (x, positions), dynamic_shapes=({0: batch, 1: seq}, {0: batch}))
    for shape, offsets in (((2, 6, 32), positions), ((3, 17, 32), torch.tensor([0, 5, FAR]))):
        x = torch.randn(shape)
        # float32: the exported graph runs anyrope's generic arithmetic, eager the fused kernel
        # where numba is installed: the same formula, a few ulp apart through the projections
        torch.testing.assert_close(exported.module()(x, offsets), model(x, offsets), rtol=1e-5, atol=1e-6)


def test_training_steps_agree_eager_and_compiled() -> None:
    """Three SGD steps of the tiny attention block, eager and torch.compile(fullgraph=True) from
    the same weights: the same gradients at each step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = Attention()
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin)]
    for step in range(3):
        x, target = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
        offsets = torch.tensor([step, 50 * step])
        for model, optimizer in zip((eager, compiled), optimizers, strict=True):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x, offsets), target).backward()
        for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
            assert a.grad is not None, name
            assert float(a.grad.abs().max()) > 0, name
            # float32: inductor fuses and reorders the sums of matmuls, softmax and the rotation's
            # backward: a few ulp per operation (on this project's CPUs they came out equal)
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=f"step {step}: {name}")
        for optimizer in optimizers:
            optimizer.step()
