"""Bounded positions: the rotary embedding a layer re-rotates keys and queries with, so that every
read sees distances and positions the model (and its feature maps) were trained on.

RoPE rotates a vector at position ``p`` by ``R(p)`` (angle ``p·θ_i`` in the ``i``-th pair of
dimensions), and rotations compose: ``R(e − p) R(p) x = R(e) x``. A key the model rotated at its
absolute position ``n`` is therefore moved to any assigned position ``e`` by one rotation of
``e − n``, whatever the model's frequencies (their scaling type included: the model's own
``inv_freq`` is used). :class:`BoundedPositions` assigns:

- **exact tokens**: a query block whose first query is at position ``m0`` reads each exact key at
  ``max(n, m0 − exact_distance)``: keys nearer than ``exact_distance`` keep their true distance
  (the window and the block's own keys always do), farther ones (sinks, sparse tokens) sit at
  distance ``exact_distance`` (up to ``exact_distance + C − 1`` for the block's later queries):
  softmax logits never see a distance beyond the model's context (LM-Infinite's and ReRoPE's cap).
- **the linear state**: queries and keys enter the feature maps at ``min(p, state_positions − 1)``,
  so the maps never see a position beyond those they were trained at (their kernel grows with
  absolute position past them: docs/results.md, "Long context: where the state's mass comes
  from"). A key is folded once, at its assigned position.

A stream shorter than both limits moves nothing: every delta is zero and the layer is today's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["BoundedPositions", "RotaryEmbedding"]


@dataclass(frozen=True, eq=False)
class RotaryEmbedding:
    """A model's rotary embedding, as the rotation it applies (no attention scaling: a delta
    rotation composes with the model's, whose scaling is already in the vectors).

    Attributes:
        inv_freq: ``[R/2]`` the frequencies ``θ_i`` (``R ≤ D`` the rotated dimensions; the first
            ``R`` dimensions of a head are rotated, in the rotate-half layout of transformers'
            Llama family: pair ``(i, i + R/2)``).
    """

    inv_freq: torch.Tensor
    _by_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        f = self.inv_freq
        if not isinstance(f, torch.Tensor) or f.dim() != 1 or f.numel() == 0 or not f.is_floating_point():
            got = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
            raise ValueError(f"inv_freq must be a non-empty 1-D float tensor [R/2], got {got}")
        if not bool(torch.isfinite(f).all()) or bool((f < 0).any()):
            raise ValueError("inv_freq must hold finite, non-negative frequencies")
        object.__setattr__(self, "inv_freq", f.detach().to("cpu", torch.float64))

    @property
    def rotary_dim(self) -> int:
        """``R``: the dimensions of a head the rotation moves."""
        return 2 * self.inv_freq.numel()

    @classmethod
    def from_theta(cls, theta: float, dim: int) -> "RotaryEmbedding":
        """The default RoPE of ``dim`` dimensions: ``θ_i = theta^{−2i/dim}``."""
        if not (isinstance(dim, int) and dim >= 2 and dim % 2 == 0):
            raise ValueError(f"dim must be an even int >= 2, got {dim!r}")
        if not theta > 1:
            raise ValueError(f"theta must be > 1, got {theta!r}")
        return cls(1.0 / (float(theta) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)))

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "RotaryEmbedding":
        """The rotation of a transformers model: its rotary module's ``inv_freq`` (``default``,
        ``linear``, ``llama3``, ``yarn``, ``longrope``… scaling already applied). A ``dynamic``
        scaling (frequencies that change with the length) is refused: a delta rotation needs
        frequencies that do not move."""
        rotary = next((m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)), None)
        if rotary is None:
            raise ValueError(f"{type(model).__name__} has no rotary embedding (no module with an inv_freq buffer): bounded positions need RoPE")
        rope_type = getattr(rotary, "rope_type", "default")
        if "dynamic" in str(rope_type):
            raise ValueError(f"the model's RoPE scaling {rope_type!r} changes its frequencies with the length: bounded positions need fixed ones")
        return cls(rotary.inv_freq)

    def cos_sin(self, delta: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [..., R/2]`` of the angles ``delta·θ`` (computed in float64: a delta of 64K
        positions keeps its angle to 1e-11 rad)."""
        f = self._freq(delta.device)
        angle = delta.to(torch.float64)[..., None] * f
        return angle.cos().to(dtype), angle.sin().to(dtype)

    def rotate(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """``R(delta) x``: ``x [..., D]`` rotated by ``delta [...]`` positions (int64, any sign),
        in ``x``'s dtype (computed in float32). A zero delta returns ``x``'s values exactly."""
        r = self.rotary_dim
        if x.shape[-1] < r:
            raise ValueError(f"vectors of {x.shape[-1]} dimensions cannot take a rotary embedding of {r}")
        cos, sin = self.cos_sin(delta)
        xf = x.float()
        x1, x2, rest = xf[..., : r // 2], xf[..., r // 2 : r], xf[..., r:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)
        return out.to(x.dtype)

    def _freq(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        f = self._by_device.get(key)
        if f is None:
            f = self._by_device[key] = self.inv_freq.to(device)
        return f


@dataclass(frozen=True, eq=False)
class BoundedPositions:
    """The positions a layer reads with, bounded however long the stream (module docstring).

    Args:
        rotary: the model's :class:`RotaryEmbedding`.
        exact_distance: the largest distance an exact read sees (plus the block's length):
            keys farther from a block's first query are read at this distance.
        state_positions: queries and keys enter the feature maps at positions below this.
    """

    rotary: RotaryEmbedding
    exact_distance: int
    state_positions: int

    def __post_init__(self) -> None:
        if not isinstance(self.rotary, RotaryEmbedding):
            raise TypeError(f"rotary must be a RotaryEmbedding, got {type(self.rotary).__name__}")
        for name in ("exact_distance", "state_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    def moves_exact(self, newest: int) -> bool:
        """Whether a read whose first query is at most at ``newest`` may move a key (host ints:
        no key moves before ``exact_distance``)."""
        return newest > self.exact_distance

    def moves_state(self, newest: int) -> bool:
        """Whether a token at most at position ``newest`` enters the maps at another position."""
        return newest >= self.state_positions

    def exact_keys(self, k: torch.Tensor, pos: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """Keys as an exact read from ``first`` sees them.

        Args:
            k: ``[B, ..., N, D]`` keys rotated at their positions; pos: ``[B, ..., N]`` int64
                (``-1``: an empty slot, left as it is).
            first: ``[B]`` int64 position of each row's first query of the read.

        Returns:
            ``k`` with each key at ``max(pos, first − exact_distance)``.
        """
        floor = (first - self.exact_distance).view(-1, *([1] * (pos.dim() - 1)))
        delta = torch.where(pos >= 0, (floor - pos).clamp_min(0), 0)
        return self.rotary.rotate(k, delta)

    def state_inputs(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Queries or keys as the feature maps see them: ``x [B, H, N, D]`` rotated at ``pos
        [B, N]`` or ``[B, H, N]`` (``-1``: padding, left as it is) moved to
        ``min(pos, state_positions − 1)``."""
        if pos.dim() == 2:
            pos = pos[:, None, :]
        delta = torch.where(pos >= 0, (self.state_positions - 1 - pos).clamp_max(0), 0)
        return self.rotary.rotate(x, delta)
