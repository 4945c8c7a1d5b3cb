"""Chunk-parallel causal linear attention in Triton (fla-style, two launches).

1. ``chunk_state_fwd_kernel``: one program per (F tile, D tile, batch*head) walks the
   chunks in order and writes the state *entering* every chunk, ``h [B, H, NT, F, D]``
   and ``s [B, H, NT, F]`` (plus the final state).
2. ``chunk_output_fwd_kernel``: one program per (D tile, chunk, batch*head), all in
   parallel: ``num = fq h + tril(fq fk^T) v``, ``den = fq s + rowsum(tril(fq fk^T))``.

All states are fp32, including the per-chunk ones (fla keeps those in the input dtype,
which saves memory traffic but rounds the whole history to 8 mantissa bits; the saving is
in docs/performance.md, "Triton kernels on an H200").
For 16-bit inputs ``fq h`` and ``A v`` then run as tf32 tensor-core dots; fp32 inputs
use tf32x3 dots (fp32 accuracy) everywhere.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..triton_utils import autotune_configs, device_guard, dot
from ..utils import common_float_dtype, dot_precision

CHUNK_SIZE = 64


@triton.autotune(
    configs=autotune_configs(
        # few programs walk the chunks sequentially: smaller tiles buy parallelism
        [
            triton.Config({"BK": BK, "BV": BV}, num_warps=w, num_stages=st)
            for BK, BV, w in ((32, 32, 2), (32, 64, 4), (64, 32, 4), (64, 64, 4))
            for st in (2, 3)
        ],
        triton.Config({"BK": 64, "BV": 64}, num_warps=4, num_stages=2),
    ),
    key=["F", "D"],
)
@triton.jit(do_not_specialize=["T", "NT"])  # sizes vary per call: no recompiles
def chunk_state_fwd_kernel(
    k,
    v,
    h,
    s,
    h0,
    s0,
    ht,
    st,
    T,
    NT,
    H: tl.constexpr,
    F: tl.constexpr,
    D: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_bh64 = tl.cast(i_bh, tl.int64)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < F, o_v < D
    m_kv = m_k[:, None] & m_v[None, :]
    p_hkv = o_k[:, None] * D + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    b_s0 = tl.zeros([BK], dtype=tl.float32)
    if USE_INITIAL_STATE:
        b_h += tl.load(h0 + i_bh64 * F * D + p_hkv, mask=m_kv, other=0.0)
        b_s0 += tl.load(s0 + i_bh64 * F + o_k, mask=m_k, other=0.0)
    # Key sums accumulate elementwise and are reduced where stored: a loop-carried
    # `acc += tl.sum(x)` is rewritten by Triton's sm_90 thread-locality pass to reduce
    # only after the loop, which corrupts the per-chunk values stored inside it.
    b_ks = tl.zeros([BK, BT], dtype=tl.float32)

    # Inputs are token-major: (b, t, h, f) lives at ((b * T + t) * H + h) * F + f.
    k_base = k + (tl.cast(i_b, tl.int64) * T * H + i_h) * F
    v_base = v + (tl.cast(i_b, tl.int64) * T * H + i_h) * D
    for i_t in range(NT):
        i_chunk = i_bh64 * NT + i_t
        tl.store(h + i_chunk * F * D + p_hkv, b_h, mask=m_kv)
        if i_v == 0:
            tl.store(s + i_chunk * F + o_k, b_s0 + tl.sum(b_ks, axis=1), mask=m_k)
        o_t = tl.cast(i_t, tl.int64) * BT + tl.arange(0, BT)
        m_t = o_t < T
        # fk loaded transposed, [BK, BT], so the state update is one dot.
        b_kt = tl.load(k_base + o_t[None, :] * (H * F) + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_v = tl.load(v_base + o_t[:, None] * (H * D) + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_h += dot(b_kt, b_v, PRECISION)
        b_ks += b_kt.to(tl.float32)

    if STORE_FINAL_STATE:
        tl.store(ht + i_bh64 * F * D + p_hkv, b_h, mask=m_kv)
        if i_v == 0:
            tl.store(st + i_bh64 * F + o_k, b_s0 + tl.sum(b_ks, axis=1), mask=m_k)


@triton.autotune(
    configs=autotune_configs(
        # fp32 states and A keep register pressure high: mostly 8 warps
        [
            triton.Config({"BK": BK, "BV": BV}, num_warps=w, num_stages=st)
            for BK, BV, w, st in (
                (64, 32, 4, 2),
                (64, 64, 8, 2),
                (64, 128, 8, 2),
                (128, 32, 4, 2),
                (128, 64, 8, 2),
                (128, 64, 8, 3),
            )
        ],
        triton.Config({"BK": 64, "BV": 64}, num_warps=8, num_stages=2),
    ),
    key=["F", "D"],
)
@triton.jit(do_not_specialize=["T", "NT"])  # sizes vary per call: no recompiles
def chunk_output_fwd_kernel(
    q,
    k,
    v,
    h,
    s,
    num,
    den,
    T,
    NT,
    H: tl.constexpr,
    F: tl.constexpr,
    D: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_chunk = tl.cast(i_bh, tl.int64) * NT + i_t
    tok0 = tl.cast(i_b, tl.int64) * T * H + i_h  # (b, 0, h) in token-major layout
    o_t = tl.cast(i_t, tl.int64) * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D

    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_den = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(0, F, BK):
        o_k = i_k + tl.arange(0, BK)
        m_k = o_k < F
        b_q = tl.load(q + tok0 * F + o_t[:, None] * (H * F) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_kt = tl.load(k + tok0 * F + o_t[None, :] * (H * F) + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_h = tl.load(h + i_chunk * F * D + o_k[:, None] * D + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_s = tl.load(s + i_chunk * F + o_k, mask=m_k, other=0.0)
        # inter-chunk: the state entering this chunk
        b_o += dot(b_q.to(tl.float32), b_h, PRECISION)
        b_den += tl.sum(b_q.to(tl.float32) * b_s[None, :], axis=1)
        # intra-chunk scores
        b_A += dot(b_q, b_kt, PRECISION)

    o_c = tl.arange(0, BT)
    b_A = tl.where(o_c[:, None] >= o_c[None, :], b_A, 0.0)
    b_v = tl.load(v + tok0 * D + o_t[:, None] * (H * D) + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    # tf32 for 16-bit inputs: rounding A to bf16 (as fla does) would cost ~3e-3 relative error.
    b_o += dot(b_A, b_v.to(tl.float32), PRECISION)
    tl.store(num + tok0 * D + o_t[:, None] * (H * D) + o_v[None, :], b_o, mask=m_t[:, None] & m_v[None, :])
    if i_v == 0:
        b_den += tl.sum(b_A, axis=1)
        tl.store(den + tok0 + o_t * H, b_den, mask=m_t)


def chunk_linear_attention(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    initial_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    output_final_state: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[Tuple[torch.Tensor, torch.Tensor]]]:
    """Triton version of :func:`..reference.chunk_linear_attention` (same contract).

    Args:
        fq, fk: ``[B, T, H, F]``; v: ``[B, T, H, D]`` (fp32/fp16/bf16).
        initial_state: ``(H0 [B, H, F, D], s0 [B, H, F])`` fp32 or None.

    Returns:
        ``num [B, T, H, D]`` fp32, ``den [B, T, H]`` fp32, ``(H_T, s_T)`` fp32 or None.
    """
    B, T, H, F = fq.shape
    D = v.shape[-1]
    dtype = common_float_dtype(fq, fk, v)
    q, k, v = (x.to(dtype).contiguous() for x in (fq, fk, v))
    device = q.device
    f32 = dict(dtype=torch.float32, device=device)

    num = torch.empty(B, T, H, D, **f32)
    den = torch.empty(B, T, H, **f32)
    ht = torch.empty(B, H, F, D, **f32) if output_final_state else None
    st = torch.empty(B, H, F, **f32) if output_final_state else None
    if T == 0 or B * H == 0:  # nothing to launch: the state passes through
        if output_final_state:
            if initial_state is None:
                ht.zero_()
                st.zero_()
            else:
                ht.copy_(initial_state[0])
                st.copy_(initial_state[1])
        return num, den, ((ht, st) if output_final_state else None)

    BT = CHUNK_SIZE
    NT = triton.cdiv(T, BT)
    h = torch.empty(B, H, NT, F, D, **f32)  # state entering each chunk
    s = torch.empty(B, H, NT, F, **f32)
    h0 = s0 = None
    if initial_state is not None:
        h0, s0 = (x.float().contiguous() for x in initial_state)
    common = dict(H=H, F=F, D=D, BT=BT, PRECISION=dot_precision(dtype))

    def grid_state(meta):
        return (triton.cdiv(F, meta["BK"]), triton.cdiv(D, meta["BV"]), B * H)

    def grid_output(meta):
        return (triton.cdiv(D, meta["BV"]), NT, B * H)

    with device_guard(q):
        chunk_state_fwd_kernel[grid_state](
            k,
            v,
            h,
            s,
            h0 if h0 is not None else h,
            s0 if s0 is not None else s,  # dummies when unused
            ht if ht is not None else h,
            st if st is not None else s,
            T,
            NT,
            USE_INITIAL_STATE=initial_state is not None,
            STORE_FINAL_STATE=output_final_state,
            **common,
        )
        chunk_output_fwd_kernel[grid_output](q, k, v, h, s, num, den, T, NT, **common)
    return num, den, ((ht, st) if output_final_state else None)
