"""Policies that estimate future use from geometry: expected attention and key diversity."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

import torch
from pydantic import Field

from lola.limits import MAX_TOKENS
from lola.memory.base import KVBlock
from lola.policies.base import ScoringContext
from lola.policies.builtin import _check_reduce

__all__ = ["ExpectedAttention", "KeyDiff", "average_rope_rotation"]


def average_rope_rotation(head_dim: int, theta: float, horizon: int, device: torch.device | None = None) -> torch.Tensor:
    """``R̄ = mean_{Δ=1..horizon} R(Δ)``, ``[D, D]``: the RoPE rotation of a query ``Δ`` tokens
    ahead, averaged (transformers' half-split layout: dimension ``i`` pairs with ``i + D/2``).

    In closed form, so that time and memory do not grow with ``horizon``: for a frequency
    ``ω``, ``mean_Δ e^{iΔω} = e^{iω(n+1)/2} · sin(nω/2) / (n · sin(ω/2))``.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    half = head_dim // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64, device=device) * 2 / head_dim)  # [D/2], in (0, 1]
    n = float(horizon)
    gain = torch.sin(n * freq / 2) / (n * torch.sin(freq / 2))  # |mean| of the rotations
    c, s = torch.cos(freq * (n + 1) / 2) * gain, torch.sin(freq * (n + 1) / 2) * gain
    r = torch.zeros(head_dim, head_dim, dtype=torch.float64, device=device)
    i = torch.arange(half, device=device)
    # x'_i = x_i c − x_{i+D/2} s,   x'_{i+D/2} = x_{i+D/2} c + x_i s
    r[i, i], r[i, i + half] = c, -s
    r[i + half, i + half], r[i + half, i] = c, s
    return r.float()


@lru_cache(maxsize=16)
def _cached_rotation(head_dim: int, theta: float, horizon: int, device: str) -> torch.Tensor:
    # Scoring runs at every step of every layer; the rotation depends on the settings only.
    return average_rope_rotation(head_dim, theta, horizon, torch.device(device))


@dataclass(frozen=True)
class ExpectedAttention:
    """kvpress' *expected attention*: the softmax weight a future query is expected to give a key.

    With ``μ, Σ`` the mean and covariance of the layer's recent queries (``ctx.queries``),
    moved ``1..horizon`` tokens ahead by the average RoPE rotation ``R̄`` when ``rope_theta``
    is given, and ``c`` the softmax scale:
    ``a_j = c (R̄μ)·k_j + ½ c² k_jᵀ R̄ΣR̄ᵀ k_j`` (the mean of ``exp(c q·k)`` for Gaussian
    ``q``, in log space); the score is ``softmax_j(a)`` over the candidates, reduced over the
    query heads of a storage head, times ``‖v_j‖`` when ``value_norm``.

    Args:
        value_norm: multiply by the value's norm (kvpress does).
        reduce: ``"mean"`` or ``"max"`` over the query heads of a storage head.
        rope_theta: the model's RoPE base, or ``None`` to use the statistics unrotated.
        horizon: how many future positions ``R̄`` averages over.
        query_half_life: tokens after which a query's weight in the statistics halves.
    """

    value_norm: bool = True
    reduce: str = "mean"
    rope_theta: Annotated[float, Field(gt=0)] | None = None
    horizon: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 512
    query_half_life: Annotated[float, Field(gt=0)] = 64.0
    needs_attention = False
    needs_queries = True

    def __post_init__(self) -> None:
        _check_reduce(self.reduce)
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        if self.rope_theta is not None and not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        if ctx.queries is None or ctx.queries.n is None:
            raise RuntimeError("ExpectedAttention needs query statistics: the memory was built without them")
        g = ctx.group(candidates)
        mu, cov = ctx.queries.mean(), ctx.queries.covariance()  # [B, H, D], [B, H, D, D]
        if self.rope_theta is not None:
            r = _cached_rotation(mu.shape[-1], self.rope_theta, self.horizon, str(mu.device))
            mu = mu @ r.T
            cov = r @ cov @ r.T
        k = ctx.expand_heads(ctx.exact_keys(candidates), g).float()  # [B, H, N, D], as the reads will see them
        c = ctx.scale
        a = c * torch.einsum("bhnd,bhd->bhn", k, mu) + 0.5 * c * c * torch.einsum("bhnd,bhde,bhne->bhn", k, cov, k)
        valid = ctx.expand_heads(candidates.valid, g)
        weight = torch.where(valid, a, float("-inf")).softmax(dim=-1).nan_to_num(0.0)  # all-empty rows → 0
        score = ctx.reduce_heads(weight, g, self.reduce)
        if self.value_norm:
            score = score * candidates.v.float().norm(dim=-1)
        return score


@dataclass(frozen=True)
class KeyDiff:
    """KeyDiff: keep keys unlike the others, ``score = −cos(k_j, mean_i k_i/‖k_i‖)`` over the
    valid candidates of each storage head."""

    needs_attention = False

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        unit = torch.nn.functional.normalize(ctx.exact_keys(candidates).float(), dim=-1)
        valid = candidates.valid[..., None]
        anchor = torch.where(valid, unit, 0.0).sum(dim=2) / valid.sum(dim=2).clamp_min(1)  # [B, Hs, D]
        return -torch.nn.functional.cosine_similarity(unit, anchor[:, :, None, :], dim=-1)
