"""The one list of feature maps: each name with its builder and whether training can fit it.

``LoLAConfig.feature_map`` accepts :data:`FEATURE_MAPS`, :func:`~lola.feature_maps.build_feature_map`
builds them, and ``lola linearize`` (``LinearizeConfig.feature_map``, ``--feature-map``) trains
:data:`TRAINABLE_FEATURE_MAPS`: all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lola.feature_maps.base import FeatureMap
from lola.feature_maps.hedgehog import HedgehogFeatureMap
from lola.feature_maps.simple import EluFeatureMap, TaylorFeatureMap

__all__ = ["DEFAULT_FEATURE_MAP", "FEATURE_MAPS", "REGISTRY", "TRAINABLE_FEATURE_MAPS", "FeatureMapSpec"]


@dataclass(frozen=True)
class FeatureMapSpec:
    """One registered feature map.

    Attributes:
        name: the name ``LoLAConfig.feature_map`` takes.
        build: ``(num_heads, head_dim, feature_dim) -> FeatureMap``.
        trainable: it has parameters that attention transfer (``lola linearize``) can train.
        description: one line for the documentation.
    """

    name: str
    build: Callable[[int, int, int], FeatureMap]
    trainable: bool
    description: str


REGISTRY: dict[str, FeatureMapSpec] = {
    spec.name: spec
    for spec in (
        FeatureMapSpec("hedgehog", lambda h, d, f: HedgehogFeatureMap(h, d, feature_dim=f), True, "Hedgehog with a random projection (F = 2f), to be trained"),
        FeatureMapSpec("hedgehog_identity", lambda h, d, f: HedgehogFeatureMap(h, d, identity=True), True, "Hedgehog with W = I at first (F = 2D)"),
        FeatureMapSpec("elu", lambda h, d, f: EluFeatureMap(h, d), False, "elu(x) + 1 (F = D)"),
        FeatureMapSpec("taylor", lambda h, d, f: TaylorFeatureMap(h, d), False, "second-order Taylor expansion of exp (F = 1 + D + D²)"),
    )
}
"""``{name: FeatureMapSpec}`` of every feature map."""

FEATURE_MAPS: tuple[str, ...] = tuple(REGISTRY)
"""The names :func:`~lola.feature_maps.build_feature_map` and ``LoLAConfig.feature_map`` accept."""

TRAINABLE_FEATURE_MAPS: tuple[str, ...] = tuple(name for name, spec in REGISTRY.items() if spec.trainable)
"""The names ``lola linearize`` can train (``LinearizeConfig.feature_map``)."""

DEFAULT_FEATURE_MAP = "hedgehog_identity"
"""``LoLAConfig``'s and ``lola linearize``'s default: a reasonable map without training."""
