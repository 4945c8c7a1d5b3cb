"""One buffer of exact slots per layer: the sinks, the sparse cache and the window are ranges of it.

A layer's exact memories are read together (the softmax over sinks ∪ sparse ∪ window) on every
query, so they live in one ``[B, Hs, N, ·]`` buffer, ``N`` the sum of their capacities, in
read order ``[sinks | sparse | window]``. Each memory's :attr:`~lola.memory.ExactStore.block`
is a view of its range: the decode step reads the whole buffer as it is (nothing is
concatenated or copied per token), and a memory's writes land in the buffer.

Writes go in place, except when the old contents must survive them: under autograd (a read
may have been saved for backward: training feature maps, LoRA), or while a deferred read holds
a *snapshot* of them
(:class:`lola.engine.segment_reads.SegmentReads` on an accelerator). Then the buffer's tensors are
replaced, copy-on-write, and the memories' views follow.
"""

from __future__ import annotations

import torch

from lola.memory.blocks import EMPTY, KVBlock

__all__ = ["SlotBuffer"]


class SlotBuffer:
    """The exact slots of one layer: ``k, v [B, Hs, N, D]`` (the layer's dtype), ``pos [B, Hs, N]``
    int64 (``-1``: empty) and, when attention is tracked, ``acc [B, Hs, N]`` float32.

    Args:
        regions: ``(name, width)`` of each memory's range, in slot order.
    """

    def __init__(self, regions: list[tuple[str, int]]) -> None:
        self.regions: dict[str, tuple[int, int]] = {}
        start = 0
        for name, width in regions:
            if name in self.regions:
                raise ValueError(f"two memories are named {name!r}: a layer's memories need distinct names")
            self.regions[name] = (start, start + int(width))
            start += int(width)
        self.width = start
        self.whole: KVBlock | None = None  # the buffer's tensors (None before allocation)
        self._views: dict[str, KVBlock] = {}
        self.shared = False  # a snapshot refers to the current tensors: the next write copies

    @property
    def allocated(self) -> bool:
        return self.whole is not None

    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, track_attention: bool) -> None:
        """Empty storage for ``batch`` rows and ``heads`` storage heads (every slot empty)."""
        n = self.width
        self.use(
            KVBlock(
                torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device),
                torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device),
                torch.full((batch, heads, n), EMPTY, dtype=torch.long, device=device),
                torch.zeros(batch, heads, n, dtype=torch.float32, device=device) if track_attention else None,
            )
        )

    def reset(self) -> None:
        """Free the storage (the next allocation starts afresh)."""
        self.whole = None
        self._views = {}
        self.shared = False

    def use(self, whole: KVBlock) -> None:
        """Hold ``whole``'s tensors as the buffer (fresh storage, or a server's pages)."""
        self.whole = whole
        self._views = {}
        self.shared = False

    def view(self, name: str) -> KVBlock:
        """Memory ``name``'s slots, ``[B, Hs, width, ·]`` views of the buffer (the same objects
        until the buffer's tensors are replaced). Read them; write through :meth:`write`."""
        found = self._views.get(name)
        if found is None:
            if self.whole is None:
                raise RuntimeError("SlotBuffer is not allocated yet")
            a, b = self.regions[name]
            w = self.whole
            found = KVBlock(w.k[:, :, a:b], w.v[:, :, a:b], w.pos[:, :, a:b], None if w.acc is None else w.acc[:, :, a:b])
            self._views[name] = found
        return found

    def snapshot(self) -> KVBlock:
        """The whole buffer as it is now, kept intact: the next write replaces the tensors
        instead of writing into them."""
        self.shared = True
        return self.whole

    def write(self, name: str, block: KVBlock) -> None:
        """Make memory ``name``'s slots hold ``block [B, Hs, width, ·]`` (its ``acc`` ignored
        when attention is not tracked; required when it is).

        In place, a field at a time (a field that already is the view is left alone); out of
        place when the buffer is shared with a snapshot or autograd is on.
        """
        view = self.view(name)
        fields = ("k", "v", "pos", "acc") if self.whole.acc is not None else ("k", "v", "pos")
        if self.whole.acc is not None and block.acc is None:
            raise ValueError(f"memory {name!r} wrote slots without their attention tallies (acc)")
        changed = [f for f in fields if getattr(block, f) is not getattr(view, f)]
        if not changed:
            return
        if not self.writes_in_place():
            # Every field is replaced (the unchanged ones cloned): neither a snapshot nor a tensor
            # autograd saved may see the in-place writes that follow.
            a, b = self.regions[name]
            w = self.whole
            new = {}
            for f in ("k", "v", "pos", "acc"):
                old = getattr(w, f)
                if old is None or f not in changed:
                    new[f] = None if old is None else old.clone()
                else:
                    new[f] = torch.slice_scatter(old, getattr(block, f).to(old.dtype), dim=2, start=a, end=b)
            self.use(KVBlock(**new))
            return
        for f in changed:
            getattr(view, f).copy_(getattr(block, f))

    def writes_in_place(self) -> bool:
        """Whether a memory may write into its view directly: no snapshot holds the buffer, and
        autograd is off (with it on, a read of the slots may have been saved for backward: a
        query that needs gradients reads them, whatever else does; inference runs under
        ``torch.no_grad`` or ``torch.inference_mode``)."""
        return not self.shared and not torch.is_grad_enabled()

    def nbytes(self) -> int:
        """Bytes held (every slot, empty or not)."""
        if self.whole is None:
            return 0
        w = self.whole
        return sum(t.numel() * t.element_size() for t in (w.k, w.v, w.pos, w.acc) if t is not None)

    def __getstate__(self) -> dict:
        # copies (deepcopy, pickle) rebuild their views from their own tensors
        return {**self.__dict__, "_views": {}}

    def __repr__(self) -> str:
        return f"SlotBuffer({', '.join(f'{n}={b - a}' for n, (a, b) in self.regions.items())})"
