"""One decode step of LoLA attention: exact part + linear part, mixed. The definition.

With ``m`` the max visible logit, ``E_num = sum e^{s_j - m} v_j``, ``E_den = sum e^{s_j - m}``
(the softmax partials), ``L_num = fq^T H``, ``L_den = fq^T s`` and the per-head softmax
weight ``w`` (already sigmoid-ed), the mixing rules are::

    lolcats         o = (w E_num + L_num) / (w E_den + L_den)
    lolcats_affine  o = (w E_num + (1-w) L_num) / (w E_den + (1-w) L_den)
    lola_authors    o = (w e^m E_num + (1-w) L_num) / (w e^m E_den + (1-w) L_den)
                        (numerator and denominator scaled by e^{-c}, c = max(m, 0), for stability)
    softmax_only    o = E_num / E_den

A zero denominator gives ``o = 0`` in every rule. Every rule is the convex combination
``o = α L_num/L_den + (1 − α) E_num/E_den`` (:func:`linear_share`); an optional ``share_cap``
``c`` replaces ``α`` by ``min(α, c)`` wherever an exact token is visible.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..softmax_partial.reference import masked_logits, partials_from_logits

MIXING_RULES = ("lolcats", "lolcats_affine", "lola_authors", "softmax_only")


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
    share = linear_share(e_den, e_max, l_den, gate, mixing)
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


def linear_share(
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


def softmax_over_slots(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax_only`` decoding: softmax attention of ``q [B, H, D]`` over the non-empty slots of
    ``k, v [B, Hs, N, D]`` (``k_pos [B, Hs, N]``, ``-1`` = empty), in fp32; ``0`` where every slot
    is empty. The same value as ``E_num / E_den`` from :func:`softmax_partial`, computed by
    PyTorch's fused attention (the G query heads of a storage head form its query rows).

    Returns:
        ``o [B, H, D]`` fp32.
    """
    B, H, D = q.shape
    Hs = k.shape[1]
    valid = (k_pos >= 0)[:, :, None, :]  # [B, Hs, 1, N]
    o = torch.nn.functional.scaled_dot_product_attention(q.float().view(B, Hs, H // Hs, D), k.float(), v.float(), attn_mask=valid, scale=scale)
    return torch.where(valid.any(-1, keepdim=True), o, 0.0).view(B, H, D)  # a fully masked row is NaN


def decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pos: torch.Tensor,
    fq: Optional[torch.Tensor],
    H: Optional[torch.Tensor],
    s: Optional[torch.Tensor],
    gate: torch.Tensor,
    mixing: str,
    scale: float,
) -> torch.Tensor:
    """Reference decode step: :func:`softmax_partial` with one query + :func:`mix_partials`.

    Args:
        q: ``[B, H, D]``; k, v: ``[B, Hs, N, D]``; k_pos: ``[B, Hs, N]`` (-1 = empty slot,
        every other slot visible); fq: ``[B, H, F]``; H: ``[B, H, F, D]`` fp32;
        s: ``[B, H, F]`` fp32; gate: ``[H]`` fp32. fq/H/s may be None for ``softmax_only``.

    Returns:
        ``o [B, H, D]`` fp32.
    """
    check_mixing(mixing)
    if mixing == "softmax_only":
        return softmax_over_slots(q, k, v, k_pos, scale)
    # One query newer than every stored key: only empty slots are masked.
    e_num, e_den, e_max = partials_from_logits(masked_logits(q[:, :, None], k, None, k_pos, scale), v)
    fq32 = fq.float().unsqueeze(2)  # [B, H, 1, F]
    l_num = torch.matmul(fq32, H.float())  # [B, H, 1, D]
    l_den = torch.matmul(fq32, s.float().unsqueeze(-1)).squeeze(-1)  # [B, H, 1]
    return mix_partials(e_num, e_den, e_max, l_num, l_den, gate, mixing)[:, :, 0]
