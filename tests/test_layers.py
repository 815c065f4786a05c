"""The package's own modules import each other at module level, downward (the layers contract in
pyproject.toml, checked by lint-imports in ``nox -s lint``). A function-local import of one of
its own modules is allowed only where that module imports an optional library as it loads."""

from __future__ import annotations

import ast
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import anyrope

import backend_toml

PACKAGE = Path(anyrope.__file__).parent
ROOT = Path(__file__).resolve().parent.parent  # the checkout: pyproject.toml, docs/, src/
# Modules whose top level imports an optional library: loaded when first used, so that
# `import anyrope` imports no backend.
LOADED_ON_FIRST_USE = {
    "anyrope._kernels._jit": "numba",
    "anyrope._kernels._jit_prologue": "numba",
    "anyrope._kernels._numba_op": "torch (and numba)",
    "anyrope._kernels._triton": "triton and torch",
    "anyrope._kernels._triton_prologue": "triton and torch",
    "anyrope._torch_ops": "torch",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _deferred_imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of the package's own modules inside
    a function."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _module_name(path)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    target = f"{base}.{node.module}" if node.module else base
                    found += [
                        (importer, f"{target}.{a.name}" if not node.module else target) for a in node.names
                    ]
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("anyrope"):
                    found.append((importer, str(node.module)))
    return found


def test_deferred_imports_only_of_modules_that_import_optional_libraries() -> None:
    deferred = _deferred_imports()
    assert {target for _, target in deferred} <= set(LOADED_ON_FIRST_USE), deferred
    assert deferred, "the scan found nothing: the Triton and numba kernels are loaded on first use"


def test_the_architecture_page_names_every_layered_module() -> None:
    """docs/architecture.md describes the layers as pyproject's contract declares them: every
    module in the contract is named on the page, and the page names no module the package lacks."""
    contract = backend_toml.read(ROOT / "pyproject.toml")["tool"]["importlinter"]["contracts"][0]
    declared = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = page[page.index("| layer (top to bottom)") : page.index("Run `lint-imports`")]
    rows = [line.split("|") for line in table.splitlines()[2:] if line.startswith("|")]
    named = {name for row in rows for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row[2])}
    assert declared <= named, f"modules of the contract missing from the page: {sorted(declared - named)}"
    existing = {info.name for info in pkgutil.iter_modules([str(ROOT / "src" / "anyrope")])}
    assert named <= existing, f"the page names modules the package lacks: {sorted(named - existing)}"


# Each layer module and the framework it is for; importing it may import that framework (with
# what the framework imports itself) and nothing else.
LAYER_FRAMEWORKS = {
    "anyrope.layers.torch": "torch",
    "anyrope.layers.mlx": "mlx.nn",
    "anyrope.layers.flax": "flax.nnx",
    "anyrope.layers.keras": "keras",
}
# onnx and its runtime too: the torch layer's export path uses torch.onnx alone, loaded with torch
FRAMEWORKS = ("torch", "jax", "flax", "keras", "mlx", "tensorflow", "onnx", "onnxruntime", "onnxscript")

_IMPORTED = """
import sys
{first}
before = set(sys.modules)
import {module}
print(" ".join(sorted({{name.partition(".")[0] for name in set(sys.modules) - before}})))
"""


def _newly_imported(module: str, first: str = "") -> set[str]:
    """The top-level packages that ``import module`` adds, in a fresh interpreter, after ``first``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")])),
    }
    env.setdefault("KERAS_BACKEND", "jax" if importlib.util.find_spec("jax") else "torch")
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED.format(first=first, module=module)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_layers_package_imports_no_framework() -> None:
    assert not _newly_imported("anyrope.layers") & set(FRAMEWORKS)


@pytest.mark.parametrize("module", sorted(LAYER_FRAMEWORKS))
def test_a_layer_module_imports_only_its_framework(module: str) -> None:
    framework = LAYER_FRAMEWORKS[module]
    if importlib.util.find_spec(framework.partition(".")[0]) is None:
        pytest.skip(f"{framework} is not installed")
    assert framework.partition(".")[0] in _newly_imported(module, "import anyrope")  # the scan sees it
    assert not _newly_imported(module, f"import anyrope, {framework}") & set(FRAMEWORKS)
