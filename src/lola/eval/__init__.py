"""Offline evaluations: RULER-style needle-in-a-haystack tasks, MQAR, and scoring."""

from lola.eval.mqar import make_mqar, mqar_accuracy
from lola.eval.niah import TASKS, NiahSample, make_niah_sample, make_sample, string_match_all

__all__ = ["TASKS", "NiahSample", "make_mqar", "make_niah_sample", "make_sample", "mqar_accuracy", "string_match_all"]
