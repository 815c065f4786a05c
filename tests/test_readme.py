"""The README does not lie: CI runs its test command verbatim, and its examples run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.DOTALL)


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    commands = [body.strip() for lang, body in BLOCKS if lang == "bash"]
    test_command = next(c for c in commands if "nox" in c)
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def test_readme_has_the_main_job_command() -> None:
    commands = [body.strip() for lang, body in BLOCKS if lang == "bash"]
    assert any(c.endswith("python -m anyrope") and "pip install" in c for c in commands)


EXAMPLES = [body for lang, body in BLOCKS if lang == "python"]


@pytest.mark.parametrize("source", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(source: str) -> None:
    module = re.match(r"import (\S+)", source)
    assert module is not None, "each example starts with the import of its array library"
    name = module.group(1)
    try:
        found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"{name} is not installed")
    if name == "cupy":
        cupy = importlib.import_module("cupy")
        try:
            cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            pytest.skip(f"cupy has no CUDA device: {exc}")
    exec(compile(source, "README.md", "exec"), {})  # noqa: S102 - the README is ours
