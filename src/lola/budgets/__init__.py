"""Per-head sparse budgets: spend the exact tokens where retrieval happens.

A uniform budget gives every K/V head of every layer the same sparse cache. A few heads do the
retrieving (Wu et al. 2024; DuoAttention), so :func:`allocate` redistributes the *same total*
over layers and heads in proportion to a per-head retrieval score (``score ** power``; lower
powers spread it more evenly), and :class:`HeadBudgets` carries the result as
``LoLAConfig.layer_overrides``. ``lola calibrate`` measures the scores on a model
(:mod:`lola.eval.calibrate`); budgets for the registered models ship with the library::

    budgets = lola.budgets.load("smollm2-135m-instruct")
    cfg = budgets.apply(lola.LoLAConfig(window=60, sparse_size=192, sinks=4), model=model)

The sparse caches of such a config hold and save exactly ``Σ λ_h`` slots per row (one ragged
run, each head its own range), so their exact-token bytes never exceed the uniform budget's.
"""

from __future__ import annotations

import json
import math
import os
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

from lola.config import LoLAConfig, validation_summary
from lola.limits import MAX_LAYERS, MAX_TOKENS

__all__ = ["HeadBudgets", "allocate", "available", "is_budgets_file", "load"]


def allocate(scores: torch.Tensor, per_head: int, power: float = 0.5, floor: int = 0, cap: int | None = None) -> torch.Tensor:
    """Split ``per_head × scores.numel()`` sparse slots over heads, in proportion to ``score ** power``.

    Args:
        scores: ``[layers, kv_heads]`` non-negative retrieval scores.
        per_head: the uniform sparse size being redistributed.
        power: exponent on the scores (``1``: proportional; ``0``: uniform).
        floor: slots every head keeps at least.
        cap: most slots any head gets (``None``: no limit); the excess goes to the others.

    Returns:
        ``[layers, kv_heads]`` int64 sizes with ``floor <= size <= cap`` and
        ``sum <= per_head × numel`` (equal unless every head is capped).
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or scores.numel() == 0:
        raise ValueError(f"scores must be a non-empty [layers, kv_heads] tensor, got {getattr(scores, 'shape', type(scores).__name__)}")
    if not bool(torch.isfinite(scores).all()) or bool((scores < 0).any()):
        raise ValueError("scores must be finite and >= 0")
    if isinstance(power, bool) or not isinstance(power, (int, float)) or not math.isfinite(power) or power < 0:
        raise ValueError(f"power must be a finite number >= 0, got {power!r}")
    if per_head < 0 or floor < 0:
        raise ValueError(f"per_head and floor must be >= 0, got {per_head} and {floor}")
    if floor > per_head:
        raise ValueError(f"floor ({floor}) must be <= per_head ({per_head}): the total could not be kept")
    if cap is not None and cap < floor:
        raise ValueError(f"cap ({cap}) must be >= floor ({floor})")
    if power < 0:
        raise ValueError(f"power must be >= 0, got {power}")
    total = per_head * scores.numel()
    weight = scores.double() ** power if power > 0 else torch.ones_like(scores, dtype=torch.float64)
    if float(weight.sum()) == 0:
        weight = torch.ones_like(weight)
    limit = torch.full_like(weight, float("inf") if cap is None else float(cap))
    share = torch.full_like(weight, float(floor))
    free = share < limit
    # Water-filling: hand out what is left in proportion to the weights of heads not yet capped.
    for _ in range(scores.numel() + 1):
        left = total - float(share.sum())
        w = torch.where(free, weight, 0.0)
        if float(w.sum()) == 0:  # only zero-score heads are left uncapped: share it evenly
            w = free.double()
        if left <= 1e-9 or float(w.sum()) == 0:
            break
        share = torch.minimum(share + left * w / w.sum(), limit)
        free = share < limit
    sizes = share.floor().long()
    # Whole slots lost to rounding go to the largest remainders (never past the cap).
    spare = min(int(total - int(sizes.sum())), int(free.sum()))
    if spare > 0:
        rest = torch.where(free, share - sizes, -1.0).flatten()
        sizes.view(-1)[rest.topk(spare).indices] += 1
    return sizes


class HeadBudgets(BaseModel):
    """Calibrated sparse sizes per layer and K/V head, and how they were obtained.

    Attributes:
        sparse_size_per_head: ``[layers][kv_heads]`` sparse-cache sizes.
        uniform_sparse_size: the uniform size they redistribute (their mean never exceeds it).
        scores: ``[layers][kv_heads]`` the retrieval scores they were allocated from.
        power: the exponent used by :func:`allocate`.
        source: how the scores were measured (command, prompts, lengths, versions).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Strict: a bool or a float is not a size; scores and power are finite and >= 0.
    sparse_size_per_head: list[list[Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS)]]] = Field(min_length=1, max_length=MAX_LAYERS)
    uniform_sparse_size: Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS)]
    scores: list[list[Annotated[float, Strict(), Field(ge=0)]]]
    power: Annotated[float, Strict(), Field(ge=0)]
    floor: Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS)] = 0
    source: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _floor_from_source(cls, data: Any) -> Any:
        # Files written before `floor` was a field record it in their source only.
        if isinstance(data, dict) and "floor" not in data and isinstance(data.get("source"), dict):
            floor = data["source"].get("floor")
            if isinstance(floor, int) and not isinstance(floor, bool):
                data = {**data, "floor": floor}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "HeadBudgets":
        heads = {len(row) for row in self.sparse_size_per_head}
        if len(heads) != 1 or 0 in heads:
            raise ValueError("sparse_size_per_head must have the same, non-zero number of heads in every layer")
        if any(x < 0 for row in self.sparse_size_per_head for x in row):
            raise ValueError("sparse sizes must be >= 0")
        if [len(r) for r in self.scores] != [len(r) for r in self.sparse_size_per_head]:
            raise ValueError("scores must have the shape of sparse_size_per_head")
        if min(min(row) for row in self.sparse_size_per_head) < self.floor:
            raise ValueError(f"sparse_size_per_head holds a head below the floor {self.floor} the budgets were allocated with")
        if self.total_slots > self.uniform_sparse_size * self.num_layers * self.num_kv_heads:
            raise ValueError(f"budgets hold {self.total_slots} sparse slots, more than the uniform {self.uniform_sparse_size} per head allows")
        return self

    @property
    def num_layers(self) -> int:
        return len(self.sparse_size_per_head)

    @property
    def num_kv_heads(self) -> int:
        return len(self.sparse_size_per_head[0])

    @property
    def total_slots(self) -> int:
        """Sparse slots over all layers and heads (per sequence)."""
        return sum(sum(row) for row in self.sparse_size_per_head)

    def check_geometry(self, num_layers: int, num_kv_heads: int) -> None:
        """Refuse a model these budgets were not calibrated for.

        Raises:
            ValueError: the model's layers or K/V heads differ from the budgets' (both named,
                with the model the budgets were calibrated on when they record it).
        """
        if (self.num_layers, self.num_kv_heads) != (num_layers, num_kv_heads):
            model = self.source.get("model")
            calibrated = f" (calibrated on {model})" if isinstance(model, str) else ""
            raise ValueError(
                f"budgets for {self.num_layers} layers x {self.num_kv_heads} K/V heads{calibrated}, but the model has "
                f"{num_layers} layers x {num_kv_heads} K/V heads: use budgets calibrated for this model (`lola calibrate`) or uniform"
            )

    def sizes_for(self, sparse_size: int) -> list[list[int]]:
        """Per-layer, per-head sizes redistributing a uniform ``sparse_size``: the stored sizes
        for :attr:`uniform_sparse_size`, else a new :func:`allocate` of the same scores and power."""
        if sparse_size == self.uniform_sparse_size:
            return [list(row) for row in self.sparse_size_per_head]
        if self.floor > sparse_size:
            raise ValueError(
                f"these budgets keep at least {self.floor} sparse slots in every head (their floor), more than sparse_size {sparse_size}: "
                f"use a sparse_size of at least {self.floor}, or budgets calibrated without a floor"
            )
        return allocate(torch.tensor(self.scores, dtype=torch.float64), sparse_size, power=self.power, floor=self.floor).tolist()

    def apply(self, config: LoLAConfig, model: Any = None) -> LoLAConfig:
        """``config`` with each layer's ``sparse_size_per_head`` redistributing its
        ``sparse_size`` by these budgets' scores (:meth:`sizes_for`): the same total of sparse
        slots as the uniform config.

        Args:
            config: the uniform config.
            model: the transformers model the config is for (or its config): budgets for
                another number of layers or K/V heads are refused (:meth:`check_geometry`).
                Without it, ``apply_lola`` still refuses budgets for more layers than the
                model has, but not for fewer.

        Raises:
            ValueError: if ``config`` stores per query head (budgets are per K/V head) or sets
                its own per-head or per-layer sparse sizes, or ``model`` has another geometry.
        """
        if model is not None:
            hf = getattr(model, "config", model)
            layers, heads = getattr(hf, "num_hidden_layers", None), getattr(hf, "num_key_value_heads", None) or getattr(hf, "num_attention_heads", None)
            if not isinstance(layers, int) or not isinstance(heads, int):
                raise TypeError(f"model must be a transformers model or its config (num_hidden_layers, num_key_value_heads), got {type(model).__name__}")
            self.check_geometry(layers, heads)
        if config.gqa_storage != "kv_head":
            raise ValueError("head budgets are per K/V head: use gqa_storage='kv_head'")
        if config.sparse_size_per_head is not None or any("sparse_size_per_head" in o or "sparse_size" in o for o in config.layer_overrides.values()):
            raise ValueError("the config already sets per-head or per-layer sparse sizes")
        overrides = {i: dict(config.layer_overrides.get(i, {})) for i in range(self.num_layers)}
        for i, row in enumerate(self.sizes_for(config.sparse_size)):
            overrides[i]["sparse_size_per_head"] = list(row)
        extra = [i for i in config.layer_overrides if i >= self.num_layers]
        if extra:
            raise ValueError(f"the config overrides layers {extra}, the budgets cover {self.num_layers}")
        # Only the fields the caller set are passed on, so that fields left unset (e.g. the mixing
        # rule, which trained feature maps fill in) stay unset.
        return LoLAConfig(**{**config.model_dump(exclude_unset=True), "layer_overrides": overrides})

    def summary(self) -> str:
        """Per-layer sparse sizes as a plain-text table, with the totals."""
        lines = [f"{'layer':>5}  sparse size per K/V head", "-" * 32]
        lines += [f"{i:>5}  " + " ".join(f"{x:>5}" for x in row) for i, row in enumerate(self.sparse_size_per_head)]
        uniform = self.uniform_sparse_size * self.num_layers * self.num_kv_heads
        lines.append(
            f"\ntotal {self.total_slots} sparse slots (uniform {self.uniform_sparse_size} per head: {uniform}); "
            f"{sum(x > 0 for row in self.sparse_size_per_head for x in row)} of {self.num_layers * self.num_kv_heads} heads keep a sparse cache"
        )
        return "\n".join(lines)

    def save(self, path: str | Path) -> None:
        """Write the budgets as JSON (one line per layer), atomically; an existing file is
        replaced only if it holds budgets (:func:`lola.io.outputs.write_files`).

        Raises:
            ValueError: ``path`` is a link or an existing file that is not budgets (named).
        """
        from lola.io.outputs import write_files

        text = self.model_dump_json(indent=1)
        # Lists of numbers on one line each: a layer's heads read across.
        text = re.sub(r"\[\s+([-\d.,eE+\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
        path = Path(path)
        write_files(path.parent, {path.name: text + "\n"}, ours=is_budgets_file, writer="lola calibrate")


def is_budgets_file(path: str | Path) -> bool:
    """Whether ``path`` holds budgets (``lola calibrate`` output, which may be replaced)."""
    try:
        load(Path(path))
    except (ValueError, OSError):
        return False
    return True


def available() -> list[str]:
    """Names of the budgets shipped with lola (one per registered model)."""
    return sorted(p.name[: -len(".json")] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def load(name_or_path: str | Path) -> HeadBudgets:
    """Shipped budgets by model name (see :func:`available`), or a JSON file from ``lola calibrate``."""
    from lola.io.outputs import read_json

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"budgets must be a shipped name or a path, got {name_or_path!r} ({type(name_or_path).__name__})")
    if not str(name_or_path).strip():  # Path("") is the current folder, which nobody meant
        raise ValueError(f"budgets is empty: give a shipped name ({', '.join(available()) or 'none'}) or a JSON file from `lola calibrate`")
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ValueError(f"budgets file {str(path)!r} does not exist")
        data = read_json(path, "a valid budgets file")  # not a regular file, not UTF-8, garbled, a key twice: named
        where = str(path)
    else:
        if str(name_or_path) not in available():
            raise ValueError(
                f"no shipped budgets named {str(name_or_path)!r}; available: {', '.join(available()) or 'none'} (or give a JSON file from `lola calibrate`)"
            )
        data = json.loads(resources.files(__name__).joinpath(f"{name_or_path}.json").read_text())
        where = f"shipped budgets {name_or_path!r}"
    try:
        return HeadBudgets.model_validate(data)
    except ValidationError as err:
        raise ValueError(f"{where} is not a valid budgets file: {validation_summary(err)}") from None
