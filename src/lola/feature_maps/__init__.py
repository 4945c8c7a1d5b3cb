"""Feature maps φ for the linear state: Hedgehog (trainable or identity), elu, Taylor."""

from __future__ import annotations

from lola.feature_maps.base import FeatureMap
from lola.feature_maps.hedgehog import HedgehogFeatureMap, HedgehogMLP
from lola.feature_maps.simple import EluFeatureMap, TaylorFeatureMap

__all__ = [
    "FEATURE_MAPS",
    "EluFeatureMap",
    "FeatureMap",
    "HedgehogFeatureMap",
    "HedgehogMLP",
    "TaylorFeatureMap",
    "build_feature_map",
]

FEATURE_MAPS = ("hedgehog", "hedgehog_identity", "elu", "taylor")


def build_feature_map(name: str, num_heads: int, head_dim: int, feature_dim: int = 64) -> FeatureMap:
    """Build a feature map by name (one of :data:`FEATURE_MAPS`).

    Args:
        name: ``"hedgehog"``, ``"hedgehog_identity"``, ``"elu"`` or ``"taylor"``.
        num_heads: number of query heads ``H`` (Hedgehog keeps one projection per head).
        head_dim: ``D``.
        feature_dim: Hedgehog's ``f`` (``F = 2f``); ignored by the others.
    """
    if name == "hedgehog":
        return HedgehogFeatureMap(num_heads, head_dim, feature_dim=feature_dim)
    if name == "hedgehog_identity":
        return HedgehogFeatureMap(num_heads, head_dim, identity=True)
    if name == "elu":
        return EluFeatureMap(num_heads, head_dim)
    if name == "taylor":
        return TaylorFeatureMap(num_heads, head_dim)
    raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {name!r}")
