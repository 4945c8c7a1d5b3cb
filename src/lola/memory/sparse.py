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
        size: ``λ``, the number of slots per (row, storage head); or one size per storage head
            (a list), the storage then being sized for the largest.
    """

    name = "sparse"

    def __init__(self, size: int | list[int]) -> None:
        sizes = [int(x) for x in size] if isinstance(size, (list, tuple)) else [int(size)]
        if not sizes or min(sizes) < 0:
            raise ValueError(f"sparse cache size must be >= 0 (or a non-empty list of such), got {size}")
        super().__init__(max(sizes))
        self.head_sizes = sizes if isinstance(size, (list, tuple)) else None

    def __repr__(self) -> str:
        return f"SparseCache({self.head_sizes if self.head_sizes else self.capacity})"

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
            if self.head_sizes and len(self.head_sizes) != scores.shape[1]:
                raise ValueError(f"sparse cache has {len(self.head_sizes)} per-head sizes for {scores.shape[1]} storage heads")
            top = scores.topk(self.capacity, dim=-1, sorted=bool(self.head_sizes)).indices  # [B, Hs, λ]
            picked = valid.gather(-1, top)
            if self.head_sizes:  # head h keeps only its best head_sizes[h]
                rank = torch.arange(self.capacity, device=top.device)
                picked = picked & (rank < torch.tensor(self.head_sizes, device=top.device).view(-1, 1))
            keep.scatter_(-1, top, picked)
            chosen = candidates.gather(top).masked(picked)
            row = rows[:, None, None]
            self.block = KVBlock(
                torch.where(row[..., None], chosen.k, block.k),
                torch.where(row[..., None], chosen.v, block.v),
                torch.where(row, chosen.pos, block.pos),
                None if block.acc is None else torch.where(row, chosen.acc, block.acc),
            )
        return candidates.masked(valid & ~keep)
