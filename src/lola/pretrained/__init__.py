"""Loading trained artifacts: feature-map folders, LoRA weights, the shipped registry.

The layer below inference and training. ``apply_lola(feature_maps=…)``, ``lola.models.load(...,
linearized=True)``, the evaluation and the lm-eval and vLLM entry points read through it; ``lola
linearize`` writes through it. It imports no training code (no optimiser, no teacher, no
distributed set-up), so using a linearized model never loads :mod:`lola.linearize`::

    from lola.pretrained import read_feature_maps
    maps = read_feature_maps("smollm2-135m-instruct")      # a shipped name or a folder
    maps.config, maps.geometry, maps.lora_spec

- :mod:`lola.pretrained.folder`: the folder format (read, write, check against a model);
- :mod:`lola.pretrained.lora`: LoRA names, merge into the base weights, restore;
- :mod:`lola.pretrained.shipped`: the maps that ship with lola (sha256-checked);
- :mod:`lola.pretrained.geometry`: a transformers model's attention modules and their shape.
"""

from lola.pretrained.folder import FeatureMaps, check_geometry, model_geometry, read_feature_maps, write_feature_maps
from lola.pretrained.geometry import attention_geometry, attention_modules
from lola.pretrained.lora import LoraSpec, merge_lora, restore_weights
from lola.pretrained.shipped import SHIPPED, ShippedMaps, resolve_feature_maps, shipped_folder

__all__ = [
    "SHIPPED",
    "FeatureMaps",
    "LoraSpec",
    "ShippedMaps",
    "attention_geometry",
    "attention_modules",
    "check_geometry",
    "merge_lora",
    "model_geometry",
    "read_feature_maps",
    "resolve_feature_maps",
    "restore_weights",
    "shipped_folder",
    "write_feature_maps",
]
