"""Self-recall error of tokens under a linear-attention state."""

from __future__ import annotations

import torch

from ..dispatch import implementation
from ..utils import ShapeChecker, check_float, check_linear_state, check_same_device


def check_inputs(fk, v, H, s) -> None:
    c = ShapeChecker()
    c.check("fk", fk, "B H N F")
    c.check("v", v, "B H N D")
    check_float("fk", fk)
    check_float("v", v)
    check_linear_state(c, H, s)
    check_same_device([("fk", fk), ("v", v), ("H", H), ("s", s)])


def self_recall_error(
    fk: torch.Tensor,
    v: torch.Tensor,
    H: torch.Tensor,
    s: torch.Tensor,
    eps: float = 1e-6,
    *,
    check: bool = True,
) -> torch.Tensor:
    """``err_n = || v_n - (fk_n^T H) / (fk_n^T s + eps) ||_2`` for every token.

    Args:
        fk: ``[B, H, N, F]`` key features (fp32/fp16/bf16).
        v: ``[B, H, N, D]`` values.
        H: ``[B, H, F, D]`` fp32 linear-attention state.
        s: ``[B, H, F]`` fp32 normaliser state.
        eps: added to the denominator.
        check: validate shapes, dtypes and devices first (``False`` only for callers that
            built the inputs themselves, such as the LoLA engine on its decode path).

    Returns:
        ``err [B, H, N]`` fp32.
    """
    if check:
        check_inputs(fk, v, H, s)
    fn = implementation("self_recall_error", fk, v, H, s)
    return fn(fk, v, H, s, eps=eps)


__all__ = ["self_recall_error", "check_inputs"]
