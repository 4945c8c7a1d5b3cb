"""The documentation cannot rot: its examples run, and its API reference names every export.

Every ```` ```python ```` block of the pages in ``PAGES`` is executed in order, in one namespace
per page, so later blocks may use what earlier blocks defined. A block directly preceded by a
``<!-- no-test -->`` line is skipped. Policies registered by a page are unregistered after it.
"""

from __future__ import annotations

import importlib
import re
import sys
import tempfile
import types
from pathlib import Path

import pytest

import lola

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted({DOCS / "index.md", DOCS / "quickstart.md", DOCS / "concepts.md", *DOCS.glob("guides/*.md")})
SKIP_MARK = "<!-- no-test -->"
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)[^`]*$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, source)`` of every ```` ```python ```` block not marked no-test."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].lower()
        start = i + 1
        j = start
        while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence)) and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        previous = next((lines[p].strip() for p in range(i - 1, -1, -1) if lines[p].strip()), "")
        if info in ("python", "py", "python3") and previous != SKIP_MARK:
            body = [line[len(m["indent"]) :] if line.startswith(m["indent"]) else line for line in lines[start:j]]
            blocks.append((start + 1, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def test_extraction() -> None:
    text = "x\n```python\na = 1\n```\n<!-- no-test -->\n```python\nraise SystemExit\n```\n```toml\n[a]\n```\n````python\nb = 2\n````\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (13, "b = 2\n")]


def test_pages_have_examples() -> None:
    assert (DOCS / "quickstart.md") in PAGES
    assert len(list(DOCS.glob("guides/*.md"))) >= 3
    for page in DOCS.glob("guides/*.md"):
        assert python_blocks(page.read_text(encoding="utf-8")), f"{page.name} has no python example"


def run_blocks(blocks: list[tuple[int, str]], name: str, where: str) -> None:
    """Execute ``blocks`` in order in one fresh module named ``name`` (``where``: the file, for
    messages); policies they register are unregistered afterwards."""
    module = types.ModuleType(name)
    module.__file__ = where
    sys.modules[module.__name__] = module  # dataclasses defined in the examples look it up
    registered = set(lola.policies.available())
    try:
        for line, source in blocks:
            code = compile(source, f"{where}:{line}", "exec")
            try:
                exec(code, module.__dict__)
            except Exception as err:
                raise AssertionError(f"the example at {where}, line {line}, failed: {err!r}") from err
    finally:
        for registered_name in set(lola.policies.available()) - registered:
            lola.policies.unregister(registered_name)
        del sys.modules[module.__name__]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip(f"{page.name} has no python blocks")
    # The examples make their folders with tempfile, as a reader would: inside tmp_path, so
    # that the test suite leaves nothing behind.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_blocks(blocks, f"lola_docs_{page.stem}", str(page.relative_to(DOCS)))


README = DOCS.parent / "README.md"


def test_readme_is_short_and_opens_with_an_example() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    blocks = python_blocks("\n".join(lines))
    assert len(lines) <= 150, f"the README has {len(lines)} lines; the rest belongs in docs/"
    assert blocks and blocks[0][0] <= 40, "the README's first runnable example must come within its first 40 lines"


def test_readme_holds_the_commands_ci_runs() -> None:
    """`.ci/run` reads the README: its first bash block (set-up, then tests) and the bash block of
    "## Documentation" (the docs build). A README edit that loses either would break CI."""
    text = README.read_text(encoding="utf-8")
    bash = re.findall(r"^```bash\n(.*?)^```$", text, flags=re.S | re.M)
    first = bash[0].strip().splitlines()
    assert len(first) == 2 and "pip install" in first[0] and "pytest" in first[1]
    docs = re.search(r"^## Documentation$.*?^```bash\n(.*?)^```$", text, flags=re.S | re.M)
    assert docs and "sphinx-build" in docs.group(1)


@pytest.mark.model
def test_readme_examples_run() -> None:
    """The README's examples run as written (the first loads the real model, as the README's
    first command does)."""
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "the README has no python example"
    run_blocks(blocks, "lola_readme", "README.md")


API_PAGES = {
    "lola": "lola.rst",
    "lola.memory": "memory.rst",
    "lola.policies": "policies.rst",
    "lola.budgets": "budgets.rst",
    "lola.schedules": "schedules.rst",
    "lola.core": "core.rst",
    "lola.feature_maps": "feature_maps.rst",
    "lola.feature_maps.registry": "feature_maps.rst",
    "lola.kernels": "kernels.rst",
    "lola.integrations.transformers": "integrations.rst",
    "lola.integrations.transformers.model_record": "integrations.rst",
    "lola.pretrained": "pretrained.rst",
    "lola.pretrained.geometry": "pretrained.rst",
    "lola.pretrained.folder": "pretrained.rst",
    "lola.pretrained.lora": "pretrained.rst",
    "lola.limits": "lola.rst",
    "lola.memory.allocation": "lola.rst",
    "lola.engine.state_pages": "lola.rst",
    "lola.integrations.lm_eval": "lm_eval.rst",
    "lola.integrations.lm_eval.model": "lm_eval.rst",
    "lola.integrations.lm_eval.niah": "lm_eval.rst",
    "lola.models": "models.rst",
    "lola.io.checksums": "models.rst",
    "lola.io.paths": "models.rst",
    "lola.registry": "schedules.rst",
    "lola.io.outputs": "models.rst",
    "lola.data.text": "data.rst",
    "lola.data.corpora": "data.rst",
    "lola.pretrained.shipped": "pretrained.rst",
    "lola.linearize.distributed": "linearize.rst",
    "lola.linearize.training_attention": "linearize.rst",
    "lola.eval.generation": "eval.rst",
    "lola.eval.state_probe": "eval.rst",
    "lola.eval.budget_sweep": "eval.rst",
    "lola.eval": "eval.rst",
    "lola.methods": "eval.rst",
    "lola.linearize": "linearize.rst",
}


@pytest.mark.parametrize("module", sorted(API_PAGES))
def test_api_reference_names_every_public_name(module: str) -> None:
    text = (DOCS / "api" / API_PAGES[module]).read_text(encoding="utf-8")
    names = importlib.import_module(module).__all__
    # A bare name (as in autosummary lists and directives) or one qualified by the module.
    missing = [n for n in names if not re.search(rf"((?<![\w.])|{re.escape(module)}\.){re.escape(n)}\b", text)]
    assert not missing, f"docs/api/{API_PAGES[module]} does not mention {missing} from {module}.__all__"


def test_design_names_the_job_of_every_top_level_package_and_module() -> None:
    """docs/design.md's "The packages" gives each entry of ``src/lola/`` its one-line job: a
    package or module added, moved or renamed without it fails here."""
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    block = text.split("## The packages", 1)[1].split("```", 2)[1]
    src = Path(lola.__file__).resolve().parent
    entries = [p.name + "/" for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    entries += [p.name for p in src.glob("*.py") if p.name != "__init__.py"]
    missing = [e for e in sorted(entries) if not re.search(rf"(?<![\w/]){re.escape(e)}", block)]
    assert not missing, f"docs/design.md's package list lacks {missing}"
    assert len([p for p in src.glob("*.py") if p.name != "__init__.py"]) <= 10, "src/lola/ holds at most 10 top-level modules"
