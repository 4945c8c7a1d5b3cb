"""The pieces of the adversarial pass: cases, what each expects, and how an outcome is judged.

A :class:`Case` runs one hostile input in its own folder (``ctx.dir``, also the working
directory) and either returns (the input was accepted: a value, or a :class:`CliResult` with
exit status 0) or raises / returns a refusing :class:`CliResult` (exit status 2). Its
``expect`` says what the right answer is:

- :func:`refuse`: the input must be refused, and the message must hold ``fragments`` (the
  option, field or file at fault; ``"--needle|needle template"`` accepts either);
- :func:`accept`: the input is valid and must be accepted; ``check`` proves the result right;
- :func:`either`: refused naming ``fragments``, or accepted with a result that ``check``
  proves right (a resume that must be refused or correctly redone);
- :func:`intact`: anything goes (a simulated kill, a full disk) as long as no protected file
  is lost and ``check`` holds afterwards.

:func:`classify` turns what happened (recorded by :func:`execute`, in the child process) into
one outcome: ``clear``, ``unclear``, ``silent``, ``lost``, ``oom``, ``ok``, ``refused-valid`` (a
valid input refused) or ``timeout`` (the case hung).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

CLASSES = ("attention", "state", "resume", "files", "numbers", "refused", "messages")
OUTCOMES = ("clear", "unclear", "silent", "lost", "oom", "ok", "refused-valid", "timeout")
Check = Callable[[Any, "Ctx"], None]


@dataclass(frozen=True)
class Expect:
    """What the right answer to a case is (see the module docstring)."""

    kind: str  # "refuse", "accept", "either", "intact"
    fragments: tuple[str, ...] = ()
    check: Check | None = None


def refuse(*fragments: str, check: Check | None = None) -> Expect:
    """The input must be refused with a message holding every fragment; ``check``, run if it
    was accepted anyway, describes what came out (for the report)."""
    return Expect("refuse", fragments, check)


def accept(check: Check | None = None) -> Expect:
    """The input is valid: accepted, and ``check(result, ctx)`` raises nothing."""
    return Expect("accept", (), check)


def either(*fragments: str, check: Check) -> Expect:
    """Refused naming ``fragments``, or accepted with a result ``check`` proves right."""
    return Expect("either", fragments, check)


def intact(check: Check | None = None) -> Expect:
    """Refusal or acceptance both do, as long as no protected file is lost and ``check`` holds."""
    return Expect("intact", (), check)


@dataclass(frozen=True)
class Case:
    """One hostile input: ``run(ctx)`` feeds it to lola; ``expect`` says what should happen.

    Attributes:
        id: a name unique among the cases.
        cls: its input class, one of :data:`CLASSES`.
        what: the input, in words.
        run: ``run(ctx)`` feeds the input to lola.
        expect: what the right answer is.
        timeout: seconds before the case counts as hung.
        batch: the batch of cases it was written in: 1 (before the fixes it led to), 2 (after
            them, to check that they hold) or 3 (before the round-three fixes, to measure them);
            0 until :func:`in_batch` files it.
    """

    id: str
    cls: str
    what: str
    run: Callable[["Ctx"], Any]
    expect: Expect
    timeout: float = 120.0
    batch: int = 0


def in_batch(batch: int, cases: list[Case]) -> list[Case]:
    """``cases``, each filed in ``batch``."""
    return [replace(c, batch=batch) for c in cases]


@dataclass
class CliResult:
    """What a command did: its exit status, stdout and stderr."""

    status: int
    out: str
    err: str
    prefix: str  # the start of its error line: "lola niah: error: " or "export-niah: "

    def __repr__(self) -> str:
        return f"exit {self.status}: {one_line(self.err or self.out)[:200]}"


class SimulatedKill(Exception):
    """Raised by a monkeypatched write: the process "dies" at that point."""


class CaseFailure(AssertionError):
    """A ``check`` found an accepted result wrong (the message says how)."""


def lost(message: str) -> None:
    """A check found that files which were there are gone or no longer usable."""
    raise CaseFailure("LOST: " + message)


def ensure(condition: object, message: str) -> None:
    """Raise :class:`CaseFailure` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CaseFailure(message)


@dataclass
class Ctx:
    """A case's folder, and the files it protects (compared before and after the run)."""

    dir: Path
    protected: dict[str, bytes | None] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        return self.dir / name

    def write(self, name: str, data: bytes | str) -> Path:
        """Write ``data`` at ``name`` (parents created) and return the path."""
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p

    def protect(self, path: Path | str) -> None:
        """Snapshot ``path`` (a file, or every file under a folder): it must survive the case."""
        path = Path(path)
        for p in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if p.is_symlink():
                self.protected[str(p)] = b"->" + os.readlink(p).encode()
            elif p.is_file():
                self.protected[str(p)] = p.read_bytes()

    def lost(self) -> list[str]:
        """The protected files that changed or disappeared."""
        out = []
        for name, before in self.protected.items():
            p = Path(name)
            now = (b"->" + os.readlink(p).encode()) if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
            if now != before:
                out.append(f"{p.relative_to(self.dir) if p.is_relative_to(self.dir) else p} {'changed' if now is not None else 'is gone'}")
        return out


def one_line(text: str) -> str:
    return " ".join(str(text).split())


_PROGRESS = re.compile(r"\d+%\|")


def error_lines(err: str, prefix: str | None = None) -> list[str]:
    """The non-empty stderr lines that are not progress bars (tqdm redraws with ``\\r``); an
    error printed right after a bar, on its line, is cut out of it (``prefix`` marks its start)."""
    lines = []
    for line in err.splitlines():
        last = line.split("\r")[-1]
        if prefix and _PROGRESS.search(last) and prefix in last:
            last = last[last.index(prefix) :]
        if last.strip() and not _PROGRESS.search(last):
            lines.append(last)
    return lines


def cli(argv: list[str]) -> CliResult:
    """Run ``lola ARGV`` in this process; an exception escaping ``main`` propagates (a traceback)."""
    from lola.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as stop:  # argparse: usage and an error line
            status = stop.code if isinstance(stop.code, int) else 2
    return CliResult(int(status), out.getvalue(), err.getvalue(), f"lola {argv[0]}: error: ")


def export(argv: list[str]) -> CliResult:
    """Run ``python -m lola.integrations.lm_eval export-niah ARGV`` in this process."""
    from lola.integrations.lm_eval.__main__ import export_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = export_main(list(argv))
        except SystemExit as stop:  # argparse
            status = stop.code if isinstance(stop.code, int) else 2
    return CliResult(int(status), out.getvalue(), err.getvalue(), "export-niah: ")


# -- in the child: run one case and record what happened -----------------------------------------


def _describe(value: Any) -> str:
    """A short description of an accepted result (a model by its class, not its repr)."""
    if hasattr(value, "named_parameters") and hasattr(value, "forward"):
        return f"a {type(value).__name__}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if type(value).__name__ == "Tensor":
        return f"tensor{tuple(value.shape)}"
    return one_line(repr(value))[:300]


_USER_TYPES = ("ValueError", "TypeError", "OSError", "FileNotFoundError", "PermissionError", "IsADirectoryError", "NotADirectoryError", "FileExistsError")


def _raised_in_lola(tb: Any) -> bool:
    """Whether the innermost frame of a traceback lies in lola's own source."""
    frames = traceback.extract_tb(tb)
    return bool(frames) and f"{os.sep}lola{os.sep}" in frames[-1].filename and "site-packages" not in frames[-1].filename


def _accepted(case: Case, ctx: Ctx, value: Any) -> dict:
    """The record of a run that returned: the result, and what the case's check says of it."""
    if isinstance(value, CliResult):
        record = dict(kind="cli", status=value.status, err=value.err[-4000:], out=value.out[-1000:], prefix=value.prefix)
    else:
        record = dict(kind="returned", value=_describe(value))
    accepted = not isinstance(value, CliResult) or value.status == 0
    if case.expect.check is not None and (accepted or case.expect.kind == "intact"):
        try:
            case.expect.check(value, ctx)
            record["check"] = "passed"
        except CaseFailure as err:
            record["check"] = one_line(str(err))[:300]
        except Exception as err:  # noqa: BLE001 - a check that cannot even run says the result is wrong
            record["check"] = f"the check failed with {type(err).__name__}: {one_line(str(err))[:300]}"
    return record


def execute(case: Case, ctx: Ctx) -> dict:
    """Run ``case`` (in the child process) and describe what happened as JSON-able data."""
    record: dict[str, Any] = {}
    try:
        value = case.run(ctx)
    except CaseFailure as err:  # the case itself found the result wrong (e.g. files lost)
        record.update(kind="returned", value="", check=one_line(str(err))[:300])
        value = None
    except BaseException as err:  # noqa: BLE001 - every outcome is recorded, none escapes
        mro = [k.__name__ for k in type(err).__mro__]
        record.update(
            kind="raised",
            type=type(err).__name__,
            mro=mro,
            message=str(err) if not isinstance(err, KeyError) or type(err).__str__ is not KeyError.__str__ else repr(err.args[0]) if err.args else "",
            bare_key=type(err) is KeyError,
            in_lola=_raised_in_lola(err.__traceback__),
            traceback=traceback.format_exc()[-3000:],
        )
    else:
        record.update(_accepted(case, ctx, value))
    record["lost"] = ctx.lost()
    here = str(ctx.dir) + os.sep
    for key in ("message", "err", "out", "value", "check"):
        if isinstance(record.get(key), str):
            record[key] = record[key].replace(here, "")
    return record


# -- in the parent: judge it -----------------------------------------------------------------------

_OOM_TEXT = ("can't allocate memory", "not enough memory", "DefaultCPUAllocator", "out of memory", "Cannot allocate memory")


def _is_oom(rec: dict) -> bool:
    """An allocation that failed under the limit (lola's own check, which refuses before
    allocating and says how much is free, is a refusal, not an ``oom``)."""
    if rec.get("kind") == "cli":
        text = rec["err"]
    elif rec.get("kind") == "raised":
        text = rec["message"] if rec["type"] != "MemoryError" or "is free" not in rec["message"] else ""
        if rec["type"] == "MemoryError" and text:
            return True
    else:
        return False
    return any(t in text for t in _OOM_TEXT)


def _message(rec: dict) -> str:
    if rec["kind"] == "raised":
        return f"{rec['type']}: {one_line(rec['message'])}"
    if rec["kind"] == "cli":
        lines = error_lines(rec["err"], rec["prefix"])
        if rec["status"] == 0:
            return "exit 0 (accepted)"
        return " | ".join(lines) if lines else f"exit {rec['status']}, no message"
    return rec.get("value", "")


def judge_message(rec: dict, fragments: tuple[str, ...]) -> tuple[str, str]:
    """``("clear", "")`` or ``("unclear", why)`` for a refusal."""
    if rec["kind"] == "cli":
        lines = error_lines(rec["err"], rec["prefix"])
        if rec["status"] != 2:
            return "unclear", f"exit status {rec['status']}"
        if any("Traceback" in line for line in lines):
            return "unclear", "a traceback"
        if len(lines) != 1:
            return "unclear", f"{len(lines)} stderr lines"
        if not lines[0].startswith(rec["prefix"]):
            return "unclear", f"does not start with {rec['prefix']!r}"
        text = lines[0]
    else:
        mro = rec["mro"]
        if rec["bare_key"]:
            return "unclear", "a bare KeyError"
        user = any(t in mro for t in _USER_TYPES) or rec["type"] == "MemoryError"
        if rec["type"] == "RuntimeError" and rec["in_lola"]:
            user = True  # lola's own RuntimeError, e.g. a window overflow it explains
        if not user:
            return "unclear", f"{rec['type']} escaped"
        text = rec["message"]
    missing = [f for f in fragments if not any(alt in text for alt in f.split("|"))]
    if missing:
        return "unclear", f"lacks {missing}"
    return "clear", ""


def classify(case: Case, rec: dict) -> tuple[str, str, str]:
    """``(outcome, why, message)`` of a case from its record."""
    kind = rec.get("kind")
    if kind == "timeout":
        return "timeout", f"no answer within {case.timeout:.0f} s", ""
    if kind == "killed":
        return "oom", rec.get("why", "killed"), ""
    message = _message(rec)
    if rec.get("lost"):
        return "lost", "; ".join(rec["lost"]), message
    if _is_oom(rec):
        return "oom", "allocation failed under the memory limit", message
    refused = kind == "raised" or (kind == "cli" and rec["status"] != 0)
    check = rec.get("check")
    expect = case.expect
    if check and check.startswith("LOST: "):
        return "lost", check[len("LOST: ") :], message
    if expect.kind == "intact":
        if kind == "raised" and rec["type"] not in ("SimulatedKill", "KeyboardInterrupt"):
            outcome, why = judge_message(rec, ())
            if outcome == "unclear":
                return outcome, why, message
        if kind == "cli" and rec["status"] not in (0, 2, 130):
            return "unclear", f"exit status {rec['status']}", message
        if check and check != "passed":
            return "silent", check, message
        return "ok", "", message
    if refused:
        if expect.kind == "accept":
            return "refused-valid", "a valid input was refused", message
        outcome, why = judge_message(rec, expect.fragments)
        return outcome, why, message
    if expect.kind == "refuse":
        return "silent", "accepted" + (f"; {check}" if check and check != "passed" else ""), message
    if check and check != "passed":
        return "silent", check, message
    return "ok", "", message
