"""Self-recall error of tokens against a linear-attention state: the definition.

How well the state ``(H, s)`` reproduces each token's own value when queried with the
token's own key features::

    v_hat_n = (fk_n^T H) / (fk_n^T s + eps)           # [D]
    err_n   = || v_n - v_hat_n ||_2                    # over D

Tokens the state recalls badly are the ones worth keeping exactly (sparse cache).
"""

from __future__ import annotations

import torch


def self_recall_error(
    fk: torch.Tensor,
    v: torch.Tensor,
    H: torch.Tensor,
    s: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Reference self-recall error (materialises ``v_hat``).

    Args:
        fk: ``[B, H, N, F]`` key features.
        v: ``[B, H, N, D]`` values.
        H: ``[B, H, F, D]`` fp32 state; s: ``[B, H, F]`` fp32 normaliser state.
        eps: added to the denominator.

    Returns:
        ``err [B, H, N]`` fp32.
    """
    fk32 = fk.float()
    v_hat = (fk32 @ H.float()) / ((fk32 @ s.float()[..., None]) + eps)  # [B, H, N, D]
    return torch.linalg.vector_norm(v.float() - v_hat, dim=-1)
