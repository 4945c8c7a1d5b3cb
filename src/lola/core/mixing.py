"""Output mixing rules: how the exact (softmax) and linear partials become one output. The one
definition of the rules and their arithmetic (the kernels' references and the layer use it).

With ``m`` the max visible logit, ``E_num = Σ e^{s_j − m} v_j``, ``E_den = Σ e^{s_j − m}`` (the
softmax partials, shifted by the row max), ``L_num = φ(q)ᵀH``, ``L_den = φ(q)ᵀs`` (the linear
partials) and ``w = sigmoid(window_factor)`` per head::

    lolcats         o = (w E_num + L_num) / (w E_den + L_den)            (as LoLCATs checkpoints were trained)
    lolcats_affine  o = (w E_num + (1-w) L_num) / (w E_den + (1-w) L_den)
    lola_authors    o = (w e^m E_num + (1-w) L_num) / (w e^m E_den + (1-w) L_den)
                        (numerator and denominator scaled by e^{-c}, c = max(m, 0), so neither
                        term overflows for logits up to the float32 range)
    softmax_only    o = E_num / E_den  (the linear state is kept, scoring reads it, but it does
                        not enter the output)

A config names a :class:`MixingRule` (``lolcats`` with ``affine`` is ``lolcats_affine``:
:func:`kernel_mixing`); the kernels take the four names of :data:`MIXING_RULES`. A zero
denominator (a query that sees nothing) gives ``o = 0``, never NaN. Every rule is the convex
combination ``o = α L_num/L_den + (1 − α) E_num/E_den`` (:func:`linear_share_of`); an optional
``share_cap`` ``c`` replaces ``α`` by ``min(α, c)`` wherever an exact token is visible.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional, Union

import torch

from lola.core.partials import LinearPartial, SoftmaxPartial

__all__ = [
    "MIXING_NAMES",
    "MIXING_RULES",
    "MixingRule",
    "check_mixing",
    "kernel_mixing",
    "linear_share",
    "linear_share_of",
    "mix",
    "mix_partials",
    "mixing_weights",
    "safe_divide",
]


class MixingRule(str, Enum):
    """Named rule for combining the exact and linear partials (a config's ``mixing``)."""

    LOLCATS = "lolcats"
    LOLA_AUTHORS = "lola_authors"
    SOFTMAX_ONLY = "softmax_only"


MIXING_NAMES = tuple(rule.value for rule in MixingRule)
"""The rules a config names (``LoLAConfig.mixing``)."""

MIXING_RULES = (MixingRule.LOLCATS.value, "lolcats_affine", *(rule.value for rule in MixingRule if rule is not MixingRule.LOLCATS))
"""The rules the arithmetic and the kernels take: :data:`MIXING_NAMES` with ``lolcats``' affine
variant (kernels index them in this order)."""


def kernel_mixing(rule: MixingRule | str, affine: bool = False) -> str:
    """The :data:`MIXING_RULES` name of ``rule`` (``lolcats`` + ``affine`` is ``"lolcats_affine"``)."""
    rule = MixingRule(rule)
    return "lolcats_affine" if rule is MixingRule.LOLCATS and affine else rule.value


def check_mixing(mixing: str) -> int:
    """Index of ``mixing`` in :data:`MIXING_RULES`; ValueError for anything else."""
    if mixing not in MIXING_RULES:
        raise ValueError(f"mixing must be one of {', '.join(MIXING_RULES)}; got {mixing!r}")
    return MIXING_RULES.index(mixing)


def safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den[..., None]`` with 0 where ``den == 0`` (no NaN/inf, finite gradients)."""
    zero = den == 0
    out = num / torch.where(zero, torch.ones_like(den), den)[..., None]
    return out.masked_fill(zero[..., None], 0.0)


def mix_partials(
    e_num: torch.Tensor,
    e_den: torch.Tensor,
    e_max: torch.Tensor,
    l_num: torch.Tensor,
    l_den: torch.Tensor,
    gate: torch.Tensor,
    mixing: str,
    share_cap: Optional[Union[float, torch.Tensor]] = None,
) -> torch.Tensor:
    """Mix exact softmax partials with linear-attention partials.

    Args:
        e_num: ``[B, H, L, D]`` softmax numerator, shifted by ``e^{-e_max}``.
        e_den: ``[B, H, L]`` softmax denominator, same shift.
        e_max: ``[B, H, L]`` max logit (``-inf`` when nothing was visible).
        l_num: ``[B, H, L, D]`` linear numerator ``fq^T H``.
        l_den: ``[B, H, L]`` linear denominator ``fq^T s``.
        gate: ``[H]`` softmax weight ``w`` per head (already sigmoid-ed).
        mixing: one of :data:`MIXING_RULES`.
        share_cap: ``c ∈ (0, 1]``: the linear state's share of each output is at most ``c``
            (``None``: no cap); or a tensor broadcastable to ``[B, H, L]``, one cap per output
            (``1``: none).

    Returns:
        ``o [B, H, L, D]`` fp32.
    """
    check_mixing(mixing)
    e_num, e_den = e_num.float(), e_den.float()
    if mixing == "softmax_only":
        return safe_divide(e_num, e_den)
    a, b = mixing_weights(e_max, gate, mixing)
    num = a[..., None] * e_num + b[..., None] * l_num.float()
    den = a * e_den + b * l_den.float()
    out = safe_divide(num, den)
    if share_cap is None:
        return out
    # Where the state's share exceeds the cap, the same two reads mixed at the cap instead (a
    # query that sees no exact token keeps the state's read: there is nothing to mix it with).
    share = linear_share_of(e_den, e_max, l_den, gate, mixing)
    c = share_cap.float()[..., None] if isinstance(share_cap, torch.Tensor) else share_cap  # per output: over D too
    capped = c * safe_divide(l_num.float(), l_den.float()) + (1 - c) * safe_divide(e_num, e_den)
    return torch.where(((share > share_cap) & (e_den > 0))[..., None], capped, out)


def mixing_weights(e_max: torch.Tensor, gate: torch.Tensor, mixing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights ``a`` (exact partials) and ``b`` (linear partials) of a rule that mixes:
    ``o = (a E_num + b L_num) / (a E_den + b L_den)``.

    Args:
        e_max: ``[B, H, L]`` max logit of the exact partials (``-inf`` when nothing was visible).
        gate: ``[H]`` softmax weight ``w`` per head (already sigmoid-ed).
        mixing: ``lolcats``, ``lolcats_affine`` or ``lola_authors``.

    Returns:
        ``a``, ``b``, each ``[B, H, L]`` (or broadcastable to it) fp32.
    """
    w = gate.float().reshape(1, -1, 1)  # [1, H, 1]
    if mixing == "lolcats":
        return w, torch.ones_like(w)
    if mixing == "lolcats_affine":
        return w, 1 - w
    if mixing != "lola_authors":
        raise ValueError(f"mixing {mixing!r} has no linear term; expected lolcats, lolcats_affine or lola_authors")
    # lola_authors: unshifted softmax sums e^m E, both sides scaled by e^{-c}
    e_max = e_max.float()
    c = e_max.clamp_min(0.0)  # -inf (nothing visible) -> 0
    return w * torch.exp(e_max - c), (1 - w) * torch.exp(-c)  # a <= w; exactly 0 when nothing is visible


def linear_share_of(
    e_den: torch.Tensor, e_max: torch.Tensor, l_den: torch.Tensor, gate: torch.Tensor, mixing: str, share_cap: Optional[Union[float, torch.Tensor]] = None
) -> torch.Tensor:
    """The share of each output that the linear state gives (at most ``share_cap`` when given).

    Every mixing rule is a convex combination ``o = α · L_num/L_den + (1 − α) · E_num/E_den``
    with ``α = b L_den / (a E_den + b L_den)`` (:func:`mixing_weights`); ``α`` is returned
    (``0`` for ``softmax_only`` and where both denominators are zero).

    Args:
        e_den, e_max: ``[B, H, L]`` exact partials (as in :func:`mix_partials`).
        l_den: ``[B, H, L]`` linear denominator ``fq^T s``.
        gate: ``[H]``; mixing: one of :data:`MIXING_RULES`.

    Returns:
        ``α [B, H, L]`` fp32 in ``[0, 1]``.
    """
    check_mixing(mixing)
    if mixing == "softmax_only":
        return torch.zeros_like(e_den, dtype=torch.float32)
    a, b = mixing_weights(e_max, gate, mixing)
    lin = b * l_den.float()
    share = safe_divide(lin[..., None], a * e_den.float() + lin)[..., 0]
    if share_cap is None:
        return share
    return torch.where(e_den > 0, torch.minimum(share, torch.as_tensor(share_cap, dtype=share.dtype, device=share.device)), share)


def mix(
    exact: SoftmaxPartial,
    linear: LinearPartial,
    gate: torch.Tensor,
    rule: MixingRule | str,
    affine: bool = False,
    share_cap: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine partials into attention outputs (:func:`mix_partials` on the partial objects).

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
    """The share ``α`` of each output that comes from the linear state (:func:`linear_share_of`
    on the partial objects; ``0`` for ``softmax_only``).

    Args:
        exact, linear, gate, rule, affine, share_cap: as in :func:`mix`.

    Returns:
        ``[B, H, L]`` float32 in ``[0, 1]``.
    """
    return linear_share_of(exact.den, exact.max, linear.den, gate, kernel_mixing(rule, affine), share_cap)
