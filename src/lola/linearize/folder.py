"""The feature-map folder that ``lola linearize`` writes and ``apply_lola(feature_maps=…)`` reads.

A folder holds:

- ``feature_maps.safetensors``: per layer ``model.layers.{i}.self_attn.feature_map_q.mlp.layer``,
  ``…feature_map_k.mlp.layer`` (``[H, D, f]``) and ``…window_factors`` (``[1, H, 1, 1]``), the
  LoLCATs key names, so :func:`~lola.integrations.transformers.load_lolcats_checkpoint` reads it too;
- ``lola_config.json``: the hybrid's :class:`~lola.LoLAConfig` (window, feature map, mixing)
  and the geometry of the model it was trained for;
- ``report.json``: how it was trained (per-layer MSE before and after, text, steps, time);
- after stage 2 (LoRA fine-tuning): ``lora.safetensors`` (peft-named adapters of q, k, v, o;
  see :mod:`lola.linearize.lora`), their rank and alpha under ``"lora"`` in
  ``lola_config.json``, and ``finetune_report.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lola.config import LoLAConfig
from lola.linearize.lora import LORA_FILE, LoraSpec

__all__ = ["FEATURE_MAPS_FILE", "CONFIG_FILE", "REPORT_FILE", "FeatureMaps", "model_geometry", "read_feature_maps", "write_feature_maps"]

FEATURE_MAPS_FILE = "feature_maps.safetensors"
CONFIG_FILE = "lola_config.json"
REPORT_FILE = "report.json"
FORMAT = "lola-feature-maps"

# Fields of LoLAConfig that the trained maps fix; budgets and policies stay the user's choice.
TRAINED_FIELDS = ("feature_map", "feature_dim", "mixing", "affine")


@dataclass
class FeatureMaps:
    """A feature-map folder read into memory.

    Attributes:
        config: the hybrid configuration the maps were trained with.
        geometry: ``num_layers``, ``num_heads``, ``num_kv_heads``, ``head_dim`` of the model.
        tensors: LoLCATs-named tensors (see the module docstring).
        path: where it was read from.
        lora: peft-named LoRA tensors of stage 2, or ``None`` (maps only).
        lora_spec: their rank, alpha and targets.
    """

    config: LoLAConfig
    geometry: dict
    tensors: dict[str, torch.Tensor]
    path: str
    lora: dict[str, torch.Tensor] | None = None
    lora_spec: LoraSpec | None = None

    def merge_into(self, config: LoLAConfig) -> LoLAConfig:
        """``config`` with the trained fields (feature map, ``f``, mixing, affine) filled in.

        A trained field the caller set explicitly to another value is an error, except
        ``mixing``, which the caller may change on purpose (e.g. ``softmax_only`` for scoring
        studies).
        """
        update = {}
        for field in TRAINED_FIELDS:
            ours, theirs = getattr(self.config, field), getattr(config, field)
            if field in config.model_fields_set and theirs != ours and field != "mixing":
                raise ValueError(
                    f"config.{field}={theirs!r} conflicts with the feature maps in {self.path!r}, trained with {field}={ours!r}; "
                    f"leave {field} unset or set it to {ours!r}"
                )
            if field not in config.model_fields_set:
                update[field] = ours
        return config.model_copy(update=update) if update else config


def model_geometry(model: torch.nn.Module) -> dict:
    """``num_layers, num_heads, num_kv_heads, head_dim`` of a Llama-family model."""
    from lola.integrations.transformers.apply import _geometry, attention_modules

    modules = attention_modules(model)
    heads, kv_heads, head_dim = _geometry(modules[0])
    return {"num_layers": len(modules), "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}


def write_feature_maps(
    folder: str | Path,
    tensors: dict[str, torch.Tensor],
    config: LoLAConfig,
    geometry: dict,
    model_name: str | None = None,
    lora: dict[str, torch.Tensor] | None = None,
    lora_spec: LoraSpec | None = None,
) -> None:
    """Write ``feature_maps.safetensors``, ``lola_config.json`` and, with ``lora``, ``lora.safetensors``."""
    from safetensors.torch import save_file

    if (lora is None) != (lora_spec is None):
        raise ValueError("lora and lora_spec go together")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}, str(folder / FEATURE_MAPS_FILE))
    meta = {"format": FORMAT, "version": 1, "model": model_name, "geometry": geometry, "lola_config": config.model_dump(mode="json")}
    if lora is not None:
        save_file({k: v.detach().float().contiguous().cpu() for k, v in lora.items()}, str(folder / LORA_FILE))
        meta["lora"] = lora_spec.model_dump(mode="json")
    elif (folder / LORA_FILE).exists():
        (folder / LORA_FILE).unlink()  # stale adapters of an earlier run must not be read with new maps
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def read_feature_maps(folder: str | Path) -> FeatureMaps:
    """Read a folder written by ``lola linearize``, or the maps shipped under a registered name
    (:mod:`lola.linearize.shipped`, e.g. ``"smollm2-135m-instruct"``).

    Raises:
        FileNotFoundError: the folder or one of its two files is missing.
        ValueError: ``lola_config.json`` is not a lola feature-map description.
    """
    from lola.linearize.shipped import resolve_feature_maps

    folder = resolve_feature_maps(folder)
    if not folder.is_dir():
        from lola.linearize.shipped import SHIPPED

        shipped = f", or use a shipped name ({', '.join(sorted(SHIPPED))})" if SHIPPED else ""
        raise FileNotFoundError(f"feature_maps folder {str(folder)!r} does not exist (create it with `lola linearize --out {folder}`{shipped})")
    for name in (FEATURE_MAPS_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"feature_maps folder {str(folder)!r} has no {name}: is it the --out folder of a finished `lola linearize` run?")
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{folder / CONFIG_FILE} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{folder / CONFIG_FILE} is not a lola feature-map description (format {FORMAT!r})")
    missing = [k for k in ("lola_config", "geometry") if k not in meta]
    if missing:
        raise ValueError(f"{folder / CONFIG_FILE} lacks {missing}")
    lora = lora_spec = None
    if meta.get("lora") is not None:
        if not (folder / LORA_FILE).is_file():
            raise FileNotFoundError(f"feature_maps folder {str(folder)!r} describes LoRA adapters but has no {LORA_FILE}")
        lora_spec = LoraSpec.model_validate(meta["lora"])
        lora = _load(folder / LORA_FILE)
    return FeatureMaps(
        config=LoLAConfig.model_validate(meta["lola_config"]),
        geometry=dict(meta["geometry"]),
        tensors=_load(folder / FEATURE_MAPS_FILE),
        path=str(folder),
        lora=lora,
        lora_spec=lora_spec,
    )


def _load(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file, with an error that names it when it is truncated or not safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); write it again with `lola linearize`") from None


def check_geometry(maps: FeatureMaps, model: torch.nn.Module) -> None:
    """Refuse feature maps trained for a model of another shape, naming the difference."""
    ours = model_geometry(model)
    diff = [f"{k}: maps {maps.geometry.get(k)} vs model {v}" for k, v in ours.items() if maps.geometry.get(k) != v]
    if diff:
        raise ValueError(f"the feature maps in {maps.path!r} were trained for another model ({'; '.join(diff)})")
