"""The ``lola`` entry of a saved model's ``config.json``: the LoLA config a model folder runs with.

:func:`lola.apply_lola` records :func:`config_entry` as ``model.config.lola``;
``save_pretrained`` writes it to ``config.json``; :func:`lola.from_pretrained` and the vLLM
plug-in read it back with :func:`entry_config`. It needs only the core (no transformers), so a
serving process reads a saved folder without lola's transformers integration::

    {"lola": {"format": "lola-pretrained/1", "config": {...LoLAConfig fields...}, "lora_merged": true,
              "merged_projections": {"names": [...], "digest": "..."}}}

``lora_merged`` says the folder's projections hold LoRA adapters merged in; a folder that says so
also records which tensors they are and their digest (:func:`lola.io.checksums.tensors_digest`),
and :func:`lola.from_pretrained` checks the files against it: the flag is verified, not trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from lola.config import LoLAConfig

__all__ = ["CONFIG_KEY", "ENTRY_FORMAT", "MergedProjections", "ModelEntry", "config_entry", "entry_config", "is_entry", "read_entry"]

CONFIG_KEY = "lola"
"""The attribute of a transformers config (and key of ``config.json``) that holds :func:`config_entry`."""

ENTRY_FORMAT = "lola-pretrained/1"
"""The ``format`` marker of :func:`config_entry`."""


class MergedProjections(BaseModel):
    """The projections a folder's LoRA adapters were merged into, as saved.

    Attributes:
        names: the parameter names (as in the safetensors files), sorted.
        digest: :func:`lola.io.checksums.tensors_digest` of those tensors as saved.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    names: list[StrictStr] = Field(min_length=1)
    digest: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")


class ModelEntry(BaseModel):
    """The ``lola`` entry of a saved model's ``config.json``, read as strictly as the API reads a
    config: unknown keys are refused (a typo or a newer writer's field is not dropped unread),
    ``lora_merged`` must be a JSON boolean, and ``merged_projections`` is there only when it is
    true (the loader requires it then: :func:`lola.from_pretrained`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["lola-pretrained/1"]
    config: LoLAConfig
    lora_merged: StrictBool = False
    merged_projections: MergedProjections | None = None

    @model_validator(mode="after")
    def _projections_only_when_merged(self) -> "ModelEntry":
        if self.merged_projections is not None and not self.lora_merged:
            raise ValueError("merged_projections is recorded but lora_merged is false: the entry contradicts itself")
        return self


def config_entry(config: LoLAConfig, lora_merged: bool, merged_projections: MergedProjections | dict | None = None) -> dict[str, Any]:
    """What :func:`lola.apply_lola` stores in ``model.config.lola`` (JSON-ready).

    Args:
        config: the LoLA config in effect (every field written, so the rule that ran is recorded).
        lora_merged: whether LoRA adapters were merged into the model's projections.
        merged_projections: which tensors hold them and their digest (written when the model
            is saved; only with ``lora_merged``).
    """
    entry = {"format": ENTRY_FORMAT, "config": config.model_dump(mode="json"), "lora_merged": bool(lora_merged)}
    if merged_projections is not None:
        entry["merged_projections"] = MergedProjections.model_validate(merged_projections).model_dump()
    return entry


def is_entry(value: object) -> bool:
    """Whether ``value`` claims to be a :func:`config_entry` (a mapping with a ``format`` key)."""
    return isinstance(value, Mapping) and "format" in value


def read_entry(entry: object) -> ModelEntry:
    """A :func:`config_entry` read back into a :class:`ModelEntry`.

    Raises:
        ValueError: ``entry`` is not an entry this version of lola wrote (another format, or no
            ``config`` mapping); a field the entry or the config refuses (an unknown key, a
            ``lora_merged`` that is not a boolean) is pydantic's ``ValidationError``, which
            names the field.
    """
    if not isinstance(entry, Mapping) or entry.get("format") != ENTRY_FORMAT or not isinstance(entry.get("config"), Mapping):
        found = entry.get("format") if isinstance(entry, Mapping) else type(entry).__name__
        raise ValueError(f"config.json has a 'lola' entry that lola did not write (format {found!r}, expected {ENTRY_FORMAT!r})")
    return ModelEntry.model_validate(dict(entry))


def entry_config(entry: object) -> LoLAConfig:
    """The :class:`~lola.LoLAConfig` of a :func:`config_entry` (read by :func:`read_entry`)."""
    return read_entry(entry).config
