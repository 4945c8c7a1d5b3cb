"""Output paths of the ``lola`` commands, checked before any expensive work.

A command's ``--out`` must be somewhere it can write (not a file where a folder is wanted, not a
read-only place), and a command never writes over a file it did not create: each one
recognises its own files by a format marker and refuses anything else, naming the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["check_output_file", "check_output_folder", "read_json"]


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")  # pragma: no cover - the root always exists


def _probe_writable(folder: Path, option: str, target: Path) -> None:
    """Create and remove an empty folder in ``folder``; refuse ``target`` if that fails.

    A real write is the only reliable test: ``os.access`` says yes to root on a read-only
    file system such as ``/sys``.
    """
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lola-write-check-", dir=folder))
    except OSError as err:
        raise ValueError(f"{option} {target}: cannot write in {folder} ({err.strerror or err})") from None


def check_output_folder(path: str | os.PathLike, option: str = "--out") -> Path:
    """Refuse an output folder that is a file, lies under a file, or cannot be written to.

    Nothing is created: the folder's nearest existing ancestor is only probed with an empty
    folder that is removed at once.

    Args:
        path: the folder a command will write to.
        option: the command-line option that named it (for the message).

    Raises:
        ValueError: naming ``option``, the path and what is wrong.
    """
    target = Path(path)
    existing = _nearest_existing(target)
    if not existing.is_dir():
        where = "is a file" if existing == target else f"lies under {existing}, which is a file"
        raise ValueError(f"{option} {target} {where}, not a folder")
    _probe_writable(existing, option, target)
    return target


def check_output_file(path: str | os.PathLike, option: str = "--out", ours: Any = None, writer: str = "lola") -> Path:
    """Refuse an output file that is a folder, cannot be written, or exists and is not ours.

    Args:
        path: the file a command will write.
        option: the command-line option that named it.
        ours: ``ours(path) -> bool``: whether an existing file was written by this command (it
            may then be replaced); ``None`` refuses every existing file.
        writer: the command, for the message.

    Raises:
        ValueError: naming ``option``, the path and what is wrong.
    """
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{option} {target} is a folder; give a file name")
    check_output_folder(target.parent, option)
    if target.exists() and (ours is None or not ours(target)):
        raise ValueError(f"{option} {target} exists and was not written by {writer}; move it away or choose another {option}")
    return target


def read_json(path: Path, what: str) -> Any:
    """The JSON in ``path``; a truncated, garbled or non-UTF-8 file is a ``ValueError`` naming it.

    Args:
        path: the file.
        what: what the file should be, for the message (e.g. ``"a lola niah results file"``).
    """
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not {what}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not {what}: invalid JSON, truncated or garbled ({err.msg} at line {err.lineno} column {err.colno})") from None
