"""The numba kernel as a torch operator, for calls that ``torch.compile`` traces (imports torch).

Inductor cannot call numba, and left to compile the generic code itself it writes the
interleaved rotation of 16-bit floats as a scalar loop, several times the numba pass on a CPU. As an operator with a fake implementation the pass is
one node of the graph, which inductor calls between its own kernels; its gradient is the
inverse rotation through the same operator. Its table is the call's own cos and sin side by
side (:func:`anyrope._tables.side_by_side`), as the graph forms or reads them, with rows 0, 1,
2, ... (no position is read on the host).
"""

from typing import Any

import torch

from ._numba_run import rows_of_table, run_kernel

__all__ = ["rotate"]


@torch.library.custom_op("anyrope::numba_rotate", mutates_args=(), device_types="cpu")
def rotate(
    x: torch.Tensor,
    table: torch.Tensor,
    kind: str,
    layout: str,
    inverse: bool,
    seq_axis: int,
) -> torch.Tensor:
    """x rotated by a (seq, 2 * pairs) or (rows, seq, 2 * pairs) table into a new C-contiguous tensor."""
    flat, rows = rows_of_table(table)
    return run_kernel(x.contiguous(), flat, rows, None, kind, layout, inverse, seq_axis)


@rotate.register_fake
def _rotate_fake(x: torch.Tensor, *call: object) -> torch.Tensor:  # noqa: ARG001 - the op's signature
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # C-contiguous, as the kernel's


def _setup(ctx: Any, inputs: tuple[object, ...], output: object) -> None:  # noqa: ARG001
    _, table, *call = inputs
    ctx.save_for_backward(table)
    ctx.call = call


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[object, ...]:
    # Linear in x: the vector-Jacobian product is the inverse rotation of grad.
    (table,) = ctx.saved_tensors
    kind, layout, inverse, seq_axis = ctx.call
    return rotate(grad, table, kind, layout, not inverse, seq_axis), None, None, None, None, None


rotate.register_autograd(_backward, setup_context=_setup)
