"""Append-only record files (JSON Lines) that a run resumes from.

Each record is one line, written with its newline in one call and flushed, so a kill leaves at
most the last line cut short (no newline). A resume drops that cut line before appending (its
sample runs again) instead of appending to it, which would join two records into one line
that no later run can read.

Record files are plain files of the run's folder: :func:`open_record_file` opens one refusing a
symbolic link (read or appended through, it would be someone else's file) and anything that is
not a regular file (a FIFO would block the run forever, a device or folder is no record file),
without ever blocking on the open. Every reader and appender of records goes through it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import IO, Any

__all__ = ["append_record", "complete_lines", "drop_cut_record", "open_record_file", "read_checked_records", "read_record_file"]


def complete_lines(text: str) -> list[str]:
    """The lines of ``text`` that were written whole: all but a last one without its newline."""
    lines = text.split("\n")
    return lines[:-1]  # the piece after the last newline is empty, or a record cut short


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_plain(path: Path, flags: int, writer: str) -> int:
    """A descriptor of the regular file ``path`` opened with ``flags`` (never following a link,
    never blocking); ``ValueError`` naming the file when it is a link or not a regular file."""
    how = f"{writer} keeps its records only in a plain file of its folder: remove it, or use another --out"
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP or path.is_symlink():
            raise ValueError(f"{path} is a symbolic link; {how}") from None
        if err.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV):
            kind = _kind(os.lstat(path).st_mode) if path.exists() else "not a regular file"
            raise ValueError(f"{path} is {kind}, not a record file; {how}") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is {_kind(info.st_mode)}, not a record file; {how}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_record_file(path: str | os.PathLike, writer: str = "lola") -> bytes | None:
    """The bytes of the record file ``path``, ``None`` when there is none; a link or anything
    but a regular file is refused (:func:`open_record_file`)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    with os.fdopen(_open_plain(path, os.O_RDONLY, writer), "rb") as f:
        return f.read()


def open_record_file(path: str | os.PathLike, writer: str = "lola") -> IO[str]:
    """``path`` opened for appending records (created if missing), as text.

    Refused with ``ValueError`` naming the file: a symbolic link (appending would write into its
    target) and anything that is not a regular file (a FIFO, a folder, a device), found without
    blocking. A file with other hard links (a ``cp -al`` snapshot) is first rewritten as this
    folder's own, so that appending does not write into every copy.
    """
    path = Path(path)
    fd = _open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, writer)
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        from lola.io.outputs import write_files

        data = read_record_file(path, writer) or b""
        write_files(path.parent, {path.name: data}, writer=writer, record=False)
        fd = _open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, writer)
    return os.fdopen(fd, "a", encoding="utf-8")


def drop_cut_record(path: str | os.PathLike, writer: str = "lola") -> bool:
    """Remove a last line cut short (no newline) from ``path``, in place; whether one was there.

    Called by the run that holds the folder (:func:`lola.io.outputs.run_lock`) before it appends.
    A link or a file that is not regular is refused (:func:`open_record_file`), never truncated
    through or waited on; a file with other hard links is replaced, not cut in every copy.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return False
    fd = _open_plain(path, os.O_RDWR, writer)
    with os.fdopen(fd, "r+b") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        if os.fstat(f.fileno()).st_nlink > 1:  # a hard link: cut this folder's own copy, not every copy
            from lola.io.outputs import write_files

            write_files(path.parent, {path.name: data[: data.rfind(b"\n") + 1]}, writer=writer, record=False)
            return True
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True


def append_record(log: IO[str], record: dict[str, Any]) -> None:
    """Write ``record`` as one line of ``log`` (opened for appending) and flush it to the file."""
    log.write(json.dumps(record) + "\n")
    log.flush()
    os.fsync(log.fileno())


def read_checked_records(
    path: str | os.PathLike,
    schema: Any,
    context: dict[str, Any],
    *,
    writer: str,
    what: str,
    hint: str,
) -> dict[tuple[str, int, int], dict]:
    """The finished records of ``path`` by ``(method, length, index)``, each validated by the
    pydantic model ``schema`` with ``context`` (its validators check the record against the run).

    A last line cut short by a kill is no record (the run that resumes drops it and redoes that
    sample). Any other line that is not JSON, has a key twice, is refused by ``schema`` or
    repeats a sample is an error naming the file and the line(s), described as ``what`` (``"lola
    niah sample"``) and ending with ``hint`` (what the user can do). The file must be a plain file
    (:func:`read_record_file`); none gives ``{}``. Each record keeps its fields, with ``method``
    by the name ``schema`` resolves it to (a renamed method reads by today's name).
    """
    from pydantic import ValidationError

    from lola.errors import describe_validation
    from lola.io.outputs import _unique_keys

    data = read_record_file(path, writer)
    if data is None:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a {writer} records file: not UTF-8 text ({err.reason} at byte {err.start}); {hint}") from None
    done: dict[tuple[str, int, int], dict] = {}
    lines: dict[tuple[str, int, int], int] = {}
    for number, line in enumerate(complete_lines(text), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not a JSON record ({err.msg}); delete that line to redo that sample, or {hint}") from None
        except ValueError as err:  # a key given twice: json would keep the last silently
            raise ValueError(f"{path}: line {number} is not a {what} ({err}); delete that line to redo that sample, or {hint}") from None
        try:
            checked = schema.model_validate(record, context=context)
        except ValidationError as err:
            raise ValueError(
                f"{path}: line {number} is not a {what} of this run ({describe_validation(err)}); delete that line to redo that sample, or {hint}"
            ) from None
        record["method"] = checked.method
        key = (checked.method, checked.length, checked.index)
        if key in lines:  # two answers to one sample: neither can be trusted over the other
            raise ValueError(
                f"{path}: line {number} repeats sample {key[2]} of {key[0]} at length {key[1]} (first on line {lines[key]}); delete the line that is wrong, or {hint}"
            )
        lines[key] = number
        done[key] = record
    return done
