# /// script
# dependencies = ["nox>=2025.2"]
# ///
"""Sessions: one conformance-test session per backend (from backends/*/backend.toml), and lint.

nox                       # lint and the tests of every CPU backend
nox -s tests-torch        # one backend (torch also runs on CUDA when a GPU is present)
nox -s tests-jax          # JAX, once with x64 off (its default) and once with it on
nox -s tests-cupy         # skips, saying why, where there is no NVIDIA GPU
nox -s tests-torch-triton # the Triton kernel for CUDA tensors, on the CPU under Triton's interpreter
nox -s tests-numpy -- -k layout   # arguments after -- go to pytest
nox -s peers              # anyrope against transformers, rotary-embedding-torch, mlx.fast.rope (not by default)
nox -s bench -- --quick   # benchmarks/ through pyperf: anyrope against a copy and the peers (not by default)
nox -s docs               # the Sphinx site (warnings are errors), its doctests, and a headless-browser check
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2"  # dependency groups (nox.project.dependency_groups)

if sys.version_info >= (3, 11):
    import tomllib
else:  # nox depends on tomli for these Pythons
    import tomli as tomllib

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
BACKENDS = {
    data["name"]: data
    for data in (tomllib.loads(path.read_text()) for path in sorted(ROOT.glob("backends/*/backend.toml")))
}

VARIANTS = {f"{n}-{v}": (n, v) for n, b in BACKENDS.items() for v in b.get("variants", {})}

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint",
    *(f"tests-{n}" for n, b in BACKENDS.items() if not b.get("gpu-only")),
    *(f"tests-{v}" for v in VARIANTS),
    "docs",
]


def _has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def _tests(session: nox.Session, name: str, variant: str | None = None) -> None:
    backend = BACKENDS[name]
    if backend.get("gpu-only") and not _has_nvidia_gpu():
        session.skip(f"{name} needs an NVIDIA GPU and this machine has none (no nvidia-smi, no /dev/nvidia0)")
    varied = backend["variants"][variant] if variant else {}
    session.install(
        *nox.project.dependency_groups(PYPROJECT, "test"), *varied.get("install", backend["install"])
    )
    session.install(".")
    ids = [name]
    for device in backend["devices"][1:] if not variant else []:  # e.g. torch-cuda, where the probe finds one
        probe = backend.get("probe", {}).get(device)
        found = probe is not None and "True" in (session.run("python", "-c", probe, silent=True) or "")
        if found:
            ids.append(f"{name}-{device}")
        else:
            session.log(f"{name}-{device}: not tested, no {device} device here")
    # tests/peers compares against other libraries and has a session of its own, "peers".
    for env in backend.get("runs", [{}]):  # JAX: once with x64 off, once with it on
        env = {**env, **varied.get("env", {})}
        if env:
            session.log(f"{name}: run with {env}")
        session.run(
            "pytest", "--ignore=tests/peers", *(f"--backend={i}" for i in ids), *varied.get("pytest", []),
            *session.posargs, env=env,
        )  # fmt: skip


for _name in BACKENDS:

    def _session(session: nox.Session, _name: str = _name) -> None:
        _tests(session, _name)

    _session.__doc__ = f"Conformance suite on {_name}."
    nox.session(name=f"tests-{_name}")(_session)

for _variant, (_name, _kind) in VARIANTS.items():

    def _varied(session: nox.Session, _name: str = _name, _kind: str = _kind) -> None:
        _tests(session, _name, _kind)

    _varied.__doc__ = f"Conformance suite on {_name}, variant {_kind!r} (see backends/{_name}/backend.toml)."
    nox.session(name=f"tests-{_variant}")(_varied)


# The peers' own packages, plus torch and mlx exactly as their backends/ folders install them
# (torch pinned there); mlx's tests skip, saying why, where it does not install. transformers is
# pinned: anyrope._families records its 5.23 modeling code, and tests/peers checks every family.
PEERS = [
    "transformers==5.23.0",
    "rotary-embedding-torch>=0.9",
    # pinned: its set of rope classes changes between versions; it needs Python 3.11 and, on
    # Linux, the mlx[cpu] that backends/mlx installs
    "mlx-lm==0.32.2; python_version >= '3.11'",
    *BACKENDS["torch"]["install"],
    *BACKENDS["mlx"]["install"],
]


@nox.session
def peers(session: nox.Session) -> None:
    """anyrope against other implementations (tests/peers); not run by default.

    Hugging Face transformers on real models' configs and every model family it has (in tiny
    models, through anyrope.integrations.transformers), mlx-lm through its integration,
    rotary-embedding-torch, Meta's complex-number RoPE, and mlx.core.fast.rope; and the docs'
    examples that need these libraries (tests/test_readme.py, skipped in the backend sessions).
    """
    session.install(*nox.project.dependency_groups(PYPROJECT, "test"), *PEERS)
    session.install(".")
    session.run("pytest", "tests/peers", "tests/test_readme.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """benchmarks/run.py: pyperf timings, medians with quartiles, ratios to a copy and the peers.

    Installs NumPy, torch, mlx and JAX (jax>=0.4.30, CPU) as their backends/ folders do, and the
    "bench" dependency group (pyperf, numba for the fast paths, matplotlib for the plot, the
    peers). Arguments after -- go to benchmarks/run.py, e.g. ``nox -s bench -- --quick`` or
    ``-- --backend torch``; after a second -- to pyperf (``-- --quick -- --rigorous``).
    Writes bench-results/ (bench.txt, bench.json, bench.png, and pyperf's files in pyperf/).
    Not run by default.
    """
    session.install(
        *nox.project.dependency_groups(PYPROJECT, "bench"),
        *BACKENDS["numpy"]["install"],
        *BACKENDS["torch"]["install"],
        *BACKENDS["mlx"]["install"],
        *BACKENDS["jax"]["install"],  # jax>=0.4.30
    )
    session.install(".")
    session.run("python", "benchmarks/run.py", "--out", "bench-results", *session.posargs)


def _chromium(session: nox.Session) -> None:
    """Debian's chromium and chromium-driver for the browser check, installed if missing (as root)."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if not (shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0):
        session.error(
            "the docs check needs chromium and chromedriver: apt-get install chromium chromium-driver"
        )
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=env)  # a fresh machine's lists may be stale
    session.run(
        "apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver",
        external=True, env=env,
    )  # fmt: skip


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site: Sphinx with warnings as errors, its doctests, then every page in Chromium.

    Figures are drawn by anyrope at build time (docs/_ext). Writes docs/_build/html and
    docs/_build/screenshot-index.png.
    """
    session.install(*nox.project.dependency_groups(PYPROJECT, "docs"), *BACKENDS["numpy"]["install"])
    session.install(".")
    shutil.rmtree(ROOT / "docs" / "_build", ignore_errors=True)
    session.run("sphinx-build", "-W", "--keep-going", "-q", "-b", "html", "docs", "docs/_build/html")
    session.run("sphinx-build", "-W", "--keep-going", "-q", "-b", "doctest", "docs", "docs/_build/doctest")
    _chromium(session)
    session.run("python", "docs/check_pages.py", "docs/_build/html")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy --strict."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.install("-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
