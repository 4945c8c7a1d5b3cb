"""The ``lola`` entry of a saved model's ``config.json``: the LoLA config a model folder runs with.

:func:`lola.apply_lola` records :func:`config_entry` as ``model.config.lola``;
``save_pretrained`` writes it to ``config.json``; :func:`lola.from_pretrained` and the vLLM
plug-in read it back with :func:`entry_config`. It needs only the core (no transformers), so a
serving process reads a saved folder without lola's transformers integration::

    {"lola": {"format": "lola-pretrained/1", "config": {...LoLAConfig fields...}, "lora_merged": true}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lola.config import LoLAConfig

__all__ = ["CONFIG_KEY", "ENTRY_FORMAT", "config_entry", "entry_config", "is_entry"]

CONFIG_KEY = "lola"
"""The attribute of a transformers config (and key of ``config.json``) that holds :func:`config_entry`."""

ENTRY_FORMAT = "lola-pretrained/1"
"""The ``format`` marker of :func:`config_entry`."""


def config_entry(config: LoLAConfig, lora_merged: bool) -> dict[str, Any]:
    """What :func:`lola.apply_lola` stores in ``model.config.lola`` (JSON-ready).

    Args:
        config: the LoLA config in effect (every field written, so the rule that ran is recorded).
        lora_merged: whether LoRA adapters were merged into the model's projections.
    """
    return {"format": ENTRY_FORMAT, "config": config.model_dump(mode="json"), "lora_merged": bool(lora_merged)}


def is_entry(value: object) -> bool:
    """Whether ``value`` claims to be a :func:`config_entry` (a mapping with a ``format`` key)."""
    return isinstance(value, Mapping) and "format" in value


def entry_config(entry: object) -> LoLAConfig:
    """The :class:`~lola.LoLAConfig` of a :func:`config_entry`.

    Raises:
        ValueError: ``entry`` is not an entry this version of lola wrote (another format, or no
            ``config`` mapping); a field the config refuses is pydantic's ``ValidationError``.
    """
    if not isinstance(entry, Mapping) or entry.get("format") != ENTRY_FORMAT or not isinstance(entry.get("config"), Mapping):
        found = entry.get("format") if isinstance(entry, Mapping) else type(entry).__name__
        raise ValueError(f"config.json has a 'lola' entry that lola did not write (format {found!r}, expected {ENTRY_FORMAT!r})")
    return LoLAConfig.model_validate(dict(entry["config"]))
