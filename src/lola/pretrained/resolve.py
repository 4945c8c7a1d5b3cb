"""The one place that decides the mixing rule a config runs with on trained feature maps.

A LoLA config may leave ``mixing`` unset. Without trained maps it is ``LoLAConfig``'s default
(``softmax_only``: untrained maps would damage the output). With trained maps:

- **LoLA** (a sparse cache in any layer): the paper's rule, ``lola_authors``. The LoLA paper
  adds the sparse cache to LoLCATs hybrids trained with the max-shifted ``lolcats`` rule, *without
  further training*, and reads them with its own unshifted rule (the authors' code notes the
  shifted rule scored far below theirs). On the first shipped linearized SmolLM2 the paper's
  rule kept far more pass-keys than the trained rule at 2K and 4K, and more still at 4K once
  stage 2 also trained through LoLA with this rule, the weights shipped now (docs/results.md,
  "The paper's rule: LoLA on the shipped hybrid, measured to the end").
- **The hybrid** (no sparse cache): the rule the maps were trained with, i.e. the hybrid as it
  was trained.

A rule the caller sets is always kept. :meth:`lola.pretrained.folder.FeatureMaps.merge_into` calls
:func:`resolve_mixing`, so ``apply_lola(..., feature_maps=…)`` and ``lola.models.load(...,
linearized=True)`` share it.

The per-head sparse budgets a run asks for by name (``budgets="auto"``, a shipped name or a
``lola calibrate`` file) are decided here too (:func:`resolve_budgets`; ``"auto"`` prefers the
budgets calibrated for the feature maps a run applies, then the model's shipped ones), and
:func:`resolve_config` puts the three together (config, budgets, feature maps and rule): the one
resolution of ``lola niah``, ``lola perplexity``, the lm-eval model and the vLLM plug-in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from lola.config import LoLAConfig
from lola.pretrained.mixing_rule import PAPER_MIXING, default_mixing, has_sparse_cache, resolve_mixing
from lola.pretrained.model_entry import entry_config, is_entry

__all__ = [
    "AUTO_BUDGETS",
    "PAPER_MIXING",
    "default_mixing",
    "has_sparse_cache",
    "maps_budgets",
    "resolve_budgets",
    "resolve_config",
    "resolve_mixing",
    "resolve_positions",
    "run_config",
    "takes_budgets",
]

AUTO_BUDGETS = "auto"
"""The budgets name that means: where they apply, the budgets calibrated for the feature maps a
run applies, else the model's shipped calibrated budgets (:func:`resolve_budgets`)."""


def resolve_config(
    config: LoLAConfig | Mapping[str, Any] | None = None,
    trained_mixing: str | None = None,
    *,
    model: str | None = None,
    feature_maps: Any = None,
    budgets: str | os.PathLike | None = None,
    maps_to_apply: str | os.PathLike | None = None,
) -> LoLAConfig:
    """The config a run executes: the one resolution of every command and integration
    (``lola niah``, ``lola perplexity``, the lm-eval model, the vLLM plug-in).

    In order: ``config`` is read (a :class:`~lola.LoLAConfig`, a mapping of its fields such as
    vLLM's ``hf_overrides={"lola": {...}}``, the ``lola`` entry that ``save_pretrained`` wrote to
    a model's ``config.json`` (:mod:`lola.pretrained.model_entry`), or ``None``: the defaults); the per-head
    sparse ``budgets`` are applied (:func:`resolve_budgets`, ``"auto"`` by the maps, else by
    ``model``); the
    ``feature_maps``' trained fields fill what the config leaves unset; and the mixing rule, if
    unset, is decided (:func:`default_mixing`) on the config as it will run, budgets included
    (without maps or ``trained_mixing`` it stays unset: maps applied later decide it).

    Args:
        config: the config or its description.
        trained_mixing: the rule of trained maps known without reading them (the saved entry of
            an exported model records its own); ignored when ``feature_maps`` are given.
        model: the registered model name, for ``budgets="auto"``.
        feature_maps: :class:`~lola.pretrained.folder.FeatureMaps` as
            :func:`~lola.pretrained.folder.read_feature_maps` reads them, or ``None``.
        budgets: ``None``/``"uniform"``, ``"auto"``, a shipped name or a ``lola calibrate`` file.
        maps_to_apply: the feature maps (shipped name or folder) a run applies later
            (``apply_lola(..., feature_maps=…)``, as ``lola niah`` and ``lola perplexity`` do):
            only the budgets calibrated for them are read here, for ``"auto"``; ignored when
            ``feature_maps`` are given.

    Raises:
        TypeError: ``config`` or ``feature_maps`` of another kind.
        ValueError: budgets the config cannot take, or a config field that conflicts with the maps.
    """
    if config is None:
        config = LoLAConfig()
    elif is_entry(config):
        config = entry_config(config)
    elif not isinstance(config, LoLAConfig):
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a LoLAConfig, a mapping of its fields or None, got {type(config).__name__}")
        config = LoLAConfig(**config)
    config = resolve_budgets(config, budgets, model, feature_maps if feature_maps is not None else maps_to_apply)
    if feature_maps is None:
        # Without trained maps an unset rule stays unset (it reads as LoLAConfig's default), so
        # that maps given later (``apply_lola(..., feature_maps=...)``) still decide it.
        return config if trained_mixing is None else resolve_mixing(config, trained_mixing)
    if not hasattr(feature_maps, "merge_into"):
        # (lola.pretrained reads them, and imports this module: read maps are passed in)
        raise TypeError(f"feature_maps must be read feature maps (lola.pretrained.folder.read_feature_maps), got {type(feature_maps).__name__}")
    return feature_maps.merge_into(config)


def takes_budgets(config: LoLAConfig) -> bool:
    """Whether per-head budgets can be applied to ``config``
    (:meth:`lola.budgets.HeadBudgets.apply`): it stores per K/V head and sets no per-head or
    per-layer sparse sizes of its own."""
    own_sizes = config.sparse_size_per_head is not None or any("sparse_size" in o or "sparse_size_per_head" in o for o in config.layer_overrides.values())
    return config.gqa_storage == "kv_head" and not own_sizes


def resolve_budgets(config: LoLAConfig, budgets: str | os.PathLike | None, model: str | None = None, feature_maps: Any = None) -> LoLAConfig:
    """``config`` with the per-head sparse budgets ``budgets`` names: the one rule for every
    command and integration that takes a ``budgets`` option.

    Args:
        config: the LoLA config (fields it leaves unset, such as the mixing rule, stay unset).
        budgets: ``None`` or ``"uniform"``: ``config`` as it is. ``"auto"``, when ``config`` can
            take budgets (:func:`takes_budgets`): the budgets calibrated for ``feature_maps`` if
            they carry any (their ``read`` entry, :class:`~lola.pretrained.folder.ReadDefaults`:
            the adapted model keeps its needles in other heads than the stock one), else the
            shipped budgets of ``model`` if there are any, else ``config`` as it is. Otherwise a
            shipped name or a ``lola calibrate`` file, applied.
        model: the registered model name, for ``"auto"``.
        feature_maps: the feature maps the config will read (read maps, a shipped name or a
            folder), or ``None`` (the stock model).

    Raises:
        ValueError: named budgets that ``config`` cannot take (per query head, or its own sizes).
        FileNotFoundError: a budgets file that does not exist.
    """
    from lola import budgets as head_budgets

    if budgets == AUTO_BUDGETS:
        if not takes_budgets(config):
            return config
        calibrated = maps_budgets(feature_maps)
        if calibrated is not None:
            return calibrated.apply(config)
        budgets = model if model in head_budgets.available() else None
    if budgets is None or budgets == "uniform":
        return config
    return head_budgets.load(budgets).apply(config)


def maps_budgets(feature_maps: Any) -> Any:
    """The :class:`~lola.budgets.HeadBudgets` calibrated for ``feature_maps`` (read maps, a shipped
    name or a folder; their ``read.budgets``), or ``None`` (none given, or none calibrated)."""
    if feature_maps is None:
        return None
    if isinstance(feature_maps, (str, os.PathLike)):
        from lola.pretrained.folder import read_defaults

        read = read_defaults(feature_maps)
    else:
        read = getattr(feature_maps, "read", None)
    return None if read is None else read.budgets


def resolve_positions(config: LoLAConfig, model_positions: int | None, trained_length: int | None = None) -> LoLAConfig:
    """``config`` with the limits of ``positions="bounded"`` that it leaves unset filled in
    (unchanged under absolute positions):

    - ``exact_distance``: the length the feature maps and their adapters were trained at
      (``trained_length``: the adapted weights read distances beyond it badly; at 16K a cap at
      the model's context answered 1 of 4 tuning prompts, at 2,048 all four: docs/results.md,
      "Past the model's context"), else the model's context less one schedule period
      (``model_positions − P``); never more than that, so that no exact read sees a distance
      the model was not trained on;
    - ``state_positions``: the length trained feature maps were trained at (``trained_length``),
      else the model's context.

    Args:
        model_positions: the model's ``max_position_embeddings`` (``None``: unknown).
        trained_length: the positions the feature maps were trained on, or ``None``.
    """
    if config.positions != "bounded":
        return config
    update: dict[str, int] = {}
    known = type(model_positions) is int and model_positions > 0
    from lola.schedules import build as build_schedule

    schedule = build_schedule(config.schedule, chunk=config.chunk, **config.schedule_kwargs)
    # the most tokens between two steps: a prefill's block (prefill_chunk) reads at one position too
    period = max(schedule.period, getattr(schedule, "prefill_period", schedule.period))
    if config.exact_distance is None:
        # a read sees distances up to exact_distance + period - 1: within the model's context
        most = model_positions - period if known else None
        if trained_length:
            update["exact_distance"] = int(trained_length) if most is None else max(1, min(int(trained_length), most))
        elif most is None or most < 1:
            raise ValueError(
                f"positions='bounded' needs exact_distance: the model's context ({model_positions!r} positions) does not give one beyond the schedule's period {period}; set exact_distance"
            )
        else:
            update["exact_distance"] = most
    if config.state_positions is None:
        if trained_length:
            update["state_positions"] = int(trained_length)
        elif known:
            update["state_positions"] = model_positions
        else:
            raise ValueError(
                "positions='bounded' needs state_positions: neither the feature maps nor the model say how many positions they were trained on; set it"
            )
    if known:  # limits given by the caller: bounded means inside what the model was trained on
        if config.exact_distance is not None and config.exact_distance > model_positions - period:
            raise ValueError(
                f"exact_distance {config.exact_distance} lets exact reads see distances up to {config.exact_distance + period - 1}, past the model's "
                f"{model_positions} positions (a schedule period is {period}): give at most {max(1, model_positions - period)}"
            )
        if config.state_positions is not None and config.state_positions > model_positions:
            raise ValueError(f"state_positions {config.state_positions} is past the model's {model_positions} positions: give at most {model_positions}")
    return config.model_copy(update=update) if update else config


def run_config(config: LoLAConfig | None, feature_maps: Any = None, model_positions: int | None = None) -> LoLAConfig | None:
    """The config a LoLA layer runs with once :func:`~lola.integrations.transformers.apply_lola`
    applied read ``feature_maps`` (their trained fields and read defaults) on a model of
    ``model_positions`` positions (the limits of bounded positions); ``None`` (full attention)
    stays ``None``. What the evaluations record and decide with before applying anything."""
    if config is None:
        return None
    if feature_maps is not None:
        config = feature_maps.merge_into(config)
    return resolve_positions(config, model_positions, feature_maps.trained_length if feature_maps is not None else None)
