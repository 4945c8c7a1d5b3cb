"""The feature-map folder that ``lola linearize`` writes and ``apply_lola(feature_maps=…)`` reads.

A folder holds:

- ``feature_maps.safetensors``: per layer ``model.layers.{i}.self_attn.feature_map_q.mlp.layer``,
  ``…feature_map_k.mlp.layer`` (``[H, D, f]``) and ``…window_factors`` (``[1, H, 1, 1]``), the
  LoLCATs key names, so :func:`~lola.integrations.transformers.load_lolcats_checkpoint` reads it too;
- ``lola_config.json``: the hybrid's :class:`~lola.LoLAConfig` (window, feature map, mixing)
  and the geometry of the model it was trained for; optionally ``"read"``
  (:class:`ReadDefaults`), how LoLA reads the maps unless told otherwise, calibrated after
  training;
- ``report.json``: how it was trained (per-layer MSE before and after, text, steps, time);
- after stage 2 (LoRA fine-tuning): ``lora.safetensors`` (peft-named adapters of q, k, v, o;
  see :mod:`lola.pretrained.lora`), their rank and alpha under ``"lora"`` in
  ``lola_config.json``, and ``finetune_report.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, Strict, StrictInt

from lola.budgets import HeadBudgets
from lola.config import LoLAConfig
from lola.limits import MAX_FEATURE_DIM, MAX_HEADS, MAX_LAYERS, MAX_TOKENS
from lola.pretrained.lora import LORA_FILE, LoraSpec
from lola.pretrained.mixing_rule import resolve_mixing
from lola.pretrained.tensors import group_tensors

__all__ = [
    "CONFIG_FILE",
    "FEATURE_MAPS_FILE",
    "FINETUNE_REPORT_FILE",
    "REPORT_FILE",
    "FeatureMaps",
    "ReadDefaults",
    "folder_is_ours",
    "model_geometry",
    "read_defaults",
    "read_feature_maps",
    "write_feature_maps",
]

FEATURE_MAPS_FILE = "feature_maps.safetensors"
CONFIG_FILE = "lola_config.json"
REPORT_FILE = "report.json"
FORMAT = "lola-feature-maps"
FINETUNE_REPORT_FILE = "finetune_report.json"
REPORT_FILES = (REPORT_FILE, FINETUNE_REPORT_FILE)
GROUP_FILES = (FEATURE_MAPS_FILE, "lora.safetensors", *REPORT_FILES)
"""The files a folder's ``lola_config.json`` describes (beside it)."""

GEOMETRY_KEYS = ("num_layers", "num_heads", "num_kv_heads", "head_dim")
GEOMETRY_LIMITS = {"num_layers": MAX_LAYERS, "num_heads": MAX_HEADS, "num_kv_heads": MAX_HEADS, "head_dim": MAX_FEATURE_DIM}
# The LoLCATs names of a layer's tensors (as lola.integrations.transformers.lolcats reads them).
_TENSOR_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.self_attn\.(feature_map_q\.mlp\.layer|feature_map_k\.mlp\.layer|feature_map_q\.mlp\.bias|feature_map_k\.mlp\.bias|window_factors)$"
)

# Fields of LoLAConfig that the trained maps fix; budgets and policies stay the user's choice, and
# the mixing rule is decided by lola.pretrained.resolve (the trained rule for the hybrid, the paper's for LoLA).
TRAINED_FIELDS = ("feature_map", "feature_dim", "affine")
BOUNDED_STATE_FIELDS = ("positions", "state_positions", "state_key_positions")
"""Trained too when the maps were trained for a bounded state (``lola linearize --state-positions``)."""


class ReadDefaults(BaseModel):
    """How LoLA reads a folder's maps under the paper's rule (``lola_authors``) unless the
    config says otherwise: fields of :class:`~lola.LoLAConfig` calibrated after training
    (``"read"`` in ``lola_config.json``). :meth:`FeatureMaps.merge_into` fills the ones a
    config leaves unset.

    Attributes:
        linear_share_cap: the state's share of each output at most this (calibrated as a high
            quantile of the share on the maps' own training text at their training length).
        linear_share_cap_from: the cap applies from this position on (reads before it are left
            as trained).
        trained_length: the positions the maps and adapters were trained on, where bounded
            positions put their limits; ``None``: ``linear_share_cap_from`` (folders written
            before the field, whose cap started at the training length).
        positions: ``"bounded"`` to read the maps with bounded positions (limits at their
            trained length: :func:`lola.pretrained.resolve.resolve_positions`), or ``None``
            (the config's own, absolute by default).
        state_key_positions: with bounded positions, where the state's keys enter the maps
            (:class:`~lola.LoLAConfig`'s field), or ``None`` (the config's own).
        budgets: per-head sparse budgets calibrated on the adapted model (``lola calibrate
            --feature-maps``), or ``None``. Unlike the cap they do not depend on the rule: a run
            that asks for ``budgets="auto"`` with these maps gets them in place of the stock
            model's (:func:`lola.pretrained.resolve.resolve_budgets`); a rule of its own, uniform
            or named budgets are the caller's choice.
        note: how the values were found (a command), for the reader.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    linear_share_cap: Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    linear_share_cap_from: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] = 0
    trained_length: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = None
    positions: Literal["absolute", "bounded"] | None = None
    state_key_positions: Literal["clamped", "spread"] | None = None
    budgets: HeadBudgets | None = None
    note: str = ""


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
        read: how LoLA reads the maps unless told otherwise, or ``None``.
    """

    config: LoLAConfig
    geometry: dict
    tensors: dict[str, torch.Tensor]
    path: str
    lora: dict[str, torch.Tensor] | None = None
    lora_spec: LoraSpec | None = None
    read: ReadDefaults | None = None

    @property
    def trained_length(self) -> int | None:
        """The positions the maps were trained on, where the folder says (its read defaults'
        ``trained_length``, else their ``linear_share_cap_from``), else ``None``."""
        if self.read is None:
            return None
        return self.read.trained_length or self.read.linear_share_cap_from or None

    def merge_into(self, config: LoLAConfig) -> LoLAConfig:
        """``config`` with the trained fields (feature map, ``f``, affine) filled in and its
        mixing rule decided by :func:`lola.pretrained.resolve.resolve_mixing`: unset, it is the
        paper's ``lola_authors`` for LoLA (a sparse cache) and the trained rule for the hybrid.

        A trained field the caller set explicitly to another value is an error, except
        ``mixing``, which the caller may change on purpose (e.g. ``softmax_only`` for scoring
        studies). Maps trained for a state at bounded positions (``lola linearize
        --state-positions``) are read at them by every rule that reads the state: ``positions``,
        ``state_positions`` and ``state_key_positions`` are trained fields then. Under the
        paper's rule the folder's :class:`ReadDefaults` fill the fields the caller left unset
        and no trained field fills (``linear_share_cap=1.0`` turns a shipped cap off).
        """
        update = self._trained(config, TRAINED_FIELDS)
        merged = resolve_mixing(config.model_copy(update=update) if update else config, self.config.mixing)
        if self.config.state_positions is not None and merged.mixing != "softmax_only":
            trained = self._trained(config, BOUNDED_STATE_FIELDS)
            merged, update = merged.model_copy(update=trained), {**update, **trained}
        if self.read is None or merged.mixing != "lola_authors":
            return merged
        given = config.model_fields_set | set(update)  # the caller's and the trained fields: read defaults fill neither
        read = {
            f: getattr(self.read, f) for f in ("linear_share_cap", "linear_share_cap_from", "positions") if f not in given and getattr(self.read, f) is not None
        }
        if "linear_share_cap" in config.model_fields_set:  # the caller's cap starts where the caller says
            read.pop("linear_share_cap_from", None)
        keys = self.read.state_key_positions
        if keys is not None and "state_key_positions" not in given and read.get("positions", merged.positions) == "bounded":
            read["state_key_positions"] = keys  # (a placement of bounded positions only: absolute ones keep theirs)
        return merged.model_copy(update=read) if read else merged

    def _trained(self, config: LoLAConfig, fields: tuple[str, ...]) -> dict:
        """The maps' values of ``fields`` that ``config`` leaves unset; one it set to another
        value is refused, naming the field and the folder."""
        update = {}
        for field in fields:
            ours, theirs = getattr(self.config, field), getattr(config, field)
            if field in config.model_fields_set and theirs != ours:
                raise ValueError(
                    f"config.{field}={theirs!r} conflicts with the feature maps in {self.path!r}, trained with {field}={ours!r}; "
                    f"leave {field} unset or set it to {ours!r}"
                )
            if field not in config.model_fields_set:
                update[field] = ours
        return update


def model_geometry(model: torch.nn.Module) -> dict:
    """``num_layers, num_heads, num_kv_heads, head_dim`` of a Llama-family model."""
    from lola.pretrained.geometry import attention_geometry, attention_modules

    modules = attention_modules(model)
    heads, kv_heads, head_dim = attention_geometry(modules[0])
    return {"num_layers": len(modules), "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}


def folder_is_ours(folder: str | Path) -> bool:
    """Whether ``folder`` may receive a feature-map group: it holds none of the group's files, or
    its ``lola_config.json`` carries lola's format marker (the files beside it are then ours)."""
    folder = Path(folder)
    description = folder / CONFIG_FILE
    if description.is_file() and not description.is_symlink():
        try:
            meta = json.loads(description.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return False
        return isinstance(meta, dict) and meta.get("format") == FORMAT
    return not any((folder / name).exists() or (folder / name).is_symlink() for name in GROUP_FILES)


def write_feature_maps(
    folder: str | Path,
    tensors: dict[str, torch.Tensor],
    config: LoLAConfig,
    geometry: dict,
    model_name: str | None = None,
    lora: dict[str, torch.Tensor] | None = None,
    lora_spec: LoraSpec | None = None,
    reports: dict[str, dict] | None = None,
) -> None:
    """Write the folder as one group: ``feature_maps.safetensors``, with ``lora``
    ``lora.safetensors``, the ``reports`` (``{file name: JSON data}``), then ``lola_config.json``,
    which records the sha256 of every other file of the group.

    Each file is replaced atomically (:func:`lola.io.outputs.write_files`), the description last;
    a folder holding another tool's files is refused before anything is written, and adapters
    of an earlier run are removed when none are given (they must not be read with new maps).

    Raises:
        ValueError: ``folder`` holds files of the group that lola did not write (named), or a
            link in a file's place.
    """
    from safetensors.torch import save

    from lola.io.outputs import write_files

    if (lora is None) != (lora_spec is None):
        raise ValueError("lora and lora_spec go together")
    folder = Path(folder)
    if not folder_is_ours(folder):
        raise ValueError(
            f"{folder} holds files that were not written by lola linearize ({CONFIG_FILE} missing or foreign); move them away or choose another folder"
        )
    files: dict[str, bytes] = {FEATURE_MAPS_FILE: save({k: v.detach().float().contiguous().cpu() for k, v in tensors.items()})}
    meta = {"format": FORMAT, "version": 1, "model": model_name, "geometry": geometry, "lola_config": config.model_dump(mode="json")}
    if lora is not None:
        files[LORA_FILE] = save({k: v.detach().float().contiguous().cpu() for k, v in lora.items()})
        meta["lora"] = lora_spec.model_dump(mode="json")
    for name, data in (reports or {}).items():
        files[name] = (json.dumps(data, indent=2) + "\n").encode()
    kept = {}
    if (folder / CONFIG_FILE).is_file():  # the earlier group's reports stay valid beside new maps only if rewritten
        old = json.loads((folder / CONFIG_FILE).read_text())
        keep = [REPORT_FILE] if lora is None else list(REPORT_FILES)
        kept = {n: h for n, h in (old.get("files") or {}).items() if n not in files and n in keep and (folder / n).is_file()}
    meta["files"] = {**kept, **{name: hashlib.sha256(data).hexdigest() for name, data in files.items()}}
    files[CONFIG_FILE] = (json.dumps(meta, indent=2) + "\n").encode()
    # without adapters, those of an earlier run (and the report of their training) must go
    write_files(folder, files, writer="lola linearize", remove=[] if lora is not None else [n for n in (LORA_FILE, FINETUNE_REPORT_FILE) if n not in files])


def read_feature_maps(folder: str | Path) -> FeatureMaps:
    """Read a folder written by ``lola linearize``, or the maps shipped under a registered name
    (:mod:`lola.pretrained.shipped`, e.g. ``"smollm2-135m-instruct"``).

    Everything is checked before a model is touched: the description's keys, the tensors of
    every layer of its geometry (none missing, none extra, shapes ``[H, D, f]`` and finite
    values).

    Raises:
        FileNotFoundError: the folder or one of its two files is missing.
        ValueError: a file is truncated or garbled, ``lola_config.json`` is not a lola
            feature-map description or lacks a key, or the tensors do not cover the layers it
            describes (each message names the file and the key).
    """
    from lola.pretrained.shipped import resolve_feature_maps

    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"feature_maps must be a folder or a shipped name, got {folder!r} ({type(folder).__name__})")
    if not str(folder).strip():  # Path("") is the current folder, which nobody meant
        raise ValueError("feature_maps is empty: give a `lola linearize` folder or a shipped name")
    folder = resolve_feature_maps(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"feature_maps {str(folder)!r} is a file, not a folder: give the --out folder of a `lola linearize` run")
    if not folder.is_dir():
        from lola.pretrained.shipped import SHIPPED

        shipped = f", or use a shipped name ({', '.join(sorted(SHIPPED))})" if SHIPPED else ""
        raise FileNotFoundError(f"feature_maps folder {str(folder)!r} does not exist (create it with `lola linearize --out {folder}`{shipped})")
    from lola.io.outputs import finish_pending

    finish_pending(folder)  # a write of the group that a kill cut short: completed first
    for name in (FEATURE_MAPS_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"feature_maps folder {str(folder)!r} has no {name}: is it the --out folder of a finished `lola linearize` run?")
    meta_path = folder / CONFIG_FILE
    meta = _read_description(meta_path)
    _check_group(meta, folder, meta_path)
    config = _description_config(meta, meta_path)
    geometry = _description_geometry(meta, meta_path)
    lora = lora_spec = None
    if meta.get("lora") is not None:
        lora_spec = _description_lora(meta, meta_path)
        if not (folder / LORA_FILE).is_file():
            raise FileNotFoundError(f"feature_maps folder {str(folder)!r} describes LoRA adapters but has no {LORA_FILE}")
        lora = _load(folder / LORA_FILE)
        _check_finite(lora, folder / LORA_FILE)
    read = _description_read(meta, meta_path, geometry)
    tensors = _load(folder / FEATURE_MAPS_FILE)
    check_tensors(tensors, geometry, folder / FEATURE_MAPS_FILE)
    return FeatureMaps(config=config, geometry=geometry, tensors=tensors, path=str(folder), lora=lora, lora_spec=lora_spec, read=read)


def _unique_keys(pairs: list) -> dict:
    from lola.io.outputs import _unique_keys as unique

    return unique(pairs)


def _read_description(path: Path) -> dict:
    """``lola_config.json`` as a dict with lola's format marker, version 1 and both required keys."""
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a text file ({e.reason} at byte {e.start}); write it again with `lola linearize`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (truncated or garbled? {e}); write it again with `lola linearize`") from None
    except ValueError as e:  # a key given twice: json would keep the last
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a lola feature-map description (format {FORMAT!r})")
    if meta.get("version") != 1:
        raise ValueError(f"{path}: version must be 1, got {meta.get('version')!r} (written by another version of lola?)")
    missing = [k for k in ("lola_config", "geometry") if k not in meta]
    if missing:
        raise ValueError(f"{path} lacks the key {missing[0]!r}; write it again with `lola linearize`")
    return meta


def _check_group(meta: dict, folder: Path, meta_path: Path) -> None:
    """The files ``lola_config.json`` records (``"files"``: name → sha256) are those beside it.

    Catches a group that is not whole (a file from another run, a write cut between two files,
    damage); folders written before the entry existed (and shipped folders, whose files the
    registry checks) have none. Not a defence against edits: whoever changes a file can
    change its recorded sum too.
    """
    recorded = meta.get("files")
    if recorded is None:
        return
    if not isinstance(recorded, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in recorded.items()):
        raise ValueError(f"{meta_path}: files must map file names to sha256 digests, got {recorded!r}")
    for name, digest in recorded.items():
        if name not in GROUP_FILES:
            raise ValueError(f"{meta_path}: files names {name!r}, which is not a file of a feature-map folder ({', '.join(GROUP_FILES)})")
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"feature_maps folder {str(folder)!r} has no {name}, which {CONFIG_FILE} records")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise ValueError(
                f"{path} is not the file {CONFIG_FILE} records (sha256 differs): damaged, or from another run; write the folder again with `lola linearize`"
            )


def _description_config(meta: dict, path: Path) -> LoLAConfig:
    """The ``lola_config`` entry as a validated :class:`~lola.LoLAConfig`, errors naming ``path``."""
    from pydantic import ValidationError

    from lola.config import validation_summary

    if not isinstance(meta["lola_config"], dict):
        raise ValueError(f"{path}: lola_config must be a mapping of LoLAConfig fields, got {meta['lola_config']!r}")
    try:
        return LoLAConfig.model_validate(meta["lola_config"])
    except ValidationError as err:
        raise ValueError(f"{path}: lola_config: {validation_summary(err)}") from None


def _description_geometry(meta: dict, path: Path) -> dict:
    """The ``geometry`` entry: ``num_layers, num_heads, num_kv_heads, head_dim``, each an int >= 1."""
    geometry = meta["geometry"]
    if not isinstance(geometry, dict):
        raise ValueError(f"{path}: geometry must be a mapping of {', '.join(GEOMETRY_KEYS)}, got {geometry!r}")
    for key in GEOMETRY_KEYS:
        if key not in geometry:
            raise ValueError(f"{path}: geometry lacks {key!r}")
        value = geometry[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{path}: geometry.{key} must be an int >= 1, got {value!r}")
        if value > GEOMETRY_LIMITS[key]:
            raise ValueError(f"{path}: geometry.{key} must be <= {GEOMETRY_LIMITS[key]}, got {value}")
    if geometry["num_heads"] % geometry["num_kv_heads"]:
        raise ValueError(f"{path}: geometry.num_heads ({geometry['num_heads']}) must be a multiple of geometry.num_kv_heads ({geometry['num_kv_heads']})")
    return dict(geometry)


def _description_read(meta: dict, path: Path, geometry: dict) -> ReadDefaults | None:
    """The optional ``read`` entry as a validated :class:`ReadDefaults` whose budgets, if any,
    cover the layers and K/V heads of ``geometry``."""
    from pydantic import ValidationError

    from lola.config import validation_summary

    if meta.get("read") is None:
        return None
    try:
        read = ReadDefaults.model_validate(meta["read"])
    except ValidationError as err:
        raise ValueError(f"{path}: read: {validation_summary(err)}") from None
    if read.budgets is not None:
        try:
            read.budgets.check_geometry(geometry["num_layers"], geometry["num_kv_heads"])
        except ValueError as err:
            raise ValueError(f"{path}: read.budgets: {err}") from None
    return read


def read_defaults(folder: str | os.PathLike) -> ReadDefaults | None:
    """The ``read`` entry of a feature-map folder or shipped name, without loading its tensors:
    what :func:`lola.pretrained.resolve.resolve_budgets` asks of maps a run applies later.

    Raises:
        FileNotFoundError: the folder or its ``lola_config.json`` is missing.
        ValueError: the description is not lola's, or its ``read`` entry is invalid (named).
    """
    from lola.pretrained.shipped import resolve_feature_maps

    path = resolve_feature_maps(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"feature_maps {str(folder)!r} has no {CONFIG_FILE}: is it the --out folder of a finished `lola linearize` run?")
    meta = _read_description(path)
    return _description_read(meta, path, _description_geometry(meta, path))


def _description_lora(meta: dict, path: Path) -> LoraSpec:
    """The ``lora`` entry as a validated :class:`~lola.pretrained.lora.LoraSpec`."""
    from pydantic import ValidationError

    from lola.config import validation_summary

    try:
        return LoraSpec.model_validate(meta["lora"])
    except ValidationError as err:
        raise ValueError(f"{path}: lora: {validation_summary(err)}") from None


def check_tensors(tensors: dict[str, torch.Tensor], geometry: dict, path: str | Path) -> None:
    """Refuse feature-map tensors that do not cover every layer of ``geometry`` exactly.

    Every layer ``0 … num_layers − 1`` needs ``feature_map_q.mlp.layer`` and
    ``feature_map_k.mlp.layer`` (``[H, D, f]``) and ``window_factors`` (``H`` values); no other
    tensor may be present, and all values must be finite. Errors name ``path``.
    """
    grouped = group_tensors(tensors, _TENSOR_KEY, str(path), "a feature-map tensor (layers.{i}.self_attn.feature_map_q.mlp.layer, …, window_factors)")
    by_layer = {int(i): parts for i, parts in grouped.items()}
    layers, heads, head_dim = geometry["num_layers"], geometry["num_heads"], geometry["head_dim"]
    extra = sorted(i for i in by_layer if i >= layers)
    if extra:
        raise ValueError(f"{path} holds tensors for layers {extra}, beyond the {layers} layers of its geometry")
    missing = [i for i in range(layers) if i not in by_layer]
    if missing:
        raise ValueError(f"{path} has no tensors for layers {missing} of {layers}: a partial or damaged folder; write it again with `lola linearize`")
    for i, found in sorted(by_layer.items()):
        lacking = sorted({"feature_map_q.mlp.layer", "feature_map_k.mlp.layer", "window_factors"} - found.keys())
        if lacking:
            raise ValueError(f"{path}: layer {i} lacks {lacking}")
        for side in ("q", "k"):
            w = found[f"feature_map_{side}.mlp.layer"]
            if w.dim() != 3 or tuple(w.shape[:2]) != (heads, head_dim):
                raise ValueError(f"{path}: layer {i} feature_map_{side}.mlp.layer is {tuple(w.shape)}, expected [{heads}, {head_dim}, f] by its geometry")
        if found["window_factors"].numel() != heads:
            raise ValueError(f"{path}: layer {i} window_factors has {found['window_factors'].numel()} values, expected {heads} (one per head)")
    _check_finite(tensors, path)


def _check_finite(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """Refuse tensors holding inf or NaN (they would silently turn every output into NaN)."""
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{path}: tensor {key!r} holds non-finite values (inf or NaN)")


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
