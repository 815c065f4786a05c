"""PyTorch's CPU fast path: the numba kernel on zero-copy NumPy views, inside an autograd.Function.

The backward of a rotation is the inverse rotation, so gradients run through the same kernel.
Without numba the generic path runs: torch's complex multiply would be one pass for
"interleaved", but it rounds differently in its vector and scalar loops, so decoding token by
token would not reproduce a full call bit for bit. 16-bit tensors reach the kernel as their
bits, which it widens to float32 and rounds once on the way out, as the generic path does.
CUDA, MPS and traced calls (torch.compile, FX) take the generic path.
"""

from __future__ import annotations

from typing import Any

from . import _kernels
from .numpy_cpu import canonical, lookup, storage

__all__ = ["host_view", "rotate"]

_Function: Any = None


def host_view(x: Any) -> Any:
    """A CPU tensor as a NumPy array sharing its memory; 16-bit floats as int16 bits."""
    import torch

    if x.requires_grad:
        x = x.detach()
    return x.view(torch.int16).numpy() if x.dtype in (torch.float16, torch.bfloat16) else x.numpy()


def _run(x: Any, cos: Any, sin: Any, out: Any, layout: str, inverse: bool, seq_axis: int) -> Any:
    """Rotate with the kernel; x is a contiguous CPU tensor of a dtype :func:`storage` accepts,
    cos and sin CPU tables of its compute dtype."""
    import numpy as np

    batched = cos.ndim == 3 and cos.shape[0] > 1
    shape5 = canonical(tuple(x.shape), seq_axis, batched)
    if out is None:
        out = x.new_empty(x.shape)
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    source, target = host_view(x).reshape(shape5), host_view(out).reshape(shape5)
    separate = out.data_ptr() != x.data_ptr()
    cos3, sin3 = cos.detach().contiguous().numpy(), sin.detach().contiguous().numpy()
    rows_cos, rows_sin, rows = lookup(np, cos3, sin3, inverse)
    kind = storage(x.dtype)
    assert kind is not None, "rotate() lets only kernel dtypes through"
    _kernels.kernel(layout, kind)(source, rows_cos, rows_sin, rows, target, separate)
    return out


def _autograd_function() -> Any:
    global _Function
    if _Function is None:
        import torch

        class Rotate(torch.autograd.Function):
            @staticmethod
            def forward(
                ctx: Any, x: Any, cos: Any, sin: Any, layout: str, inverse: bool, seq_axis: int
            ) -> Any:
                ctx.save_for_backward(cos, sin)
                ctx.layout, ctx.inverse, ctx.seq_axis = layout, inverse, seq_axis
                return _run(x.contiguous(), cos, sin, None, layout, inverse, seq_axis)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                cos, sin = ctx.saved_tensors
                # Linear in x: the vector-Jacobian product is the inverse rotation of grad.
                again: Any = Rotate.apply  # untyped in torch's stubs
                back = again(grad.contiguous(), cos, sin, ctx.layout, not ctx.inverse, ctx.seq_axis)
                return back, None, None, None, None, None

        _Function = Rotate
    return _Function


def rotate(x: Any, cos: Any, sin: Any, *, layout: str, inverse: bool, seq_axis: int, out: Any) -> Any | None:
    import torch

    if x.device.type != "cpu" or cos.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    kind = storage(x.dtype)
    if kind is None or cos.dtype != (x.dtype if kind == "float" else torch.float32):
        return None
    if not _kernels.available():
        return None
    grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    if out is not None:
        if grad or out.dtype != x.dtype or not out.is_contiguous() or out.device.type != "cpu":
            return None
        return _run(x.contiguous(), cos, sin, out, layout, inverse, seq_axis)
    if grad:
        apply: Any = _autograd_function().apply
        return apply(x, cos, sin, layout, inverse, seq_axis)
    return _run(x.contiguous(), cos, sin, None, layout, inverse, seq_axis)
