"""CI runs the README's test command verbatim. (The README's and the docs' code blocks run through
conftest.py at the repository root.)"""

from __future__ import annotations

import re
from pathlib import Path

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
