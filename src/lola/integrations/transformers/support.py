"""Which transformers architectures LoLA reproduces, and the check :func:`apply_lola` runs.

LoLA's attention function receives the projected, normalised and rotated queries, keys and
values of a layer and computes softmax attention over its memories (plus the linear state).
With a window that covers the whole sequence it must give the stock model's output; that
holds when the model's attention is plain causal softmax of ``q·k · scaling``. It does not hold
for attention that soft-caps its logits (Gemma 2), restricts itself to a sliding window shorter
than the context (Mistral's ``sliding_window``, Gemma 3's local layers), adds position biases (ALiBi), has learned
attention sinks (gpt-oss), or scales queries before the attention function while passing
another ``scaling`` (OPT). Architectures are therefore allowed by name, each checked on a tiny
random model (stock logits equal to LoLA's with nothing evicted), and refused otherwise unless
the caller passes ``force=True``.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

__all__ = ["VERIFIED_MODEL_TYPES", "check_architecture", "check_flag", "unsupported_reason"]

# model_type values whose attention LoLA reproduces (checked with transformers 5.24: logits of
# a tiny random model with LoLA, window >= sequence, softmax_only, equal the stock ones).
VERIFIED_MODEL_TYPES = frozenset(
    {
        "apertus",
        "arcee",
        "cohere",
        "cohere2",
        "exaone4",
        "gemma",
        "gemma2",
        "gemma3_text",
        "glm",
        "glm4",
        "granite",
        "granitemoe",
        "helium",
        "llama",
        "ministral",
        "mistral",
        "mixtral",
        "nemotron",
        "olmo",
        "olmo2",
        "olmo3",
        "phi",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "seed_oss",
        "smollm3",
        "stablelm",
        "starcoder2",
    }
)


def _softcap_reason(config: object) -> str | None:
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        return f"soft-caps its attention logits (attn_logit_softcapping={softcap}), which LoLA does not"
    return None


def _alibi_reason(config: object) -> str | None:
    if getattr(config, "alibi", False) or getattr(config, "position_embedding_type", None) == "alibi":
        return "adds ALiBi position biases to its attention logits, which LoLA does not"
    return None


def _sinks_reason(model: torch.nn.Module) -> str | None:
    for module in model.modules():
        if all(hasattr(module, a) for a in ("q_proj", "k_proj", "v_proj")) and isinstance(getattr(module, "sinks", None), torch.Tensor):
            return "has learned attention sinks (extra softmax logits per head), which LoLA does not"
    return None


def _sliding_window_reason(config: object, stock_layers: Collection[int] = ()) -> str | None:
    """A sliding window the model applies within its own context: stock attention forgets what
    lies beyond it, LoLA would not (its sparse cache and state keep it), so outputs differ.
    Only layers LoLA runs matter: those in ``stock_layers`` keep their own attention."""
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    stock = set(stock_layers)
    layer_types = list(getattr(config, "layer_types", None) or [])
    if layer_types:
        sliding = [i for i, t in enumerate(layer_types) if t == "sliding_attention" and i not in stock]
        if not sliding:
            return None
    else:  # every layer slides
        count = getattr(config, "num_hidden_layers", None)
        sliding = [i for i in range(int(count)) if i not in stock] if isinstance(count, int) and stock else None
        if sliding == []:
            return None
    context = getattr(config, "max_position_embeddings", None)
    if context is not None and int(window) >= int(context):
        return None  # the window never binds
    layers = sliding if sliding is not None else "all"
    return f"attends within a sliding window of {window} tokens (layers {layers}) in a {context}-token context, which LoLA does not reproduce"


def _rotary_reason(model: torch.nn.Module) -> str | None:
    if not any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()):
        return "has no rotary position embeddings (LoLA's policies and feature maps assume RoPE-rotated keys)"
    return None


def unsupported_reason(model: torch.nn.Module, stock_layers: Collection[int] = ()) -> str | None:
    """Why LoLA would not reproduce ``model``'s attention, or ``None`` if it does.

    Checks, in order: logit soft-capping, ALiBi, learned attention sinks, a sliding window that
    binds within the model's context on a layer LoLA runs (not one of ``stock_layers``, the
    config's ``full_attention_layers``), rotary embeddings, and finally whether
    ``model.config.model_type`` is in :data:`VERIFIED_MODEL_TYPES`.
    """
    config = getattr(model, "config", None)
    for reason in (_softcap_reason(config), _alibi_reason(config), _sinks_reason(model), _sliding_window_reason(config, stock_layers), _rotary_reason(model)):
        if reason is not None:
            return reason
    model_type = getattr(config, "model_type", None)
    if model_type not in VERIFIED_MODEL_TYPES:
        return f"is not an architecture whose attention LoLA is verified to reproduce (verified model_type values: {', '.join(sorted(VERIFIED_MODEL_TYPES))})"
    return None


def check_flag(name: str, value: object) -> None:
    """Refuse a flag of the public API that is not a real ``bool``: ``bool("false")`` is true,
    so a string or a number would silently mean something else.

    Raises:
        TypeError: naming the flag and what it got.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_architecture(model: torch.nn.Module, stock_layers: Collection[int] = ()) -> None:
    """Refuse a model whose attention LoLA does not reproduce (see :func:`unsupported_reason`;
    ``stock_layers``, the config's ``full_attention_layers``, keep stock attention).

    Raises:
        ValueError: naming the model, its ``model_type`` and the reason; ``apply_lola(...,
            force=True)`` skips this check.
    """
    reason = unsupported_reason(model, stock_layers)
    if reason is not None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise ValueError(f"{type(model).__name__} (model_type {model_type!r}) {reason}: LoLA would change its outputs; pass force=True to apply it anyway")
