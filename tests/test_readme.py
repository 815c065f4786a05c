"""The README and the docs do not lie: CI runs the README's test command verbatim, and every
complete example (a Python block that starts with an import) in them runs."""

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
    # the docs session may skip its browser check elsewhere, never on CI
    required = "export ANYROPE_REQUIRE_BROWSER_CHECK=1"
    assert required in ci_lines
    assert ci_lines.index(required) < ci_lines.index(test_command)


def test_readme_has_the_main_job_command() -> None:
    commands = [body.strip() for lang, body in BLOCKS if lang == "bash"]
    assert any(c.endswith("python -m anyrope") and "pip install" in c for c in commands)


EXAMPLES = [("README.md", body) for lang, body in BLOCKS if lang == "python"]
for _page in sorted((ROOT / "docs").glob("*.md")):
    EXAMPLES += [
        (f"docs/{_page.name}", body)
        for lang, body in re.findall(r"```(\w+)\n(.*?)```", _page.read_text(), flags=re.DOTALL)
        if lang == "python" and body.startswith("import ")  # the rest are fragments beside prose
    ]


@pytest.mark.parametrize(
    ("where", "source"), EXAMPLES, ids=[f"{where}-{i}" for i, (where, _) in enumerate(EXAMPLES)]
)
def test_example_runs(where: str, source: str) -> None:
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
    exec(compile(source, where, "exec"), {})  # noqa: S102 - the README and docs are ours
