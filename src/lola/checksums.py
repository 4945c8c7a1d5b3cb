"""sha256 of files: downloads (models, corpora), checkpoints and saved caches are checked with it;
and the fingerprints of a run's inputs, by content, so that a resumed run never mixes two inputs
that share a path."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["changed_inputs", "content_digest", "sha256_file"]


def sha256_file(path: str | os.PathLike, progress: bool = False) -> str:
    """The hex sha256 of the file at ``path``, read in 1 MiB blocks (a tqdm bar with ``progress``)."""
    digest = hashlib.sha256()
    size = os.path.getsize(path)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"checking {os.path.basename(path)}", leave=False, disable=None)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                if bar is not None:
                    bar.update(len(block))
    finally:
        if bar is not None:
            bar.close()
    return digest.hexdigest()


def content_digest(path: str | os.PathLike) -> str:
    """The sha256 of what ``path`` holds: a file's bytes, or for a folder every file under it
    (names relative to it, sorted, with their bytes); the path itself does not count.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if not p.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    digest = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        digest.update(f"{f.relative_to(p).as_posix()}\0{sha256_file(f)}\n".encode())
    return digest.hexdigest()


def changed_inputs(saved: Mapping[str, object] | None, current: Mapping[str, object]) -> list[str]:
    """The names whose fingerprint differs between a saved run and this one (a name the saved
    run did not record is not compared: runs from before fingerprints resume as they did)."""
    if not isinstance(saved, Mapping):
        return []
    return sorted(k for k, v in current.items() if k in saved and saved[k] != v)
