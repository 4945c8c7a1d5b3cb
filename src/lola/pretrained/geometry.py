"""The attention modules of a transformers decoder model and their shape (heads, K/V heads, head size).

Shared by :func:`~lola.integrations.transformers.apply_lola`, the feature-map folders and linearization
(:mod:`lola.pretrained.folder`, :mod:`lola.linearize.transfer`); it imports nothing else of lola.
"""

from __future__ import annotations

import torch

__all__ = ["attention_geometry", "attention_modules"]


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention modules of a decoder model, ordered by ``layer_idx``.

    A module qualifies if it has ``layer_idx``, ``q_proj``, ``k_proj`` and ``v_proj`` (the
    Llama family: Llama, Mistral, Qwen2, SmolLM, …).
    """
    found = [m for m in model.modules() if all(hasattr(m, a) for a in ("layer_idx", "q_proj", "k_proj", "v_proj"))]
    if not found:
        raise ValueError(f"found no Llama-style attention modules (with layer_idx, q_proj, k_proj, v_proj) in {type(model).__name__}")
    found.sort(key=lambda m: m.layer_idx)
    return found


def attention_geometry(module: torch.nn.Module) -> tuple[int, int, int]:
    """``(query heads, K/V heads, head_dim)`` of one attention module (from its model config)."""
    cfg = module.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(module, "head_dim", None) or getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return heads, kv_heads, head_dim
