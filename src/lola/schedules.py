"""Update schedules: when the select-and-evict step runs.

A schedule maps the number of real tokens a row has seen to the number of tokens until (and
including) its next step. The step runs *after* that token is written and *before* it reads,
so with :class:`Tokenwise` and window ``η`` every query sees exactly its ``η`` newest tokens
(itself included) in the window, as LoLCATs' sliding-window attention does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Chunkwise", "Tokenwise", "UpdateSchedule"]


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
