"""Sparse cache: the ``λ`` tokens a scoring policy wants kept exact."""

from __future__ import annotations

import torch

from lola.core.partials import SoftmaxPartial
from lola.memory.base import EMPTY, ExactStore, KVBlock, QueryBlock

__all__ = ["SparseCache"]


class SparseCache(ExactStore):
    """Exact storage for the top-``size`` tokens by a policy's score.

    The cache holds no ordering; visibility is decided by positions, and every cached token is
    older than any query that reads it.

    With one size per storage head (calibrated budgets: retrieval heads get most slots,
    streaming heads none), storage is *ragged*: one flat run of ``Σ λ_h`` slots per row,
    head ``h`` owning ``λ_h`` of them, so the bytes held are the budget's and not
    ``max λ_h`` per head. :attr:`block` still presents the usual ``[B, Hs, max λ_h, ·]``
    view (built on demand, empty slots padded) to the composer and the policies.

    Args:
        size: ``λ``, the number of slots per (row, storage head); or one size per storage head
            (a list).
    """

    name = "sparse"

    def __init__(self, size: int | list[int]) -> None:
        sizes = [int(x) for x in size] if isinstance(size, (list, tuple)) else [int(size)]
        if not sizes or min(sizes) < 0:
            raise ValueError(f"sparse cache size must be >= 0 (or a non-empty list of such), got {size}")
        self.head_sizes = sizes if isinstance(size, (list, tuple)) else None
        self._flat: KVBlock | None = None  # ragged storage: [B, 1, Σ λ_h, ·]
        self._view: tuple[KVBlock, KVBlock] | None = None  # (the _flat it unpacks, the padded view)
        super().__init__(max(sizes))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.head_sizes if self.head_sizes else self.capacity})"

    # -- ragged storage (per-head sizes) ---------------------------------------------------------
    # With per-head sizes, ``block`` is a property: setting it packs head h's first λ_h slots
    # (``select`` fills a head's slots from the left, so nothing valid is dropped) into the flat
    # run; reading it unpacks them into a padded view, built once per new run: the flat run is
    # only ever replaced, never written in place, so between two steps every read returns the
    # same view (and the composer's block of exact slots, which checks its sources by identity,
    # is reused while decoding instead of being rebuilt per token).
    @property
    def block(self) -> KVBlock | None:  # type: ignore[override]
        if self.head_sizes is None:
            return self._padded
        if self._flat is None:
            return None
        if self._view is None or self._view[0] is not self._flat:
            self._view = (self._flat, self._unpack(self._flat))
        return self._view[1]

    @block.setter
    def block(self, value: KVBlock | None) -> None:
        if self.head_sizes is None or value is None:
            self._padded, self._flat = value, None
            return
        if value.k.shape[1] != len(self.head_sizes):
            raise ValueError(f"sparse cache has {len(self.head_sizes)} per-head sizes for {value.k.shape[1]} storage heads")
        slot = torch.arange(value.k.shape[2], device=value.pos.device)
        sizes = torch.tensor(self.head_sizes, device=value.pos.device)
        # (meta tensors hold no values: the layout a state must have is built on that device)
        if value.pos.device.type != "meta" and bool((value.valid & (slot >= sizes.view(-1, 1))).any()):
            raise RuntimeError("a head holds more tokens than its sparse size (internal error)")
        self._flat = self._pack(value)

    def _segments(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for n in self.head_sizes or []:
            out.append((start, n))
            start += n
        return out

    def _pack(self, block: KVBlock) -> KVBlock:
        parts = [
            (block.k[:, h, :n], block.v[:, h, :n], block.pos[:, h, :n], None if block.acc is None else block.acc[:, h, :n])
            for h, (_, n) in enumerate(self._segments())
        ]
        k, v, pos = (torch.cat([p[i] for p in parts], dim=1).unsqueeze(1) for i in range(3))
        acc = None if block.acc is None else torch.cat([p[3] for p in parts], dim=1).unsqueeze(1)
        return KVBlock(k, v, pos, acc)

    def _unpack(self, flat: KVBlock) -> KVBlock:
        b, _, _, d = flat.k.shape
        hs, n = len(self.head_sizes), self.capacity
        k = flat.k.new_zeros(b, hs, n, d)
        v = flat.v.new_zeros(b, hs, n, d)
        pos = flat.pos.new_full((b, hs, n), EMPTY)
        acc = None if flat.acc is None else flat.acc.new_zeros(b, hs, n)
        for h, (start, size) in enumerate(self._segments()):
            k[:, h, :size] = flat.k[:, 0, start : start + size]
            v[:, h, :size] = flat.v[:, 0, start : start + size]
            pos[:, h, :size] = flat.pos[:, 0, start : start + size]
            if acc is not None:
                acc[:, h, :size] = flat.acc[:, 0, start : start + size]
        return KVBlock(k, v, pos, acc)

    @property
    def reads_block(self) -> bool:
        # The padded block view reads the same partials as the ragged per-head read below.
        return type(self).read is SparseCache.read

    def read(self, query: QueryBlock, keep_logits: bool = False) -> SoftmaxPartial:
        """Softmax partial of ``query`` over the cached slots; ragged storage is read head by
        head (no padded copy), each storage head answering its group of query heads."""
        if self.head_sizes is None or keep_logits:
            return super().read(query, keep_logits)
        from lola.kernels import softmax_partial

        self._require()
        flat = self._flat
        b, h, l, d = query.q.shape
        g = h // len(self.head_sizes)
        parts = []
        for i, (start, size) in enumerate(self._segments()):
            q = query.q[:, i * g : (i + 1) * g]
            if size == 0:
                parts.append(SoftmaxPartial.empty(b, g, l, d, q.device))
                continue
            sl = slice(start, start + size)
            parts.append(SoftmaxPartial(*softmax_partial(q, flat.k[:, :, sl], flat.v[:, :, sl], query.pos, flat.pos[:, :, sl], query.scale)))
        return SoftmaxPartial(*(torch.cat([getattr(p, f) for p in parts], dim=1) for f in ("num", "den", "max")))

    def observe_attention(self, weights: torch.Tensor) -> None:
        block = self._require()
        if block.acc is not None:
            self.block = KVBlock(block.k, block.v, block.pos, block.acc + weights.detach())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Per-head sizes: the flat ``k, v [B, 1, Σ λ_h, D]``, ``pos [B, 1, Σ λ_h]`` (and ``acc``)."""
        if self.head_sizes is None or self._flat is None:
            return super().state_dict()
        f = self._flat
        out = {"k": f.k, "v": f.v, "pos": f.pos}
        if f.acc is not None:
            out["acc"] = f.acc
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.head_sizes is None or not state:
            super().load_state_dict(state)
            return
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
        acc = state.get("acc")
        self._flat = KVBlock(k.clone(), v.clone(), pos.clone(), None if acc is None else acc.clone())

    def select(self, candidates: KVBlock, scores: torch.Tensor, rows: torch.Tensor) -> KVBlock:
        """Keep the top-``size`` candidates by score; return the rest.

        Args:
            candidates: ``[B, Hs, M, ·]`` slots: the tokens leaving the window *and* the current
                cache contents (so cached tokens are re-scored every step).
            scores: ``[B, Hs, M]`` higher = keep exact. Empty slots are never kept over a token,
                whatever the tokens' scores (``-inf`` included).
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
