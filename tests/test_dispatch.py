"""Import hygiene, the table cache's bound and thread safety, and the doctests."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import anyrope
from anyrope import TableCache

from harness import Backend


def test_import_loads_no_array_library() -> None:
    code = (
        "import sys, anyrope, anyrope.reference\n"
        "eager = [m for m in ('numpy', 'torch', 'mlx.core', 'cupy', 'jax', 'array_api_strict') if m in sys.modules]\n"
        "print(','.join(eager))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == ""


# The cache serves the table path: the generic kernel and the CPU kernels. The GPU kernels
# form angles in the kernel and keep no tables, so these tests keep to the generic kernel.


@pytest.mark.feature("table-cache")
def test_cache_grows_by_doubling_and_is_reused(backend: Backend) -> None:
    anyrope.table_cache.clear()
    rope = anyrope.RoPE(8, base=777.0)
    x = backend.asarray(np.zeros((1, 1, 8)), "float32")
    with anyrope.use_fast_paths(False):
        for step in range(300):
            rope(x, offset=step)
    info = anyrope.table_cache.info()
    assert info["tables"] == 1
    # 300 positions -> 512 rows of cos and sin, 4 pairs each (beside the digit tables where
    # angles are formed from digits: MLX, JAX without x64)
    assert info["nbytes"] - info["constant_nbytes"] == 512 * 8 * 4


@pytest.mark.feature("table-cache")
def test_cache_keys_on_library_device_and_dtype(backend: Backend) -> None:
    anyrope.table_cache.clear()
    rope = anyrope.RoPE(8, base=778.0)
    with anyrope.use_fast_paths(False):
        for dtype in backend.dtypes:
            rope(backend.asarray(np.zeros((1, 2, 8)), dtype))
    wide = {"float64"} & set(backend.dtypes)
    assert anyrope.table_cache.info()["tables"] == 1 + len(wide)  # 16-bit inputs share float32 tables


def test_cache_respects_its_bound(backend: Backend) -> None:
    cache = anyrope.table_cache
    limit = cache.limit_bytes
    try:
        cache.clear()
        cache.set_limit(64 * 1024)
        x = backend.asarray(np.zeros((1, 2, 64)), "float32")
        for base in (100.0, 200.0, 300.0, 400.0, 500.0):
            anyrope.RoPE(64, base=base)(x, offset=10)
        assert cache.info()["nbytes"] <= 64 * 1024
        # A table over half the bound is built for the call and not kept.
        rope = anyrope.RoPE(64, base=600.0)
        big = backend.asarray(np.zeros((1, 600, 64)), "float32")
        np.testing.assert_array_equal(
            backend.to_numpy(rope(big, offset=5)), backend.to_numpy(rope(big, positions=list(range(5, 605))))
        )
        assert cache.info()["nbytes"] <= 64 * 1024
    finally:
        cache.set_limit(limit)
        cache.clear()


@pytest.mark.feature("table-cache")
def test_cache_under_threads(backend: Backend) -> None:
    anyrope.table_cache.clear()
    rope = anyrope.RoPE(16, base=4321.0)
    x = backend.asarray(np.random.default_rng(0).standard_normal((1, 2, 16)), "float32")
    with anyrope.use_fast_paths(False):
        expected = {n: backend.to_numpy(rope(x, positions=[n, n + 1])) for n in range(0, 2000, 97)}
    anyrope.table_cache.clear()
    errors: list[BaseException] = []

    def work(start: int) -> None:
        try:
            with anyrope.use_fast_paths(False):  # a thread starts with the default: every kernel
                for n in range(start, 2000, 97 * 4):
                    got = backend.to_numpy(rope(x, offset=n))
                    np.testing.assert_array_equal(got, expected[n])
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(97 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert anyrope.table_cache.info()["tables"] == 1


def test_table_cache_validates_its_limit() -> None:
    with pytest.raises(ValueError, match="limit_bytes=-1 must be a non-negative int"):
        TableCache().set_limit(-1)


def test_repr() -> None:
    assert repr(anyrope.RoPE(64, rotary_dim=32, layout="meta")) == (
        "RoPE(64, base=10000.0, rotary_dim=32, layout='interleaved')"
    )


def _modules_with_examples() -> list[tuple[str, bool]]:
    """Every module of the package whose source holds a doctest prompt, found by walking it (no
    hand list to fall behind), and whether any of its examples runs here (the others need a
    model download: +SKIP). Read as text: importing every module would import optional libraries."""
    found = []
    for info in pkgutil.walk_packages(anyrope.__path__, "anyrope."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None
        assert spec.origin is not None
        prompts = [
            line for line in Path(spec.origin).read_text(encoding="utf-8").splitlines() if ">>> " in line
        ]
        if prompts:
            found.append((info.name, any("doctest: +SKIP" not in line for line in prompts)))
    return found


@pytest.mark.parametrize(("module", "runs"), _modules_with_examples())
def test_docstring_examples(module: str, runs: bool) -> None:
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:  # an integration's own library (mlx-lm, transformers)
        if (exc.name or "anyrope").partition(".")[0] == "anyrope":
            raise
        pytest.skip(f"{module} needs {exc.name}, not installed here")
    result = doctest.testmod(imported, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    assert (result.attempted > 0) == runs
