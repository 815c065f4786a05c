"""The compiler policy lives in one module (anyrope._policy): table sources and kernels read its
decisions and never ask which tracer runs; each kind of table source offers the forms it declares."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import anyrope
from anyrope import _policy
from anyrope._job import FORMS, SOURCES, Kernel
from anyrope._tables import GivenTables, PositionTables, XPosTables

SRC = pathlib.Path(anyrope.__file__).parent

# What tells one tracer from another: torch's and JAX's own tests, and anyrope's answers to them.
_TRACER_TESTS = {
    "is_compiling", "is_dynamo_compiling", "is_exporting", "is_tracing", "dynamo_traces", "handed_on",
    "hands_on", "dynamo_hands_on", "dynamo_static_by_default", "strict_exports", "tracer", "Tracer",
}  # fmt: skip
# The modules that hold table sources, kernels, the choice of kernels and the call's plan.
_READERS = ["_tables.py", "_kernel_angles.py", "_xpos.py", "_registry.py", "_plan.py", "_dask.py", "_job.py"]


def _names(path: pathlib.Path) -> set[str]:
    """Every function ``path``'s code calls, and every name it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize(
    "module", [*_READERS, *(f"_kernels/{p.name}" for p in sorted((SRC / "_kernels").glob("*.py")))]
)
def test_sources_and_kernels_ask_no_tracer(module: str) -> None:
    """A table source, a kernel or the plan reads the call's ``Tracing`` (or the key's tracer, as
    kernels declare the tracers they take), never calls torch's or JAX's tests themselves."""
    asked = _names(SRC / module) & _TRACER_TESTS
    if module in ("_plan.py",):  # the signer asks whether torch traces, before any plan or memo
        asked -= {"is_dynamo_compiling", "is_tracing"}
    assert not asked, f"{module} asks {sorted(asked)}: read the call's policy (anyrope._policy) instead"


def test_an_eager_call_has_the_eager_policy() -> None:
    xp = anyrope._compat.array_namespace(q=np.zeros(1))
    assert _policy.tracing(xp, False) is _policy.EAGER
    assert not _policy.EAGER.tracer
    assert not _policy.EAGER.fetches


def test_the_policy_picks_a_kernel_s_traced_launch() -> None:
    eager, traced = object(), object()
    assert _policy.EAGER.prepared(eager, traced) is eager
    compiled = _policy.Tracing("torch.compile", fetches=True)
    assert compiled.prepared(eager, traced) is traced
    assert compiled.prepared(eager, None) is eager  # one launch serves both
    assert compiled.paired(eager, None) is None  # no traced pair launch: q and k apart
    assert _policy.EAGER.paired(eager, None) is eager


def test_call_forms_of_numpy_calls() -> None:
    q = np.zeros((1, 2, 3, 8))
    never = lambda: pytest.fail("the switch is read only for a call dynamo may hand on")
    assert _policy.call_form(q, None, None, 0, -2, False, never) is None


def test_every_source_kind_declares_its_forms() -> None:
    assert set(FORMS) == set(SOURCES)
    for form in FORMS["offset"]:
        assert callable(getattr(PositionTables, form)), form
    # The caller's tables and xPos's offer only what they have: no method answers "none".
    for source, kind in ((GivenTables, "tables"), (XPosTables, "xpos")):
        offered = {form for forms in FORMS.values() for form in forms if hasattr(source, form)}
        assert offered == set(FORMS[kind]), source


def test_kernels_with_a_traced_form_are_traceable() -> None:
    for kernel in anyrope.kernels():
        assert isinstance(kernel, Kernel)
        if kernel.prepare_traced is not None or kernel.prepare_pair_traced is not None:
            assert kernel.traceable, kernel.name
