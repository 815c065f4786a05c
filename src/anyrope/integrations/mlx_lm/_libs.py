"""mlx and mlx-lm, imported once for the package, and the mlx-lm rope classes it converts."""

from __future__ import annotations

import importlib
from typing import Any

# Imported as Any: mlx's typing is partial (mlx.nn re-exports its layers implicitly), and
# mlx-lm has none to speak of; lint environments may have neither installed.
mx: Any = importlib.import_module("mlx.core")
nn: Any = importlib.import_module("mlx.nn")
_rope_utils: Any = importlib.import_module("mlx_lm.models.rope_utils")
# mlx-lm's own, for the checks, kept even where a user puts ours in its place.
_stock_initialize_rope: Any = _rope_utils.initialize_rope


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


def _stored_kinds() -> tuple[type, ...]:
    names = ("Llama3RoPE", "YarnRoPE", "SuScaledRoPE", "ProportionalRoPE")
    return tuple(getattr(_rope_utils, name) for name in names)
