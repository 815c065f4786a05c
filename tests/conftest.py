"""One conformance suite for every backend.

Choose backends with ``--backend NAME`` (repeatable) or ``ANYROPE_BACKEND=a,b``; the default is
every installed CPU backend. Tests that take the ``backend`` fixture run once per backend; tests
that take ``mode`` also run under each compiler the backend declares (``compilers`` in its
backend.toml; ``--mode eager`` keeps to eager runs), and tests that take ``dtype`` once per
floating dtype it has. Known deviations (``[deviations.<feature>]`` there) apply to tests marked
``@pytest.mark.feature("<feature>")``, as skip or xfail.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from harness import SPECS, Backend, default_ids, deviations_of, make_backend, target_ids

settings.register_profile(
    "default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "feature(name): the test exercises a feature a backend may lack")
    config.addinivalue_line("markers", "dtypes(*names): run only for these floating dtypes of each backend")
    config.addinivalue_line(
        "markers",
        "kernel_takes(*what): only kernels (and backends) that take in-place writes, gradients or "
        "the tracing of the backend's compilers",
    )
    config.addinivalue_line(
        "markers",
        "backends(*names): run only on these backends (a name, or a target such as torch-cuda); "
        "the others are not parametrized, so nothing is built to be skipped",
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


def _modes(target: str, chosen: list[str]) -> list[str]:
    compilers = SPECS[target_ids()[target][0]].get("compilers", [])
    every = ["eager"] + (["compiled"] if compilers else []) + (["dynamic"] if len(compilers) > 1 else [])
    return [m for m in every if not chosen or m in chosen]


def _dtypes(target: str) -> list[str]:
    """The floating dtypes ``target`` has (probed where they depend on the setup, as JAX's
    float64 does); float32 alone where the backend cannot load, whose tests then skip."""
    loaded = _load(target)
    return loaded.dtypes if isinstance(loaded, Backend) else ["float32"]


def _traces(backend: Backend, kernel: Any) -> bool:
    """Whether ``kernel`` takes the trace of ``backend``'s compilers (torch's: torch.compile)."""
    return not kernel.tracers or ("torch.compile" if backend.name == "torch" else "other") in kernel.tracers


def _parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        if name in (names.split(",") if isinstance(names, str) else names):
            return True
    return False


def _kernel_combos(metafunc: pytest.Metafunc, targets: list[str]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(backend, kernel[, dtype][, layout][, mode]) for every combination a kernel's declaration
    takes: the backend's library and device type, the dtypes (the backend's, narrowed by a
    ``dtypes`` marker) and layouts it declares, and the backend's modes; a ``kernel_takes("inplace"|"gradients"|"tracing")`` marker
    keeps kernels (and backends) with those, and a kernel that takes no eager call is in tests of
    tracing alone. Nothing outside a declaration is built to be skipped."""
    import anyrope
    from anyrope._arrays import LIBRARIES
    from anyrope._compat import environment

    takes = {arg for marker in metafunc.definition.iter_markers("kernel_takes") for arg in marker.args}
    dtype_marker = metafunc.definition.get_closest_marker("dtypes")
    wanted = set(dtype_marker.args) if dtype_marker is not None else None
    by_dtype = "dtype" in metafunc.fixturenames and not _parametrized(metafunc, "dtype")
    by_layout = "layout" in metafunc.fixturenames and not _parametrized(metafunc, "layout")
    by_mode = "mode" in metafunc.fixturenames
    combos: list[tuple[Any, ...]] = []
    for target in targets:
        loaded = _load(target)
        for k in anyrope.kernels():
            if k.libraries and LIBRARIES[target_ids()[target][0]].namespace not in k.libraries:
                continue
            if isinstance(loaded, Backend):  # else the backend's own reason skips it
                device_type = environment(loaded.xp, loaded.device).device_type
                if k.devices and device_type not in k.devices:
                    continue
                if "gradients" in takes and not (loaded.autograd and k.differentiable):
                    continue
                if "tracing" in takes and not (k.traceable and _traces(loaded, k)):
                    continue
            if "inplace" in takes and not k.inplace:
                continue
            if "tracing" not in takes and not k.eager:  # a test of eager calls
                continue
            dtypes: list[Any] = [None]
            if by_dtype:
                dtypes = [
                    d
                    for d in _dtypes(target)
                    if (not k.dtypes or d in k.dtypes) and (wanted is None or d in wanted)
                ]
            layouts: list[Any] = sorted(k.layouts) if by_layout else [None]
            modes: list[Any] = [None]
            if by_mode:  # the compiled ones alone where the test is of tracing
                chosen = _modes(target, metafunc.config.getoption("--mode"))
                modes = [m for m in chosen if not ("tracing" in takes and m == "eager")]
            combos += [(target, k.name, d, lay, m) for d in dtypes for lay in layouts for m in modes]
    names = [
        "backend",
        "kernel",
        *(["dtype"] if by_dtype else []),
        *(["layout"] if by_layout else []),
        *(["mode"] if by_mode else []),
    ]
    keep = [0, 1, *([2] if by_dtype else []), *([3] if by_layout else []), *([4] if by_mode else [])]
    return names, [tuple(c[i] for i in keep) for c in combos]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Backends, and with them each compiler (``mode``) and each floating dtype (``dtype``; a
    ``dtypes(...)`` marker narrows them) that backend has."""
    if "backend" not in metafunc.fixturenames:
        return
    targets = _selected(metafunc.config)
    only = metafunc.definition.get_closest_marker("backends")
    if only is not None:  # a backend or a target: "torch" takes torch-cuda too, "torch-cuda" alone
        targets = [t for t in targets if t in only.args or target_ids()[t][0] in only.args]
    if "kernel" in metafunc.fixturenames:  # each kernel with what it declares it takes
        names, combos = _kernel_combos(metafunc, targets)
        metafunc.parametrize(names, combos, indirect=["backend", "kernel"], scope="session")
        return
    names, combos = ["backend"], [(t,) for t in targets]
    if "mode" in metafunc.fixturenames:
        names.append("mode")
        combos = [(*c, m) for c in combos for m in _modes(c[0], metafunc.config.getoption("--mode"))]
    if "dtype" in metafunc.fixturenames and not _parametrized(metafunc, "dtype"):
        marker = metafunc.definition.get_closest_marker("dtypes")
        wanted = set(marker.args) if marker is not None else None
        names.append("dtype")
        combos = [(*c, d) for c in combos for d in _dtypes(c[0]) if wanted is None or d in wanted]
    if len(names) == 1:
        metafunc.parametrize("backend", targets, indirect=True, scope="session")
    else:
        metafunc.parametrize(names, combos, indirect=["backend"], scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Backend:
    loaded = _load(request.param)
    if isinstance(loaded, str):
        pytest.skip(loaded)
    return loaded


@pytest.fixture(scope="session")
def xp(backend: Backend) -> Any:
    return backend.xp


@pytest.fixture(autouse=True)
def _fresh_compiler(request: pytest.FixtureRequest) -> None:
    """torch.compile keeps compiled frames per code object: start each compiled test afresh, so
    that recompilation limits and counts belong to the test alone."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if params.get("mode", "eager") != "eager" and str(params.get("backend", "")).startswith("torch"):
        import torch

        torch._dynamo.reset()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ids = target_ids()
    for item in items:
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("backend") if callspec else None
        if target not in ids:  # None, or pytest's marker of an empty parameter set
            continue
        deviations = deviations_of(target)
        for marker in item.iter_markers("feature"):
            found = deviations.get(marker.args[0])
            if found is not None and found["mode"] != "rounding":  # "rounding": see harness.assert_same
                mark = pytest.mark.skip if found["mode"] == "skip" else pytest.mark.xfail
                item.add_marker(mark(reason=f"{target}: {found['reason']}"))
