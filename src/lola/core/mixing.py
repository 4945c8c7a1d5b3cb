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
"""

from __future__ import annotations

from enum import Enum

import torch

from lola.core.partials import LinearPartial, SoftmaxPartial

__all__ = ["MixingRule", "mix"]


class MixingRule(str, Enum):
    """Named rule for combining the exact and linear partials."""

    LOLCATS = "lolcats"
    LOLA_AUTHORS = "lola_authors"
    SOFTMAX_ONLY = "softmax_only"


def mix(
    exact: SoftmaxPartial,
    linear: LinearPartial,
    gate: torch.Tensor,
    rule: MixingRule | str,
    affine: bool = False,
) -> torch.Tensor:
    """Combine partials into attention outputs.

    Args:
        exact: merged softmax partial, ``num [B, H, L, D]``, ``den``/``max`` ``[B, H, L]``.
        linear: linear partial, ``num [B, H, L, D]``, ``den [B, H, L]``.
        gate: ``[H]`` softmax weight ``w = sigmoid(window_factor)`` per head.
        rule: a :class:`MixingRule` or its name.
        affine: ``lolcats`` only: weight the linear term by ``1 − w`` instead of ``1``.

    Returns:
        ``[B, H, L, D]`` float32 outputs.
    """
    rule = MixingRule(rule)
    w = gate.float().view(1, -1, 1)
    finite = torch.isfinite(exact.max)
    if rule is MixingRule.SOFTMAX_ONLY:
        num, den = exact.num, exact.den
    elif rule is MixingRule.LOLCATS:
        lin_w = (1.0 - w) if affine else torch.ones_like(w)
        num = w.unsqueeze(-1) * exact.num + lin_w.unsqueeze(-1) * linear.num
        den = w * exact.den + lin_w * linear.den
    else:  # LOLA_AUTHORS
        m = torch.where(finite, exact.max, 0.0)
        c = m.clamp_min(0.0)
        e_scale = torch.where(finite, torch.exp(m - c), 0.0) * w
        l_scale = torch.exp(-c) * (1.0 - w)
        num = e_scale.unsqueeze(-1) * exact.num + l_scale.unsqueeze(-1) * linear.num
        den = e_scale * exact.den + l_scale * linear.den
    safe = den != 0
    return torch.where(safe.unsqueeze(-1), num / torch.where(safe, den, 1.0).unsqueeze(-1), 0.0)
