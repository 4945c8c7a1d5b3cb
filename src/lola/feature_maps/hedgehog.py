"""Hedgehog feature map (Zhang et al. 2024), in the LoLCATs parameter layout."""

from __future__ import annotations

import math

import torch
from torch import nn

from lola.feature_maps.base import FeatureMap

__all__ = ["HedgehogFeatureMap", "HedgehogMLP"]


class HedgehogMLP(nn.Module):
    """Per-head linear projection ``x W_h`` with ``layer: [H, D, f]`` (LoLCATs key ``mlp.layer``)."""

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int, identity: bool) -> None:
        super().__init__()
        if identity:
            if feature_dim != head_dim:
                raise ValueError(f"identity Hedgehog needs feature_dim == head_dim, got {feature_dim} != {head_dim}")
            weight = torch.eye(head_dim).expand(num_heads, head_dim, head_dim).clone()
        else:
            weight = torch.empty(num_heads, head_dim, feature_dim)
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        self.layer = nn.Parameter(weight)
        self.bias: nn.Parameter | None = None

    def set_bias(self, bias: torch.Tensor) -> None:
        """Add (or replace) a bias broadcast over ``[B, H, N, f]`` (LoLCATs trains ``[1, H, 1, 1]``)."""
        self.bias = nn.Parameter(bias.detach().to(self.layer.device, self.layer.dtype).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, H, N, D] -> [B, H, N, f]`` (float32)."""
        z = torch.einsum("bhnd,hdf->bhnf", x.float(), self.layer.float())
        return z if self.bias is None else z + self.bias.float()


class HedgehogFeatureMap(FeatureMap):
    """``φ(x) = [softmax(x W), softmax(−x W)]`` per head, clamped at ``eps``.

    ``F = 2 f``. With ``identity=True`` the projection starts as ``W = I`` (``f = D``), a
    reasonable training-free map; otherwise ``W`` is random and meant to be trained by
    attention transfer. Parameter names follow LoLCATs (``mlp.layer``) so trained
    checkpoints load directly.

    Args:
        num_heads: ``H``, one projection per query head.
        head_dim: ``D``.
        feature_dim: ``f`` (ignored and set to ``D`` when ``identity``).
        identity: initialise ``W`` to the identity.
        eps: lower clamp of the features (keeps ``φ(q)ᵀs > 0``).
    """

    non_negative = True  # softmaxes, clamped at eps
    head_axes = {"mlp.layer": 0, "mlp.bias": 1}  # [H, D, f], and a trained bias [1, H, 1, 1]

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int = 64, identity: bool = False, eps: float = 1e-12) -> None:
        super().__init__(num_heads, head_dim)
        f = head_dim if identity else feature_dim
        if f < 1:
            raise ValueError(f"feature_dim must be >= 1, got {feature_dim}")
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be a finite number > 0 (the features' floor), got {eps!r}")
        self.mlp = HedgehogMLP(num_heads, head_dim, f, identity)
        self.eps = float(eps)
        self.feature_dim = 2 * f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, H, N, D] -> [B, H, N, 2f]`` (float32)."""
        z = self.mlp(x)
        return torch.cat([torch.softmax(z, dim=-1), torch.softmax(-z, dim=-1)], dim=-1).clamp_min(self.eps)
