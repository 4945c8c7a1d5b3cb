"""One decode step of LoLA attention: exact part + linear part, mixed. The definition.

The softmax partials of the one query over the cache (:mod:`lola.kernels.softmax_partial`)
and its linear partials ``φ(q)ᵀH, φ(q)ᵀs``, mixed by a rule of :mod:`lola.core.mixing` (the
rules and their arithmetic are defined there, once). A ragged run
(:class:`lola.kernels.RaggedSlots`) adds slots to each storage head's cache.
"""

from __future__ import annotations

from typing import Optional

import torch

from lola.core.mixing import MIXING_RULES, check_mixing, linear_share_of, mix_partials, mixing_weights, safe_divide
from lola.core.partials import read_linear_state

from ..exact_attention.reference import masked_logits, partials_from_logits, partials_with_ragged
from ..ragged import RaggedSlots

__all__ = ["MIXING_RULES", "check_mixing", "decode_step", "linear_share_of", "mix_partials", "mixing_weights", "safe_divide", "softmax_over_slots"]


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
    ragged: Optional[RaggedSlots] = None,
    share_cap: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Reference decode step: :func:`softmax_partial` with one query + :func:`mix_partials`.

    Args:
        q: ``[B, H, D]``; k, v: ``[B, Hs, N, D]``; k_pos: ``[B, Hs, N]`` (-1 = empty slot,
        every other slot visible); fq: ``[B, H, F]``; H: ``[B, H, F, D]`` fp32;
        s: ``[B, H, F]`` fp32; gate: ``[H]`` fp32. fq/H/s may be None for ``softmax_only``.
        ragged: extra slots per storage head (``k, v [B, S, D]``, ``pos [B, S]``, ``offsets``),
        every non-empty one visible too, or ``None``.
        share_cap: ``[B]`` the linear state's largest share per row (``1``: none), or ``None``.

    Returns:
        ``o [B, H, D]`` fp32.
    """
    check_mixing(mixing)
    if mixing == "softmax_only" and ragged is None:
        return softmax_over_slots(q, k, v, k_pos, scale)
    # One query newer than every stored key: only empty slots are masked.
    if ragged is None:
        e_num, e_den, e_max = partials_from_logits(masked_logits(q[:, :, None], k, None, k_pos, scale), v)
    else:
        e_num, e_den, e_max = partials_with_ragged(q[:, :, None], k, v, None, k_pos, scale, ragged)
    if mixing == "softmax_only":
        return safe_divide(e_num, e_den)[:, :, 0]
    linear = read_linear_state(fq.unsqueeze(2), H, s)  # [B, H, 1, D], [B, H, 1]
    cap = None if share_cap is None else share_cap.float()[:, None, None]  # [B, 1, 1]: one per row
    return mix_partials(e_num, e_den, e_max, linear.num, linear.den, gate, mixing, cap)[:, :, 0]
