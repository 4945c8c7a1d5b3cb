"""Teacher activations: each layer's post-RoPE ``q, k, v`` and its softmax output.

Attention transfer trains each layer's feature maps against that layer's own softmax
attention, a function of the layer's ``(q, k, v)`` alone. So the frozen model runs once per
text chunk and every layer's inputs and target are kept (bf16, on the CPU); training then
never runs the model again.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Iterable

import torch

__all__ = ["LayerActivations", "collect_activations"]

TEACHER_ATTENTION = "lola_teacher"
_RECORD: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lola_teacher_record", default=None)


@dataclass
class LayerActivations:
    """One layer on one chunk (``B = 1``).

    Attributes:
        q: ``[1, H, T, D]`` post-RoPE queries.
        k, v: ``[1, H_kv, T, D]`` post-RoPE keys and values.
        y: ``[1, H, T, D]`` the softmax attention output (before ``o_proj``): the target.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    y: torch.Tensor


def _teacher_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any
):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    record = _RECORD.get()
    if record is not None:
        keep = dict(dtype=record["dtype"], device="cpu")
        record["layers"][module.layer_idx] = LayerActivations(
            q=query.detach().to(**keep),
            k=key.detach().to(**keep),
            v=value.detach().to(**keep),
            y=out.detach().transpose(1, 2).to(**keep),  # sdpa returns [B, T, H, D]
        )
    return out, weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TEACHER_ATTENTION, _teacher_attention)
    AttentionMaskInterface.register(TEACHER_ATTENTION, sdpa_mask)


@torch.no_grad()
def collect_activations(
    model: torch.nn.Module,
    chunks: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    progress: Iterable | None = None,
    position_ids: torch.Tensor | None = None,
) -> list[dict[int, LayerActivations]]:
    """Run the frozen ``model`` over each chunk and keep every layer's activations.

    Args:
        model: a stock transformers decoder (LoLA not applied).
        chunks: ``[n, T]`` token ids, one sequence per chunk.
        dtype: storage dtype of the activations.
        progress: optional wrapper for the chunk loop (e.g. ``tqdm``).
        position_ids: ``[n, T]`` the positions each chunk's tokens are rotated at (PoSE), or
            ``None``: ``0 … T − 1``.

    Returns:
        One ``{layer_idx: LayerActivations}`` per chunk.
    """
    if getattr(model, "_lola", None) is not None:
        raise ValueError("collect_activations needs the stock model: call remove_lola(model) first")
    if chunks.dim() != 2:
        raise ValueError(f"chunks must be [n, T] token ids, got shape {tuple(chunks.shape)}")
    if position_ids is not None and tuple(position_ids.shape) != tuple(chunks.shape):
        raise ValueError(f"position_ids must be [n, T] = {tuple(chunks.shape)} like chunks, got shape {tuple(position_ids.shape)}")
    _register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(TEACHER_ATTENTION)
    device = next(model.parameters()).device
    out = []
    try:
        rows = progress(range(chunks.shape[0])) if progress is not None else range(chunks.shape[0])
        for i in rows:
            record = {"dtype": dtype, "layers": {}}
            token = _RECORD.set(record)
            try:
                ids = chunks[i : i + 1].to(device)
                # Given positions with a skip and no mask, transformers reads the skip as the start of
                # a packed sequence and splits the attention there: a mask of ones keeps it causal by index.
                pos, mask = (None, None) if position_ids is None else (position_ids[i : i + 1].to(device), torch.ones_like(ids))
                model(ids, position_ids=pos, attention_mask=mask, use_cache=False, logits_to_keep=1)  # no full-vocab logits
            finally:
                _RECORD.reset(token)
            out.append(record["layers"])
    finally:
        model.set_attn_implementation(previous)
    return out
