"""A policy that scores each token with a fitted model of how much it will be read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lola.memory.base import KVBlock
from lola.policies.base import ScoringContext

__all__ = ["LearnedScore"]


@dataclass(frozen=True)
class LearnedScore:
    """Keep the tokens a :class:`lola.scorers.TokenScorer` predicts will be read most.

    ``score = w[layer, head] · [R(−p)·k, v, 1]``: the predicted log-attention of each candidate,
    from its key (rotary embedding undone) and value alone, so a token's score never changes
    while it waits in the cache (no state, no queries). Needs the layer's index (set for every
    layer of a model by ``apply_lola``) and storage per K/V head.

    Args:
        scorer: a shipped scorer's name (:func:`lola.scorers.available`) or a ``lola fit-scorer``
            file.
    """

    scorer: str
    needs_attention = False
    _model: object = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from lola import scorers

        # Loaded when the policy is built, so that a missing or foreign file fails at apply time.
        object.__setattr__(self, "_model", scorers.load(self.scorer))

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        if ctx.layer is None:
            raise ValueError("the learned policy needs the layer's index (ScoringContext.layer): build the layer with layer=i, as apply_lola does")
        return self._model.score(ctx.layer, candidates.k, candidates.v, candidates.pos)
