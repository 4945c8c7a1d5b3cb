"""Policies built from other policies: score fusion, value-norm weighting, span pooling, repeats
folded, scores kept from the window's exit or at their peak.

Each wraps registered policies by name (so the whole combination stays a JSON-able
``LoLAConfig(policy=..., policy_kwargs=...)``) and asks the composer for whatever its parts
need (tracked attention, query statistics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lola.core.checks import reads_back
from lola.memory.base import KVBlock
from lola.policies.base import ScoringContext, ScoringPolicy, check_keeping, score_leaving

__all__ = ["Distinct", "Fusion", "PeakScore", "ScoredAtExit", "SpanPooling", "ValueWeighted", "zscore"]


def _build(name: str, kwargs: dict[str, Any]) -> ScoringPolicy:
    from lola.policies.registry import build

    if not isinstance(name, str):
        raise TypeError(f"policy names must be strings, got {name!r}")
    return build(name, **dict(kwargs))


def zscore(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Standardise ``scores [B, Hs, N]`` over the ``valid`` candidates of each (row, head);
    invalid entries become 0, constant scores become 0."""
    x = torch.where(valid, scores.float(), 0.0)
    count = valid.sum(dim=-1, keepdim=True)
    n = count.clamp_min(1)
    mean = x.sum(dim=-1, keepdim=True) / n
    var = (torch.where(valid, x - mean, 0.0) ** 2).sum(dim=-1, keepdim=True) / n
    z = (x - mean) / var.sqrt().clamp_min(1e-12)
    # Two candidates standardise to ±1 whatever their gap: set exactly, by comparison. Computed,
    # they are ±1 up to rounding, so two parts that disagree would fuse to a tie decided by
    # rounding noise, which differs between a prefill in one call and the same tokens split.
    high = torch.where(valid, x, float("-inf")).amax(dim=-1, keepdim=True)
    low = torch.where(valid, x, float("inf")).amin(dim=-1, keepdim=True)
    pair = torch.where(high == low, 0.0, torch.where(x == high, 1.0, -1.0))
    # (a NaN score stays NaN, for the step's check to refuse: it compares equal to nothing)
    return torch.where(valid, torch.where((count == 2) & ~torch.isnan(x).any(dim=-1, keepdim=True), pair, z), 0.0)


class _Composite:
    """Shared plumbing: the parts' needs, and the half-life of the query statistics."""

    parts: tuple[ScoringPolicy, ...]

    @property
    def needs_attention(self) -> bool:
        return any(getattr(p, "needs_attention", False) for p in self.parts)

    @property
    def keeps_scores(self) -> bool:
        keepers = sum(bool(getattr(p, "keeps_scores", False)) for p in self.parts)
        if keepers > 1:
            raise ValueError(f"{keepers} parts of {self!r} keep scores: one part of a policy keeps scores")
        return keepers == 1

    @property
    def needs_queries(self) -> bool:
        return any(getattr(p, "needs_queries", False) for p in self.parts)

    @property
    def couples_heads(self) -> bool:
        """Whether a head's scores depend on other heads' candidates (no share of the heads can
        be scored alone: :func:`lola.compose` with ``heads=`` refuses it)."""
        return any(getattr(p, "couples_heads", False) for p in self.parts)

    @property
    def query_half_life(self) -> float:
        lives = {float(getattr(p, "query_half_life", 64.0)) for p in self.parts if getattr(p, "needs_queries", False)}
        if len(lives) > 1:
            raise ValueError(f"the parts of {self!r} ask for different query half-lives {sorted(lives)}")
        return lives.pop() if lives else 64.0


@dataclass(frozen=True)
class Fusion(_Composite):
    """``Σ_p w_p · z(score_p)``: z-normalised scores of several policies, weighted.

    Args:
        policies: registered policy names, e.g. ``["sre", "expected_attention"]``.
        weights: one weight per policy (default all 1).
        kwargs: one mapping of keyword arguments per policy (default none).
    """

    policies: list[str] = field(default_factory=lambda: ["sre", "expected_attention"])
    weights: list[float] | None = None
    kwargs: list[dict[str, Any]] | None = None
    parts: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("policies must name at least one policy")
        for name, given in (("weights", self.weights), ("kwargs", self.kwargs)):
            if given is not None and len(given) != len(self.policies):
                raise ValueError(f"{name} must have one entry per policy ({len(self.policies)}), got {len(given)}")
        kwargs = self.kwargs or [{} for _ in self.policies]
        object.__setattr__(self, "parts", tuple(_build(n, k) for n, k in zip(self.policies, kwargs)))
        if self.keeps_scores and self.needs_attention:  # (keeps_scores refuses two keepers)
            raise ValueError(f"policies {self.policies}: a part keeps scores in the slots' tallies where another tallies attention")

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        weights = self.weights or [1.0] * len(self.parts)
        valid = candidates.valid
        return sum(float(w) * zscore(p.score(candidates, ctx), valid) for w, p in zip(weights, self.parts))


@dataclass(frozen=True)
class ValueWeighted(_Composite):
    """``score_p · ‖v_j‖`` (CriticalKV-style): a token whose value is small changes the output
    little wherever it is kept. The inner policy's scores should be non-negative.

    Args:
        policy: a registered policy name.
        policy_kwargs: its keyword arguments.
    """

    policy: str = "sre"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    parts: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", (_build(self.policy, self.policy_kwargs),))

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        return self.parts[0].score(candidates, ctx) * candidates.v.float().norm(dim=-1)


@dataclass(frozen=True)
class SpanPooling(_Composite):
    """Keep spans, not isolated tokens (SnapKV/ChunkKV): a candidate's score becomes the max of
    the inner scores of the candidates within ``radius`` positions of it, so that all tokens
    of a number and its key phrase rise and fall together.

    With ``among="cached"`` a candidate pools over the tokens already in the sparse cache only
    (the candidates after ``ctx.fresh``; none outside a select-and-evict step): a span stays
    while its best token does, but a token leaving the window takes no neighbours in with it.
    Pooling over every candidate lifts each outlier's neighbours too, ``2·radius + 1`` slots
    for one; pooling over the cache alone guards what is held against being folded a token
    at a time (self-recall error of a number's digits falls as its first digit folds:
    docs/results.md, "Self-recall error at 8K: the needle erodes").

    Args:
        policy: a registered policy name.
        policy_kwargs: its keyword arguments.
        radius: positions on each side pooled over (``radius=2`` is a width-5 window).
        across_heads: pool over the candidates of every storage head of the layer, so the
            heads keep the same spans (scores are z-normalised per head first).
        among: ``"candidates"`` (every candidate) or ``"cached"`` (the sparse cache's tokens).
    """

    policy: str = "sre"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    radius: int = 2
    across_heads: bool = False
    among: str = "candidates"
    parts: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.radius < 0:
            raise ValueError(f"radius must be >= 0, got {self.radius}")
        if self.among not in ("candidates", "cached"):
            raise ValueError(f"among must be 'candidates' or 'cached', got {self.among!r}")
        object.__setattr__(self, "parts", (_build(self.policy, self.policy_kwargs),))

    @property
    def couples_heads(self) -> bool:
        return self.across_heads or super().couples_heads

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        inner = self.parts[0].score(candidates, ctx).float()
        valid, pos = candidates.valid, candidates.pos
        b, hs, n = pos.shape
        source = valid
        if self.among == "cached":
            fresh = n if ctx is None or ctx.fresh is None else ctx.fresh
            source = valid & (torch.arange(n, device=valid.device) >= fresh)
        if self.across_heads:
            inner = zscore(inner, valid)
            src_score, src_pos, src_valid = (x.reshape(b, 1, hs * n).expand(b, hs, hs * n) for x in (inner, pos, source))
        else:
            src_score, src_pos, src_valid = inner, pos, source
        near = (pos[..., :, None] - src_pos[..., None, :]).abs() <= self.radius  # [B, Hs, N, M]
        near = near & src_valid[..., None, :]
        pooled = torch.where(near, src_score[..., None, :], float("-inf")).amax(dim=-1)
        if self.among == "cached":  # a candidate is its own source only when every candidate is
            pooled = torch.maximum(pooled, inner)
        return torch.where(valid, pooled, inner)


@dataclass(frozen=True)
class Distinct(_Composite):
    """Fold repeats: a candidate whose value nearly repeats (cosine ``>= threshold``) the value
    of a candidate the inner policy ranks higher is ranked below every candidate that repeats
    nothing (ties go to the older token).

    A score that depends on a token's own key and value (the learned scorer, key norms) gives
    every copy of a repeated phrase the same score, so at length the copies of one
    high-scoring token fill the whole sparse cache and push out a needle they outnumber (at 8K
    on a repetitive haystack most of one head's exact tokens were copies of ``.``:
    docs/results.md, "What the misses at 8K are"). The first ``copies`` copies stay exact; the
    others are folded into the linear state, which holds repeated directions well: that is
    what it is for. A needle of digits repeats some of its own digits, and prose holds digits
    of its own, so more than one copy may need to stay (``copies``).

    Args:
        policy: a registered policy name.
        policy_kwargs: its keyword arguments.
        threshold: cosine similarity of two values above which the lower-ranked is a repeat,
            in ``(0, 1]``.
        copies: how many higher-ranked near-copies make a candidate a repeat (``1``: any).
    """

    policy: str = "sre"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    threshold: float = 0.95
    copies: int = 1
    parts: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool) or not 0.0 < float(self.threshold) <= 1.0:
            raise ValueError(f"threshold must be a number in (0, 1], got {self.threshold!r}")
        if not isinstance(self.copies, int) or isinstance(self.copies, bool) or self.copies < 1:
            raise ValueError(f"copies must be an integer >= 1, got {self.copies!r}")
        object.__setattr__(self, "parts", (_build(self.policy, self.policy_kwargs),))

    def check_candidates(self, candidates: int) -> None:
        """Refuse ``copies`` that no step of ``candidates`` candidates reaches (nothing would fold).

        Raises:
            ValueError: ``copies >= candidates``.
        """
        if self.copies >= candidates:
            raise ValueError(
                f"distinct keeps {self.copies} copies, but a step scores at most {candidates} candidates (the sparse cache and one period's "
                f"tokens leaving the window), so a candidate repeats at most {candidates - 1} others and nothing would be folded: "
                f"use copies < {candidates}, or a policy without distinct"
            )

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        inner = self.parts[0].score(candidates, ctx).float()
        valid, pos = candidates.valid, candidates.pos
        repeated = repeats(candidates.v, inner, pos, valid, float(self.threshold), self.copies)
        # Below every candidate that repeats nothing, in the inner order among themselves.
        big = torch.finfo(torch.float32).max / 4
        lo = torch.where(valid, inner, big).amin(dim=-1, keepdim=True)
        hi = torch.where(valid, inner, -big).amax(dim=-1, keepdim=True)
        return torch.where(repeated & valid, inner - (hi - lo) - 1.0, inner)


def repeats(v: torch.Tensor, scores: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor, threshold: float, copies: int = 1) -> torch.Tensor:
    """``[B, Hs, N]`` bool: valid candidate ``i`` repeats at least ``copies`` valid candidates ``j``
    ranked above it (``scores[j] > scores[i]``, or equal and ``pos[j] < pos[i]``) whose values
    have cosine similarity ``>= threshold`` with its own. ``O(N²)`` per head, for the few
    hundred to few thousand candidates of one update.

    The candidates are sorted by rank first, so "ranked above" is "earlier in the order": the
    similarities of each candidate with those before it are the strict lower triangle of one
    ``[N, N]`` product, and a row's largest entry (``copies`` 1) or its count of entries at the
    threshold tells whether it repeats (no ``[N, N]`` rank comparison: at 8K those took most
    of a layer's step, docs/results.md, "What the misses at 8K are").

    Args:
        v: ``[B, Hs, N, D]`` values.
        scores: ``[B, Hs, N]`` the inner ranking.
        pos: ``[B, Hs, N]`` positions (ties).
        valid: ``[B, Hs, N]`` real candidates.
        copies: near-copies ranked above that make a repeat.
    """
    if scores.shape[-1] == 0:
        return torch.zeros_like(valid)
    if reads_back(valid.device):
        # Per-head budgets leave each head's candidates ragged: a (row, head) is compared over
        # its slots up to its last token only (empty slots repeat nothing), not the widest head's.
        n = valid.shape[-1]
        ends = (torch.arange(1, n + 1, device=valid.device) * valid).amax(-1).tolist()  # [B][Hs]
        if sum(e * e for row in ends for e in row) < 0.75 * len(ends) * len(ends[0]) * n * n:
            out = torch.zeros_like(valid)
            for b, row in enumerate(ends):
                for h, e in enumerate(row):
                    if e:
                        one = (slice(b, b + 1), slice(h, h + 1), slice(0, e))
                        out[one] = _repeats_dense(v[one], scores[one], pos[one], valid[one], threshold, copies)
            return out
    return _repeats_dense(v, scores, pos, valid, threshold, copies)


def _repeats_dense(v: torch.Tensor, scores: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor, threshold: float, copies: int) -> torch.Tensor:
    """:func:`repeats` over every slot of every (row, head) at once."""
    # Within float32's rounding of the threshold counts as reaching it (threshold 1 = same direction).
    cut = threshold - 1e-5
    # Rank order: by position, then (stably) by score, highest first.
    order = torch.sort(pos, dim=-1, stable=True).indices
    order = order.gather(-1, torch.sort(scores.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    unit = torch.nn.functional.normalize(v.float(), dim=-1).gather(-2, order[..., None].expand(*order.shape, v.shape[-1]))
    ranked_valid = valid.gather(-1, order)
    if cut > 0:
        # An invalid candidate is a zero vector as the one repeated, and what is not above is
        # zeroed: both stay below a positive cut. Rows in blocks against the columns before
        # their block's end only: the strict lower triangle in about 5/8 of the full product.
        others = (unit * ranked_valid[..., None]).transpose(-1, -2)
        step = _REPEAT_ROWS
        blocks = [_repeat_rows((unit[..., i : i + step, :] @ others[..., : i + step]).tril_(i - 1), cut, copies) for i in range(0, unit.shape[-2], step)]
        repeated = torch.cat(blocks, dim=-1) if blocks else torch.zeros_like(ranked_valid)
    else:
        sim = unit @ unit.transpose(-1, -2)
        above = torch.ones(sim.shape[-1], sim.shape[-1], dtype=torch.bool, device=sim.device).tril_(-1)
        repeated = _repeat_rows(sim.masked_fill_(~(above & ranked_valid[..., None, :]), -2.0), cut, copies)
    return torch.zeros_like(valid).scatter_(-1, order, repeated & ranked_valid)


_REPEAT_ROWS = 128
"""Rows of one block of :func:`_repeats_dense`'s similarity product."""


def _repeat_rows(sim: torch.Tensor, cut: float, copies: int) -> torch.Tensor:
    """``[..., R]`` bool: rows of ``sim [..., R, C]`` (zero or below ``cut`` where not compared)
    with at least ``copies`` entries at ``cut``."""
    return sim.amax(dim=-1) >= cut if copies == 1 else (sim >= cut).sum(dim=-1) >= copies


def repeats_reference(v: torch.Tensor, scores: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor, threshold: float, copies: int = 1) -> torch.Tensor:
    """:func:`repeats` as its definition reads, every pair compared (``[B, Hs, N, N]`` masks)."""
    unit = torch.nn.functional.normalize(v.float(), dim=-1)
    similar = unit @ unit.transpose(-1, -2) >= threshold - 1e-5  # [B, Hs, N(i), N(j)]
    si, sj = scores[..., :, None], scores[..., None, :]
    above = (sj > si) | ((sj == si) & (pos[..., None, :] < pos[..., :, None]))
    return ((similar & above & valid[..., None, :]).sum(dim=-1) >= copies) & valid


def _keeping_part(name: str, kwargs: dict[str, Any], keeper: str) -> ScoringPolicy:
    """The inner policy of a combinator that keeps scores in the slots' tallies (``keeper``): one
    that neither tallies attention there nor keeps scores of its own."""
    part = _build(name, kwargs)
    if getattr(part, "needs_attention", False):
        raise ValueError(f"policy {name!r} tallies attention in the slots where {keeper} keeps its scores: wrap a policy that does not")
    if getattr(part, "keeps_scores", False):
        raise ValueError(f"policy {name!r} keeps its scores already (one part of a policy keeps scores): use it without {keeper}")
    return part


@dataclass(frozen=True)
class _ScoreKeeper(_Composite):
    """A combinator that keeps its inner policy's scores in the slots' tallies, under the name
    ``_keeper`` (the policy is its one part, and the one part of it that keeps scores)."""

    _keeper = ""
    policy: str = "sre"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    parts: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", (_keeping_part(self.policy, self.policy_kwargs, self._keeper),))

    @property
    def keeps_scores(self) -> bool:
        return True


@dataclass(frozen=True)
class ScoredAtExit(_ScoreKeeper):
    """Score each token once, when it leaves the window, and rank it by that score for as long
    as it stays in the sparse cache.

    A score read off the linear state (self-recall error) changes as the state does: every
    step re-scores the cached tokens against a state that has folded more. When a token of
    a number is folded, the state recalls its near-copies (the number's other digits)
    better, their error falls, and they follow it out a step at a time (at 8K SRE loses the
    whole needle head by head: docs/results.md, "Self-recall error at 8K: the needle
    erodes"). Here the
    score a token gets at its exit is the one it keeps; the cache then holds the top-``λ`` of
    every token that has left the window, by those scores.

    The inner policy scores only the tokens leaving the window (``candidates[..., :ctx.fresh]``,
    against what it can see at that step); the cached tokens' scores are read from the slots'
    tallies, where the composer keeps them (``ctx.kept``). For a score that depends only on the
    token (key norms) the ranking is the inner policy's, at the cost of scoring each token once
    instead of at every step (the learned scorer does this itself). It may sit inside other combinations
    (``distinct`` over ``at_exit`` keeps the learned scores and folds repeats at every step);
    one part of a policy keeps scores.

    Args:
        policy: a registered policy name (one that does not tally attention).
        policy_kwargs: its keyword arguments.
    """

    _keeper = "at_exit"

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        return score_leaving(candidates, ctx, lambda block: self.parts[0].score(block, ctx), f"ScoredAtExit({self.policy!r})")


@dataclass(frozen=True)
class PeakScore(_ScoreKeeper):
    """Rank a cached token by the highest score its inner policy has given it since it left the
    window: every candidate is scored at every step, on the current state's scale, but a
    cached token's score does not fall.

    Between re-scoring every step (self-recall error erodes a cached needle: once a digit of a
    number is folded the state recalls its near-copies better and they follow it out) and
    scoring once at the window's exit (:class:`ScoredAtExit`: scores taken against states of
    different sizes are not comparable, and at length the cache fills with the newest tokens),
    this keeps the current scale for the tokens leaving the window and a floor for the cached.

    Args:
        policy: a registered policy name (one that does not tally attention or keep scores).
        policy_kwargs: its keyword arguments.
    """

    _keeper = "peak"

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        m = check_keeping(candidates, ctx, f"PeakScore({self.policy!r})")
        now = self.parts[0].score(candidates, ctx).float()
        cached = torch.arange(now.shape[-1], device=now.device) >= m
        ctx.kept = torch.where(cached, torch.maximum(now, candidates.acc), now)
        return ctx.kept
