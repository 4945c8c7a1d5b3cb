"""LoLAMemory: one layer's memories, its scoring policy and its schedule, composed.

The life of a token (positions count real tokens of a row):

1. It is written to the sinks (if its position is below ``sinks``) or to the window.
2. If a schedule step falls on it, the step runs now: window tokens beyond the newest ``η``
   and the current sparse cache are scored by the policy against the current linear state;
   the top ``λ`` stay in the sparse cache, the rest are folded into ``H, s``.
3. Its query reads every memory: softmax over sinks ∪ sparse ∪ window (causal by position)
   and the linear state; the partials go back to the caller, which mixes them.

The state is :class:`lola.engine.state.LayerState`; the steps are functions over it, one file
each: the block loop (:mod:`lola.engine.block_loop`), select-and-evict
(:mod:`lola.engine.select_step`), the reads (:mod:`lola.engine.segment_reads`) and external
pages (:mod:`lola.engine.state_pages`). This module is the glue a layer calls.
"""

from __future__ import annotations

from typing import Mapping

import torch

from lola.core.partials import LinearPartial, SoftmaxPartial
from lola.engine.block_loop import run_blocks
from lola.engine.decode_read import DecodeRead
from lola.engine.segment_reads import SegmentReads, gather_tokens
from lola.engine.select_step import FeatureFn
from lola.engine.state import WORKING_COPIES, LayerState, PageBinding
from lola.engine.state_checks import StateLayout, check_state
from lola.engine.state_pages import bind, page_layout

__all__ = ["WORKING_COPIES", "LoLAMemory", "StateLayout", "check_state"]


class LoLAMemory(LayerState):
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
        gqa_storage: ``"kv_head"`` or ``"query_head"``, as :class:`lola.LoLAConfig`'s
            ``gqa_storage`` (``storage``, its old name, still works with a warning).
        queries: running statistics of the layer's queries for the policy's
            :class:`~lola.policies.ScoringContext`; built automatically (with the policy's
            ``query_half_life``, default 64) when the policy sets ``needs_queries = True``.
        layer: the layer's index in its model (given to the policy), or ``None``; a layer
            refuses a state of another index.
        head_offset: ``None`` (the layer computes all its heads), or for a share of the heads
            (``compose(heads=…)``) the index of its first storage head in the model's layer
            (given to the policy).

    Attributes:
        layout: the :class:`StateLayout` the owning layer declared (``None`` for a memory no
            layer has taken yet): what a loaded state is checked against.
        owner: a weak reference to the :class:`lola.LoLAAttention` that took this state (its
            linear state sums that layer's features, so no other layer may read it), or ``None``.
    """

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
        if self.binding is not None:
            self.reset()

    @property
    def bound_pages(self) -> PageBinding | None:
        """The external buffers this state lives in (``None``: its own storage)."""
        return self.binding

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
        host = not packed and (t == 1 or self.counts.in_step())
        order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True) if packed else None
        qp, fqp, kp, vp = (None if x is None else gather_tokens(x, order) for x in (q, fq, k, v)) if packed else (q, fq, k, v)

        track = bool(getattr(self.policy, "needs_attention", False))
        reads = SegmentReads(self, qp, fqp, self.seen, scale, uniform=host, track=track)
        run_blocks(self, qp, kp, vp, valid, scale, feature_map_k, reads, host)
        exact, linear = reads.result()
        if not packed:
            return exact, linear
        # Unpack to the caller's token order (padding keeps the empty partial).
        inverse = torch.argsort(order, dim=1)
        exact = SoftmaxPartial(*(gather_tokens(x, inverse) for x in (exact.num, exact.den, exact.max)))
        linear = LinearPartial(*(gather_tokens(x, inverse) for x in (linear.num, linear.den)))
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
        share_cap: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One new token per row (no padding): the block loop's one-token case (the loop of
        :meth:`attend`: write it, run the step if it falls on it), read and mixed with one
        :func:`lola.kernels.decode_step` call (:class:`~lola.engine.decode_read.DecodeRead`).

        Equals :meth:`attend` on the same token followed by :func:`lola.core.mix` (tested).

        Args:
            q: ``[B, H, 1, D]``; fq: ``[B, H, 1, F]`` (``None`` with ``softmax_only``);
            k, v: ``[B, Hs, 1, D]``.
            scale: softmax scale; feature_map_k: ``φ`` for keys.
            gate: ``[H]`` softmax weight per head; mixing: a :data:`lola.core.mixing.MIXING_RULES` name.
            share_cap: ``[B]`` the linear state's largest share per row (``1``: none), or ``None``.

        Returns:
            ``[B, H, D]`` float32 outputs.
        """
        self._require_allocated()
        if not self.decodes_fused:
            raise RuntimeError(f"{self!r} cannot use the fused decode step (custom exact memories or attention-scored policy): use attend()")
        reads = DecodeRead(self, q, fq, scale, gate, mixing, share_cap)
        run_blocks(self, q, k, v, None, scale, feature_map_k, reads, host=True)
        return reads.result()
