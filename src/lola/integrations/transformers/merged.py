"""The LoRA-merged projections of a LoLA model: recorded when the model is saved, checked when
it is loaded, so that a folder's ``lora_merged`` flag is a fact about its tensors.

A stage-2 feature-map folder merges LoRA adapters into the model's projections
(:func:`lola.pretrained.lora.merge_lora`). ``save_pretrained`` on a model with LoLA applied then
writes, beside ``lora_merged: true``, which tensors hold the merge and their digest
(:class:`lola.pretrained.model_entry.MergedProjections`); :func:`check_merged_projections` refuses a folder
whose files differ (stock projections put back, another model's weights, a flag edited by hand).
"""

from __future__ import annotations

from pathlib import Path
from types import MethodType
from typing import Any

import torch

from lola.io.checksums import tensors_digest
from lola.pretrained.model_entry import CONFIG_KEY, ModelEntry, read_entry

__all__ = ["check_merged_projections", "install_save_hook", "merged_names", "record_merged_projections", "remove_save_hook"]


def merged_names(model: torch.nn.Module) -> list[str]:
    """The parameter names of the projections that hold merged LoRA adapters, sorted: those
    :func:`~lola.apply_lola` merged, or, on a model :func:`~lola.from_pretrained` loaded, those its
    folder recorded; ``[]`` when nothing was merged."""
    info = getattr(model, "_lola", None)
    if info is not None and info.merged_weights:
        return sorted(info.merged_weights)
    entry = getattr(model.config, CONFIG_KEY, None)
    if entry is None:
        return []
    saved = read_entry(entry)
    return list(saved.merged_projections.names) if saved.lora_merged and saved.merged_projections is not None else []


def record_merged_projections(model: torch.nn.Module) -> None:
    """Write the merged projections' names and their digest, from the model's weights as they are
    now, into ``model.config.lola`` (what ``save_pretrained`` is about to write)."""
    names = merged_names(model)
    if not names:
        return
    params = dict(model.named_parameters())
    absent = [n for n in names if n not in params]
    if absent:
        raise ValueError(f"the model has no parameter {absent[0]!r}, which its LoLA entry records as holding merged LoRA adapters")
    entry = dict(getattr(model.config, CONFIG_KEY))
    entry["merged_projections"] = {"names": names, "digest": tensors_digest((n, params[n]) for n in names)}
    setattr(model.config, CONFIG_KEY, entry)


def install_save_hook(model: torch.nn.Module) -> None:
    """Shadow ``model.save_pretrained`` (this instance only) so that every save records the merged
    projections as saved (after any training or dtype cast since :func:`~lola.apply_lola`)."""
    stock = type(model).save_pretrained

    def save_pretrained(self: Any, *args: Any, **kwargs: Any) -> Any:
        record_merged_projections(self)
        return stock(self, *args, **kwargs)

    model.save_pretrained = MethodType(save_pretrained, model)


def remove_save_hook(model: torch.nn.Module) -> None:
    """Undo :func:`install_save_hook`."""
    model.__dict__.pop("save_pretrained", None)


def check_merged_projections(directory: Path, entry: ModelEntry) -> None:
    """Refuse a saved folder whose files do not hold the merged projections its entry records.

    Raises:
        ValueError: the entry says ``lora_merged`` without recording the projections, a recorded
            tensor is in no file, or their digest differs from the recorded one.
    """
    if not entry.lora_merged:
        return
    if entry.merged_projections is None:
        raise ValueError(
            f"{directory}/config.json says lora_merged: true but does not record which projections hold the adapters "
            "(merged_projections): lola's save_pretrained writes them; save or export the model again"
        )
    from safetensors import safe_open

    names = set(entry.merged_projections.names)
    found: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in names.intersection(f.keys()):
                found[name] = f.get_tensor(name)
    absent = sorted(names - set(found))
    if absent:
        raise ValueError(f"{directory}: no weights file holds {absent[0]!r}, which config.json records as a LoRA-merged projection")
    if tensors_digest(found.items()) != entry.merged_projections.digest:
        raise ValueError(
            f"{directory}: the projections its config.json records as LoRA-merged ({len(names)} tensors, e.g. {min(names)!r}) "
            "do not match their recorded digest: the weights were changed after saving, or lora_merged does not describe them"
        )
