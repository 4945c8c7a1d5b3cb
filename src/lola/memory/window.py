"""Sliding window: the most recent tokens, exact."""

from __future__ import annotations

import torch

from lola.memory.base import EMPTY, ExactStore, KVBlock, drop_unless_declared

__all__ = ["SlidingWindow"]


class SlidingWindow(ExactStore):
    """The newest tokens of each row, kept exact.

    After each select-and-evict step the window holds the newest ``size`` tokens; between
    steps it also buffers the tokens that arrived since (at most ``max_pending``), so its
    storage has ``size + max_pending`` slots. The slots form a ring: the token at position
    ``p`` lives in slot ``p % capacity``, so a new token is written in place and nothing
    moves (the tokens held are always consecutive positions, so they never collide).

    Args:
        size: ``η``, tokens kept after each step; or one size per storage head (a list),
            the storage then being sized for the largest.
        max_pending: most tokens that can arrive between two steps (the schedule's period).
    """

    name = "window"
    #: Declared capability: the token at position ``p`` lives in slot ``p % capacity`` and
    #: :meth:`push` writes one there (what a server's pages write back, token by token).
    ring = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        drop_unless_declared(cls, "ring", ("append", "push", "pop_oldest"))

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
        self._keep: torch.Tensor | None = None  # per-head sizes as a [Hs, 1] tensor, made once

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Append new tokens.

        Args:
            k, v: ``[B, Hs, L, D]`` new tokens.
            pos: ``[B, L]`` int64 positions, ``-1`` for tokens not to store (padding, sinks).

        Raises:
            RuntimeError: if a row would overflow (the schedule let more than ``max_pending``
                tokens arrive between steps); nothing is written then, nothing dropped silently.
        """
        block = self._require()
        b, hs, cap = block.pos.shape
        store = pos >= 0
        slot = torch.where(store, pos % cap, cap)  # [B, L]; the rest go to a scratch slot
        held = block.pos.gather(2, slot.clamp(max=cap - 1)[:, None, :].expand(-1, hs, -1)) >= 0
        if k.shape[2] > cap or bool((held & store[:, None, :]).any()):
            count = int((block.pos >= 0).sum(-1).max()) + int(store.sum(1).max())
            raise RuntimeError(
                f"SlidingWindow overflow: {count} tokens for {cap} slots "
                f"(size {self.size} + max_pending {self.max_pending}); the schedule must run a step "
                f"at least every {self.max_pending} tokens"
            )
        idx = slot[:, None, :].expand(-1, hs, -1)
        in_place = self._writes_in_place() and (torch.is_inference_mode_enabled() or not block.k.is_inference())
        if in_place and k.shape[2] <= cap and bool(store.all()):
            # every token has a slot of its own (no scratch slot needed): scattered in place
            at = idx.unsqueeze(-1).expand(*idx.shape, k.shape[-1])
            block.k.scatter_(2, at, k.to(block.k.dtype))
            block.v.scatter_(2, at, v.to(block.v.dtype))
            block.pos.scatter_(2, idx, pos[:, None, :].expand(-1, hs, -1))
            if block.acc is not None:
                block.acc.scatter_(2, idx, 0.0)
            return
        self.block = KVBlock(
            _put(block.k, idx, k),
            _put(block.v, idx, v),
            _put(block.pos, idx, pos[:, None, :].expand(-1, hs, -1)),
            None if block.acc is None else _put(block.acc, idx, torch.zeros(idx.shape, dtype=torch.float32, device=idx.device)),
        )

    def push(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, position: torch.Tensor | int) -> None:
        """Decode fast path: one token per row, written into its ring slot (in place unless
        autograd or a deferred read needs the old contents). No overflow check: the composer guarantees a step
        at least every ``max_pending`` tokens.

        Args:
            k, v: ``[B, Hs, 1, D]`` the new tokens.
            pos: ``[B, 1]`` int64 position to store, ``-1`` to leave the slot empty (a sink).
            position: ``[B]`` int64 each token's position, picking slot ``position % capacity``;
                or one int, the slot itself, when every row writes the same one.
        """
        block = self._require()
        b, hs, cap = block.pos.shape
        if not self._writes_in_place():
            # out of place: earlier reads may be saved for backward, or held by a deferred read
            ring = torch.arange(cap, device=block.pos.device).view(1, 1, cap)
            at = ring == (position if isinstance(position, int) else (position % cap).view(b, 1, 1))  # [B or 1, 1, cap]
            self.block = KVBlock(
                torch.where(at[..., None], k.to(block.k.dtype), block.k),
                torch.where(at[..., None], v.to(block.v.dtype), block.v),
                torch.where(at, pos.view(b, 1, 1), block.pos),
                None if block.acc is None else torch.where(at, 0.0, block.acc),
            )
            return
        if isinstance(position, int):
            block.k.narrow(2, position, 1).copy_(k)
            block.v.narrow(2, position, 1).copy_(v)
            block.pos.narrow(2, position, 1).copy_(pos.view(b, 1, 1))
            if block.acc is not None:
                block.acc.narrow(2, position, 1).zero_()
            return
        slot = (position % cap).view(b, 1, 1).expand(b, hs, 1)
        kv_slot = slot.unsqueeze(-1).expand(b, hs, 1, k.shape[-1])
        block.k.scatter_(2, kv_slot, k.to(block.k.dtype))
        block.v.scatter_(2, kv_slot, v.to(block.v.dtype))
        block.pos.scatter_(2, slot, pos.view(b, 1, 1).expand(b, hs, 1))
        if block.acc is not None:
            block.acc.scatter_(2, slot, 0.0)

    def pop_oldest(self, rows: torch.Tensor) -> KVBlock:
        """Remove all but the newest ``size`` tokens of the given rows.

        Args:
            rows: ``[B]`` bool, rows at a select-and-evict step.

        Returns:
            The removed tokens, ``[B, Hs, M]`` slots with ``M`` the most removed from any (row,
            head), empty slots padding the others (scoring and folding cost follows ``M``).
        """
        block = self._require()
        if self.head_sizes:
            if len(self.head_sizes) != block.pos.shape[1]:
                raise ValueError(f"window has {len(self.head_sizes)} per-head sizes for {block.pos.shape[1]} storage heads")
            if self._keep is None or self._keep.device != block.pos.device:
                self._keep = torch.tensor(self.head_sizes, device=block.pos.device).view(-1, 1)
            keep = self._keep
        else:
            keep = self.size
        # The held positions are consecutive: the newest `keep` are those above newest - keep.
        newest = block.pos.amax(dim=-1, keepdim=True)
        leaving = block.valid & (block.pos <= newest - keep) & rows[:, None, None]
        out = KVBlock(block.k, block.v, torch.where(leaving, block.pos, EMPTY), block.acc)
        self.block = KVBlock(block.k, block.v, torch.where(leaving, EMPTY, block.pos), block.acc)
        m = int(leaving.sum(-1).max())
        if m < block.pos.shape[-1]:  # keep the leaving slots only (in ring order, padded)
            out = out.gather(torch.argsort((~leaving).to(torch.uint8), dim=-1, stable=True)[..., :m])
        return out

    def resize_pending(self, max_pending: int) -> KVBlock | None:
        """Room for ``max_pending`` tokens between steps (a call that steps less often holds
        more): the capacity becomes ``size + max_pending`` and the held tokens move to their ring
        slots of it. Returns the slots re-placed, ``[B, Hs, capacity, ·]`` (``None`` before
        allocation), for the owner of a bound store's buffer to hold (:meth:`lola.memory.slots.SlotBuffer.resize`).

        Raises:
            ValueError: ``max_pending < 1``.
            RuntimeError: more tokens are held than the new capacity has slots.
        """
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        cap = self.size + max_pending
        block = self.block
        moved = None
        if block is not None:
            held = int(block.valid.sum(-1).max()) if block.pos.numel() else 0
            if held > cap:
                raise RuntimeError(f"SlidingWindow holds {held} tokens, more than the {cap} slots of size {self.size} + max_pending {max_pending}")
            idx = torch.where(block.valid, block.pos % cap, cap)
            b, hs, _ = block.pos.shape
            empty = lambda t, fill: torch.full((b, hs, cap, *t.shape[3:]), fill, dtype=t.dtype, device=t.device)  # noqa: E731
            moved = KVBlock(
                _put(empty(block.k, 0), idx, block.k),
                _put(empty(block.v, 0), idx, block.v),
                _put(empty(block.pos, EMPTY), idx, block.pos),
                None if block.acc is None else _put(empty(block.acc, 0), idx, block.acc),
            )
        self.max_pending, self.capacity = max_pending, cap
        if self._slots is None and moved is not None:
            self.block = moved
        return moved

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a saved window; tokens are placed in their ring slots (a state saved with
        another slot order loads the same)."""
        super().load_state_dict(state)
        block = self.block
        if block is None or block.pos.shape[-1] == 0:
            return
        cap = block.pos.shape[-1]
        idx = torch.where(block.valid, block.pos % cap, cap)
        claims = torch.zeros(*idx.shape[:2], cap + 1, dtype=torch.long, device=idx.device).scatter_add_(2, idx, torch.ones_like(idx))
        if bool((claims[:, :, :cap] > 1).any()):
            raise ValueError("SlidingWindow state holds tokens that collide in the ring (at most `capacity` consecutive positions)")
        empty = KVBlock(
            torch.zeros_like(block.k), torch.zeros_like(block.v), torch.full_like(block.pos, EMPTY), None if block.acc is None else torch.zeros_like(block.acc)
        )
        self.block = KVBlock(
            _put(empty.k, idx, block.k),
            _put(empty.v, idx, block.v),
            _put(empty.pos, idx, block.pos),
            None if block.acc is None else _put(empty.acc, idx, block.acc),
        )

    def __repr__(self) -> str:
        size = self.head_sizes if self.head_sizes else self.size
        return f"{type(self).__name__}(size={size}, max_pending={self.max_pending})"


def _put(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst [B, Hs, N, ...]`` with ``src [B, Hs, L, ...]`` written at slots ``idx [B, Hs, L]``
    (out of place); index ``N`` is a scratch slot whose writes are dropped."""
    n = dst.shape[2]
    buf = torch.cat([dst, dst.new_zeros(*dst.shape[:2], 1, *dst.shape[3:])], dim=2)
    index = idx.view(*idx.shape, *([1] * (dst.dim() - 3))).expand(*idx.shape, *dst.shape[3:])
    return buf.scatter(2, index, src.to(dst.dtype))[:, :, :n].contiguous()
