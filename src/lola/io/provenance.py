"""What produced a file: lola's release and commit, and the versions of what it ran with.

Every ``results.json``, report and saved state that lola writes records :func:`versions`, so
that a number can be traced to the code that made it. ``__version__`` below is the one source
of the version (the package metadata reads it at build time, ``pyproject.toml``'s ``dynamic``).
"""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "__version__", "lola_commit", "versions"]

__version__ = "0.1.0"

DISTRIBUTION = "lola-attention"
"""The name lola is installed by (``pip install lola-attention``); the import name is ``lola``."""

_PACKAGE = Path(__file__).resolve().parent.parent  # the lola package


@functools.cache
def lola_commit() -> str | None:
    """The git commit lola runs from, ``+dirty`` when its tracked sources differ from it.

    Only a source checkout has one (an editable install, or ``src`` on the path): the package's
    own folder must be ``src/lola`` of the work tree that git names. An installed wheel has no
    commit (``None``): its release is its version.
    """
    root = _PACKAGE.parent.parent
    if _PACKAGE.parent.name != "src" or not (root / ".git").exists():
        return None

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top, commit = git("rev-parse", "--show-toplevel"), git("rev-parse", "HEAD")
    if top is None or commit is None or Path(top).resolve() != root:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "src")
    return commit + ("+dirty" if changed else "")


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """lola's version and commit, and torch's, transformers' (``None`` without it) and Python's."""
    import torch

    return {
        "lola": __version__,
        "commit": lola_commit(),
        "torch": torch.__version__,
        "transformers": _installed("transformers"),
        "python": platform.python_version(),
    }
