"""``model.generate(ids)`` on a LoLA model gets a :class:`LoLACache` without being asked.

transformers' ``generate`` builds its default cache in ``_prepare_cache_for_generation``
(a ``DynamicCache``, which would hand LoLA layers every past key). :func:`apply_lola` shadows
that method on the model *instance* (the class and other models are untouched) so that any
caller that passes no cache — pipelines, lm-eval, TRL — gets a fresh ``LoLACache``; a cache
LoLA cannot use is refused before any compute. :func:`remove_lola` takes the shadow away.

Every forward, with a cache or without, first runs
:func:`~lola.integrations.transformers.applied.check_attention_implementation` (a forward
pre-hook, :func:`install_forward_check`): a model switched to another attention implementation
after ``apply_lola`` is refused instead of running stock attention. A switch made on purpose
(stage 2 of ``lola linearize`` runs its teacher passes on the stock attention) goes through
:func:`~lola.integrations.transformers.applied.attention_switched`.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch

__all__ = ["check_cache", "install_forward_check", "install_generation_hook", "remove_forward_check", "remove_generation_hook"]

_HOOK = "_prepare_cache_for_generation"
_CACHE_KWARGS = ("cache", "past_key_values")  # the name generate uses (transformers >= 5.24), and the old one


def check_cache(model: torch.nn.Module, cache: Any) -> None:
    """Refuse ``cache`` unless it is a :class:`LoLACache` built for ``model`` as it is patched now."""
    from lola.integrations.transformers.cache import LoLACache

    if not isinstance(cache, LoLACache):
        raise ValueError(f"a LoLA model needs a lola LoLACache, got a {type(cache).__name__}: pass no cache (generate builds one) or cache=LoLACache(model)")
    cache.check_model(model)


def _prepare_cache_for_generation(self: torch.nn.Module, generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any) -> Any:
    from lola.integrations.transformers.cache import LoLACache

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


def install_generation_hook(model: torch.nn.Module) -> None:
    """Shadow ``model._prepare_cache_for_generation`` (this instance only)."""
    if hasattr(type(model), _HOOK):
        setattr(model, _HOOK, MethodType(_prepare_cache_for_generation, model))


def remove_generation_hook(model: torch.nn.Module) -> None:
    """Undo :func:`install_generation_hook`."""
    model.__dict__.pop(_HOOK, None)


def _check_forward(model: torch.nn.Module, args: Any) -> None:
    from lola.integrations.transformers.applied import check_attention_implementation

    check_attention_implementation(model)  # attribute reads: nothing waits for the device


def install_forward_check(model: torch.nn.Module) -> None:
    """Check the attention implementation before every forward of ``model`` (the hook's handle is
    kept in ``model._lola.forward_check``)."""
    model._lola.forward_check = model.register_forward_pre_hook(_check_forward)


def remove_forward_check(model: torch.nn.Module) -> None:
    """Undo :func:`install_forward_check`."""
    handle = getattr(model._lola, "forward_check", None)
    if handle is not None:
        handle.remove()
        model._lola.forward_check = None
