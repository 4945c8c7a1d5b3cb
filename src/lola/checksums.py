"""sha256 of files: downloads (models, corpora), checkpoints and saved caches are checked with it."""

from __future__ import annotations

import hashlib
import os

__all__ = ["sha256_file"]


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
