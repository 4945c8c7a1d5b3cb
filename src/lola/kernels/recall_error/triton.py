"""Fused self-recall error in Triton: ``v_hat`` lives only in registers.

One program per (token tile, batch*head): ``fk_tile @ H`` accumulates over F tiles,
is divided by ``fk_tile . s + eps`` and reduced to a squared error per D tile; only
``err [B, H, N]`` is written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_utils import device_guard, dot
from ..utils import block_size, dot_precision


@triton.jit(do_not_specialize=["N"])  # sizes vary per call: no recompiles
def self_recall_error_fwd_kernel(
    fk,
    v,
    h,
    s,
    err,
    eps,
    N,
    F: tl.constexpr,
    D: tl.constexpr,
    BN: tl.constexpr,
    BF: tl.constexpr,
    BD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh64 = tl.cast(i_bh, tl.int64)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N

    b_err = tl.zeros([BN], dtype=tl.float32)
    for i_d in range(0, D, BD):
        o_d = i_d + tl.arange(0, BD)
        m_d = o_d < D
        b_num = tl.zeros([BN, BD], dtype=tl.float32)
        # The denominator is recomputed per D tile: fk is loaded for the dot anyway
        # and D usually fits one tile.
        b_den = tl.zeros([BN], dtype=tl.float32)
        for i_f in range(0, F, BF):
            o_f = i_f + tl.arange(0, BF)
            m_f = o_f < F
            b_fk = tl.load(fk + (i_bh64 * N + o_n[:, None]) * F + o_f[None, :], mask=m_n[:, None] & m_f[None, :], other=0.0).to(tl.float32)
            b_h = tl.load(h + i_bh64 * F * D + o_f[:, None] * D + o_d[None, :], mask=m_f[:, None] & m_d[None, :], other=0.0)
            b_s = tl.load(s + i_bh64 * F + o_f, mask=m_f, other=0.0)
            b_num += dot(b_fk, b_h, PRECISION)
            b_den += tl.sum(b_fk * b_s[None, :], axis=1)
        b_v = tl.load(v + (i_bh64 * N + o_n[:, None]) * D + o_d[None, :], mask=m_n[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_diff = b_v - b_num / (b_den + eps)[:, None]  # padded columns are 0 - 0
        b_err += tl.sum(b_diff * b_diff, axis=1)
    tl.store(err + i_bh64 * N + o_n, tl.sqrt(b_err), mask=m_n)


def self_recall_error(
    fk: torch.Tensor,
    v: torch.Tensor,
    H: torch.Tensor,
    s: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Triton version of :func:`..reference.self_recall_error` (same contract).

    Args:
        fk: ``[B, H, N, F]``; v: ``[B, H, N, D]``; H: ``[B, H, F, D]`` fp32; s: ``[B, H, F]`` fp32.

    Returns:
        ``err [B, H, N]`` fp32.
    """
    B, Hh, N, F = fk.shape
    D = v.shape[-1]
    fk, v = fk.contiguous(), v.contiguous()
    H, s = H.float().contiguous(), s.float().contiguous()
    err = torch.empty(B, Hh, N, dtype=torch.float32, device=fk.device)
    if B * Hh * N == 0:
        return err
    BD = block_size(D, hi=128)
    BF = block_size(F, hi=64 if BD <= 64 else 32)
    BN = 64
    grid = (triton.cdiv(N, BN), B * Hh)
    with device_guard(fk):
        self_recall_error_fwd_kernel[grid](
            fk,
            v,
            H,
            s,
            err,
            float(eps),
            N,
            F=F,
            D=D,
            BN=BN,
            BF=BF,
            BD=BD,
            # fp32 x fp32 dot (fk upcast to meet the fp32 state): tf32x3 for fp32 inputs,
            # tf32 for 16-bit ones.
            PRECISION=dot_precision(fk.dtype),
            num_warps=4,
            num_stages=2,
        )
    return err
