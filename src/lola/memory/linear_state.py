"""Linear-attention state ``H = Σ φ(k) vᵀ``, ``s = Σ φ(k)`` over evicted tokens (float32)."""

from __future__ import annotations

import torch

from lola.core.partials import LinearPartial, read_linear_state
from lola.memory.base import QueryBlock, drop_unless_declared

__all__ = ["LinearState"]


class LinearState:
    """Constant-size memory of every token in neither the window, the sparse cache nor the sinks.

    Storage: ``H: [B, H, F, D]`` and ``s: [B, H, F]``, always float32 (a bf16 state loses
    tokens to rounding as it grows). One state per *query* head, since feature maps are per
    query head.

    Args:
        decay: ``γ ∈ (0, 1]`` per token (``1``: none, the paper's state). With ``γ < 1`` the state
            holds ``H = Σ_j γ^{τ−j} φ(k_j) v_jᵀ`` (and ``s`` likewise) as of its last step ``τ``:
            a step multiplies the rows it writes by ``γ^P`` (``P`` tokens since their last
            step) and adds each folded token with weight ``γ^{age}``. Feature maps trained on
            short contexts give far keys a larger share than softmax would (``lola probe``),
            and a decay bounds what they add at any length (RetNet's fixed decay).
    """

    name = "linear"
    #: Declared capability: the state is the tensors ``H, s``; :meth:`snapshot` hands them out and
    #: the next :meth:`write` replaces them instead of adding into them, so a read may be deferred
    #: past later writes (and a server's pages may hold them).
    snapshots = True
    #: Declared capability: ``s`` is a (decayed) sum of the folded keys' features, so a state of a
    #: non-negative feature map holds ``s >= 0`` (what a loaded state is checked against).
    sums_features = True

    def __init_subclass__(cls, **kwargs) -> None:
        # A subclass with a read, a write or a snapshot of its own keeps a capability only by
        # declaring it again.
        super().__init_subclass__(**kwargs)
        drop_unless_declared(cls, "snapshots", ("read", "write", "snapshot"))
        drop_unless_declared(cls, "sums_features", ("write",))

    def __init__(self, decay: float = 1.0) -> None:
        if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        self.decay = float(decay)
        self.H: torch.Tensor | None = None
        self.s: torch.Tensor | None = None
        self.shared = False  # a deferred read holds H, s: the next write replaces them

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(H, s)`` as they are now, kept intact: the next :meth:`write` replaces them instead
        of adding into them."""
        self.shared = True
        return self.state

    def allocate(self, batch: int, heads: int, feature_dim: int, head_dim: int, device: torch.device) -> None:
        """Allocate a zero state."""
        self.H = torch.zeros(batch, heads, feature_dim, head_dim, dtype=torch.float32, device=device)
        self.s = torch.zeros(batch, heads, feature_dim, dtype=torch.float32, device=device)

    @property
    def allocated(self) -> bool:
        return self.H is not None

    @property
    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(H [B, H, F, D], s [B, H, F])``, float32; raises if not allocated."""
        if self.H is None or self.s is None:
            raise RuntimeError("LinearState is not allocated yet: write to it first")
        return self.H, self.s

    def read(self, query: QueryBlock) -> LinearPartial:
        """``num = φ(q)ᵀH [B, H, L, D]``, ``den = φ(q)ᵀs [B, H, L]``."""
        H, s = self.state  # (checks the allocation before the query is read)
        return read_linear_state(query.fq, H, s)

    def write(
        self,
        fk: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
        age: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        elapsed: int = 0,
    ) -> None:
        """Fold tokens in: ``H += Σ φ(k) vᵀ``, ``s += Σ φ(k)`` over slots where ``mask``.

        Args:
            fk: ``[B, H, N, F]`` feature-mapped keys.
            v: ``[B, H, N, D]`` values.
            mask: ``[B, H, N]`` bool, the tokens to fold.
            age, rows, elapsed: with a decay only (ignored at ``decay = 1``): ``age [B, H, N]``
                tokens from each folded token to the step, ``rows [B]`` bool the rows that step
                (their ``H, s`` are multiplied by ``γ^elapsed`` first).
        """
        H, s = self.state
        fk = torch.where(mask.unsqueeze(-1), fk.float(), 0.0)
        carry = None
        if self.decay != 1.0:
            if age is None or rows is None:
                raise ValueError("a decaying LinearState needs age and rows with every write")
            fk = fk * torch.pow(self.decay, age.float().clamp_min(0)).unsqueeze(-1)
            carry = torch.where(rows, self.decay**elapsed, 1.0).to(H.dtype)  # [B]
        dH = torch.matmul(fk.transpose(-1, -2), torch.where(mask.unsqueeze(-1), v.float(), 0.0))
        grow = fk.sum(dim=2)
        if self.shared or torch.is_grad_enabled():
            # Out of place: an earlier read of H may be saved for autograd (a query that needs
            # gradients reads it) or held by a deferred read.
            if carry is not None:
                H, s = H * carry[:, None, None, None], s * carry[:, None, None]
            self.H, self.s, self.shared = H + dH, s + grow, False
        else:  # in place: the storage stays where it is (a bound state's pages)
            if carry is not None:
                H.mul_(carry[:, None, None, None])
                s.mul_(carry[:, None, None])
            H.add_(dH)
            s.add_(grow)

    def nbytes(self) -> int:
        return 0 if self.H is None else self.H.nbytes + self.s.nbytes

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of ``H, s`` (they are added into in place later)."""
        return {} if self.H is None else {"H": self.H.clone(), "s": self.s.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.H = self.s = None
            return
        if set(state) != {"H", "s"}:
            raise ValueError(f"LinearState state must hold exactly 'H' and 's', got {sorted(state)}")
        H, s = state["H"], state["s"]
        if H.dtype != torch.float32 or s.dtype != torch.float32 or H.dim() != 4 or s.shape != H.shape[:3]:
            raise ValueError(f"LinearState needs float32 H [B, H, F, D] and s [B, H, F], got {H.dtype} {tuple(H.shape)}, {s.dtype} {tuple(s.shape)}")
        self.H, self.s, self.shared = H.clone(), s.clone(), False

    def reset(self) -> None:
        self.H = self.s = None
        self.shared = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()" if self.decay == 1.0 else f"{type(self).__name__}(decay={self.decay})"
