"""Every code block of the README and of docs/*.md runs under pytest (Sybil), one namespace a page.

A Python block runs where each library it imports is installed, and skips, naming the library,
where one is not: each backend's nox session runs the blocks of its own library, and the peers
session those needing transformers or mlx-lm. A block without imports continues the page's
previous block and skips with it. A block that cannot run says why in a comment before it
(``<!-- skip: next "reason" -->``, or ``start``/``end`` around several). bash blocks are commands
for a shell (install, nox), never run here; any other language fails, so a new block is either
runnable Python or marked.

The test suite's options (``--backend``, ``--mode``; tests/conftest.py reads them) are declared
here, in the conftest pytest loads whichever paths it is given, so ``pytest --backend numpy
docs`` parses too. The code blocks do not read them: a block runs where its libraries are.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer
from sybil.parsers.myst import CodeBlockParser, SkipParser

from harness import target_ids


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        action="append",
        default=[],
        help=f"backend to test (repeatable): one of {', '.join(target_ids())}; default: installed CPU ones",
    )
    parser.addoption(
        "--mode",
        action="append",
        default=[],
        choices=["eager", "compiled", "dynamic"],
        help="run tests that take `mode` in these modes only (repeatable); default: every compiler the "
        "backend declares, and eager",
    )


_SHELL = {"bash", "console"}
_run = PythonEvaluator()
_skipped: dict[Document, str] = {}  # the reason the page's previous block skipped, if it did


def _missing(module: str) -> str | None:
    """Why ``module`` cannot be imported here, or None."""
    top = module.partition(".")[0]
    try:
        if importlib.util.find_spec(top) is None:
            return f"{top} is not installed"
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
        if module == "cupy":
            cupy = importlib.import_module("cupy")
            cupy.cuda.runtime.getDeviceCount()
    except (ImportError, OSError) as exc:  # e.g. mlx on Linux without its CPU library
        return f"{module} does not import: {exc}"
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, whose class needs cupy to name
        return f"{module} has no CUDA device: {exc}"
    return None


def _imports(source: str) -> list[str]:
    modules = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.append(node.module)
    return modules


def _evaluate(example: Example) -> None:
    modules = _imports(str(example.parsed))
    reasons = [r for r in map(_missing, modules) if r]
    if not modules and example.document in _skipped:
        reasons = [f"continues a block that skipped: {_skipped[example.document]}"]
    if reasons:
        _skipped[example.document] = reasons[0]
        pytest.skip(reasons[0])
    _skipped.pop(example.document, None)
    _run(example)


def _unmarked(document: Document) -> Iterator[Region]:
    """A region that fails for each fenced block neither Python, shell nor a MyST directive."""
    for lexed in FencedCodeBlockLexer(language=r".+")(document):
        language = lexed.lexemes["language"]
        if language in _SHELL or language == "python" or re.fullmatch(r"\{[\w-]+\}.*", language):
            continue

        def fail(_example: Example, language: str = language) -> None:
            raise AssertionError(
                f"a {language!r} block: make it Python (run, or marked skip), bash or $$ math"
            )

        yield Region(lexed.start, lexed.end, language, fail)


pytest_collect_file = Sybil(
    parsers=[SkipParser(), CodeBlockParser("python", _evaluate), _unmarked],
    patterns=["README.md", "docs/*.md"],
    excludes=["docs/_build/*", "docs/_generated/*"],
).pytest()
