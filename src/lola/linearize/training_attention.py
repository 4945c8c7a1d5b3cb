"""The ``"lola_hybrid"`` attention function: the window + linear hybrid, differentiable, for training.

Stage 2 of linearization trains the whole model (LoRA on the projections, the feature maps and
the window factors) through the hybrid. The inference path (:class:`lola.LoLAAttention` with
``sparse_size=0``) walks the sequence chunk by chunk through its memories; for training the
same function is computed in parallel form by :func:`~lola.linearize.hybrid_attention`, with
the parameters of the layer's ``module.lola`` (added by :func:`lola.apply_lola`). Both paths
are tested equal.

Training runs on packed, unpadded chunks: the function refuses padding masks (no mask function
is registered under this name, so transformers passes ``attention_mask=None`` for causal
sequences) and caches.
"""

from __future__ import annotations

from typing import Any

import torch

from lola.linearize.hybrid import hybrid_attention, state_features

__all__ = ["HYBRID_ATTENTION", "hybrid_attention_forward", "hybrid_window", "register_hybrid_attention"]

HYBRID_ATTENTION = "lola_hybrid"


def hybrid_window(attn: torch.nn.Module) -> int:
    """The window ``η`` of a LoLA layer that is a pure hybrid (uniform window, no sinks, no sparse
    cache, token-wise schedule); anything else has no parallel training form here."""
    window = getattr(attn, "_hybrid_window", None)
    if window is None:
        memory = attn.memory_factory()
        if memory.window.head_sizes is not None or memory.sinks.capacity or memory.sparse.capacity or memory.schedule.period != 1:
            raise ValueError(
                f"the training hybrid needs a LoLA config with one window size, sinks=0, sparse_size=0 and schedule='tokenwise'; the layer has {memory.spec()}"
            )
        window = attn._hybrid_window = int(memory.window.size)
    return window


def hybrid_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: the hybrid of ``module.lola`` over the whole sequence.

    Args:
        module: an attention module prepared by :func:`lola.apply_lola` (``module.lola``).
        query: ``[B, H, T, D]``; key, value: ``[B, H_kv, T, D]`` (post-RoPE).
        attention_mask: must be ``None`` (packed training chunks have no padding).
        kwargs: the model's ``position_ids [B, T]`` (absent: ``0 … T − 1``), where a layer with
            bounded positions moves its state's queries and keys from.

    Returns:
        ``(attn_output [B, T, H, D] in the query's dtype, None)``.
    """
    attn = getattr(module, "lola", None)
    if attn is None:
        raise ValueError(f"layer {getattr(module, 'layer_idx', '?')} has no LoLA layer: apply_lola(model, config) before training the hybrid")
    if attention_mask is not None:
        raise ValueError("the training hybrid takes packed chunks without padding; got an attention mask")
    if dropout:
        raise ValueError("the training hybrid does not implement attention dropout")
    window = hybrid_window(attn)
    groups = attn.num_heads // attn.num_kv_heads
    k, v = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    pos = kwargs.get("position_ids")
    if pos is None:
        pos = torch.arange(query.shape[2], device=query.device)[None, :]
    # a layer with bounded positions (maps trained for them) moves its state's queries and keys
    fq, fk = state_features(attn, query, k, attn.positions, pos.to(query.device).expand(query.shape[0], -1))
    gate = torch.sigmoid(attn.window_factors.float()).view(-1)
    scale = attn.scale if scaling is None else scaling
    y = hybrid_attention(query, k, v, fq, fk, gate, window, scale, attn.mixing, attn.affine)
    return y.transpose(1, 2).to(query.dtype), None


def register_hybrid_attention() -> None:
    """Register ``"lola_hybrid"`` with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(HYBRID_ATTENTION, hybrid_attention_forward)
