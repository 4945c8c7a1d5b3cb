"""Update schedules: when the select-and-evict step runs.

A schedule maps the number of real tokens a row has seen to the number of tokens until (and
including) its next step. The step runs *after* that token is written and *before* it reads,
so with :class:`Tokenwise` and window ``η`` every query sees exactly its ``η`` newest tokens
(itself included) in the window, as LoLCATs' sliding-window attention does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from lola.limits import MAX_TOKENS
from lola.registry import Registry

__all__ = ["ENTRY_POINT_GROUP", "Chunkwise", "Tokenwise", "UpdateSchedule", "available", "build", "register", "reload_entry_points", "unregister"]

ENTRY_POINT_GROUP = "lola.schedules"


@runtime_checkable
class UpdateSchedule(Protocol):
    """When the select-and-evict step runs.

    Attributes:
        period: the most tokens that can arrive between two steps (sizes the window buffer).

    A schedule may also step less often inside a call of many tokens (a prefill), as
    :class:`Chunkwise` does with ``prefill_chunk``: it then has an int ``prefill_period`` above
    ``period`` and ``prefill_until_step(seen, remaining)``, whose steps leave fewer than ``period``
    tokens waiting when the call ends (the window holds ``prefill_period`` during the call only).
    """

    period: int

    def tokens_until_step(self, seen: torch.Tensor) -> torch.Tensor:
        """``seen [B]`` int64 tokens already processed → ``[B]`` int64 in ``[1, period]``:
        the step runs after the token at position ``seen + result − 1``."""
        ...


@dataclass(frozen=True)
class Chunkwise:
    """Run the step every ``C`` tokens (after positions ``C−1, 2C−1, …``), prefill and decode alike.

    Between steps (decoding, or a prefill whose length is not a multiple of ``C``) new tokens
    wait in the window's buffer: nothing is padded.

    With ``prefill_chunk = P`` (a multiple of ``C``), a call that brings many tokens at once (a
    prefill) steps only after positions ``P−1, 2P−1, …`` and after its last position
    ``mC−1``; decoding steps every ``C`` tokens as before. Every step still falls after a multiple
    of ``C``, and a call leaves fewer than ``C`` tokens waiting, so the state between calls has
    the window buffer of ``C`` (the cache's bytes are those of ``Chunkwise(C)``); during the
    call the window holds up to ``P`` waiting tokens (:meth:`prefill_until_step`). Which steps
    run depends on how the stream is cut into calls: one prefill of ``T`` tokens and the same
    tokens in two calls may step at different positions (both are steps of ``Chunkwise(C)``).

    Args:
        chunk: ``C >= 1``; the LoLA authors use ``C = η``.
        prefill_chunk: ``P``, a multiple of ``C``, or ``None`` (``P = C``: every call steps
            every ``C`` tokens).
    """

    chunk: int
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chunk, int) or isinstance(self.chunk, bool) or self.chunk < 1:
            raise ValueError(f"chunk must be an integer >= 1, got {self.chunk!r}")
        p = self.prefill_chunk
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or p < self.chunk or p % self.chunk or p > MAX_TOKENS):
            raise ValueError(f"prefill_chunk must be a multiple of chunk ({self.chunk}) in {self.chunk}..{MAX_TOKENS}, or None, got {p!r}")

    @property
    def period(self) -> int:
        return self.chunk

    def __repr__(self) -> str:  # the plain schedule's repr as before (specs and records compare it)
        extra = f", prefill_chunk={self.prefill_chunk}" if self.prefill_chunk is not None else ""
        return f"Chunkwise(chunk={self.chunk}{extra})"

    @property
    def prefill_period(self) -> int:
        """The most tokens between two steps within a call of many tokens (``P``)."""
        return self.prefill_chunk or self.chunk

    def tokens_until_step(self, seen: torch.Tensor) -> torch.Tensor:
        return self.chunk - seen % self.chunk

    def prefill_until_step(self, seen: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
        """``[B]`` int64 tokens until the next step of a call with ``remaining [B]`` tokens left
        after ``seen [B]``: the next multiple of ``P``, or the call's last multiple of ``C`` if
        that comes first; past ``remaining`` when no multiple of ``C`` is left in the call (the
        tokens then wait for the next one)."""
        c, p = self.chunk, self.prefill_period
        end = seen + remaining
        last = end - end % c  # the step after position last - 1: the call's last multiple of C
        return torch.where(last > seen, torch.minimum(p - seen % p, last - seen), c - seen % c)


@dataclass(frozen=True)
class Tokenwise:
    """Run the step after every token (the paper's per-token update; ``≡ Chunkwise(1)``)."""

    @property
    def period(self) -> int:
        return 1

    def tokens_until_step(self, seen: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(seen)


# -- registry ------------------------------------------------------------------------------------
ScheduleFactory = Callable[..., UpdateSchedule]


def _check_schedule(name: str, factory: ScheduleFactory) -> None:
    if not callable(factory):
        raise TypeError(f"schedule {name!r} must be a callable returning an UpdateSchedule, got {factory!r}")


_SCHEDULES: Registry[ScheduleFactory] = Registry("schedule", ENTRY_POINT_GROUP, _check_schedule)


def register(name: str, factory: ScheduleFactory | None = None, *, overwrite: bool = False) -> Any:
    """Register a schedule factory under ``name`` (usable as a decorator).

    The factory is called as ``factory(chunk=cfg.chunk, **cfg.schedule_kwargs)`` and returns an
    :class:`UpdateSchedule`; ``LoLAConfig(schedule=name)`` then uses it. A third-party package
    publishes one with, in its ``pyproject.toml``::

        [project.entry-points."lola.schedules"]
        strided = "my_package.schedules:strided"
    """
    return _SCHEDULES.register(name, factory, overwrite=overwrite)


# The shared Registry's own methods (documented there): one definition for policies and schedules.
unregister = _SCHEDULES.unregister
reload_entry_points = _SCHEDULES.reload_entry_points
available = _SCHEDULES.available


def build(name: str, chunk: int, **kwargs: Any) -> UpdateSchedule:
    """The schedule registered under ``name``, built with the config's ``chunk`` and ``kwargs``.

    Raises:
        ValueError: ``name`` is unknown (the message lists the registered ones), or the factory
            returned something without ``period`` and ``tokens_until_step``.
    """
    try:
        factory = _SCHEDULES.get(name)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    schedule = factory(chunk=chunk, **kwargs)
    if not isinstance(schedule, UpdateSchedule):
        raise ValueError(f"schedule {name!r} built {schedule!r}: expected an UpdateSchedule (period and tokens_until_step)")
    period = schedule.period
    # The period sizes the window's buffer: bounded like every size (lola.limits), before
    # anything is allocated.
    if not isinstance(period, int) or isinstance(period, bool) or not 1 <= period <= MAX_TOKENS:
        raise ValueError(
            f"schedule {name!r} built {schedule!r} with period {period!r}: expected an int in 1..{MAX_TOKENS} (lola.limits.MAX_TOKENS; the period sizes the window's buffer)"
        )
    return schedule


@register("chunkwise")
def _chunkwise(chunk: int, prefill_chunk: int | None = None) -> Chunkwise:
    return Chunkwise(chunk, prefill_chunk)


@register("tokenwise")
def _tokenwise(chunk: int) -> Tokenwise:  # the chunk size does not apply
    return Tokenwise()
