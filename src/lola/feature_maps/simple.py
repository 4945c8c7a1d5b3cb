"""Parameter-free feature maps: ``elu(x) + 1`` and the second-order Taylor map of ``exp``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lola.feature_maps.base import FeatureMap

__all__ = ["EluFeatureMap", "TaylorFeatureMap"]


class EluFeatureMap(FeatureMap):
    """``φ(x) = elu(x) + 1`` (Katharopoulos et al. 2020); ``F = D``."""

    non_negative = True  # elu(x) > -1

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__(num_heads, head_dim)
        self.feature_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, H, N, D] -> [B, H, N, D]`` (float32)."""
        return F.elu(x.float()) + 1.0


class TaylorFeatureMap(FeatureMap):
    """Based/Taylor map ``φ(x) = [1, x / d^¼, (x ⊗ x) / (√2 · √d)]``; ``F = 1 + D + D²``.

    ``φ(q)ᵀφ(k) = 1 + q·k/√d + (q·k)²/(2d)``, the second-order Taylor expansion of
    ``exp(q·k/√d)``, which is always positive.
    """

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__(num_heads, head_dim)
        self.feature_dim = 1 + head_dim + head_dim * head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, H, N, D] -> [B, H, N, 1 + D + D²]`` (float32)."""
        x = x.float()
        d = self.head_dim
        x1 = x / d**0.25
        x2 = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2 * d)
        return torch.cat([torch.ones_like(x[..., :1]), x1, x2], dim=-1)
