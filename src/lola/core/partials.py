"""Attention partials: the one currency every memory pays in.

A softmax memory answers a block of queries with ``(num, den, max)`` where
``num = Σ e^{s−m} v``, ``den = Σ e^{s−m}`` and ``m = max s`` over the keys it
holds and the query may see. The linear state answers with ``(num, den)`` =
``(φ(q)ᵀH, φ(q)ᵀs)``. Partials from several softmax memories merge exactly by
log-sum-exp, so a new memory only has to return a partial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SoftmaxPartial", "LinearPartial", "merge_softmax_partials", "read_linear_state"]


@dataclass
class SoftmaxPartial:
    """Exact-attention partial over some set of keys, float32.

    Attributes:
        num: ``[B, H, L, D]`` ``Σ_j e^{s_ij − m_i} v_j``.
        den: ``[B, H, L]`` ``Σ_j e^{s_ij − m_i}``.
        max: ``[B, H, L]`` ``m_i = max_j s_ij``; ``-inf`` where query ``i`` sees no key.
        logits: optional ``[B, H, L, N]`` masked scores (``-inf`` where invisible),
            kept only when a scoring policy needs the attention weights.
    """

    num: torch.Tensor
    den: torch.Tensor
    max: torch.Tensor
    logits: torch.Tensor | None = None

    @classmethod
    def empty(cls, batch: int, heads: int, length: int, head_dim: int, device: torch.device) -> "SoftmaxPartial":
        """A partial over no keys: ``num = 0``, ``den = 0``, ``max = -inf``."""
        return cls(
            num=torch.zeros(batch, heads, length, head_dim, dtype=torch.float32, device=device),
            den=torch.zeros(batch, heads, length, dtype=torch.float32, device=device),
            max=torch.full((batch, heads, length), float("-inf"), dtype=torch.float32, device=device),
        )

    def merge(self, other: "SoftmaxPartial") -> "SoftmaxPartial":
        """Combine two partials over disjoint key sets (log-sum-exp rescaling)."""
        m = torch.maximum(self.max, other.max)
        # exp(-inf - -inf) would be NaN: an empty side contributes a factor 0.
        a = _rescale(self.max, m)
        b = _rescale(other.max, m)
        return SoftmaxPartial(
            num=self.num * a.unsqueeze(-1) + other.num * b.unsqueeze(-1),
            den=self.den * a + other.den * b,
            max=m,
        )


@dataclass
class LinearPartial:
    """Linear-attention partial, float32.

    Attributes:
        num: ``[B, H, L, D]`` ``φ(q_i)ᵀ H``.
        den: ``[B, H, L]`` ``φ(q_i)ᵀ s``.
    """

    num: torch.Tensor
    den: torch.Tensor


def read_linear_state(fq: torch.Tensor, H: torch.Tensor, s: torch.Tensor) -> LinearPartial:
    """The one read of a linear state, in float32: ``num = φ(q)ᵀH``, ``den = φ(q)ᵀs``.

    Args:
        fq: ``[..., L, F]`` query features; H: ``[..., F, D]``; s: ``[..., F]`` (leading axes
            broadcast, e.g. ``[B, H]``).

    Returns:
        ``num [..., L, D]``, ``den [..., L]``.
    """
    fq = fq.float()
    return LinearPartial(num=torch.matmul(fq, H.float()), den=torch.matmul(fq, s.float().unsqueeze(-1)).squeeze(-1))


def _rescale(m_part: torch.Tensor, m_total: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(m_part)
    return torch.where(finite, torch.exp(torch.where(finite, m_part - m_total, 0.0)), 0.0)


def merge_softmax_partials(partials: list[SoftmaxPartial]) -> SoftmaxPartial:
    """Merge a non-empty list of softmax partials over disjoint key sets."""
    if not partials:
        raise ValueError("partials must be a non-empty list of SoftmaxPartial")
    out = partials[0]
    for p in partials[1:]:
        out = out.merge(p)
    return out
