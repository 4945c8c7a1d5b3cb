"""Load trained LoLCATs feature maps and window factors into a model prepared with apply_lola.

LoLCATs (Zhang et al. 2024) checkpoints of attention transfer store, per decoder layer,
``model.layers.{i}.self_attn.feature_map_q.mlp.layer`` and ``…feature_map_k.mlp.layer``
(``[H, D, f]``, Hedgehog projections; ``…mlp.bias`` ``[1, H, 1, 1]`` when trained with a
bias) and ``model.layers.{i}.self_attn.window_factors`` (``[1, H, 1, 1]``). Any prefix before
``layers.`` (``base_model.model.model.`` from PEFT, say) is accepted.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict

import torch
from torch import nn

from lola.feature_maps import HedgehogFeatureMap
from lola.integrations.transformers.model_record import applied

__all__ = ["load_lolcats_checkpoint"]

_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.self_attn\.(feature_map_q\.mlp\.layer|feature_map_k\.mlp\.layer|feature_map_q\.mlp\.bias|feature_map_k\.mlp\.bias|window_factors)$"
)


def _read(source: str | os.PathLike | dict) -> dict[str, torch.Tensor]:
    if isinstance(source, dict):
        return source
    path = os.fspath(source)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    # weights_only: a checkpoint file is data, never code to run.
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def load_lolcats_checkpoint(model: nn.Module, source: str | os.PathLike | dict[str, torch.Tensor]) -> list[int]:
    """Copy LoLCATs feature maps and window factors into ``model`` (after :func:`apply_lola`).

    The model must have been prepared with ``feature_map="hedgehog"`` and the checkpoint's
    ``feature_dim`` (``f``, the last axis of ``mlp.layer``).

    Args:
        model: a model prepared with ``apply_lola``.
        source: a ``.pt``/``.bin`` file (loaded with ``weights_only=True``), a
            ``.safetensors`` file, or a state dict.

    Returns:
        The layer indices that were loaded.

    Raises:
        ValueError: no LoLCATs keys, a layer that is not a LoLA layer, a wrong shape, or a layer
            whose checkpoint lacks one of the three tensors.
    """
    info = applied(model, needed_by="load_lolcats_checkpoint")
    found: dict[int, dict[str, torch.Tensor]] = defaultdict(dict)
    for key, tensor in _read(source).items():
        m = _KEY.search(key)
        if m:
            found[int(m.group(1))][m.group(2)] = tensor
    if not found:
        raise ValueError("no LoLCATs keys (layers.{i}.self_attn.feature_map_q.mlp.layer, …, window_factors) in the checkpoint")
    modules = info.modules
    for layer, tensors in sorted(found.items()):
        if layer not in modules:
            raise ValueError(f"the checkpoint has layer {layer}, which is not a LoLA layer of this model (LoLA layers: {sorted(modules)})")
        missing = {"feature_map_q.mlp.layer", "feature_map_k.mlp.layer", "window_factors"} - tensors.keys()
        if missing:
            raise ValueError(f"layer {layer} of the checkpoint lacks {sorted(missing)}")
        attn = modules[layer]
        with torch.no_grad():
            for side in ("q", "k"):
                fmap = getattr(attn, f"feature_map_{side}")
                weight = tensors[f"feature_map_{side}.mlp.layer"]
                if not isinstance(fmap, HedgehogFeatureMap) or tuple(fmap.mlp.layer.shape) != tuple(weight.shape):
                    have = tuple(fmap.mlp.layer.shape) if isinstance(fmap, HedgehogFeatureMap) else type(fmap).__name__
                    raise ValueError(
                        f"layer {layer}: checkpoint feature_map_{side}.mlp.layer is {tuple(weight.shape)} [H, D, f], the model has {have}; "
                        f"apply LoLA with feature_map='hedgehog', feature_dim={weight.shape[-1]}"
                    )
                fmap.mlp.layer.copy_(weight)
                bias = tensors.get(f"feature_map_{side}.mlp.bias")
                if bias is not None:
                    fmap.mlp.set_bias(bias)
            wf = tensors["window_factors"]
            if wf.numel() != attn.window_factors.numel():
                raise ValueError(f"layer {layer}: window_factors has {wf.numel()} values, the model has {attn.num_heads} heads")
            attn.window_factors.copy_(wf.reshape(attn.window_factors.shape))
    return sorted(found)
