"""Causal linear attention numerator and denominator over a sequence (prefill)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..dispatch import implementation
from ..utils import ShapeChecker, check_float, check_fp32, check_same_device

State = Tuple[torch.Tensor, torch.Tensor]


def check_inputs(fq, fk, v, initial_state) -> None:
    c = ShapeChecker()
    c.check("fq", fq, "B T H F")
    c.check("fk", fk, "B T H F")
    c.check("v", v, "B T H D")
    for name, t in (("fq", fq), ("fk", fk), ("v", v)):
        check_float(name, t)
    tensors = [("fq", fq), ("fk", fk), ("v", v)]
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError("initial_state must be None or a tuple (H0 [B, H, F, D], s0 [B, H, F])")
        h0, s0 = initial_state
        c.check("initial_state[0] (H0)", h0, "B H F D")
        c.check("initial_state[1] (s0)", s0, "B H F")
        check_fp32("initial_state[0] (H0)", h0)
        check_fp32("initial_state[1] (s0)", s0)
        tensors += [("initial_state[0] (H0)", h0), ("initial_state[1] (s0)", s0)]
    check_same_device(tensors)


def chunk_linear_attention(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    initial_state: Optional[State] = None,
    output_final_state: bool = False,
    *,
    check: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[State]]:
    """Unnormalised causal linear attention, resumable from a state.

    ``num_t = fq_t^T (H0 + sum_{j<=t} fk_j v_j^T)`` and ``den_t = fq_t^T (s0 + sum_{j<=t} fk_j)``;
    no normalisation and no scale are applied.

    Args:
        fq: ``[B, T, H, F]`` feature-mapped queries (fp32/fp16/bf16).
        fk: ``[B, T, H, F]`` feature-mapped keys.
        v: ``[B, T, H, D]`` values.
        initial_state: None (zeros) or ``(H0 [B, H, F, D], s0 [B, H, F])``, both fp32.
        output_final_state: whether to return ``(H_T [B, H, F, D], s_T [B, H, F])``.
        check: validate shapes, dtypes and devices first (``False`` only for callers that
            built the inputs themselves, such as the LoLA engine on its decode path).

    Returns:
        ``(num [B, T, H, D] fp32, den [B, T, H] fp32, final_state or None)``.
    """
    if check:
        check_inputs(fq, fk, v, initial_state)
    fn = implementation("chunk_linear_attention", fq, fk, v, *(initial_state or ()))
    return fn(fq, fk, v, initial_state=initial_state, output_final_state=output_final_state)


__all__ = ["chunk_linear_attention", "check_inputs"]
