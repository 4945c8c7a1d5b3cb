"""Sliding window: the most recent tokens, exact."""

from __future__ import annotations

import torch

from lola.memory.base import EMPTY, ExactStore, KVBlock

__all__ = ["SlidingWindow"]


class SlidingWindow(ExactStore):
    """The newest tokens of each row, kept exact.

    After each select-and-evict step the window holds the newest ``size`` tokens; between
    steps it also buffers the tokens that arrived since (at most ``max_pending``), so its
    storage has ``size + max_pending`` slots. Slots are kept sorted by position with the
    empty ones first, so the oldest tokens are always on the left.

    Args:
        size: ``η``, tokens kept after each step; or one size per storage head (a list),
            the storage then being sized for the largest.
        max_pending: most tokens that can arrive between two steps (the schedule's period).
    """

    name = "window"

    def __init__(self, size: int | list[int], max_pending: int = 1) -> None:
        sizes = [int(x) for x in size] if isinstance(size, (list, tuple)) else [int(size)]
        if not sizes or min(sizes) < 0:
            raise ValueError(f"window size must be >= 0 (or a non-empty list of such), got {size}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        super().__init__(max(sizes) + max_pending)
        self.size = size if isinstance(size, int) else max(sizes)
        self.head_sizes = sizes if isinstance(size, (list, tuple)) else None
        self.max_pending = int(max_pending)

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Append new tokens.

        Args:
            k, v: ``[B, Hs, L, D]`` new tokens.
            pos: ``[B, L]`` int64 positions, ``-1`` for tokens not to store (padding, sinks).

        Raises:
            RuntimeError: if a row would overflow (the schedule let more than ``max_pending``
                tokens arrive between steps); nothing is dropped silently.
        """
        block = self._require()
        hs = block.k.shape[1]
        new_pos = pos[:, None, :].expand(-1, hs, -1)
        merged = KVBlock.cat(
            [block, KVBlock(k.to(block.k.dtype), v.to(block.v.dtype), new_pos, None if block.acc is None else torch.zeros_like(new_pos, dtype=torch.float32))]
        )
        count = merged.valid.sum(-1)
        if bool((count > self.capacity).any()):
            raise RuntimeError(
                f"SlidingWindow overflow: {int(count.max())} tokens for {self.capacity} slots "
                f"(size {self.size} + max_pending {self.max_pending}); the schedule must run a step "
                f"at least every {self.max_pending} tokens"
            )
        # Sorting by position puts empty slots (-1) first and keeps tokens in order.
        order = merged.pos.argsort(dim=-1, stable=True)[..., -self.capacity :] if self.capacity else merged.pos[..., :0]
        self.block = merged.gather(order)

    def pop_oldest(self, rows: torch.Tensor) -> KVBlock:
        """Remove all but the newest ``size`` tokens of the given rows.

        Args:
            rows: ``[B]`` bool, rows at a select-and-evict step.

        Returns:
            The removed tokens as a block of ``[B, Hs, capacity]`` slots (empty elsewhere).
        """
        block = self._require()
        slot = torch.arange(self.capacity, device=block.pos.device)
        keep = torch.tensor(self.head_sizes, device=slot.device).view(-1, 1) if self.head_sizes else self.size
        if self.head_sizes and len(self.head_sizes) != block.pos.shape[1]:
            raise ValueError(f"window has {len(self.head_sizes)} per-head sizes for {block.pos.shape[1]} storage heads")
        leaving = block.valid & (slot < self.capacity - keep) & rows[:, None, None]
        out = KVBlock(block.k, block.v, torch.where(leaving, block.pos, EMPTY), block.acc)
        # Leaving slots are the leftmost valid ones, so the sort order is kept.
        self.block = KVBlock(block.k, block.v, torch.where(leaving, EMPTY, block.pos), block.acc)
        return out

    def __repr__(self) -> str:
        size = self.head_sizes if self.head_sizes else self.size
        return f"SlidingWindow(size={size}, max_pending={self.max_pending})"
