"""Converting one mlx-lm rope module into its :class:`AnyRoPE`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ... import scaling as sc
from ..._args import check_bool
from ..._rope import RoPE
from ._from_config import initialize_rope
from ._libs import _rope_utils, _stored_kinds, _supported_names, mx, nn
from ._module import AnyRoPE, StoredFrequencies
from ._probe import _F32_EPS, _check


def _stored(module: Any, dims: int, traditional: bool, attention: float) -> RoPE:
    periods = module._freqs.astype(mx.float32).tolist()
    frequencies = StoredFrequencies(
        tuple(1.0 / p for p in periods), float(attention), source=type(module).__name__
    )
    return RoPE(dims, rotary_dim=dims, layout="interleaved" if traditional else "half", scaling=frequencies)


def _convert(module: Any) -> RoPE:
    kind = type(module)
    layout = "interleaved" if getattr(module, "traditional", False) else "half"
    if kind is nn.RoPE:
        scale = float(module.scale)
        scaling = None if scale == 1.0 else sc.Linear(1.0 / scale)
        return RoPE(module.dims, base=float(module.base), layout=layout, scaling=scaling)
    if kind is _rope_utils.DynamicNTKScalingRoPE:
        original = int(module.max_position_embeddings)
        return RoPE(
            module.dims,
            base=float(module.base),
            layout=layout,
            scaling=sc.DynamicNTK(float(module.factor), original),
            max_position=original,
        )
    if kind is _rope_utils.Llama3RoPE:
        return _stored(module, module.dims, module.traditional, 1.0)
    if kind is _rope_utils.YarnRoPE:
        return _stored(module, module.dims, module.traditional, module.mscale)
    if kind is _rope_utils.SuScaledRoPE:
        return _stored(module, module.dim, False, module._scale)
    if kind is _rope_utils.ProportionalRoPE:
        return _stored(module, module.dims, module.traditional, 1.0)
    raise TypeError(
        f"anyrope has no drop-in for {kind.__module__}.{kind.__qualname__}; it converts "
        f"{', '.join(_supported_names())}"
    )


def from_mlx_lm(module: Any, *, args: Any = None, check: bool = True) -> AnyRoPE:
    """The :class:`AnyRoPE` that rotates as the mlx-lm rope module ``module`` does.

    ``nn.RoPE`` and ``DynamicNTKScalingRoPE`` keep their parameters, which anyrope uses exactly.
    ``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE`` and ``ProportionalRoPE`` keep only float32
    periods (rounded, so their angles can be off by about ``position * 2**-23`` rad): given the
    model's ``args``, anyrope computes their frequencies from the config exactly, as
    :func:`initialize_rope` does, where those agree with the module's to float32 precision, and
    otherwise uses the reciprocals of the module's periods (see :class:`StoredFrequencies`),
    with the module's multiplier (``mscale``, ``_scale``) either way.

    Parameters
    ----------
    module : mlx.nn.Module
        ``mlx.nn.RoPE`` or a rope module of ``mlx_lm.models.rope_utils`` (exactly these
        classes: a subclass may rotate otherwise). An :class:`AnyRoPE` is returned as it is.
    args : ModelArgs or dict, optional
        The model's arguments (``model.args`` in mlx-lm), read for ``rope_theta``,
        ``rope_scaling``, ``max_position_embeddings`` and ``original_max_position_embeddings``.
    check : bool
        Check that both rotate a probe alike (positions 0..63, and past the original context
        for DynamicNTK).

    Raises
    ------
    TypeError
        For a module of any other class, naming it.
    ValueError
        Where the check fails.
    """
    check = check_bool(check, "check")
    if isinstance(module, AnyRoPE):
        return module
    drop_in = AnyRoPE(_convert(module))
    if args is not None and type(module) in _stored_kinds():
        exact = _from_args(drop_in, args)
        if exact is not None:
            drop_in = exact
    drop_in._state.original = module
    if check:
        _check(module, drop_in, type(module).__name__)
    return drop_in


def _arg(args: Any, key: str) -> Any:
    return args.get(key) if isinstance(args, Mapping) else getattr(args, key, None)


def _from_args(stored: AnyRoPE, args: Any) -> AnyRoPE | None:
    """The AnyRoPE ``initialize_rope`` makes of the model's args, if its frequencies are those
    ``stored`` read from the module, to float32 precision; else None."""
    base = _arg(args, "rope_theta")
    scaling = _arg(args, "rope_scaling")
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        return None
    if scaling is not None and not isinstance(scaling, Mapping):
        return None
    if scaling is not None:
        scaling = dict(scaling)
        if scaling.get("type") == "su":  # Phi-3's name for LongRoPE; phi3.py builds SuScaledRoPE
            scaling["type"] = "longrope"
        original = _arg(args, "original_max_position_embeddings")
        if original is not None and "original_max_position_embeddings" not in scaling:
            scaling["original_max_position_embeddings"] = original
    try:
        exact = initialize_rope(
            stored.dims,
            float(base),
            stored.traditional,
            scaling,
            _arg(args, "max_position_embeddings"),
            check=False,
        )
    except (ValueError, TypeError, KeyError, ArithmeticError):
        return None
    return exact if _agree(exact.rope, stored.rope) else None


# float32 periods carry a rounding and a pow's ulp or two: 8 * 2**-24 relative is generous for
# that, and far below any difference a different config makes.
_AGREEMENT = 8 * _F32_EPS


def _agree(exact: RoPE, stored: RoPE) -> bool:
    if (exact.head_dim, exact.rotary_dim, exact.layout) != (
        stored.head_dim,
        stored.rotary_dim,
        stored.layout,
    ):
        return False
    if not math.isclose(exact.attention_scaling, stored.attention_scaling, rel_tol=1e-6):
        return False
    return all(
        (a == 0) == (b == 0) and abs(a - b) <= _AGREEMENT * max(abs(a), abs(b))
        for a, b in zip(exact.inv_freq, stored.inv_freq, strict=True)
    )
