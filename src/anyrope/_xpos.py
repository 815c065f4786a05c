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

from ._compat import Environment, float64_scope
from ._positions import PositionSpec

__all__ = ["XPosAngles", "log_zeta", "xpos_scale"]

GAMMA = 0.4  # the paper's, and rotary-embedding-torch's


def log_zeta(rotary_dim: int) -> tuple[float, ...]:
    """``ln(zeta_i)`` per pair."""
    return tuple(math.log((2 * i / rotary_dim + GAMMA) / (1 + GAMMA)) for i in range(rotary_dim // 2))


def xpos_scale(
    xp: Any, env: Environment, spec: PositionSpec, seq: int, device: Any, rope: Any, sign: float, dtype: Any
) -> Any:
    """``zeta ** (sign * position / scale_base)``, shape like the tables: (seq, pairs) or (rows, seq, pairs)."""
    work = xp.float64 if env.float64 else xp.float32
    with float64_scope(xp) if env.float64 else contextlib.nullcontext():
        positions = xp.astype(spec.positions(xp, env, seq, device), work)
        rates = xp.asarray(
            [sign * z / rope.xpos_scale_base for z in log_zeta(rope.rotary_dim)], dtype=work, device=device
        )
        return xp.astype(xp.exp(positions[..., None] * rates), dtype)


class XPosAngles:
    """A call's angles with xPos's scale: q's tables times ``zeta ** (m / scale_base)`` (``sign``
    +1), k's divided by ``zeta ** (n / scale_base)`` (-1). Every kernel reads the tables then (no
    shared cached rows: the scale differs per array)."""

    __slots__ = ("angles", "sign")

    def __init__(self, angles: Any, sign: float) -> None:
        self.angles, self.sign = angles, sign

    def tables(self, seq: int, dtype: Any) -> tuple[Any, Any]:
        a = self.angles
        cos, sin = a.tables(seq, dtype)
        scale = xpos_scale(a.xp, a.env, a.spec, seq, a.device, a.rope, self.sign, dtype)
        return cos * scale, sin * scale

    def lookup(self, seq: int, dtype: Any) -> None:  # noqa: ARG002
        return None
