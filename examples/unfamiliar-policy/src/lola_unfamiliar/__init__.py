"""A lola scoring policy in a package of its own: ``Unfamiliar``.

Published through the ``lola.policies`` entry point (see ``pyproject.toml``), so that once this
package is installed ``lola.LoLAConfig(policy="unfamiliar")`` builds it by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

__all__ = ["Unfamiliar"]
__version__ = "0.1.0"


@dataclass(frozen=True)
class Unfamiliar:
    """Keep exact the keys the linear state has absorbed least of.

    A key scores ``-φ(k)ᵀs / ‖φ(k)‖₁``: minus the average normaliser mass under its features, so
    a key unlike anything folded so far ranks high. Cheap (one product with ``s``) and free of
    attention weights.

    Args:
        eps: added to ``‖φ(k)‖₁`` (a key whose features are all zero scores 0, not NaN).
    """

    eps: Annotated[float, Field(gt=0)] = 1e-6
    needs_attention = False  # a class attribute, not a dataclass field

    def score(self, candidates, ctx) -> torch.Tensor:
        """``candidates``: a KVBlock with ``k`` ``[B, Hs, N, D]``; returns ``[B, Hs, N]``, higher = keep exact."""
        g = ctx.group(candidates)  # query heads per storage head
        fk = ctx.key_features(candidates)  # [B, H, N, F]
        familiar = (fk @ ctx.s.unsqueeze(-1)).squeeze(-1) / (fk.sum(-1) + self.eps)  # [B, H, N]
        return ctx.reduce_heads(-familiar, g)  # [B, Hs, N]
