"""The torch operator that keeps a call's tables while torch.compile compiles it; imported on
first use (it imports torch).

Inductor fuses elementwise work into its consumers: left alone, the float64 angles and their cos
and sin go into the loop over every head, formed once per head instead of once per call. An
operator it cannot see into makes it form them once, into a buffer, before the rotation reads
them. The operator only copies, so results are unchanged; its gradient passes through.
"""

from typing import Any

import torch

__all__ = ["keep_tables"]


@torch.library.custom_op("anyrope::keep_tables", mutates_args=())
def keep_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, copied."""
    return cos.clone(), sin.clone()


@keep_tables.register_fake
def _keep_tables_fake(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(cos), torch.empty_like(sin)


def _backward(ctx: Any, grad_cos: torch.Tensor, grad_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ARG001
    return grad_cos, grad_sin


keep_tables.register_autograd(_backward)
