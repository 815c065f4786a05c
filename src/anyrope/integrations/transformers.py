"""Make a Hugging Face transformers model rotate with anyrope's angles.

transformers' models compute cos and sin once per forward, in a ``*RotaryEmbedding`` module,
from the position ids, and hand them to every attention layer. :func:`use_anyrope` makes those
modules return anyrope's tables instead: angles formed exactly on the device (float32 angles
lose about ``position * 2**-24`` radians, 3e-2 at position 2**19), the model family's own
scaling and per-layer-type parameters read by :meth:`anyrope.RoPE.from_hf_config`, and
DynamicNTK and LongRoPE switched on the device, with no host read of the positions. The model's
attention code stays as it is, so ``generate``, every KV cache and ``torch.compile`` work
unchanged.

Vision towers are patched too: their rotary modules take one position per patch and axis,
``(patches, axes)``, and rotate with :meth:`anyrope.RoPE.from_hf_config` of the vision config
(``rope_type="axial"``). A tower whose rotation anyrope cannot express (or whose config it cannot
read) is left stock with a warning that names the module and says why; the rest of the model is
patched.

Each rotary module is checked when it is patched: its own tables at a few positions must equal
anyrope's, which also tells which of the families' table formats it uses (``cat(c, c)``, pairs
repeated, compact, compact as ``(sin, cos)``, or complex ``freqs_cis``, and for vision towers
which axis comes first). A model whose rotation anyrope reads differently is refused with the
difference, never silently changed.

>>> from anyrope.integrations.transformers import use_anyrope  # doctest: +SKIP
>>> model = use_anyrope(AutoModelForCausalLM.from_pretrained(name))  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import inspect
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from array_api_compat import torch as torch_namespace

from .._dtypes import isdtype
from .._families import family_of
from .._grid import grid_positions
from .._hf import UnknownFamilyWarning
from .._hf_vision import refusal
from .._rope import RoPE, rotary_of
from .._vision_families import vision_family_of

__all__ = ["is_patched", "remove_anyrope", "use_anyrope"]

_MARK = "_anyrope_rotary"
# Positions probed when a module is patched. transformers forms float32 angles, off by up to
# |angle| * 2**-24 (4e-6 at position 63 and frequency 1), and rounds cos and sin to float32;
# a wrong table format or frequency is off by O(1) within these positions.
_PROBE_LENGTH = 64
_PROBE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class _Format:
    """How a family's rotary module lays out its tables."""

    # "cat": cat(c, c); "repeat": each column twice; "compact": c; "sincos": c, returned as (sin,
    # cos) (GPT-J and CodeGen since transformers 5.24); "complex": c + i s
    expand: str
    dtype: torch.dtype | None  # of cos and sin: None for x's dtype, else always this one
    # vision towers: position_ids' axes in anyrope's stream order (their tables may put width
    # first), and the unit axes the module puts in front of its tables (SAM 2's memory attention)
    axes: tuple[int, ...] | None = None
    lead: int = 0


@dataclass
class _Patch:
    ropes: dict[str | None, RoPE]
    table_format: _Format


@dataclass
class _TablePatch:
    attribute: str
    table: torch.Tensor  # the values not in use: anyrope's before patching, the stock ones after


def _expand(table_format: _Format, cos: torch.Tensor, sin: torch.Tensor) -> Any:
    if table_format.expand == "cat":
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    if table_format.expand == "repeat":
        return torch.repeat_interleave(cos, 2, dim=-1), torch.repeat_interleave(sin, 2, dim=-1)
    if table_format.expand == "complex":
        return torch.complex(cos, sin)
    if table_format.expand == "sincos":
        return sin, cos
    return cos, sin


def _table_holders(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str]]:
    """Modules that keep a precomputed ``cat(sin, cos)`` table by position (GPT-J, CodeGen, RoFormer)."""
    for name, module in model.named_modules():
        if isinstance(getattr(module, "embed_positions", None), torch.Tensor):
            yield name, module, "embed_positions"
        elif isinstance(module, torch.nn.Embedding) and type(module).__name__.endswith(
            "SinusoidalPositionalEmbedding"
        ):
            yield name, module, "weight"


def _sincos_table(rope: RoPE, like: torch.Tensor) -> torch.Tensor:
    """Rows ``cat(sin, cos)`` for positions 0 .. len(like) - 1, in like's dtype and device."""
    positions = torch.arange(like.shape[0], device=like.device)
    cos, sin = rope.cos_sin(positions, like=like)
    return torch.cat((sin, cos), dim=-1)


def _patch_table(name: str, module: torch.nn.Module, attribute: str, rope: RoPE) -> torch.Tensor:
    """anyrope's table for a table holder, after checking that its first rows equal the module's."""
    stock = getattr(module, attribute).detach()
    ours = _sincos_table(rope, stock)
    if ours.shape != stock.shape:
        raise ValueError(
            f"{name}.{attribute} has shape {tuple(stock.shape)}, but anyrope's {rope!r} makes "
            f"{tuple(ours.shape)} from the same config: anyrope leaves this model alone"
        )
    diff = float((ours[:_PROBE_LENGTH] - stock[:_PROBE_LENGTH]).abs().max())
    if diff > _PROBE_TOLERANCE:
        raise ValueError(
            f"{name}.{attribute} holds other angles than anyrope's {rope!r} from the same config "
            f"(max difference {diff:.3g} at positions 0..{_PROBE_LENGTH - 1}): anyrope leaves this model alone"
        )
    return ours


def _grid_tables(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str]]:
    """Vision rotary modules that keep the complex table of one patch grid (Llama 4's)."""
    for name, module in model.named_modules():
        family = vision_family_of(getattr(getattr(module, "config", None), "model_type", None))
        attribute = family.grid_table if family is not None else None
        if attribute and isinstance(getattr(module, attribute, None), torch.Tensor):
            yield name, module, attribute


def _patch_grid_table(name: str, module: torch.nn.Module, attribute: str, rope: RoPE) -> torch.Tensor:
    """anyrope's table of a grid table module's patches (from 1 on each axis, then a class token
    at 0), with the axis order that matches the module's own table: it must, at every patch."""
    stock = getattr(module, attribute).detach()
    side = module.config.image_size // module.config.patch_size
    like = torch.zeros((), dtype=stock.real.dtype, device=stock.device)
    rows_columns = grid_positions((side, side), start=1, like=like)
    diffs = []
    for order in ((1, 0), (0, 1)):  # columns first (Llama 4), else rows
        positions = torch.cat([rows_columns[list(order)], rows_columns.new_zeros(2, 1)], dim=1)
        cos, sin = rope.cos_sin(positions, like=like)
        if cos.numel() != stock.numel():
            raise ValueError(
                f"{name}.{attribute} holds {stock.numel()} table entries, but anyrope's {rope!r} makes "
                f"{cos.numel()} for the config's {side} x {side} patches and a class token: anyrope "
                "leaves this model alone"
            )
        ours = torch.complex(cos, sin).reshape(stock.shape)
        diffs.append(float((ours - stock).abs().max()))
        if diffs[-1] <= _PROBE_TOLERANCE:
            return ours
    raise ValueError(
        f"{name}.{attribute} holds other angles than anyrope's {rope!r} from the same config (max "
        f"difference {min(diffs):.3g} over its {side} x {side} patches, either axis first): anyrope "
        "leaves this model alone"
    )


_ROTARY_NAME = ("Rotary", "Rope")


def _unknown_rotaries(model: torch.nn.Module, known: set[torch.nn.Module]) -> dict[str, str]:
    """Modules named as rotary ones that no patch above recognises, with why: never left silently."""
    found = {}
    for name, module in model.named_modules():
        cls = type(module).__name__
        if module in known or not any(word in cls for word in _ROTARY_NAME):
            continue
        family = vision_family_of(getattr(getattr(module, "config", None), "model_type", None))
        if family is not None and family.unsupported is not None:  # a tower known not to be RoPE
            found[f"{name} ({cls})"] = refusal(family)
            continue
        params = ", ".join(list(inspect.signature(type(module).forward).parameters)[1:])
        found[f"{name} ({cls})"] = (
            f"its forward takes ({params}), not position ids, and anyrope does not know how it "
            "places its tokens; call anyrope.RoPE on q and k directly to rotate as it does"
        )
    return found


@dataclass
class _AnglePatch:
    rope: RoPE
    # the module returns stack([cos, sin]) of shape (2, seq, 1, 1, d), cat(c, c) halves, in
    # hidden_states' dtype (the speech conformers); else angles (CLVP)
    stacked: bool


def _angle_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """Modules that make positions 0 .. seq - 1 from ``forward(hidden_states)``: their angles as
    ``cat(freqs, freqs)`` with a batch axis of one, leaving cos and sin to the attention (CLVP),
    or their cos and sin stacked (the speech conformers)."""
    for name, module in model.named_modules():
        if not type(module).__name__.endswith("RotaryPositionalEmbedding"):
            continue
        if list(inspect.signature(type(module).forward).parameters)[1:] == ["hidden_states"]:
            yield name, module


def _angles(rope: RoPE, length: int, like: torch.Tensor) -> torch.Tensor:
    """anyrope's angles of positions 0 .. length - 1, reduced to (-pi, pi] from its exact tables:
    their cos and sin, which the model takes, are anyrope's tables to a rounding of like's dtype."""
    positions = torch.arange(length, device=like.device)
    cos, sin = rope.cos_sin(positions, like=like)
    angles = torch.atan2(sin, cos)
    return torch.cat((angles, angles), dim=-1)[None]


def _stacked_tables(rope: RoPE, length: int, like: torch.Tensor) -> torch.Tensor:
    """anyrope's ``stack([cat(c, c), cat(s, s)])`` of positions 0 .. length - 1, (2, length, 1, 1, d)."""
    positions = torch.arange(length, device=like.device)
    cos, sin = rope.cos_sin(positions, like=like)
    return torch.stack((torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)))[:, :, None, None]


def _as_tables(output: torch.Tensor, stacked: bool) -> torch.Tensor:
    """cos and sin of an angle module's output, to compare."""
    return output if stacked else torch.stack((output.cos(), output.sin()))


def _patch_angles(name: str, module: torch.nn.Module, rope: RoPE) -> _AnglePatch:
    """The patch of an angle module, in the format its output has, after checking that it makes
    anyrope's tables at the probe positions."""
    x = torch.zeros((1, _PROBE_LENGTH, 1), device=_probe_device(module))
    with torch.no_grad():  # on a copy: the module's own cache stays as it was
        stock = type(module).forward(copy.copy(module), x)
    made = {stacked: _angle_output(_AnglePatch(rope, stacked), module, x) for stacked in (False, True)}
    stacked = next((key for key, ours in made.items() if ours.shape == stock.shape), None)
    if stacked is None:
        raise ValueError(
            f"the rotary module {name} returns shape {tuple(stock.shape)}, but anyrope's {rope!r} makes "
            f"angles of shape {tuple(made[False].shape)}, or stacked cos and sin of shape "
            f"{tuple(made[True].shape)}, from the same config: anyrope leaves it alone"
        )
    diff = float((_as_tables(made[stacked], stacked) - _as_tables(stock, stacked)).abs().max())
    if diff > _PROBE_TOLERANCE:
        raise ValueError(
            f"the rotary module {name} turns by other angles than anyrope's {rope!r} from the same config "
            f"(max difference of cos and sin {diff:.3g} at positions 0..{_PROBE_LENGTH - 1}): anyrope "
            "leaves it alone"
        )
    return _AnglePatch(rope, stacked)


def _angle_output(
    patch: _AnglePatch, module: torch.nn.Module | None, hidden_states: torch.Tensor
) -> torch.Tensor:
    """What the patched module returns for ``hidden_states``: in the dtype its stock code gives."""
    length = hidden_states.shape[1]
    if patch.stacked:  # the stock casts its tables to hidden_states' dtype
        return _stacked_tables(patch.rope, length, hidden_states)
    # angles come in the dtype of the module's own frequencies
    buffers = module.buffers() if module is not None else ()
    dtype = next((b.dtype for b in buffers if b.is_floating_point()), torch.float32)
    return _angles(patch.rope, length, hidden_states.new_zeros((), dtype=dtype))


def _angle_forward(patch: _AnglePatch, module: torch.nn.Module) -> Callable[..., Any]:
    held = weakref.ref(module)  # the module holds this function: no cycle through it

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        return _angle_output(patch, held(), hidden_states)

    return forward


def _nearest_config(name: str, model: torch.nn.Module) -> Any:
    """The config of the innermost module holding ``name`` that has one (CLVP's text and speech
    encoders each have their own)."""
    parts = name.split(".")
    for end in range(len(parts) - 1, -1, -1):
        config = getattr(model.get_submodule(".".join(parts[:end])), "config", None)
        if config is not None:
            return config
    raise ValueError(f"the rotary module {name} has no config, and neither has any module holding it")


def _rotary_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """The modules that make cos and sin from position ids: ``forward(x, position_ids, ...)``."""
    for name, module in model.named_modules():
        if not type(module).__name__.endswith("RotaryEmbedding"):
            continue
        params = list(inspect.signature(type(module).forward).parameters)
        if params[1:3] == ["x", "position_ids"]:
            yield name, module


def _layer_types(module: torch.nn.Module, config: Any) -> list[str | None]:
    """The layer types a module's forward takes (None where it takes no layer_type), leaving out
    those without RoPE (Beam's full-attention layers): the model never asks for their tables."""
    return [lt for lt in _all_layer_types(module, config) if lt is None or _rotates(config, lt)]


def _rotates(config: Any, layer_type: str) -> bool:
    params = getattr(config, "rope_parameters", None)
    return not (isinstance(params, dict) and layer_type in params and params[layer_type] is None)


def _all_layer_types(module: torch.nn.Module, config: Any) -> list[str | None]:
    params = inspect.signature(type(module).forward).parameters
    if "layer_type" not in params:
        return [None]
    names = getattr(module, "layer_types", None) or getattr(config, "layer_types", None) or []
    found: list[str | None] = sorted(set(names))
    rope_parameters = getattr(config, "rope_parameters", None)
    nested = isinstance(rope_parameters, dict) and any(isinstance(v, dict) for v in rope_parameters.values())
    if params["layer_type"].default is not inspect.Parameter.empty and not nested:
        found.append(None)  # (with parameters per layer type, the module has none for None either)
    return found or [None]


def _probe_device(module: torch.nn.Module) -> torch.device:
    for tensor in (*module.buffers(), *module.parameters()):
        return tensor.device
    return torch.device("cpu")


def _call_stock(
    module: torch.nn.Module, x: torch.Tensor, positions: torch.Tensor, layer_type: str | None
) -> Any:
    forward = type(module).forward
    with torch.no_grad():
        if layer_type is None:
            return forward(module, x, positions)
        return forward(module, x, positions, layer_type)


def _probe_positions(rope: RoPE, device: torch.device) -> torch.Tensor:
    """What the probe gives the module: text positions (1, length); for M-RoPE, streams that
    differ, so each pair's stream shows (values stay below length); for vision towers, (patches,
    axes) with axes that differ, so the axis order shows."""
    length = min(_PROBE_LENGTH, rope.fixed_length or _PROBE_LENGTH)
    positions = torch.arange(length, device=device)
    steps = torch.arange(1, rope.streams + 1, device=device)
    if _vision_axes(rope) is not None:
        return positions[:, None] * steps % length
    if rope.streams > 1:
        return positions[None, None] * steps[:, None, None] % length
    return positions[None]


def _vision_axes(rope: RoPE) -> int | None:
    """Positions per patch of a vision tower's rotation (axial RoPE, or a stream map whose pairs
    turn by frequencies of their axis: Kimi-K2.5), else None."""
    return rope.streams if rotary_of(rope).per_axis else None


def _candidates(rope: RoPE) -> Iterator[_Format]:
    axis_orders: list[tuple[int, ...] | None] = [None]
    count = _vision_axes(rope)
    if count is not None:
        axis_orders = [tuple(range(count)), tuple(reversed(range(count)))]
    for axes in axis_orders:
        for expand in ("cat", "repeat", "compact", "sincos", "complex"):
            yield _Format(expand, None, axes)


def _tables(rope: RoPE, table_format: _Format, position_ids: torch.Tensor, like: torch.Tensor) -> Any:
    """anyrope's tables in a module's format, for the position ids the module takes."""
    if table_format.axes is not None:  # (..., patches, axes) -> (axes, ..., patches), in stream order
        position_ids = position_ids.movedim(-1, 0)[list(table_format.axes)]
    elif rope.streams > 1 and (position_ids.ndim == 2 or position_ids.shape[0] == 1):
        # M-RoPE modules take text positions (batch, seq) for every stream, as they expand them
        position_ids = position_ids.expand(rope.streams, *position_ids.shape[-2:])
    cos, sin = rope.cos_sin(position_ids, like=like)
    cos, sin = cos[(None,) * table_format.lead], sin[(None,) * table_format.lead]
    return _expand(table_format, cos, sin)


def _learn_format(module: torch.nn.Module, name: str, rope: RoPE, layer_type: str | None) -> _Format:
    """The table format of a module, found by matching its own tables at the probe positions."""
    positions = _probe_positions(rope, _probe_device(module))
    x = torch.zeros((1, positions.shape[-1], 1), dtype=torch.float32, device=positions.device)
    stock = _call_stock(module, x, positions, layer_type)
    where = f"{name} ({type(module).__name__}{f', layer_type={layer_type!r}' if layer_type else ''})"
    errors = []
    theirs: list[torch.Tensor] = [stock] if isinstance(stock, torch.Tensor) else list(stock)
    for candidate in _candidates(rope):
        made = _tables(rope, candidate, positions, x)
        ours: list[torch.Tensor] = [made] if isinstance(made, torch.Tensor) else list(made)
        if len(ours) != len(theirs):
            continue
        lead = theirs[0].ndim - ours[0].ndim
        if lead > 0 and all(n == 1 for n in theirs[0].shape[:lead]):
            ours = [table[(None,) * lead] for table in ours]
        pairs = list(zip(ours, theirs, strict=True))
        label = candidate.expand + (f", axes {candidate.axes}" if candidate.axes else "")
        if any(a.shape != b.shape for a, b in pairs):
            errors.append(f"{label}: shape {tuple(pairs[0][0].shape)} != {tuple(pairs[0][1].shape)}")
            continue
        diff = max(float((a - b.to(a.dtype)).abs().max()) for a, b in pairs)
        if diff <= _PROBE_TOLERANCE:
            dtype = _output_dtype(module, positions, layer_type)
            return _Format(candidate.expand, dtype, candidate.axes, max(lead, 0))
        errors.append(f"{label}: max difference {diff:.3g}")
    raise ValueError(
        f"the rotary module {where} makes other tables than anyrope's {rope!r} from the same "
        f"config ({'; '.join(errors)}): anyrope would change this model's rotation, so it leaves it "
        "alone; please report the model"
    )


def _output_dtype(
    module: torch.nn.Module, positions: torch.Tensor, layer_type: str | None
) -> torch.dtype | None:
    """None where the tables follow x's dtype; otherwise the real dtype the module always
    returns (float32 for complex64 ``freqs_cis``, and for most vision towers)."""
    x = torch.zeros((1, positions.shape[-1], 1), dtype=torch.bfloat16, device=positions.device)
    stock = _call_stock(module, x, positions, layer_type)
    table = stock if isinstance(stock, torch.Tensor) else stock[0]
    return None if table.dtype == torch.bfloat16 else table.real.dtype


def _anyrope_forward(patch: _Patch) -> Callable[..., Any]:
    def forward(x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        rope = patch.ropes.get(layer_type)
        if rope is None:
            raise ValueError(
                f"layer_type={layer_type!r} is none of this model's: {sorted(map(str, patch.ropes))}"
            )
        _check_position_ids(position_ids, rope)
        dtype = patch.table_format.dtype
        like = x if dtype is None else x.new_zeros((), dtype=dtype)
        return _tables(rope, patch.table_format, position_ids, like)

    return forward


def _check_position_ids(position_ids: Any, rope: RoPE) -> None:
    """What transformers' rotary modules take: an integer tensor of shape (batch, seq), for M-RoPE
    (streams, batch, seq), for vision towers (patches, axes). Checked here, so that an error
    names ``position_ids``."""
    if position_ids is None:
        raise ValueError("anyrope's rotary modules need position_ids, as transformers' own do")
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor, not {type(position_ids).__name__}")
    if not isdtype(torch_namespace, position_ids.dtype, "integral"):
        raise TypeError(
            f"position_ids must be an integer tensor, got dtype {position_ids.dtype}; cast it with .long()"
        )
    axes = _vision_axes(rope)
    if axes is not None:
        if position_ids.ndim < 2 or position_ids.shape[-1] != axes:
            raise ValueError(
                f"position_ids of a vision tower must have shape (patches, {axes}), one "
                f"position per axis, got {tuple(position_ids.shape)}"
            )
        return
    streams = rope.streams
    ndims = (2, 3) if streams > 1 else (2,)
    if position_ids.ndim not in ndims or (
        position_ids.ndim == 3 and position_ids.shape[0] not in (1, streams)
    ):
        want = "(batch, seq)" + (f" or ({streams}, batch, seq)" if streams > 1 else "")
        raise ValueError(f"position_ids must have shape {want}, got {tuple(position_ids.shape)}")


def _counterclockwise(rope: RoPE) -> RoPE:
    """The RoPE whose tables the model's rotary module makes: a clockwise family (NanoChat) turns
    the other way in its apply function, from the usual tables."""
    return rope._replace(clockwise=False) if rope.clockwise else rope


def _learned_scale(module: torch.nn.Module, name: str, config: Any, rope: RoPE) -> RoPE:
    """The RoPE with the frequency scale a family keeps as a weight of its rotary module, not in
    its config (Mistral Large 4: ``exp(alpha)``), read now: the patched module rotates by the
    values the weight has at patch time."""
    weight_name = family_of(getattr(config, "model_type", None)).log_frequency_scale
    if weight_name is None:
        return rope
    weight = getattr(module, weight_name, None)
    if not isinstance(weight, torch.Tensor):  # a ValueError: use_anyrope leaves the module stock, saying why
        raise ValueError(  # noqa: TRY004
            f"the rotary module {name} has no tensor {weight_name!r}, whose exp scales this family's "
            "frequencies: anyrope leaves it alone"
        )
    if weight.requires_grad and module.training:
        warnings.warn(
            f"use_anyrope reads {name}.{weight_name} once, now: training it changes nothing in the "
            f"patched model's rotation. Freeze it ({weight_name}.requires_grad_(False)), or call "
            "remove_anyrope(model) and use_anyrope(model) again after training",
            stacklevel=4,
        )
    # exp in float64 of the stored values: the scale they stand for, not a float32 rounding of it
    return rope.with_frequency_scale(weight.detach().to(torch.float64).exp())


def use_anyrope(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` compute its rotary cos and sin with anyrope.

    In place; returns the model. Every ``*RotaryEmbedding`` module whose forward takes ``(x,
    position_ids)`` (and ``layer_type`` where RoPE parameters differ by layer type) is patched
    with :meth:`anyrope.RoPE.from_hf_config` of its config, after checking that its own tables
    equal anyrope's at positions 0..63 (GPT-J's and CodeGen's, since transformers 5.24, return
    ``(sin, cos)``). Families that keep a precomputed sin/cos table elsewhere (GPT-J's and
    CodeGen's attention before 5.24, RoFormer's sinusoidal embedding) get anyrope's table in
    its place, checked the same way; a ``*RotaryPositionalEmbedding`` that returns angles from
    ``forward(hidden_states)`` (CLVP) returns anyrope's, exactly reduced, and one that returns
    cos and sin stacked (Wav2Vec2-Conformer, Wav2Vec2-BERT, SeamlessM4T's speech encoder, whose
    attention rotates the hidden states before the q and k projections) anyrope's. The model's attention
    code, KV cache and ``generate`` are untouched (DeepSeek-V4's and CLVP's rotate their values,
    and DeepSeek-V4's turns outputs back, with the patched tables); it compiles with
    ``torch.compile(fullgraph=True)``. Calling it twice is harmless; :func:`remove_anyrope`
    undoes it.

    A frequency scale a family keeps as a weight of its rotary module (Mistral Large 4's
    ``exp(alpha)``) is read when the module is patched: the patched model turns by the weight's
    values at that moment. Where the weight could still train (the module in training mode and
    the weight requiring grad), a ``UserWarning`` says so; freeze it, or call
    :func:`remove_anyrope` and ``use_anyrope`` again after training.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers model (a ``PreTrainedModel``, or any module holding its rotary modules).

    Vision towers' rotary modules (``forward(x, position_ids)`` with ``position_ids`` of shape
    ``(patches, axes)``) are patched the same way, from their vision config; Llama 4's, which
    keeps the complex table of its one patch grid, gets anyrope's table in its place, checked
    at every patch. A module whose config anyrope cannot express or read (Gemma 4's vision
    tower, SAM 3's ViT, HunYuan-VL's text decoder, ...), or one named as a rotary module whose
    forward anyrope does not recognise (MusicFlamingo's takes timestamps), is left stock, with a
    ``UserWarning`` that names it and says why.

    Raises
    ------
    ValueError
        Where the model has no such module, where anyrope can express none of its modules' configs
        (the error says why), or where a module's own tables differ from anyrope's; nothing is
        patched then.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), not {type(model).__name__}")
    rotary = dict(_rotary_modules(model))
    modules = [(n, m) for n, m in rotary.items() if not is_patched(m)]
    # A rotary module that keeps its table by position (GPT-J's and CodeGen's since transformers
    # 5.24) is patched by its forward, which also serves positions past the table.
    kept = set(rotary.values())
    tables = [(n, m, a) for n, m, a in _table_holders(model) if m not in kept and not is_patched(m)]
    angles = [(n, m) for n, m in _angle_modules(model) if not is_patched(m)]
    grids = [(n, m, a) for n, m, a in _grid_tables(model) if not is_patched(m)]
    known = kept | {m for _, m, _ in tables} | {m for _, m in angles} | {m for _, m, _ in grids}
    known |= {m for m in model.modules() if is_patched(m)}
    stock = _unknown_rotaries(model, known)  # module -> why anyrope leaves it as it is
    if not modules and not tables and not angles and not grids and not stock:
        if any(is_patched(m) for _, m in model.named_modules()):
            return model
        raise ValueError(
            f"{type(model).__name__} has no rotary embedding module (a submodule named "
            "*RotaryEmbedding with forward(x, position_ids), or a sin/cos table by position); for "
            "other models call anyrope.RoPE on q and k directly"
        )
    patches: dict[torch.nn.Module, Any] = {}
    for name, module in modules:  # check every module before patching any
        config = _config_of(name, module, model)
        try:
            with warnings.catch_warnings():
                # the module's own tables are compared below, and its own code pairs the features
                warnings.simplefilter("ignore", UnknownFamilyWarning)
                ropes = {
                    lt: _learned_scale(
                        module, name, config, _counterclockwise(RoPE.from_hf_config(config, layer_type=lt))
                    )
                    for lt in _layer_types(module, config)
                }
        except ValueError as exc:  # a rotation anyrope cannot express, or a config it cannot read
            stock[f"{name} ({type(module).__name__})"] = str(exc)
            continue
        formats = {_learn_format(module, name, rope, lt) for lt, rope in ropes.items()}
        if len(formats) > 1:
            raise ValueError(
                f"the rotary module {name} lays out its tables differently per layer type: {formats}"
            )
        patches[module] = _Patch(ropes, formats.pop())
    for name, module in angles:
        try:
            rope = RoPE.from_hf_config(_nearest_config(name, model))
        except ValueError as exc:
            stock[f"{name} ({type(module).__name__})"] = str(exc)
            continue
        patches[module] = _patch_angles(name, module, rope)
    for name, module, attribute in tables:
        rope = RoPE.from_hf_config(_config_of(name, module, model))
        patches[module] = _TablePatch(attribute, _patch_table(name, module, attribute, rope))
    for name, module, attribute in grids:
        try:
            rope = RoPE.from_hf_config(module.config)
        except ValueError as exc:
            stock[f"{name} ({type(module).__name__})"] = str(exc)
            continue
        patches[module] = _TablePatch(attribute, _patch_grid_table(name, module, attribute, rope))
    reasons = "; ".join(f"{where}: {why}" for where, why in stock.items())
    if not patches and not any(is_patched(m) for m in model.modules()):
        raise ValueError(f"anyrope can patch none of {type(model).__name__}'s rotary modules: {reasons}")
    for where, why in stock.items():
        warnings.warn(f"use_anyrope leaves the rotary module {where} stock: {why}", stacklevel=2)
    for module, patch in patches.items():
        if isinstance(patch, _TablePatch):  # swap values, keeping the tensor the model holds
            table = getattr(module, patch.attribute)
            with torch.no_grad():
                patch.table, original = table.detach().clone(), patch.table
                table.copy_(original)
        elif isinstance(patch, _AnglePatch):
            vars(module)["forward"] = _angle_forward(patch, module)
        else:
            vars(module)["forward"] = _anyrope_forward(patch)  # an instance attribute: del restores
        setattr(module, _MARK, patch)
    return model


def _config_of(name: str, module: torch.nn.Module, model: torch.nn.Module) -> Any:
    config = getattr(module, "config", None) or getattr(model, "config", None)
    if config is None:
        raise ValueError(f"the rotary module {name} has no config, and neither has the model")
    return config


def remove_anyrope(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`use_anyrope`: the model computes its tables as before. In place."""
    for _, module in model.named_modules():
        patch = getattr(module, _MARK, None)
        if isinstance(patch, _TablePatch):
            with torch.no_grad():
                getattr(module, patch.attribute).copy_(patch.table)
        elif patch is not None:
            del module.forward
        if patch is not None:
            delattr(module, _MARK)
    return model


def is_patched(module: torch.nn.Module) -> bool:
    """Whether :func:`use_anyrope` patched this module."""
    return hasattr(module, _MARK)
