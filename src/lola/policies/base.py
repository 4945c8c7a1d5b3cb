"""The scoring-policy interface and what a policy may look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch

from lola.memory.base import KVBlock
from lola.memory.linear_state import LinearState
from lola.memory.query_stats import QueryStatistics

__all__ = ["ScoringContext", "ScoringPolicy", "keeps_tallies"]


@dataclass
class ScoringContext:
    """What a policy can read when it scores candidates at a select-and-evict step.

    Attributes:
        linear: the layer's :class:`~lola.memory.LinearState` *before* this step's evictions;
            its tensors are also :attr:`H` and :attr:`s`.
        feature_map_k: the layer's key feature map, ``[B, H, N, D] -> [B, H, N, F]``.
        num_heads: ``H``, query heads.
        step: ``[B]`` int64 position of the token at which each row's step runs.
        scale: the softmax scale of the layer's logits.
        layer: the layer's index in its model (``None`` for a standalone layer).
        queries: running statistics of the layer's recent queries (mean, covariance per query
            head), present when the policy sets ``needs_queries = True``; else ``None``.
        leaving: ``[B, Hs, N]`` bool, the candidates leaving the window at this step (the others
            are the sparse cache's); ``None`` outside a select-and-evict step.
    """

    linear: LinearState
    feature_map_k: Callable[[torch.Tensor], torch.Tensor]
    num_heads: int
    step: torch.Tensor
    scale: float = 1.0
    layer: int | None = None
    queries: QueryStatistics | None = None
    leaving: torch.Tensor | None = None
    _features: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def H(self) -> torch.Tensor:
        """``[B, H, F, D]`` float32 ``Σ φ(k) vᵀ`` over the tokens in the linear state."""
        return self.linear.state[0]

    @property
    def s(self) -> torch.Tensor:
        """``[B, H, F]`` float32 ``Σ φ(k)`` over the tokens in the linear state."""
        return self.linear.state[1]

    def group(self, block: KVBlock) -> int:
        """Query heads per storage head of ``block``."""
        return self.num_heads // block.k.shape[1]

    def expand_heads(self, x: torch.Tensor, group: int) -> torch.Tensor:
        """``[B, Hs, ...] -> [B, H, ...]``: each storage head serves ``group`` query heads."""
        return x if group == 1 else x.repeat_interleave(group, dim=1)

    def reduce_heads(self, x: torch.Tensor, group: int, how: str = "mean") -> torch.Tensor:
        """``[B, H, N] -> [B, Hs, N]``: ``"mean"`` or ``"max"`` over the query heads sharing a storage head."""
        if how not in ("mean", "max"):
            raise ValueError(f"how must be 'mean' or 'max', got {how!r}")
        if group == 1:
            return x
        x = x.unflatten(1, (-1, group))
        return x.mean(dim=2) if how == "mean" else x.amax(dim=2)

    def key_features(self, block: KVBlock) -> torch.Tensor:
        """``φ(k)`` of the block's keys for every query head, ``[B, H, N, F]`` float32.

        Computed once per key tensor within a step (the policy scores the candidates, the
        composer folds the evicted ones: the same keys).
        """
        if self._features is not None and self._features[0] is block.k:
            return self._features[1]
        fk = self.feature_map_k(self.expand_heads(block.k, self.group(block)))
        self._features = (block.k, fk)
        return fk


@runtime_checkable
class ScoringPolicy(Protocol):
    """Decides which candidates stay exact in the sparse cache.

    ``score`` returns ``[B, Hs, N]`` with **higher = keep exact**; the composer keeps the
    top-``λ`` valid candidates and folds the rest into the linear state. Scores of empty slots
    are ignored. Set ``needs_attention = True`` to have the composer track the attention mass
    each exact token receives (``candidates.acc``), and ``needs_queries = True`` (optionally
    with ``query_half_life``) to get running query statistics in ``ctx.queries``. A policy that
    sets ``keeps_scores = True`` has the composer keep, in ``candidates.acc``, the score each
    cached token was last kept with (its scores must then be finite and ``>= 0``; see
    :class:`~lola.policies.ScoredAtExit`).
    """

    needs_attention: bool

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        """Score ``candidates`` (``k, v [B, Hs, N, D]``, ``pos [B, Hs, N]``): ``[B, Hs, N]``."""
        ...


def keeps_tallies(policy: object) -> bool:
    """Whether the exact slots carry a float32 tally for ``policy``: the attention mass each
    received (``needs_attention``) or the score each was kept with (``keeps_scores``)."""
    return bool(getattr(policy, "needs_attention", False) or getattr(policy, "keeps_scores", False))
