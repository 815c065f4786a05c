"""The check that a drop-in rotates a probe as the mlx-lm module it stands for does."""

from __future__ import annotations

from typing import Any

from ._libs import _rope_utils, mx
from ._module import AnyRoPE

_F32_EPS = 2.0**-24  # float32's unit roundoff
# mlx-lm forms each angle in float32 from float32 frequencies (a pow, a reciprocal, a product,
# and for Llama 3 and YaRN a blend), each rounding by 2**-24 relative or an ulp, so its angle at
# position p and frequency theta is off by up to about 8 * 2**-24 * |p| * theta. The probe
# allows twice that, plus 1e-5 of the largest input for rounding x cos - y sin (measured: under
# 2 * 2**-24 and 1.1 * 2**-24 * |p| * theta). A wrong layout, frequency or multiplier is off by
# O(1) at these positions.
_PROBE_LENGTH = 64
_PROBE_ANGLE_ULPS = 16.0
_PROBE_ROUNDING = 1e-5


def _probe_offsets(module: Any) -> tuple[int, ...]:
    if type(module) is _rope_utils.DynamicNTKScalingRoPE and module.max_position_embeddings:
        return (0, int(module.max_position_embeddings))  # the base grows past it
    return (0,)


def _check(module: Any, drop_in: AnyRoPE, where: str) -> None:
    """Raise ValueError unless ``drop_in`` rotates a probe as ``module`` does."""
    rope = drop_in.rope
    x = mx.random.normal((1, 2, _PROBE_LENGTH, drop_in.dims), key=mx.random.key(0))
    largest = float(mx.max(mx.abs(x)).item())
    fastest = max((abs(f) for f in rope.inv_freq), default=0.0)
    for offset in _probe_offsets(module):
        try:
            theirs = module(x, offset=offset)
        except Exception as exc:
            raise ValueError(f"mlx-lm's module of {where} fails on a probe: {exc}") from exc
        ours = drop_in(x, offset=offset)
        diff = float(mx.max(mx.abs(ours - theirs)).item())
        position = offset + _PROBE_LENGTH - 1
        bound = (
            max(rope.attention_scaling, 1.0)
            * largest
            * (_PROBE_ROUNDING + _PROBE_ANGLE_ULPS * _F32_EPS * position * fastest)
        )
        if not diff <= bound:
            raise ValueError(
                f"anyrope's {rope!r} rotates differently from mlx-lm's {type(module).__name__} of {where}: "
                f"by up to {diff:.3g} at positions {offset}..{position} (allowed {bound:.3g}); please "
                "report the model"
            )
