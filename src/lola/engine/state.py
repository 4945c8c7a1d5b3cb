"""One layer's state: its memories, policy and schedule, the storage they hold, and its rows.

:class:`LayerState` holds what a layer carries from call to call: the exact slots (one
:class:`~lola.memory.slots.SlotBuffer`, ``[sinks | sparse | window]``), the linear state, the
policy's statistics and each row's token count (:class:`~lola.engine.row_counts.RowCounts`);
it allocates them, saves and loads them (:meth:`LayerState.state_dict`), and selects and writes
rows. The engine's steps are functions over it (:mod:`lola.engine.block_loop`,
:mod:`lola.engine.select_step`, :mod:`lola.engine.segment_reads`, :mod:`lola.engine.state_pages`);
:class:`lola.LoLAMemory` adds the calls a layer makes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from lola.core.positions import BoundedPositions
from lola.engine.parts import binds_buffer, describe_part, slot_widths
from lola.engine.row_counts import RowCounts
from lola.engine.state_checks import (
    LAYOUT_KEY,
    StateLayout,
    check_row_index,
    check_state,
    describe_layout,
    encode_layout,
    layout_difference,
    reference_of,
    summary,
)
from lola.kernels.ragged import RaggedSlots
from lola.memory.base import KVBlock, LinearMemory, SinkMemory, SparseMemory, WindowMemory, check_role
from lola.memory.linear_state import LinearState
from lola.memory.query_stats import QueryStatistics
from lola.memory.sinks import SinkTokens
from lola.memory.slots import SlotBuffer
from lola.policies.base import ScoringPolicy, keeps_tallies
from lola.schedules import UpdateSchedule

__all__ = ["WORKING_COPIES", "LayerState", "PageBinding", "Written"]

WORKING_COPIES = 3
"""The memory a layer's state is checked against, in copies of the state: itself and the
out-of-place copies a step makes of its exact memories."""


@dataclass
class PageBinding:
    """Where a state bound to external buffers lives (:func:`lola.engine.state_pages.bind`):
    ``pages`` (``{key: [slots, ...]}``), the page of each row (``rows [B]`` int64), and the first
    page when the rows are one contiguous range (``None`` when they are gathered)."""

    pages: dict[str, torch.Tensor]
    rows: torch.Tensor
    start: int | None


@dataclass
class Written:
    """What a call wrote, for the pages a bound state syncs: ``pushed [B]``, the positions of the
    one ring slot per row a decoded token took, and whether that is all (``ring_only``)."""

    pushed: torch.Tensor | None = None
    ring_only: bool = True


class LayerState:
    """The state of one LoLA layer; built and documented as :class:`lola.LoLAMemory` (which adds
    the calls of the engine)."""

    def __init__(
        self,
        *,
        window: WindowMemory,
        sparse: SparseMemory,
        policy: ScoringPolicy,
        schedule: UpdateSchedule,
        sinks: SinkMemory | None = None,
        linear: LinearMemory | None = None,
        gqa_storage: str = "kv_head",
        queries: QueryStatistics | None = None,
        layer: int | None = None,
        storage: str | None = None,
        head_offset: int | None = None,
    ) -> None:
        if storage is not None:  # the old name of gqa_storage (the config's)
            warnings.warn("LoLAMemory(storage=...) is now gqa_storage=..., the name LoLAConfig uses", DeprecationWarning, stacklevel=2)
            gqa_storage = storage
        linear = linear if linear is not None else LinearState()
        sinks = sinks if sinks is not None else SinkTokens(0)
        for part, role, argument in (
            (sinks, SinkMemory, "sinks"),
            (window, WindowMemory, "window"),
            (sparse, SparseMemory, "sparse"),
            (linear, LinearMemory, "linear"),
        ):
            check_role(part, role, argument)
        # The policy and schedule are duck-typed roles too: checked here, not at the first step.
        if not callable(getattr(policy, "score", None)):
            raise TypeError(
                f"policy must implement lola.policies.ScoringPolicy (a score(candidates, ctx) method): got {type(policy).__name__} "
                "(build one by name with lola.policies.build)"
            )
        period = getattr(schedule, "period", None)
        if not callable(getattr(schedule, "tokens_until_step", None)) or isinstance(period, bool) or not isinstance(period, int):
            raise TypeError(
                f"schedule must implement lola.schedules.UpdateSchedule (an int period and tokens_until_step(seen)): got {type(schedule).__name__} "
                "(build one by name with lola.schedules.build)"
            )
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 0):
            raise TypeError(f"layer must be an int >= 0 or None, got {layer!r}")
        if head_offset is not None and (isinstance(head_offset, bool) or not isinstance(head_offset, int) or head_offset < 0):
            raise TypeError(f"head_offset must be an int >= 0 or None, got {head_offset!r}")
        if window.max_pending < schedule.period:
            raise ValueError(
                f"window.max_pending ({window.max_pending}) must be >= schedule.period ({schedule.period}): "
                "tokens arriving between two steps wait in the window"
            )
        if gqa_storage not in ("kv_head", "query_head"):
            raise ValueError(f"gqa_storage must be 'kv_head' or 'query_head', got {gqa_storage!r}")
        self.sinks = sinks
        self.window = window
        self.sparse = sparse
        self.linear = linear
        self.policy = policy
        self.schedule = schedule
        self.gqa_storage = gqa_storage
        if queries is None and getattr(policy, "needs_queries", False):
            queries = QueryStatistics(getattr(policy, "query_half_life", 64.0))
        self.queries = queries
        self.layer = layer
        self.head_offset = head_offset
        self.layout: StateLayout | None = None
        self.owner: Callable[[], object] | None = None
        # The positions reads assign (set by the layer that takes the state; None: absolute).
        self.positions: BoundedPositions | None = None
        self.counts = RowCounts()
        self.num_heads = 0
        self.validated_for: tuple | None = None  # (layer, parts) a layer last validated
        # The one buffer of the exact slots, [sinks | sparse | window]: the stock stores are
        # ranges of it (a custom store that keeps storage of its own stays outside).
        # A store with per-head sizes (the calibrated sparse cache) is held ragged: one run of
        # each head's own slots, no head padded to the largest.
        self.slots = SlotBuffer([(m.name, slot_widths(m)) for m in self.exact_memories if binds_buffer(m)])
        for m in self.exact_memories:
            if binds_buffer(m):
                m.bind(self.slots)
        self.buffered = all(binds_buffer(m) for m in self.exact_memories)  # the buffer holds every exact slot
        self.binding: PageBinding | None = None  # external buffers holding this state (bind_pages)
        self.written = Written()
        # Whether a segment's exact reads must give the largest score as their max (the layer's
        # mixing rule reads it, as lolcats does); False lets a CPU read them by fused attention.
        self.exact_max = True
        # The ragged run as decoded tokens read it under bounded positions, kept for the
        # schedule period it was rotated for (ragged_view): (key, view).
        self._ragged_view: tuple[torch.Tensor, tuple, RaggedSlots] | None = None
        self._dense_view: tuple[torch.Tensor, tuple, torch.Tensor] | None = None  # the same for the slots before the window's

    @property
    def storage(self) -> str:
        """The old name of :attr:`gqa_storage` (deprecated)."""
        warnings.warn("LoLAMemory.storage is now gqa_storage, the name LoLAConfig uses", DeprecationWarning, stacklevel=2)
        return self.gqa_storage

    @property
    def seen(self) -> torch.Tensor | None:
        """``[B]`` int64 real tokens each row has seen (``None`` before allocation)."""
        return self.counts.seen

    @seen.setter
    def seen(self, value: torch.Tensor | None) -> None:
        self.counts.set(value)  # the host copies are read again when asked

    # -- description -----------------------------------------------------------------------------
    @property
    def exact_memories(self) -> list:
        """The softmax memories, in read order: sinks, sparse cache, window."""
        return [self.sinks, self.sparse, self.window]

    def parts(self) -> tuple:
        """The component objects (memories, policy, schedule, statistics) and the storage mode."""
        return (self.sinks, self.window, self.sparse, self.linear, self.policy, self.schedule, self.gqa_storage, self.queries)

    def spec(self) -> dict[str, object]:
        """What a state must match to be used by a layer (its index, capacities, policy,
        schedule, storage)."""
        return {
            "layer": self.layer,
            "head_offset": self.head_offset,
            "sinks": self.sinks.capacity,
            "window": describe_part(self.window),
            "max_pending": self.window.max_pending,
            "sparse": describe_part(self.sparse),
            "policy": describe_part(self.policy),
            "schedule": describe_part(self.schedule),
            "gqa_storage": self.gqa_storage,
            "queries": describe_part(self.queries),
        }

    @property
    def allocated(self) -> bool:
        return self.seen is not None

    @property
    def batch_size(self) -> int:
        """Rows the storage was allocated for (0 before the first call)."""
        return 0 if self.seen is None else self.seen.shape[0]

    def nbytes(self) -> int:
        """Bytes this layer's state holds (constant once allocated): the slot buffer, every slot
        counted, empty or not (per-head sparse sizes: each head's own ``λ_h``, held ragged as
        :meth:`state_dict` saves them), the linear state, the statistics and ``seen``."""
        if self.seen is None:
            return 0
        held = self.slots.nbytes() + self.seen.numel() * self.seen.element_size()
        for m in self.stateful_parts():
            if not (binds_buffer(m) and m in self.exact_memories):
                held += m.nbytes()
        return held

    # -- allocation and persistence ------------------------------------------------------------
    def allocate(self, batch: int, num_heads: int, storage_heads: int, head_dim: int, feature_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate empty storage: exact memories ``[batch, storage_heads, ·, head_dim]`` in ``dtype``,
        the linear state ``[batch, num_heads, feature_dim, head_dim]`` in float32.

        Raises:
            MemoryError: the storage would not fit in the memory the device has free (the
                message names the sizes it comes from); nothing is allocated then.
        """
        from lola.memory.allocation import check_allocation

        track = keeps_tallies(self.policy)
        widths = {m.name: slot_widths(m) for m in self.exact_memories}  # a ragged store holds Σ λ_h, not Hs · max λ_h
        slots = {name: w if isinstance(w, int) else f"{sum(w)} over the heads" for name, w in widths.items()}
        per_head = sum(w for w in widths.values() if isinstance(w, int))
        ragged = sum(sum(w) for w in widths.values() if not isinstance(w, int))
        element = torch.empty((), dtype=dtype).element_size()
        per_slot = 2 * head_dim * element + 8 + (4 if track else 0)  # k, v, position, tally
        linear = num_heads * (feature_dim + 1) * head_dim * 4 + (num_heads * (1 + head_dim + head_dim * head_dim) * 4 if self.queries is not None else 0)
        need = batch * ((storage_heads * per_head + ragged) * per_slot + linear)
        sizes = " + ".join(f"{name} {n}" for name, n in slots.items())
        # A step builds out-of-place copies of the exact memories (the block it attends over, the
        # buffers of an update): room for the state and two working copies of it is asked for.
        check_allocation(
            WORKING_COPIES * need,
            device,
            f"one layer's LoLA state ({sizes} slots × {storage_heads} K/V heads × head_dim {head_dim} in {dtype}, "
            f"a {feature_dim}×{head_dim} linear state per head, batch {batch}; {WORKING_COPIES}× that while a step runs)",
            held=need,
        )
        self.binding = None
        self.slots.allocate(batch, storage_heads, head_dim, dtype, device, track)
        for m in self.exact_memories:
            m.allocate(batch, storage_heads, head_dim, dtype, device, track)  # nothing to do for the buffer's
        self.linear.allocate(batch, num_heads, feature_dim, head_dim, device)
        if self.queries is not None:
            self.queries.allocate(batch, num_heads, head_dim, device)
        self.seen = torch.zeros(batch, dtype=torch.long, device=device)
        self.counts.host = [0] * batch
        self.num_heads = num_heads

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat ``{"seen", "sinks.k", …, "linear.H", "linear.s"}`` tensors (safetensors-ready)."""
        if self.seen is None:
            return {}
        out = {"seen": self.seen}
        for m in self.stateful_parts():
            out.update({f"{m.name}.{k}": t for k, t in m.state_dict().items()})
        out[LAYOUT_KEY] = self.layout_entry()
        return out

    def layout_entry(self) -> torch.Tensor:
        """``layout [B, W]`` uint8: this state's layout descriptor
        (:func:`~lola.engine.state_checks.describe_layout`) with every row, as :meth:`state_dict`
        stamps it (held once per device and descriptor: no host copy per call)."""
        descriptor = describe_layout(self)
        key = (repr(descriptor), self.seen.device)
        cached = getattr(self, "_layout_row", None)
        if cached is None or cached[0] != key:
            cached = (key, encode_layout(descriptor, 1, self.seen.device))
            self._layout_row = cached
        return cached[1].expand(self.seen.shape[0], -1).contiguous()

    def leave_inference_mode(self) -> None:
        """Copy a state made under ``torch.inference_mode()`` into normal tensors, once: outside
        that mode its tensors cannot be written in place (the window's ring slot, a step's
        select), and transformers' own cache works across the boundary (it concatenates).

        Raises:
            ValueError: the state is bound to pages (the pages are the caller's to make).
        """
        if self.binding is not None:
            raise ValueError(
                "the state is bound to pages made under torch.inference_mode(): outside it they cannot be written in place; "
                "allocate the pages outside inference mode (or run every step inside it)"
            )
        self.load_state_dict(self.state_dict(), check=False)  # state_dict's clones are normal tensors here

    def load_state_dict(self, state: dict[str, torch.Tensor], check: bool = True) -> None:
        """Restore what :meth:`state_dict` saved (copies; every held token bit-exact, empty slots
        zeroed).

        With ``check`` (the default; rows reordered from this very state skip it) the state
        must hold what a run of this memory could have written (:func:`check_state`): its
        keys, dtypes and shapes, finite values, ``seen >= 0``, non-negative normalisers, and per
        row and storage head stored positions ``< seen`` that no two exact slots share.

        Raises:
            ValueError: naming the tensor and what is wrong.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping of names to tensors (LoLAMemory.state_dict's), got a {type(state).__name__}")
        if "seen" not in state:
            raise ValueError("state must contain 'seen' (was it saved by LoLAMemory.state_dict?)")
        if check:
            check_state(state, self)
        self.binding = None
        self._allocate_slots_for(state)
        known = {"seen", LAYOUT_KEY}  # the layout: compared by check_state, written again by state_dict
        for m in self.stateful_parts():
            part = {k.split(".", 1)[1]: t for k, t in state.items() if k.startswith(m.name + ".")}
            known |= {f"{m.name}.{k}" for k in part}
            m.load_state_dict(part)
        unknown = set(state) - known
        if unknown:
            raise ValueError(f"state has unexpected keys {sorted(unknown)}")
        self.seen = state["seen"].clone()
        if not self.linear.allocated or self.seen.shape[0] != self.linear.state[0].shape[0]:
            raise ValueError("state is inconsistent: 'seen' and 'linear.H' disagree on the batch size")
        self.num_heads = self.linear.state[0].shape[1]

    def reference_state(self, state: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], set[str]] | None:
        """What a state of this memory holds, for :func:`check_state`
        (:func:`lola.engine.state_checks.reference_of`)."""
        return reference_of(self, state)

    # -- rows (sequence slots) -------------------------------------------------------------------
    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index [B']`` (int64, repeats allowed) of every state tensor, in that order:
        beam reordering, dropping finished sequences, or growing a batch."""
        self._require_allocated()
        index = check_row_index(index, self.batch_size, "index", repeats=True, device=self.seen.device)
        self.load_state_dict({k: t.index_select(0, index) for k, t in self.state_dict().items()}, check=False)

    def write_rows(self, index: torch.Tensor, other: LayerState) -> None:
        """Copy every row of ``other`` into rows ``index [B_other]`` of this state.

        Rows are independent sequences (the schedule, ring slots and positions of a row depend
        on that row alone), so a serving engine can prefill a request in a state of its own and
        place it in a slot of a batched state, then decode the batch (tested against decoding
        each sequence alone).
        """
        self._require_allocated()
        if not isinstance(other, LayerState):
            raise TypeError(f"other must be a LoLAMemory, got a {type(other).__name__}")
        if not other.allocated:
            raise ValueError("other is not allocated: it holds no rows to write (run it on a sequence first)")
        diff = layout_difference(describe_layout(other), describe_layout(self))
        if diff is not None:  # the layout first: states of the same shapes may be of others
            field, a, b = diff
            raise ValueError(
                f"other was built for another configuration: it holds a state of {a}, this state is of {b} (layout field {field!r}; rows move only between states of one layout): "
                f"other {summary(describe_layout(other))}; this {summary(describe_layout(self))}"
            )
        theirs = other.state_dict()
        ours = self.state_dict()
        if theirs.keys() != ours.keys() or other.spec() != self.spec():
            raise ValueError(f"other was built for another configuration: {other.spec()} vs {self.spec()}")
        index = check_row_index(index, self.batch_size, "index", repeats=False, device=self.seen.device)
        if index.shape != (other.batch_size,):
            raise ValueError(f"index must give one row per row of other ({other.batch_size}), got shape {tuple(index.shape)}")
        self.load_state_dict({k: t.index_copy(0, index, theirs[k].to(t.device)) for k, t in ours.items()}, check=False)

    def _require_allocated(self) -> None:
        if self.seen is None:
            raise RuntimeError("LoLAMemory is not allocated: call allocate() first")

    def reset(self) -> None:
        """Forget everything; the next call allocates afresh."""
        for m in self.stateful_parts():
            m.reset()
        self.slots.reset()
        self.binding = None
        self.seen = None
        self.num_heads = 0

    def stateful_parts(self) -> list:
        return [*self.exact_memories, self.linear, *([self.queries] if self.queries is not None else [])]

    def exact_slots(self) -> KVBlock:
        """The exact slots as one block, ``[sinks | sparse | window]``: the slot buffer itself
        (no copy) when it holds them all (the slots of a store held ragged are not in it:
        :meth:`ragged_slots`); with a custom store of its own, the stores' blocks concatenated
        (a copy per call)."""
        if self.buffered:
            return self.slots.whole
        return KVBlock.cat([m.block for m in self.exact_memories if m.capacity])

    def ragged_slots(self) -> RaggedSlots | None:
        """The exact slots held ragged (per-head sparse sizes): each storage head's own range of
        one run, read beside :meth:`exact_slots` (``None`` when none are, or the buffer does not
        hold every store: :meth:`exact_slots` then holds them, padded)."""
        return self.slots.ragged() if self.buffered else None

    def snapshot_exact(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], RaggedSlots | None]:
        """The exact slots as they are now, ``(k, v, pos)`` per block and the ragged run, for a
        read deferred past later writes: the buffer's next write copies instead of overwriting
        them (:meth:`release_snapshots` when the deferred reads are done)."""
        if self.buffered:
            w = self.slots.snapshot()
            return [(w.k, w.v, w.pos)], self.slots.ragged()
        if self.slots.allocated:
            self.slots.snapshot()
        return [(m.block.k, m.block.v, m.block.pos) for m in self.exact_memories if m.capacity], None

    def ragged_view(self, ragged: RaggedSlots, newest: int) -> RaggedSlots:
        """The ragged run as a decoded token at ``newest`` (every row there) reads it:
        :meth:`exact_view` of its keys, rotated once per schedule period and kept (the run
        changes only at a step, the read's position only from one period to the next). The kept
        view is keyed on the run's tensors and the buffer's count of writes to them
        (``SlotBuffer.run_writes``: a step, a load, a reorder), and not kept for a state bound to
        a server's pages (which the server writes itself)."""
        bounded = self.positions
        if bounded is None or not bounded.moves_exact(newest):
            return ragged
        period = self.schedule.period
        start = (newest + 1) // period * period - 1  # the period's first query (exact_view's)
        run = self.slots.run
        key = (self.slots.run_writes, start, ragged.offsets)
        kept = self._ragged_view
        if self.binding is None and kept is not None and kept[0] is run.k and kept[1] == key:
            return kept[2]
        view = RaggedSlots(self.exact_view(ragged.k, ragged.pos, newest, newest), ragged.v, ragged.pos, ragged.offsets)
        self._ragged_view = (run.k, key, view)
        return view

    def dense_view(self, block: KVBlock, newest: int) -> torch.Tensor:
        """The dense slots' keys (``block``: :meth:`exact_slots`) as a decoded token at ``newest``
        (every row there) reads them: :meth:`exact_view`, with the slots before the window's
        (sinks, a uniform sparse cache: they change only at steps and loads) rotated once per
        schedule period and kept, and the window's as they are when none of them can be far
        enough to move (its ring, pending slots included, within ``exact_distance``); else
        :meth:`exact_view` itself. Kept as :meth:`ragged_view` keeps the run's (the buffer's
        count of writes; never for a state bound to pages)."""
        bounded = self.positions
        if bounded is None or not bounded.moves_exact(newest):
            return block.k
        region = self.slots.regions.get(self.window.name) if self.buffered and self.binding is None else None
        if region is None or region[1] != block.k.shape[2] or region[1] - region[0] > bounded.exact_distance:
            return self.exact_view(block.k, block.pos, newest, newest)
        a = region[0]
        period = self.schedule.period
        key = (self.slots.writes, (newest + 1) // period * period - 1)
        kept = self._dense_view
        if kept is None or kept[0] is not block.k or kept[1] != key:
            kept = self._dense_view = (block.k, key, self.exact_view(block.k[:, :, :a], block.pos[:, :, :a], newest, newest))
        return torch.cat([kept[2], block.k[:, :, a:]], dim=2)

    def exact_view(self, k: torch.Tensor, pos: torch.Tensor, first: torch.Tensor | int, newest: int) -> torch.Tensor:
        """Exact keys ``k [B, ..., N, D]`` (positions ``pos [B, ..., N]``) as a read whose first
        query is at ``first`` (``[B]``, or an int for every row) sees them: ``k`` itself under
        absolute positions or when no key can move (``newest``: a host bound on ``first``), else
        re-rotated by :meth:`~lola.core.positions.BoundedPositions.exact_keys` (a copy) for
        the first position of ``first``'s schedule period (``((first + 1) // P) · P − 1``: the
        query a step falls on and those after it until the next step read one state)."""
        bounded = self.positions
        if bounded is None or not bounded.moves_exact(newest):
            return k
        if not isinstance(first, torch.Tensor):
            first = torch.full((k.shape[0],), first, dtype=torch.long, device=k.device)
        # The read's position is its schedule period's first query: the same however the stream
        # was cut into calls (a group of reads never spans two periods: its memories change at steps).
        period = self.schedule.period
        start = ((first + 1) // period * period - 1).clamp_min(0)
        return bounded.exact_keys(k, pos, start)

    def prefill_period(self, tokens: int) -> int | None:
        """The period of a call of ``tokens`` tokens that steps less often than the schedule's
        (its ``prefill_period``, :class:`lola.schedules.Chunkwise`'s ``prefill_chunk``), or
        ``None``: the call steps every ``period``. ``None`` for a single token, a state bound
        to pages (their window has the period's slots) or a window that cannot grow."""
        big = getattr(self.schedule, "prefill_period", None)
        if tokens <= 1 or not isinstance(big, int) or big <= self.schedule.period or self.binding is not None:
            return None
        return big if callable(getattr(self.window, "resize_pending", None)) else None

    def resize_window(self, max_pending: int) -> None:
        """Give the window room for ``max_pending`` waiting tokens (a prefill's chunk, then the
        schedule's period again): its held tokens move to their ring slots of the new capacity
        (:meth:`lola.memory.SlidingWindow.resize_pending`), the layer's other slots stay."""
        window = self.window
        if window.max_pending == max_pending:
            return
        moved = window.resize_pending(max_pending)
        if binds_buffer(window):
            self.slots.resize(window.name, window.capacity, moved)
            window.bind(self.slots)

    def release_snapshots(self) -> None:
        """No deferred read holds the slots or the linear state any more: writes go in place again."""
        self.slots.shared = self.slots.run_shared = False
        if getattr(self.linear, "snapshots", False):
            self.linear.shared = False

    def _allocate_slots_for(self, state: dict[str, torch.Tensor]) -> None:
        """A fresh slot buffer of the geometry ``state`` holds (rows from ``seen``; heads, ``D``,
        dtype and device from a stored memory's keys; attention tallies if it has them), for
        the stores to load into."""
        for m in self.exact_memories:
            k = state.get(f"{m.name}.k")
            if not binds_buffer(m) or not isinstance(k, torch.Tensor) or k.dim() != 4:
                continue
            head_sizes = getattr(m, "head_sizes", None)  # a ragged saved state: one run of every head's slots
            heads = len(head_sizes) if head_sizes is not None else k.shape[1]
            track = any(key.endswith(".acc") for key in state)
            self.slots.allocate(state["seen"].shape[0], heads, k.shape[3], k.dtype, k.device, track)
            return
        self.slots.reset()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sinks={self.sinks!r}, window={self.window!r}, sparse={self.sparse!r}, "
            f"policy={self.policy!r}, schedule={self.schedule!r}, gqa_storage={self.gqa_storage!r}"
            + (f", queries={self.queries!r}" if self.queries is not None else "")
            + ")"
        )
