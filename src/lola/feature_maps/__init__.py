"""Feature maps φ for the linear state: Hedgehog (trainable or identity), elu, Taylor.

The names, builders and which ones training can fit are registered once, in
:mod:`lola.feature_maps.registry`.
"""

from __future__ import annotations

from lola.feature_maps.base import FeatureMap
from lola.feature_maps.hedgehog import HedgehogFeatureMap, HedgehogMLP
from lola.feature_maps.registry import DEFAULT_FEATURE_MAP, FEATURE_MAPS, TRAINABLE_FEATURE_MAPS
from lola.feature_maps.registry import REGISTRY as _REGISTRY
from lola.feature_maps.simple import EluFeatureMap, TaylorFeatureMap

__all__ = [
    "DEFAULT_FEATURE_MAP",
    "FEATURE_MAPS",
    "TRAINABLE_FEATURE_MAPS",
    "EluFeatureMap",
    "FeatureMap",
    "HedgehogFeatureMap",
    "HedgehogMLP",
    "TaylorFeatureMap",
    "build_feature_map",
]


def build_feature_map(name: str, num_heads: int, head_dim: int, feature_dim: int = 64) -> FeatureMap:
    """Build a feature map by name (one of :data:`FEATURE_MAPS`, see :mod:`lola.feature_maps.registry`).

    Args:
        name: a name of :data:`FEATURE_MAPS`.
        num_heads: number of query heads ``H`` (Hedgehog keeps one projection per head).
        head_dim: ``D``.
        feature_dim: Hedgehog's ``f`` (``F = 2f``); ignored by the others.
    """
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {name!r}")
    fm = spec.build(num_heads, head_dim, feature_dim)
    fm.kind = spec.name
    return fm
