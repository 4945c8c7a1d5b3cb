"""Causal linear attention numerator/denominator: the definition, in PyTorch.

For every token t (no normalisation, no scale)::

    num_t = fq_t^T (H0 + sum_{j<=t} fk_j v_j^T)      # [D]
    den_t = fq_t^T (s0 + sum_{j<=t} fk_j)            # scalar

``naive_recurrent_linear_attention`` is the literal token loop; ``chunk_linear_attention``
is the chunked form used on CPU (intra-chunk causal matmul + inter-chunk state).
Both compute in fp32 whatever the input dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

CHUNK_SIZE = 64

State = Tuple[torch.Tensor, torch.Tensor]


def _initial_state(initial_state: Optional[State], B: int, H: int, F: int, D: int, device) -> State:
    if initial_state is None:
        return (
            torch.zeros(B, H, F, D, dtype=torch.float32, device=device),
            torch.zeros(B, H, F, dtype=torch.float32, device=device),
        )
    h0, s0 = initial_state
    return h0.float(), s0.float()


def naive_recurrent_linear_attention(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    initial_state: Optional[State] = None,
    output_final_state: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[State]]:
    """Token-by-token recurrence; slow, only for tests.

    Args:
        fq, fk: ``[B, T, H, F]`` feature-mapped queries / keys.
        v: ``[B, T, H, D]`` values.
        initial_state: ``(H0 [B, H, F, D], s0 [B, H, F])`` fp32, or None for zeros.

    Returns:
        ``num [B, T, H, D]``, ``den [B, T, H]`` fp32, and ``(H_T, s_T)`` if ``output_final_state``.
    """
    B, T, H, F = fq.shape
    D = v.shape[-1]
    h, s = _initial_state(initial_state, B, H, F, D, fq.device)
    h, s = h.clone(), s.clone()
    num = fq.new_zeros(B, T, H, D, dtype=torch.float32)
    den = fq.new_zeros(B, T, H, dtype=torch.float32)
    for t in range(T):
        q_t, k_t, v_t = fq[:, t].float(), fk[:, t].float(), v[:, t].float()  # [B, H, *]
        h = h + k_t[..., :, None] * v_t[..., None, :]
        s = s + k_t
        num[:, t] = torch.einsum("bhf,bhfd->bhd", q_t, h)
        den[:, t] = (q_t * s).sum(-1)
    return num, den, ((h, s) if output_final_state else None)


def chunk_linear_attention(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    initial_state: Optional[State] = None,
    output_final_state: bool = False,
    chunk_size: int = CHUNK_SIZE,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[State]]:
    """Chunked causal linear attention (the CPU path).

    Args:
        fq, fk: ``[B, T, H, F]``; v: ``[B, T, H, D]``.
        initial_state: ``(H0 [B, H, F, D], s0 [B, H, F])`` fp32, or None for zeros.
        output_final_state: also return ``(H_T [B, H, F, D], s_T [B, H, F])``.

    Returns:
        ``num [B, T, H, D]`` fp32, ``den [B, T, H]`` fp32, final state or None.
    """
    B, T, H, F = fq.shape
    D = v.shape[-1]
    h0, s0 = _initial_state(initial_state, B, H, F, D, fq.device)
    C = max(1, min(chunk_size, T))  # a short sequence is one chunk (the result does not depend on C)
    NT = -(-T // C)
    pad = NT * C - T

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, X] -> [B, H, NT, C, X] fp32
        x = x.float().transpose(1, 2)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))  # zero tokens add nothing
        return x.reshape(B, H, NT, C, x.shape[-1])

    q, k, vv = chunks(fq), chunks(fk), chunks(v)

    # Per-chunk state increments and the state *entering* each chunk (exclusive prefix).
    kv = k.transpose(-1, -2) @ vv  # [B, H, NT, F, D]
    ks = k.sum(-2)  # [B, H, NT, F]
    h_in = h0[:, :, None] + torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1]], 2).cumsum(2)
    s_in = s0[:, :, None] + torch.cat([torch.zeros_like(ks[:, :, :1]), ks[:, :, :-1]], 2).cumsum(2)

    causal = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()
    A = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)  # [B, H, NT, C, C]
    num = q @ h_in + A @ vv  # [B, H, NT, C, D]
    den = (q * s_in[..., None, :]).sum(-1) + A.sum(-1)  # [B, H, NT, C]

    num = num.reshape(B, H, NT * C, D)[:, :, :T].transpose(1, 2).contiguous()
    den = den.reshape(B, H, NT * C)[:, :, :T].transpose(1, 2).contiguous()
    final = None
    if output_final_state:
        final = (h0 + kv.sum(2), s0 + ks.sum(2))
    return num, den, final
