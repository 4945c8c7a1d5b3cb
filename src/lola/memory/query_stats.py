"""Running statistics of a layer's recent queries, for policies that predict future attention."""

from __future__ import annotations

import math

import torch

__all__ = ["QueryStatistics"]


class QueryStatistics:
    """Exponentially weighted mean and covariance of the queries seen so far, per query head.

    A query ``i`` tokens old weighs ``β^i`` with ``β = 2^(−1/half_life)``, so the statistics
    describe the recent window (half of the weight on the newest ``half_life`` queries) at
    constant memory: ``n [B, H]``, ``sum [B, H, D]`` and ``sq [B, H, D, D]`` (float32)
    hold ``Σ β^i``, ``Σ β^i q_i`` and ``Σ β^i q_i q_iᵀ``. Folding a block of queries in one
    call equals folding them one by one (up to rounding), so the statistics do not depend on
    how a sequence is split into calls.

    Args:
        half_life: tokens after which a query's weight halves.
    """

    name = "queries"

    def __init__(self, half_life: float = 64.0) -> None:
        if not (isinstance(half_life, (int, float)) and math.isfinite(half_life) and half_life > 0):
            raise ValueError(f"half_life must be a finite number > 0, got {half_life!r}")
        self.half_life = float(half_life)
        self.n: torch.Tensor | None = None
        self.sum: torch.Tensor | None = None
        self.sq: torch.Tensor | None = None

    @property
    def decay(self) -> float:
        """``β``, the weight factor per token of age."""
        return 2.0 ** (-1.0 / self.half_life)

    def allocate(self, batch: int, heads: int, head_dim: int, device: torch.device) -> None:
        self.n = torch.zeros(batch, heads, dtype=torch.float32, device=device)
        self.sum = torch.zeros(batch, heads, head_dim, dtype=torch.float32, device=device)
        self.sq = torch.zeros(batch, heads, head_dim, head_dim, dtype=torch.float32, device=device)

    def update(self, q: torch.Tensor, active: torch.Tensor) -> None:
        """Fold in a block of queries.

        Args:
            q: ``[B, H, L, D]`` queries, oldest first.
            active: ``[B, L]`` bool, the queries that are real (a row's active entries come
                first; inactive ones are neither counted nor aged).
        """
        if self.n is None:
            raise RuntimeError("QueryStatistics is not allocated yet")
        count = active.sum(dim=1)  # [B]
        j = torch.arange(q.shape[2], device=q.device)
        # A query's age at the end of its row's block: count - 1 - j.
        age = (count[:, None] - 1 - j[None, :]).clamp(min=0).float()
        w = torch.where(active, self.decay**age, 0.0)[:, None, :]  # [B, 1, L]
        qf = q.float()
        carry = (self.decay ** count.float())[:, None]  # [B, 1]
        self.n = self.n * carry + w.sum(-1)
        self.sum = self.sum * carry[..., None] + torch.einsum("bhl,bhld->bhd", w.expand(-1, q.shape[1], -1), qf)
        self.sq = self.sq * carry[..., None, None] + torch.einsum("bhl,bhld,bhle->bhde", w.expand(-1, q.shape[1], -1), qf, qf)

    def mean(self) -> torch.Tensor:
        """``[B, H, D]`` weighted mean (zeros before any query)."""
        return self.sum / self.n.clamp_min(1e-30)[..., None]

    def covariance(self) -> torch.Tensor:
        """``[B, H, D, D]`` weighted covariance ``E[qqᵀ] − μμᵀ``."""
        mu = self.mean()
        return self.sq / self.n.clamp_min(1e-30)[..., None, None] - mu[..., :, None] * mu[..., None, :]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.n is None else {"n": self.n, "sum": self.sum, "sq": self.sq}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.n = self.sum = self.sq = None
            return
        if set(state) != {"n", "sum", "sq"}:
            raise ValueError(f"QueryStatistics state must hold exactly 'n', 'sum' and 'sq', got {sorted(state)}")
        n, s, sq = state["n"], state["sum"], state["sq"]
        if n.dim() != 2 or s.shape[:2] != n.shape or sq.shape != (*s.shape, s.shape[-1]):
            raise ValueError(f"QueryStatistics needs n [B, H], sum [B, H, D], sq [B, H, D, D], got {tuple(n.shape)}, {tuple(s.shape)}, {tuple(sq.shape)}")
        self.n, self.sum, self.sq = n.clone(), s.clone(), sq.clone()

    def reset(self) -> None:
        self.n = self.sum = self.sq = None

    def __repr__(self) -> str:
        return f"QueryStatistics(half_life={self.half_life})"
