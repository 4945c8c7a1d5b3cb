"""One layout of per-head slots held without padding: each storage head's own slots, one
after another, in one run per row.

A store with one size per storage head (the sparse cache under calibrated budgets) is read and
written as a padded block ``[B, Hs, W, ·]`` (``W`` the widest head; head ``h`` fills only its
first ``w_h`` slots) but held, saved and shipped as the run ``[B, 1, Σ w_h, ·]``: head ``h``'s
slots are ``offsets[h]:offsets[h + 1]`` of it. This module is that layout's one definition; the
layer's slot buffer holds its run in it (:class:`lola.memory.slots.SlotBuffer`) and the sparse
cache saves its state in it (:meth:`lola.memory.SparseCache.state_dict`).
"""

from __future__ import annotations

import torch

from lola.memory.blocks import EMPTY, KVBlock

__all__ = ["HeadRuns"]


class HeadRuns:
    """The run layout of per-head widths ``widths`` (one int >= 0 per storage head)."""

    def __init__(self, widths: list[int] | tuple[int, ...]) -> None:
        if not widths or min(int(w) for w in widths) < 0:
            raise ValueError(f"per-head widths must be a non-empty list of ints >= 0, got {list(widths)}")
        self.widths = tuple(int(w) for w in widths)
        #: head ``h``'s slots are ``offsets[h]:offsets[h + 1]`` of the run
        self.offsets = tuple(int(x) for x in torch.tensor((0, *self.widths)).cumsum(0).tolist())
        self._index: dict[str, torch.Tensor] = {}

    @property
    def heads(self) -> int:
        return len(self.widths)

    @property
    def total(self) -> int:
        """Slots of the run per row, ``Σ w_h``."""
        return self.offsets[-1]

    @property
    def padded_width(self) -> int:
        """Slots per head of the padded block, ``max w_h``."""
        return max(self.widths)

    def padded_index(self, device: torch.device) -> torch.Tensor:
        """``[Σ w_h]`` int64: where each slot of the run sits in the padded block flattened over
        ``(head, slot)``: head ``h``'s ``r``-th slot (run index ``offsets[h] + r``) at ``h · W + r``."""
        key = str(device)
        found = self._index.get(key)
        if found is None:
            w = self.padded_width
            flat = [h * w + r for h, width in enumerate(self.widths) for r in range(width)]
            found = self._index[key] = torch.tensor(flat, dtype=torch.long, device=device)
        return found

    def beyond(self, device: torch.device) -> torch.Tensor:
        """``[Hs, W]`` bool: the padded block's slots past each head's width (always empty)."""
        slot = torch.arange(self.padded_width, device=device)
        return slot >= torch.tensor(self.widths, device=device).view(-1, 1)

    def pack(self, block: KVBlock) -> KVBlock:
        """The run ``[B, 1, Σ w_h, ·]`` of ``block [B, Hs, W, ·]``'s first ``w_h`` slots of each
        head (the slots past a head's width are dropped: empty by the store's contract)."""
        if block.pos.shape[1:] != (self.heads, self.padded_width):
            raise ValueError(
                f"a block of {self.heads} heads × {self.padded_width} slots was expected for widths {list(self.widths)}, got {tuple(block.pos.shape)}"
            )
        flat = self.padded_index(block.pos.device)

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.flatten(1, 2).index_select(1, flat).unsqueeze(1)

        return KVBlock(pick(block.k), pick(block.v), pick(block.pos), pick(block.acc))

    def unpack(self, run: KVBlock) -> KVBlock:
        """The padded block ``[B, Hs, W, ·]`` of ``run [B, 1, Σ w_h, ·]``: the slots past a head's
        width empty (zero ``k, v, acc``, ``pos`` :data:`~lola.memory.EMPTY`)."""
        if tuple(run.pos.shape[1:]) != (1, self.total):
            raise ValueError(
                f"a run of {self.total} slots per row [B, 1, {self.total}] was expected for widths {list(self.widths)}, got {tuple(run.pos.shape)}"
            )
        flat = self.padded_index(run.pos.device)
        b, hs, w = run.pos.shape[0], self.heads, self.padded_width

        def spread(t: torch.Tensor | None, fill: float) -> torch.Tensor | None:
            if t is None:
                return None
            out = t.new_full((b, hs * w, *t.shape[3:]), fill)
            return out.index_copy(1, flat, t[:, 0]).view(b, hs, w, *t.shape[3:])

        return KVBlock(spread(run.k, 0), spread(run.v, 0), spread(run.pos, EMPTY), spread(run.acc, 0))

    def __repr__(self) -> str:
        return f"HeadRuns({list(self.widths)})"
