"""anyrope: rotary position embeddings for every array library.

One implementation, written against the Python array API standard, runs on the arrays you give
it (NumPy, PyTorch, CuPy, MLX, any array-API library) and returns arrays of the same library,
device and dtype. No array library is imported until an array of it arrives.
"""

from __future__ import annotations

from . import analysis, reference, scaling
from ._cache import TableCache, table_cache
from ._call import apply
from ._grid import grid_positions
from ._job import Kernel
from ._kvcache import KVCache
from ._layout import LAYOUTS, permute_qk_weight, to_layout
from ._packed import packed_positions
from ._prologue import Prologue, explain_prologue, prologue
from ._qknorm import QKNorm
from ._registry import kernels, use_fast_paths
from ._rerotate import rerotate
from ._rope import RoPE
from ._sinusoidal import sinusoidal
from ._version import __version__

__all__ = [
    "LAYOUTS",
    "KVCache",
    "Kernel",
    "Prologue",
    "QKNorm",
    "RoPE",
    "TableCache",
    "__version__",
    "analysis",
    "apply",
    "explain_prologue",
    "grid_positions",
    "kernels",
    "packed_positions",
    "permute_qk_weight",
    "prologue",
    "reference",
    "rerotate",
    "scaling",
    "sinusoidal",
    "table_cache",
    "to_layout",
    "use_fast_paths",
]
