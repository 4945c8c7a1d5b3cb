"""Sphinx configuration of the lola documentation.

Build (from the repository root)::

    PYTHONPATH=src sphinx-build -W --keep-going -b html docs docs/_build/html

The build is offline by default. ``LOLA_DOCS_ONLINE=1`` enables intersphinx links to the
Python, PyTorch and transformers documentation (their inventories are fetched at build time).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# autodoc imports lola from the source tree, whether or not it is installed.
sys.path.insert(0, str(ROOT / "src"))

import lola  # noqa: E402

# -- project ---------------------------------------------------------------------------------
project = "lola"
author = "the lola authors"
copyright = "the lola authors, Apache-2.0"
release = lola.__version__
version = ".".join(release.split(".")[:2])

# -- general ---------------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.mathjax",
    "sphinx.ext.intersphinx",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []
pygments_style = "sphinx"
pygments_dark_style = "monokai"

# -- MyST (Markdown) -------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links to h1–h3

# -- autodoc / napoleon ----------------------------------------------------------------------
# No default "members": a default of True would override the explicit member lists below.
autodoc_default_options = {
    "undoc-members": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "mixed"
autodoc_inherit_docstrings = True
autosummary_generate = False  # the API pages list their names by hand
# lola.integrations.lm_eval.model subclasses lm-eval's HFLM; lm-eval is in the dev and eval
# extras, not in docs: without it, autodoc documents the module against a mock.
try:
    import lm_eval  # noqa: F401
except ImportError:
    autodoc_mock_imports = ["lm_eval"]

napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" sections become :ivar: fields, so dataclass fields are not described twice.
napoleon_use_ivar = True
napoleon_use_rtype = False

# -- intersphinx: only when asked (the default build needs no network) ------------------------
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
if os.environ.get("LOLA_DOCS_ONLINE") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "torch": ("https://docs.pytorch.org/docs/stable", None),
        "transformers": ("https://huggingface.co/docs/transformers/main/en", None),
    }
# Offline, names of other projects cannot be linked: keep nitpicky (-n) builds quiet about them.
if not intersphinx_mapping:
    nitpick_ignore_regex = [(r"py:.*", r"(torch|pydantic|transformers)\..*")]

# -- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"lola {release}"
html_static_path: list[str] = []
html_show_sourcelink = False


# -- docstring conventions -------------------------------------------------------------------
def _no_inline_attribute_type(app, what, name, obj, options, lines):
    """Property docstrings here start like "``[B, Hs, N]`` bool: slots that hold a token.".

    Napoleon would read the text before the colon as the property's type; the types come from
    the annotations instead. A leading empty comment (``..``) turns that parsing off.
    """
    if what in ("property", "attribute") and lines and lines[0].strip():
        lines[:0] = ["..", ""]


def _no_builtin_type_docstring(app, what, name, obj, options, lines):
    """Module constants (``ENV_VAR = "LOLA_KERNELS"``) would show the docstring of ``str`` or
    ``tuple``; the API pages describe them in the directive's content instead."""
    if what == "data" and type(obj).__module__ == "builtins":
        lines.clear()


def setup(app):
    # Before napoleon (priority 500) rewrites the docstring.
    app.connect("autodoc-process-docstring", _no_inline_attribute_type, priority=400)
    app.connect("autodoc-process-docstring", _no_builtin_type_docstring)
