"""Figures lola writes, and how it recognises its own before replacing one.

A PNG lola writes carries ``Software: lola <version>`` in a text chunk (:func:`save_png`);
:func:`is_lola_png` reads it back, so a command re-run into its folder replaces its own figure
and refuses someone's file of the same name. Figures written before lola marked them say
``Software: Matplotlib …``: those count as lola's only in a folder whose results file is lola's
(the caller says so).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["check_figures", "figure_is_ours", "is_lola_png", "png_software", "save_png"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def save_png(fig: Any, path: str | os.PathLike, dpi: int) -> None:
    """``fig.savefig`` as a PNG marked as lola's (``Software: lola <version>``)."""
    from lola.io.provenance import __version__

    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": f"lola {__version__}"})


def png_software(path: str | os.PathLike) -> str | None:
    """The ``Software`` text of the PNG at ``path``, or ``None`` (no such chunk, not a PNG, unreadable)."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != _SIGNATURE:
                return None
            for _ in range(64):  # text chunks come before the image data
                head = f.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                if kind == b"IDAT" or kind == b"IEND" or length > 1 << 20:
                    return None
                data = f.read(length)
                f.read(4)  # CRC
                if kind == b"tEXt" and data.startswith(b"Software\x00"):
                    return data[len(b"Software\x00") :].decode("latin-1")
    except OSError:
        return None
    return None


def is_lola_png(path: str | os.PathLike, folder_is_lola_s: bool = False) -> bool:
    """Whether the PNG at ``path`` is a figure lola wrote (and may replace): marked as lola's, or
    an unmarked Matplotlib figure in a folder whose results lola wrote (``folder_is_lola_s``)."""
    software = png_software(Path(path)) or ""
    return software.startswith("lola ") or (folder_is_lola_s and software.startswith("Matplotlib"))


def check_figures(folder: str | os.PathLike, names: list[str], results_file: str, writer: str) -> None:
    """Refuse a run into ``folder`` that would replace a figure lola did not write, before any
    work: each of ``names`` present must be lola's (:func:`is_lola_png`; an unmarked Matplotlib
    figure is taken as lola's only if ``results_file`` was already there, the folder's results
    being lola's: the command checks those itself).

    Raises:
        ValueError: naming the file.
    """
    folder = Path(folder)
    ours_before = (folder / results_file).is_file()
    for name in names:
        path = folder / name
        if path.is_symlink() or (path.exists() and not (path.is_file() and is_lola_png(path, ours_before))):
            raise ValueError(
                f"{writer}: {path} exists and was not written by {writer} (it would be replaced by the run's figure); move it away or choose another --out"
            )


def figure_is_ours(path: Path) -> bool:
    """The ``ours`` of a figure written at the end of a run (its folder's results are lola's by then)."""
    return is_lola_png(path, folder_is_lola_s=True)
