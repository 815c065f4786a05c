"""Sphinx configuration: MyST pages, furo theme, numpydoc API pages, plots drawn at build time."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

import anyrope

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))

project = "anyrope"
author = "the anyrope developers"
copyright = "2026, the anyrope developers"
release = version = anyrope.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    # MathJax 3 copied into the build's _static, so pages render formulas without the network
    "sphinx-mathjax-offline",
    "numpydoc",
    "anyrope_docs",  # docs/_ext: figures, the backend matrix and the README quick start
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath", "amsmath"]
myst_heading_anchors = 3
# Without noundefined an unknown macro is a TeX error (mjx-merror), which docs/check_pages.py finds,
# rather than red text.
mathjax3_config = {"tex": {"packages": {"[-]": ["noundefined"]}}}

html_theme = "furo"
html_title = f"anyrope {release}"
html_static_path = ["_static"]
html_css_files = ["anyrope.css"]

numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_typehints = "none"  # numpydoc's Parameters sections already give the types
# The integrations import their libraries, which the docs environment does not install.
autodoc_mock_imports = ["torch", "mlx", "mlx_lm"]
autosummary_generate = False

nitpicky = True  # every cross-reference resolves, or the build (warnings as errors) fails
suppress_warnings = ["myst.header"]

# Docstring examples run as doctests here too (tests/test_dispatch.py runs them per module): the
# module's own names are in scope there, so they are here.
doctest_global_setup = """
import math
import numpy as np
import anyrope
from anyrope.analysis import *
from anyrope.reference import *
from anyrope.scaling import *
"""
doctest_default_flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS  # as the test suite's doctests
