"""The feature-map interface: φ maps per-head vectors to non-negative features."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FeatureMap"]


class FeatureMap(nn.Module):
    """Base class of feature maps ``φ: [B, H, N, D] -> [B, H, N, F]``.

    Subclasses set :attr:`feature_dim` (``F``) and implement :meth:`forward`. Outputs are
    float32 whatever the input dtype, because the linear state accumulates them.
    """

    feature_dim: int
    #: Whether every feature is ``>= 0`` (so a linear state's normaliser ``s = Σ φ(k)`` is too);
    #: a saved state whose ``s`` is negative is then refused (:func:`lola.engine.state_checks.check_state`).
    non_negative: bool = False
    #: ``{parameter name: axis}`` of every per-head parameter (a share of the heads, as a
    #: tensor-parallel rank holds, is cut along it: :func:`lola.head_share.head_axes`).
    head_axes: dict[str, int] = {}
    #: The name it was built by (:func:`lola.feature_maps.build_feature_map`; ``None``: a custom
    #: map, named by its class). A saved state records it: maps of one ``F`` write other features.
    kind: str | None = None

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        self.num_heads = num_heads
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Map ``x: [B, H, N, D]`` to features ``[B, H, N, F]`` (float32)."""
        raise NotImplementedError
