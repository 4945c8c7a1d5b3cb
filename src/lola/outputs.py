"""Output paths of the ``lola`` commands, checked before any expensive work, and the one way
lola writes files.

A command's ``--out`` must be somewhere it can write (not a file where a folder is wanted, not a
read-only place), and a command never writes over a file it did not create: each one
recognises its own files by a format marker and refuses anything else, naming the file.

Every file lola writes goes through :func:`write_files`: each file is written to a fresh
temporary name beside it (created exclusively, never a name another process may have left)
and moved into place with an atomic rename, in the order given; a link or a foreign file in a
target's place is refused before anything is written; on any failure the temporary files are
removed and the previous files are left as they were. A group whose files must agree (a cache:
tensors and their description) puts the file that names the others last and gives the others
names of their own content, so that a kill between two renames leaves the previous group whole.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

__all__ = ["FileContent", "TEMP_PREFIX", "check_output_file", "check_output_folder", "check_target", "read_json", "write_files"]

TEMP_PREFIX = ".lola-tmp-"
"""Temporary files of :func:`write_files` start with this (a kill can leave one; it is never read)."""

FileContent = Union[bytes, str, Callable[[Path], None]]
"""What :func:`write_files` writes: bytes, text (UTF-8), or a function that writes the file at
the path it is given (``safetensors.torch.save_file``, ``torch.save``, ``Figure.savefig``)."""


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
    if target.is_symlink():
        raise ValueError(f"{option} {target} is a symbolic link; {writer} does not write through links (remove it or choose another {option})")
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


def check_target(path: Path, ours: Callable[[Path], bool] | None = None, writer: str = "lola") -> None:
    """Refuse to write ``path`` if it is a link, not a plain file, or a file that is not ours.

    Args:
        path: a file about to be replaced.
        ours: ``ours(path) -> bool`` says whether an existing file was written by this writer;
            ``None`` accepts any existing plain file (the caller checked the folder as a whole).
        writer: who writes it, for the message.

    Raises:
        ValueError: naming the file and what is wrong.
    """
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; {writer} does not write through links (remove it or choose another place)")
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} exists and is not a plain file; {writer} will not replace it")
    if path.exists() and ours is not None and not ours(path):
        raise ValueError(f"{path} exists and was not written by {writer}; move it away or choose another place")


def write_files(
    folder: str | os.PathLike,
    files: Mapping[str, FileContent],
    ours: Callable[[Path], bool] | None = None,
    writer: str = "lola",
    remove: Sequence[str] = (),
) -> list[Path]:
    """Write a group of files into ``folder``, each atomically, in the order given.

    Every target is checked first (:func:`check_target`); then every file is written to a
    temporary name in ``folder`` and synced; only when all are written are they renamed into
    place, in order (put the file that describes or names the others last). Files named in
    ``remove`` are deleted after the last rename (superseded parts of the group).

    Args:
        folder: the folder (created with its parents if missing; a link to a folder is followed).
        files: ``{file name: content}``; names are plain file names, no paths.
        ours: whether an existing file may be replaced (see :func:`check_target`).
        writer: who writes, for messages.
        remove: plain file names to delete once the group is in place (missing ones are fine).

    Returns:
        The paths written, in order.

    Raises:
        ValueError: a bad name, a link or foreign file in a target's place, or a folder that
            cannot be created; nothing was written then.
    """
    folder = Path(folder)
    for name in (*files, *remove):
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"{writer}: {name!r} is not a plain file name")
    targets = [folder / name for name in files]
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder; {writer} writes its files into a folder")
    for target in targets:
        check_target(target, ours, writer)
    folder.mkdir(parents=True, exist_ok=True)
    temps: list[Path] = []
    try:
        for name, content in files.items():
            fd, tmp_name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{name}.", dir=folder)
            tmp = Path(tmp_name)
            temps.append(tmp)
            if callable(content):
                os.close(fd)
                content(tmp)
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(content.encode("utf-8") if isinstance(content, str) else bytes(content))
            _sync(tmp)
        for tmp, target in zip(temps, targets):
            check_target(target, ours, writer)  # nothing swapped in while the files were written
            os.replace(tmp, target)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    for name in remove:
        stale = folder / name
        if name not in files and stale.is_file() and not stale.is_symlink():
            stale.unlink()
    _sync_folder(folder)
    return targets


def _sync(path: Path) -> None:
    """Flush ``path`` to disk, so that a rename never exposes a file whose data is not there."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entries (the renames); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)
