"""Softmax partials by PyTorch's fused CPU attention: the prefill's reads on a CPU.

The reference (:mod:`.reference`) materialises the ``[B, H, L, N]`` scores, masks them and
exponentiates them in separate passes; on a CPU a prefill block of 256 queries spends most of
its read there (docs/performance.md, "A prefill's chunk"). PyTorch's flash attention for CPU
(``aten._scaled_dot_product_flash_attention_for_cpu``) computes the same softmax in one pass
over tiles and returns the output with its log-sum-exp, which are partials of their own:
``num = o, den = 1, max = logsumexp`` (``num / den`` and ``den · e^max`` are the reference's).
Rows that see no key get the reference's ``num = 0, den = 0, max = -inf``.

Reads of fewer than :data:`MIN_QUERIES` queries (a decoded token) go to the reference: there
the fused call costs more than it saves. The reference stays the definition; this form is
tested against it (``tests/kernels/test_exact_attention_fused.py``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..ragged import RaggedSlots
from . import reference

__all__ = ["MIN_QUERIES", "softmax_partial"]

MIN_QUERIES = 16
"""Queries per read from which the fused call is taken (fewer: the reference)."""


def softmax_partial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    ragged: Optional[RaggedSlots] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`lola.kernels.softmax_partial` by fused attention (same arguments and results).

    Query head ``h`` reads storage head ``h // G``: the ``G`` query heads of a storage head
    and their ``L`` queries are the ``G·L`` rows of one attention over that head's keys (no
    key is copied per query head). A ragged run is read head by head, each head over its dense
    slots and its own range of the run.
    """
    B, H, L, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    if L < MIN_QUERIES or N + (0 if ragged is None else ragged.pos.shape[1]) == 0:
        return reference.softmax_partial(q, k, v, q_pos, k_pos, scale, ragged)
    G = H // Hs
    qf = q.float()
    if ragged is None:
        o, lse, seen = _attend(qf.reshape(B, Hs, G * L, D), k.float(), v.float(), q_pos, k_pos, G, scale)
    else:
        outs = []
        for h, (a, b) in enumerate(zip(ragged.offsets, ragged.offsets[1:])):
            kh = torch.cat([k[:, h], ragged.k[:, a:b]], dim=1).float()[:, None]  # [B, 1, N + S_h, D]
            vh = torch.cat([v[:, h], ragged.v[:, a:b]], dim=1).float()[:, None]
            ph = torch.cat([k_pos[:, h], ragged.pos[:, a:b]], dim=1)[:, None]  # [B, 1, N + S_h]
            outs.append(_attend_head(qf[:, h * G : (h + 1) * G], kh, vh, q_pos, ph, scale))
        o, lse, seen = (torch.cat(x, dim=1) for x in zip(*outs))
    o, lse, seen = o.reshape(B, H, L, D), lse.reshape(B, H, L), seen.reshape(B, H, L)
    num = torch.where(seen[..., None], o, 0.0)
    return num, seen.float(), torch.where(seen, lse, float("-inf"))


def _attend(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, G: int, scale: float
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One fused attention of ``qg [B, Hs, G·L, D]`` (fp32) over ``k, v [B, Hs, N, D]`` (fp32)
    with key ``j`` visible to a query iff ``0 <= k_pos[j] <= q_pos``: ``o [B, Hs, G·L, D]``,
    ``logsumexp [B, Hs, G·L]`` and whether the row saw any key ``[B, Hs, G·L]``."""
    B, Hs, rows, _ = qg.shape
    L = rows // G
    kp = k_pos[:, :, None, :]  # [B, Hs, 1, N]
    # (the kernel takes an additive mask of the query's dtype, one row per query row)
    mask = (
        torch.where((kp >= 0) & (kp <= q_pos[:, None, :, None]), 0.0, float("-inf"))[:, :, None]
        .expand(B, Hs, G, L, k.shape[2])
        .reshape(B, Hs, rows, k.shape[2])
    )
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, k, v, 0.0, False, attn_mask=mask, scale=scale)
    seen = _seen(q_pos, k_pos)[:, :, None].expand(B, Hs, G, L).reshape(B, Hs, rows)
    return o, lse, seen


def _attend_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_attend` of the ``G`` query heads ``q [B, G, L, D]`` (fp32) of one storage head,
    ``k, v [B, 1, N, D]`` (fp32), ``k_pos [B, 1, N]``: the keys are broadcast to the ``G`` heads
    and one ``[B, 1, L, N]`` mask to every head (nothing copied per query head). Returns ``o [B,
    G, L, D]``, ``logsumexp [B, G, L]`` and whether the row saw any key ``[B, G, L]``."""
    B, G, L, D = q.shape
    N = k.shape[2]
    kp = k_pos[:, :, None, :]  # [B, 1, 1, N]
    mask = torch.where((kp >= 0) & (kp <= q_pos[:, None, :, None]), 0.0, float("-inf"))  # [B, 1, L, N]
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k.expand(B, G, N, D), v.expand(B, G, N, D), 0.0, False, attn_mask=mask, scale=scale)
    return o, lse, _seen(q_pos, k_pos).expand(B, G, L)


def _seen(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``[B, Hs, L]``: whether query ``l`` sees any key, i.e. the earliest stored key
    (``k_pos [B, Hs, N]``, ``-1`` empty) is at or before its position ``q_pos [B, L]`` (no
    ``[L, N]`` pass)."""
    if k_pos.shape[-1] == 0:
        return torch.zeros(*k_pos.shape[:2], q_pos.shape[1], dtype=torch.bool, device=k_pos.device)
    first = torch.where(k_pos >= 0, k_pos, torch.iinfo(k_pos.dtype).max).amin(-1)  # [B, Hs]
    return first[:, :, None] <= q_pos[:, None, :]  # (an empty row's first is the largest int)
