"""LoLAMemory: one layer's memories, its scoring policy and its schedule, composed.

The life of a token (positions count real tokens of a row):

1. It is written to the sinks (if its position is below ``sinks``) or to the window.
2. If a schedule step falls on it, the step runs now: window tokens beyond the newest ``η``
   and the current sparse cache are scored by the policy against the current linear state;
   the top ``λ`` stay in the sparse cache, the rest are folded into ``H, s``.
3. Its query reads every memory: softmax over sinks ∪ sparse ∪ window (causal by position)
   and the linear state; the partials go back to the caller, which mixes them.

A segment of ``T`` tokens is processed in blocks that end at schedule steps; within a block,
all queries are read in parallel (no token enters ``H`` inside a block), and the query on
which a step falls is read with the next block, against the state after the step
(:mod:`lola.engine.segment_reads`).
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from lola.core.checks import reads_back, require
from lola.core.partials import LinearPartial, SoftmaxPartial, merge_softmax_partials
from lola.engine.segment_reads import DecodeRead, SegmentReads, take_tokens
from lola.engine.state_pages import PageBinding, bind, page_layout, sync
from lola.memory.base import ExactStore, KVBlock, LinearMemory, QueryBlock, SinkMemory, SparseMemory, WindowMemory, check_role
from lola.memory.linear_state import LinearState
from lola.memory.query_stats import QueryStatistics
from lola.memory.sinks import SinkTokens
from lola.memory.slots import SlotBuffer
from lola.memory.sparse import SparseCache
from lola.memory.window import SlidingWindow
from lola.policies.base import ScoringContext, ScoringPolicy, keeps_tallies
from lola.schedules import UpdateSchedule

__all__ = ["LoLAMemory", "StateLayout", "check_state"]

WORKING_COPIES = 3
"""The memory a layer's state is checked against, in copies of the state: itself and the
out-of-place copies a step makes of its exact memories."""

FeatureFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StateLayout:
    """The geometry of a layer's state, declared by the layer it belongs to
    (:meth:`lola.LoLAAttention.new_state`); :func:`check_state` compares a loaded state with
    what a state of this geometry holds.

    Attributes:
        num_heads: query heads ``H`` (the linear state's heads).
        storage_heads: heads the exact memories store (``H_kv``, or ``H`` per query head).
        head_dim: ``D``.
        feature_dim: ``F``, the size of ``φ(k)``.
        non_negative: the key feature map's features are ``>= 0``, and so is ``linear.s``.
    """

    num_heads: int
    storage_heads: int
    head_dim: int
    feature_dim: int
    non_negative: bool = False


class LoLAMemory:
    """The state of one LoLA layer: sinks + sliding window + sparse cache + linear state.

    Build one from the parts (any subclass of the memories works) and pass it to
    :class:`lola.LoLAAttention` as ``state``; or let the layer build it from its config.
    Storage is allocated on the first call and never grows.

    Each part plays a role the composer drives (:class:`~lola.memory.WindowMemory`,
    :class:`~lola.memory.SparseMemory`, :class:`~lola.memory.SinkMemory`,
    :class:`~lola.memory.LinearMemory`); any object with the role's members works, and a
    missing member is named at construction.

    Args:
        window: the sliding window; its ``max_pending`` must cover ``schedule.period``.
        sparse: the sparse cache.
        policy: scores candidates at each step (higher = keep exact).
        schedule: when steps run.
        sinks: pinned first tokens, or ``None``.
        linear: the linear state (a fresh :class:`~lola.memory.LinearState` by default).
        storage: ``"kv_head"`` or ``"query_head"``, see :class:`lola.LoLAConfig`.
        queries: running statistics of the layer's queries for the policy's
            :class:`~lola.policies.ScoringContext`; built automatically (with the policy's
            ``query_half_life``, default 64) when the policy sets ``needs_queries = True``.
        layer: the layer's index in its model (given to the policy), or ``None``; a layer
            refuses a state of another index.

    Attributes:
        layout: the :class:`StateLayout` the owning layer declared (``None`` for a memory no
            layer has taken yet): what a loaded state is checked against.
        owner: a weak reference to the :class:`lola.LoLAAttention` that took this state (its
            linear state sums that layer's features, so no other layer may read it), or ``None``.
    """

    def __init__(
        self,
        *,
        window: WindowMemory,
        sparse: SparseMemory,
        policy: ScoringPolicy,
        schedule: UpdateSchedule,
        sinks: SinkMemory | None = None,
        linear: LinearMemory | None = None,
        storage: str = "kv_head",
        queries: QueryStatistics | None = None,
        layer: int | None = None,
    ) -> None:
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
        if window.max_pending < schedule.period:
            raise ValueError(
                f"window.max_pending ({window.max_pending}) must be >= schedule.period ({schedule.period}): "
                "tokens arriving between two steps wait in the window"
            )
        if storage not in ("kv_head", "query_head"):
            raise ValueError(f"storage must be 'kv_head' or 'query_head', got {storage!r}")
        self.sinks = sinks
        self.window = window
        self.sparse = sparse
        self.linear = linear
        self.policy = policy
        self.schedule = schedule
        self.storage = storage
        if queries is None and getattr(policy, "needs_queries", False):
            queries = QueryStatistics(getattr(policy, "query_half_life", 64.0))
        self.queries = queries
        self.layer = layer
        self.layout: StateLayout | None = None
        self.owner: Callable[[], object] | None = None
        self.seen = None
        self.num_heads = 0
        self._spec_checked: tuple | None = None  # (layer, parts) a layer last validated
        # The one buffer of the exact slots, [sinks | sparse | window]: the stock stores are
        # ranges of it (a custom store that keeps storage of its own stays outside).
        self.slots = SlotBuffer([(m.name, m.capacity) for m in self.exact_memories if _binds(m)])
        for m in self.exact_memories:
            if _binds(m):
                m.bind(self.slots)
        self._whole = all(_binds(m) for m in self.exact_memories)  # the buffer holds every exact slot
        self._pages: PageBinding | None = None  # external buffers holding this state (bind_pages)
        self._pushed: torch.Tensor | None = None  # a call's one ring slot per row, for the pages
        self._ring_only = True

    @property
    def seen(self) -> torch.Tensor | None:
        """``[B]`` int64 real tokens each row has seen (``None`` before allocation)."""
        return self._seen

    @seen.setter
    def seen(self, value: torch.Tensor | None) -> None:
        self._seen = value
        # Host copies for the decode path (no device reads per token): each row's count, and
        # each row's tokens until its next step; read from the device once when unknown, then
        # advanced on the host (:meth:`_advance`).
        self._seen_host: list[int] | None = None
        self._due: list[int] | None = None

    # -- description -----------------------------------------------------------------------------
    @property
    def exact_memories(self) -> list:
        """The softmax memories, in read order: sinks, sparse cache, window."""
        return [self.sinks, self.sparse, self.window]

    def parts(self) -> tuple:
        """The component objects (memories, policy, schedule, statistics) and the storage mode."""
        return (self.sinks, self.window, self.sparse, self.linear, self.policy, self.schedule, self.storage, self.queries)

    def spec(self) -> dict[str, object]:
        """What a state must match to be used by a layer (its index, capacities, policy,
        schedule, storage)."""
        return {
            "layer": self.layer,
            "sinks": self.sinks.capacity,
            "window": _describe(self.window),
            "max_pending": self.window.max_pending,
            "sparse": _describe(self.sparse),
            "policy": _describe(self.policy),
            "schedule": _describe(self.schedule),
            "storage": self.storage,
            "queries": _describe(self.queries),
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
        counted, empty or not (per-head sparse sizes give each head the largest head's slots:
        :meth:`state_dict` saves them ragged), the linear state, the statistics and ``seen``."""
        if self.seen is None:
            return 0
        held = self.slots.nbytes() + self.seen.numel() * self.seen.element_size()
        for m in self._stateful():
            if not (_binds(m) and m in self.exact_memories):
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
        slots = {m.name: m.capacity for m in self.exact_memories}
        element = torch.empty((), dtype=dtype).element_size()
        per_slot = 2 * head_dim * element + 8 + (4 if track else 0)  # k, v, position, tally
        linear = num_heads * (feature_dim + 1) * head_dim * 4 + (num_heads * (1 + head_dim + head_dim * head_dim) * 4 if self.queries is not None else 0)
        need = batch * (storage_heads * sum(slots.values()) * per_slot + linear)
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
        self._pages = None
        self.slots.allocate(batch, storage_heads, head_dim, dtype, device, track)
        for m in self.exact_memories:
            m.allocate(batch, storage_heads, head_dim, dtype, device, track)  # nothing to do for the buffer's
        self.linear.allocate(batch, num_heads, feature_dim, head_dim, device)
        if self.queries is not None:
            self.queries.allocate(batch, num_heads, head_dim, device)
        self.seen = torch.zeros(batch, dtype=torch.long, device=device)
        self._seen_host = [0] * batch
        self.num_heads = num_heads

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat ``{"seen", "sinks.k", …, "linear.H", "linear.s"}`` tensors (safetensors-ready)."""
        if self.seen is None:
            return {}
        out = {"seen": self.seen}
        for m in self._stateful():
            out.update({f"{m.name}.{k}": t for k, t in m.state_dict().items()})
        return out

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
        self._pages = None
        self._allocate_slots_for(state)
        known = {"seen"}
        for m in self._stateful():
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
        """What a state of this memory holds, for :func:`check_state`: ``(tensors, follow)``.

        Once allocated, its own tensors (``follow`` empty: every dtype is fixed). Before, the
        tensors of a twin allocated for one row on the ``meta`` device (no memory is used),
        for the :attr:`layout` its layer declared or, without one, the geometry read off
        ``state``'s ``linear.H`` and ``window.k``; ``follow`` names the tensors whose dtype is
        the keys' and values' (the twin is allocated twice, in two dtypes, to tell them).
        ``None`` when neither tells the geometry, or when a custom part cannot be copied or
        allocated on ``meta`` (the checks that need no reference still run).
        """
        if self.allocated:
            return self.state_dict(), set()
        layout = self.layout or _layout_of(state or {}, self.linear.name, self.window.name)
        if layout is None:
            return None
        twins = []
        for dtype in (torch.float16, torch.bfloat16):
            try:
                parts = copy.deepcopy((self.sinks, self.window, self.sparse, self.linear, self.queries))  # unallocated: no tensors to copy
                twin = LoLAMemory(
                    sinks=parts[0],
                    window=parts[1],
                    sparse=parts[2],
                    linear=parts[3],
                    queries=parts[4],
                    policy=self.policy,
                    schedule=self.schedule,
                    storage=self.storage,
                )
                twin.allocate(1, layout.num_heads, layout.storage_heads, layout.head_dim, layout.feature_dim, dtype, torch.device("meta"))
            except Exception:  # a custom part that cannot be copied or allocated on meta
                return None
            twins.append(twin.state_dict())
        a, b = twins
        return a, {k for k in a if a[k].dtype != b[k].dtype}

    # -- rows (sequence slots) -------------------------------------------------------------------
    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index [B']`` (int64, repeats allowed) of every state tensor, in that order:
        beam reordering, dropping finished sequences, or growing a batch."""
        self._require_allocated()
        index = self._check_index(index, self.batch_size, "index", repeats=True)
        self.load_state_dict({k: t.index_select(0, index) for k, t in self.state_dict().items()}, check=False)

    def _check_index(self, index: object, rows: int, name: str, repeats: bool) -> torch.Tensor:
        """``index`` as a 1-D int64 tensor of rows in ``[0, rows)`` on the state's device, else an
        error naming ``name`` (:func:`lola.core.checks.require`: no wait on an accelerator)."""
        if not isinstance(index, torch.Tensor):
            raise TypeError(f"{name} must be a 1-D int64 tensor of rows, got a {type(index).__name__}")
        if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
            raise TypeError(f"{name} must be a tensor of int rows, got {index.dtype}")
        if index.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor of rows, got shape {tuple(index.shape)}")
        from lola.core.checks import require

        index = index.to(device=self._seen.device, dtype=torch.long)
        # (beam search reorders every layer at every step: on an accelerator this is an asynchronous assert)
        if index.numel() and not require((index.amin() >= 0) & (index.amax() < rows), f"{name} must hold rows in [0, {rows})"):
            raise ValueError(f"{name} must hold rows in [0, {rows}) (the state's batch), got {index.tolist()[:8]}")
        if not repeats and index.unique().numel() != index.numel():
            raise ValueError(f"{name} must name each row once (two rows written to one would overwrite each other), got {index.tolist()[:8]}")
        return index

    def write_rows(self, index: torch.Tensor, other: "LoLAMemory") -> None:
        """Copy every row of ``other`` into rows ``index [B_other]`` of this state.

        Rows are independent sequences (the schedule, ring slots and positions of a row depend
        on that row alone), so a serving engine can prefill a request in a state of its own and
        place it in a slot of a batched state, then decode the batch (tested against decoding
        each sequence alone).
        """
        self._require_allocated()
        if not isinstance(other, LoLAMemory):
            raise TypeError(f"other must be a LoLAMemory, got a {type(other).__name__}")
        if not other.allocated:
            raise ValueError("other is not allocated: it holds no rows to write (run it on a sequence first)")
        theirs = other.state_dict()
        ours = self.state_dict()
        if theirs.keys() != ours.keys() or other.spec() != self.spec():
            raise ValueError(f"other was built for another configuration: {other.spec()} vs {self.spec()}")
        index = self._check_index(index, self.batch_size, "index", repeats=False)
        if index.shape != (other.batch_size,):
            raise ValueError(f"index must give one row per row of other ({other.batch_size}), got shape {tuple(index.shape)}")
        self.load_state_dict({k: t.index_copy(0, index, theirs[k].to(t.device)) for k, t in ours.items()}, check=False)

    # -- external buffers (a server's pages) -------------------------------------------------------
    def page_layout(
        self, num_heads: int, storage_heads: int, head_dim: int, feature_dim: int, dtype: torch.dtype, seen: bool = False
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-row shape and dtype of each page a bound state needs (:func:`lola.engine.state_pages.page_layout`)."""
        return page_layout(self, num_heads, storage_heads, head_dim, feature_dim, dtype, seen)

    def bind_pages(self, pages: Mapping[str, torch.Tensor], rows: torch.Tensor, seen: torch.Tensor | None = None, check: bool = True) -> None:
        """Keep this state in rows ``rows [B]`` of external buffers ``pages`` (a serving engine's
        pages): contiguous rows are written in place, others gathered here and written back by
        index after every call (:mod:`lola.engine.state_pages`). Loading, reordering or resetting the
        state unbinds it. A row another live state is bound to is refused (release that state
        first: :meth:`release_pages`). Pages that share memory, and rows whose content no run could have
        written (a negative ``seen``, positions outside ``[-1, seen)``), are refused
        (:func:`lola.engine.state_pages.check_pages_content`: one read back per bind); ``check=False``
        skips that for a server binding pages only it writes, every step (the layout is
        checked always)."""
        bind(self, pages, rows, seen, check=check)

    def release_pages(self) -> None:
        """Give up the pages this state is bound to, so that another state may bind their rows:
        the pages keep what it held (they are current after every call) and this state forgets
        it, as :meth:`reset` does. Nothing happens to a state that is not bound."""
        if self._pages is not None:
            self.reset()

    @property
    def bound_pages(self) -> PageBinding | None:
        """The external buffers this state lives in (``None``: its own storage)."""
        return self._pages

    def _require_allocated(self) -> None:
        if self._seen is None:
            raise RuntimeError("LoLAMemory is not allocated: call allocate() first")

    def reset(self) -> None:
        """Forget everything; the next call allocates afresh."""
        for m in self._stateful():
            m.reset()
        self.slots.reset()
        self._pages = None
        self.seen = None
        self.num_heads = 0

    def _stateful(self) -> list:
        return [*self.exact_memories, self.linear, *([self.queries] if self.queries is not None else [])]

    # -- the engine ------------------------------------------------------------------------------
    def attend(
        self,
        q: torch.Tensor,
        fq: torch.Tensor | None,
        k: torch.Tensor,
        v: torch.Tensor,
        valid: torch.Tensor,
        scale: float,
        feature_map_k: FeatureFn,
    ) -> tuple[SoftmaxPartial, LinearPartial]:
        """Write a segment into the memories and read every query.

        The segment runs in blocks that end at schedule steps: a block's tokens are written,
        its queries are read (:class:`~lola.engine.segment_reads.SegmentReads`: the query a step falls
        on is read with the next block, against the state after the step), then the step runs.

        Args:
            q: ``[B, H, T, D]`` queries; fq: ``[B, H, T, F]`` their features (float32), or
                ``None`` when the output does not read the linear state (``softmax_only``: it is
                still written, the policy scores against it); the linear partial is then zero.
            k, v: ``[B, Hs, T, D]`` keys/values per storage head.
            valid: ``[B, T]`` bool, real tokens (padding is neither written nor read).
            scale: softmax scale.
            feature_map_k: ``φ`` for keys, ``[B, H, N, D] -> [B, H, N, F]``.

        Returns:
            The merged exact partial and the linear partial, both ``[B, H, T, ·]``;
            padded positions read nothing (``den = 0``).
        """
        self._require_allocated()
        b, h, t, d = q.shape
        # Pack each row's real tokens to the left, in order; rows then run independent schedules.
        packed = not bool(valid.all())
        # Unpadded rows whose blocks are known on the host: rows at the same position (they share
        # every block boundary), or one token per row (its own block, wherever the row is).
        host = not packed and (t == 1 or self._rows_in_step())
        order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True) if packed else None
        qp, fqp, kp, vp = (None if x is None else take_tokens(x, order) for x in (q, fq, k, v)) if packed else (q, fq, k, v)

        track = bool(getattr(self.policy, "needs_attention", False))
        reads = SegmentReads(self, qp, fqp, self.seen, scale, uniform=host, track=track)
        self._run_blocks(qp, kp, vp, valid, scale, feature_map_k, reads, host)
        exact, linear = reads.result()
        if not packed:
            return exact, linear
        # Unpack to the caller's token order (padding keeps the empty partial).
        inverse = torch.argsort(order, dim=1)
        exact = SoftmaxPartial(*(take_tokens(x, inverse) for x in (exact.num, exact.den, exact.max)))
        linear = LinearPartial(*(take_tokens(x, inverse) for x in (linear.num, linear.den)))
        return exact, linear

    @property
    def decodes_fused(self) -> bool:
        """Whether :meth:`decode` applies: every exact memory reads its block (``reads_block``) and
        the policy needs no attention weights (else single tokens take :meth:`attend`)."""
        return not getattr(self.policy, "needs_attention", False) and all(m.reads_block for m in self.exact_memories)

    def decode(
        self,
        q: torch.Tensor,
        fq: torch.Tensor | None,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        feature_map_k: FeatureFn,
        gate: torch.Tensor,
        mixing: str,
    ) -> torch.Tensor:
        """One new token per row (no padding): the block loop's one-token case (the loop of
        :meth:`attend`: write it, run the step if it falls on it), read and mixed with one
        :func:`lola.kernels.decode_step` call (:class:`~lola.engine.segment_reads.DecodeRead`).

        Equals :meth:`attend` on the same token followed by :func:`lola.core.mix` (tested).

        Args:
            q: ``[B, H, 1, D]``; fq: ``[B, H, 1, F]`` (``None`` with ``softmax_only``);
            k, v: ``[B, Hs, 1, D]``.
            scale: softmax scale; feature_map_k: ``φ`` for keys.
            gate: ``[H]`` softmax weight per head; mixing: a :data:`lola.core.mixing.MIXING_RULES` name.

        Returns:
            ``[B, H, D]`` float32 outputs.
        """
        self._require_allocated()
        if not self.decodes_fused:
            raise RuntimeError(f"{self!r} cannot use the fused decode step (custom exact memories or attention-scored policy): use attend()")
        reads = DecodeRead(self, q, fq, scale, gate, mixing)
        self._run_blocks(q, k, v, None, scale, feature_map_k, reads, host=True)
        return reads.result()

    def _run_blocks(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        valid: torch.Tensor | None,
        scale: float,
        feature_map_k: FeatureFn,
        reads: SegmentReads | DecodeRead,
        host: bool,
    ) -> None:
        """The block loop of prefill and decode alike: blocks end at schedule steps; a block's
        tokens are written, its queries are read (``reads.add``: the carried query and the
        block's queries up to, not including, one a step falls on), then the step runs; a query a
        step falls on is read with the next block, against the state after the step.

        Args:
            q: ``[B, H, T, D]``; k, v: ``[B, Hs, T, D]``, each row's real tokens packed to the left.
            valid: ``[B, T]`` real tokens (only read when not ``host``).
            reads: where the queries' reads go (:class:`~lola.engine.segment_reads.SegmentReads` for
                partials, :class:`~lola.engine.segment_reads.DecodeRead` for one mixed token per row).
            host: every row takes all ``T`` tokens and each block's length is known on the host:
                rows at one position (they share every block boundary), or ``T = 1`` (each row's
                own step, if it falls on its token, runs before the read; a step changes only its
                own rows, so the rows that do not step read the same state either way). Blocks are
                then slices and no device value is read. Else the rows' blocks are asked of the
                schedule on the device, one read per block.
        """
        b, t, device = q.shape[0], k.shape[2], k.device
        self._pushed, self._ring_only = None, True
        # Packed index of each row's next token, and whether the row's last token stepped (its
        # query then waits for the state after the step).
        offset: int | torch.Tensor = 0 if host else torch.zeros(b, dtype=torch.long, device=device)
        carried: int | torch.Tensor = 0 if host else torch.zeros(b, dtype=torch.long, device=device)
        remaining = None if host else valid.sum(dim=1)
        while (offset < t) if host else bool((remaining > 0).any()):
            if host:
                dues = self._host_due()
                L = min(min(dues), t - offset)
                steps = [d == L for d in dues]
                length, any_step = L, any(steps)
                stepping = (torch.full((b,), True, device=device) if all(steps) else torch.tensor(steps, device=device)) if any_step else None
                pos = self.seen[:, None] if L == 1 else (self.seen[:, None] + torch.arange(L, device=device)).expand(b, L)
                active = None
                k_c, v_c = k.narrow(2, offset, L), v.narrow(2, offset, L)
            else:
                due = self._ask_schedule(self.seen)
                length = torch.minimum(due, remaining)
                stepping = (length == due) & (length > 0)
                # One device read for the block's length, whether a step falls in it and the
                # schedule's range (an answer of 0 would make empty blocks forever).
                L, any_step, lo, hi = torch.stack([length.max(), stepping.any().long(), due.min(), due.max()]).tolist()
                self._check_until(lo, hi)
                L, any_step = int(L), bool(any_step)
                j = torch.arange(L, device=device)
                active = j[None, :] < length[:, None]  # [B, L]
                idx = (offset[:, None] + j).clamp(max=t - 1)
                pos = torch.where(active, self.seen[:, None] + j, -1)
                k_c, v_c = take_tokens(k, idx), take_tokens(v, idx)

            q_c = (q.narrow(2, offset, L) if host else take_tokens(q, idx)) if self.queries is not None else None
            self._write_block(k_c, v_c, pos, length, q_c, active)
            if host:  # the countdowns go on without asking the schedule, which is asked at a step
                self._due = [d - L for d in dues] if not any_step else self._host_due()
            # The carried query and this block's queries up to (not including) a stepping one.
            stepped = int(any_step) if host else stepping.long()
            reads.add(offset - carried, carried + length - stepped)
            if any_step:
                self._step(stepping, feature_map_k, scale)
            offset, carried = offset + length, stepped
            if not host:
                remaining = remaining - length
        reads.add(offset - carried, carried)  # a step on the last token: its query reads the state after it
        if self._pages is not None:
            if isinstance(reads, SegmentReads):
                reads.flush()  # a waiting read may hold the pages themselves: read before they change
            sync(self, self._pushed if self._ring_only else None)

    def _write_block(
        self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, length: int | torch.Tensor, q: torch.Tensor | None, active: torch.Tensor | None = None
    ) -> None:
        """Take in a block of tokens, the one write of prefill and decode alike: sinks take the
        positions below their capacity, the window the rest (one token per row past the sinks
        goes into its ring slot in place), each row's count advances by ``length``, and the
        query statistics (if any) see the block's queries.

        Args:
            k, v: ``[B, Hs, L, D]``; pos: ``[B, L]`` int64 positions, ``-1`` for entries that are
                not tokens (padding).
            length: tokens per row, an int when every row takes ``L``, else ``[B]``.
            q: ``[B, H, L, D]`` the block's queries (for the statistics), or ``None``.
            active: ``[B, L]`` bool real entries, ``None`` when all are.
        """
        lo, hi = self._host_seen_range()
        past_sinks = lo >= self.sinks.capacity  # every row is past its sinks: none takes a token
        if past_sinks and k.shape[2] == 1 and active is None and hasattr(self.window, "push"):
            # Decode: rows in step write one ring slot known on the host, the others their own.
            self.window.push(k, v, pos, lo % self.window.capacity if lo == hi else self._seen)
            self._pushed = pos[:, 0]  # (two pushes in one call have a step between them: whole rows sync)
        elif past_sinks:
            self.window.append(k, v, pos)
            self._ring_only = False
        else:
            taken = self.sinks.write(k, v, pos)
            self.window.append(k, v, torch.where(taken, -1, pos))
            self._ring_only = False
        self._advance(length)
        if self.queries is not None and q is not None:
            self._ring_only = False
            self.queries.update(q, active if active is not None else torch.ones(pos.shape, dtype=torch.bool, device=pos.device))

    def _step(self, stepping: torch.Tensor, feature_map_k: FeatureFn, scale: float) -> None:
        """Select-and-evict for the rows in ``stepping [B]``, the survivors' rest folded into the
        linear state: the one step of prefill and decode alike."""
        self._ring_only = False
        fk, v, mask, pos = self._select(stepping, feature_map_k, scale)
        if getattr(self.linear, "decay", 1.0) != 1.0:  # a decaying state weighs tokens by their age at the step
            age = (self.seen - 1)[:, None, None] - pos
            self.linear.write(fk, v, mask, age=age, rows=stepping, elapsed=self.schedule.period)
        else:
            self.linear.write(fk, v, mask)

    def _exact_slots(self) -> KVBlock:
        """Every exact slot, ``[sinks | sparse | window]``, as one block: the slot buffer itself
        (no copy) when it holds them all; with a custom store of its own, the stores' blocks
        concatenated (a copy per call)."""
        if self._whole:
            return self.slots.whole
        return KVBlock.cat([m.block for m in self.exact_memories if m.capacity])

    def _snapshot_exact(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The exact slots as they are now, ``(k, v, pos)`` per block, for a read deferred past
        later writes: the buffer's next write copies instead of overwriting them
        (:meth:`_release_snapshots` when the deferred reads are done)."""
        if self._whole:
            w = self.slots.snapshot()
            return [(w.k, w.v, w.pos)]
        if self.slots.allocated:
            self.slots.snapshot()
        return [(m.block.k, m.block.v, m.block.pos) for m in self.exact_memories if m.capacity]

    def _release_snapshots(self) -> None:
        """No deferred read holds the slots or the linear state any more: writes go in place again."""
        self.slots.shared = False
        if getattr(self.linear, "snapshots", False):
            self.linear.shared = False

    def _allocate_slots_for(self, state: dict[str, torch.Tensor]) -> None:
        """A fresh slot buffer of the geometry ``state`` holds (rows from ``seen``; heads, ``D``,
        dtype and device from a stored memory's keys; attention tallies if it has them), for
        the stores to load into."""
        for m in self.exact_memories:
            k = state.get(f"{m.name}.k")
            if not _binds(m) or not isinstance(k, torch.Tensor) or k.dim() != 4:
                continue
            ragged = isinstance(m, SparseCache) and m.head_sizes is not None
            heads = len(m.head_sizes) if ragged else k.shape[1]
            track = any(key.endswith(".acc") for key in state)
            self.slots.allocate(state["seen"].shape[0], heads, k.shape[3], k.dtype, k.device, track)
            return
        self.slots.reset()

    def _rows_in_step(self) -> bool:
        """Whether every row has seen the same number of tokens (known on the host)."""
        lo, hi = self._host_seen_range()
        return lo == hi

    def _host_seen(self) -> list[int]:
        """Each row's count on the host: read from the device once after a change the host
        cannot follow (a padded segment, a loaded or reordered state), then kept by :meth:`_advance`."""
        if self._seen_host is None:
            self._seen_host = self._seen.tolist()
        return self._seen_host

    def _host_seen_range(self) -> tuple[int, int]:
        seen = self._host_seen()
        return (min(seen), max(seen)) if seen else (0, 0)

    def _host_due(self) -> list[int]:
        """Each row's tokens until its next step (1: the step falls on its next token), asked of
        the schedule on host copies of the counts, so no device value is read."""
        if self._due is None:
            until = self._ask_schedule(torch.tensor(self._host_seen(), dtype=torch.long)).tolist()
            self._check_until(min(until, default=1), max(until, default=1))
            self._due = until
        return self._due

    def _advance(self, n: int | torch.Tensor) -> None:
        """``seen += n``: an int for every row (the host copy follows, and the countdown to the
        next step is the caller's), or a ``[B]`` tensor (the host copies are then unknown)."""
        host = self._seen_host
        self.seen = self._seen + n
        if isinstance(n, int) and host is not None:
            self._seen_host = [x + n for x in host]

    def _ask_schedule(self, seen: torch.Tensor) -> torch.Tensor:
        """The schedule's ``tokens_until_step(seen)``, the one way the composer asks it: a
        plug-in's failure, or an answer that is not an integer tensor shaped and placed like
        ``seen``, is an error naming the schedule. Only metadata is read here (no device sync);
        the values are checked by :meth:`_check_until` with the read the caller already makes."""
        try:
            until = self.schedule.tokens_until_step(seen)
        except (MemoryError, torch.OutOfMemoryError):  # not the schedule's fault: kept as it is
            raise
        except Exception as err:
            raise RuntimeError(f"schedule {self.schedule!r} failed in tokens_until_step(): {type(err).__name__}: {err}") from err
        expected = f"an integer tensor [B] = {tuple(seen.shape)} on {seen.device}"
        if not isinstance(until, torch.Tensor):
            raise TypeError(f"schedule {self.schedule!r} returned {type(until).__name__} {until!r} from tokens_until_step(), expected {expected}")
        if until.dtype == torch.bool or until.is_floating_point() or until.is_complex():
            raise TypeError(f"schedule {self.schedule!r} returned {until.dtype} from tokens_until_step(), expected {expected} (a whole number of tokens)")
        if until.shape != seen.shape:
            raise ValueError(f"schedule {self.schedule!r} returned shape {tuple(until.shape)} from tokens_until_step(), expected {expected}")
        if until.device != seen.device:
            raise ValueError(f"schedule {self.schedule!r} returned a tensor on {until.device} from tokens_until_step(), expected {expected}")
        return until

    def _check_until(self, lo: int, hi: int) -> None:
        """Refuse a schedule whose answers (``lo..hi`` over the rows) leave ``1..period``: with 0
        no block would ever end, beyond the period the window would overflow. Every path that
        asks the schedule checks here."""
        period = self.schedule.period
        if lo < 1 or hi > period:
            bad = lo if lo < 1 else hi
            raise ValueError(f"schedule {self.schedule!r} returned {bad} tokens until its step, expected 1..{period} (its period)")

    def _read_exact(self, query: QueryBlock, keep_logits: bool) -> tuple[SoftmaxPartial, list[SoftmaxPartial]]:
        """The merged softmax partial of ``query`` over the exact memories (and, when
        ``keep_logits``, each memory's partial with its logits)."""
        mems = self.exact_memories
        if not keep_logits and all(m.reads_block for m in mems):
            # Stock slot stores: one kernel call over their concatenated slots (the merge of the
            # per-memory partials, computed at once).
            from lola.kernels import softmax_partial

            block = self._exact_slots()
            return SoftmaxPartial(*softmax_partial(query.q, block.k, block.v, query.pos, block.pos, query.scale, check=False)), []
        parts = [m.read(query, keep_logits) for m in mems]
        return merge_softmax_partials(parts), parts

    def _observe(self, parts: list[SoftmaxPartial], exact: SoftmaxPartial, counted: torch.Tensor) -> None:
        """Add each slot's softmax weight (normalised over the query's exact set) to its tally."""
        self._ring_only = False
        m = torch.where(torch.isfinite(exact.max), exact.max, 0.0).unsqueeze(-1)
        den = exact.den.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
        for mem, part in zip(self.exact_memories, parts):
            if mem.capacity == 0:
                continue
            w = torch.exp(part.logits - m) / den  # [B, H, L, N]
            w = (w * counted[:, None, :, None]).sum(dim=2)  # [B, H, N]
            hs = mem.block.k.shape[1]
            mem.observe_attention(w.unflatten(1, (hs, -1)).sum(dim=2))

    def _select(self, rows: torch.Tensor, feature_map_k: FeatureFn, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Select-and-evict for ``rows [B]``: window overflow + sparse cache → top-λ stay exact.

        Returns:
            The tokens to fold into the linear state, per query head: ``φ(k) [B, H, M, F]``,
            ``v [B, H, M, D]``, ``mask [B, H, M]`` and positions ``[B, H, M]`` (the linear state
            is not touched here: scoring reads it as it is before the step).
        """
        leaving = self.window.pop_oldest(rows)
        candidates = KVBlock.cat([leaving, self.sparse.block])
        ctx = ScoringContext(self.linear, feature_map_k, self.num_heads, self.seen - 1, scale=scale, layer=self.layer, queries=self.queries, fresh=leaving.size)
        scores = self._score(candidates, ctx) if self.sparse.capacity > 0 else torch.zeros_like(candidates.pos, dtype=torch.float32)
        _check_scores(scores, candidates.valid, self.policy)
        if getattr(self.policy, "keeps_scores", False) and self.sparse.capacity > 0:
            # The cached tokens carry the kept scores to the next step, in the slots' tallies.
            candidates = KVBlock(candidates.k, candidates.v, candidates.pos, self._kept(ctx, candidates))
        evicted = _compact(self.sparse.select(candidates, scores, rows))
        g = ctx.group(evicted)
        return ctx.key_features(evicted), ctx.expand_heads(evicted.v, g), ctx.expand_heads(evicted.valid, g), ctx.expand_heads(evicted.pos, g)

    def _kept(self, ctx: ScoringContext, candidates: KVBlock) -> torch.Tensor:
        """The ``[B, Hs, N]`` scores a ``keeps_scores`` policy set in ``ctx.kept``, finite (a state
        holds finite tallies; an infinite score keeps its place at the float32 limit)."""
        from lola.policies.registry import describe

        kept = ctx.kept
        if not isinstance(kept, torch.Tensor) or kept.shape != candidates.pos.shape:
            got = tuple(kept.shape) if isinstance(kept, torch.Tensor) else type(kept).__name__
            raise RuntimeError(
                f"policy {describe(self.policy)} keeps scores but set ctx.kept to {got}, expected a tensor [B, Hs, N] = {tuple(candidates.pos.shape)}"
            )
        big = torch.finfo(torch.float32).max
        return kept.float().clamp(-big, big)

    def _score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        """The policy's scores of ``candidates``; a plug-in's failure, or an answer that is not a
        ``[B, Hs, N]`` tensor, is an error naming the policy (once per select step)."""
        from lola.policies.registry import describe

        try:
            scores = self.policy.score(candidates, ctx)
        except (MemoryError, torch.OutOfMemoryError):  # not the policy's fault: kept as it is
            raise
        except Exception as err:
            raise RuntimeError(f"policy {describe(self.policy)} failed in score(): {type(err).__name__}: {err}") from err
        if not isinstance(scores, torch.Tensor):
            raise TypeError(
                f"policy {describe(self.policy)} returned a {type(scores).__name__} from score(), expected a tensor [B, Hs, N] = {tuple(candidates.pos.shape)}"
            )
        if scores.is_complex() or scores.dtype == torch.bool:
            raise TypeError(f"policy {describe(self.policy)} returned {scores.dtype} scores from score(), expected real numbers (higher = keep exact)")
        if scores.shape != candidates.pos.shape:
            raise ValueError(f"policy {describe(self.policy)} returned scores of shape {tuple(scores.shape)}, expected {tuple(candidates.pos.shape)}")
        if scores.device != candidates.pos.device:
            raise ValueError(
                f"policy {describe(self.policy)} returned scores on {scores.device}, expected them on the candidates' device {candidates.pos.device}"
            )
        return scores

    def __repr__(self) -> str:
        return (
            f"LoLAMemory(sinks={self.sinks!r}, window={self.window!r}, sparse={self.sparse!r}, "
            f"policy={self.policy!r}, schedule={self.schedule!r}, storage={self.storage!r}"
            + (f", queries={self.queries!r}" if self.queries is not None else "")
            + ")"
        )


def _binds(memory: object) -> bool:
    """Whether ``memory`` keeps its slots in its composer's buffer (a stock store, or a subclass
    that reads and writes them only through ``block``)."""
    return isinstance(memory, ExactStore) and memory.binds


def _describe(part: object) -> str:
    """``repr(part)``, or its class and capacity when the class keeps object's default repr
    (which names a memory address and would make every fresh state look different)."""
    if type(part).__repr__ is object.__repr__:
        return f"{type(part).__module__}.{type(part).__qualname__}(capacity={getattr(part, 'capacity', None)})"
    return repr(part)


def _compact(block: KVBlock) -> KVBlock:
    """On a host device, ``block``'s tokens moved to the front of its slots, ``[B, Hs, E]`` with
    ``E`` the most any (row, head) holds: a step evicts about as many tokens as left the window,
    out of the window's and the whole cache's slots, so the features and the fold cost ``E``
    slots, not all of them. On an accelerator the block as it is (``E`` would be read back)."""
    valid = block.valid
    if not reads_back(valid.device) or valid.numel() == 0:
        return block
    e = int(valid.sum(-1).amax())
    if e == valid.shape[-1]:
        return block
    return block.gather(torch.argsort((~valid).to(torch.uint8), dim=-1, stable=True)[..., :e])


def _check_scores(scores: torch.Tensor, valid: torch.Tensor, policy: object) -> None:
    """Refuse NaN scores of real candidates: a top-k over NaN keeps tokens in slot order, a
    silent change of policy. Once per select step (not per token under the chunkwise schedule);
    on accelerators an asynchronous assert, so the step does not wait for the device."""
    from lola.policies.registry import describe

    bad = torch.isnan(scores) & valid
    if not require(~bad.any(), f"policy {describe(policy)} returned NaN scores"):
        raise ValueError(f"policy {describe(policy)} returned NaN scores for {int(bad.sum())} candidates")


def _layout_of(state: dict[str, torch.Tensor], linear: str, window: str) -> StateLayout | None:
    """The geometry a state claims: heads, ``F`` and ``D`` from its linear ``H [B, H, F, D]``,
    storage heads from its window's ``k [B, Hs, N, D]`` (``None`` if it lacks either)."""
    H, k = state.get(f"{linear}.H"), state.get(f"{window}.k")
    if not (isinstance(H, torch.Tensor) and H.dim() == 4 and isinstance(k, torch.Tensor) and k.dim() == 4):
        return None
    return StateLayout(num_heads=H.shape[1], storage_heads=k.shape[1], head_dim=H.shape[3], feature_dim=H.shape[2])


def _check_layout(state: dict[str, torch.Tensor], memory: LoLAMemory) -> None:
    """``state`` against what ``memory`` holds (:meth:`LoLAMemory.reference_state`): the same
    keys, dtypes, and shapes but the batch."""
    found = memory.reference_state(state)
    if found is None:
        return
    reference, follow = found
    unknown = sorted(set(state) - set(reference))
    if unknown:
        raise ValueError(f"state holds unknown tensors {unknown}: this layer's memories hold {sorted(reference)}")
    missing = sorted(set(reference) - set(state))
    if missing:
        why = ""
        if all(k.endswith(".acc") for k in missing):
            from lola.policies.registry import describe

            kept = getattr(memory.policy, "keeps_scores", False)
            held = "the score it keeps" if kept else "the attention mass it scores by"
            why = f" ({held} per slot, for policy {describe(memory.policy)})"
        owners = {m.name: type(m).__name__ for m in memory._stateful()}
        by_part: dict[str, list[str]] = {}
        for key in missing:
            by_part.setdefault(owners.get(key.split(".", 1)[0], "LoLAMemory"), []).append(key)
        held = "; ".join(f"{part} state must hold {keys}" for part, keys in by_part.items())
        raise ValueError(f"{held}{why}: the state lacks them (was it saved by a layer of another configuration?)")
    # Keys and values share one float dtype, the memory's once allocated; when the state
    # disagrees with itself the odd ones out are named.
    dtype = None
    if follow:
        counts = Counter(state[k].dtype for k in reference if k in follow)
        dtype = counts.most_common(1)[0][0]
        if not dtype.is_floating_point:
            raise ValueError(f"state[{sorted(follow)[0]!r}] must hold floats (keys and values), got {dtype}")
    for key, ref in reference.items():
        t, want = state[key], dtype if key in follow else ref.dtype
        if t.dtype != want:
            kind = "floats" if want.is_floating_point else "integers"
            like = " like the state's other keys and values" if key in follow else ""
            raise ValueError(f"state[{key!r}] must be {want} {kind}{like}, got {t.dtype}")
    batch = state["seen"].shape[0]
    for key, ref in reference.items():
        t = state[key]
        if t.dim() != ref.dim() or t.shape[1:] != ref.shape[1:]:
            raise ValueError(f"state[{key!r}] has shape {tuple(t.shape)}, this layer's is [B, {', '.join(map(str, ref.shape[1:]))}]")
        if t.shape[0] != batch:
            raise ValueError(f"state[{key!r}] holds {t.shape[0]} rows, 'seen' {batch}")


def check_state(state: dict[str, torch.Tensor], memory: LoLAMemory | None = None) -> None:
    """Refuse a state dict no run (of ``memory``, when given) could have written; the one check of
    every state that comes from outside (:meth:`LoLAMemory.load_state_dict`, ``LoLACache.load``).

    Always: every value a tensor, ``seen`` a ``[B]`` int64 count ``>= 0``, finite floats,
    the slots' attention tallies (``.acc``, unless ``memory``'s policy keeps scores there) ``>= 0``, and positions ``[B, Hs, N]`` int64 below their row's
    ``seen``, no position held by two exact slots of a row and storage head. Against
    ``memory`` (see :meth:`LoLAMemory.reference_state`): the same keys (an unknown one is
    refused, a missing one named), the same dtypes (positions int64, keys and values one float
    dtype, the memory's once allocated), the same shapes but the batch (one for all), the
    normaliser ``linear.s >= 0`` when the layer's feature map is non-negative, and the query
    statistics' weight ``queries.n >= 0``.

    Raises:
        ValueError: naming the tensor and what is wrong.
    """
    for key, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"state[{key!r}] must be a tensor, got {type(t).__name__}")
    seen = state["seen"]
    if seen.dtype != torch.int64 or seen.dim() != 1:
        raise ValueError(f"state['seen'] must be a 1-D torch.int64 tensor, got {seen.dtype} {tuple(seen.shape)}")
    # One device for the whole state: the memory's once allocated, else the one 'seen' is on;
    # never `meta` (shapes without data).
    device = memory.seen.device if memory is not None and memory.allocated else seen.device
    where = "this memory's" if memory is not None and memory.allocated else "state['seen']'s"
    for key, t in state.items():
        if t.device.type == "meta":
            raise ValueError(f"state[{key!r}] lies on the meta device: it holds no values")
        if t.device != device:
            raise ValueError(f"state[{key!r}] lies on {t.device}, but {where} device is {device}: a state lies on one device")
    if memory is not None:
        _check_layout(state, memory)
    for key, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"state[{key!r}] holds non-finite values (inf or NaN)")
    if bool((seen < 0).any()):
        raise ValueError("state['seen'] holds negative counts")
    # Sums of non-negative terms: attention weights, the statistics' decay weights, and the
    # features of a non-negative map (a negative normaliser flips the linear read's sign).
    # Kept scores (a `keeps_scores` policy) may be negative; attention tallies may not.
    scores_kept = memory is not None and bool(getattr(memory.policy, "keeps_scores", False))
    sums = {} if scores_kept else {k: "attention weights" for k in state if k.endswith(".acc")}
    if memory is not None and memory.queries is not None:
        sums[f"{memory.queries.name}.n"] = "query weights"
    if memory is not None and isinstance(memory.linear, LinearState) and memory.layout is not None and memory.layout.non_negative:
        sums[f"{memory.linear.name}.s"] = "the features of a non-negative feature map"
    for key, what in sums.items():
        if key in state and bool((state[key] < 0).any()):
            raise ValueError(f"state[{key!r}] holds negative values, but it sums {what}: no run could have written it")
    positions = [(k, t) for k, t in state.items() if k.endswith(".pos")]
    if not positions:
        return
    for key, pos in positions:
        if pos.dtype != torch.int64 or pos.dim() != 3 or pos.shape[0] != seen.shape[0]:
            raise ValueError(f"state[{key!r}] must be [batch {seen.shape[0]}, heads, slots] torch.int64 integers, got {pos.dtype} {tuple(pos.shape)}")
        if bool((pos >= seen.view(-1, 1, 1)).any()):
            raise ValueError(f"state[{key!r}] holds a position at or beyond its row's 'seen' count")
    if memory is not None and isinstance(memory.window, SlidingWindow):
        _check_window(state, seen, memory)
    # Memories with the same storage heads are compared together (per-head sparse sizes may
    # store a memory per query head while the others store per K/V head).
    by_heads: dict[int, list[tuple[str, torch.Tensor]]] = {}
    for key, pos in positions:
        by_heads.setdefault(pos.shape[1], []).append((key, pos))
    for group in by_heads.values():
        every = torch.cat([pos for _, pos in group], dim=2)  # [B, Hs, all slots], -1 = empty
        ordered = every.sort(dim=2).values
        repeated = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
        if bool(repeated.any()):
            raise ValueError(f"a position is held twice in one row and storage head ({', '.join(k for k, _ in group)}): the state is damaged")


def _check_window(state: dict[str, torch.Tensor], seen: torch.Tensor, memory: LoLAMemory) -> None:
    """A :class:`~lola.memory.SlidingWindow` holds its row's newest tokens: per row and storage
    head, ``n`` consecutive positions ending at ``seen - 1`` (none while the row fills its
    sinks), and at least ``min(size, seen - sinks)`` of them (a step keeps the newest ``size``)."""
    window = memory.window
    key = f"{window.name}.pos"
    pos = state.get(key)
    if pos is None or pos.shape[-1] == 0:
        return
    valid = pos >= 0
    n = valid.sum(-1)  # [B, Hs]
    newest = pos.amax(-1)
    oldest = torch.where(valid, pos, torch.iinfo(torch.int64).max).amin(-1)
    last = seen.view(-1, 1) - 1
    sizes = window.head_sizes if window.head_sizes and len(window.head_sizes) == pos.shape[1] else [window.size] * pos.shape[1]
    size = torch.tensor(sizes, dtype=torch.int64, device=pos.device).view(1, -1)
    least = torch.minimum(size, (seen.view(-1, 1) - memory.sinks.capacity).clamp_min(0))
    bad = ((n > 0) & ((newest != last) | (newest - oldest != n - 1))) | (n < least)
    if bool(bad.any()):
        row, head = (int(i) for i in bad.nonzero()[0])
        held = sorted(int(p) for p in pos[row, head] if p >= 0)
        span = f"positions {held[0]}..{held[-1]} ({len(held)} held)" if held else "no position"
        raise ValueError(
            f"state[{key!r}] row {row} storage head {head} holds {span}, but a sliding window holds its row's newest tokens: "
            f"at least {int(least[row, head])} consecutive positions ending at seen - 1 = {int(seen[row]) - 1}"
        )
