"""Masked softmax-attention partials (numerator, denominator, running max)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..dispatch import implementation
from ..ragged import RaggedSlots, check_ragged
from ..utils import check_integer, check_query_and_cache, check_same_device


def check_inputs(q, k, v, q_pos, k_pos, ragged=None) -> None:
    c = check_query_and_cache(q, "B H L D", k, v, k_pos)
    c.check("q_pos", q_pos, "B L")
    check_integer("q_pos", q_pos)
    check_same_device([("q", q), ("k", k), ("v", v), ("q_pos", q_pos), ("k_pos", k_pos)])
    if ragged is not None:
        check_ragged("ragged", ragged, k, v)


def softmax_partial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    *,
    ragged: Optional[RaggedSlots] = None,
    check: bool = True,
    exact_max: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact-attention partials over a (sparse, possibly partly empty) key cache.

    Query head ``h`` uses k/v head ``h // (H // Hs)``. Key ``j`` is visible to query ``i``
    iff ``k_pos[j] >= 0 and k_pos[j] <= q_pos[i]``. With ``s_ij = scale * q_i . k_j`` (fp32)
    and ``m_i`` the max visible ``s_ij``: ``num_i = sum exp(s_ij - m_i) v_j``,
    ``den_i = sum exp(s_ij - m_i)``. Nothing visible gives ``num = 0, den = 0, max = -inf``.

    Args:
        q: ``[B, H, L, D]`` queries (fp32/fp16/bf16).
        k, v: ``[B, Hs, N, D]`` keys and values.
        q_pos: ``[B, L]`` int64 positions of the queries.
        k_pos: ``[B, Hs, N]`` int64 positions of the keys, ``-1`` = empty slot.
        scale: logit scale (e.g. ``D ** -0.5``).
        ragged: extra slots per storage head (:class:`~lola.kernels.RaggedSlots`: ``k, v
            [B, S, D]``, ``pos [B, S]``, head ``h`` owns ``offsets[h]:offsets[h + 1]``), seen
            like the dense slots of their head; the same as concatenating
            :func:`~lola.kernels.pad_ragged` to the cache along ``N``. ``None``: only the cache.
        check: validate shapes, dtypes and devices first (``False`` only for callers that
            built the inputs themselves, such as the LoLA engine on its decode path).
        exact_max: ``max`` is the largest visible score. ``False`` lets the partials carry
            another shift (``num / den`` and ``den · e^max`` are the same), which a CPU then
            computes by fused attention (:mod:`.fused`, ``max`` its log-sum-exp): for callers
            that read only those, as the ``lola_authors`` and ``softmax_only`` rules do.

    Returns:
        ``(num [B, H, L, D], den [B, H, L], max [B, H, L])``, all fp32.
    """
    if check:
        check_inputs(q, k, v, q_pos, k_pos, ragged)
    extra = () if ragged is None else (ragged.k, ragged.v, ragged.pos)  # they decide the backend too
    fn = implementation("softmax_partial", q, k, v, *extra, fused=not exact_max)
    return fn(q, k, v, q_pos, k_pos, scale, ragged)


__all__ = ["softmax_partial", "check_inputs"]
