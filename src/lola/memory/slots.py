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

from lola.kernels.ragged import RaggedSlots
from lola.memory.blocks import EMPTY, KVBlock
from lola.memory.head_runs import HeadRuns

__all__ = ["SlotBuffer"]


class SlotBuffer:
    """The exact slots of one layer: ``k, v [B, Hs, N, D]`` (the layer's dtype), ``pos [B, Hs, N]``
    int64 (``-1``: empty) and, when attention is tracked, ``acc [B, Hs, N]`` float32.

    Args:
        regions: ``(name, width)`` of each memory's range, in slot order.
    """

    def __init__(self, regions: list[tuple[str, int | list[int]]]) -> None:
        self.regions: dict[str, tuple[int, int]] = {}
        self.ragged_name: str | None = None  # the region held ragged (per-head widths), if any
        self.runs: HeadRuns | None = None  # its layout: head h's slots are runs.offsets[h]:offsets[h + 1] of one run per row
        start = 0
        for name, width in regions:
            if name in self.regions or name == self.ragged_name:
                raise ValueError(f"two memories are named {name!r}: a layer's memories need distinct names")
            if isinstance(width, (list, tuple)):
                if self.ragged_name is not None:
                    raise ValueError(f"one region may have per-head widths, got {self.ragged_name!r} and {name!r}")
                if not width or min(int(w) for w in width) < 0:
                    raise ValueError(f"region {name!r} needs one width >= 0 per storage head, got {list(width)}")
                self.ragged_name, self.runs = name, HeadRuns(width)
                continue
            self.regions[name] = (start, start + int(width))
            start += int(width)
        self.width = start
        self.whole: KVBlock | None = None  # the buffer's tensors (None before allocation)
        self.run: KVBlock | None = None  # the ragged region's run, [B, 1, Σ widths, ·] (None without one)
        self._views: dict = {}
        self.shared = False  # a snapshot refers to the current tensors: the next write copies
        self.run_shared = False  # the same for the ragged run
        self.run_writes = 0  # writes to (or replacements of) the ragged run so far: what a kept view of it checks
        self.writes = 0  # the same for the dense buffer through write() (a window's in-place ring writes are not counted)

    @property
    def head_widths(self) -> tuple[int, ...]:
        """The ragged region's width per storage head (``()`` without one)."""
        return self.runs.widths if self.runs is not None else ()

    @property
    def offsets(self) -> tuple[int, ...]:
        """Head ``h``'s slots of the ragged region are ``offsets[h]:offsets[h + 1]`` of the run
        (``()`` without one)."""
        return self.runs.offsets if self.runs is not None else ()

    @property
    def allocated(self) -> bool:
        return self.whole is not None

    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, track_attention: bool) -> None:
        """Empty storage for ``batch`` rows and ``heads`` storage heads (every slot empty)."""
        if self.ragged_name is not None and heads != len(self.head_widths):
            raise ValueError(f"region {self.ragged_name!r} has {len(self.head_widths)} per-head widths for {heads} storage heads")
        self.use(
            _empty(batch, heads, self.width, head_dim, dtype, device, track_attention),
            _empty(batch, 1, self.offsets[-1], head_dim, dtype, device, track_attention) if self.ragged_name else None,
        )

    def resize(self, name: str, width: int, block: KVBlock | None = None) -> None:
        """Give the last dense region, ``name``, ``width`` slots holding ``block [B, Hs, width, ·]``
        (required once allocated); the other regions keep their slots. New tensors: a snapshot
        or autograd keeps the old ones.

        Raises:
            ValueError: ``name`` is not the last dense region, or ``block`` is missing or of
                another width.
        """
        a, b = self.regions.get(name, (0, -1))
        if b != self.width:
            raise ValueError(f"{self!r} resizes its last dense region only, not {name!r}")
        if self.whole is not None:
            if block is None or block.pos.shape[-1] != width:
                raise ValueError(f"region {name!r} of {width} slots needs its block of {width} slots")
            w = self.whole
            fields = {}
            for f in ("k", "v", "pos", "acc"):
                old = getattr(w, f)
                fields[f] = None if old is None else torch.cat([old[:, :, :a], getattr(block, f).to(old.dtype)], dim=2)
            self.whole = KVBlock(**fields)
            self._views = {k: v for k, v in self._views.items() if k == self.ragged_name}
            self.shared = False
            self.writes += 1
        self.regions[name] = (a, a + width)
        self.width = a + width

    def reset(self) -> None:
        """Free the storage (the next allocation starts afresh)."""
        self.whole = self.run = None
        self._views = {}
        self.shared = self.run_shared = False
        self.run_writes += 1
        self.writes += 1

    def use(self, whole: KVBlock, run: KVBlock | None = None) -> None:
        """Hold ``whole``'s tensors as the buffer (fresh storage, or a server's pages), and ``run``'s
        as the ragged region's run ``[B, 1, Σ widths, ·]`` (required with a ragged region)."""
        if (run is None) != (self.ragged_name is None):
            raise ValueError(f"{self!r} needs {'a' if self.ragged_name else 'no'} ragged run")
        if run is not None and (whole.pos.shape[1] != len(self.head_widths) or tuple(run.pos.shape[1:]) != (1, self.offsets[-1])):
            raise ValueError(
                f"{self!r} holds {len(self.head_widths)} storage heads and a run of {self.offsets[-1]} slots per row, "
                f"got {whole.pos.shape[1]} heads and a run of shape {tuple(run.pos.shape)}"
            )
        self.whole, self.run = whole, run
        self._views = {}
        self.shared = self.run_shared = False
        self.run_writes += 1
        self.writes += 1

    @property
    def heads(self) -> int:
        return self.whole.pos.shape[1]

    def ragged(self) -> RaggedSlots | None:
        """The ragged region's slots for the exact-attention kernels (views of the run), or ``None``."""
        if self.run is None:
            return None
        r = self.run
        return RaggedSlots(r.k[:, 0], r.v[:, 0], r.pos[:, 0], self.offsets)

    def view(self, name: str) -> KVBlock:
        """Memory ``name``'s slots, ``[B, Hs, width, ·]`` views of the buffer (the same objects
        until the buffer's tensors are replaced). Read them; write through :meth:`write`.

        The ragged region's block is padded to its widest head (slots past a head's width
        empty): a copy of the run, kept until the next write."""
        found = self._views.get(name)
        if found is None:
            if self.whole is None:
                raise RuntimeError("SlotBuffer is not allocated yet")
            if name == self.ragged_name:
                found = self._views[name] = self.runs.unpack(self.run)
                return found
            a, b = self.regions[name]
            w = self.whole
            found = KVBlock(w.k[:, :, a:b], w.v[:, :, a:b], w.pos[:, :, a:b], None if w.acc is None else w.acc[:, :, a:b])
            self._views[name] = found
        return found

    def snapshot(self) -> KVBlock:
        """The whole buffer as it is now, kept intact: the next write replaces the tensors
        instead of writing into them (:meth:`ragged` taken now is kept intact too)."""
        self.shared = self.run_shared = True
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
        self.writes += 1
        if name == self.ragged_name:
            self.write_run(self.runs.pack(block), changed)
            return
        if self.shared or torch.is_grad_enabled():
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
            self.whole, self.shared = KVBlock(**new), False
            self._views = {k: v for k, v in self._views.items() if k == self.ragged_name}
            return
        for f in changed:
            getattr(view, f).copy_(getattr(block, f))

    def write_run(self, packed: KVBlock, changed: list[str] | None = None) -> None:
        """Make the ragged region hold the run ``packed [B, 1, Σ widths, ·]`` (the fields in
        ``changed``; all by default): in place, or copy-on-write while a snapshot holds the run
        or autograd is on."""
        r = self.run
        if r is None:
            raise RuntimeError(f"{self!r} holds no ragged run (not allocated, or no region has per-head widths)")
        if tuple(packed.pos.shape) != tuple(r.pos.shape) or packed.k.shape != r.k.shape or packed.v.shape != r.v.shape:
            raise ValueError(f"a run of shape {tuple(r.pos.shape)} was expected for {self!r}, got {tuple(packed.pos.shape)}")
        if changed is None:
            changed = ["k", "v", "pos", *(["acc"] if r.acc is not None else [])]
            if r.acc is not None and packed.acc is None:
                raise ValueError(f"memory {self.ragged_name!r} wrote a run without its attention tallies (acc)")
        if not self.run_shared and not torch.is_grad_enabled():
            for f in changed:
                getattr(r, f).copy_(getattr(packed, f))
        else:  # copy-on-write, as the buffer's ranges
            new = {}
            for f in ("k", "v", "pos", "acc"):
                old = getattr(r, f)
                new[f] = (
                    None if old is None else (getattr(packed, f).to(device=old.device, dtype=old.dtype, copy=True) if f in changed else old.clone())
                )  # never the caller's tensor
            self.run, self.run_shared = KVBlock(**new), False
        self._views.pop(self.ragged_name, None)
        self.run_writes += 1

    def writes_in_place(self) -> bool:
        """Whether a memory may write into its view of the dense buffer directly (the ragged run's
        writes go through :meth:`write`, which asks its own flag): no snapshot holds the buffer, and
        autograd is off (with it on, a read of the slots may have been saved for backward: a
        query that needs gradients reads them, whatever else does; inference runs under
        ``torch.no_grad`` or ``torch.inference_mode``)."""
        return not self.shared and not torch.is_grad_enabled()

    def nbytes(self) -> int:
        """Bytes held (every slot, empty or not; the ragged region's run, no padding)."""
        return sum(t.numel() * t.element_size() for blk in (self.whole, self.run) if blk is not None for t in (blk.k, blk.v, blk.pos, blk.acc) if t is not None)

    def __getstate__(self) -> dict:
        # copies (deepcopy, pickle) rebuild their views from their own tensors
        return {**self.__dict__, "_views": {}}

    def __repr__(self) -> str:
        parts = [f"{n}={b - a}" for n, (a, b) in self.regions.items()]
        if self.ragged_name:
            parts.append(f"{self.ragged_name}={list(self.head_widths)}")
        return f"SlotBuffer({', '.join(parts)})"


def _empty(batch: int, heads: int, n: int, head_dim: int, dtype: torch.dtype, device: torch.device, track_attention: bool) -> KVBlock:
    return KVBlock(
        torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device),
        torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device),
        torch.full((batch, heads, n), EMPTY, dtype=torch.long, device=device),
        torch.zeros(batch, heads, n, dtype=torch.float32, device=device) if track_attention else None,
    )
