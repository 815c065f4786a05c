"""What every framework's ``RotaryEmbedding`` shares, framework-free: its RoPE from the layer's
arguments, its call, and the RoPE as plain data (the Keras config; any format that stores a
layer's arguments as JSON)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from .. import scaling as sc
from .._rope import RoPE

__all__ = ["ROPE_OPTIONS", "LayerBase", "make_rope", "rope_config", "rope_from_config"]

# RoPE's keyword arguments: a layer takes them beside its framework's own.
ROPE_OPTIONS = frozenset(inspect.signature(RoPE).parameters) - {"head_dim"}


def make_rope(rope: Any, options: Mapping[str, Any], layer: str) -> RoPE:
    """``rope`` itself, or ``RoPE(rope, **options)`` for a head width."""
    if isinstance(rope, RoPE):
        if options:
            raise TypeError(
                f"{layer}(rope, ...) takes an anyrope.RoPE or head_dim with RoPE's keyword arguments, "
                f"not both: got a RoPE and {', '.join(sorted(options))}"
            )
        return rope
    if isinstance(rope, bool) or not isinstance(rope, int):
        raise TypeError(
            f"rope must be an anyrope.RoPE or head_dim (an int, with RoPE's keyword arguments), not "
            f"{type(rope).__name__}; for a Hugging Face config use {layer}.from_hf_config(config)"
        )
    return RoPE(rope, **options)


class LayerBase:
    """The part of each ``RotaryEmbedding`` that is the same in every framework: the RoPE it
    holds, its call and its Hugging Face constructor. A mixin holding no state of its own."""

    _rope: RoPE

    @property
    def rope(self) -> RoPE:
        """The :class:`anyrope.RoPE` this layer rotates with."""
        return self._rope

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        layout: str | None = None,
        layer_type: str | None = None,
        layer: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """The layer of :meth:`anyrope.RoPE.from_hf_config` (same arguments); ``kwargs`` go to
        the layer's constructor (e.g. Keras's ``name`` and ``dtype``)."""
        make: Any = cls  # a framework's layer class, whose constructor this mixin cannot see
        return make(RoPE.from_hf_config(config, layout=layout, layer_type=layer_type, layer=layer), **kwargs)

    def _rotate(
        self, q: Any, k: Any, positions: Any, offset: Any, seq_axis: Any, inverse: Any = False
    ) -> Any:
        return self._rope(q, k, positions=positions, offset=offset, seq_axis=seq_axis, inverse=inverse)

    def _extra_repr(self) -> str:  # mlx.nn.Module's repr hook; harmless elsewhere
        return repr(self._rope)


def _plain(value: Any) -> Any:
    """Sequences as lists, so the config is JSON."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _scaling_config(scaling: sc.Scaling | None) -> dict[str, Any] | None:
    if scaling is None:
        return None
    kind = type(scaling)
    if getattr(sc, kind.__name__, None) is not kind:
        raise TypeError(
            f"a RoPE with scaling {kind.__qualname__} cannot be stored as a config: only the methods "
            "of anyrope.scaling can be rebuilt from their fields"
        )
    fields = {f.name: _plain(getattr(scaling, f.name)) for f in dataclasses.fields(scaling)}
    return {"method": kind.__name__, **fields}


def rope_config(rope: RoPE) -> dict[str, Any]:
    """``rope`` as JSON-ready data that :func:`rope_from_config` turns back into an equal RoPE."""
    return {
        "head_dim": rope.head_dim,
        "base": rope.base,
        "rotary_dim": rope.rotary_dim,
        "layout": rope.layout,
        "scaling": _scaling_config(rope.scaling),
        "max_position": rope.max_position,
        "clockwise": rope.clockwise,
        "mrope_section": _plain(rope.mrope_section),
        "mrope_interleaved": rope.mrope_interleaved,
        "axial": rope.axial,
        "axial_frequencies": rope.axial_frequencies or "blocks",
        "xpos_scale_base": rope.xpos_scale_base,
        "frequency_scale": _plain(rope.frequency_scale),
        **_stream_map(rope),
        "fixed_length": rope.fixed_length,
    }


def _stream_map(rope: RoPE) -> dict[str, Any]:
    """``pair_streams`` (and ``pair_frequencies``) where no named case above says them."""
    if rope.streams == 1 or rope.mrope_section is not None or rope.axial is not None:
        return {}
    own = rope.pair_frequencies == tuple(range(len(rope.pair_frequencies)))
    return {
        "pair_streams": list(rope.pair_streams),
        "pair_frequencies": None if own else list(rope.pair_frequencies),
    }


def rope_from_config(config: Mapping[str, Any]) -> RoPE:
    """The RoPE :func:`rope_config` described."""
    if not isinstance(config, Mapping):
        raise TypeError(
            f"the layer config's rope must be a dict from get_config(), not {type(config).__name__}"
        )
    options = dict(config)
    fixed = options.pop("fixed_length", None)
    scaling = options.get("scaling")
    if scaling is not None:
        fields = dict(scaling)
        method = fields.pop("method", None)
        kind = getattr(sc, str(method), None)
        if not (isinstance(kind, type) and issubclass(kind, sc.Scaling)):
            raise ValueError(
                f"the layer config's rope names scaling method {method!r}, which anyrope.scaling lacks"
            )
        options["scaling"] = kind(**fields)
    rope = RoPE(options.pop("head_dim"), **options)
    return rope if fixed is None else rope.at_length(fixed)
