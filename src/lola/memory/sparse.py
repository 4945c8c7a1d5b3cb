"""Sparse cache: the ``λ`` tokens a scoring policy wants kept exact."""

from __future__ import annotations

import torch

from lola.memory.base import ExactStore, KVBlock, drop_unless_declared
from lola.memory.head_runs import HeadRuns

__all__ = ["SparseCache"]


class SparseCache(ExactStore):
    """Exact storage for the top-``size`` tokens by a policy's score.

    The cache holds no ordering; visibility is decided by positions, and every cached token is
    older than any query that reads it.

    With one size per storage head (calibrated budgets: retrieval heads get most slots,
    streaming heads none), :attr:`block` has ``max λ_h`` slots per head and head ``h`` fills
    only its first ``λ_h`` (the others stay empty). A composer holds them *ragged* (``ragged``):
    one run of ``Σ λ_h`` slots per row, each head's own range, read beside the other exact
    slots by the same kernel call; the saved state is that run (:meth:`state_dict`), so what is
    held, saved or shipped is the budget's bytes.

    Args:
        size: ``λ``, the number of slots per (row, storage head); or one size per storage head
            (a list).
    """

    name = "sparse"
    #: Declared capability: with per-head sizes, head ``h``'s slots past ``λ_h`` are always empty, so
    #: a composer may hold only each head's own ``λ_h`` (one ragged run, no head padded).
    ragged = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        drop_unless_declared(cls, "ragged", ("select", "block", "observe_attention"))  # may fill past λ_h

    def __init__(self, size: int | list[int]) -> None:
        sizes = [int(x) for x in size] if isinstance(size, (list, tuple)) else [int(size)]
        if not sizes or min(sizes) < 0:
            raise ValueError(f"sparse cache size must be >= 0 (or a non-empty list of such), got {size}")
        self.head_sizes = sizes if isinstance(size, (list, tuple)) else None
        self.runs = HeadRuns(sizes) if self.head_sizes is not None else None  # the saved (and held) layout
        super().__init__(max(sizes))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.head_sizes if self.head_sizes else self.capacity})"

    # -- the ragged saved state (per-head sizes) -------------------------------------------------
    def _own_run(self) -> KVBlock | None:
        """The run this store's slots are held in, when its composer holds them ragged (a view)."""
        slots = self._slots
        if slots is not None and slots.ragged_name == self.name and slots.allocated:
            return slots.run
        return None

    def _pack(self, block: KVBlock) -> KVBlock:
        """Head ``h``'s first ``λ_h`` slots, one after another: ``[B, 1, Σ λ_h, ·]``."""
        if block.pos.shape[1] != len(self.head_sizes):
            raise ValueError(f"sparse cache has {len(self.head_sizes)} per-head sizes for {block.pos.shape[1]} storage heads")
        # (meta tensors hold no values: the layout a state must have is built on that device)
        if block.pos.device.type != "meta" and bool((block.valid & self.runs.beyond(block.pos.device)).any()):
            raise RuntimeError("a head holds more tokens than its sparse size (internal error)")
        return self.runs.pack(block)

    def observe_attention(self, weights: torch.Tensor) -> None:
        block = self._require()
        if block.acc is not None:
            self.block = KVBlock(block.k, block.v, block.pos, block.acc + weights.detach())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Per-head sizes: the ragged ``k, v [B, 1, Σ λ_h, D]``, ``pos [B, 1, Σ λ_h]`` (and ``acc``)."""
        if self.head_sizes is None or self.block is None:
            return super().state_dict()
        run = self._own_run()  # held ragged: handed over as it is (a copy), not padded and packed again
        f = (
            self._pack(self.block)
            if run is None
            else KVBlock(*(None if t is None else t.clone(memory_format=torch.contiguous_format) for t in (run.k, run.v, run.pos, run.acc)))
        )
        out = {"k": f.k, "v": f.v, "pos": f.pos}
        if f.acc is not None:
            out["acc"] = f.acc
        return out | self.layout_entry(f.pos)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.head_sizes is None or not state:
            super().load_state_dict(state)
            return
        state = self.check_layout_entry(state)
        missing = {"k", "v", "pos"} - state.keys()
        if missing:
            raise ValueError(f"SparseCache state is missing {sorted(missing)}")
        k, v, pos = state["k"], state["v"], state["pos"]
        total = sum(self.head_sizes)
        if k.dim() != 4 or k.shape != v.shape or k.shape[1:3] != (1, total) or pos.shape != k.shape[:3]:
            raise ValueError(
                f"SparseCache state with per-head sizes {self.head_sizes} must hold k, v [B, 1, {total}, D] and pos [B, 1, {total}], "
                f"got k {tuple(k.shape)}, v {tuple(v.shape)}, pos {tuple(pos.shape)}"
            )
        run = KVBlock(k, v, pos, state.get("acc"))
        held = self._own_run()
        if held is not None and held.k.shape == k.shape:  # written into the held run as it is (a copy)
            self._slots.write_run(KVBlock(k.to(held.k.dtype), v.to(held.v.dtype), pos, run.acc))
        else:
            self.block = self.runs.unpack(run)

    def select(self, candidates: KVBlock, scores: torch.Tensor, rows: torch.Tensor) -> KVBlock:
        """Keep the top-``size`` candidates by score; return the rest.

        Args:
            candidates: ``[B, Hs, M, ·]`` slots: the tokens leaving the window *and* the current
                cache contents (so cached tokens are re-scored every step).
            scores: ``[B, Hs, M]`` higher = keep exact; equal scores keep the older token (a
                rule of positions, so a row's choice does not depend on where its slots sit in
                a batch). Empty slots are never kept over a token, whatever the tokens' scores
                (``-inf`` included).
            rows: ``[B]`` bool, rows at a step; other rows keep their cache unchanged.

        Returns:
            The evicted tokens, ``[B, Hs, M]`` slots (empty where kept or not a candidate).
        """
        block = self._require()
        valid = candidates.valid & rows[:, None, None]
        # Tokens rank above every empty slot: a token's -inf becomes the lowest finite score, so
        # a tie with the empty slots' -inf cannot keep an empty slot over it.
        lowest = torch.finfo(torch.float32).min
        scores = torch.where(valid, scores.float().clamp_min(lowest), float("-inf"))
        keep = torch.zeros_like(valid)
        if self.capacity > 0:
            if self.head_sizes and len(self.head_sizes) != scores.shape[1]:
                raise ValueError(f"sparse cache has {len(self.head_sizes)} per-head sizes for {scores.shape[1]} storage heads")
            top = _top_by_score_then_age(scores, candidates.pos, self.capacity)  # [B, Hs, λ], best first
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


def _top_by_score_then_age(scores: torch.Tensor, pos: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` best slots of ``scores [B, Hs, M]``, best first: by score, ties
    by position (older first). ``topk`` breaks ties by where slots sit, which differs between a
    row alone and the same row in a left-padded batch (tied scores are common: span pooling
    gives a span's tokens one score)."""
    by_age = torch.sort(pos, dim=-1, stable=True).indices
    ranked = torch.sort(scores.gather(-1, by_age), dim=-1, descending=True, stable=True).indices[..., :count]
    return by_age.gather(-1, ranked)
