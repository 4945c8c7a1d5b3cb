"""The reads of a segment's queries, grouped by the state they see and batched across groups.

Within a segment a layer's memories change only at schedule steps, so its queries fall into
*groups* that each read one state: the group of block ``i`` holds the query a step fell on at
the end of block ``i - 1`` (it reads the memories as they are after that step) and the queries
of block ``i`` up to, not including, the one its own step falls on. Block ``i``'s tokens are
already written when its group reads, and they are all newer than the carried-over query, so
the causal mask by position hides them from it: one read per block, none repeated.

A group's state is kept as tensor references (a *snapshot*): the slot buffer then copies on its
next write instead of writing in place (:meth:`lola.LoLAMemory.snapshot_exact`), and so does
the linear state (:meth:`lola.memory.LinearState.snapshot`). Reads of many groups
are therefore deferred and computed at once, the groups folded into the batch: one softmax
partial and one linear read for up to :data:`READ_BYTES` of snapshots, instead of one small
call per block. A policy that scores by attention (it must see the weights of a block before
the step that follows it), a custom exact memory or a custom linear memory is read group by
group, at once, through the memories' own ``read``.

A decoded token (one per row) is read by :class:`lola.engine.decode_read.DecodeRead` instead:
one fused :func:`lola.kernels.decode_step` that reads and mixes, called by the same block loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lola.core.partials import LinearPartial, SoftmaxPartial, merge_softmax_partials, read_linear_state
from lola.engine.state import LayerState
from lola.kernels import softmax_partial
from lola.kernels.ragged import RaggedSlots
from lola.memory.base import KVBlock, QueryBlock, exact_logits, partial_from_logits

__all__ = ["READ_BYTES", "READ_BYTES_CPU", "SegmentReads", "observe_attention", "read_exact", "gather_tokens"]

READ_BYTES = 64 * 2**20
"""Snapshot bytes held on an accelerator before the deferred reads are computed: bounds the
extra memory a long prefill holds (each snapshot keeps its exact slots and linear state alive)
while still folding tens of blocks into one launch."""

READ_BYTES_CPU = 0
"""The same on a CPU: each group is read as it comes. Batching buys nothing there (no launch
to save) and its larger intermediates fall out of the caches: one batched read of a 1,024-token
prefill's 16 groups took longer than 16 reads of one group (``benchmarks/layer.py`` shapes;
docs/performance.md, "The engine's second step (2026-12-02)")."""


@dataclass
class _Group:
    """One group's queries: ``query`` (padded to ``length`` per row), where they sit in the
    segment, and either its read (``exact``, ``linear``) or the snapshot to read later."""

    query: QueryBlock
    start: int | torch.Tensor  # packed index of each row's first query (an int when rows agree)
    count: int  # queries per row (uniform rows) or the longest row's count
    active: torch.Tensor | None  # [B, count] bool, rows with fewer queries (packed rows only)
    slots: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
    ragged: RaggedSlots | None = None
    linear_state: tuple[torch.Tensor, torch.Tensor] | None = None
    exact: SoftmaxPartial | None = None
    linear: LinearPartial | None = None


class SegmentReads:
    """Collects a segment's groups of queries, reads them, and returns every query's partials.

    Args:
        memory: the layer's state (its memories are read as they are when :meth:`add` is called).
        q: ``[B, H, T, D]`` the segment's queries in packed order; fq: ``[B, H, T, F]`` their
            features, or ``None``: the linear state is not read (its partial is zero).
        seen: ``[B]`` int64 tokens each row had seen before the segment (a query at packed
            index ``j`` has position ``seen + j``).
        scale: softmax scale.
        uniform: every row has all ``T`` queries and the same block boundaries (starts and
            counts are ints, groups are slices).
        track: the policy scores by attention: each group's weights are given to the memories
            (:func:`observe_attention`) as it is read, before the next step.
    """

    def __init__(self, memory: LayerState, q: torch.Tensor, fq: torch.Tensor | None, seen: torch.Tensor, scale: float, *, uniform: bool, track: bool) -> None:
        self.memory, self.q, self.fq, self.seen, self.scale = memory, q, fq, seen, scale
        self.uniform, self.track = uniform, track
        # Snapshots are tensor references only when every memory is a stock slot store read by
        # one kernel call and the linear state is the stock one.
        self.defer = not track and all(m.reads_block for m in memory.exact_memories) and bool(getattr(memory.linear, "snapshots", False))
        self._groups: list[_Group] = []
        self._waiting: list[_Group] = []
        self._waiting_bytes = 0

    def add(self, start: int | torch.Tensor, count: int | torch.Tensor) -> None:
        """Read the queries ``start .. start + count - 1`` (packed indices, per row) against the
        memories as they are now: at once, or from a snapshot at the next flush.

        Args:
            start, count: ints when rows are uniform, else ``[B]`` int64 tensors.
        """
        query, longest, active = self._query(start, count)
        if longest == 0:
            return
        group = _Group(query, start, longest, active)
        mem = self.memory
        first = self.seen + start  # [B]: each row's first query of the group
        # A host bound on the group's positions (no query is past the rows' counts), asked only
        # when positions are bounded (on an accelerator it may read the counts back).
        newest = mem.counts.host_range()[1] if mem.positions is not None else 0
        if self.defer:
            group.slots, group.ragged = mem.snapshot_exact()
            if mem.positions is not None and mem.positions.moves_exact(newest):  # re-rotated copies, read later
                group.slots = [(mem.exact_view(k, p, first, newest), v, p) for k, v, p in group.slots]
                if group.ragged is not None:
                    r = group.ragged
                    group.ragged = RaggedSlots(mem.exact_view(r.k, r.pos, first, newest), r.v, r.pos, r.offsets)
            group.linear_state = mem.linear.snapshot() if self.fq is not None else ()
            self._waiting.append(group)
            held = [*(t for s in group.slots for t in s), *group.linear_state, *(group.ragged[:3] if group.ragged is not None else ())]
            self._waiting_bytes += sum(t.numel() * t.element_size() for t in held)
            if self._waiting_bytes >= (READ_BYTES_CPU if self.q.device.type == "cpu" else READ_BYTES):
                self.flush()
        else:
            group.exact, parts = read_exact(mem, query, self.track, first, newest)
            group.linear = mem.linear.read(query) if self.fq is not None else None
            if self.track:
                counted = active if active is not None else torch.ones(query.pos.shape, dtype=torch.bool, device=query.pos.device)
                observe_attention(mem, parts, group.exact, counted)
        self._groups.append(group)

    def _query(self, start: int | torch.Tensor, count: int | torch.Tensor) -> tuple[QueryBlock, int, torch.Tensor | None]:
        """The group's queries ``[B, H, L, ·]``, ``L`` the longest row's count, and ``[B, L]``
        which entries are real (``None`` when every row has all ``L``)."""
        q, fq, device = self.q, self.fq, self.q.device
        if self.uniform:
            length = int(count)
            j = torch.arange(length, device=device)
            pos = (self.seen[:, None] + start + j).expand(q.shape[0], length)
            return QueryBlock(q.narrow(2, start, length), None if fq is None else fq.narrow(2, start, length), pos, self.scale), length, None
        length = int(count.max())
        j = torch.arange(length, device=device)
        active = j[None, :] < count[:, None]  # [B, L]
        idx = (start[:, None] + j).clamp(0, q.shape[2] - 1)
        pos = torch.where(active, self.seen[:, None] + start[:, None] + j, -1)
        return QueryBlock(gather_tokens(q, idx), None if fq is None else gather_tokens(fq, idx), pos, self.scale), length, active

    def flush(self) -> None:
        """Compute the waiting groups' reads: one softmax-partial and one linear read for all
        of them (groups padded to the longest, folded into the batch)."""
        groups, self._waiting, self._waiting_bytes = self._waiting, [], 0
        if not groups:
            return
        self.memory.release_snapshots()  # read below, before any later write
        longest = max(g.count for g in groups)
        n = len(groups)

        def stack(tensors: list[torch.Tensor], fill: float = 0.0) -> torch.Tensor:
            # [B, ·, L, ...] or [B, L] per group, padded along L, → [n * B, ...]
            dim = 1 if tensors[0].dim() == 2 else 2
            padded = [t if t.shape[dim] == longest else _pad(t, dim, longest, fill) for t in tensors]
            out = torch.stack(padded) if n > 1 else padded[0].unsqueeze(0)
            return out.flatten(0, 1)

        q = stack([g.query.q for g in groups])
        pos = stack([g.query.pos for g in groups], fill=-1)
        k, v, kpos = (torch.cat([_stack([g.slots[m][i] for g in groups]) for m in range(len(groups[0].slots))], dim=2) for i in range(3))
        ragged = groups[0].ragged
        if ragged is not None:  # every group's run, folded into the batch as the dense slots
            ragged = RaggedSlots(*(_stack([getattr(g.ragged, f) for g in groups]) for f in ("k", "v", "pos")), ragged.offsets)
        num, den, mx = softmax_partial(q, k, v, pos, kpos, self.scale, ragged=ragged, check=False, exact_max=self.memory.exact_max)
        if self.fq is not None:
            fq32 = stack([g.query.fq for g in groups]).float()
            H = _stack([g.linear_state[0] for g in groups])
            s = _stack([g.linear_state[1] for g in groups])
            read = read_linear_state(fq32, H, s)
            lnum, lden = read.num, read.den
        b = groups[0].query.q.shape[0]
        for i, g in enumerate(groups):
            rows, keep = slice(i * b, (i + 1) * b), g.count
            g.exact = SoftmaxPartial(num[rows, :, :keep], den[rows, :, :keep], mx[rows, :, :keep])
            g.linear = LinearPartial(lnum[rows, :, :keep], lden[rows, :, :keep]) if self.fq is not None else None
            g.slots = g.linear_state = g.ragged = None

    def result(self) -> tuple[SoftmaxPartial, LinearPartial]:
        """Every query's partials ``[B, H, T, ·]`` in packed order; entries no group read (padding
        at the end of a row) read nothing (``den = 0``, ``max = -inf``)."""
        self.flush()
        groups = self._groups
        b, h, t, d = self.q.shape
        unread = None
        if self.fq is None:  # the linear state is not read: a zero partial, no memory held
            zero = torch.zeros((), dtype=torch.float32, device=self.q.device)
            unread = LinearPartial(zero.expand(b, h, t, d), zero.expand(b, h, t))
        if self.uniform:
            if len(groups) == 1:
                return groups[0].exact, groups[0].linear if unread is None else unread
            cat = lambda xs: torch.cat(xs, dim=2)  # noqa: E731
            exact = SoftmaxPartial(cat([g.exact.num for g in groups]), cat([g.exact.den for g in groups]), cat([g.exact.max for g in groups]))
            if unread is not None:
                return exact, unread
            return exact, LinearPartial(cat([g.linear.num for g in groups]), cat([g.linear.den for g in groups]))
        device = self.q.device
        # One scratch entry past the end receives the writes of inactive group entries.
        out_e = SoftmaxPartial.empty(b, h, t + 1, d, device)
        f32 = dict(dtype=torch.float32, device=device)
        out_l = LinearPartial(torch.zeros(b, h, t + 1, d, **f32), torch.zeros(b, h, t + 1, **f32)) if unread is None else None
        for g in groups:
            j = torch.arange(g.count, device=device)
            idx = torch.where(g.active, g.start[:, None] + j, t)
            pairs = [(out_e.num, g.exact.num), (out_e.den, g.exact.den), (out_e.max, g.exact.max)]
            if unread is None:
                pairs += [(out_l.num, g.linear.num), (out_l.den, g.linear.den)]
            for dst, src in pairs:
                full = idx.view(b, 1, g.count, *([1] * (dst.dim() - 3))).expand_as(src)
                dst.scatter_(2, full, src)
        return (
            SoftmaxPartial(out_e.num[:, :, :t], out_e.den[:, :, :t], out_e.max[:, :, :t]),
            unread if unread is not None else LinearPartial(out_l.num[:, :, :t], out_l.den[:, :, :t]),
        )


def read_exact(
    state: LayerState, query: QueryBlock, keep_logits: bool, first: torch.Tensor | int = 0, newest: int = 0
) -> tuple[SoftmaxPartial, list[SoftmaxPartial]]:
    """The merged softmax partial of ``query`` over the exact memories (and, when
    ``keep_logits``, each memory's partial with its logits).

    Args:
        first: ``[B]`` each row's first query position (bounded positions re-rotate the keys
            for it: :meth:`~lola.engine.state.LayerState.exact_view`); newest: a host bound on it.
    """
    mems = state.exact_memories
    moves = state.positions is not None and state.positions.moves_exact(newest)
    if not keep_logits and all(m.reads_block for m in mems):
        # Stock slot stores: one kernel call over their concatenated slots (the merge of the
        # per-memory partials, computed at once).
        block = state.exact_slots()
        ragged = state.ragged_slots()
        k = state.exact_view(block.k, block.pos, first, newest)
        if moves and ragged is not None:
            ragged = RaggedSlots(state.exact_view(ragged.k, ragged.pos, first, newest), ragged.v, ragged.pos, ragged.offsets)
        partial = softmax_partial(query.q, k, block.v, query.pos, block.pos, query.scale, ragged=ragged, check=False, exact_max=state.exact_max)
        return SoftmaxPartial(*partial), []
    if moves:  # each stock store read over its re-rotated keys (custom reads are refused with bounded positions)
        parts = []
        for m in mems:
            b = m.block
            moved = KVBlock(state.exact_view(b.k, b.pos, first, newest), b.v, b.pos, b.acc)
            parts.append(partial_from_logits(exact_logits(query, moved), b.v, keep_logits))
        return merge_softmax_partials(parts), parts
    parts = [m.read(query, keep_logits) for m in mems]
    return merge_softmax_partials(parts), parts


def observe_attention(state: LayerState, parts: list[SoftmaxPartial], exact: SoftmaxPartial, counted: torch.Tensor) -> None:
    """Add each slot's softmax weight (normalised over the query's exact set) to its tally."""
    state.written.ring_only = False
    m = torch.where(torch.isfinite(exact.max), exact.max, 0.0).unsqueeze(-1)
    den = exact.den.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    for mem, part in zip(state.exact_memories, parts):
        if mem.capacity == 0:
            continue
        w = torch.exp(part.logits - m) / den  # [B, H, L, N]
        w = (w * counted[:, None, :, None]).sum(dim=2)  # [B, H, N]
        hs = mem.block.k.shape[1]
        mem.observe_attention(w.unflatten(1, (hs, -1)).sum(dim=2))


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``n`` tensors ``[B, ...]`` → ``[n * B, ...]`` (no copy for one)."""
    return tensors[0] if len(tensors) == 1 else torch.stack(tensors).flatten(0, 1)


def _pad(x: torch.Tensor, dim: int, length: int, fill: float) -> torch.Tensor:
    """``x`` padded with ``fill`` at the end of ``dim`` to ``length``."""
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, length - x.shape[dim]]
    return F.pad(x, pad, value=fill)


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gather along the token axis: ``x [B, H, T, ...]``, ``index [B, L]`` → ``[B, H, L, ...]``."""
    shape = list(x.shape)
    idx = index.view(index.shape[0], 1, index.shape[1], *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(shape[0], shape[1], index.shape[1], *shape[3:]))
