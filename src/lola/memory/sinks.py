"""Attention sinks: the first real tokens of each row, pinned in exact memory forever."""

from __future__ import annotations

import torch

from lola.memory.base import EMPTY, ExactStore, KVBlock

__all__ = ["SinkTokens"]


class SinkTokens(ExactStore):
    """Pins the tokens at positions ``0 … n−1`` of each row (StreamingLLM-style sinks).

    Positions count real tokens only, so with left padding the sinks are the first *real*
    tokens of the row. Slot ``i`` holds the token at position ``i``.

    Args:
        n: number of sink tokens (``0`` disables sinks).
    """

    name = "sinks"

    def write(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Store the tokens whose position is below ``n``.

        Args:
            k, v: ``[B, Hs, L, D]`` new tokens.
            pos: ``[B, L]`` int64 positions (``-1`` for padding).

        Returns:
            ``[B, L]`` bool: the tokens taken as sinks (the caller writes the rest elsewhere).
        """
        block = self._require()
        taken = (pos >= 0) & (pos < self.capacity)
        if not bool(taken.any()):
            return taken
        hs, d = k.shape[1], k.shape[-1]
        # Untaken tokens are routed to a scratch slot past the end, then dropped.
        slot = torch.where(taken, pos, self.capacity)  # [B, L]
        idx = slot[:, None, :].expand(-1, hs, -1)
        kv = []
        for dst, src in ((block.k, k), (block.v, v)):
            buf = torch.cat([dst, dst.new_zeros(dst.shape[0], hs, 1, d)], dim=2)
            buf.scatter_(2, idx.unsqueeze(-1).expand(-1, -1, -1, d), src.to(dst.dtype))
            kv.append(buf[:, :, : self.capacity])
        pbuf = torch.cat([block.pos, block.pos.new_full((block.pos.shape[0], hs, 1), EMPTY)], dim=2)
        pbuf.scatter_(2, idx, torch.where(taken, pos, EMPTY)[:, None, :].expand(-1, hs, -1))
        self.block = KVBlock(kv[0], kv[1], pbuf[:, :, : self.capacity], block.acc)
        return taken

    @property
    def contents(self) -> KVBlock:
        """The pinned slots, ``[B, Hs, n, ·]``."""
        return self._require()
