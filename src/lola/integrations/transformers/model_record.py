"""What :func:`~lola.integrations.transformers.apply_lola` records on a model: ``model._lola``
(:class:`AppliedLoLA`) and the ``model.config.lola`` entry that ``save_pretrained`` writes to
``config.json`` (:func:`config_entry`, read back by :func:`saved_config`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from lola.config import LoLAConfig
from lola.layer import LoLAAttention
from lola.pretrained.model_entry import CONFIG_KEY, config_entry, entry_config

__all__ = ["CONFIG_KEY", "AppliedLoLA", "applied", "attention_switched", "check_attention_implementation", "config_entry", "context_limit", "saved_config"]


@dataclass
class AppliedLoLA:
    """The record of one :func:`apply_lola` call, kept as ``model._lola`` until :func:`remove_lola`.

    Attributes:
        config: the LoLA configuration in effect (after a feature-map folder filled in its fields).
        previous_attn_implementation: the attention implementation restored by ``remove_lola``.
        num_layers: decoder layers of the model.
        full_attention_layers: layers left as stock attention.
        modules: ``{layer index: LoLAAttention}`` of the LoLA layers.
        fingerprint: what a saved cache must match (model shape, config, weight digest).
        merged_weights: stock projection weights replaced by merged LoRA ones (restored on removal).
        feature_maps: the folder the trained maps came from, or ``None``.
        forward_check: the handle of the forward pre-hook that runs
            :func:`check_attention_implementation` (removed by ``remove_lola``).
        deliberate_implementation: the attention implementation a model runs on purpose inside
            :func:`attention_switched` (stage 2's teacher passes), or ``None``.
    """

    config: LoLAConfig
    previous_attn_implementation: str | None
    num_layers: int
    full_attention_layers: list[int]
    modules: dict[int, LoLAAttention]
    fingerprint: dict[str, Any] = field(default_factory=dict)
    merged_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    feature_maps: str | None = None
    forward_check: Any = None
    deliberate_implementation: str | None = None


def saved_config(model_config: Any) -> LoLAConfig | None:
    """The :class:`~lola.LoLAConfig` recorded in a transformers config, or ``None``.

    Raises ``ValueError`` if the ``lola`` entry is present but not one this version wrote
    (:func:`lola.pretrained.model_entry.entry_config`).
    """
    entry = getattr(model_config, CONFIG_KEY, None)
    return None if entry is None else entry_config(entry)


def applied(model: torch.nn.Module, needed_by: str | None = None) -> AppliedLoLA | None:
    """``model``'s :class:`AppliedLoLA`, or ``None`` if LoLA is not applied.

    With ``needed_by`` (a function name for the message), a model without LoLA raises ``ValueError``.
    """
    info = getattr(model, "_lola", None)
    if info is None and needed_by is not None:
        raise ValueError(f"{needed_by} needs a model prepared with lola.apply_lola(model, config)")
    return info


def context_limit(model: torch.nn.Module) -> int | None:
    """The positions ``model`` may be fed: ``None`` (no limit) when LoLA is applied with bounded
    positions to every layer (every read then sees positions the model was trained on, however
    long the stream), else its ``max_position_embeddings`` (``None`` if it has none): full
    attention, and LoLA with absolute positions, would read past the trained range."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    positions = positions if type(positions) is int and positions > 0 else None
    info = getattr(model, "_lola", None)
    if info is None or info.full_attention_layers or not info.modules:
        return positions
    if all(m.positions is not None for m in info.modules.values()):
        return None
    return positions


def check_attention_implementation(model: torch.nn.Module) -> None:
    """Refuse a LoLA model whose attention implementation is no longer LoLA's
    (``model.set_attn_implementation("sdpa")`` after ``apply_lola``): its layers would run stock
    attention without a word. Run before every forward and by ``LoLACache.check_model``.

    Accepted: ``"lola"``, an attention function lola registered (the training hybrid of
    ``lola linearize``, which computes the same layers in parallel form), and the implementation
    of an :func:`attention_switched` block (stage 2's teacher passes).
    """
    from lola.integrations.transformers.attention import ATTENTION_NAME

    impl = getattr(model.config, "_attn_implementation", None)
    if impl == ATTENTION_NAME:
        return
    info = getattr(model, "_lola", None)
    if info is not None and impl == info.deliberate_implementation:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    function = ALL_ATTENTION_FUNCTIONS.get(impl) if isinstance(impl, str) else None
    if not (getattr(function, "__module__", None) or "").startswith("lola."):
        raise ValueError(
            f"LoLA is applied to this model but its attention implementation is now {impl!r}: its layers would not run LoLA; "
            f"call model.set_attn_implementation({ATTENTION_NAME!r}) again, or remove_lola(model) to use the stock model"
        )


@contextmanager
def attention_switched(model: torch.nn.Module, implementation: str) -> Iterator[None]:
    """Run a LoLA model on another attention implementation on purpose, inside the block only
    (e.g. the stock teacher passes of ``lola linearize`` stage 2); the previous one is restored
    after it. Outside such a block a switched model refuses to run
    (:func:`check_attention_implementation`)."""
    info = getattr(model, "_lola", None)
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    if info is not None:
        info.deliberate_implementation = implementation
    try:
        yield
    finally:
        if info is not None:
            info.deliberate_implementation = None
        model.set_attn_implementation(previous)
