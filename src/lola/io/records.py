"""Append-only record files (JSON Lines) that a run resumes from.

Each record is one line, written with its newline in one call and flushed, so a kill leaves at
most the last line cut short (no newline). A resume drops that cut line before appending (its
sample runs again) instead of appending to it, which would join two records into one line
that no later run can read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

__all__ = ["append_record", "complete_lines", "drop_cut_record"]


def complete_lines(text: str) -> list[str]:
    """The lines of ``text`` that were written whole: all but a last one without its newline."""
    lines = text.split("\n")
    return lines[:-1]  # the piece after the last newline is empty, or a record cut short


def drop_cut_record(path: str | os.PathLike) -> bool:
    """Remove a last line cut short (no newline) from ``path``, in place; whether one was there.

    Called by the run that holds the folder (:func:`lola.io.outputs.run_lock`) before it appends.
    """
    path = Path(path)
    if not path.is_file():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True


def append_record(log: IO[str], record: dict[str, Any]) -> None:
    """Write ``record`` as one line of ``log`` (opened for appending) and flush it to the file."""
    log.write(json.dumps(record) + "\n")
    log.flush()
    os.fsync(log.fileno())
