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
  from"). A key is folded once, at its assigned position. With ``key_spread = W``, a key past
  the limit enters at ``p mod (state_positions − W)`` instead: a query there sits at
  ``state_positions − 1``, so the state's keys are read at distances spread over
  ``[W, state_positions)``, as in a stream the maps were trained on, not all at distance zero
  (where a rotated ``q·k`` is largest: docs/results.md, "Keys spread over the trained distances").

A stream shorter than both limits moves nothing: every delta is zero and the layer is today's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lola.core.checks import reads_back

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
        ``linear``, ``llama3``, ``yarn``… scaling already applied), checked against the model's
        own ``apply_rotary_pos_emb``: rotating by a delta must equal the model's rotation at the
        moved position. Refused, naming why: a model with no rotary module, with several, with
        layers that skip RoPE, or whose rotation the check does not reproduce (frequencies that
        change with the length, such as ``dynamic`` and ``longrope``; an interleaved layout)."""
        rotaries = [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
        name = type(model).__name__
        if not rotaries:
            raise ValueError(f"{name} has no rotary embedding of fixed frequencies (a module with an inv_freq buffer): bounded positions need one")
        if any(not torch.equal(r.inv_freq, rotaries[0].inv_freq) for r in rotaries[1:]):
            raise ValueError(f"{name} rotates its layers with {len(rotaries)} different rotary embeddings: bounded positions support one")
        config = getattr(model, "config", None)
        skipped = getattr(config, "no_rope_layers", None)
        if isinstance(skipped, (list, tuple)) and not all(skipped):
            raise ValueError(f"{name} skips RoPE in some layers (no_rope_layers): bounded positions would rotate keys the model never rotated")
        rotary = cls(rotaries[0].inv_freq)
        _check_against(rotary, rotaries[0], config, name)
        return rotary

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


def _check_against(rotary: RotaryEmbedding, module: torch.nn.Module, config: object, name: str) -> None:
    """Refuse ``rotary`` unless moving a vector the model rotated at ``n`` by ``Δ`` equals the
    model's own rotation at ``n + Δ`` (``Δ`` past its context, where length-dependent frequencies
    switch), through the ``apply_rotary_pos_emb`` of the module's model file."""
    import copy
    import sys

    apply = getattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb", None)
    module = copy.deepcopy(module)  # a length-dependent rotary updates its buffers when called: never the model's
    if apply is None:
        raise ValueError(f"{name}: no apply_rotary_pos_emb beside its rotary embedding, so its layout cannot be checked: bounded positions are refused")
    dim = rotary.rotary_dim
    head_dim = getattr(config, "head_dim", None) or dim
    x = torch.randn(1, 1, 2, head_dim, generator=torch.Generator().manual_seed(0))
    context = getattr(config, "max_position_embeddings", None) or 4096
    n, delta = 5, 2 * int(context) + 7
    try:
        with torch.no_grad():
            cos_n, sin_n = module(x, torch.tensor([[n, n + 1]]))
            cos_m, sin_m = module(x, torch.tensor([[n + delta, n + 1 + delta]]))
            at_n, _ = apply(x, x, cos_n, sin_n)
            at_m, _ = apply(x, x, cos_m, sin_m)
    except Exception as err:  # a signature of another kind: not a layout this check knows
        raise ValueError(f"{name}: its rotary embedding could not be checked ({type(err).__name__}: {err}): bounded positions are refused") from None
    moved = rotary.rotate(at_n.float(), torch.full((1, 1, 2), delta))
    err = float((moved - at_m.float()).norm() / at_m.float().norm().clamp_min(1e-30))
    if not err < 1e-3:
        raise ValueError(
            f"{name}: rotating by a position delta does not reproduce the model's RoPE (relative error {err:.2g}: frequencies that change with the length, "
            "such as dynamic or longrope scaling, or a layout other than rotate-half): bounded positions are refused"
        )


@dataclass(frozen=True, eq=False)
class BoundedPositions:
    """The positions a layer reads with, bounded however long the stream (module docstring).

    Args:
        rotary: the model's :class:`RotaryEmbedding`.
        exact_distance: the largest distance an exact read sees (plus the block's length):
            keys farther from a block's first query are read at this distance.
        state_positions: queries and keys enter the feature maps at positions below this.
        key_spread: ``None``: the state's keys enter the maps as queries do; ``W``: a key past
            ``state_positions`` enters at its position modulo ``state_positions − W`` (its
            distance from a query there in ``[W, state_positions)``).
    """

    rotary: RotaryEmbedding
    exact_distance: int
    state_positions: int
    key_spread: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rotary, RotaryEmbedding):
            raise TypeError(f"rotary must be a RotaryEmbedding, got {type(self.rotary).__name__}")
        for name in ("exact_distance", "state_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        spread = self.key_spread
        if spread is not None and (isinstance(spread, bool) or not isinstance(spread, int) or not 0 <= spread < self.state_positions):
            raise ValueError(f"key_spread must be None or an int in [0, state_positions={self.state_positions}), got {spread!r}")

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
        if reads_back(delta.device) and not bool(delta.any()):  # on a host: no held key is that far, no copy
            return k
        return self.rotary.rotate(k, delta)

    def state_inputs(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Queries or keys as the feature maps see them: ``x [B, H, N, D]`` rotated at ``pos
        [B, N]`` or ``[B, H, N]`` (``-1``: padding, left as it is) moved to
        ``min(pos, state_positions − 1)``."""
        if pos.dim() == 2:
            pos = pos[:, None, :]
        delta = torch.where(pos >= 0, (self.state_positions - 1 - pos).clamp_max(0), 0)
        return self.rotary.rotate(x, delta)

    def state_keys(self, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Keys as the feature maps see them when they are folded into the state: ``k [B, H,
        N, D]`` rotated at ``pos [B, H, N]`` (``-1``: an empty slot, left as it is), moved as
        :meth:`state_inputs` moves them, or with ``key_spread`` ``W`` a key at ``p >=
        state_positions`` to ``p mod (state_positions − W)``."""
        if self.key_spread is None:
            return self.state_inputs(k, pos)
        s = self.state_positions
        target = torch.where(pos >= s, pos % (s - self.key_spread), pos)
        return self.rotary.rotate(k, torch.where(pos >= 0, target - pos, 0))
