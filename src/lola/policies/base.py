"""The scoring-policy interface and what a policy may look at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import torch

from lola.memory.base import KVBlock
from lola.memory.linear_state import LinearState

__all__ = ["ScoringContext", "ScoringPolicy"]


@dataclass
class ScoringContext:
    """What a policy can read when it scores candidates at a select-and-evict step.

    Attributes:
        linear: the layer's :class:`~lola.memory.LinearState` *before* this step's evictions
            (``H [B, H, F, D]``, ``s [B, H, F]``, float32).
        feature_map_k: the layer's key feature map, ``[B, H, N, D] -> [B, H, N, F]``.
        num_heads: ``H``, query heads.
        step: ``[B]`` int64 position of the token at which each row's step runs.
    """

    linear: LinearState
    feature_map_k: Callable[[torch.Tensor], torch.Tensor]
    num_heads: int
    step: torch.Tensor

    def group(self, block: KVBlock) -> int:
        """Query heads per storage head of ``block``."""
        return self.num_heads // block.k.shape[1]

    def expand_heads(self, x: torch.Tensor, group: int) -> torch.Tensor:
        """``[B, Hs, ...] -> [B, H, ...]``: each storage head serves ``group`` query heads."""
        return x if group == 1 else x.repeat_interleave(group, dim=1)

    def reduce_heads(self, x: torch.Tensor, group: int) -> torch.Tensor:
        """``[B, H, N] -> [B, Hs, N]``: mean over the query heads sharing a storage head."""
        return x if group == 1 else x.unflatten(1, (-1, group)).mean(dim=2)

    def key_features(self, block: KVBlock) -> torch.Tensor:
        """``φ(k)`` of the block's keys for every query head, ``[B, H, N, F]`` float32."""
        return self.feature_map_k(self.expand_heads(block.k, self.group(block)))


@runtime_checkable
class ScoringPolicy(Protocol):
    """Decides which candidates stay exact in the sparse cache.

    ``score`` returns ``[B, Hs, N]`` with **higher = keep exact**; the composer keeps the
    top-``λ`` valid candidates and folds the rest into the linear state. Scores of empty slots
    are ignored. Set ``needs_attention = True`` to have the composer track the attention mass
    each exact token receives (``candidates.acc``).
    """

    needs_attention: bool

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        """Score ``candidates`` (``k, v [B, Hs, N, D]``, ``pos [B, Hs, N]``): ``[B, Hs, N]``."""
        ...
