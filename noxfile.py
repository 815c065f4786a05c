#!/usr/bin/env -S uv run --script
# /// script
# dependencies = ["nox>=2025.2"]
# ///
"""Sessions: one conformance-test session per backend (from backends/*/backend.toml), and lint.

nox                       # lint and the tests of every CPU backend
nox -s tests-torch        # one backend (torch also runs on CUDA when a GPU is present)
nox -s tests-jax          # JAX, once with x64 off (its default) and once with it on
nox -s tests-cupy         # skips, saying why, where there is no NVIDIA GPU
nox -s tests-torch-triton # the Triton kernel for CUDA tensors, on the CPU under Triton's interpreter
nox -s tests-torch-previous  # the compiled tests on torch 2.11, the previous release (not by default)
nox -s tests-numpy -- -k layout   # arguments after -- go to pytest
nox -s tests-lowest        # the NumPy suite at the lowest versions the metadata allows
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

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "tools"))  # backend_toml: the one reader of backends/ (stdlib only)
import backend_toml

PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
BACKENDS = backend_toml.load(ROOT)

VARIANTS = {f"{n}-{v}": (n, v) for n, b in BACKENDS.items() for v in b.get("variants", {})}

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True
# `nox` alone runs every session not marked default=False (all but tests-cupy, tests-torch-previous,
# peers and bench), in the order they are defined here.


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format), mypy --strict, and the layers contract (lint-imports)."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.install("-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("lint-imports")  # pyproject's [tool.importlinter]: docs/architecture.md's layers


# pytest-xdist: one test process per core, each taking whole files: the code blocks of a docs
# page share one namespace and their skip comments pair up, so a page must run in one process.
# "-n 0" after -- runs in one process again.
PARALLEL = ["-n", "auto", "--dist", "loadfile"]


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
            "pytest", *PARALLEL, "--ignore=tests/peers", *(f"--backend={i}" for i in ids),
            *varied.get("pytest", []), *session.posargs, env=env,
        )  # fmt: skip


for _name, _backend in BACKENDS.items():

    def _session(session: nox.Session, _name: str = _name) -> None:
        _tests(session, _name)

    _session.__doc__ = f"Conformance suite on {_name}."
    nox.session(name=f"tests-{_name}", default=not _backend.get("gpu-only"))(_session)

for _variant, (_name, _kind) in VARIANTS.items():

    def _varied(session: nox.Session, _name: str = _name, _kind: str = _kind) -> None:
        _tests(session, _name, _kind)

    _varied.__doc__ = f"Conformance suite on {_name}, variant {_kind!r} (see backends/{_name}/backend.toml)."
    _default = BACKENDS[_name]["variants"][_kind].get("default", True)  # a variant may leave `nox` alone
    nox.session(name=f"tests-{_variant}", default=_default)(_varied)


@nox.session(name="tests-lowest")
def tests_lowest(session: nox.Session) -> None:
    """The NumPy conformance suite at the lowest versions that anyrope's metadata allows.

    uv's lowest-direct resolution takes the floor of each requirement named here: anyrope's own
    (array-api-compat), its numpy and numba extras and the test group; what those pull in comes
    at its newest. On the Python that runs nox: the floors are for Python 3.10 to 3.12 (NumPy
    1.26 and numba 0.60 have no wheels for later ones).
    """
    session.install("uv")  # pip has no lowest-versions resolution
    # Nothing here needs torch, and uv does not see this machine's local CPU build: were a
    # requirement to pull one in, it would come as a CUDA build of several GB.
    excluded = Path(session.create_tmp()) / "excluded.txt"
    excluded.write_text("torch\n")
    session.run(
        "uv", "pip", "install", "--python", str(Path(session.bin) / "python"), "--excludes", str(excluded),
        "--resolution", "lowest-direct", *nox.project.dependency_groups(PYPROJECT, "test"), ".[numpy,numba]",
    )  # fmt: skip
    session.run("pytest", *PARALLEL, "--ignore=tests/peers", "--backend=numpy", *session.posargs)


# The peers' own packages, plus torch and mlx exactly as their backends/ folders install them
# (torch pinned there); mlx's tests skip, saying why, where it does not install. transformers is
# pinned: anyrope._families records its 5.24 modeling code, and tests/peers checks every family.
PEERS = [
    "transformers==5.24.0",
    "rotary-embedding-torch>=0.9",
    # pinned: its set of rope classes changes between versions; it needs Python 3.11 and, on
    # Linux, the mlx[cpu] that backends/mlx installs
    "mlx-lm==0.32.2; python_version >= '3.11'",
    *BACKENDS["torch"]["install"],
    *BACKENDS["mlx"]["install"],
]


@nox.session(default=False)
def peers(session: nox.Session) -> None:
    """anyrope against other implementations (tests/peers); not run by default.

    Hugging Face transformers on real models' configs and every model family it has (in tiny
    models, through anyrope.integrations.transformers), mlx-lm through its integration,
    rotary-embedding-torch, Meta's complex-number RoPE, and mlx.core.fast.rope; and the docs'
    code blocks that need these libraries (README.md and docs/*.md, skipped in the backend sessions).
    """
    session.install(*nox.project.dependency_groups(PYPROJECT, "test"), *PEERS)
    session.install(".")
    # README.md and docs: their code blocks (conftest.py), those importing transformers or mlx_lm included
    session.run("pytest", "tests/peers", "tests/test_readme.py", "README.md", "docs", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """benchmarks/run.py: pyperf timings, medians with quartiles, ratios to a copy and the peers.

    Installs NumPy, torch, mlx and JAX (jax>=0.4.30, CPU) as their backends/ folders do, Triton as
    torch's "triton" variant does (the call-overhead table counts the Triton path's Python calls
    under its CPU interpreter; the variant pins the same torch), and the "bench" dependency group
    (pyperf, numba for the fast paths, matplotlib for the plot, the peers). Arguments after -- go to benchmarks/run.py, e.g. ``nox -s bench -- --quick`` or
    ``-- --backend torch``; after a second -- to pyperf (``-- --quick -- --rigorous``).
    Writes bench-results/ (bench.txt, bench.json, bench.png, and pyperf's files in pyperf/).
    Not run by default.
    """
    session.install(
        *nox.project.dependency_groups(PYPROJECT, "bench"),
        *BACKENDS["numpy"]["install"],
        *BACKENDS["torch"]["install"],
        *BACKENDS["torch"]["variants"]["triton"]["install"],  # the same torch pin, and triton
        *BACKENDS["mlx"]["install"],
        *BACKENDS["jax"]["install"],  # jax>=0.4.30
    )
    session.install(".")
    session.run("python", "benchmarks/run.py", "--out", "bench-results", *session.posargs)


def _chromium(session: nox.Session) -> bool:
    """Debian's chromium and chromium-driver for the browser check: True once both are on PATH.

    Installed when missing where we are root with apt-get. Elsewhere (macOS, Linux without root)
    the check is skipped with the reason, so the README's test command passes there; CI sets
    ANYROPE_REQUIRE_BROWSER_CHECK=1 (.ci/run), which turns that skip into an error.
    """
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return True
    if not (shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0):
        reason = "no chromium and chromedriver here, and no apt-get as root to install them"
        if os.environ.get("ANYROPE_REQUIRE_BROWSER_CHECK") == "1":
            session.error(f"the browser check is required (ANYROPE_REQUIRE_BROWSER_CHECK=1): {reason}")
        session.warn(f"browser check skipped: {reason} (apt-get install chromium chromium-driver)")
        return False
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=env)  # a fresh machine's lists may be stale
    session.run(
        "apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver",
        external=True, env=env,
    )  # fmt: skip
    return True


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site: Sphinx with warnings as errors, its doctests, then every page in Chromium.

    The browser check is skipped, with the reason, where Chromium cannot be had (see _chromium).

    Figures are drawn by anyrope at build time (docs/_ext). Writes docs/_build/html and
    docs/_build/screenshot-index.png.
    """
    session.install(*nox.project.dependency_groups(PYPROJECT, "docs"), *BACKENDS["numpy"]["install"])
    session.install(".")
    shutil.rmtree(ROOT / "docs" / "_build", ignore_errors=True)
    session.run("sphinx-build", "-W", "--keep-going", "-q", "-b", "html", "docs", "docs/_build/html")
    session.run("sphinx-build", "-W", "--keep-going", "-q", "-b", "doctest", "docs", "docs/_build/doctest")
    if _chromium(session):
        session.run("python", "docs/check_pages.py", "docs/_build/html")


if __name__ == "__main__":  # ./noxfile.py, with uv installing the nox of the script block
    nox.main()
