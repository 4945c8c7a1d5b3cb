"""Offline evaluations: RULER-style needle-in-a-haystack tasks and scoring."""

from lola.eval.niah import NiahSample, make_niah_sample, string_match_all

__all__ = ["NiahSample", "make_niah_sample", "string_match_all"]
