"""Slots of keys and values (:class:`KVBlock`) and a segment's queries (:class:`QueryBlock`).

Stored memories use the ``[B, Hs, N, ·]`` layout of transformers caches: ``Hs`` storage heads
(the K/V heads, or the query heads when keys are stored per query head), ``N`` slots. A slot
is empty when its position is ``-1`` (:data:`EMPTY`); positions are the per-row count of real
tokens seen before the token (``0`` for the first real token of a row), so padding never gets one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EMPTY", "KVBlock", "QueryBlock"]

#: Position of an empty slot.
EMPTY = -1


@dataclass
class KVBlock:
    """A set of key/value slots.

    Attributes:
        k: ``[B, Hs, N, D]`` keys (RoPE applied).
        v: ``[B, Hs, N, D]`` values.
        pos: ``[B, Hs, N]`` int64 token positions; ``-1`` marks an empty slot.
        acc: optional ``[B, Hs, N]`` float32 attention mass received so far
            (kept only for policies that score by attention).
    """

    k: torch.Tensor
    v: torch.Tensor
    pos: torch.Tensor
    acc: torch.Tensor | None = None

    @property
    def valid(self) -> torch.Tensor:
        """``[B, Hs, N]`` bool: slots that hold a token."""
        return self.pos >= 0

    @property
    def size(self) -> int:
        """Number of slots ``N``."""
        return self.pos.shape[-1]

    def masked(self, keep: torch.Tensor) -> "KVBlock":
        """The same slots with those where ``keep [B, Hs, N]`` is false marked empty."""
        return KVBlock(self.k, self.v, torch.where(keep, self.pos, EMPTY), self.acc)

    def gather(self, index: torch.Tensor) -> "KVBlock":
        """Slots picked by ``index [B, Hs, M]`` (int64) along the slot axis."""
        idx = index.unsqueeze(-1).expand(-1, -1, -1, self.k.shape[-1])
        acc = None if self.acc is None else self.acc.gather(2, index)
        return KVBlock(self.k.gather(2, idx), self.v.gather(2, idx), self.pos.gather(2, index), acc)

    @staticmethod
    def cat(blocks: list["KVBlock"]) -> "KVBlock":
        """Concatenate blocks along the slot axis (``acc`` kept only if all blocks have it)."""
        accs = [b.acc for b in blocks]
        acc = torch.cat(accs, dim=2) if all(a is not None for a in accs) else None
        return KVBlock(
            torch.cat([b.k for b in blocks], dim=2),
            torch.cat([b.v for b in blocks], dim=2),
            torch.cat([b.pos for b in blocks], dim=2),
            acc,
        )


@dataclass
class QueryBlock:
    """A block of queries read against the memories.

    Attributes:
        q: ``[B, H, L, D]`` queries (RoPE applied).
        fq: ``[B, H, L, F]`` float32 feature-mapped queries ``φ(q)``.
        pos: ``[B, L]`` int64 positions; ``-1`` for padding (reads nothing).
        scale: softmax scale (``1/√D`` by default).
    """

    q: torch.Tensor
    fq: torch.Tensor
    pos: torch.Tensor
    scale: float
