"""One-launch LoLA decode step in Triton.

One program per (batch, k/v head) serves the ``G = H // Hs`` query heads sharing that
k/v head, so the cache is read once (flash-decoding's grouping; the G rows are padded
to 16 for ``tl.dot``). The program runs the online softmax over the cache tiles, reads
each head's fp32 state ``H [F, D]`` / ``s [F]`` for the linear part and mixes in
registers: only ``o [B, H, D]`` is written. A ragged run's range of the k/v head is read
after its cache, in the same online softmax.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from lola.core.mixing import check_mixing

from ..ragged import RaggedSlots, kernel_args
from ..triton_utils import autotune_configs, cache_tile_scores, device_guard, online_softmax_tile, ragged_range, slot_tile_scores
from ..utils import block_size, common_float_dtype, dot_precision


@triton.autotune(
    configs=autotune_configs(
        [triton.Config({"BN": BN}, num_warps=w, num_stages=st) for BN, w, st in ((32, 4, 2), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 8, 2), (128, 4, 3))],
        triton.Config({"BN": 64}, num_warps=4, num_stages=2),
    ),
    # N and S are left out on purpose: they grow every step and would retune each time.
    key=["G", "D", "F", "MIXING", "HAS_RAGGED"],
)
@triton.jit(do_not_specialize=["N", "S"])  # sizes vary per call: no recompiles
def decode_step_fwd_kernel(
    q,
    k,
    v,
    k_pos,
    rk,
    rv,
    r_pos,
    r_offsets,
    fq,
    h,
    s,
    gate,
    cap,
    o,
    scale,
    N,
    S,
    Hs: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    F: tl.constexpr,
    BG: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    BF: tl.constexpr,
    MIXING: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_RAGGED: tl.constexpr,
    HAS_CAP: tl.constexpr,
):
    # MIXING: 0 lolcats, 1 lolcats_affine, 2 lola_authors, 3 softmax_only
    # rk, rv: [B, S, D], r_pos: [B, S], r_offsets: [Hs + 1] (a ragged run; unread without HAS_RAGGED)
    i_bkv = tl.program_id(0)
    i_b, i_hs = i_bkv // Hs, i_bkv % Hs
    i_bkv64 = tl.cast(i_bkv, tl.int64)
    o_g = tl.arange(0, BG)
    m_g = o_g < G
    o_h = i_hs * G + o_g  # query heads of this group
    o_row = tl.cast(i_b, tl.int64) * (Hs * G) + o_h  # flat (b, h)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_gd = m_g[:, None] & m_d[None, :]

    # ---- exact part: online softmax over the cache -------------------------------
    b_q = tl.load(q + o_row[:, None] * D + o_d[None, :], mask=m_gd, other=0.0)
    b_m = tl.full([BG], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BG], dtype=tl.float32)
    b_acc = tl.zeros([BG, BD], dtype=tl.float32)
    for i_n in range(0, N, BN):
        b_s, b_v, b_kpos = cache_tile_scores(b_q, k, v, k_pos, i_bkv64, i_n, N, scale, o_d, m_d, D, BN, PRECISION)
        b_s = tl.where((b_kpos >= 0)[None, :], b_s, float("-inf"))
        b_m, b_l, b_acc = online_softmax_tile(b_m, b_l, b_acc, b_s, b_v, PRECISION)
    if HAS_RAGGED:
        # The same softmax over this k/v head's range of the row's ragged run (no padding read).
        r_start, r_len = ragged_range(r_offsets, i_hs)
        r_base = tl.cast(i_b, tl.int64) * S + r_start
        for i_n in range(0, r_len, BN):
            b_s, b_v, b_kpos = slot_tile_scores(b_q, rk, rv, r_pos, r_base, i_n, r_len, scale, o_d, m_d, D, BN, PRECISION)
            b_s = tl.where((b_kpos >= 0)[None, :], b_s, float("-inf"))
            b_m, b_l, b_acc = online_softmax_tile(b_m, b_l, b_acc, b_s, b_v, PRECISION)

    if MIXING == 3:
        b_num = b_acc
        b_den = b_l
    else:
        # ---- linear part: fq^T H and fq^T s per query head (fp32 matvecs) --------
        b_lnum = tl.zeros([BG, BD], dtype=tl.float32)
        b_lden = tl.zeros([BG], dtype=tl.float32)
        for g in range(G):
            i_row = tl.cast(i_b, tl.int64) * (Hs * G) + i_hs * G + g
            b_rnum = tl.zeros([BD], dtype=tl.float32)
            b_rden = tl.zeros([BF], dtype=tl.float32)
            for i_f in range(0, F, BF):
                o_f = i_f + tl.arange(0, BF)
                m_f = o_f < F
                b_fq = tl.load(fq + i_row * F + o_f, mask=m_f, other=0.0).to(tl.float32)
                b_h = tl.load(h + i_row * F * D + o_f[:, None] * D + o_d[None, :], mask=m_f[:, None] & m_d[None, :], other=0.0)
                b_st = tl.load(s + i_row * F + o_f, mask=m_f, other=0.0)
                b_rnum += tl.sum(b_fq[:, None] * b_h, axis=0)
                b_rden += b_fq * b_st
            b_lnum = tl.where((o_g == g)[:, None], b_rnum[None, :], b_lnum)
            b_lden = tl.where(o_g == g, tl.sum(b_rden, axis=0), b_lden)

        # ---- mixing ---------------------------------------------------------------
        b_w = tl.load(gate + o_h, mask=m_g, other=0.0).to(tl.float32)
        if MIXING == 0:
            b_a = b_w
            b_b = tl.full([BG], 1.0, dtype=tl.float32)
        elif MIXING == 1:
            b_a = b_w
            b_b = 1.0 - b_w
        else:
            # unshifted softmax sums e^m E, everything scaled by e^{-c}, c = max(m, 0)
            b_c = tl.maximum(b_m, 0.0)
            b_a = b_w * tl.exp(b_m - b_c)
            b_b = (1.0 - b_w) * tl.exp(-b_c)
        b_num = b_a[:, None] * b_acc + b_b[:, None] * b_lnum
        b_den = b_a * b_l + b_b * b_lden

    b_zero = b_den == 0.0
    b_o = b_num / tl.where(b_zero, 1.0, b_den)[:, None]
    b_o = tl.where(b_zero[:, None], 0.0, b_o)
    if HAS_CAP:
        # The state's share b·L_den / (a·E_den + b·L_den) above the row's cap c (where an exact
        # slot is visible): the two reads mixed at c instead (lola.core.mixing.mix_partials).
        b_c = tl.load(cap + i_b).to(tl.float32)
        b_lin = b_b * b_lden
        b_share = tl.where(b_zero, 0.0, b_lin / tl.where(b_zero, 1.0, b_den))
        b_lread = tl.where((b_lden == 0.0)[:, None], 0.0, b_lnum / tl.where(b_lden == 0.0, 1.0, b_lden)[:, None])
        b_eread = tl.where((b_l == 0.0)[:, None], 0.0, b_acc / tl.where(b_l == 0.0, 1.0, b_l)[:, None])
        b_capped = b_c * b_lread + (1.0 - b_c) * b_eread
        b_o = tl.where(((b_share > b_c) & (b_l > 0.0))[:, None], b_capped, b_o)
    tl.store(o + o_row[:, None] * D + o_d[None, :], b_o, mask=m_gd)


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
    """Triton version of :func:`..reference.decode_step` (same contract).

    Args:
        q: ``[B, H, D]``; k, v: ``[B, Hs, N, D]``; k_pos: ``[B, Hs, N]``; fq: ``[B, H, F]``;
        H: ``[B, H, F, D]`` fp32; s: ``[B, H, F]`` fp32; gate: ``[H]``;
        ragged: ``k, v [B, S, D]``, ``pos [B, S]``, ``offsets`` (``Hs + 1``), or ``None``.
        share_cap: ``[B]`` the linear state's largest share per row, or ``None``.

    Returns:
        ``o [B, H, D]`` fp32.
    """
    rule = check_mixing(mixing)
    B, Hq, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    G = Hq // Hs
    dtype = common_float_dtype(q, k, v)
    q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
    k_pos = k_pos.to(torch.int64).contiguous()
    gate = gate.float().contiguous()
    o = torch.empty(B, Hq, D, dtype=torch.float32, device=q.device)
    if B * Hq == 0:
        return o
    if mixing == "softmax_only":
        F = 16
        fq = H = s = q  # never read
    else:
        F = fq.shape[-1]
        fq, H, s = fq.contiguous(), H.float().contiguous(), s.float().contiguous()
    rk, rv, r_pos, r_offsets, S = kernel_args(ragged, q, dtype)
    has_cap = share_cap is not None and mixing != "softmax_only"
    cap = share_cap.float().contiguous() if has_cap else gate  # (never read without HAS_CAP)
    BD = block_size(D)
    with device_guard(q):
        decode_step_fwd_kernel[(B * Hs,)](
            q,
            k,
            v,
            k_pos,
            rk,
            rv,
            r_pos,
            r_offsets,
            fq,
            H,
            s,
            gate,
            cap,
            o,
            float(scale),
            N,
            S,
            Hs=Hs,
            G=G,
            D=D,
            F=F,
            BG=block_size(G),
            BD=BD,
            BF=block_size(F, hi=64 if BD <= 64 else 32),
            MIXING=rule,
            PRECISION=dot_precision(dtype),
            HAS_RAGGED=S > 0,
            HAS_CAP=has_cap,
        )
    return o
