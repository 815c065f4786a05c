"""PyTorch's CPU fast path: the numba kernel on zero-copy NumPy views, inside an autograd.Function.

The backward of a rotation is the inverse rotation, so gradients run through the same kernel.
Without numba the generic path runs: torch's complex multiply would be one pass for
"interleaved", but it rounds differently in its vector and scalar loops, so decoding token by
token would not reproduce a full call bit for bit. 16-bit inputs are widened to float32 for the kernel and rounded once on the way out, as in the
generic path. CUDA, MPS and traced calls (torch.compile, FX) take the generic path.
"""

from __future__ import annotations

from typing import Any

from . import _kernels
from .numpy_cpu import canonical

__all__ = ["rotate"]

_Function: Any = None


def _five(x: Any, shape5: tuple[int, ...]) -> Any:
    return x.detach().numpy().reshape(shape5)


def _run(x: Any, cos: Any, sin: Any, out: Any, layout: str, inverse: bool, seq_axis: int) -> Any:
    """Rotate with the kernel; x, cos and sin are CPU tensors of one float dtype, x contiguous."""
    batched = cos.ndim == 3 and cos.shape[0] > 1
    shape5 = canonical(tuple(x.shape), seq_axis, batched)
    if out is None:
        out = x.new_empty(x.shape)
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    source, target = _five(x, shape5), _five(out, shape5)
    separate = out.data_ptr() != x.data_ptr()
    sign = -1.0 if inverse else 1.0
    cos3, sin3 = cos.contiguous().numpy(), sin.contiguous().numpy()
    _kernels.kernel(layout)(source, cos3, sin3, target, sign, separate)
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
    wide = x.dtype in (torch.float32, torch.float64)
    if not wide and x.dtype not in (torch.float16, torch.bfloat16):
        return None
    if not _kernels.available():
        return None
    grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    if out is not None:
        if grad or out.dtype != x.dtype or not out.is_contiguous() or out.device.type != "cpu":
            return None
        if wide:
            return _run(x.contiguous(), cos, sin, out, layout, inverse, seq_axis)
        out.copy_(_run(x.float().contiguous(), cos, sin, None, layout, inverse, seq_axis))
        return out
    work = x if wide else x.float()
    if cos.dtype != work.dtype:
        return None
    if grad:
        apply: Any = _autograd_function().apply
        result = apply(work, cos, sin, layout, inverse, seq_axis)
    else:
        result = _run(work.contiguous(), cos, sin, None, layout, inverse, seq_axis)
    return result if wide else result.to(x.dtype)
