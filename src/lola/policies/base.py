"""The scoring-policy interface and what a policy may look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch

from lola.memory.base import KVBlock
from lola.memory.linear_state import LinearState
from lola.memory.query_stats import QueryStatistics

__all__ = ["ScoringContext", "ScoringPolicy", "check_keeping", "keeps_tallies", "score_leaving"]


@dataclass
class ScoringContext:
    """What a policy can read when it scores candidates at a select-and-evict step.

    Attributes:
        linear: the layer's :class:`~lola.memory.LinearState` *before* this step's evictions;
            its tensors are also :attr:`H` and :attr:`s`.
        feature_map_k: the layer's key feature map, ``[B, H, N, D] -> [B, H, N, F]``.
        num_heads: ``H``, query heads.
        step: ``[B]`` int64 position of the token at which each row's step runs.
        scale: the softmax scale of the layer's logits.
        layer: the layer's index in its model (``None`` for a standalone layer).
        queries: running statistics of the layer's recent queries (mean, covariance per query
            head), present when the policy sets ``needs_queries = True``; else ``None``.
        head_offset: ``None`` when the layer computes all its heads; for a share of the heads (a
            tensor-parallel rank, built by :func:`lola.compose` with ``heads=``), the index in the
            model's layer of its first storage head. A policy that depends on which head it
            scores (the learned scorer's per-head weights, a seed per head) adds it to its index.
        fresh: in a select-and-evict step, how many candidates lead the block: slots ``[..., :fresh]``
            hold the tokens leaving the window at this step (empty where a row or head has fewer),
            the others the sparse cache's; ``None`` outside a step.
        key_positions: ``None``, or ``(k [B, Hs, N, D], pos [B, Hs, N]) -> k`` the keys as the
            feature maps see them (bounded positions: :class:`lola.core.positions.BoundedPositions`);
            :meth:`key_features` applies it, so a policy that needs ``φ(k)`` asks for it there.
        exact_positions: ``None``, or ``(k [B, Hs, N, D], pos [B, Hs, N]) -> k`` the keys as the
            exact reads after this step see them (bounded positions re-rotate far keys);
            :meth:`exact_keys` applies it, so a policy that predicts attention from keys asks
            for them there.
        kept: ``[B, Hs, N]`` float32, set during :meth:`ScoringPolicy.score` by the part of a
            policy that keeps scores (``keeps_scores``): what the composer stores in the slots'
            tallies for the next step (``candidates.acc`` then).
    """

    linear: LinearState
    feature_map_k: Callable[[torch.Tensor], torch.Tensor]
    num_heads: int
    step: torch.Tensor
    scale: float = 1.0
    layer: int | None = None
    queries: QueryStatistics | None = None
    fresh: int | None = None
    head_offset: int | None = None
    key_positions: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    exact_positions: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kept: torch.Tensor | None = field(default=None, init=False)
    _features: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def H(self) -> torch.Tensor:
        """``[B, H, F, D]`` float32 ``Σ φ(k) vᵀ`` over the tokens in the linear state."""
        return self.linear.state[0]

    @property
    def s(self) -> torch.Tensor:
        """``[B, H, F]`` float32 ``Σ φ(k)`` over the tokens in the linear state."""
        return self.linear.state[1]

    def group(self, block: KVBlock) -> int:
        """Query heads per storage head of ``block``."""
        return self.num_heads // block.k.shape[1]

    def expand_heads(self, x: torch.Tensor, group: int) -> torch.Tensor:
        """``[B, Hs, ...] -> [B, H, ...]``: each storage head serves ``group`` query heads."""
        return x if group == 1 else x.repeat_interleave(group, dim=1)

    def reduce_heads(self, x: torch.Tensor, group: int, how: str = "mean") -> torch.Tensor:
        """``[B, H, N] -> [B, Hs, N]``: ``"mean"`` or ``"max"`` over the query heads sharing a storage head."""
        if how not in ("mean", "max"):
            raise ValueError(f"how must be 'mean' or 'max', got {how!r}")
        if group == 1:
            return x
        x = x.unflatten(1, (-1, group))
        return x.mean(dim=2) if how == "mean" else x.amax(dim=2)

    def exact_keys(self, block: KVBlock) -> torch.Tensor:
        """``[B, Hs, N, D]``: the block's keys at the positions the exact reads after this step
        give them (the keys themselves under absolute positions)."""
        return block.k if self.exact_positions is None else self.exact_positions(block.k, block.pos)

    def key_features(self, block: KVBlock, index: torch.Tensor | None = None) -> torch.Tensor:
        """``φ(k)`` of the block's keys for every query head, ``[B, H, N, F]`` float32; with
        ``index [B, Hs, M]`` (int64 slots of the block), those slots' only, ``[B, H, M, F]``.

        Computed once per key tensor within a step: the policy scores the candidates, the
        composer folds the evicted ones (the same keys, some of their slots), and the features
        of a token depend on that token alone.
        """
        memo = self._features
        if memo is not None and memo[0] is block.k:
            fk = memo[1]
            if index is None:
                return fk
            at = self.expand_heads(index, self.group(block))
            return fk.gather(2, at.unsqueeze(-1).expand(*at.shape, fk.shape[-1]))
        if index is not None:
            block = block.gather(index)
        g = self.group(block)
        k = block.k if self.key_positions is None else self.key_positions(block.k, block.pos)  # per stored head: a rotation per token
        fk = self.feature_map_k(self.expand_heads(k, g))
        self._features = (block.k, fk)
        return fk


@runtime_checkable
class ScoringPolicy(Protocol):
    """Decides which candidates stay exact in the sparse cache.

    ``score`` returns ``[B, Hs, N]`` with **higher = keep exact**; the composer keeps the
    top-``λ`` valid candidates and folds the rest into the linear state. Scores of empty slots
    are ignored. Set ``needs_attention = True`` to have the composer track the attention mass
    each exact token receives (``candidates.acc``), and ``needs_queries = True`` (optionally
    with ``query_half_life``) to get running query statistics in ``ctx.queries``. A policy that
    sets ``keeps_scores = True`` (one of its parts, :class:`~lola.policies.ScoredAtExit`, sets
    ``ctx.kept`` while scoring) has the composer keep those values in the slots' tallies, and
    read them back as ``candidates.acc`` at the next step. A policy whose score of one storage
    head reads another head's candidates sets ``couples_heads = True``: a layer split by heads
    (:func:`lola.compose` with ``heads=``, a tensor-parallel rank) refuses it, since a share
    sees only its own heads (a score of each head's own candidates, with the head's index from
    ``ctx.head_offset``, splits exactly).
    """

    needs_attention: bool

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        """Score ``candidates`` (``k, v [B, Hs, N, D]``, ``pos [B, Hs, N]``): ``[B, Hs, N]``."""
        ...


def keeps_tallies(policy: object) -> bool:
    """Whether the exact slots carry a float32 tally for ``policy``: the attention mass each
    received (``needs_attention``) or a score kept for it (``keeps_scores``)."""
    return bool(getattr(policy, "needs_attention", False) or getattr(policy, "keeps_scores", False))


def score_leaving(candidates: KVBlock, ctx: ScoringContext, score: Callable[[KVBlock], torch.Tensor], who: str) -> torch.Tensor:
    """Scores of ``candidates [B, Hs, N]`` where only the tokens leaving the window at this step
    (``candidates[..., :ctx.fresh]``) are scored, by ``score(block) -> [B, Hs, M]``, and the
    sparse cache's are the scores kept for them (``candidates.acc``); the result is also set as
    ``ctx.kept``, for the composer to keep. The one way a ``keeps_scores`` policy scores.

    Raises:
        RuntimeError: outside a select-and-evict step (no ``ctx.fresh`` or no kept scores), or
            when another part of the policy kept scores at this step already.
        ValueError: ``score`` returned another shape (named by ``who``).
    """
    m = check_keeping(candidates, ctx, who)
    leaving = KVBlock(candidates.k[..., :m, :], candidates.v[..., :m, :], candidates.pos[..., :m], candidates.acc[..., :m])
    fresh = score(leaving)
    if not isinstance(fresh, torch.Tensor) or fresh.shape != leaving.pos.shape:
        got = tuple(fresh.shape) if isinstance(fresh, torch.Tensor) else type(fresh).__name__
        raise ValueError(f"{who} returned {got} for the {m} tokens leaving the window, expected {tuple(leaving.pos.shape)}")
    ctx.kept = torch.cat([fresh.float(), candidates.acc[..., m:]], dim=-1)
    return ctx.kept


def check_keeping(candidates: KVBlock, ctx: ScoringContext, who: str) -> int:
    """``ctx.fresh`` (the candidates leaving the window lead the block), after checking that a
    policy that keeps scores runs in a select-and-evict step with its kept scores
    (``candidates.acc``) and that no other part kept scores at this step.

    Raises:
        RuntimeError: naming ``who``, outside a step or when ``ctx.kept`` is set already.
    """
    if ctx.fresh is None or candidates.acc is None:
        raise RuntimeError(f"{who} keeps scores across steps (candidates.acc) for the tokens that left the window (ctx.fresh): run it in a LoLAMemory")
    if ctx.kept is not None:
        raise RuntimeError("two parts of the policy keep scores (ctx.kept is set already): one part of a policy keeps scores")
    return ctx.fresh
