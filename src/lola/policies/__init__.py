"""Scoring policies: which tokens stay exact in the sparse cache.

Built-ins are registered as ``"sre"``, ``"attention"``, ``"recency"``, ``"random"`` and
``"key_norm"``. Add your own with :func:`register` or the ``lola.policies`` entry point.
"""

from lola.policies.base import ScoringContext, ScoringPolicy
from lola.policies.builtin import AttentionMagnitude, KeyNorm, Random, Recency, SelfRecallError
from lola.policies.registry import ENTRY_POINT_GROUP, available, build, get, register, reload_entry_points, unregister

register("sre", SelfRecallError)
register("attention", AttentionMagnitude)
register("recency", Recency)
register("random", Random)
register("key_norm", KeyNorm)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AttentionMagnitude",
    "KeyNorm",
    "Random",
    "Recency",
    "ScoringContext",
    "ScoringPolicy",
    "SelfRecallError",
    "available",
    "build",
    "get",
    "register",
    "reload_entry_points",
    "unregister",
]
