"""Output mixing rules: how the exact (softmax) and linear partials become one output.

With ``E = (num, den, m)`` the merged softmax partial over the exact set, ``L = (num, den)``
the linear partial and ``w = sigmoid(window_factor)`` per head:

- ``lolcats``: ``y = (w·E.num + ℓ·L.num) / (w·E.den + ℓ·L.den)`` with the softmax terms
  shifted by the row max ``m`` (as LoLCATs checkpoints were trained), ``ℓ = 1``, or
  ``ℓ = 1 − w`` when ``affine``.
- ``lola_authors``: the unshifted softmax sums ``e^m·E``, ``ℓ = 1 − w``. Evaluated as
  ``(w e^{m−c} E.num + ℓ e^{−c} L.num) / (…)`` with ``c = max(m, 0)`` so neither term
  overflows for logits up to the float32 range.
- ``softmax_only``: ``y = E.num / E.den``; the linear state is kept (scoring reads it)
  but does not enter the output.

A zero denominator (a query that sees nothing) gives ``y = 0``, never NaN.

The arithmetic lives in one place, :func:`lola.kernels.mix_partials` (which the fused
:func:`lola.kernels.decode_step` also implements); this module names the rules and adapts the
partial objects.
"""

from __future__ import annotations

from enum import Enum

import torch

from lola.core.partials import LinearPartial, SoftmaxPartial
from lola.kernels.decode_step.reference import linear_share as _linear_share
from lola.kernels.decode_step.reference import mix_partials

__all__ = ["MixingRule", "kernel_mixing", "linear_share", "mix"]


class MixingRule(str, Enum):
    """Named rule for combining the exact and linear partials."""

    LOLCATS = "lolcats"
    LOLA_AUTHORS = "lola_authors"
    SOFTMAX_ONLY = "softmax_only"


def kernel_mixing(rule: MixingRule | str, affine: bool = False) -> str:
    """The :data:`lola.kernels.MIXING_RULES` name of ``rule`` (``lolcats`` + ``affine`` is
    ``"lolcats_affine"``)."""
    rule = MixingRule(rule)
    return "lolcats_affine" if rule is MixingRule.LOLCATS and affine else rule.value


def mix(
    exact: SoftmaxPartial,
    linear: LinearPartial,
    gate: torch.Tensor,
    rule: MixingRule | str,
    affine: bool = False,
    share_cap: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine partials into attention outputs.

    Args:
        exact: merged softmax partial, ``num [B, H, L, D]``, ``den``/``max`` ``[B, H, L]``.
        linear: linear partial, ``num [B, H, L, D]``, ``den [B, H, L]``.
        gate: ``[H]`` softmax weight ``w = sigmoid(window_factor)`` per head.
        rule: a :class:`MixingRule` or its name.
        affine: ``lolcats`` only: weight the linear term by ``1 − w`` instead of ``1``.
        share_cap: the linear state's share of each output is at most this (``None``: no cap), or
            a tensor broadcastable to ``[B, H, L]``, one cap per output (``1``: none).

    Returns:
        ``[B, H, L, D]`` float32 outputs.
    """
    return mix_partials(exact.num, exact.den, exact.max, linear.num, linear.den, gate, kernel_mixing(rule, affine), share_cap)


def linear_share(
    exact: SoftmaxPartial,
    linear: LinearPartial,
    gate: torch.Tensor,
    rule: MixingRule | str,
    affine: bool = False,
    share_cap: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The share ``α`` of each output that comes from the linear state.

    Each rule's output is the convex combination ``α · L.num/L.den + (1 − α) · E.num/E.den``;
    ``α`` is ``0`` for ``softmax_only`` (see :func:`lola.kernels.decode_step.reference.linear_share`).

    Args:
        exact, linear, gate, rule, affine: as in :func:`mix`.

    Returns:
        ``[B, H, L]`` float32 in ``[0, 1]``.
    """
    return _linear_share(exact.den, exact.max, linear.den, gate, kernel_mixing(rule, affine), share_cap)
