"""One conformance suite for every backend.

Choose backends with ``--backend NAME`` (repeatable) or ``ANYROPE_BACKEND=a,b``; the default is
every installed CPU backend. Tests that take the ``backend`` fixture run once per backend, and
known deviations from backends/*/backend.toml are applied as skip or xfail marks.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from harness import SPECS, Backend, default_ids, make_backend, target_ids

settings.register_profile(
    "default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        action="append",
        default=[],
        help=f"backend to test (repeatable): one of {', '.join(target_ids())}; default: installed CPU ones",
    )


def _selected(config: pytest.Config) -> list[str]:
    chosen: list[str] = [b for arg in config.getoption("--backend") for b in arg.split(",") if b]
    if not chosen and os.environ.get("ANYROPE_BACKEND"):
        chosen = [b for b in os.environ["ANYROPE_BACKEND"].split(",") if b]
    known = target_ids()
    for name in chosen:
        if name not in known:
            raise pytest.UsageError(f"unknown backend {name!r}; choose from {', '.join(known)}")
    return chosen or default_ids()


_cache: dict[str, Backend | str] = {}


def _load(target: str) -> Backend | str:
    if target not in _cache:
        try:
            _cache[target] = make_backend(target)
        except LookupError as exc:
            _cache[target] = str(exc)
    return _cache[target]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", _selected(metafunc.config), indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Backend:
    loaded = _load(request.param)
    if isinstance(loaded, str):
        pytest.skip(loaded)
    return loaded


@pytest.fixture(scope="session")
def xp(backend: Backend) -> Any:
    return backend.xp


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ids = target_ids()
    for item in items:
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("backend") if callspec else None
        if target is None:
            continue
        for deviation in SPECS[ids[target][0]].get("deviations", []):
            if deviation["tests"] in item.nodeid:
                mark = pytest.mark.skip if deviation["mode"] == "skip" else pytest.mark.xfail
                item.add_marker(mark(reason=f"{target}: {deviation['reason']}"))
