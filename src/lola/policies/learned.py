"""A policy that scores each token with a fitted model of how much it will be read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lola.memory.base import KVBlock
from lola.policies.base import ScoringContext, score_leaving

__all__ = ["LearnedScore"]


@dataclass(frozen=True)
class LearnedScore:
    """Keep the tokens a :class:`lola.scorers.TokenScorer` predicts will be read most.

    ``score = w[layer, head] · [R(−p)·k, v, 1]``: the predicted log-attention of each candidate,
    from its key (rotary embedding undone) and value alone, so a token's score never changes
    while it waits in the cache (no state, no queries). So in a select-and-evict step only the
    tokens leaving the window are scored; the cached ones keep theirs (``keeps_scores``, as
    :class:`~lola.policies.ScoredAtExit` would: the same ranking, each token scored once).
    Needs the layer's index (set for every layer of a model by ``apply_lola``) and storage per
    K/V head.

    Args:
        scorer: a shipped scorer's name (:func:`lola.scorers.available`) or a ``lola fit-scorer``
            file.
    """

    scorer: str
    needs_attention = False
    keeps_scores = True
    _model: object = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from lola import scorers

        # Loaded when the policy is built, so that a missing or foreign file fails at apply time.
        object.__setattr__(self, "_model", scorers.load(self.scorer))

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        if ctx.layer is None:
            raise ValueError("the learned policy needs the layer's index (ScoringContext.layer): build the layer with layer=i, as apply_lola does")
        first = ctx.head_offset  # a share of the heads scores with those heads' weights
        if ctx.fresh is None:  # outside a step: every candidate
            return self._model.score(ctx.layer, candidates.k, candidates.v, candidates.pos, first_head=first)
        return score_leaving(candidates, ctx, lambda b: self._model.score(ctx.layer, b.k, b.v, b.pos, first_head=first), f"learned scorer {self.scorer!r}")
