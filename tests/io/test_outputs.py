"""``lola.io.outputs.write_files``: the one way lola writes files.

Each property is checked on the helper itself; tests/hostile/test_files.py checks that every
writer of the library and the commands goes through it (caches, feature-map folders,
checkpoints, results, budgets, exported tasks).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

import lola.io.outputs
from lola.io.outputs import PENDING_FILE, TEMP_PREFIX, WRITTEN_FILE, check_target, read_json, write_files, written_record


def _listing(folder: Path) -> dict[str, bytes]:
    """The folder's files, less lola's record of what it wrote (tested on its own below)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink() and p.name != WRITTEN_FILE}


def test_writes_every_kind_of_content_in_order(tmp_path):
    order = []
    real = os.replace

    def record(src, dst):
        order.append(Path(dst).name)
        real(src, dst)

    lola.io.outputs.os.replace, saved = record, lola.io.outputs.os.replace
    try:
        paths = write_files(tmp_path / "new" / "deep", {"a.bin": b"\x00\x01", "b.txt": "héllo", "c.dat": lambda p: p.write_bytes(b"fn")})
    finally:
        lola.io.outputs.os.replace = saved
    assert order == [PENDING_FILE, "a.bin", "b.txt", "c.dat", WRITTEN_FILE]  # the journal, the group, its record last
    assert [p.name for p in paths] == order[1:-1]
    assert _listing(tmp_path / "new" / "deep") == {"a.bin": b"\x00\x01", "b.txt": "héllo".encode(), "c.dat": b"fn"}


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_a_failure_while_writing_leaves_the_previous_files_and_no_temporaries(tmp_path, fail_at):
    write_files(tmp_path, {"a": b"old a", "b": b"old b", "c": b"old c"})
    before = _listing(tmp_path)

    def boom(path):
        path.write_bytes(b"half")
        raise OSError("disk full")

    contents = [b"new a", b"new b", b"new c"]
    contents[fail_at] = boom
    with pytest.raises(OSError, match="disk full") as raised:
        write_files(tmp_path, dict(zip("abc", contents)))
    assert str(tmp_path / "abc"[fail_at]) in str(raised.value)  # the error names the file it could not write
    assert _listing(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_a_full_disk_is_reported_with_the_file_and_its_errno(tmp_path):
    def full(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what write() raises: no file name

    with pytest.raises(OSError) as raised:
        write_files(tmp_path, {"config.json": full}, writer="lola export")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "config.json")
    assert str(raised.value) == f"[Errno 28] lola export could not write it: No space left on device: '{tmp_path / 'config.json'}'"


@pytest.mark.parametrize("kind", ["file", "folder", "dangling"])
def test_links_in_a_targets_place_are_refused_and_not_followed(tmp_path, kind):
    victim = tmp_path / "victim"
    if kind == "file":
        victim.write_text("precious")
    elif kind == "folder":
        victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").symlink_to(victim)
    with pytest.raises(ValueError, match=r"result.json is a symbolic link"):
        write_files(out, {"other.json": "{}", "result.json": "{}"})
    assert not (out / "other.json").exists()  # refused before anything was written
    if kind == "file":
        assert victim.read_text() == "precious"
    assert (out / "result.json").is_symlink()


def test_foreign_files_are_refused_by_name_before_anything_is_written(tmp_path):
    (tmp_path / "b.json").write_text('{"someone": "else"}')
    ours = lambda p: b"lola" in p.read_bytes()  # noqa: E731
    with pytest.raises(ValueError, match=r"b.json exists and was not written by tester"):
        write_files(tmp_path, {"a.json": "lola a", "b.json": "lola b"}, ours=ours, writer="tester")
    assert _listing(tmp_path) == {"b.json": b'{"someone": "else"}'}
    (tmp_path / "b.json").write_text("lola's earlier b")
    write_files(tmp_path, {"a.json": "lola a", "b.json": "lola b"}, ours=ours)
    assert _listing(tmp_path) == {"a.json": b"lola a", "b.json": b"lola b"}


@pytest.mark.parametrize("name", ["../escape", "sub/file", "/abs", "", ".", "..", 3])
def test_names_must_be_plain_file_names(tmp_path, name):
    with pytest.raises(ValueError, match="is not a plain file name"):
        write_files(tmp_path, {name: b"x"})
    with pytest.raises(ValueError, match="is not a plain file name"):
        write_files(tmp_path, {"ok": b"x"}, remove=[name])
    assert not (tmp_path.parent / "escape").exists()


def test_a_folder_in_a_files_place_or_a_file_in_the_folders_place(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="taken exists and is not a plain file"):
        write_files(tmp_path, {"taken": b"x"})
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="afile is a file, not a folder"):
        write_files(tmp_path / "afile", {"y": b"y"})


def test_superseded_files_are_removed_after_the_group_is_in_place(tmp_path):
    write_files(tmp_path, {"data-1": b"1", "index": b"data-1"})
    (tmp_path / "link").symlink_to(tmp_path / "index")
    write_files(tmp_path, {"data-2": b"2", "index": b"data-2"}, remove=["data-1", "missing", "link"])
    assert _listing(tmp_path) == {"data-2": b"2", "index": b"data-2"}
    assert (tmp_path / "link").is_symlink()  # links are never followed, nor removed


def test_check_target_accepts_missing_and_plain_files(tmp_path):
    check_target(tmp_path / "missing")
    (tmp_path / "plain").write_text("x")
    check_target(tmp_path / "plain")
    with pytest.raises(ValueError, match="was not written by me"):
        check_target(tmp_path / "plain", ours=lambda p: False, writer="me")


def _kill_after(n: int):
    """An ``os.replace`` that does ``n`` renames and then dies (a kill between two renames)."""
    real = os.replace
    done = []

    def replace(src, dst):
        if len(done) == n:
            raise KeyboardInterrupt  # not an Exception: nothing may clean up after a kill
        done.append(dst)
        real(src, dst)

    return replace


@pytest.mark.parametrize("renames", [0, 1, 2])
def test_a_group_cut_between_renames_is_finished_by_the_next_reader_or_writer(tmp_path, monkeypatch, renames):
    from lola.io.outputs import finish_pending

    write_files(tmp_path, {"data.bin": b"old data", "meta.json": b'{"v": "old"}'})
    monkeypatch.setattr(lola.io.outputs.os, "replace", _kill_after(renames))
    with pytest.raises(KeyboardInterrupt):
        write_files(tmp_path, {"data.bin": b"new data", "meta.json": b'{"v": "new"}'}, remove=["gone.txt"])
    monkeypatch.undo()
    listing = _listing(tmp_path)
    if renames <= 1:  # the journal, at most, was renamed: no file of the group yet
        assert (listing["data.bin"], listing["meta.json"]) == (b"old data", b'{"v": "old"}')
    assert finish_pending(tmp_path) == (PENDING_FILE in listing)
    listing = _listing(tmp_path)
    assert PENDING_FILE not in listing and not any(n.startswith(TEMP_PREFIX) for n in listing)
    assert (listing["data.bin"], listing["meta.json"]) in ((b"old data", b'{"v": "old"}'), (b"new data", b'{"v": "new"}'))


def test_a_cut_group_is_finished_before_the_next_write(tmp_path, monkeypatch):
    write_files(tmp_path, {"a": b"1", "b": b"1"})
    monkeypatch.setattr(lola.io.outputs.os, "replace", _kill_after(2))  # the journal and "a"
    with pytest.raises(KeyboardInterrupt):
        write_files(tmp_path, {"a": b"2", "b": b"2"})
    monkeypatch.undo()
    assert _listing(tmp_path)["b"] == b"1" and (tmp_path / PENDING_FILE).is_file()
    write_files(tmp_path, {"c": b"3"})
    assert {k: v for k, v in _listing(tmp_path).items()} == {"a": b"2", "b": b"2", "c": b"3"}


@pytest.mark.parametrize(
    "journal",
    [b"not json", b'{"renames": [["../x", "y"]]}', b'{"renames": [["%s", "../../etc/passwd"]]}' % TEMP_PREFIX.encode(), b'{"renames": [["x", "y"]]}'],
)
def test_a_journal_that_is_not_lola_s_is_refused_and_nothing_moves(tmp_path, journal):
    from lola.io.outputs import finish_pending

    (tmp_path / PENDING_FILE).write_bytes(journal)
    (tmp_path / "x").write_text("keep")
    with pytest.raises(ValueError, match="journal|lola's temporary"):
        finish_pending(tmp_path)
    assert (tmp_path / "x").read_text() == "keep" and (tmp_path / PENDING_FILE).read_bytes() == journal


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_readers_and_outputs_refuse_what_is_not_a_regular_file(tmp_path, kind):
    from lola.io.outputs import check_output_file, check_regular_file

    path = tmp_path / "thing.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(ValueError, match="thing.json"):
        check_regular_file(path, "a JSON file")
    with pytest.raises(ValueError, match="thing.json"):
        read_json(path, "a JSON file")
    with pytest.raises(ValueError, match="thing.json"):
        check_output_file(path, "--out", ours=lambda p: p.read_bytes() == b"")  # never reads a FIFO


def test_read_json_refuses_a_key_given_twice(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"window": 8, "nested": {"a": 1, "a": 2}}')
    with pytest.raises(ValueError, match=r"r.json.*'a' appears twice"):
        read_json(path, "a results file")


def test_recovery_never_replaces_a_file_changed_since_the_write_was_cut(tmp_path, monkeypatch):
    """A file edited (or put in place) after the kill is someone's now: the journal names the
    state it expected to replace, and recovery leaves the file and refuses by name."""
    from lola.io.outputs import finish_pending

    write_files(tmp_path, {"a": b"1", "b": b"1"})
    monkeypatch.setattr(lola.io.outputs.os, "replace", _kill_after(2))  # the journal and "a"
    with pytest.raises(KeyboardInterrupt):
        write_files(tmp_path, {"a": b"2", "b": b"2"})
    monkeypatch.undo()
    (tmp_path / "b").write_bytes(b"the user's edit after the crash")
    with pytest.raises(ValueError, match=r"b changed since"):
        finish_pending(tmp_path)
    assert (tmp_path / "b").read_bytes() == b"the user's edit after the crash"


_HOLD = """
import sys, time
from lola.io.outputs import folder_lock
with folder_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print("released", flush=True)
"""

_WRITER = """
import sys
from lola.io.outputs import write_files
me, folder = sys.argv[1], sys.argv[2]
for i in range(40):
    write_files(folder, {"a.txt": f"{me} {i}", "b.txt": f"{me} {i}"})
"""


def _holder(folder, seconds):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_another_process_is_writing_is_waited_for_then_reported_busy(tmp_path, monkeypatch):
    proc = _holder(tmp_path, 3)
    try:
        monkeypatch.setattr(lola.io.outputs, "LOCK_WAIT", 0.3)
        with pytest.raises(ValueError, match=r"is busy: another process has been writing into it for 0.3 s"):
            write_files(tmp_path, {"x.txt": "mine"})
        assert not (tmp_path / "x.txt").exists() and not list(tmp_path.glob(f"{TEMP_PREFIX}*"))
        monkeypatch.setattr(lola.io.outputs, "LOCK_WAIT", 60.0)
        start = time.monotonic()
        write_files(tmp_path, {"x.txt": "mine"})  # waits for the holder, then writes
        assert (tmp_path / "x.txt").read_text() == "mine" and proc.stdout.readline().strip() == "released"
        assert time.monotonic() - start > 0.5  # it did wait (the holder held it for 3 s from before the first try)
    finally:
        proc.kill()
        proc.wait()
    assert set(_listing(tmp_path)) == {"x.txt"}  # the lock leaves no file behind


def test_two_processes_writing_one_group_into_one_folder_both_finish_whole(tmp_path):
    """Without the lock one writer's recovery would finish the other's journal mid-write and
    groups would mix; with it every group read back is one writer's."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, me, str(tmp_path)], stderr=subprocess.PIPE, text=True) for me in ("p", "q")]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    files = _listing(tmp_path)
    assert set(files) == {"a.txt", "b.txt"} and files["a.txt"] == files["b.txt"]
    assert files["a.txt"].decode().endswith(" 39")


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_a_killed_writer_left_are_reclaimed_by_the_next_write(tmp_path):
    write_files(tmp_path, {"state.bin": b"old"})
    leftover = tmp_path / f"{TEMP_PREFIX}{_dead_pid()}-state.bin.abc12345"
    leftover.write_bytes(b"x" * 4096)  # a killed writer's half-written copy of the state
    write_files(tmp_path, {"state.bin": b"new"})
    assert _listing(tmp_path) == {"state.bin": b"new"}


def test_only_lola_s_temporaries_of_writers_gone_are_reclaimed(tmp_path):
    # a user's file that merely starts like lola's, and a live writer's temporary, stay
    kept = {f"{TEMP_PREFIX}results.json.abc": b"someone's draft", f"{TEMP_PREFIX}{os.getppid()}-state.bin.abc12345": b"a live writer's"}
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    write_files(tmp_path, {"state.bin": b"new"})
    assert _listing(tmp_path) == {"state.bin": b"new", **kept}


# -- the record of what lola wrote (WRITTEN_FILE) ----------------------------------------------------


def test_the_files_lola_writes_are_recorded_with_their_digests(tmp_path):
    import hashlib

    write_files(tmp_path, {"a.txt": "one", "b.bin": b"\x00"}, writer="lola niah")
    write_files(tmp_path, {"c.log": "appended to later"}, writer="lola probe", record=False)
    written = written_record(tmp_path)
    assert written == {
        "a.txt": {"sha256": hashlib.sha256(b"one").hexdigest(), "writer": "lola niah"},
        "b.bin": {"sha256": hashlib.sha256(b"\x00").hexdigest(), "writer": "lola niah"},
    }
    write_files(tmp_path, {"a.txt": "two"}, remove=["b.bin"], writer="lola niah")
    assert set(written_record(tmp_path)) == {"a.txt"} and written_record(tmp_path)["a.txt"]["sha256"] == hashlib.sha256(b"two").hexdigest()


@pytest.mark.parametrize("how", ["replace", "remove"])
def test_a_file_lola_wrote_and_someone_changed_is_neither_replaced_nor_removed(tmp_path, how):
    write_files(tmp_path, {"results.json": "{}", "plot.png": b"png"}, writer="lola niah")
    (tmp_path / "results.json").write_text('{"my": "notes"}')
    with pytest.raises(ValueError, match=r"results.json was written by lola niah and has changed since .*move it away"):
        if how == "replace":
            write_files(tmp_path, {"results.json": "{}"}, writer="lola niah")
        else:
            write_files(tmp_path, {"plot.png": b"new"}, remove=["results.json"], writer="lola niah")
    assert (tmp_path / "results.json").read_text() == '{"my": "notes"}'
    (tmp_path / "results.json").write_text("{}")  # restored: lola's own again
    write_files(tmp_path, {"results.json": "[]"}, writer="lola niah")


@pytest.mark.parametrize("record", ["not json", '{"format": "lola-files", "files": {"a": 3}}', '{"files": {}}'])
def test_a_record_that_is_not_lola_s_is_refused(tmp_path, record):
    (tmp_path / WRITTEN_FILE).write_text(record)
    with pytest.raises(ValueError, match=r"\.lola-files\.json is not lola's record of the files it wrote"):
        write_files(tmp_path, {"a.txt": "x"})
    assert not (tmp_path / "a.txt").exists()
