"""anyrope: rotary position embeddings for every array library.

One implementation, written against the Python array API standard, runs on the arrays you give
it (NumPy, PyTorch, CuPy, MLX, any array-API library) and returns arrays of the same library,
device and dtype. No array library is imported until an array of it arrives.
"""

from __future__ import annotations

from . import analysis, reference, scaling
from ._cache import TableCache, table_cache
from ._grid import grid_positions
from ._layout import LAYOUTS, permute_qk_weight, to_layout
from ._packed import packed_positions
from ._registry import Kernel, kernels, use_fast_paths
from ._rerotate import rerotate
from ._rope import RoPE
from ._rotate import apply
from ._sinusoidal import sinusoidal

__version__ = "0.1.0"

__all__ = [
    "LAYOUTS",
    "Kernel",
    "RoPE",
    "TableCache",
    "__version__",
    "analysis",
    "apply",
    "grid_positions",
    "kernels",
    "packed_positions",
    "permute_qk_weight",
    "reference",
    "rerotate",
    "scaling",
    "sinusoidal",
    "table_cache",
    "to_layout",
    "use_fast_paths",
]
