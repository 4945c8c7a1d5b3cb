"""Each row's count of real tokens, and its countdown to the next schedule step.

The count lives on the state's device (``seen``, saved with the state). The decode path also
keeps host copies, so that a token per row needs no device read: each row's count, read from
the device once when unknown (a padded segment, a loaded or reordered state), then advanced on
the host; and each row's tokens until its next step, asked of the schedule on those copies.
"""

from __future__ import annotations

import torch

__all__ = ["RowCounts", "ask_prefill", "ask_schedule", "check_until"]


class RowCounts:
    """``seen [B]`` int64 on the device, and its host copies (``None`` while unknown).

    Attributes:
        seen: ``[B]`` real tokens each row has seen, or ``None`` before allocation.
        host: each row's count on the host, or ``None`` (read from ``seen`` when asked).
        due: each row's tokens until its next step (1: the step falls on its next token), or
            ``None`` (asked of the schedule when needed).
    """

    def __init__(self) -> None:
        self.set(None)

    def set(self, seen: torch.Tensor | None) -> None:
        """Hold ``seen`` (a change the host cannot follow: its copies are read again when asked)."""
        self.seen = seen
        self.host: list[int] | None = None
        self.due: list[int] | None = None

    def host_seen(self) -> list[int]:
        """Each row's count on the host (one device read after a change the host cannot follow)."""
        if self.host is None:
            self.host = self.seen.tolist()
        return self.host

    def host_range(self) -> tuple[int, int]:
        """The least and the greatest count over the rows (``(0, 0)`` for no rows)."""
        seen = self.host_seen()
        return (min(seen), max(seen)) if seen else (0, 0)

    def in_step(self) -> bool:
        """Whether every row has seen the same number of tokens (known on the host)."""
        lo, hi = self.host_range()
        return lo == hi

    def host_due(self, schedule: object) -> list[int]:
        """Each row's tokens until its next step, asked of ``schedule`` on the host copies (no
        device value is read)."""
        if self.due is None:
            until = ask_schedule(schedule, torch.tensor(self.host_seen(), dtype=torch.long)).tolist()
            check_until(schedule, min(until, default=1), max(until, default=1))
            self.due = until
        return self.due

    def advance(self, n: int | torch.Tensor) -> None:
        """``seen += n``: an int for every row (the host copy follows; the countdown is the
        caller's to keep), or a ``[B]`` tensor (the host copies are then unknown)."""
        host = self.host
        self.set(self.seen + n)
        if isinstance(n, int) and host is not None:
            self.host = [x + n for x in host]


def ask_schedule(schedule: object, seen: torch.Tensor) -> torch.Tensor:
    """``schedule.tokens_until_step(seen)``, the one way the engine asks a schedule: a plug-in's
    failure, or an answer that is not an integer tensor shaped and placed like ``seen [B]``, is
    an error naming the schedule. Only metadata is read here (no device sync); the values are
    checked by :func:`check_until` with the read the caller already makes."""
    return _ask(schedule, "tokens_until_step", seen)


def ask_prefill(schedule: object, seen: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """``schedule.prefill_until_step(seen, remaining)`` (a call of many tokens, ``remaining [B]``
    left), checked as :func:`ask_schedule` checks its answer."""
    return _ask(schedule, "prefill_until_step", seen, remaining)


def _ask(schedule: object, method: str, seen: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
    try:
        until = getattr(schedule, method)(seen, *more)
    except (MemoryError, torch.OutOfMemoryError):  # not the schedule's fault: kept as it is
        raise
    except Exception as err:
        raise RuntimeError(f"schedule {schedule!r} failed in {method}(): {type(err).__name__}: {err}") from err
    expected = f"an integer tensor [B] = {tuple(seen.shape)} on {seen.device}"
    if not isinstance(until, torch.Tensor):
        raise TypeError(f"schedule {schedule!r} returned {type(until).__name__} {until!r} from {method}(), expected {expected}")
    if until.dtype == torch.bool or until.is_floating_point() or until.is_complex():
        raise TypeError(f"schedule {schedule!r} returned {until.dtype} from {method}(), expected {expected} (a whole number of tokens)")
    if until.shape != seen.shape:
        raise ValueError(f"schedule {schedule!r} returned shape {tuple(until.shape)} from {method}(), expected {expected}")
    if until.device != seen.device:
        raise ValueError(f"schedule {schedule!r} returned a tensor on {until.device} from {method}(), expected {expected}")
    return until


def check_until(schedule: object, lo: int, hi: int, period: int | None = None) -> None:
    """Refuse a schedule whose answers (``lo..hi`` over the rows) leave ``1..period`` (its
    ``period``, or the prefill period given): with 0 no block would ever end, beyond the period
    the window would overflow. Every path that asks the schedule checks here."""
    period = schedule.period if period is None else period
    if lo < 1 or hi > period:
        bad = lo if lo < 1 else hi
        raise ValueError(f"schedule {schedule!r} returned {bad} tokens until its step, expected 1..{period} (its period)")
