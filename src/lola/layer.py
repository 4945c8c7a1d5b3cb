"""LoLAAttention: the attention module, and ``compose(config)`` that builds it from a config."""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from lola.config import LoLAConfig
from lola.core.checks import reads_back, require
from lola.core.mixing import MixingRule, kernel_mixing, linear_share, mixing_weights
from lola.core.partials import LinearPartial, SoftmaxPartial
from lola.core.positions import BoundedPositions, RotaryEmbedding
from lola.core.thread_stack import pushed
from lola.engine.composer import LoLAMemory, StateLayout
from lola.feature_maps import FeatureMap, build_feature_map
from lola.kernels import mix_partials
from lola.memory import LinearState, SinkTokens, SlidingWindow, SparseCache
from lola.policies import build as build_policy
from lola.schedules import build as build_schedule

__all__ = ["LoLAAttention", "ObservedCall", "bounded_positions", "compose", "memory_from_config", "observe_calls", "observe_linear_share"]

_observers = threading.local()


@dataclass(frozen=True)
class ObservedCall:
    """What one :class:`LoLAAttention` call computed, for diagnostics (:func:`observe_calls`).

    Attributes:
        layer: the module that ran.
        exact: merged softmax partial over the exact tokens, ``num [B, H, T, D]``,
            ``den``/``max`` ``[B, H, T]`` (``den`` shifted by ``e^{-max}``).
        linear: the linear state's partial, ``num [B, H, T, D]``, ``den [B, H, T]``.
        gate: ``[H]`` softmax weight ``w = sigmoid(window_factor)``.
        valid: ``[B, T]`` bool, real tokens.
        state: the layer's :class:`LoLAMemory` after the call (its exact tokens, linear state).
        cap: the share cap the call applied: ``None``, a number, or ``[B, 1, T]`` per query
            (``1`` where it does not apply; see ``linear_share_cap_from``).
    """

    layer: "LoLAAttention"
    exact: SoftmaxPartial
    linear: LinearPartial
    gate: torch.Tensor
    valid: torch.Tensor
    state: LoLAMemory
    cap: float | torch.Tensor | None = None

    @property
    def rule(self) -> str:
        """The kernel name of the layer's mixing rule (``lolcats_affine`` included)."""
        return kernel_mixing(self.layer.mixing, self.layer.affine)

    def share(self) -> torch.Tensor:
        """``[B, H, T]``: the part of each output that the linear state gives (:func:`lola.core.linear_share`)."""
        return linear_share(self.exact, self.linear, self.gate, self.layer.mixing, self.layer.affine, self.cap)

    def log_masses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(exact, linear)``, each ``[B, H, T]``: the natural logs of the two masses the rule
        adds in its denominator, ``a·E_den`` and ``b·L_den`` (:func:`lola.core.mixing.mixing_weights`),
        unscaled (``lola_authors``: ``w·Σ e^{s}`` and ``(1 − w)·φ(q)ᵀs``); ``-inf`` where a
        part is empty, and the linear part is ``-inf`` for ``softmax_only``."""
        e_den = self.exact.den.float()
        if self.rule == "softmax_only":
            exact = e_den.log() + self.exact.max.float()
            return exact, torch.full_like(exact, float("-inf"))
        a, b = mixing_weights(self.exact.max, self.gate, self.rule)
        unscale = self.exact.max.float().clamp_min(0.0) if self.rule == "lola_authors" else 0.0  # undo e^{-c}
        exact = (a * e_den).log() + unscale
        linear = (b * self.linear.den.float()).log() + unscale
        return exact, linear


@contextlib.contextmanager
def observe_calls(callback: Callable[[ObservedCall], None]) -> Iterator[None]:
    """Call ``callback(call)`` with an :class:`ObservedCall` after every :class:`LoLAAttention`
    call in this thread. While a callback is active, decode tokens take the unfused path (same
    outputs, tested) so their partials can be read. A diagnostic: it costs a pass over the
    partials per layer."""
    with pushed(_observers, "stack", callback):
        yield


@contextlib.contextmanager
def observe_linear_share(callback: Callable[["LoLAAttention", torch.Tensor, torch.Tensor], None]) -> Iterator[None]:
    """Call ``callback(layer, share, valid)`` after every :class:`LoLAAttention` call in this thread.

    ``share [B, H, T]`` is the part of each output that the linear state gives
    (:func:`lola.core.linear_share`: ``0`` for ``softmax_only``, ``1`` for an output read from
    the state alone); ``valid [B, T]`` marks real tokens. Built on :func:`observe_calls`.
    """
    with observe_calls(lambda call: callback(call.layer, call.share(), call.valid)):
        yield


class LoLAAttention(nn.Module):
    """LoLA attention over pre-projected (and RoPE-rotated) queries, keys and values.

    ``o, state = attn(q, k, v, state=None, padding_mask=None)``:

    - ``q: [B, T, H, D]``; ``k, v: [B, T, H_kv, D]`` with ``H % H_kv == 0``; fp32, fp16 or bf16.
    - ``padding_mask: [B, T]`` (bool, or 0/1 integers) marks real tokens; padded tokens are
      never written to any memory and their outputs are zero.
    - ``state``: a :class:`LoLAMemory` from an earlier call (continue the sequence: the next
      segment or one decode token) or ``None`` (start afresh). It is updated in place and
      returned.
    - ``o: [B, T, H, D]`` in ``q``'s dtype.

    Parameters: the query and key feature maps (``feature_map_q``, ``feature_map_k``) and the
    per-head ``window_factors [1, H, 1, 1]`` (softmax weight ``w = sigmoid(window_factors)``),
    named as in LoLCATs checkpoints.

    Args:
        num_heads: ``H``.
        head_dim: ``D``.
        num_kv_heads: ``H_kv`` (defaults to ``H``).
        memory_factory: builds an empty :class:`LoLAMemory` for a new sequence.
        feature_map_q, feature_map_k: ``φ`` for queries and keys.
        mixing: a :class:`~lola.core.MixingRule` name.
        affine: see :func:`lola.core.mix`.
        window_factor_init: initial value of ``window_factors``.
        scale: softmax scale, ``1/√D`` when ``None``.
        check_inputs: validate tensors on every call.
        share_cap: the linear state's share of each output is at most this (``None``: no cap;
            see :func:`lola.core.mix`); a decoded token's cap is applied in the fused decode step.
        share_cap_from: the cap applies to queries at positions ``>=`` this only (``0``: all);
            a query's position is the count of real tokens before it in its row.
        positions: ``None`` (absolute positions: reads see the positions the keys and queries
            were rotated at) or a :class:`~lola.core.positions.BoundedPositions`: reads assign
            positions within the limits it sets, however long the stream. It assumes the keys
            and queries were rotated (by its rotary embedding) at their positions, a position
            being the count of real tokens before it in its row (what ``generate()`` does).
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        *,
        memory_factory: Callable[[], LoLAMemory],
        feature_map_q: FeatureMap,
        feature_map_k: FeatureMap,
        mixing: str | MixingRule = MixingRule.LOLCATS,
        affine: bool = False,
        window_factor_init: float = -2.1972,
        scale: float | None = None,
        check_inputs: bool = True,
        share_cap: float | None = None,
        share_cap_from: int = 0,
        positions: BoundedPositions | None = None,
    ) -> None:
        super().__init__()
        check_geometry(num_heads, head_dim, num_kv_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if feature_map_q.feature_dim != feature_map_k.feature_dim:
            raise ValueError(f"feature maps disagree on F: q {feature_map_q.feature_dim}, k {feature_map_k.feature_dim}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.memory_factory = memory_factory
        self.feature_map_q = feature_map_q
        self.feature_map_k = feature_map_k
        self.mixing = MixingRule(mixing)
        if affine and self.mixing is not MixingRule.LOLCATS:
            raise ValueError(
                f"affine=True weighs the linear term of the lolcats rule only, and mixing={self.mixing.value!r} ignores it: set affine=False or mixing='lolcats'"
            )
        self.affine = affine
        if share_cap is not None and not 0 < share_cap <= 1:
            raise ValueError(f"share_cap must be in (0, 1] or None, got {share_cap!r}")
        self.share_cap = share_cap
        if isinstance(share_cap_from, bool) or not isinstance(share_cap_from, int) or share_cap_from < 0:
            raise ValueError(f"share_cap_from must be an integer >= 0, got {share_cap_from!r}")
        if share_cap_from and share_cap is None:
            raise ValueError(f"share_cap_from={share_cap_from} without a share_cap: set share_cap or leave share_cap_from at 0")
        self.share_cap_from = share_cap_from
        if positions is not None and not isinstance(positions, BoundedPositions):
            raise TypeError(f"positions must be a lola.core.positions.BoundedPositions or None, got {type(positions).__name__}")
        if positions is not None and positions.rotary.rotary_dim > head_dim:
            raise ValueError(f"positions' rotary embedding rotates {positions.rotary.rotary_dim} dimensions, heads have {head_dim}")
        self.positions = positions
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        self.check_inputs = check_inputs
        self.window_factors = nn.Parameter(torch.full((1, num_heads, 1, 1), float(window_factor_init)))
        probe = memory_factory()
        self._spec, self._layer = probe.spec(), probe.layer
        if positions is not None:
            _check_periodic(probe.schedule)

    @property
    def feature_dim(self) -> int:
        """``F``, the size of ``φ(·)``."""
        return self.feature_map_q.feature_dim

    def new_state(self) -> LoLAMemory:
        """An empty state for a new batch of sequences (allocated on its first call), taken by
        this layer (see :meth:`take`)."""
        return self.take(self.memory_factory())

    def take(self, state: LoLAMemory) -> LoLAMemory:
        """Make ``state`` this layer's: it records the layer (:attr:`LoLAMemory.owner`; no other
        layer may read it) and the geometry a state loaded into it must have
        (:attr:`LoLAMemory.layout`). A state passed to :meth:`forward` that no layer has taken
        is taken by it."""
        state.layout = StateLayout(
            num_heads=self.num_heads,
            storage_heads=self.storage_heads(state),
            head_dim=self.head_dim,
            feature_dim=self.feature_dim,
            non_negative=bool(getattr(self.feature_map_k, "non_negative", False)),
            feature_map=getattr(self.feature_map_k, "kind", None) or type(self.feature_map_k).__name__,
        )
        if self.positions is not None:
            own = [m.name for m in state.exact_memories if not m.reads_block]
            if own:
                raise ValueError(
                    f"bounded positions re-rotate the keys of the stock exact stores; memories {own} read their own keys: use positions=None (absolute) with them"
                )
        state.positions = self.positions
        state.owner = weakref.ref(self)
        return state

    def _check_parameters(self) -> None:
        """Refuse NaN or infinite parameters (feature maps, window factors) when a sequence
        starts: they would turn every output of the layer into NaN without an error (a diverged
        training step, a damaged ``load_state_dict``). One host sync per layer and sequence."""
        params = [(n, p) for n, p in self.named_parameters() if p.is_floating_point() and p.device.type != "meta"]
        if not params:
            return
        finite = torch.stack([torch.isfinite(p).all() for _, p in params])
        if not bool(finite.all()):
            bad = [n for (n, _), ok in zip(params, finite.tolist(), strict=True) if not ok]
            raise ValueError(
                f"LoLA layer parameter(s) {', '.join(bad[:3])}{', …' if len(bad) > 3 else ''} hold non-finite values (NaN or inf); reload or retrain them"
            )

    def storage_heads(self, state: LoLAMemory) -> int:
        """Heads the exact memories are stored for: ``H_kv`` or ``H``."""
        return self.num_kv_heads if state.gqa_storage == "kv_head" else self.num_heads

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        state: LoLAMemory | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LoLAMemory]:
        """Attend ``q`` over the sequence so far plus ``k, v``; see the class docstring."""
        if self.check_inputs:
            self._check(q, k, v, state, padding_mask)
        state = self.new_state() if state is None else state
        self._check_spec(state)
        b = q.shape[0]
        hs = self.storage_heads(state)
        if not state.allocated:
            self._check_parameters()
            state.allocate(b, self.num_heads, hs, self.head_dim, self.feature_dim, k.dtype, k.device)
        else:
            self._check_state(state, k)
            if state.seen.is_inference() and not torch.is_inference_mode_enabled():
                state.leave_inference_mode()
        self._check_owner(state)

        qh = q.transpose(1, 2)  # [B, H, T, D]
        kh, vh = k.transpose(1, 2), v.transpose(1, 2)  # [B, H_kv, T, D]
        if hs != self.num_kv_heads:
            g = self.num_heads // self.num_kv_heads
            kh, vh = kh.repeat_interleave(g, dim=1), vh.repeat_interleave(g, dim=1)
        valid = None if padding_mask is None else _as_bool_mask(padding_mask, q)
        observers = getattr(_observers, "stack", None)
        if q.shape[1] == 1 and state.decodes_fused and not observers and (valid is None or bool(valid.all())):
            # One token per row: the fused decode step (one kernel call reads, mixes and caps);
            # softmax_only never reads the linear state nor the gate, so neither is computed.
            mixing = kernel_mixing(self.mixing, self.affine)
            softmax_only = mixing == "softmax_only"
            fq = None if softmax_only else self._query_features(qh, state, None)
            gate = self.window_factors.detach().view(-1) if softmax_only else torch.sigmoid(self.window_factors.float()).view(-1)
            cap = None if softmax_only else self._row_caps(state.seen.to(q.device))
            o = state.decode(qh, fq, kh, vh, self.scale, self.feature_map_k, gate, mixing, cap)
            return o.unsqueeze(1).to(q.dtype), state
        gate = torch.sigmoid(self.window_factors.float()).view(-1)
        if valid is None:
            valid = torch.ones(q.shape[:2], dtype=torch.bool, device=q.device)
        # softmax_only: the output never reads the linear state, so the queries' features are not computed.
        fq = None if kernel_mixing(self.mixing, self.affine) == "softmax_only" else self._query_features(qh, state, valid)
        cap = self._caps(state.seen, valid)  # from the counts before this call's tokens
        # The rules that read the exact part as num/den and den·e^max only (not its max) let the
        # reads take another shift (fused attention on a CPU); an observer sees the reference's.
        state.exact_max = bool(observers) or kernel_mixing(self.mixing, self.affine) not in ("lola_authors", "softmax_only")
        exact, linear = state.attend(qh, fq, kh, vh, valid, self.scale, self.feature_map_k)
        # (the kernels' mix: the definition's output in two passes over the reads)
        o = mix_partials(exact.num, exact.den, exact.max, linear.num, linear.den, gate, kernel_mixing(self.mixing, self.affine), cap)
        if observers:
            call = ObservedCall(self, exact, linear, gate, valid, state, cap)
            for callback in tuple(observers):
                callback(call)
        return o.transpose(1, 2).to(q.dtype), state

    def _query_features(self, qh: torch.Tensor, state: LoLAMemory, valid: torch.Tensor | None) -> torch.Tensor:
        """``φ(q)`` of ``qh [B, H, T, D]``, the queries entering the maps at the positions the
        layer's :class:`~lola.core.positions.BoundedPositions` assign (their own when absolute).

        Args:
            valid: ``[B, T]`` real tokens, ``None`` when all are.
        """
        bounded = self.positions
        if bounded is not None and bounded.moves_state(state.counts.host_range()[1] + qh.shape[2] - 1):
            steps = valid.long().cumsum(dim=1) if valid is not None else torch.arange(1, qh.shape[2] + 1, device=qh.device)[None, :]
            pos = state.seen.to(qh.device)[:, None] + steps - 1  # [B, T]: each query's position
            if valid is not None:
                pos = torch.where(valid, pos, -1)
            qh = bounded.state_inputs(qh, pos)
        return self.feature_map_q(qh)

    def _row_caps(self, seen: torch.Tensor) -> torch.Tensor | None:
        """The share cap of one decoded token per row, ``[B]`` fp32 (``1``: none), or ``None``
        without a cap: :meth:`_caps` for a call of one real token per row.

        Args:
            seen: ``[B]`` real tokens each row held before this token (its position).
        """
        if self.share_cap is None:
            return None
        if not self.share_cap_from:
            return torch.full(seen.shape, float(self.share_cap), device=seen.device)
        return torch.where(seen >= self.share_cap_from, self.share_cap, 1.0).float()

    def _caps(self, seen: torch.Tensor, valid: torch.Tensor) -> float | torch.Tensor | None:
        """The share cap of each query: ``None``, the cap itself, or with ``share_cap_from``
        ``[B, 1, T]``, the cap from that position on and ``1`` (no cap) before it.

        Args:
            seen: ``[B]`` real tokens each row held before this call.
            valid: ``[B, T]`` bool, real tokens of this call.
        """
        if self.share_cap is None or not self.share_cap_from:
            return self.share_cap
        pos = seen.to(valid.device)[:, None] + valid.long().cumsum(dim=1) - 1  # [B, T]: each query's position
        return torch.where(pos >= self.share_cap_from, self.share_cap, 1.0).float()[:, None, :]

    # -- validation -----------------------------------------------------------------------------
    def _check(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: LoLAMemory | None, padding_mask: torch.Tensor | None) -> None:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            if x.dim() != 4:
                raise ValueError(f"{name} must be [B, T, heads, D] (4 dims), got shape {tuple(x.shape)}")
            if not x.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
        b, t, h, d = q.shape
        if t < 1:
            raise ValueError(f"q must hold at least one token (T >= 1), got T={t}")
        if b < 1:
            raise ValueError(f"q must hold at least one row (B >= 1), got an empty batch of shape {tuple(q.shape)}")
        if h != self.num_heads or d != self.head_dim:
            raise ValueError(f"q must be [B, T, {self.num_heads}, {self.head_dim}], got {tuple(q.shape)}")
        expected_kv = (b, t, self.num_kv_heads, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            if tuple(x.shape) != expected_kv:
                raise ValueError(f"{name} must be [B, T, H_kv, D] = {expected_kv} to match q {tuple(q.shape)}, got {tuple(x.shape)}")
        if not (q.dtype == k.dtype == v.dtype):
            raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if not (q.device == k.device == v.device):
            raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
        if reads_back(q.device):
            # A sum is finite if every value is; one that is not (a non-finite value, or finite
            # ones overflowing the dtype) is told apart value by value. Sums in the inputs' dtype
            # read back cost a third of float64 ones (the check runs per decoded token and layer).
            total = sum(x.sum().item() for x in (q, k, v))
            finite = math.isfinite(total)
        else:
            # A float64 sum of finite fp32/fp16/bf16 values cannot overflow: finite iff every value
            # is (an asynchronous assert: no stall per token).
            total = q.sum(dtype=torch.float64) + k.sum(dtype=torch.float64) + v.sum(dtype=torch.float64)
            finite = require(torch.isfinite(total), "q, k or v contains non-finite values (inf or NaN)")
        if not finite:
            for name, x in (("q", q), ("k", k), ("v", v)):
                if not bool(torch.isfinite(x).all()):
                    raise ValueError(f"{name} contains non-finite values (inf or NaN)")
        if padding_mask is not None:
            if not isinstance(padding_mask, torch.Tensor) or tuple(padding_mask.shape) != (b, t):
                shape = tuple(padding_mask.shape) if isinstance(padding_mask, torch.Tensor) else type(padding_mask).__name__
                raise ValueError(f"padding_mask must be a [B, T] = {(b, t)} tensor, got {shape}")
            if padding_mask.device != q.device:
                raise ValueError(f"padding_mask must be on {q.device}, got {padding_mask.device}")
        if state is not None and not isinstance(state, LoLAMemory):
            raise TypeError(f"state must be a LoLAMemory or None, got {type(state).__name__}")

    def _check_spec(self, state: LoLAMemory) -> None:
        """Refuse a state of another layer index (two layers' states swapped) or configuration."""
        if not isinstance(state, LoLAMemory):  # check_inputs=False: the call fails below anyway
            return
        if state.layer != self._layer:
            raise ValueError(
                f"state belongs to layer {state.layer}, this is layer {self._layer}: a layer reads only its own state (were two layers' states swapped?)"
            )
        # spec() formats every part; compare it again only when a part was swapped.
        parts = state.parts()
        if state.validated_for != (self, parts):
            if state.spec() != self._spec:
                raise ValueError(f"state was built for another configuration: state {state.spec()}, layer {self._spec}")
            state.validated_for = (self, parts)

    def _check_owner(self, state: LoLAMemory) -> None:
        """Refuse a state taken by another layer object of the same configuration and geometry
        (another model's, or one from before LoLA was re-applied): its linear state sums that
        layer's features. A state no layer has taken becomes this layer's."""
        if state.owner is None:
            self.take(state)
        elif state.owner() is not self:
            raise ValueError(
                "state was taken by another LoLA layer of the same configuration (another model's, or one from before LoLA was re-applied): "
                "its linear state sums that layer's features; continue it with that layer, or start from a fresh state"
            )

    def _check_state(self, state: LoLAMemory, k: torch.Tensor) -> None:
        if state.batch_size != k.shape[0]:
            raise ValueError(f"state holds {state.batch_size} rows, got a batch of {k.shape[0]}")
        block = state.window.block
        expected = (self.storage_heads(state), self.head_dim)
        if block is not None and (block.k.shape[1], block.k.shape[3]) != expected:
            raise ValueError(f"state stores [heads, D] = {(block.k.shape[1], block.k.shape[3])}, layer expects {expected}")
        H = state.linear.state[0] if state.linear.allocated else None
        if H is not None and tuple(H.shape[1:]) != (self.num_heads, self.feature_dim, self.head_dim):
            raise ValueError(f"state's linear state is {tuple(H.shape[1:])}, layer expects {(self.num_heads, self.feature_dim, self.head_dim)}")
        if block is not None and block.k.dtype != k.dtype:
            raise TypeError(f"state stores {block.k.dtype} keys, got k of dtype {k.dtype}")
        if state.seen.device != k.device:
            raise ValueError(f"state lives on {state.seen.device}, got inputs on {k.device}")

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, mixing={self.mixing.value}, memory={self.new_state()!r}"
        )


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """``value`` must be an int (not a bool) in ``[minimum, maximum]``; the error names ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def check_geometry(num_heads: object, head_dim: object, num_kv_heads: object = None, layer: object = None) -> None:
    """Refuse a layer geometry that is not positive ints (at most :data:`~lola.limits.MAX_HEADS`
    heads of :data:`~lola.limits.MAX_HEAD_DIM` dimensions) with ``num_heads % num_kv_heads == 0``.

    Raises:
        TypeError: an argument is not an int (a bool or a float such as ``2.5`` is not one).
        ValueError: an argument is out of range, or ``num_heads`` is no multiple of ``num_kv_heads``.
    """
    from lola.limits import MAX_HEAD_DIM, MAX_HEADS

    _check_int("num_heads", num_heads, 1, MAX_HEADS)
    _check_int("head_dim", head_dim, 1, MAX_HEAD_DIM)
    if num_kv_heads is not None:
        _check_int("num_kv_heads", num_kv_heads, 1, MAX_HEADS)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if layer is not None:
        _check_int("layer", layer, 0)


def _check_periodic(schedule: object) -> None:
    """Bounded positions read each schedule period at one position: refuse a schedule whose
    steps are not after positions ``P − 1, 2P − 1, …`` (``P`` its period), as Chunkwise's are."""
    period = schedule.period
    seen = torch.arange(3 * period + 1)
    if not torch.equal(schedule.tokens_until_step(seen), period - seen % period):
        raise ValueError(
            f"bounded positions need a schedule that steps after positions P-1, 2P-1, ... (P = its period, as chunkwise and tokenwise do); {schedule!r} steps elsewhere"
        )


def _as_bool_mask(mask: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() or not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("padding_mask must be bool or hold only 0/1 integers (1 = real token)")
    return mask.bool()


def memory_from_config(cfg: LoLAConfig, layer: int | None = None, head_offset: int | None = None) -> LoLAMemory:
    """An empty :class:`LoLAMemory` built from ``cfg`` (sinks, window, sparse cache, policy,
    schedule) for layer ``layer`` of a model (``None``: a standalone layer); ``head_offset``: for a
    share of the heads (:func:`compose`), the index of its first storage head in the layer."""
    schedule = build_schedule(cfg.schedule, chunk=cfg.chunk, **cfg.schedule_kwargs)
    return LoLAMemory(
        sinks=SinkTokens(cfg.sinks),
        window=SlidingWindow(cfg.window_per_head or cfg.window, max_pending=schedule.period),
        sparse=SparseCache(cfg.sparse_size_per_head or cfg.sparse_size),
        linear=LinearState(cfg.linear_decay),
        policy=build_policy(cfg.policy, **cfg.policy_kwargs),
        schedule=schedule,
        gqa_storage=cfg.gqa_storage,
        layer=layer,
        head_offset=head_offset,
    )


def compose(
    cfg: LoLAConfig,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int | None = None,
    layer: int | None = None,
    *,
    heads: tuple[int, int] | None = None,
    rotary: RotaryEmbedding | None = None,
) -> LoLAAttention:
    """Build a :class:`LoLAAttention` from a config.

    Args:
        cfg: the layer's :class:`~lola.LoLAConfig`.
        num_heads: query heads ``H``.
        head_dim: ``D``.
        num_kv_heads: K/V heads ``H_kv`` (``H`` if ``None``).
        layer: the layer's index in its model, passed to the scoring policy.
        heads: ``(first, end)``: build the share of query heads ``[first, end)`` of this layer
            (whole groups of the query heads that read one K/V head), as a tensor-parallel rank
            computes it: its per-head sizes, parameters (cut along :func:`lola.head_share.head_axes`)
            and the policy's head indices are those heads'; the shares' outputs, side by side,
            are the whole layer's. ``None``: every head.
        rotary: the model's rotary embedding, needed by ``cfg.positions="bounded"`` (which
            also needs ``cfg.exact_distance`` and ``cfg.state_positions``); ignored otherwise.

    Example::

        attn = lola.compose(lola.LoLAConfig(window=64, sparse_size=64), num_heads=8, head_dim=64)
        o, state = attn(q, k, v)                    # q: [B, T, 8, 64]
        o2, state = attn(q2, k2, v2, state=state)   # continue the sequence
    """
    if not isinstance(cfg, LoLAConfig):
        raise TypeError(f"cfg must be a LoLAConfig, got {type(cfg).__name__}")
    check_geometry(num_heads, head_dim, num_kv_heads, layer)
    storage = (num_kv_heads or num_heads) if cfg.gqa_storage == "kv_head" else num_heads
    for field in ("window_per_head", "sparse_size_per_head"):
        sizes = getattr(cfg, field)
        if sizes is not None and len(sizes) != storage:
            raise ValueError(f"{field} must give one size per storage head ({storage} with gqa_storage={cfg.gqa_storage!r}), got {len(sizes)}")
    head_offset = None
    if heads is not None:
        from lola.head_share import head_share

        share = head_share(heads, num_heads, num_kv_heads or num_heads, cfg.gqa_storage)
        if getattr(build_policy(cfg.policy, **cfg.policy_kwargs), "couples_heads", False):
            raise ValueError(f"policy {cfg.policy!r} ranks the candidates of every head of the layer together: it cannot score a share of the heads")
        cfg, num_heads, num_kv_heads, head_offset = share.config(cfg), share.heads, share.kv_heads, share.storage_first
        storage = share.storage_end - share.storage_first
    positions = bounded_positions(cfg, rotary)
    if cfg.mixing == "softmax_only":
        # That rule reads exact tokens alone: a head that holds none would output zeros.
        windows = cfg.window_per_head or [cfg.window] * storage
        sparse = cfg.sparse_size_per_head or [cfg.sparse_size] * storage
        empty = [(head_offset or 0) + h for h in range(storage) if cfg.sinks + windows[h] + sparse[h] == 0]  # the layer's head indices
        if empty:
            where = f"layer {layer}: " if layer is not None else ""
            raise ValueError(
                f"{where}storage heads {empty} hold no exact token (sinks + window + sparse_size = 0) and mixing='softmax_only' reads exact "
                "tokens alone: their output would be zeros; give them a window, sparse slots or sinks, or a mixing rule that reads the linear state"
            )
    return LoLAAttention(
        num_heads,
        head_dim,
        num_kv_heads,
        memory_factory=lambda: memory_from_config(cfg, layer, head_offset),
        feature_map_q=build_feature_map(cfg.feature_map, num_heads, head_dim, cfg.feature_dim),
        feature_map_k=build_feature_map(cfg.feature_map, num_heads, head_dim, cfg.feature_dim),
        mixing=cfg.mixing,
        affine=cfg.affine,
        window_factor_init=cfg.window_factor_init,
        scale=cfg.scale,
        check_inputs=cfg.check_inputs,
        share_cap=cfg.linear_share_cap,
        share_cap_from=cfg.linear_share_cap_from,
        positions=positions,
    )


def bounded_positions(cfg: LoLAConfig, rotary: RotaryEmbedding | None) -> BoundedPositions | None:
    """The :class:`~lola.core.positions.BoundedPositions` of ``cfg`` (``None`` for absolute
    positions); a bounded config without a rotary embedding or its limits is refused, naming them."""
    if cfg.positions == "absolute":
        return None
    missing = [f for f in ("exact_distance", "state_positions") if getattr(cfg, f) is None]
    if rotary is None or missing:
        what = ", ".join((["rotary= (the model's RotaryEmbedding)"] if rotary is None else []) + [f"cfg.{f}" for f in missing])
        raise ValueError(f"positions='bounded' needs {what}: apply_lola(model, cfg) takes them from the model; compose() needs them given")
    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a lola.RotaryEmbedding, got {type(rotary).__name__}")
    # (limits filled in after validation, by resolve_positions, are checked here)
    return BoundedPositions(rotary, cfg.exact_distance, cfg.state_positions, key_spread=cfg.state_key_spread())
