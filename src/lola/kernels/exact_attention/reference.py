"""Masked softmax attention *partials* (numerator, denominator, max): the definition.

Query head ``h`` reads key/value head ``h // (H // Hs)`` (grouped-query attention).
Key ``j`` is visible to query ``i`` iff ``k_pos[j] >= 0`` and ``k_pos[j] <= q_pos[i]``
(``-1`` marks an empty cache slot). With ``s_ij = scale * q_i . k_j`` in fp32::

    m_i   = max_{j visible} s_ij                        (-inf if nothing is visible)
    den_i = sum_{j visible} exp(s_ij - m_i)             (0 if nothing is visible)
    num_i = sum_{j visible} exp(s_ij - m_i) v_j         (0 if nothing is visible)

Partials from disjoint key sets combine exactly (flash-decoding style), which is how
the exact (sparse cache / window) part is mixed with the linear part.

A ragged run (:class:`lola.kernels.RaggedSlots`) adds slots ``offsets[h]:offsets[h + 1]`` to
storage head ``h``'s cache: the same partials over both.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from ..ragged import RaggedSlots


def masked_logits(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor | None, k_pos: torch.Tensor, scale: float) -> torch.Tensor:
    """Scores ``s_ij = scale * q_i . k_j`` (fp32), ``-inf`` where key ``j`` is invisible to query ``i``.

    Args:
        q: ``[B, H, L, D]`` queries.
        k: ``[B, Hs, N, D]`` keys, ``H % Hs == 0``.
        q_pos: ``[B, L]`` int64 query positions, or ``None``: every stored key is visible
            (a decode query, newer than all of them).
        k_pos: ``[B, Hs, N]`` int64 key positions, ``-1`` = empty slot.
        scale: logit scale.

    Returns:
        ``[B, H, L, N]`` fp32.
    """
    B, H, L, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    G = H // Hs
    # The G query heads of a group and the L queries form the rows of one matmul per storage
    # head, so k is read once (no broadcast copies).
    qf = q.float().reshape(B, Hs, G * L, D)
    s = scale * (qf @ k.float().transpose(-1, -2))  # [B, Hs, G*L, N]
    if q_pos is None:
        return s.masked_fill((k_pos < 0)[:, :, None, :], float("-inf")).view(B, H, L, N)
    kp = k_pos[:, :, None, None, :]
    visible = (kp >= 0) & (kp <= q_pos[:, None, None, :, None])  # [B, Hs, 1, L, N]
    return s.view(B, Hs, G, L, N).masked_fill(~visible, float("-inf")).view(B, H, L, N)


def partials_from_logits(s: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax partials from masked scores.

    Args:
        s: ``[B, H, L, N]`` fp32 scores, ``-inf`` where invisible (see :func:`masked_logits`).
        v: ``[B, Hs, N, D]`` values, ``H % Hs == 0``.

    Returns:
        ``num [B, H, L, D]``, ``den [B, H, L]``, ``max [B, H, L]``, all fp32.
    """
    B, H, L, N = s.shape
    Hs, D = v.shape[1], v.shape[-1]
    s = s.reshape(B, Hs, (H // Hs) * L, N)
    m = s.amax(-1) if N > 0 else s.new_full(s.shape[:-1], float("-inf"))
    # Rows with nothing visible keep m = -inf but shift by a finite number, so exp(-inf) = 0,
    # not NaN (any visible score makes m finite, and then the clamp changes nothing).
    p = torch.exp(s - m.clamp_min(torch.finfo(torch.float32).min)[..., None])
    num = p @ v.float()
    den = p.sum(-1)
    return num.reshape(B, H, L, D), den.reshape(B, H, L), m.reshape(B, H, L)


RAGGED_BY_HEAD_WORK = 1 << 16
"""Scores of other storage heads' slots (``B·G·L·S·(Hs − 1)``) above which a read of a ragged run
is computed head by head (:func:`partials_ragged_by_head`) rather than masked
(:func:`partials_ragged_masked`). On two CPU cores the head-by-head form costs a few tenths
of a millisecond more in calls and saves the masked scores: a prefill block of 64 queries
over a calibrated layer's run of 1,260 slots took 2.3 ms against 8.4 ms masked, one decode
query 0.45 ms against 0.30 ms (``python benchmarks/ragged_reads.py --feature-maps
smollm2-135m-instruct``, which also shows the form picked)."""


def partials_with_ragged(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: Optional[torch.Tensor], k_pos: torch.Tensor, scale: float, ragged: RaggedSlots
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partials over each storage head's dense slots and its own range of the ragged run.

    Two forms compute the same partials: the run masked per head (few calls, every query head
    scores the whole run) for short reads, head by head (each scores its own range) for reads
    whose masked work passes :data:`RAGGED_BY_HEAD_WORK`.

    Args:
        q: ``[B, H, L, D]``; k, v: ``[B, Hs, N, D]``; q_pos: ``[B, L]`` or ``None`` (every
            stored key visible, see :func:`masked_logits`); k_pos: ``[B, Hs, N]``.
        ragged: ``k, v [B, S, D]``, ``pos [B, S]``, ``offsets`` (``Hs + 1`` ints).

    Returns:
        ``num [B, H, L, D]``, ``den [B, H, L]``, ``max [B, H, L]``, all fp32.
    """
    B, H, L, _ = q.shape
    Hs = k.shape[1]
    if q.shape[0] * H * L * ragged.pos.shape[1] * (Hs - 1) // Hs >= RAGGED_BY_HEAD_WORK:
        return partials_ragged_by_head(q, k, v, q_pos, k_pos, scale, ragged)
    return partials_ragged_masked(q, k, v, q_pos, k_pos, scale, ragged)


def partials_ragged_masked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: Optional[torch.Tensor], k_pos: torch.Tensor, scale: float, ragged: RaggedSlots
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`partials_with_ragged` with every query head scoring the whole run and the slots of
    other storage heads masked like empty ones: two products per read, whatever ``Hs`` (the
    fixed cost of a call dominates short reads on a CPU), nothing padded held."""
    B, H, L, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    S = ragged.pos.shape[1]
    G = H // Hs
    dense = masked_logits(q, k, q_pos, k_pos, scale).view(B, Hs, G, L, N)
    run = scale * (q.float().reshape(B, Hs, G * L, D) @ ragged.k.float().transpose(-1, -2)[:, None])  # [B, Hs, G*L, S]
    rp = ragged.pos[:, None, None, None, :]  # [B, 1, 1, 1, S]
    visible = (_slot_heads(tuple(ragged.offsets), q.device) == torch.arange(Hs, device=q.device)[:, None])[None, :, None, None, :] & (rp >= 0)
    if q_pos is not None:
        visible = visible & (rp <= q_pos[:, None, None, :, None])
    run = run.view(B, Hs, G, L, S).masked_fill(~visible, float("-inf"))
    s = torch.cat([dense, run], dim=-1).view(B, Hs, G * L, N + S)
    m = s.amax(-1) if N + S > 0 else s.new_full(s.shape[:-1], float("-inf"))
    p = torch.exp(s - m.clamp_min(torch.finfo(torch.float32).min)[..., None])  # as partials_from_logits
    num = p[..., :N] @ v.float() + p[..., N:] @ ragged.v.float()[:, None]
    return num.reshape(B, H, L, D), p.sum(-1).reshape(B, H, L), m.reshape(B, H, L)


def partials_ragged_by_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: Optional[torch.Tensor], k_pos: torch.Tensor, scale: float, ragged: RaggedSlots
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`partials_with_ragged` with each storage head's queries scoring only its own range of
    the run (one product per storage head): the work of ``Σ λ_h`` slots, not ``Hs × Σ λ_h``,
    for a few calls per head more (a prefill block's many queries over a long run)."""
    B, H, L, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    G = H // Hs
    qf = q.float().reshape(B, Hs, G * L, D)
    dense = masked_logits(q, k, q_pos, k_pos, scale).view(B, Hs, G * L, N)
    m_dense = dense.amax(-1) if N > 0 else dense.new_full(dense.shape[:-1], float("-inf"))  # [B, Hs, G*L]
    runs, maxima = [], []
    for h, (a, b) in enumerate(zip(ragged.offsets, ragged.offsets[1:])):
        s = scale * (qf[:, h] @ ragged.k[:, a:b].float().transpose(-1, -2))  # [B, G*L, S_h]
        rp = ragged.pos[:, None, None, a:b]  # [B, 1, 1, S_h]
        visible = (rp >= 0) if q_pos is None else (rp >= 0) & (rp <= q_pos[:, None, :, None])  # [B, 1 or G, L, S_h]
        s = s.view(B, G, L, b - a).masked_fill(~visible, float("-inf")).view(B, G * L, b - a)
        runs.append(s)
        maxima.append(torch.maximum(m_dense[:, h], s.amax(-1)) if b > a else m_dense[:, h])
    m = torch.stack(maxima, 1)  # (no per-head index tensor: nothing copied to the device per call)
    shift = m.clamp_min(torch.finfo(torch.float32).min)[..., None]  # as partials_from_logits
    p = torch.exp(dense - shift)
    num, den = p @ v.float(), p.sum(-1)  # [B, Hs, G*L, D], [B, Hs, G*L]
    nums, dens = [], []
    for h, (a, b) in enumerate(zip(ragged.offsets, ragged.offsets[1:])):
        ph = torch.exp(runs[h] - shift[:, h])
        nums.append(num[:, h] + ph @ ragged.v[:, a:b].float())
        dens.append(den[:, h] + ph.sum(-1))
    return torch.stack(nums, 1).reshape(B, H, L, D), torch.stack(dens, 1).reshape(B, H, L), m.reshape(B, H, L)


@functools.lru_cache(maxsize=256)
def _slot_heads(offsets: Tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[S]`` int64: the storage head owning each slot of a run with these offsets."""
    widths = torch.tensor([b - a for a, b in zip(offsets, offsets[1:])])
    return torch.repeat_interleave(torch.arange(len(widths)), widths).to(device)


def softmax_partial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    ragged: Optional[RaggedSlots] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference softmax partials (materialises the ``[B, H, L, N]`` scores).

    Args:
        q: ``[B, H, L, D]`` queries.
        k, v: ``[B, Hs, N, D]`` keys / values, ``H % Hs == 0``.
        q_pos: ``[B, L]`` int64 query positions.
        k_pos: ``[B, Hs, N]`` int64 key positions, ``-1`` = empty slot.
        scale: logit scale.
        ragged: extra slots per storage head (see :func:`partials_with_ragged`), or ``None``.

    Returns:
        ``num [B, H, L, D]``, ``den [B, H, L]``, ``max [B, H, L]``, all fp32.
    """
    if ragged is not None:
        return partials_with_ragged(q, k, v, q_pos, k_pos, scale, ragged)
    return partials_from_logits(masked_logits(q, k, q_pos, k_pos, scale), v)
