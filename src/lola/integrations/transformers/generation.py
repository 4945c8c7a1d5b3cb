"""``model.generate(ids)`` on a LoLA model gets a :class:`LoLACache` without being asked.

transformers' ``generate`` builds its default cache in ``_prepare_cache_for_generation``
(a ``DynamicCache``, which would hand LoLA layers every past key). :func:`apply_lola` shadows
that method on the model *instance* (the class and other models are untouched) so that any
caller that passes no cache — pipelines, lm-eval, TRL — gets a fresh ``LoLACache``; a cache
LoLA cannot use, and a request that would run past ``max_position_embeddings``, are refused
before any compute. ``_prepare_position_ids_for_generation`` is shadowed too: an
``attention_mask`` whose shape is not the prompt's is refused there, before generate derives
positions from it. :func:`remove_lola` takes the shadows away.

Every forward, with a cache or without, first runs
:func:`~lola.integrations.transformers.model_record.check_attention_implementation` and
:func:`check_attention_mask` and :func:`check_input_ids` (a forward pre-hook, :func:`install_forward_check`): a model switched to another attention implementation
after ``apply_lola`` is refused instead of running stock attention. A switch made on purpose
(stage 2 of ``lola linearize`` runs its teacher passes on the stock attention) goes through
:func:`~lola.integrations.transformers.model_record.attention_switched`.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch

__all__ = [
    "check_attention_mask",
    "check_cache",
    "check_generation_length",
    "check_input_ids",
    "install_forward_check",
    "install_generation_hook",
    "remove_forward_check",
    "remove_generation_hook",
]

_HOOK = "_prepare_cache_for_generation"
_CACHE_KWARGS = ("cache", "past_key_values")  # the name generate uses (transformers >= 5.24), and the old one


def check_cache(model: torch.nn.Module, cache: Any) -> None:
    """Refuse ``cache`` unless it is a :class:`LoLACache` built for ``model`` as it is patched now."""
    from lola.integrations.transformers.cache import LoLACache

    if not isinstance(cache, LoLACache):
        raise ValueError(f"a LoLA model needs a lola LoLACache, got a {type(cache).__name__}: pass no cache (generate builds one) or cache=LoLACache(model)")
    cache.check_model(model)


def check_generation_length(model: torch.nn.Module, positions_needed: int) -> None:
    """Refuse a generation that would feed positions past the model's ``max_position_embeddings``
    unless every layer bounds its positions (:func:`~lola.integrations.transformers.model_record.context_limit`):
    with absolute positions LoLA's exact tokens keep their rotary positions, and beyond the trained
    range the model's (and the feature maps') behaviour is unmeasured: refused, as
    :meth:`LoLACache.load` does."""
    from lola.integrations.transformers.model_record import context_limit

    positions = context_limit(model)
    if positions is not None and positions_needed > positions:
        raise ValueError(
            f"generate would feed {positions_needed} positions (the prompt plus max_new_tokens, less the last token), past the model's "
            f"max_position_embeddings ({positions}): lower max_new_tokens (or max_length) so that prompt + new tokens is at most {positions + 1}, "
            "or apply LoLA with positions='bounded'"
        )


def _prepare_cache_for_generation(self: torch.nn.Module, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any) -> Any:
    from lola.integrations.transformers.cache import LoLACache

    # transformers passes (generation_mode, batch_size, max_cache_length): the positions the
    # cache will be fed, max_length - 1.
    most = kwargs.get("max_cache_length", args[2] if len(args) > 2 else None)
    if type(most) is int:
        check_generation_length(self, most)
    given = [model_kwargs[k] for k in _CACHE_KWARGS if model_kwargs.get(k) is not None]
    if given:
        check_cache(self, given[0])
    elif generation_config.use_cache is not False:
        impl = generation_config.cache_implementation
        if impl not in (None, "dynamic"):
            raise ValueError(f"cache_implementation={impl!r} does not apply to a LoLA model (its cache is a LoLACache); leave it unset")
        cache = LoLACache(self)
        cache.check_model(self)  # e.g. the attention implementation was switched away from LoLA's
        model_kwargs["cache"] = cache
        return None
    return type(self)._prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs)


def _prepare_position_ids_for_generation(self: torch.nn.Module, inputs_tensor: Any, model_kwargs: dict, *args: Any, **kwargs: Any) -> Any:
    # The one place where generate holds both the prompt and the user's 2-D mask: it derives the
    # positions from the mask here, then drops an all-ones mask, so a mask of another length
    # would shift every position silently (or fail deep in the rotary embedding).
    mask = model_kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and isinstance(inputs_tensor, torch.Tensor) and mask.dim() == 2 and tuple(mask.shape) != tuple(inputs_tensor.shape[:2]):
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)}, expected {tuple(inputs_tensor.shape[:2])}: that of the input ids, one column per token"
        )
    return type(self)._prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs, *args, **kwargs)


_HOOKS = {_HOOK: _prepare_cache_for_generation, "_prepare_position_ids_for_generation": _prepare_position_ids_for_generation}


def install_generation_hook(model: torch.nn.Module) -> None:
    """Shadow ``model._prepare_cache_for_generation`` and ``_prepare_position_ids_for_generation``
    (this instance only)."""
    for name, hook in _HOOKS.items():
        if hasattr(type(model), name):
            setattr(model, name, MethodType(hook, model))


def remove_generation_hook(model: torch.nn.Module) -> None:
    """Undo :func:`install_generation_hook`."""
    for name in _HOOKS:
        model.__dict__.pop(name, None)


def check_attention_mask(input_ids: Any, attention_mask: Any, cache: Any) -> None:
    """Refuse an ``attention_mask`` that does not cover ``[B, past + T]`` for inputs ``[B, T]``
    (``past``: the tokens ``cache`` holds; stock attention would broadcast some mismatches silently)."""
    if not isinstance(attention_mask, torch.Tensor) or not isinstance(input_ids, torch.Tensor) or attention_mask.dim() != 2 or input_ids.dim() < 2:
        return
    past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    batch, new = input_ids.shape[0], input_ids.shape[1]
    if tuple(attention_mask.shape) != (batch, past + new):
        held = f" + {past} cached" if past else ""
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected ({batch}, {past + new}): one row per sequence and one column "
            f"per token ({new} new{held})"
        )
    # Values, for a prompt only (one read back, not one per decoded token): a 2 or a 0.5 would be
    # read as a real token by one part of the model and as padding by another.
    if new > 1 and attention_mask.dtype != torch.bool and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (a real token), got values {sorted(set(attention_mask.unique().tolist()))[:6]}")


def check_input_ids(input_ids: Any, vocab_size: Any) -> None:
    """Refuse an empty batch, ids that are not integers, and (for a prompt of more than one
    token: one read back, not one per decoded token) ids outside ``[0, vocab_size)``, which the
    embedding would meet as an index error (on CUDA a device-side assert that ends the process's
    use of the device)."""
    if not isinstance(input_ids, torch.Tensor):
        return
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must hold at least one sequence, got an empty batch of shape {tuple(input_ids.shape)}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor of token ids, got {input_ids.dtype}")
    if input_ids.shape[1] > 1 and input_ids.numel() and type(vocab_size) is int and vocab_size > 0:
        low, high = (int(x) for x in torch.stack([input_ids.min(), input_ids.max()]).tolist())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"input_ids hold token id {bad}, outside the model's vocabulary [0, {vocab_size}): ids from another tokenizer?")


def _check_forward(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    from lola.integrations.transformers.model_record import check_attention_implementation

    check_attention_implementation(model)  # attribute reads: nothing waits for the device
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is not None:
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        check_input_ids(ids, getattr(embedding, "num_embeddings", None))
        if isinstance(ids, torch.Tensor) and ids.shape[-1] == 0 and kwargs.get("inputs_embeds") is None:
            raise ValueError(f"input_ids hold no tokens (shape {tuple(ids.shape)}): give at least one token per sequence")
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    cache = next((kwargs[k] for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
    check_attention_mask(ids, kwargs.get("attention_mask"), cache)  # shapes only
    if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
        _check_forward_positions(model, cache, ids.shape[1])


def _check_forward_positions(model: torch.nn.Module, cache: Any, tokens: int) -> None:
    """Refuse a forward whose tokens reach past the model's positions unless every layer bounds
    its positions (as :func:`check_generation_length` does for ``generate()``): the cache's
    tokens so far (a host count) and this call's."""
    from lola.integrations.transformers.model_record import context_limit

    positions = context_limit(model)
    if positions is None:
        return
    seen = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    seen = int(seen) if isinstance(seen, (int, torch.Tensor)) else 0
    if seen + tokens > positions:
        raise ValueError(
            f"this forward would feed positions up to {seen + tokens} ({seen} in the cache and {tokens} now), past the model's "
            f"max_position_embeddings ({positions}): with absolute positions (or a layer left as full attention) LoLA reads past the "
            "trained range unmeasured; apply LoLA with positions='bounded' to every layer, or feed fewer tokens"
        )


def install_forward_check(model: torch.nn.Module) -> None:
    """Check the attention implementation and the attention mask's shape before every forward of
    ``model`` (the hook's handle is kept in ``model._lola.forward_check``)."""
    model._lola.forward_check = model.register_forward_pre_hook(_check_forward, with_kwargs=True)


def remove_forward_check(model: torch.nn.Module) -> None:
    """Undo :func:`install_forward_check`."""
    handle = getattr(model._lola, "forward_check", None)
    if handle is not None:
        handle.remove()
        model._lola.forward_check = None
