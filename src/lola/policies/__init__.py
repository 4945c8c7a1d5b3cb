"""Scoring policies: which tokens stay exact in the sparse cache.

Built-ins are registered as ``"sre"``, ``"attention"``, ``"recency"``, ``"random"``,
``"key_norm"``, ``"expected_attention"``, ``"key_diff"`` and ``"learned"`` (a fitted
:class:`lola.scorers.TokenScorer`); the combinators ``"fusion"``,
``"value_weighted"``, ``"span"``, ``"distinct"``, ``"at_exit"`` and ``"peak"`` build on any of them by name. Add your own with :func:`register` or the ``lola.policies`` entry point.
"""

from lola.policies.base import ScoringContext, ScoringPolicy, keeps_tallies
from lola.policies.builtin import AttentionMagnitude, KeyNorm, Random, Recency, SelfRecallError
from lola.policies.combinators import Distinct, Fusion, PeakScore, ScoredAtExit, SpanPooling, ValueWeighted, zscore
from lola.policies.learned import LearnedScore
from lola.policies.predictive import ExpectedAttention, KeyDiff, average_rope_rotation
from lola.policies.registry import ENTRY_POINT_GROUP, available, build, get, register, reload_entry_points, unregister

register("sre", SelfRecallError)
register("attention", AttentionMagnitude)
register("recency", Recency)
register("random", Random)
register("key_norm", KeyNorm)
register("expected_attention", ExpectedAttention)
register("key_diff", KeyDiff)
register("learned", LearnedScore)
register("fusion", Fusion)
register("value_weighted", ValueWeighted)
register("span", SpanPooling)
register("distinct", Distinct)
register("at_exit", ScoredAtExit)
register("peak", PeakScore)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AttentionMagnitude",
    "Distinct",
    "ExpectedAttention",
    "Fusion",
    "KeyDiff",
    "KeyNorm",
    "LearnedScore",
    "PeakScore",
    "Random",
    "Recency",
    "ScoredAtExit",
    "ScoringContext",
    "ScoringPolicy",
    "SelfRecallError",
    "SpanPooling",
    "ValueWeighted",
    "average_rope_rotation",
    "available",
    "build",
    "get",
    "keeps_tallies",
    "register",
    "reload_entry_points",
    "unregister",
    "zscore",
]
