"""Flash-style softmax partials in Triton: tiled over keys with a running max.

One program per (query tile, batch*head). The ``[L, N]`` scores never leave registers;
rows with nothing visible keep ``max = -inf`` and shift by 0 so no NaN appears. With a ragged
run, the same online softmax goes on over the program's storage head's own range of it.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..ragged import RaggedSlots, kernel_args
from ..triton_utils import cache_tile_scores, device_guard, online_softmax_tile, ragged_range, slot_tile_scores
from ..utils import block_size, common_float_dtype, dot_precision


@triton.jit(do_not_specialize=["L", "N", "S"])  # sizes vary per call: no recompiles
def softmax_partial_fwd_kernel(
    q,
    k,
    v,
    q_pos,
    k_pos,
    rk,
    rv,
    r_pos,
    r_offsets,
    num,
    den,
    mx,
    scale,
    L,
    N,
    S,
    H: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BL: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_RAGGED: tl.constexpr,
):
    # rk, rv: [B, S, D], r_pos: [B, S], r_offsets: [Hs + 1] (a ragged run; unread without HAS_RAGGED)
    i_l, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_bh64 = tl.cast(i_bh, tl.int64)
    i_bkv = tl.cast(i_b, tl.int64) * (H // G) + i_h // G  # the shared key/value head
    o_l = i_l * BL + tl.arange(0, BL)
    m_l = o_l < L
    o_d = tl.arange(0, BD)
    m_d = o_d < D

    b_q = tl.load(q + (i_bh64 * L + o_l[:, None]) * D + o_d[None, :], mask=m_l[:, None] & m_d[None, :], other=0.0)
    # Padding rows get position -1: they see nothing.
    b_qpos = tl.load(q_pos + tl.cast(i_b, tl.int64) * L + o_l, mask=m_l, other=-1)

    b_m = tl.full([BL], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BL], dtype=tl.float32)
    b_acc = tl.zeros([BL, BD], dtype=tl.float32)
    for i_n in range(0, N, BN):
        b_s, b_v, b_kpos = cache_tile_scores(b_q, k, v, k_pos, i_bkv, i_n, N, scale, o_d, m_d, D, BN, PRECISION)
        visible = (b_kpos[None, :] >= 0) & (b_kpos[None, :] <= b_qpos[:, None])
        b_s = tl.where(visible, b_s, float("-inf"))
        b_m, b_l, b_acc = online_softmax_tile(b_m, b_l, b_acc, b_s, b_v, PRECISION)
    if HAS_RAGGED:
        # The same softmax over this k/v head's range of the row's ragged run (no padding read).
        r_start, r_len = ragged_range(r_offsets, i_h // G)
        r_base = tl.cast(i_b, tl.int64) * S + r_start
        for i_n in range(0, r_len, BN):
            b_s, b_v, b_kpos = slot_tile_scores(b_q, rk, rv, r_pos, r_base, i_n, r_len, scale, o_d, m_d, D, BN, PRECISION)
            visible = (b_kpos[None, :] >= 0) & (b_kpos[None, :] <= b_qpos[:, None])
            b_s = tl.where(visible, b_s, float("-inf"))
            b_m, b_l, b_acc = online_softmax_tile(b_m, b_l, b_acc, b_s, b_v, PRECISION)

    tl.store(num + (i_bh64 * L + o_l[:, None]) * D + o_d[None, :], b_acc, mask=m_l[:, None] & m_d[None, :])
    tl.store(den + i_bh64 * L + o_l, b_l, mask=m_l)
    tl.store(mx + i_bh64 * L + o_l, b_m, mask=m_l)


def softmax_partial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    ragged: Optional[RaggedSlots] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of :func:`..reference.softmax_partial` (same contract).

    Args:
        q: ``[B, H, L, D]``; k, v: ``[B, Hs, N, D]``; q_pos: ``[B, L]``; k_pos: ``[B, Hs, N]``;
        ragged: ``k, v [B, S, D]``, ``pos [B, S]``, ``offsets`` (``Hs + 1``), or ``None``.

    Returns:
        ``num [B, H, L, D]``, ``den [B, H, L]``, ``max [B, H, L]``, all fp32.
    """
    B, H, L, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    dtype = common_float_dtype(q, k, v)
    q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
    q_pos = q_pos.to(torch.int64).contiguous()
    k_pos = k_pos.to(torch.int64).contiguous()
    f32 = dict(dtype=torch.float32, device=q.device)
    num = torch.empty(B, H, L, D, **f32)
    den = torch.empty(B, H, L, **f32)
    mx = torch.empty(B, H, L, **f32)
    if B * H * L == 0:
        return num, den, mx
    rk, rv, r_pos, r_offsets, S = kernel_args(ragged, q, dtype)

    BD = block_size(D)
    BL = block_size(L, hi=64 if BD <= 128 else 32)
    BN = 64 if BD <= 64 else 32
    grid = (triton.cdiv(L, BL), B * H)
    with device_guard(q):
        softmax_partial_fwd_kernel[grid](
            q,
            k,
            v,
            q_pos,
            k_pos,
            rk,
            rv,
            r_pos,
            r_offsets,
            num,
            den,
            mx,
            float(scale),
            L,
            N,
            S,
            H=H,
            G=H // Hs,
            D=D,
            BL=BL,
            BN=BN,
            BD=BD,
            PRECISION=dot_precision(dtype),
            HAS_RAGGED=S > 0,
            num_warps=4 if BL * BD <= 64 * 64 else 8,
            num_stages=2,
        )
    return num, den, mx
