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
repeated, compact, or complex ``freqs_cis``, and for vision towers which axis comes first). A
model whose rotation anyrope reads differently is refused with the difference, never silently
changed.

>>> from anyrope.integrations.transformers import use_anyrope  # doctest: +SKIP
>>> model = use_anyrope(AutoModelForCausalLM.from_pretrained(name))  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from array_api_compat import torch as torch_namespace

from .._dtypes import isdtype
from .._rope import RoPE

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

    expand: str  # "cat": cat(c, c); "repeat": each column twice; "compact": c; "complex": c + i s
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
    if rope.axial is not None:
        return positions[:, None] * steps % length
    if rope.streams > 1:
        return positions[None, None] * steps[:, None, None] % length
    return positions[None]


def _candidates(rope: RoPE) -> Iterator[_Format]:
    axis_orders: list[tuple[int, ...] | None] = [None]
    if rope.axial is not None:
        axis_orders = [tuple(range(rope.axial)), tuple(reversed(range(rope.axial)))]
    for axes in axis_orders:
        for expand in ("cat", "repeat", "compact", "complex"):
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
    if rope.axial is not None:
        if position_ids.ndim < 2 or position_ids.shape[-1] != rope.axial:
            raise ValueError(
                f"position_ids of a vision tower must have shape (patches, {rope.axial}), one "
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


def use_anyrope(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` compute its rotary cos and sin with anyrope.

    In place; returns the model. Every ``*RotaryEmbedding`` module whose forward takes ``(x,
    position_ids)`` (and ``layer_type`` where RoPE parameters differ by layer type) is patched
    with :meth:`anyrope.RoPE.from_hf_config` of its config, after checking that its own tables
    equal anyrope's at positions 0..63. Families that keep a precomputed sin/cos table instead
    (GPT-J's and CodeGen's ``embed_positions``, RoFormer's sinusoidal embedding) get anyrope's
    table in its place, checked the same way. The model's attention code, KV cache and
    ``generate`` are untouched; it compiles with ``torch.compile(fullgraph=True)``. Calling it
    twice is harmless; :func:`remove_anyrope` undoes it.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers model (a ``PreTrainedModel``, or any module holding its rotary modules).

    Vision towers' rotary modules (``forward(x, position_ids)`` with ``position_ids`` of shape
    ``(patches, axes)``) are patched the same way, from their vision config. A module whose
    config anyrope cannot express or read (Kimi-K2.5's and Gemma 4's vision towers, ERNIE
    4.5-VL's text decoder, ...) is left stock, with a ``UserWarning`` that names it and says why.

    Raises
    ------
    ValueError
        Where the model has no such module, where anyrope can express none of its modules' configs
        (the error says why), or where a module's own tables differ from anyrope's; nothing is
        patched then.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), not {type(model).__name__}")
    modules = [(n, m) for n, m in _rotary_modules(model) if not is_patched(m)]
    tables = [(n, m, a) for n, m, a in _table_holders(model) if not is_patched(m)]
    if not modules and not tables:
        if any(is_patched(m) for _, m in model.named_modules()):
            return model
        raise ValueError(
            f"{type(model).__name__} has no rotary embedding module (a submodule named "
            "*RotaryEmbedding with forward(x, position_ids), or a sin/cos table by position); for "
            "other models call anyrope.RoPE on q and k directly"
        )
    patches: dict[torch.nn.Module, Any] = {}
    stock: dict[str, str] = {}  # module -> why anyrope leaves it as it is
    for name, module in modules:  # check every module before patching any
        config = _config_of(name, module, model)
        try:
            ropes = {
                lt: _counterclockwise(RoPE.from_hf_config(config, layer_type=lt))
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
    for name, module, attribute in tables:
        rope = RoPE.from_hf_config(_config_of(name, module, model))
        patches[module] = _TablePatch(attribute, _patch_table(name, module, attribute, rope))
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
