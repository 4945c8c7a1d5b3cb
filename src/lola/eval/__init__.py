"""Offline evaluations: RULER-style needle-in-a-haystack tasks and scoring."""

from lola.eval.niah import TASKS, NiahSample, make_niah_sample, make_sample, string_match_all

__all__ = ["TASKS", "NiahSample", "make_niah_sample", "make_sample", "string_match_all"]
