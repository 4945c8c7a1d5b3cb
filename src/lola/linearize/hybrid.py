"""The sliding-window + linear hybrid in parallel (training) form, differentiable.

Query ``i`` attends exactly (softmax) to its ``window`` newest keys ``(i − window, i]`` and
linearly to every older key ``j ≤ i − window``; the two partials are combined by
:func:`lola.core.mix`. This is what :class:`lola.LoLAAttention` computes with
``window=η, sparse_size=0, sinks=0, schedule="tokenwise"``, written for a whole sequence at
once so attention transfer can train the feature maps by backpropagation.

Blocks of ``window`` tokens make the exact part cheap: a query in block ``b`` sees exactly
block ``b−1`` (keys after it) and block ``b`` (keys up to itself). The linear part is a causal
linear scan over the keys shifted ``window`` places later, one
:func:`lola.kernels.chunk_linear_attention` call. Cost ``O(T·window·(D+F) + T·F·D)``, not
``O(T²)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from lola.core import LinearPartial, MixingRule, SoftmaxPartial, mix
from lola.kernels import chunk_linear_attention

if TYPE_CHECKING:
    from lola.core.positions import BoundedPositions
    from lola.layer import LoLAAttention

__all__ = ["hybrid_attention", "state_features"]


def _blocks(x: torch.Tensor, window: int) -> torch.Tensor:
    """``[B, H, T, X] -> [B, H, nb, window, X]``, zero-padded at the end."""
    pad = (-x.shape[2]) % window
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    b, h, t, d = x.shape
    return x.view(b, h, t // window, window, d)


def _previous(x: torch.Tensor) -> torch.Tensor:
    """Block ``b−1`` beside block ``b`` (zeros before the first): ``[B, H, nb, W, X]``."""
    return F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :-1]


def hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fq: torch.Tensor,
    fk: torch.Tensor,
    gate: torch.Tensor,
    window: int,
    scale: float,
    mixing: MixingRule | str = MixingRule.LOLCATS,
    affine: bool = False,
) -> torch.Tensor:
    """Sliding-window softmax + linear attention over a whole sequence (causal).

    Args:
        q: ``[B, H, T, D]`` queries.
        k, v: ``[B, H, T, D]`` keys and values, already repeated to the ``H`` query heads.
        fq, fk: ``[B, H, T, F]`` feature maps of ``q`` and ``k``.
        gate: ``[H]`` softmax weight ``w = sigmoid(window_factor)``.
        window: ``η ≥ 1``, exact keys per query (itself included).
        scale: softmax scale.
        mixing, affine: see :func:`lola.core.mix`.

    Returns:
        ``[B, H, T, D]`` float32.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    b, h, t, d = q.shape
    W = window
    qb, kb, vb = (_blocks(x.float(), W) for x in (q, k, v))
    nb = qb.shape[2]
    device = q.device

    # exact part: keys of blocks b-1 and b; key c (0..2W-1) is visible to query a iff a < c <= a + W
    keys = torch.cat([_previous(kb), kb], dim=3)  # [B, H, nb, 2W, D]
    vals = torch.cat([_previous(vb), vb], dim=3)
    a = torch.arange(W, device=device).view(W, 1)
    c = torch.arange(2 * W, device=device).view(1, 2 * W)
    visible = ((c > a) & (c <= a + W)).expand(nb, W, 2 * W).clone()
    visible[0, :, :W] = False  # no block before the first
    scores = torch.einsum("bhnad,bhncd->bhnac", qb, keys) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    m = scores.amax(dim=-1)  # each query sees itself: finite
    p = torch.exp(scores - m.unsqueeze(-1))
    exact = SoftmaxPartial(
        num=torch.einsum("bhnac,bhncd->bhnad", p, vals).reshape(b, h, -1, d)[:, :, :t],
        den=p.sum(-1).reshape(b, h, -1)[:, :, :t],
        max=m.reshape(b, h, -1)[:, :, :t],
    )

    # linear part: every key at least `window` older than the query, i.e. a causal linear scan
    # over the keys shifted `window` places later (key j sits at position j + window).
    shifted = [F.pad(x.float(), (0, 0, W, 0))[:, :, :t].transpose(1, 2) for x in (fk, v)]  # [B, T, H, ·]
    num, den, _ = chunk_linear_attention(fq.float().transpose(1, 2), *shifted)
    linear = LinearPartial(num=num.transpose(1, 2), den=den.transpose(1, 2))
    return mix(exact, linear, gate, mixing, affine)


def state_features(
    attn: LoLAAttention, q: torch.Tensor, k: torch.Tensor, mover: BoundedPositions | None, pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``φ_q, φ_k`` of a training hybrid's ``q [B, H, T, D]`` and ``k [B, H, T, D]`` (K/V heads
    spread to the query heads), at the positions ``pos [B, T]`` moved by ``mover`` as a bounded
    LoLA layer moves its state's queries and keys (``None``: where they are)."""
    if mover is not None:
        q, k = mover.state_inputs(q, pos), mover.state_keys(k, pos[:, None, :])
    return attn.feature_map_q(q.float()), attn.feature_map_k(k.float())
