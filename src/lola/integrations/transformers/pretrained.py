"""``save_pretrained`` / :func:`from_pretrained` round trip of a LoLA model.

:func:`apply_lola` records the LoLA config in ``model.config.lola``; ``model.save_pretrained(dir)``
then writes it to ``config.json`` and the LoLA layers' parameters (feature maps, window factors)
into the safetensors weights beside the model's own (as ``…self_attn.lola.…``). Stock
``from_pretrained`` would load the model without LoLA (and warn about the ``lola`` tensors);
:func:`from_pretrained` loads it, re-applies LoLA with the saved config and loads those tensors.

LoRA adapters merged by a stage-2 feature-map folder are saved merged into the projections, so
a model loaded this way cannot give the stock weights back on :func:`remove_lola`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lola.integrations.transformers.applied import CONFIG_KEY, config_entry, saved_config
from lola.integrations.transformers.apply import apply_lola, remove_lola
from lola.integrations.transformers.attention import register_attention

# CONFIG_KEY, config_entry and saved_config live beside AppliedLoLA; re-exported here, where they are documented.
__all__ = ["CONFIG_KEY", "config_entry", "from_pretrained", "saved_config"]


def _lola_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} has no *.safetensors weights (save the model with save_pretrained(..., safe_serialization=True))")
    out: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if ".lola." in name:
                        out[name] = f.get_tensor(name)
                        # Trained LoLA weights are finite: a NaN would surface later as some
                        # policy's or layer's fault, far from the file that holds it.
                        t = out[name]
                        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                            raise ValueError(f"{path}: LoLA weight {name!r} holds non-finite values (inf or NaN); the saved model is damaged")
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path} cannot be read as safetensors ({e})") from None
    return out


def from_pretrained(path: str | os.PathLike, model_class: Any = None, **kwargs: Any) -> torch.nn.Module:
    """Load a model saved with ``save_pretrained`` after :func:`apply_lola`, with LoLA applied.

    Args:
        path: the folder ``save_pretrained`` wrote (local; nothing is downloaded).
        model_class: the transformers class to load with (default ``AutoModelForCausalLM``).
        **kwargs: passed to ``from_pretrained`` (e.g. ``dtype``).

    Returns:
        The model, patched with the saved LoLA config and its trained LoLA parameters.

    Raises:
        ValueError: the folder's ``config.json`` has no LoLA entry (a stock model: load it with
            transformers and call ``apply_lola``), or its LoLA tensors are missing or damaged.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} is not a saved model folder (no config.json)")
    register_attention()  # a saved config may name the "lola" attention implementation
    model_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    config = saved_config(model_config)
    if config is None:
        raise ValueError(f"{directory}/config.json has no LoLA entry: it holds a stock model; load it with transformers and call lola.apply_lola")
    cls = model_class or AutoModelForCausalLM
    kwargs.setdefault("local_files_only", True)
    model = cls.from_pretrained(str(directory), config=model_config, **kwargs)
    if getattr(model.config, "_attn_implementation", None) == "lola":
        model.set_attn_implementation("sdpa")  # the stock implementation apply_lola will record
    tensors = _lola_tensors(directory)
    apply_lola(model, config)
    params = {name for name, _ in model.named_parameters() if ".lola." in name}
    missing, unexpected = sorted(params - set(tensors)), sorted(set(tensors) - params)
    if missing or unexpected:
        remove_lola(model)
        raise ValueError(f"the LoLA weights in {directory} do not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.load_state_dict(tensors, strict=False)
    model.config.lola = config_entry(model._lola.config, lora_merged=bool(getattr(model_config, CONFIG_KEY).get("lora_merged")))
    return model
