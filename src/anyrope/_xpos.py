"""xPos (Sun et al., "A Length-Extrapolatable Transformer", 2022): RoPE whose pairs also decay.

Pair ``i`` of q at position ``m`` is scaled by ``zeta_i ** (m / scale_base)`` and of k at ``n``
by ``zeta_i ** (-n / scale_base)``, with ``zeta_i = (2i / rotary_dim + 0.4) / 1.4``. A score then
carries ``zeta_i ** ((m - n) / scale_base)``: it still depends on the relative position only,
and slow pairs (``zeta_i`` near 1) decay least. The scales are formed on the device from the
positions, like the angles.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from ._compat import float64_scope
from ._context import CallContext
from ._positions import PositionSpec
from ._rotary import Rotary

__all__ = ["log_zeta", "xpos_scale"]

GAMMA = 0.4  # the paper's, and rotary-embedding-torch's


def log_zeta(rotary_dim: int) -> tuple[float, ...]:
    """``ln(zeta_i)`` per pair."""
    return tuple(math.log((2 * i / rotary_dim + GAMMA) / (1 + GAMMA)) for i in range(rotary_dim // 2))


def xpos_scale(
    ctx: CallContext, spec: PositionSpec, seq: int, rotary: Rotary, sign: float, dtype: Any
) -> Any:
    """``zeta ** (sign * position / scale_base)``, shape like the tables: (seq, pairs) or (rows, seq, pairs)."""
    xp, env = ctx.xp, ctx.env
    assert rotary.xpos_scale_base is not None
    work = xp.float64 if env.float64 else xp.float32
    with float64_scope(xp) if env.float64 else contextlib.nullcontext():
        positions = xp.astype(spec.positions(xp, env, seq), work)
        rates = xp.asarray(
            [sign * z / rotary.xpos_scale_base for z in log_zeta(rotary.rotary_dim)],
            dtype=work,
            device=ctx.device,
        )
        return xp.astype(xp.exp(positions[..., None] * rates), dtype)
