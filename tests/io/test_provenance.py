"""The version has one source, the changelog names it, and lola records where a result came from."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import lola
from lola.io import provenance

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_has_one_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lola.io.provenance.__version__"}
    assert project["project"]["name"] == provenance.DISTRIBUTION
    assert lola.__version__ == provenance.__version__
    # The installed metadata (what pip shows) was read from the same place.
    assert metadata.version(provenance.DISTRIBUTION) == lola.__version__


def test_the_changelog_keeps_a_changelog_and_names_this_release():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.M)
    assert releases[0] == ("Unreleased", ""), "the changelog starts with an [Unreleased] section"
    assert releases[1][0] == lola.__version__ and releases[1][1], "the newest release is this version, with its date"
    kinds = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_versions_name_the_release_the_commit_and_what_ran():
    found = provenance.versions()
    assert set(found) == {"lola", "commit", "torch", "transformers", "python"} and found["lola"] == lola.__version__
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if done.returncode != 0 or not (ROOT / "src" / "lola" / "io" / "provenance.py").samefile(provenance.__file__):
        pytest.skip("lola does not run from this repository's git checkout")
    assert found["commit"].removesuffix("+dirty") == done.stdout.strip()


def test_a_package_outside_a_checkout_has_no_commit(tmp_path, monkeypatch):
    # An installed wheel (site-packages/lola) records its release only.
    monkeypatch.setattr(provenance, "_PACKAGE", tmp_path / "site-packages" / "lola")
    assert provenance.lola_commit.__wrapped__() is None
    # A folder laid out like a checkout but not one (no .git) neither.
    (tmp_path / "src" / "lola").mkdir(parents=True)
    monkeypatch.setattr(provenance, "_PACKAGE", tmp_path / "src" / "lola")
    assert provenance.lola_commit.__wrapped__() is None
