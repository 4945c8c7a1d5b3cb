"""apply_lola / remove_lola: turn a transformers decoder model's attention into LoLA and back."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

from lola.config import LoLAConfig
from lola.integrations.transformers.attention import ATTENTION_NAME, read_padding_only, register_attention
from lola.integrations.transformers.generation import install_forward_check, install_generation_hook, remove_forward_check, remove_generation_hook
from lola.integrations.transformers.merged import install_save_hook, remove_save_hook
from lola.integrations.transformers.model_record import CONFIG_KEY, AppliedLoLA, config_entry
from lola.integrations.transformers.support import check_architecture, check_flag
from lola.layer import LoLAAttention, compose
from lola.pretrained.geometry import attention_geometry, attention_modules

if TYPE_CHECKING:  # pragma: no cover
    from lola.pretrained.folder import FeatureMaps

__all__ = ["apply_lola", "attention_modules", "patch", "remove_lola"]


def apply_lola(
    model: torch.nn.Module, config: LoLAConfig | None = None, feature_maps: "str | os.PathLike | FeatureMaps | None" = None, *, force: bool = False
) -> torch.nn.Module:
    """Make every attention layer of ``model`` a LoLA layer (in place; returns ``model``).

    Each attention module gets a ``lola`` submodule (:class:`lola.LoLAAttention`: feature maps
    and window factors, trainable and saved with the model), the model's attention
    implementation becomes ``"lola"`` (function and mask registered with transformers; every
    forward checks it still is), and layers listed in ``config.full_attention_layers`` keep
    stock attention. Per-layer settings come from ``config.layer_overrides``. The softmax scale
    is the module's own ``scaling`` unless ``config.scale`` is set.

    Args:
        model: a transformers Llama-family model (``LlamaForCausalLM``, ``MistralForCausalLM``,
            ``Qwen2ForCausalLM``, …).
        config: the LoLA configuration (default ``LoLAConfig()``).
        feature_maps: a folder written by ``lola linearize`` (:mod:`lola.pretrained.folder`),
            or one already read (:class:`~lola.pretrained.FeatureMaps`):
            its trained maps and window factors are loaded into every LoLA layer, and its
            ``feature_map``, ``feature_dim``, ``mixing`` and ``affine`` fill in whatever
            ``config`` leaves unset. A folder of stage 2 also holds LoRA adapters: they are
            merged into the q, k, v, o projections (and taken out again by
            :func:`remove_lola`). A registered name (``"smollm2-135m-instruct"``) loads the
            maps shipped with lola (:mod:`lola.pretrained.shipped`). Refused with a ``ValueError`` if it was trained for a
            model of another shape or ``config`` sets a conflicting feature map.
        force: apply LoLA even to an architecture whose attention it does not reproduce. By
            default such a model is refused with a ``ValueError`` saying why (soft-capped
            logits as in Gemma 2, ALiBi, learned attention sinks, no rotary embeddings, or a
            ``model_type`` not in ``lola.integrations.transformers.support.VERIFIED_MODEL_TYPES``).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a transformers model (a torch.nn.Module), got {type(model).__name__}: load it first (lola.models.load or transformers)")
    config = LoLAConfig() if config is None else config
    if not isinstance(config, LoLAConfig):
        raise TypeError(f"config must be a lola.LoLAConfig, got {type(config).__name__}")
    check_flag("force", force)
    if getattr(model, "_lola", None) is not None:
        raise ValueError("LoLA is already applied to this model; call remove_lola(model) first")
    if not force:
        check_architecture(model, stock_layers=config.full_attention_layers)
    maps = None
    if feature_maps is not None:
        from lola.pretrained.folder import FeatureMaps, check_geometry, read_feature_maps

        maps = feature_maps if isinstance(feature_maps, FeatureMaps) else read_feature_maps(feature_maps)
        check_geometry(maps, model)
        config = maps.merge_into(config)
    if config.mixing == "softmax_only" and config.linear_share_cap is not None and config.linear_share_cap < 1:
        # (decidable only now: trained maps may make an unset rule the paper's, where it acts)
        raise ValueError(
            f"linear_share_cap={config.linear_share_cap} caps the linear state's share of each output, and under mixing='softmax_only' "
            "(the rule without trained feature maps) the output reads no state: drop it, or set mixing='lola_authors'"
        )
    modules = attention_modules(model)
    num_layers = len(modules)
    bad = [i for i in config.full_attention_layers if i >= num_layers]
    if bad:
        raise ValueError(f"full_attention_layers {bad} out of range: the model has {num_layers} layers")
    if num_layers and len(set(config.full_attention_layers)) >= num_layers:
        raise ValueError(
            f"full_attention_layers {sorted(config.full_attention_layers)} covers every one of the model's {num_layers} layers: "
            "nothing would run LoLA; leave at least one layer out (or do not apply LoLA)"
        )
    bad = [i for i in config.layer_overrides if i >= num_layers]
    if bad:
        raise ValueError(f"layer_overrides for layers {bad} out of range: the model has {num_layers} layers")
    rotary = None
    if config.positions == "bounded":  # the layers re-rotate with the model's own rotary embedding
        from lola.core.positions import RotaryEmbedding
        from lola.pretrained.resolve import resolve_positions

        # (the maps' fields are merged above)
        config = resolve_positions(config, getattr(model.config, "max_position_embeddings", None), maps.trained_length if maps is not None else None)
        rotary = RotaryEmbedding.from_model(model)
    register_attention()
    by_layer: dict[int, LoLAAttention] = {}
    for module in modules:
        i = module.layer_idx
        if i in config.full_attention_layers:
            continue
        heads, kv_heads, head_dim = attention_geometry(module)
        layer_cfg = config.for_layer(i)
        if layer_cfg.scale is None and getattr(module, "scaling", None) is not None:
            layer_cfg = layer_cfg.model_copy(update={"scale": float(module.scaling)})
        weight = module.q_proj.weight
        lola_attn = compose(layer_cfg, num_heads=heads, head_dim=head_dim, num_kv_heads=kv_heads, layer=i, rotary=rotary).to(weight.device)
        module.lola = lola_attn
        by_layer[i] = lola_attn
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION_NAME)
    model._lola = AppliedLoLA(
        config=config,
        previous_attn_implementation=previous,
        num_layers=num_layers,
        full_attention_layers=list(config.full_attention_layers),
        modules=by_layer,
        fingerprint=_fingerprint(model, config, num_layers),
    )
    read_padding_only(model.config, every_layer=not config.full_attention_layers)
    install_generation_hook(model)
    install_forward_check(model)
    install_save_hook(model)  # records the LoRA-merged projections as saved
    model.config.lola = config_entry(config, lora_merged=False)  # save_pretrained writes it to config.json
    if maps is not None:
        import re

        from lola.integrations.transformers.lolcats import load_lolcats_checkpoint

        # layers kept as full attention have nothing to load
        keep = {k: v for k, v in maps.tensors.items() if int(re.search(r"layers\.(\d+)\.", k).group(1)) in by_layer}
        try:
            load_lolcats_checkpoint(model, keep)
            if maps.lora is not None:
                from lola.pretrained.lora import merge_lora

                model._lola.merged_weights = merge_lora(model, maps.lora, maps.lora_spec, layers=set(by_layer))  # not into full-attention layers
        except Exception:
            remove_lola(model)  # leave the model as it came
            raise
        model._lola.feature_maps = maps.path
        model.config.lola = config_entry(config, lora_merged=bool(model._lola.merged_weights))
    return model


def remove_lola(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`apply_lola`: drop the ``lola`` submodules and restore the attention implementation."""
    info = getattr(model, "_lola", None)
    if info is None:
        raise ValueError("LoLA is not applied to this model")
    for module in attention_modules(model):
        if hasattr(module, "lola"):
            del module.lola
    model.set_attn_implementation(info.previous_attn_implementation)
    if info.merged_weights:
        from lola.pretrained.lora import restore_weights

        restore_weights(model, info.merged_weights)  # the stock projections, bit for bit
    read_padding_only(model.config, every_layer=False)
    remove_generation_hook(model)
    remove_forward_check(model)
    remove_save_hook(model)
    if hasattr(model.config, CONFIG_KEY):
        delattr(model.config, CONFIG_KEY)
    del model._lola
    return model


@contextmanager
def patch(
    model: torch.nn.Module, config: LoLAConfig | None = None, feature_maps: "str | os.PathLike | FeatureMaps | None" = None, *, force: bool = False
) -> Iterator[torch.nn.Module]:
    """``with lola.patch(model, cfg):`` — :func:`apply_lola` on entry, :func:`remove_lola` on exit.

    The model is restored even if the body raises. Yields ``model``.
    """
    check_flag("force", force)
    apply_lola(model, config, feature_maps=feature_maps, force=force)
    try:
        yield model
    finally:
        remove_lola(model)


def _fingerprint(model: torch.nn.Module, config: LoLAConfig, num_layers: int) -> dict:
    cfg = model.config
    return {
        "model_type": getattr(cfg, "model_type", type(model).__name__),
        "name_or_path": str(getattr(cfg, "name_or_path", "") or getattr(cfg, "_name_or_path", "")),
        "num_layers": num_layers,
        "hidden_size": getattr(cfg, "hidden_size", None),
        "num_attention_heads": getattr(cfg, "num_attention_heads", None),
        "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "lola_config": config.model_dump(mode="json"),
    }
