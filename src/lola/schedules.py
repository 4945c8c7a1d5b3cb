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

    Args:
        chunk: ``C >= 1``; the LoLA authors use ``C = η``.
    """

    chunk: int

    def __post_init__(self) -> None:
        if not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"chunk must be an integer >= 1, got {self.chunk!r}")

    @property
    def period(self) -> int:
        return self.chunk

    def tokens_until_step(self, seen: torch.Tensor) -> torch.Tensor:
        return self.chunk - seen % self.chunk


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
def _chunkwise(chunk: int) -> Chunkwise:
    return Chunkwise(chunk)


@register("tokenwise")
def _tokenwise(chunk: int) -> Tokenwise:  # the chunk size does not apply
    return Tokenwise()
