"""Where lola keeps what it fetches: the user cache of models and corpora."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """Where fetched models and corpora live: ``$LOLA_CACHE``, else ``$XDG_CACHE_HOME/lola``, else ``~/.cache/lola``."""
    if os.environ.get("LOLA_CACHE"):
        return Path(os.environ["LOLA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lola"
