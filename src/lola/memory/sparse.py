"""Sparse cache: the ``λ`` tokens a scoring policy wants kept exact."""

from __future__ import annotations

import torch

from lola.memory.base import ExactStore, KVBlock

__all__ = ["SparseCache"]


class SparseCache(ExactStore):
    """Exact storage for the top-``size`` tokens by a policy's score.

    The cache holds no ordering; visibility is decided by positions, and every cached token is
    older than any query that reads it.

    Args:
        size: ``λ``, the number of slots per (row, storage head).
    """

    name = "sparse"

    def select(self, candidates: KVBlock, scores: torch.Tensor, rows: torch.Tensor) -> KVBlock:
        """Keep the top-``size`` candidates by score; return the rest.

        Args:
            candidates: ``[B, Hs, M, ·]`` slots: the tokens leaving the window *and* the current
                cache contents (so cached tokens are re-scored every step).
            scores: ``[B, Hs, M]`` higher = keep exact. Empty slots are never kept over a token.
            rows: ``[B]`` bool, rows at a step; other rows keep their cache unchanged.

        Returns:
            The evicted tokens, ``[B, Hs, M]`` slots (empty where kept or not a candidate).
        """
        block = self._require()
        valid = candidates.valid & rows[:, None, None]
        scores = torch.where(valid, scores.float(), float("-inf"))
        keep = torch.zeros_like(valid)
        if self.capacity > 0:
            top = scores.topk(self.capacity, dim=-1, sorted=False).indices  # [B, Hs, λ]
            keep.scatter_(-1, top, True)
            chosen = candidates.gather(top).masked(valid.gather(-1, top))
            row = rows[:, None, None]
            self.block = KVBlock(
                torch.where(row[..., None], chosen.k, block.k),
                torch.where(row[..., None], chosen.v, block.v),
                torch.where(row, chosen.pos, block.pos),
                None if block.acc is None else torch.where(row, chosen.acc, block.acc),
            )
        return candidates.masked(valid & ~keep)
