"""The needle-in-a-haystack run: its spec (:class:`NiahRun`) and the LoLA configs of its methods."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictInt, ValidationError, ValidationInfo, field_validator, model_validator

from lola.config import MAX_TOKENS, LoLAConfig, Tokens, validation_summary
from lola.core.mixing import MIXING_NAMES
from lola.eval.demo import Seed
from lola.eval.niah import check_templates
from lola.methods import (
    FOLDED_POLICIES,  # (defined beside the option scopes that read it; used here and re-exported)
    METHODS,
    ExactDistanceOption,
    LinearDecayOption,
    LinearShareCapFromOption,
    LinearShareCapOption,
    PositionsOption,
    PrefillChunkOption,
    StateKeyPositionsOption,
    StatePositionsOption,
    linear_state_options,
    method_config,
    method_name,
    position_options,
)
from lola.pretrained.resolve import resolve_config


def _distinct(name: str, values: list) -> list:
    """``values`` if no entry repeats; a repeated length or method would run (and count) twice."""
    repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
    if repeated:
        raise ValueError(f"{name} must be distinct, got {values} ({', '.join(map(str, repeated))} more than once)")
    return values


def _known_and_distinct(name: str, values: list[str], available: Sequence[str]) -> list[str]:
    """``values`` if each is one of ``available`` and none repeats (``name``: the option, for the message)."""
    bad = [v for v in values if v not in available]
    if bad:
        raise ValueError(f"unknown {name} {bad}; available: {', '.join(available)}")
    return _distinct(name, values)


PAPER_METHODS = ("full", "hybrid", "lola")
"""The methods of the default run on a linearized model: full attention (stock weights), the
window + linear hybrid with its trained rule, and LoLA."""


class NiahRun(BaseModel):
    """Everything that defines a run (saved in ``results.json``; a resumed run must match)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field("smollm2-135m-instruct", description="registered name, .gguf file or Hugging Face folder")
    task: str = Field("niah_single_1", description="niah_single_1, niah_multikey_2, niah_multikey_3 or vt")
    lengths: list[StrictInt] = Field(
        default_factory=lambda: [2048, 4096], min_length=1, description="context lengths in tokens (1024 2048 by default with no feature maps)"
    )
    samples: StrictInt = Field(5, ge=1, le=1_000_000, description="samples per length, at evenly spread depths")
    methods: list[str] = Field(
        default_factory=lambda: list(PAPER_METHODS),
        min_length=1,
        description=f"any of {', '.join(METHODS)}; with no feature maps the default is all of them",
    )
    # The learned scorer won the tournament at the same bytes and samples (docs/results.md, "A
    # learned scorer"): the default where one ships for the model, else self-recall error.
    policies: list[str] = Field(
        default_factory=lambda: ["sre", "learned"],
        description="scoring policies of the lola method, one run each (with no feature maps: learned where a scorer ships, else sre); "
        "empty when only `variants` run",
    )
    window: Tokens = Field(60, description="window of the lola method")
    # 4 + 60 + 192 = 256 exact tokens: at 2K a 192-token sparse cache kept far more needles than
    # a 64-token one (docs/results.md, "Budget: how many sparse tokens").
    sparse_size: Tokens = Field(192, description="sparse cache of the lola method (per K/V head on average with budgets)")
    sinks: Tokens = Field(4, description="pinned first tokens")
    chunk: StrictInt = Field(64, ge=1, le=MAX_TOKENS, description="tokens between select-and-evict steps")
    prefill_chunk: PrefillChunkOption = None
    # Training-free (untrained identity Hedgehog map), softmax_only recalled more than
    # lola_authors (docs/results.md, "Pass-key retrieval, training-free").
    # None: softmax_only, or with feature_maps lola.pretrained.resolve's default (lola_authors for LoLA, the
    # trained rule for the hybrid).
    mixing: Literal[MIXING_NAMES] | None = Field(
        None, description="mixing rule of the lola method (none: softmax_only; with --feature-maps the paper's lola_authors, the trained rule for the hybrid)"
    )
    linear_decay: LinearDecayOption = None
    linear_share_cap: LinearShareCapOption = None
    linear_share_cap_from: LinearShareCapFromOption = None
    positions: PositionsOption = None
    exact_distance: ExactDistanceOption = None
    state_positions: StatePositionsOption = None
    state_key_positions: StateKeyPositionsOption = None
    # At 8K the learned scorer filled heads' sparse caches with copies of the haystack's repeated
    # tokens; folding repeats answered more of the same prompts (docs/results.md, "What the
    # misses at 8K are"). Decided with the model and maps: on with trained maps, for the learned scorer.
    fold_repeats: Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="wrap the learned policy in `distinct`: a candidate whose value has cosine >= this with a higher-ranked "
        "candidate's is folded into the linear state (0: off; none: 0.95 with trained feature maps, else off)",
    )
    # One copy kept folded digits of prose needles into prose digits and a needle's own repeated
    # digits, and lost prose needles the unfolded run kept; four copies kept both (docs/results.md,
    # "Repeats on prose: keep four copies").
    fold_copies: StrictInt | None = Field(
        None, ge=1, le=MAX_TOKENS, description="with fold_repeats: higher-ranked near-copies that make a candidate a repeat (none: 4)"
    )
    feature_maps: str | None = Field(
        "auto",
        description="a `lola linearize` folder or a shipped name, loaded into every method but full; auto: the model's shipped maps if any; none: untrained maps (training-free)",
    )
    gqa_storage: Literal["kv_head", "query_head"] = "kv_head"
    max_new_tokens: StrictInt | None = Field(
        None, ge=1, le=MAX_TOKENS, description="tokens generated per answer (none: 12 for number answers, 64 for uuids and vt)"
    )
    seed: Seed = Field(0, description="seed of the samples (needles, depths, haystacks)")
    haystack_file: str | None = Field(None, description="a text whose sentences replace the noise haystack (niah_single_1)")
    needle: str | None = Field(None, description="needle template with {key} and {value} (with --question)")
    question: str | None = Field(None, description="question template with {key} (with --needle)")
    answer_prefix: str | None = Field(None, description="with a custom question: text that starts the answer, with {key}")
    # Calibrated budgets won the tournament at the same bytes, most of all on prose
    # (docs/results.md, "Tournament at the same bytes"). "auto": those calibrated for the maps, else the model's shipped budgets, else uniform.
    budgets: str | None = Field(
        "auto",
        description="sparse budgets of the lola method: auto (budgets calibrated for the feature maps, else the model's shipped ones, where they apply; else uniform), uniform, a shipped name or a `lola calibrate` file",
    )
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict, description="extra lola variants: name -> LoLAConfig fields (and 'budgets')")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        from lola.eval.niah import TASKS

        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; available: {', '.join(TASKS)}")
        return task

    @field_validator("haystack_file")
    @classmethod
    def _readable_haystack(cls, path: str | None) -> str | None:
        if path is not None:
            from lola.data.text import read_text_file

            p = Path(path)
            if not p.is_file():
                raise ValueError(f"haystack file {path!r} does not exist")
            if not read_text_file(p).strip():  # binary or non-UTF-8 text is refused, naming the file
                raise ValueError(f"haystack file {path!r} is empty")
        return path

    @field_validator("feature_maps")
    @classmethod
    def _feature_maps_folder(cls, path: str | None) -> str | None:
        from lola.pretrained.shipped import SHIPPED

        if path is not None and path not in SHIPPED and not (Path(path) / "feature_maps.safetensors").is_file():
            raise ValueError(f"{path!r} is not a feature-map folder (no feature_maps.safetensors; create it with `lola linearize --out {path}`)")
        return path

    @field_validator("max_new_tokens")
    @classmethod
    def _room_for_a_prompt(cls, tokens: int | None, info: ValidationInfo) -> int | None:
        # A length counts the prompt and the answer: checked here, before any model loads,
        # rather than when the first prompt is built.
        lengths = info.data.get("lengths")
        if tokens is not None and lengths and tokens >= min(lengths):
            raise ValueError(f"must be smaller than the shortest of lengths {lengths} (a length holds the prompt and the answer), got {tokens}")
        return tokens

    @model_validator(mode="before")
    @classmethod
    def _defaults_for_the_model(cls, data: Any) -> Any:
        # Decided here, from the model and maps the run names, so that results.json records
        # what ran. Where linearized maps ship for the model, the default is the paper's
        # experiment on them: full attention, the hybrid, and LoLA scored by SRE (the paper's
        # score) and by the learned scorer, at lengths where the hybrid fails; --feature-maps
        # none is the training-free run on the stock model (softmax_only, as before).
        if not isinstance(data, dict):
            return data
        data = dict(data)
        model = data.get("model", cls.model_fields["model"].default)
        maps = data.get("feature_maps", "auto")
        if maps == "auto":
            maps = shipped_maps_for(model)
        elif maps == "none":
            maps = None
        data["feature_maps"] = maps
        if data.get("methods") is None:
            data["methods"] = list(PAPER_METHODS) if maps is not None else list(METHODS)
        if data.get("lengths") is None:
            data["lengths"] = [2048, 4096] if maps is not None else [1024, 2048]
        if data.get("fold_repeats") is None:
            data["fold_repeats"] = FOLD_REPEATS if maps is not None else 0.0
        if data.get("fold_copies") is None:
            data["fold_copies"] = FOLD_COPIES
        if data.get("prefill_chunk") is None and maps is not None:
            data["prefill_chunk"] = paper_prefill_chunk(data.get("chunk", cls.model_fields["chunk"].default))
        if data.get("policies") is None:
            learned = default_policy(model, maps)
            data["policies"] = ["sre", learned] if maps is not None and learned != "sre" else [learned]
        return data

    @model_validator(mode="after")
    def _variants_need_lola(self) -> "NiahRun":
        # Variants are LoLA configs: without the lola method they would be dropped unread.
        if self.variants and "lola" not in self.methods:
            raise ValueError(f"variants ({', '.join(self.variants)}) run with the lola method only: add lola to methods {self.methods} or remove the variants")
        if "lola" in self.methods and not self.policies and not self.variants:
            raise ValueError("policies is empty and there are no variants: the lola method needs at least one policy or variant")
        if self.max_new_tokens is None and self.new_tokens >= min(self.lengths):
            raise ValueError(
                f"lengths {self.lengths} leave no room for a prompt beside the {self.new_tokens} tokens a {self.task} answer gets "
                "(max_new_tokens unset); give longer lengths or a smaller max_new_tokens"
            )
        return self

    @model_validator(mode="after")
    def _custom_needle(self) -> "NiahRun":
        if (self.needle is None) != (self.question is None):
            raise ValueError("needle and question must be given together")
        check_templates(self.needle, self.question, self.answer_prefix)  # before any model loads
        if (self.haystack_file or self.needle) and self.task != "niah_single_1":
            raise ValueError("haystack_file, needle and question apply to niah_single_1 only")
        if self.answer_prefix is not None and self.question is None:
            raise ValueError("answer_prefix needs a custom question (the default template has its own)")
        method_configs(self)  # every variant and budget must build (errors name the field)
        return self

    @property
    def new_tokens(self) -> int:
        """Tokens generated per answer."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return 64 if self.task in ("niah_multikey_3", "vt") else 12  # a uuid is ~40 SmolLM2 tokens

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        return _known_and_distinct("methods", [method_name(m) for m in methods], METHODS)

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, names: list[str]) -> list[str]:
        from lola import policies

        return _known_and_distinct("policies", names, policies.available())

    @field_validator("lengths")
    @classmethod
    def _positive_lengths(cls, lengths: list[int]) -> list[int]:
        if any(n < 64 for n in lengths):
            raise ValueError(f"lengths must be >= 64 tokens, got {lengths}")
        if any(n > MAX_TOKENS for n in lengths):
            raise ValueError(f"lengths must be <= {MAX_TOKENS} tokens, got {lengths}")
        return _distinct("lengths", lengths)

    @property
    def budget(self) -> int:
        """Exact tokens of every method but ``full``."""
        return self.sinks + self.window + self.sparse_size


def default_lola_config(model: str, trained_maps: bool = True, feature_maps: str | os.PathLike | None = None) -> LoLAConfig:
    """The ``lola`` method as ``lola niah`` runs it by default for ``model``: :class:`NiahRun`'s
    window, sparse cache, sinks and chunk (with trained maps the prefill's chunk,
    :data:`PREFILL_CHUNK`), and ``budgets="auto"`` (those calibrated for
    ``feature_maps`` when they carry any, else the model's shipped budgets if it has any); with
    ``trained_maps`` (``--feature-maps``) the rule is left for :mod:`lola.pretrained.resolve`
    (the paper's), without them it is ``softmax_only``. Its policy is SRE (repeats are not folded
    under it: :data:`FOLDED_POLICIES`)."""
    d = {name: field.default for name, field in NiahRun.model_fields.items()}
    trained_maps = trained_maps or feature_maps is not None
    prefill = paper_prefill_chunk(d["chunk"]) if trained_maps else None  # as the run's default with maps
    cfg = method_config(
        "lola", window=d["window"], sparse_size=d["sparse_size"], sinks=d["sinks"], chunk=d["chunk"], prefill_chunk=prefill, trained_maps=trained_maps
    )
    return resolve_config(cfg, model=model, budgets=d["budgets"], maps_to_apply=feature_maps)


def check_budgets(run: NiahRun, model: Any) -> None:
    """Refuse budgets calibrated for another model (another number of layers or K/V heads),
    naming the option that set them (``--budgets``, or ``variants.NAME.budgets``)."""
    from lola import budgets as head_budgets
    from lola.errors import about
    from lola.pretrained.folder import model_geometry

    named = {"--budgets": run.budgets, **{f"variants.{name}.budgets": v.get("budgets") for name, v in run.variants.items()}}
    if not any(b not in (None, "uniform", "auto") for b in named.values()):
        return
    geometry = model_geometry(model)
    for option, budgets in named.items():
        if budgets not in (None, "uniform", "auto"):
            with about(f"{option} {budgets}"):
                head_budgets.load(budgets).check_geometry(geometry["num_layers"], geometry["num_kv_heads"])


def run_inputs(run: NiahRun, model: Any = None) -> dict[str, str]:
    """Fingerprints, by content, of what a run reads besides its options: the haystack, the
    feature maps (folder or shipped name), budget files (the run's and its variants') and, once
    it is loaded, the model's weights (``model``, :func:`lola.io.checksums.weights_digest`).
    Saved in ``results.json``; a resume on other content under the same path or name is refused."""
    from lola.io.checksums import content_digest
    from lola.pretrained.shipped import resolve_feature_maps

    inputs = {}
    if model is not None:
        from lola.io.checksums import weights_digest

        inputs["model"] = weights_digest(model)
    if run.haystack_file is not None:
        inputs["haystack_file"] = content_digest(run.haystack_file)
    if run.feature_maps is not None:
        inputs["feature_maps"] = content_digest(resolve_feature_maps(run.feature_maps))
    budgets = {"budgets": run.budgets, **{f"variants.{name}.budgets": v.get("budgets") for name, v in run.variants.items()}}
    for key, value in budgets.items():
        if isinstance(value, str) and Path(value).is_file():
            inputs[key] = content_digest(value)
    return inputs


def shipped_maps_for(model: Any) -> str | None:
    """The name of the feature maps that ship for ``model`` (linearized with ``lola linearize``), or ``None``."""
    from lola.pretrained.shipped import SHIPPED

    return next((name for name, maps in SHIPPED.items() if isinstance(model, str) and maps.model == model), None)


FOLD_REPEATS = 0.95
"""``fold_repeats`` of a run on shipped linearized maps (the threshold chosen at 8K:
docs/results.md, "What the misses at 8K are")."""
PREFILL_CHUNK = 256
"""The prefill's chunk of a run on linearized maps: the LoLA authors' chunk (one select step
per 256 tokens), with decoding still every ``chunk`` so that the cache keeps the bytes of the
decode chunk (:class:`lola.schedules.Chunkwise`); it lost no recall cell at the same bytes
(docs/results.md, "The prefill's chunk")."""


def paper_prefill_chunk(chunk: Any) -> Any:
    """:data:`PREFILL_CHUNK` where it is a multiple of ``chunk``, else ``chunk`` (every chunk);
    ``chunk`` as it is when it is not an int (the field's validation names it)."""
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        return None
    return PREFILL_CHUNK if PREFILL_CHUNK % chunk == 0 else chunk


FOLD_COPIES = 4
"""``fold_copies`` unless given: a candidate is a repeat once four higher-ranked candidates repeat
its value, so a needle's repeated digits and the digits of a prose haystack stay exact while the
hundreds of copies of a repetitive haystack's tokens fold."""


def default_policy(model: Any, feature_maps: Any = None) -> str:
    """The scoring policy ``lola niah`` runs when none is named: ``learned`` when a scorer ships
    for ``model`` (:func:`lola.scorers.default_scorer`), else ``sre``."""
    from lola.scorers import default_scorer

    try:
        default_scorer(model, feature_maps)
    except (ValueError, TypeError):
        return "sre"
    return "learned"


def _policy_defaults(policy: str, run: NiahRun) -> dict[str, Any]:
    """Options a policy named in ``policies`` needs from the run: the ``learned`` policy gets the
    shipped scorer of the model (:func:`lola.scorers.default_scorer`)."""
    if policy != "learned":
        return {}
    from lola.scorers import default_scorer

    return {"policy_kwargs": {"scorer": default_scorer(run.model, run.feature_maps)}}


def policy_fields(policy: str, run: NiahRun) -> dict[str, Any]:
    """``{"policy", "policy_kwargs"}`` of the lola method scored by ``policy`` in ``run``: its
    options from the run (the learned scorer's model), wrapped in ``distinct`` when the run
    folds repeats (``fold_repeats``, ``fold_copies``) and ``policy`` is one of :data:`FOLDED_POLICIES`."""
    kwargs = _policy_defaults(policy, run).get("policy_kwargs", {})
    if run.fold_repeats and policy in FOLDED_POLICIES:  # the policy, its repeated values ranked last (lola.policies.Distinct)
        return {"policy": "distinct", "policy_kwargs": {"policy": policy, "policy_kwargs": kwargs, "threshold": run.fold_repeats, "copies": run.fold_copies}}
    return {"policy": policy, "policy_kwargs": kwargs}


def method_configs(run: NiahRun) -> dict[str, LoLAConfig | None]:
    """``{method name: LoLA config}`` (``None`` = stock attention) for the run's methods, built by
    :func:`lola.methods.method_config`; ``lola`` is run once per policy (``lola-<policy>``) and
    once per variant (``lola-<name>``)."""
    # With trained feature maps an unset mixing rule is decided when they are loaded (lola.pretrained.resolve).
    settings = dict(
        window=run.window,
        sparse_size=run.sparse_size,
        sinks=run.sinks,
        chunk=run.chunk,
        prefill_chunk=run.prefill_chunk,
        mixing=run.mixing,
        trained_maps=run.feature_maps is not None,
    )
    common = {"gqa_storage": run.gqa_storage, **position_options(run)}
    # The lola method's linear-state options (and its variants', unless they set their own).
    decay = linear_state_options(run)
    out: dict[str, LoLAConfig | None] = {}
    for method in run.methods:
        if method != "lola":
            out[method] = method_config(method, **settings, overrides=common)
            continue
        for policy in run.policies:
            fields = policy_fields(policy, run)
            overrides = {**common, **decay, "policy_kwargs": fields["policy_kwargs"]}
            cfg = method_config("lola", policy=fields["policy"], **settings, overrides=overrides)
            out[f"lola-{policy}"] = resolve_config(cfg, model=run.model, budgets=run.budgets, maps_to_apply=run.feature_maps)
        for name, fields in run.variants.items():
            fields = dict(fields)
            budgets = fields.pop("budgets", None)
            # A variant naming the learned policy gets the model's shipped scorer, as `policies` does.
            defaults = _policy_defaults(fields["policy"], run) if "policy" in fields and "policy_kwargs" not in fields else {}
            try:
                cfg = method_config("lola", **settings, overrides={**common, **decay, **defaults, **fields})
            except ValidationError as err:
                raise ValueError(f"variant {name!r}: {validation_summary(err)}") from None
            except (ValueError, TypeError) as err:
                raise ValueError(f"variant {name!r}: {err}") from None
            try:
                out[f"lola-{name}"] = resolve_config(cfg, model=run.model, budgets=budgets, maps_to_apply=run.feature_maps)
            except ValidationError as err:
                raise ValueError(f"variants.{name}.budgets {budgets!r}: {validation_summary(err)}") from None
            except (ValueError, TypeError, OSError) as err:
                raise ValueError(f"variants.{name}.budgets {budgets!r}: {err}") from None
    return out
