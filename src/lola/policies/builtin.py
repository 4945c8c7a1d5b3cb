"""The built-in scoring policies: self-recall error, attention magnitude, recency, random, key norm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from lola.memory.base import KVBlock
from lola.policies.base import ScoringContext

__all__ = ["AttentionMagnitude", "KeyNorm", "Random", "Recency", "SelfRecallError"]


@dataclass(frozen=True)
class SelfRecallError:
    """LoLA's score: how badly the *current* linear state recalls a pair.

    ``SRE(k, v) = ‖v − φ(k)ᵀH / (φ(k)ᵀs + eps)‖₂``, per query head, averaged over the query
    heads that share a storage head. High error = the state cannot hold the pair = keep exact.

    With ``relative`` the error is measured against the value's own norm,
    ``‖v − v̂‖ / ‖v‖``: the share of the pair the state loses, so a token with a large value
    does not outrank one the state loses entirely.

    Args:
        eps: denominator guard (the authors use ``1e-6``).
        reduce: ``"mean"`` or ``"max"`` over the query heads of a storage head.
        relative: divide each query head's error by ``‖v‖`` (``+ eps``).
    """

    eps: Annotated[float, Field(gt=0)] = 1e-6
    reduce: str = "mean"
    relative: bool = False
    needs_attention = False

    def __post_init__(self) -> None:
        _check_reduce(self.reduce)

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        from lola.kernels import self_recall_error

        g = ctx.group(candidates)
        v = ctx.expand_heads(candidates.v, g).float()
        err = self_recall_error(ctx.key_features(candidates), v, ctx.H, ctx.s, self.eps)
        if self.relative:
            err = err / (v.norm(dim=-1) + self.eps)
        return ctx.reduce_heads(err, g, self.reduce)


@dataclass(frozen=True)
class AttentionMagnitude:
    """H2O-style: the softmax attention mass a token received since it entered exact memory.

    The mass is summed over the queries (and the query heads of a storage head) that read the
    token, with weights normalised over the exact set of each query.
    """

    needs_attention = True

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        if candidates.acc is None:
            raise RuntimeError("AttentionMagnitude needs tracked attention: the memory was built without it")
        return candidates.acc


@dataclass(frozen=True)
class Recency:
    """FIFO: keep the newest tokens (score = position)."""

    needs_attention = False

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        return candidates.pos.float()


@dataclass(frozen=True)
class Random:
    """Uniform random scores, reproducible from ``seed``.

    The score of a token is a hash of ``(seed, token position, step position, head)``, so it
    does not depend on how the sequence was split into calls, and replays identically after a
    state is saved and restored.

    Args:
        seed: any integer.
    """

    seed: int = 0
    needs_attention = False

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        b, hs, n = candidates.pos.shape
        first = ctx.head_offset or 0  # the model's head index (a share of the heads starts past 0)
        head = torch.arange(first, first + hs, device=candidates.pos.device).view(1, hs, 1)
        x = _mix32(candidates.pos & 0xFFFFFFFF)
        x = _mix32(x ^ (ctx.step.view(b, 1, 1) & 0xFFFFFFFF))
        x = _mix32(x ^ head)
        x = _mix32(x ^ (self.seed & 0xFFFFFFFF))
        return x.float() / 2**32


def _check_reduce(how: str) -> None:
    if how not in ("mean", "max"):
        raise ValueError(f"reduce must be 'mean' or 'max', got {how!r}")


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer finaliser (Wellons' "lowbias32"); products stay below 2**63 in int64.
    x = x & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@dataclass(frozen=True)
class KeyNorm:
    """Score by the L2 norm of the key.

    By default the *largest* norms stay exact: a large key produces large logits whose
    ``exp`` the bounded features of a linear map approximate worst, so the linear state is the
    wrong place for it. (For plain KV eviction, Devoto et al. 2024 found the opposite sign
    useful: low-norm keys draw more attention; ``largest=False`` gives that.)

    Args:
        largest: keep the largest norms (``True``) or the smallest.
    """

    largest: bool = True
    needs_attention = False

    def score(self, candidates: KVBlock, ctx: ScoringContext) -> torch.Tensor:
        norm = candidates.k.float().norm(dim=-1)
        return norm if self.largest else -norm
