"""Output paths of the ``lola`` commands, checked before any expensive work, and the one way
lola writes files.

A command's ``--out`` must be somewhere it can write (not a file where a folder is wanted, not a
read-only place), and a command never writes over a file it did not create: each one
recognises its own files by a format marker and refuses anything else, naming the file.

Every file lola writes goes through :func:`write_files`: each file is written to a fresh
temporary name beside it (created exclusively, never a name another process may have left)
and moved into place with an atomic rename, in the order given; a link or a foreign file in a
target's place is refused before anything is written; on any failure the temporary files are
removed and the previous files are left as they were.

A group of files that must agree (feature maps and their description, a checkpoint and its
checksum) is committed by a journal: once every temporary file is written, ``.lola-pending.json``
lists the renames still to do, and is removed after the last one. A kill between two renames
leaves the journal; the next :func:`write_files` into that folder, and every lola reader of a
group (:func:`finish_pending`), completes the renames first, so a reader sees the whole
previous group or the whole new one. A group read by another program (an lm-eval task) gives
its data files names of their own content and puts the file that names them last instead.

Writers into one folder take turns: a write (and the recovery of a cut one) holds an exclusive
lock on the folder itself (``flock`` of the folder, so no lock file appears among its files),
waiting up to :data:`LOCK_WAIT` seconds for another process's write to finish before saying
that the folder is busy. Holding it, a writer also removes the temporary files a killed
writer left behind (each can be a whole copy of a saved state): no other lola writer can be
using them then.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union

__all__ = [
    "FileContent",
    "FolderBusy",
    "LOCK_WAIT",
    "PENDING_FILE",
    "RUN_FILE",
    "TEMP_PREFIX",
    "WRITTEN_FILE",
    "written_record",
    "check_free",
    "check_held",
    "check_output_file",
    "check_output_folder",
    "check_regular_file",
    "check_target",
    "file_mode",
    "output_lock",
    "finish_pending",
    "folder_lock",
    "read_json",
    "read_mapping",
    "run_lock",
    "write_files",
]

TEMP_PREFIX = ".lola-tmp-"
"""Temporary files of :func:`write_files` start with this (a kill can leave one; it is never read)."""

PENDING_FILE = ".lola-pending.json"
"""The journal of a group write: ``{"renames": [[temporary name, file name, the state it replaces], …],
"remove": [...]}``; a file whose state (inode, size, modification time) differs from the one
recorded is someone's since, and is never replaced by recovery."""

LOCK_WAIT = 60.0
"""Seconds a write waits for another process's write into the same folder before refusing."""

WRITTEN_FILE = ".lola-files.json"
"""What lola wrote into a folder: ``{"format": "lola-files", "files": {name: {"sha256": …,
"writer": …}}}``, updated by every :func:`write_files` as the last file of its group (so the
record and the files change together). A listed file whose content no longer has its recorded
digest was changed by someone since: :func:`write_files` refuses to replace it (their edit
would be lost). Record files appended to line by line (``samples.jsonl``) are not listed."""

RUN_FILE = ".lola-run.json"
"""Who holds a folder for a whole run (:func:`run_lock`): its pid, command and start time."""

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
    folder that is removed at once. A write into the folder that a kill cut short is completed
    first (:func:`finish_pending`), so that a journal lola cannot finish is refused now, not
    when the command writes its results.

    Args:
        path: the folder a command will write to.
        option: the command-line option that named it (for the message).

    Raises:
        ValueError: naming ``option``, the path and what is wrong.
    """
    _check_not_empty(path, option)
    target = Path(path)
    existing = _nearest_existing(target)
    if not existing.is_dir():
        where = "is a file" if existing == target else f"lies under {existing}, which is a file"
        raise ValueError(f"{option} {target} {where}, not a folder")
    _probe_writable(existing, option, target)
    if existing == target:
        finish_pending(target)
    return target


def _check_not_empty(path: object, option: str) -> None:
    """Refuse an empty path: ``Path("")`` is the current folder, which nobody meant."""
    if isinstance(path, str) and not path.strip():
        raise ValueError(f"{option} is empty: give a path")


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
    _check_not_empty(path, option)
    target = Path(path)
    if target.is_symlink():
        raise ValueError(f"{option} {target} is a symbolic link; {writer} does not write through links (remove it or choose another {option})")
    if target.is_dir():
        raise ValueError(f"{option} {target} is a folder; give a file name")
    check_output_folder(target.parent, option)
    if target.exists() and not target.is_file():  # a FIFO or a device: reading it to test `ours` would block
        raise ValueError(f"{option} {target} exists and is not a plain file; give the name of a file to write")
    if target.exists() and (ours is None or not ours(target)):
        raise ValueError(f"{option} {target} exists and was not written by {writer}; move it away or choose another {option}")
    return target


def read_json(path: Path, what: str) -> Any:
    """The JSON in ``path``; a truncated, garbled or non-UTF-8 file is a ``ValueError`` naming it.

    Args:
        path: the file.
        what: what the file should be, for the message (e.g. ``"a lola niah results file"``).
    """
    check_regular_file(path, what)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not {what}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    lead = f"{path} is not {what}:"
    return _parse_json(text, invalid=f"{lead} invalid JSON, truncated or garbled", too_deep=f"{lead} it nests too deeply", twice=lead)


def _parse_json(text: str, *, invalid: str, too_deep: str, twice: str) -> Any:
    """``json.loads(text)`` refusing a key given twice (json would keep the last silently); each
    way it fails is a ``ValueError`` with the caller's words, so that every reader names its file.

    Args:
        text: the JSON.
        invalid: the message for text that is not JSON; the parser's reason and place follow.
        too_deep: the message for JSON nested deeper than Python's recursion limit.
        twice: what comes before the message naming the key given twice.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise ValueError(f"{invalid} ({err.msg} at line {err.lineno} column {err.colno})") from None
    except ValueError as err:  # a key given twice
        raise ValueError(f"{twice} {err}") from None
    except RecursionError:
        raise ValueError(too_deep) from None


def read_mapping(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The mapping in a JSON or YAML (``.yaml``/``.yml``) file of options, read the one way
    every user file of options is read: a regular file, UTF-8, valid, a mapping with string
    keys, none given twice (both parsers would keep the last).

    Args:
        path: the file.
        what: how the user named it, for messages (``"--config"``, ``"model_args lola_config"``).

    Raises:
        FileNotFoundError: no such file. ValueError: anything else wrong, naming ``what`` and
        the file, with the line where the parser stopped.
    """
    _check_not_empty(path, what)
    if not Path(path).exists():
        raise FileNotFoundError(f"{what} {path}: No such file or directory")
    path = check_regular_file(path, f"{what}: a JSON or YAML file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{what} {path} is not a text file ({err.reason} at byte {err.start})") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader
        except RecursionError:
            raise ValueError(f"{what} {path} nests too deeply to be a file of options") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            raise ValueError(f"{what} {path} is not valid YAML ({getattr(err, 'problem', None) or type(err).__name__}{where})") from None
    else:
        data = _parse_json(
            text, invalid=f"{what} {path} is not valid JSON", too_deep=f"{what} {path} nests too deeply to be a file of options", twice=f"{what} {path}:"
        )
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} must hold a mapping of options, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ValueError(f"{what} {path}: option names must be strings, got {bad[0]!r}")
    return data


def _unique_key_loader() -> Any:
    """A YAML ``SafeLoader`` that refuses a key given twice in a mapping."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            # An alias re-uses a node: a few KB of aliases expand to 10**8 values (a "billion
            # laughs"); files of options never need one.
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in files of options", event.start_mark)
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is an error (``json`` keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def check_regular_file(path: str | os.PathLike, what: str = "a file") -> Path:
    """Refuse to read ``path`` unless it is a regular file: a FIFO would block the reader, a
    device would never end, a folder has no text.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: something that is not a regular file (named, with ``what`` was expected).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (expected {what})")
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a pipe, socket or device)"
        raise ValueError(f"{path} is {kind}; expected {what}")
    return path


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


class FolderBusy(ValueError):
    """Another process holds the folder's lock."""


@contextmanager
def run_lock(folder: str | os.PathLike, writer: str) -> Iterator[None]:
    """Hold ``folder`` (created if missing) for a whole run: a second run on the same folder,
    in this process or another, is refused at once, naming the folder and the run that holds
    it (two runs appending to one record file would each redo the other's samples).

    The lock is :func:`folder_lock`'s (so the run's own writes re-enter it); the holder is
    described in :data:`RUN_FILE` for the message, and that file is removed at the end.

    Raises:
        ValueError: another run holds the folder.
    """
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    if getattr(_held, "folders", {}).get(key):  # this thread already runs in it: a run inside a run
        raise ValueError(f"{writer}: {folder} is already in use by a run of this process; choose another folder")
    holder = folder / RUN_FILE
    lock = folder_lock(folder, writer, wait=0)
    try:
        lock.__enter__()
    except FolderBusy:
        try:
            who = json.loads(holder.read_text()) if holder.is_file() and not holder.is_symlink() else None
            desc = f"{who['command']} (pid {who['pid']}, started {who['started']})"
        except (OSError, ValueError, KeyError, TypeError):
            desc = "another process"
        raise ValueError(f"{writer}: {folder} is in use by {desc}; wait for it to finish, or write to another folder") from None
    folder_fd = None
    try:
        _write_holder(holder, {"pid": os.getpid(), "command": writer, "started": time.strftime("%Y-%m-%d %H:%M:%S")})
        folder_fd = os.open(folder, os.O_RDONLY)
        st = os.fstat(folder_fd)
        _runs[str(folder)] = (st.st_dev, st.st_ino, writer)
        yield
    finally:
        _runs.pop(str(folder), None)
        if folder_fd is not None:  # the description goes wherever the folder went (moved, or deleted)
            try:
                os.unlink(RUN_FILE, dir_fd=folder_fd)
            except (FileNotFoundError, NotImplementedError):
                pass
            os.close(folder_fd)
        lock.__exit__(None, None, None)
        if created and folder.is_dir() and not any(folder.iterdir()):  # a run refused before writing leaves no folder behind
            folder.rmdir()


_runs: dict[str, tuple[int, int, str]] = {}  # folders held by run_lock in this process: {path: (device, inode, writer)}


def check_held(folder: str | os.PathLike) -> None:
    """Refuse to go on writing into a run's folder (:func:`run_lock`) that was deleted or moved
    while the run held it: records appended since went with the old folder (or nowhere), and
    writing by its name would start a second, partial copy elsewhere. A folder no run of this
    process holds passes.

    Raises:
        RuntimeError: naming the folder and what happened.
    """
    held = _runs.get(str(folder))
    if held is None:
        return
    try:
        st = os.stat(folder)
        same = (st.st_dev, st.st_ino) == held[:2]
    except OSError:
        same = False
    if not same:
        raise RuntimeError(
            f"{held[2]}: the output folder {folder} was deleted or moved while the run was writing into it; "
            "nothing more is written by its name (the records saved so far are where the folder went): run again with --out naming where it is now"
        )


def _write_holder(holder: Path, record: dict) -> None:
    """Write the run's description into ``holder`` as a plain file of this folder: never through
    a link, never into a FIFO or a device (a FIFO nobody reads would block the run for ever)."""
    if holder.is_symlink() or (holder.exists() and not holder.is_file()):
        kind = "a symbolic link" if holder.is_symlink() else "a folder" if holder.is_dir() else "not a plain file"
        raise ValueError(f"{holder} is {kind}; lola describes the run holding the folder there: remove it (it is not lola's) and run again")
    fd = os.open(holder, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), file_mode())
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record) + "\n")


@contextmanager
def output_lock(path: str | os.PathLike, writer: str) -> Iterator[None]:
    """Hold one output (a file, or a folder written at once: an export) for a whole run: a
    second run writing the same output is refused at once, naming it and the run that holds it
    (else the later run silently replaces the first's result, or both extend one checkpoint).

    The lock is a ``flock`` of ``.lola-run-<name>.json`` beside the output (released by the
    system when the process dies: no stale lock), which also describes the holder; the file is
    removed at the end. Where files cannot be locked, the run goes on unlocked.

    Raises:
        ValueError: another run holds the output.
    """
    target = Path(path)
    holder = target.parent / f".lola-run-{target.name}.json"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    if holder.is_symlink() or (holder.exists() and not holder.is_file()):
        raise ValueError(f"{holder} is not a plain file; lola describes there the run writing {target}: remove it")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(holder, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), file_mode())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                who = json.loads(os.read(fd, 4096).decode("utf-8"))
                desc = f"{who['command']} (pid {who['pid']}, started {who['started']})"
            except (OSError, ValueError, KeyError, TypeError):
                desc = "another process"
            raise ValueError(f"{writer}: {target} is being written by {desc}; wait for it to finish, or write to another place") from None
        except OSError:  # pragma: no cover - flock not supported here
            pass
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "command": writer, "started": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n").encode(), 0)
        try:
            yield
        finally:
            holder.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def check_free(folder: str | os.PathLike, writer: str) -> None:
    """Refuse ``folder`` if another run holds it now (:func:`run_lock`), before a command loads
    its model; the run itself takes the lock when it starts writing. A missing folder is free."""
    if Path(folder).is_dir():
        with run_lock(folder, writer):
            pass


_held = threading.local()  # folders this thread holds the lock of: {real path: count} (re-entrant)


@contextmanager
def folder_lock(folder: str | os.PathLike, writer: str = "lola", wait: float | None = None) -> Iterator[None]:
    """Hold the exclusive write lock of ``folder`` (an existing folder) while the block runs.

    Re-entrant within a thread. Where folders cannot be locked (no ``fcntl``, or a file system
    that refuses ``flock``) the block runs unlocked, as before.

    Raises:
        ValueError: another process held the lock for ``wait`` seconds (default
            :data:`LOCK_WAIT`): the folder is busy.
    """
    key = os.path.realpath(folder)
    held = getattr(_held, "folders", None)
    if held is None:
        held = _held.folders = {}
    if held.get(key):
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    try:
        fd = os.open(key, os.O_RDONLY)
    except OSError:  # pragma: no cover - a folder that cannot be opened
        yield
        return
    try:
        limit = LOCK_WAIT if wait is None else wait
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise FolderBusy(
                        f"{writer}: {folder} is busy: another process has been writing into it for {limit:g} s; "
                        "try again when it has finished (or write to another folder)"
                    ) from None
                time.sleep(0.05)
            except OSError:  # pragma: no cover - flock not supported here
                break
        held[key] = 1
        try:
            yield
        finally:
            held[key] = 0
    finally:
        os.close(fd)  # releases the lock


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666`` less the process umask."""
    try:  # Linux shows the umask without changing it (os.umask must set one to read it)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


_umask_lock = threading.Lock()


_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-.+\.[A-Za-z0-9_]{8}$")  # mkstemp's 8-character suffix


def _temp_prefix(name: str) -> str:
    """Temporary names carry the writer's pid, so that only a dead writer's are reclaimed."""
    return f"{TEMP_PREFIX}{os.getpid()}-{name}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process (or a pid we cannot ask about): not ours to clean
    return True


def _reclaim_temporaries(folder: Path) -> None:
    """Remove the temporary files a killed writer left (the lock is held: no lola writer is
    using any; those a journal names were moved into place by :func:`finish_pending` first):
    those named as lola names them (:func:`_temp_prefix`) by a pid that is this process or no
    longer runs. Any other file, a user's ``.lola-tmp-notes`` included, is left alone."""
    for leftover in folder.glob(f"{TEMP_PREFIX}*"):
        found = _TEMP_NAME.match(leftover.name)
        if not found or not leftover.is_file() or leftover.is_symlink():
            continue
        pid = int(found.group(1))
        if pid == os.getpid() or not _alive(pid):
            leftover.unlink(missing_ok=True)


def write_files(
    folder: str | os.PathLike,
    files: Mapping[str, FileContent],
    ours: Callable[[Path], bool] | None = None,
    writer: str = "lola",
    remove: Sequence[str] = (),
    record: bool = True,
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
        record: list the files, with their digests, in the folder's :data:`WRITTEN_FILE` (off
            for record files that are appended to afterwards).

    Returns:
        The paths written, in order.

    Raises:
        ValueError: a bad name, a link or foreign file in a target's place, or a folder that
            cannot be created; nothing was written then.
        OSError: writing failed (a full disk, a quota); it names the file, and nothing of the
            group was put in place.
    """
    folder = Path(folder)
    check_held(folder)  # a run's folder moved or deleted under it: not re-created by its name
    for name in (*files, *remove):
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"{writer}: {name!r} is not a plain file name")
    targets = [folder / name for name in files]
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder; {writer} writes its files into a folder")
    for target in targets:
        check_target(target, ours, writer)
    folder.mkdir(parents=True, exist_ok=True)
    with folder_lock(folder, writer):
        finish_pending(folder)  # an earlier group write cut short: complete it before this one
        _reclaim_temporaries(folder)
        written = written_record(folder)
        for target in (*targets, *(folder / n for n in remove)):
            _check_unchanged(target, written.get(target.name), writer)
        temps: list[Path] = []
        committed = False
        try:
            for name, content in files.items():
                fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(name), dir=folder)
                tmp = Path(tmp_name)
                temps.append(tmp)
                try:
                    if callable(content):
                        os.close(fd)
                        content(tmp)
                    else:
                        with os.fdopen(fd, "wb") as f:
                            f.write(content.encode("utf-8") if isinstance(content, str) else bytes(content))
                    os.chmod(tmp, file_mode())  # mkstemp's 0600 would stay with the file through the rename
                    _sync(tmp)
                except OSError as err:
                    if err.filename is not None:
                        raise
                    # a full disk or a quota says only "[Errno 28] No space left on device": name the file
                    target = str(folder / name)
                    if err.errno is None:
                        raise OSError(f"{writer} could not write {target}: {err}") from err
                    raise OSError(err.errno, f"{writer} could not write it: {err.strerror}", target) from err
            for target in targets:
                check_target(target, ours, writer)  # nothing swapped in while the files were written
            stale = [name for name in remove if name not in files]
            if record or any(n in written for n in (*files, *stale)):
                for name, tmp in zip(files, temps):
                    if record:
                        written[name] = {"sha256": _sha256(tmp), "writer": writer}
                    else:
                        written.pop(name, None)
                for name in stale:
                    written.pop(name, None)
                temps.append(_write_temp(folder, WRITTEN_FILE, json.dumps({"format": WRITTEN_FORMAT, "files": written}, indent=1) + "\n"))
                targets = [*targets, folder / WRITTEN_FILE]
            renames = [[tmp.name, target.name, _file_state(target)] for tmp, target in zip(temps, targets)]
            group = len(renames) > 1 or bool(stale)
            if group:  # the journal makes the group's renames all-or-nothing
                _write_journal(folder, renames, stale)
                committed = True  # from here on the journal completes the write, even after a kill
                finish_pending(folder)
            elif renames:
                os.replace(temps[0], targets[0])
        finally:
            if not committed:
                for tmp in temps:
                    tmp.unlink(missing_ok=True)
    _sync_folder(folder)
    return [t for t in targets if t.name != WRITTEN_FILE]


WRITTEN_FORMAT = "lola-files"


def written_record(folder: str | os.PathLike) -> dict[str, dict[str, str]]:
    """``{name: {"sha256", "writer"}}`` of the files lola wrote into ``folder``
    (:data:`WRITTEN_FILE`); empty when there is none. A record that is not lola's (or damaged)
    is refused: it would hide which files are someone's."""
    path = Path(folder) / WRITTEN_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{path} is not a plain file; lola records there what it wrote in the folder: remove it")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"] if data.get("format") == WRITTEN_FORMAT else None
        ok = isinstance(files, dict) and all(
            isinstance(e, dict) and isinstance(e.get("sha256"), str) and isinstance(e.get("writer"), str) for e in files.values()
        )
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"{path} is not lola's record of the files it wrote (damaged or someone's); move it away after checking the folder")
    return {str(k): dict(v) for k, v in files.items()}


def _check_unchanged(target: Path, entry: dict[str, str] | None, writer: str) -> None:
    """Refuse to replace (or remove) a file lola wrote that someone changed since."""
    if entry is None or not target.is_file() or target.is_symlink():
        return
    if _sha256(target) != entry["sha256"]:
        raise ValueError(
            f"{target} was written by {entry['writer']} and has changed since (its content is not the one {WRITTEN_FILE} records): "
            f"{writer} would replace someone's edit; move it away (or restore it) and run again"
        )


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_temp(folder: Path, name: str, text: str) -> Path:
    """A synced temporary file in ``folder`` with ``text``, to be renamed to ``name``."""
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(name), dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp_name, file_mode())
    _sync(Path(tmp_name))
    return Path(tmp_name)


def _file_state(path: Path) -> list[int] | None:
    """``[inode, size, mtime_ns]`` of the file at ``path``, or ``None`` when there is none: what
    a journal expects to replace, so that a file changed since is never replaced by recovery."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _write_journal(folder: Path, renames: list[list[Any]], remove: list[str]) -> None:
    """Write the journal of a group write atomically (temporary file, sync, rename)."""
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(PENDING_FILE), dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"renames": renames, "remove": remove}, f)
        _sync(Path(tmp_name))
        os.replace(tmp_name, folder / PENDING_FILE)
    finally:
        Path(tmp_name).unlink(missing_ok=True)  # gone already once renamed
    _sync_folder(folder)


def finish_pending(folder: str | os.PathLike) -> bool:
    """Complete a group write that a kill cut short in ``folder``: do the renames and removals
    its journal (:data:`PENDING_FILE`) lists, then remove the journal. Every temporary file was
    complete and synced before the journal was written, so finishing is always right.

    Returns:
        Whether there was a journal to finish.

    Raises:
        ValueError: a journal that is not lola's (named), left in place.
    """
    journal = Path(folder) / PENDING_FILE
    if not journal.is_file() or journal.is_symlink():
        return False
    with folder_lock(folder, "lola"):  # not while the writer that left it may still be renaming
        return _finish_pending(journal)


def _finish_pending(journal: Path) -> bool:
    if not journal.is_file():  # finished by the writer meanwhile
        return False
    try:
        data = json.loads(journal.read_text(encoding="utf-8"))
        renames = [(str(a), str(b), None if c is None else [int(x) for x in c]) for a, b, c in data["renames"]]
        remove = [str(x) for x in data.get("remove", [])]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{journal} is not a lola journal of an interrupted write ({err}); remove it after checking the folder") from None
    names = [n for a, b, _ in renames for n in (a, b)] + remove
    if any(Path(n).name != n or n in ("", ".", "..") for n in names) or any(not a.startswith(TEMP_PREFIX) for a, _, _ in renames):
        raise ValueError(f"{journal} names files outside its folder or not lola's temporary files; remove it after checking the folder")
    for tmp, name, expected in renames:
        source = journal.parent / tmp
        if not source.is_file() or source.is_symlink():
            continue  # renamed already
        target = journal.parent / name
        if target.is_symlink():  # never write through a link, even to finish
            raise ValueError(f"{target} is a symbolic link; the interrupted write in {journal.parent} is left unfinished")
        now = _file_state(target)
        if now is not None and now != expected:  # changed (or created) since the write began: someone's now
            raise ValueError(
                f"{target} changed since lola's write into {journal.parent} was cut short; that write is left unfinished "
                f"(its new files are the {TEMP_PREFIX}* files there; remove them and {PENDING_FILE} to drop it)"
            )
        os.replace(source, target)
    for name in remove:
        stale = journal.parent / name
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
    _sync_folder(journal.parent)
    journal.unlink()
    _sync_folder(journal.parent)
    return True


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
