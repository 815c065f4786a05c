"""Patching a whole mlx-lm model: finding its rope modules, replacing them, putting them back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..._args import check_bool
from ._conversion import from_mlx_lm
from ._libs import _supported, nn
from ._module import AnyRoPE

_ROPE_LIKE = re.compile(r"rope|rotary", re.IGNORECASE)


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
    strict, exact, check = (
        check_bool(strict, "strict"),
        check_bool(exact, "exact"),
        check_bool(check, "check"),
    )
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
