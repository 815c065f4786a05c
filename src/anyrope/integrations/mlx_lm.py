"""Make an mlx-lm model rotate with anyrope: a drop-in for mlx-lm's rope modules.

mlx-lm's attention layers hold a rope module (``mlx.nn.RoPE``, or one of
``mlx_lm.models.rope_utils``: ``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE``,
``ProportionalRoPE``, ``DynamicNTKScalingRoPE``) and call it as ``self.rope(x, offset=...)`` on
``x`` of shape ``(batch, heads, seq, head_dim)``, the offset a Python int (``KVCache``) or an
``mx.array`` with one offset per batch row, negative for left-padded rows (``BatchKVCache``).
:class:`AnyRoPE` takes that same call and rotates with :class:`anyrope.RoPE`: angles formed
exactly on the device, where ``mx.fast.rope`` forms ``position * frequency`` in float32 (off by
about ``position * 2**-24`` rad, 6e-3 rad at position 10**5). It reads no array value, so it
runs under ``mx.compile`` with traced offsets.

- :func:`patch_model` replaces every mlx-lm rope module of a model in place;
- :func:`from_mlx_lm` converts one module;
- :func:`initialize_rope` builds one from a config, with ``mlx_lm``'s signature (so it can
  also stand in for mlx-lm's own while a model is built).

``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE`` and ``ProportionalRoPE`` keep only float32
frequencies; :func:`patch_model` computes theirs exactly from the model's config
(``model.args``) where that describes them, and otherwise uses the modules' own.

Each conversion is checked: the new module must rotate a probe as the mlx-lm module does (within
float32's error of that module), or a ValueError says by how much it does not; a module of a
class it does not know is refused by name, never left to rotate differently unnoticed.

>>> from mlx_lm import load  # doctest: +SKIP
>>> from anyrope.integrations.mlx_lm import patch_model  # doctest: +SKIP
>>> model, tokenizer = load("mlx-community/Llama-3.2-1B-Instruct-4bit")  # doctest: +SKIP
>>> patch_model(model)  # doctest: +SKIP
16

What anyrope reproduces is mlx-lm's rotation, including where it departs from transformers:
``SuScaledRoPE`` (LongRoPE) always uses the long factors and always pairs features half-split;
YaRN's input multiplier is mlx-lm's ``mscale`` ratio; the linear ``scale`` of ``nn.RoPE`` becomes
``anyrope.scaling.Linear(1 / scale)``.
"""

from __future__ import annotations

import importlib
import math
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .. import scaling as sc
from .._rope import RoPE

__all__ = [
    "AnyRoPE",
    "StoredFrequencies",
    "from_mlx_lm",
    "initialize_rope",
    "patch_model",
    "unpatch_model",
]

# Imported as Any: mlx's typing is partial (mlx.nn re-exports its layers implicitly), and
# mlx-lm has none to speak of; lint environments may have neither installed.
mx: Any = importlib.import_module("mlx.core")
nn: Any = importlib.import_module("mlx.nn")
_rope_utils: Any = importlib.import_module("mlx_lm.models.rope_utils")
# mlx-lm's own, for the checks, kept even where a user puts ours in its place.
_stock_initialize_rope: Any = _rope_utils.initialize_rope

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

_YARN_TYPES = ("yarn", "deepseek_yarn", "telechat3-yarn")
_ROPE_LIKE = re.compile(r"rope|rotary", re.IGNORECASE)


@dataclass(frozen=True)
class StoredFrequencies(sc.Scaling):
    """Frequencies given pair by pair, as an mlx-lm module stores them.

    mlx-lm's ``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE`` and ``ProportionalRoPE`` keep only
    the periods their config gave (``_freqs``, float32), not the config itself;
    :func:`from_mlx_lm` turns those into ``inv_freq = 1 / period`` (exactly, in float64), so
    anyrope rotates by the very frequencies mlx-lm does. The RoPE's ``base`` is not used.

    Parameters
    ----------
    inv_freq : tuple of float
        Radians per position of each pair (``rotary_dim // 2`` of them); 0 leaves a pair alone.
    attention : float
        The factor the rotated features carry (YaRN's ``mscale``, LongRoPE's scale).
    source : str
        Where the frequencies came from, for the repr.
    """

    inv_freq: tuple[float, ...] = field(repr=False, default=())
    attention: float = 1.0
    source: str = ""
    hf_type: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inv_freq", tuple(float(f) for f in self.inv_freq))
        if not all(math.isfinite(f) for f in self.inv_freq):
            raise ValueError(f"inv_freq must hold finite numbers, got {self.inv_freq}")
        if not (math.isfinite(self.attention) and self.attention > 0):
            raise ValueError(f"attention must be a positive finite number, got {self.attention!r}")

    def frequencies(
        self, rotary_dim: int, base: float, *, seq_len: int | None = None, max_position: int | None = None
    ) -> tuple[tuple[float, ...], float]:
        del base, seq_len, max_position  # the signature every Scaling implements; none is needed
        if len(self.inv_freq) != rotary_dim // 2:
            raise ValueError(
                f"{len(self.inv_freq)} stored frequencies but rotary_dim={rotary_dim} has "
                f"{rotary_dim // 2} pairs"
            )
        return self.inv_freq, self.attention


class _State:
    """What an :class:`AnyRoPE` keeps besides its RoPE: the RoPEs it derives for other head
    widths, scales and inverses, and the mlx-lm module it replaced. A plain object, not a dict
    or a module: ``mlx.nn.Module`` would take those for children, and walk into them."""

    __slots__ = ("_lock", "original", "variants")

    def __init__(self) -> None:
        self.variants: dict[tuple[int, float, bool], RoPE] = {}
        self.original: Any = None
        self._lock = threading.Lock()

    def variant(self, key: tuple[int, float, bool], make: Any) -> RoPE:
        found = self.variants.get(key)
        if found is None:
            made = make()
            with self._lock:
                found = self.variants.setdefault(key, made)
        return found


class AnyRoPE(nn.Module):  # type: ignore[misc]  # nn is Any
    """An ``mlx.nn.Module`` that rotates like an mlx-lm rope module, with :class:`anyrope.RoPE`.

    Parameters
    ----------
    rope : anyrope.RoPE
        The rotation. Its ``rotary_dim`` is the module's ``dims``: inputs may be wider (partial
        rotary), and their remaining features pass through unchanged, as with ``mx.fast.rope``.

    Notes
    -----
    The module holds no arrays, so ``model.parameters()``, ``load_weights`` and quantization
    see no change. Construct it with :func:`initialize_rope` or :func:`from_mlx_lm`, or let
    :func:`patch_model` do it.

    Examples
    --------
    >>> import mlx.core as mx  # doctest: +SKIP
    >>> import anyrope  # doctest: +SKIP
    >>> from anyrope.integrations.mlx_lm import AnyRoPE  # doctest: +SKIP
    >>> rope = AnyRoPE(anyrope.RoPE(64, base=500000.0))  # doctest: +SKIP
    >>> q = mx.ones((2, 4, 3, 64))                      # (batch, heads, seq, head_dim)  # doctest: +SKIP
    >>> rope(q, offset=mx.array([5, -2])).shape         # per-row offsets, as BatchKVCache's  # doctest: +SKIP
    (2, 4, 3, 64)
    """

    def __init__(self, rope: RoPE) -> None:
        super().__init__()
        if not isinstance(rope, RoPE):
            raise TypeError(f"rope must be an anyrope.RoPE, not {type(rope).__name__}")
        self._rope = rope
        self._state = _State()

    @property
    def rope(self) -> RoPE:
        """The :class:`anyrope.RoPE` this module rotates with (head width ``dims``)."""
        return self._rope

    @property
    def original(self) -> Any:
        """The mlx-lm module this one was converted from by :func:`from_mlx_lm`, or None."""
        return self._state.original

    @property
    def dims(self) -> int:
        """The rotated features per head, as mlx-lm's ``dims``."""
        return int(self._rope.rotary_dim)

    @property
    def traditional(self) -> bool:
        """Whether consecutive features pair up (mlx-lm's ``traditional``, anyrope's "interleaved")."""
        return bool(self._rope.layout == "interleaved")

    def _extra_repr(self) -> str:
        return repr(self._rope)

    def __call__(self, x: Any, offset: Any = 0, scale: float = 1.0, inverse: bool = False) -> Any:
        """Rotate ``x`` at positions ``offset, offset + 1, ...`` along its second-to-last axis.

        Parameters
        ----------
        x : mx.array
            ``(..., seq, width)``, ``width >= dims``; mlx-lm passes ``(batch, heads, seq, head_dim)``.
        offset : int or mx.array
            The number of tokens before ``x``: an int, a 0-d integer array, or one per batch row
            (shape ``(batch,)``, negative for left-padded rows). Arrays may be traced
            (``mx.compile``); their values are never read on the host.
        scale : float
            Multiplies the positions, as ``YarnRoPE``'s and ``mx.fast.rope``'s ``scale``.
        inverse : bool
            Undo the rotation (``YarnRoPE``'s ``inverse``): turn by the negative angles and
            divide by the multiplier instead of multiplying.

        Returns
        -------
        mx.array
            The rotated ``x``, same shape and dtype.
        """
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) < 2:
            raise ValueError(
                f"x must be an array of shape (..., seq, head_dim), got {type(x).__name__} of shape {shape}"
            )
        width = int(shape[-1])
        if width < self.dims:
            raise ValueError(f"x has {width} features per head, fewer than the {self.dims} this rope rotates")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise TypeError(f"scale must be a finite Python number, not {scale!r}")
        rope = self._rope
        if width != rope.head_dim or scale != 1 or inverse:
            key = (width, float(scale), bool(inverse))
            rope = self._state.variant(key, lambda: _derive(self._rope, *key))
        return rope(x, offset=offset)


def _derive(rope: RoPE, width: int, scale: float, inverse: bool) -> RoPE:
    """``rope`` for inputs ``width`` wide, at positions times ``scale``, or undone."""
    scaling: sc.Scaling | None = rope.scaling
    fixed = rope.fixed_length
    if scale != 1 or inverse:
        if scaling is not None and scaling.length_dependent and fixed is None:
            raise ValueError(
                f"scale= and inverse= need frequencies that do not change with the sequence "
                f"length; {type(scaling).__name__} does (fix them with RoPE.at_length)"
            )
        sign = -1.0 if inverse else 1.0
        attention = rope.attention_scaling
        scaling = StoredFrequencies(
            tuple(sign * scale * f for f in rope.inv_freq),
            1.0 / attention if inverse else attention,
            source=f"{rope!r} at scale={scale}{', inverse' if inverse else ''}",
        )
        fixed = None
    derived = RoPE(
        width,
        base=rope.base,
        rotary_dim=rope.rotary_dim,
        layout=rope.layout,
        scaling=scaling,
        max_position=rope.max_position,
    )
    return derived if fixed is None else derived.at_length(fixed)


# ----------------------------------------------------------------------------------------------
# Construction from a config


def _yarn_mscale(scale: float, mscale: Any) -> float:
    if scale <= 1:
        return 1.0
    return float(0.1 * mscale * math.log(scale) + 1.0)


def _required(config: Mapping[str, Any], key: str, rope_type: str) -> Any:
    if key not in config:
        raise ValueError(f"scaling_config for rope_type={rope_type!r} needs {key!r} (mlx-lm reads it)")
    return config[key]


def _hf_parameters(
    rope_type: str, config: Mapping[str, Any], max_position_embeddings: int | None
) -> tuple[dict[str, Any] | None, str | None, int | None]:
    """The rope_scaling dict that makes :meth:`RoPE.from_hf_config` rotate as mlx-lm's
    ``initialize_rope`` does, a layout that overrides ``traditional`` (or None), and the length
    whose frequencies every call uses (or None)."""
    if rope_type in ("default", "mrope"):
        if rope_type == "mrope" and len(config.get("mrope_section", [])) != 3:
            raise ValueError(
                f"mrope_section must have 3 sections, as mlx-lm requires; got {config.get('mrope_section')!r}"
            )
        # mlx-lm rotates text with plain RoPE here: text tokens share one position on every
        # M-RoPE axis, so the sections all turn alike.
        return None, None, None
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": _required(config, "factor", rope_type)}, None, None
    if rope_type == "dynamic":
        if max_position_embeddings is None:
            raise ValueError("rope_type='dynamic' needs max_position_embeddings (the original context)")
        return {"rope_type": "dynamic", "factor": _required(config, "factor", rope_type)}, None, None
    if rope_type == "llama3":
        return (
            {
                "rope_type": "llama3",
                "factor": _required(config, "factor", rope_type),
                "low_freq_factor": config.get("low_freq_factor", 1.0),
                "high_freq_factor": config.get("high_freq_factor", 4.0),
                "original_max_position_embeddings": config.get("original_max_position_embeddings", 8192),
            },
            None,
            None,
        )
    if rope_type in _YARN_TYPES:
        factor = _required(config, "factor", rope_type)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"scaling_config's factor must be a number, got {factor!r}")
        # mlx-lm multiplies the rotated features by mscale(factor, mscale) /
        # mscale(factor, mscale_all_dim), defaults 1 and 0, and ignores attention_factor.
        try:
            attention = _yarn_mscale(factor, config.get("mscale", 1)) / _yarn_mscale(
                factor, config.get("mscale_all_dim", 0)
            )
        except TypeError as exc:
            raise TypeError(f"scaling_config's mscale and mscale_all_dim must be numbers: {exc}") from None
        return (
            {
                "rope_type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": config.get("original_max_position_embeddings", 4096),
                "beta_fast": config.get("beta_fast", 32),
                "beta_slow": config.get("beta_slow", 1),
                "attention_factor": attention,
            },
            None,
            None,
        )
    if rope_type == "longrope":
        if max_position_embeddings is None:
            raise ValueError(
                "rope_type='longrope' needs max_position_embeddings (mlx-lm's SuScaledRoPE reads it)"
            )
        original = _required(config, "original_max_position_embeddings", rope_type)
        factor = max_position_embeddings / original
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        params = {
            "rope_type": "longrope",
            "short_factor": _required(config, "short_factor", rope_type),
            "long_factor": _required(config, "long_factor", rope_type),
            "original_max_position_embeddings": original,
            "attention_factor": attention,
        }
        # SuScaledRoPE always rotates with the long factors, half-split: fix the length past
        # the original context so that the long factors hold at every position.
        return params, "half", int(original) + 1
    if rope_type == "proportional":
        return (
            {
                "rope_type": "proportional",
                "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
                "factor": config.get("factor", 1.0),
            },
            None,
            None,
        )
    raise ValueError(
        f"Unsupported RoPE type {rope_type!r}: mlx-lm's initialize_rope and this one read default, "
        f"linear, dynamic, llama3, {', '.join(_YARN_TYPES)}, longrope, proportional and mrope"
    )


def initialize_rope(
    dims: int,
    base: float,
    traditional: bool,
    scaling_config: Mapping[str, Any] | None = None,
    max_position_embeddings: int | None = None,
    *,
    check: bool = True,
) -> AnyRoPE:
    """The drop-in for ``mlx_lm.models.rope_utils.initialize_rope``: same arguments, an :class:`AnyRoPE`.

    The scaling is read as mlx-lm reads it (its ``type``/``rope_type`` names and defaults) and
    built exactly, in float64, by :meth:`anyrope.RoPE.from_hf_config`, where mlx-lm rounds its
    frequencies to float32.

    Parameters
    ----------
    dims : int
        Features rotated per head (inputs may be wider: the rest pass through).
    base : float
        The frequency base (``rope_theta``).
    traditional : bool
        True pairs consecutive features (anyrope's "interleaved"), False pairs i with
        i + dims / 2 ("half"). LongRoPE ignores it and pairs half-split, as mlx-lm does.
    scaling_config : dict, optional
        The model's ``rope_scaling``: ``type`` or ``rope_type`` one of default, linear, dynamic,
        llama3, yarn (deepseek_yarn, telechat3-yarn), longrope, proportional, mrope.
    max_position_embeddings : int, optional
        Needed by dynamic and longrope, as in mlx-lm.
    check : bool
        Also build mlx-lm's own module and check that both rotate a probe alike (a few
        milliseconds); a ValueError says by how much they differ.

    Raises
    ------
    ValueError, TypeError
        For an unknown rope type, a missing or malformed key (naming it), or a failed check.
    """
    if scaling_config is not None and not isinstance(scaling_config, Mapping):
        raise TypeError(f"scaling_config must be a dict or None, not {type(scaling_config).__name__}")
    config: Mapping[str, Any] = scaling_config or {}
    rope_type = config.get("type") or config.get("rope_type", "default")
    params, layout, fixed = _hf_parameters(rope_type, config, max_position_embeddings)
    hf: dict[str, Any] = {"head_dim": dims, "rope_theta": base}
    if max_position_embeddings is not None:
        hf["max_position_embeddings"] = max_position_embeddings
    if params is not None:
        hf["rope_scaling"] = params
    if layout is None:
        layout = "interleaved" if traditional else "half"
    parsed = RoPE.from_hf_config(hf, layout=layout)
    # Without max_position: it would only ask anyrope to build tables for every position up to
    # it on first use (seconds for 131072 of them); they grow with the positions used instead.
    # The scalings above took what they need from max_position_embeddings already.
    rope = RoPE(
        parsed.head_dim,
        base=parsed.base,
        rotary_dim=parsed.rotary_dim,
        layout=parsed.layout,
        scaling=parsed.scaling,
    )
    if fixed is not None:
        rope = rope.at_length(fixed)
    if rope_type == "proportional":
        rotated = int(dims * config.get("partial_rotary_factor", 1.0))
        turning = sum(f != 0 for f in rope.inv_freq)
        if turning != (rotated + 1) // 2:
            raise ValueError(
                f"proportional RoPE rotating {rotated} of {dims} features: anyrope turns {turning} "
                f"pairs where mlx-lm turns {(rotated + 1) // 2}; give a partial_rotary_factor that "
                "rotates an even number of features"
            )
    module = AnyRoPE(rope)
    if check:
        theirs = _stock_initialize_rope(dims, base, traditional, scaling_config, max_position_embeddings)
        _check(theirs, module, f"initialize_rope({dims}, {base}, {traditional}) with rope_type={rope_type!r}")
    return module


# ----------------------------------------------------------------------------------------------
# Conversion of mlx-lm's modules


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


def _supported() -> tuple[type, ...]:
    names = (
        "Llama3RoPE",
        "YarnRoPE",
        "SuScaledRoPE",
        "ProportionalRoPE",
        "DynamicNTKScalingRoPE",
    )
    return (nn.RoPE, *(getattr(_rope_utils, name) for name in names))


def _supported_names() -> list[str]:
    return [f"{kind.__module__}.{kind.__qualname__}" for kind in _supported()]


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


def _stored_kinds() -> tuple[type, ...]:
    names = ("Llama3RoPE", "YarnRoPE", "SuScaledRoPE", "ProportionalRoPE")
    return tuple(getattr(_rope_utils, name) for name in names)


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


# ----------------------------------------------------------------------------------------------
# Whole models


def _places(root: Any) -> Iterator[tuple[Any, Any, str, Any]]:
    """(container, key, path, value) for every module reachable from ``root``'s children,
    each container walked once; AnyRoPE modules are not entered."""
    seen: set[int] = set()

    def visit(container: Any, key: Any, path: str, value: Any) -> Iterator[tuple[Any, Any, str, Any]]:
        if isinstance(value, nn.Module):
            yield container, key, path, value
            if isinstance(value, AnyRoPE):
                return
            children: Any = value.items()
        elif isinstance(value, (list, tuple)):
            children = enumerate(value)
        elif isinstance(value, dict):
            children = value.items()
        else:
            return
        if id(value) in seen:
            return
        seen.add(id(value))
        for k, v in list(children):
            yield from visit(value, k, f"{path}.{k}" if path else str(k), v)

    seen.add(id(root))
    for key, value in list(root.items()):
        yield from visit(root, key, str(key), value)


def _looks_like_rope(module: Any) -> bool:
    """A module that rotates but is none of the classes this module converts: a subclass of
    ``nn.RoPE``, or a leaf module (no child modules) named like a rope."""
    if isinstance(module, nn.RoPE):
        return True
    if not _ROPE_LIKE.search(type(module).__name__):
        return False
    return not any(isinstance(v, (nn.Module, list, dict)) for v in module.values())


def patch_model(model: Any, *, strict: bool = True, exact: bool = True, check: bool = True) -> int:
    """Replace every mlx-lm rope module of ``model`` with its :class:`AnyRoPE`, in place.

    Walks the model's modules, lists and dicts (``model.layers[i].self_attn.rope`` and the
    like) and replaces each ``nn.RoPE`` and ``rope_utils`` rope module by :func:`from_mlx_lm`;
    a module shared by several layers becomes one AnyRoPE shared alike. Nothing is replaced
    unless every conversion succeeds. The model's parameters are unchanged, so weights load
    and save as before; :func:`unpatch_model` undoes it.

    Parameters
    ----------
    model : mlx.nn.Module
        An mlx-lm model (``mlx_lm.load`` returns one), or any module holding rope modules.
    strict : bool
        Refuse, with a ValueError naming them, models holding a rope module this cannot convert
        (a subclass of ``nn.RoPE``, or a leaf module named like ``*RoPE*`` or ``*Rotary*``:
        model-specific rope classes such as DeepSeek-V2's ``DeepseekV2YarnRotaryEmbedding``),
        and models holding no rope module at all. With ``strict=False`` those are left as they
        are and the count says what was replaced.
    exact : bool
        Compute the frequencies of modules that keep only float32 ones from the model's
        ``args`` (its config), where they agree (see :func:`from_mlx_lm`); False reads every
        module's own.
    check : bool
        Check each converted module against its original on a probe (see :func:`from_mlx_lm`).

    Returns
    -------
    int
        The number of attributes that now hold an AnyRoPE (0 if the model was patched already).

    Notes
    -----
    Models that call ``mx.fast.rope`` directly rather than through a module (nanochat, for one)
    have nothing to replace and rotate as before.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an mlx.nn.Module (an mlx-lm model), not {type(model).__name__}")
    supported = _supported()
    found: list[tuple[Any, Any, Any]] = []
    unknown: list[str] = []
    patched = 0
    for container, key, path, value in _places(model):
        if isinstance(value, AnyRoPE):
            patched += 1
        elif type(value) in supported:
            if isinstance(container, tuple):
                raise TypeError(f"{path} holds a rope module inside a tuple, which cannot be replaced")
            found.append((container, key, value))
        elif _looks_like_rope(value):
            kind = type(value)
            unknown.append(f"{path} ({kind.__module__}.{kind.__qualname__})")
    if strict and unknown:
        raise ValueError(
            f"{type(model).__name__} holds rope modules anyrope cannot convert: {'; '.join(unknown)}. "
            "It converts mlx.nn.RoPE and mlx_lm.models.rope_utils' Llama3RoPE, YarnRoPE, SuScaledRoPE, "
            "ProportionalRoPE and DynamicNTKScalingRoPE; pass strict=False to leave the others as they are"
        )
    if strict and not found and not patched:
        raise ValueError(
            f"{type(model).__name__} holds no mlx-lm rope module (nn.RoPE or one of rope_utils'); "
            "pass strict=False to accept that"
        )
    args = getattr(model, "args", None) if exact else None
    converted: dict[int, AnyRoPE] = {}
    for _, _, module in found:  # convert (and check) every module before replacing any
        if id(module) not in converted:
            converted[id(module)] = from_mlx_lm(module, args=args, check=check)
    for container, key, module in found:
        container[key] = converted[id(module)]
    return len(found)


def unpatch_model(model: Any) -> int:
    """Put back the mlx-lm modules :func:`patch_model` replaced; returns how many. In place.

    AnyRoPE modules made otherwise (by :func:`initialize_rope`) have no original and stay.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an mlx.nn.Module (an mlx-lm model), not {type(model).__name__}")
    restored = [
        (container, key, value.original)
        for container, key, _, value in _places(model)
        if isinstance(value, AnyRoPE) and value.original is not None
    ]
    for container, key, original in restored:
        container[key] = original
    return len(restored)
