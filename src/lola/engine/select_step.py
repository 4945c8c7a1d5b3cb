"""The select-and-evict step: the window's oldest tokens and the sparse cache are scored, the
top ``λ`` stay exact, the rest are folded into the linear state.

The one step of prefill and decode alike (:mod:`lola.engine.block_loop` runs it where the
schedule says); the policy's answer is checked here, once per step, and an error names it.
"""

from __future__ import annotations

from typing import Callable

import torch

from lola.core.checks import reads_back, require
from lola.engine.state import LayerState
from lola.memory.blocks import KVBlock
from lola.policies.base import ScoringContext
from lola.policies.registry import describe

__all__ = ["FeatureFn", "select", "step"]

FeatureFn = Callable[[torch.Tensor], torch.Tensor]


def step(state: LayerState, stepping: torch.Tensor, feature_map_k: FeatureFn, scale: float) -> None:
    """Select-and-evict for the rows in ``stepping [B]``, the survivors' rest folded into the
    linear state: the one step of prefill and decode alike."""
    state.written.ring_only = False
    fk, v, mask, pos = select(state, stepping, feature_map_k, scale)
    if getattr(state.linear, "decay", 1.0) != 1.0:  # a decaying state weighs tokens by their age at the step
        age = (state.seen - 1)[:, None, None] - pos
        state.linear.write(fk, v, mask, age=age, rows=stepping, elapsed=state.schedule.period)
    else:
        state.linear.write(fk, v, mask)


def select(state: LayerState, rows: torch.Tensor, feature_map_k: FeatureFn, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Select-and-evict for ``rows [B]``: window overflow + sparse cache → top-λ stay exact.

    Returns:
        The tokens to fold into the linear state, per query head: ``φ(k) [B, H, M, F]``,
        ``v [B, H, M, D]``, ``mask [B, H, M]`` and positions ``[B, H, M]`` (the linear state
        is not touched here: scoring reads it as it is before the step).
    """
    leaving = state.window.pop_oldest(rows)
    candidates = KVBlock.cat([leaving, state.sparse.block])
    ctx = ScoringContext(
        state.linear,
        feature_map_k,
        state.num_heads,
        state.seen - 1,
        scale=scale,
        layer=state.layer,
        queries=state.queries,
        fresh=leaving.size,
        head_offset=state.head_offset,
        key_positions=_state_positions(state),
        exact_positions=_exact_positions(state),
    )
    scores = _score(state.policy, candidates, ctx) if state.sparse.capacity > 0 else torch.zeros_like(candidates.pos, dtype=torch.float32)
    _check_scores(scores, candidates.valid, state.policy)
    if getattr(state.policy, "keeps_scores", False) and state.sparse.capacity > 0:
        # The cached tokens carry the kept scores to the next step, in the slots' tallies.
        candidates = KVBlock(candidates.k, candidates.v, candidates.pos, _kept(state.policy, ctx, candidates))
    evicted = state.sparse.select(candidates, scores, rows)
    order = _compaction(evicted.valid)
    # (the features come from the candidates' when the policy computed them: SRE does)
    fk = ctx.key_features(evicted, order)
    if order is not None:
        evicted = evicted.gather(order)
    g = ctx.group(evicted)
    return fk, ctx.expand_heads(evicted.v, g), ctx.expand_heads(evicted.valid, g), ctx.expand_heads(evicted.pos, g)


def _state_positions(state: LayerState) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """How keys enter the feature maps: ``None`` (at their positions) unless the layer bounds
    positions and a row has reached the maps' limit."""
    bounded = state.positions
    if bounded is None or not bounded.moves_state(state.counts.host_range()[1]):
        return None
    return bounded.state_keys


def _exact_positions(state: LayerState) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """Keys as the reads after the step see them (the stepping token's period): ``None`` unless
    the layer bounds positions and a row is past ``exact_distance``."""
    bounded = state.positions
    newest = state.counts.host_range()[1] - 1 if bounded is not None else 0
    if bounded is None or not bounded.moves_exact(newest):
        return None
    return lambda k, pos: state.exact_view(k, pos, state.seen - 1, newest)


def _kept(policy: object, ctx: ScoringContext, candidates: KVBlock) -> torch.Tensor:
    """The ``[B, Hs, N]`` scores a ``keeps_scores`` policy set in ``ctx.kept``, finite (a state
    holds finite tallies; an infinite score keeps its place at the float32 limit)."""
    kept = ctx.kept
    if not isinstance(kept, torch.Tensor) or kept.shape != candidates.pos.shape:
        got = tuple(kept.shape) if isinstance(kept, torch.Tensor) else type(kept).__name__
        raise RuntimeError(f"policy {describe(policy)} keeps scores but set ctx.kept to {got}, expected a tensor [B, Hs, N] = {tuple(candidates.pos.shape)}")
    big = torch.finfo(torch.float32).max
    return kept.float().clamp(-big, big)


def _score(policy: object, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
    """The policy's scores of ``candidates``; a plug-in's failure, or an answer that is not a
    ``[B, Hs, N]`` tensor, is an error naming the policy (once per select step)."""
    try:
        scores = policy.score(candidates, ctx)
    except (MemoryError, torch.OutOfMemoryError):  # not the policy's fault: kept as it is
        raise
    except Exception as err:
        raise RuntimeError(f"policy {describe(policy)} failed in score(): {type(err).__name__}: {err}") from err
    if not isinstance(scores, torch.Tensor):
        raise TypeError(
            f"policy {describe(policy)} returned a {type(scores).__name__} from score(), expected a tensor [B, Hs, N] = {tuple(candidates.pos.shape)}"
        )
    if scores.is_complex() or scores.dtype == torch.bool:
        raise TypeError(f"policy {describe(policy)} returned {scores.dtype} scores from score(), expected real numbers (higher = keep exact)")
    if scores.shape != candidates.pos.shape:
        raise ValueError(f"policy {describe(policy)} returned scores of shape {tuple(scores.shape)}, expected {tuple(candidates.pos.shape)}")
    if scores.device != candidates.pos.device:
        raise ValueError(f"policy {describe(policy)} returned scores on {scores.device}, expected them on the candidates' device {candidates.pos.device}")
    return scores


def _compaction(valid: torch.Tensor) -> torch.Tensor | None:
    """On a host device, the ``[B, Hs, E]`` slots that put the valid ones of ``valid [B, Hs, N]``
    first in slot order, ``E`` the most any (row, head) holds; ``None`` when a (row, head) fills
    the width (nothing to drop). A step evicts about as many tokens as left the window, out of
    the window's and the whole cache's slots, so the features and the fold cost ``E`` slots,
    not all of them. On an accelerator ``None`` (``E`` would be read back)."""
    if not reads_back(valid.device) or valid.numel() == 0:
        return None
    e = int(valid.sum(-1).amax())
    if e == valid.shape[-1]:
        return None
    return torch.argsort((~valid).to(torch.uint8), dim=-1, stable=True)[..., :e]


def _check_scores(scores: torch.Tensor, valid: torch.Tensor, policy: object) -> None:
    """Refuse NaN scores of real candidates: a top-k over NaN keeps tokens in slot order, a
    silent change of policy. Once per select step (not per token under the chunkwise schedule);
    on accelerators an asynchronous assert, so the step does not wait for the device."""
    bad = torch.isnan(scores) & valid
    if not require(~bad.any(), f"policy {describe(policy)} returned NaN scores"):
        raise ValueError(f"policy {describe(policy)} returned NaN scores for {int(bad.sum())} candidates")
