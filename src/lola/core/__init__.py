"""Tensor math shared by every layer: attention partials and the mixing rules."""

from lola.core.mixing import MixingRule, linear_share, mix
from lola.core.partials import LinearPartial, SoftmaxPartial, merge_softmax_partials

__all__ = ["LinearPartial", "MixingRule", "SoftmaxPartial", "linear_share", "merge_softmax_partials", "mix"]
