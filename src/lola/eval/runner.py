"""Run the needle-in-a-haystack experiment: every method on the same samples, resumable.

Methods (:mod:`lola.methods`; all but ``full`` share one exact-token budget ``sinks + window + sparse_size``):

- ``full``: stock attention and a growing cache.
- ``window``: sinks + a sliding window of the whole budget, softmax only.
- ``lolcats``: sinks + a sliding window of the whole budget + the linear state (mixed with the
  run's rule, or ``lola_authors`` when that is ``softmax_only``, which would ignore the state).
- ``lola``: sinks + window + sparse cache + linear state, once per scoring policy
  (reported as ``lola-<policy>``), with uniform or calibrated per-head budgets
  (:mod:`lola.budgets`), plus any named ``variants`` (``lola-<name>``): partial
  :class:`~lola.LoLAConfig` settings over the run's own, for comparing policies and
  allocations on the same samples.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, ValidationInfo, field_validator, model_validator

from lola.config import MAX_TOKENS, LoLAConfig, Tokens, validation_summary
from lola.demo import Seed
from lola.eval.niah import check_templates
from lola.methods import METHODS, method_config
from lola.resolve import resolve_budgets

__all__ = [
    "METHODS",
    "RESULTS_FORMAT",
    "NiahRun",
    "SampleRecord",
    "check_budgets",
    "default_lola_config",
    "check_out_folder",
    "run_inputs",
    "format_depth_summary",
    "format_intervals",
    "format_summary",
    "method_configs",
    "niah_prompts",
    "plot_results",
    "run_niah",
    "summarize",
    "summarize_by_depth",
    "wilson_interval",
]

RESULTS_FORMAT = "lola-niah-results"
"""The ``format`` marker of ``results.json``: a results folder without it is not lola's."""
RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILES = ("accuracy.png", "cache_bytes.png")


def _distinct(name: str, values: list) -> list:
    """``values`` if no entry repeats; a repeated length or method would run (and count) twice."""
    repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
    if repeated:
        raise ValueError(f"{name} must be distinct, got {values} ({', '.join(map(str, repeated))} more than once)")
    return values


class NiahRun(BaseModel):
    """Everything that defines a run (saved in ``results.json``; a resumed run must match)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field("smollm2-135m-instruct", description="registered name, .gguf file or Hugging Face folder")
    task: str = Field("niah_single_1", description="niah_single_1, niah_multikey_2, niah_multikey_3 or vt")
    lengths: list[StrictInt] = Field(default_factory=lambda: [1024, 2048], min_length=1, description="context lengths in tokens")
    samples: StrictInt = Field(5, ge=1, le=1_000_000, description="samples per length, at evenly spread depths")
    methods: list[str] = Field(default_factory=lambda: list(METHODS), min_length=1, description=f"any of {', '.join(METHODS)}")
    policies: list[str] = Field(default_factory=lambda: ["sre"], min_length=1, description="scoring policies of the lola method, one run each")
    window: Tokens = Field(60, description="window of the lola method")
    # 4 + 60 + 192 = 256 exact tokens: S-NIAH-1 at 2K went from 1/20 with a 64-token sparse
    # cache to 14/20 with 192 (`lola niah --methods lola --lengths 2048 --samples 20 --sparse-size S`).
    sparse_size: Tokens = Field(192, description="sparse cache of the lola method (per K/V head on average with budgets)")
    sinks: Tokens = Field(4, description="pinned first tokens")
    chunk: StrictInt = Field(64, ge=1, le=MAX_TOKENS, description="tokens between select-and-evict steps")
    # Training-free (untrained identity Hedgehog map), softmax_only recalled best: 3/4 at 1K
    # vs 0/4 with lola_authors (`lola niah --lengths 1024 --samples 4 --methods lola --mixing M`).
    # None: softmax_only, or with feature_maps lola.resolve's default (lola_authors for LoLA, the
    # trained rule for the hybrid).
    mixing: Literal["lolcats", "lola_authors", "softmax_only"] | None = Field(
        None, description="mixing rule of the lola method (none: softmax_only; with --feature-maps the paper's lola_authors, the trained rule for lolcats)"
    )
    feature_maps: str | None = Field(None, description="a `lola linearize` folder, or a shipped name, loaded into every method but full")
    gqa_storage: Literal["kv_head", "query_head"] = "kv_head"
    max_new_tokens: StrictInt | None = Field(
        None, ge=1, le=MAX_TOKENS, description="tokens generated per answer (none: 12 for number answers, 64 for uuids and vt)"
    )
    seed: Seed = Field(0, description="seed of the samples (needles, depths, haystacks)")
    haystack_file: str | None = Field(None, description="a text whose sentences replace the noise haystack (niah_single_1)")
    needle: str | None = Field(None, description="needle template with {key} and {value} (with --question)")
    question: str | None = Field(None, description="question template with {key} (with --needle)")
    answer_prefix: str | None = Field(None, description="with a custom question: text that starts the answer, with {key}")
    # Calibrated budgets won the tournament at the same bytes (prose 2K: 60% against 15% for
    # uniform, 20 samples; docs/results.md). "auto": the model's shipped budgets, else uniform.
    budgets: str | None = Field(
        "auto",
        description="sparse budgets of the lola method: auto (the model's shipped calibrated budgets where they apply, else uniform), uniform, a shipped name or a `lola calibrate` file",
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
            from lola.data import read_text_file

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

    @model_validator(mode="after")
    def _variants_need_lola(self) -> "NiahRun":
        # Variants are LoLA configs: without the lola method they would be dropped unread.
        if self.variants and "lola" not in self.methods:
            raise ValueError(f"variants ({', '.join(self.variants)}) run with the lola method only: add lola to methods {self.methods} or remove the variants")
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
        bad = [m for m in methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown methods {bad}; available: {', '.join(METHODS)}")
        return _distinct("methods", methods)

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, names: list[str]) -> list[str]:
        from lola import policies

        bad = [p for p in names if p not in policies.available()]
        if bad:
            raise ValueError(f"unknown policies {bad}; available: {', '.join(policies.available())}")
        return _distinct("policies", names)

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


def default_lola_config(model: str, trained_maps: bool = True) -> LoLAConfig:
    """The ``lola`` method as ``lola niah`` runs it by default for ``model``: :class:`NiahRun`'s
    window, sparse cache, sinks and chunk, the model's shipped budgets if it has any
    (``budgets="auto"``); with ``trained_maps`` (``--feature-maps``) the rule is left for
    :mod:`lola.resolve` (the paper's), without them it is ``softmax_only``."""
    d = {name: field.default for name, field in NiahRun.model_fields.items()}
    cfg = method_config("lola", window=d["window"], sparse_size=d["sparse_size"], sinks=d["sinks"], chunk=d["chunk"], trained_maps=trained_maps)
    return resolve_budgets(cfg, d["budgets"], model)


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
    it is loaded, the model's weights (``model``, :func:`lola.checksums.weights_digest`).
    Saved in ``results.json``; a resume on other content under the same path or name is refused."""
    from lola.checksums import content_digest
    from lola.pretrained.shipped import resolve_feature_maps

    inputs = {}
    if model is not None:
        from lola.checksums import weights_digest

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


def _policy_defaults(policy: str, run: NiahRun) -> dict[str, Any]:
    """Options a policy named in ``policies`` needs from the run: the ``learned`` policy gets the
    shipped scorer of the model (:func:`lola.scorers.default_scorer`)."""
    if policy != "learned":
        return {}
    from lola.scorers import default_scorer

    return {"policy_kwargs": {"scorer": default_scorer(run.model, run.feature_maps)}}


def method_configs(run: NiahRun) -> dict[str, LoLAConfig | None]:
    """``{method name: LoLA config}`` (``None`` = stock attention) for the run's methods, built by
    :func:`lola.methods.method_config`; ``lola`` is run once per policy (``lola-<policy>``) and
    once per variant (``lola-<name>``)."""
    # With trained feature maps an unset mixing rule is decided when they are loaded (lola.resolve).
    settings = dict(
        window=run.window, sparse_size=run.sparse_size, sinks=run.sinks, chunk=run.chunk, mixing=run.mixing, trained_maps=run.feature_maps is not None
    )
    common = {"gqa_storage": run.gqa_storage}
    out: dict[str, LoLAConfig | None] = {}
    for method in run.methods:
        if method != "lola":
            out[method] = method_config(method, **settings, overrides=common)
            continue
        for policy in run.policies:
            overrides = {**common, **_policy_defaults(policy, run)}
            out[f"lola-{policy}"] = resolve_budgets(method_config("lola", policy=policy, **settings, overrides=overrides), run.budgets, run.model)
        for name, fields in run.variants.items():
            fields = dict(fields)
            budgets = fields.pop("budgets", None)
            try:
                cfg = method_config("lola", **settings, overrides={**common, **fields})
            except ValidationError as err:
                raise ValueError(f"variant {name!r}: {validation_summary(err)}") from None
            except (ValueError, TypeError) as err:
                raise ValueError(f"variant {name!r}: {err}") from None
            try:
                out[f"lola-{name}"] = resolve_budgets(cfg, budgets, run.model)
            except ValidationError as err:
                raise ValueError(f"variants.{name}.budgets {budgets!r}: {validation_summary(err)}") from None
            except (ValueError, TypeError, OSError) as err:
                raise ValueError(f"variants.{name}.budgets {budgets!r}: {err}") from None
    return out


def wilson_interval(hits: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of an accuracy of ``hits`` out of ``n``, in percent."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
Count = Annotated[StrictInt, Field(ge=0)]
Rate = Annotated[StrictFloat, Field(ge=0)]


class SampleRecord(BaseModel):
    """One line of ``samples.jsonl``: the one check of every record a resume reads back.

    Types are strict (a score of ``"1"`` or ``true`` is not cast) and numbers finite and in
    range; with the run in the validation context (``{"run": NiahRun, "methods": names}``) the
    method must be one of the run's, the length one of its lengths and the index below its
    samples, so that a record of another run is never summarised as this one's.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    method: StrictStr
    length: StrictInt
    index: Count
    depth: Fraction
    score: Fraction
    cache_bytes: Count
    # Optional (older records lack them), checked when present: `lola niah` averages tokens_per_second.
    prompt_tokens: Count | None = None
    answers: list[StrictStr] | None = None
    prediction: StrictStr | None = None
    seconds: Rate | None = None
    tokens_per_second: Rate | None = None

    @model_validator(mode="after")
    def _of_this_run(self, info: ValidationInfo) -> "SampleRecord":
        context = info.context or {}
        run, methods = context.get("run"), context.get("methods")
        if methods is not None and self.method not in methods:
            raise ValueError(f"method {self.method!r} is not one of this run's ({', '.join(methods)})")
        if run is not None and self.length not in run.lengths:
            raise ValueError(f"length {self.length} is not one of this run's lengths {run.lengths}")
        if run is not None and self.index >= run.samples:
            raise ValueError(f"index {self.index} is beyond this run's {run.samples} samples per length")
        if run is not None and not math.isclose(self.depth, sample_depth(self.index, run.samples), rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(
                f"depth {self.depth} is not the depth of sample {self.index} of this run ({sample_depth(self.index, run.samples)} with {run.samples} samples)"
            )
        if self.prediction is not None and self.answers is not None:
            from lola.eval.niah import string_match_all

            if not self.answers:
                raise ValueError("answers is empty")
            expected = string_match_all(self.prediction, self.answers)
            if not math.isclose(self.score, expected, rel_tol=1e-9, abs_tol=1e-12):
                raise ValueError(f"score {self.score} is not what its prediction scores against its answers ({expected})")
        return self


def sample_depth(index: int, samples: int) -> float:
    """The needle depth of sample ``index`` of a run of ``samples`` per length: ``(index + 0.5) / samples``
    (:func:`niah_prompts`; a record at another depth is of another run)."""
    return (index + 0.5) / samples


def _load_done(path: Path, run: NiahRun | None = None) -> dict[tuple[str, int, int], dict]:
    """The finished samples in ``samples.jsonl``, each line checked by :class:`SampleRecord`
    (against ``run`` when given); a cut-short, foreign, out-of-range or repeated line is an
    error naming the file and the line."""
    from lola.errors import describe_validation
    from lola.outputs import _unique_keys

    done: dict[tuple[str, int, int], dict] = {}
    if not path.exists():
        return done
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a lola niah samples file: not UTF-8 text ({err.reason} at byte {err.start})") from None
    context = {"run": run, "methods": list(method_configs(run)) if run is not None else None}
    lines: dict[tuple[str, int, int], int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}: line {number} is not a complete JSON record ({err.msg}), e.g. a sample cut short by a crash; "
                "delete that line and run again to redo that sample"
            ) from None
        except ValueError as err:  # a key given twice: json would keep the last silently
            raise ValueError(f"{path}: line {number} is not a lola niah sample ({err}); delete that line to redo that sample") from None
        try:
            SampleRecord.model_validate(rec, context=context)
        except ValidationError as err:
            raise ValueError(
                f"{path}: line {number} is not a lola niah sample of this run ({describe_validation(err)}); delete that line to redo that sample"
            ) from None
        key = (rec["method"], rec["length"], rec["index"])
        if key in lines:  # two answers to one sample: neither can be trusted over the other
            raise ValueError(
                f"{path}: line {number} repeats sample {key[2]} of {key[0]} at length {key[1]} (first on line {lines[key]}); delete the line that is wrong"
            )
        lines[key] = number
        done[key] = rec
    return done


def _is_results(data: Any) -> bool:
    """Whether parsed JSON is a ``results.json`` of ``lola niah`` (its format marker, or the
    ``run`` + ``versions.lola`` of files written before the marker existed)."""
    if not isinstance(data, dict):
        return False
    if data.get("format") == RESULTS_FORMAT:
        return True
    return isinstance(data.get("run"), dict) and isinstance(data.get("versions"), dict) and "lola" in data["versions"]


def _run_changes(saved: NiahRun, run: NiahRun) -> str:
    """Every option in which ``run`` differs from the ``saved`` one, as ``--window: saved 60, now
    16`` (``variants``, which only a ``--config`` file sets, by its field name)."""
    from lola.errors import option_name

    changes = []
    for field in NiahRun.model_fields:
        before, now = getattr(saved, field), getattr(run, field)
        if before != now:
            name = "variants (--config)" if field == "variants" else option_name(field)
            changes.append(f"{name}: saved {before!r}, now {now!r}")
    return "; ".join(changes) or "the same options compare unequal"


PATH_OPTIONS = ("haystack_file", "feature_maps")
"""Options naming a file or folder: a saved run and a resume compare them by content."""


def _same_content_paths(saved: NiahRun, run: NiahRun, saved_inputs: Any, inputs: dict[str, str]) -> NiahRun:
    """``saved`` with each path option (:data:`PATH_OPTIONS`) that names the same content as
    ``run``'s under another path (``hay.txt`` and ``./hay.txt``, or a byte-identical copy) taken
    from ``run``: runs are compared by the content they read, not by its spelling."""
    if not isinstance(saved_inputs, dict):
        return saved
    same = {
        field: getattr(run, field)
        for field in PATH_OPTIONS
        if getattr(saved, field) is not None and getattr(run, field) is not None and field in inputs and saved_inputs.get(field) == inputs[field]
    }
    return saved.model_copy(update=same) if same else saved


def check_out_folder(out_dir: str | Path, run: NiahRun | None = None, model: Any = None) -> dict[tuple[str, int, int], dict]:
    """Check a results folder before any model work; returns the samples it already holds.

    Refused, with a message naming the file: a folder that cannot be written; a
    ``results.json`` that is truncated, garbled or not lola's (no ``format`` marker); result
    files (``samples.jsonl``, the plots) without lola's ``results.json``; a saved run other
    than ``run`` (naming each option that differs, saved and requested); a ``samples.jsonl``
    line that :class:`SampleRecord` refuses for ``run`` (cut short, foreign, out of range, of
    another method, length or index) or that repeats a sample; with ``model`` (once loaded), a
    saved run on other weights under the same ``--model`` name (:func:`run_inputs`).
    """
    from lola.checksums import changed_inputs
    from lola.outputs import check_output_folder, check_target, read_json

    out = check_output_folder(out_dir)
    for name in (RESULTS_FILE, SAMPLES_FILE, *PLOT_FILES):
        check_target(out / name, writer="lola niah")  # no links, no folders in a result file's place
    results = out / RESULTS_FILE
    if results.exists():
        if not results.is_file():
            raise ValueError(f"{results} is not a file")
        data = read_json(results, "a lola niah results file")
        if not _is_results(data):
            raise ValueError(f"{results} was not written by lola niah (no format marker {RESULTS_FORMAT!r}); move it away or use another --out")
        saved = data.get("run")
        if run is not None and saved is not None:
            try:
                saved_run = NiahRun(**saved)
            except (ValidationError, TypeError) as err:
                detail = validation_summary(err) if isinstance(err, ValidationError) else str(err)
                raise ValueError(f"{results} holds a run this version of lola refuses ({detail}); use another --out") from None
            inputs = run_inputs(run, model)
            saved_run = _same_content_paths(saved_run, run, data.get("inputs"), inputs)
            if saved_run != run:
                raise ValueError(f"{out} holds a different run ({_run_changes(saved_run, run)}); resume with the same options or use another --out")
            changed = changed_inputs(data.get("inputs"), inputs)
            if changed:
                option = "--" + changed[0].replace("_", "-") if "." not in changed[0] else changed[0]
                if changed[0] == "model":
                    raise ValueError(
                        f"{out} holds a run of other model weights: --model {run.model} now loads weights that differ from those the run started with; "
                        "use the same weights or another --out"
                    )
                raise ValueError(
                    f"{out} holds a run on other content: {option} changed since it started (same path, other content); restore it or use another --out"
                )
    else:
        foreign = [name for name in (SAMPLES_FILE, *PLOT_FILES) if (out / name).exists()]
        if foreign:
            raise ValueError(
                f"{out} holds {', '.join(foreign)} but no lola {RESULTS_FILE}: not a lola niah results folder; move them away or use another --out"
            )
    return _load_done(out / SAMPLES_FILE, run)


def _cache_bytes(cache: Any) -> int:
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


def niah_prompts(run: NiahRun, tokenizer: Any) -> dict[tuple[int, int], Any]:
    """Every prompt of ``run``: ``{(length, index): NiahSample}``, lengths outer, samples inner.

    Sample ``i`` of ``n`` sits at depth ``(i + 0.5) / n`` with seed ``seed · 100003 + i``, so the
    same options give the same prompts (``lola niah`` and the lm-eval export share this).
    """
    from lola.eval.niah import make_sample

    depths = [sample_depth(i, run.samples) for i in range(run.samples)]
    from lola.data import read_text_file

    haystack = read_text_file(run.haystack_file) if run.haystack_file else None
    return {
        (n, i): make_sample(
            tokenizer,
            run.task,
            n,
            d,
            seed=run.seed * 100_003 + i,
            max_new_tokens=run.new_tokens,
            haystack=haystack,
            needle=run.needle,
            question=run.question,
            answer_prefix=run.answer_prefix,
            haystack_name=f"--haystack-file {run.haystack_file}" if run.haystack_file else None,
        )
        for n in run.lengths
        for i, d in enumerate(depths)
    }


def run_niah(run: NiahRun, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool = True, batch_size: int = 1) -> list[dict]:
    """Run (or resume) ``run`` on ``model``; returns every sample's record.

    Records are appended to ``out_dir/samples.jsonl`` as they finish, so an interrupted run
    continues where it stopped when called again with the same ``out_dir``;
    ``out_dir/results.json`` holds the run, versions and the summary.

    Args:
        batch_size: samples of one length generated together as one left-padded batch
            (greedy decoding; each row's answer is the same as alone, up to float rounding).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    from tqdm.auto import tqdm

    out = Path(out_dir)
    done = check_out_folder(out, run, model)  # before anything is written (and on the weights now loaded)
    inputs = run_inputs(run, model)
    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if max_positions and max(run.lengths) > max_positions:
        raise ValueError(f"length {max(run.lengths)} exceeds what the model can hold ({max_positions} positions)")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = getattr(tokenizer, "eos_token_id", None) if pad_id is None else pad_id
    if batch_size > 1 and pad_id is None:
        raise ValueError("batch_size > 1 needs a tokenizer with a pad or eos token id")
    maps = None
    if run.feature_maps is not None:  # read and checked once, before any generation
        from lola.pretrained.folder import check_geometry, read_feature_maps

        maps = read_feature_maps(run.feature_maps)
        check_geometry(maps, model)
    check_budgets(run, model)
    configs = method_configs(run)
    # What each method really runs: trained maps fill in the fields a config leaves unset.
    effective = {m: c if c is None or maps is None else maps.merge_into(c) for m, c in configs.items()}
    prompts = niah_prompts(run, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    records = list(done.values())
    _write_results(results_path, run, records, effective, inputs)  # claims the folder; a resume keeps its summary
    samples_path = out / SAMPLES_FILE
    todo = [(m, n, i) for m in configs for n in run.lengths for i in range(run.samples) if (m, n, i) not in done]
    bar = tqdm(total=len(configs) * len(prompts), initial=len(configs) * len(prompts) - len(todo), desc="niah", disable=not progress)
    try:
        _generate_all(run, model, tokenizer, configs, todo, prompts, samples_path, records, bar, batch_size, pad_id, maps)
    except BaseException:  # interrupted or failed: results.json still summarises every saved sample
        bar.close()
        try:
            _write_results(results_path, run, records, effective, inputs)
        except Exception:  # noqa: S110 - the original error is the one to report
            pass
        raise
    bar.close()
    _write_results(results_path, run, records, effective, inputs)
    plot_results(records, out)
    return records


def _generate_all(
    run: NiahRun,
    model: Any,
    tokenizer: Any,
    configs: dict,
    todo: list,
    prompts: dict,
    samples_path: Path,
    records: list,
    bar: Any,
    batch_size: int,
    pad_id: int | None,
    maps: Any = None,
) -> None:
    """Generate every sample of ``todo``, appending each record to ``samples_path`` and ``records``
    (``maps``: the run's feature maps, already read)."""
    from transformers import DynamicCache

    from lola.eval.niah import string_match_all
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
    from lola.outputs import check_target, write_files

    samples_path = Path(samples_path)
    check_target(samples_path, writer="lola niah")  # appended to: never through a link
    if samples_path.exists() and samples_path.stat().st_nlink > 1:
        # A hard link (`cp -al` snapshot): appending would write into every copy. Rewritten
        # atomically first, the file becomes this folder's own.
        write_files(samples_path.parent, {samples_path.name: samples_path.read_bytes()}, writer="lola niah")
    with open(samples_path, "a") as log:
        for method, cfg in configs.items():
            mine = [(n, i) for (m, n, i) in todo if m == method]
            if not mine:
                continue
            if cfg is not None:
                apply_lola(model, cfg, feature_maps=maps)
            try:
                for batch in _batches(mine, batch_size):
                    samples = [prompts[key] for key in batch]
                    ids, mask, width = _left_pad([s.input_ids[0] for s in samples], pad_id)
                    cache = DynamicCache() if cfg is None else LoLACache(model)
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        out_ids = model.generate(ids, attention_mask=mask, max_new_tokens=run.new_tokens, do_sample=False, cache=cache, pad_token_id=pad_id)
                    seconds = (time.perf_counter() - t0) / len(batch)
                    cache_bytes = _cache_bytes(cache)
                    for row, ((n, i), s) in enumerate(zip(batch, samples)):
                        prediction = tokenizer.decode(out_ids[row, width:], skip_special_tokens=True)
                        tokens = s.length + out_ids.shape[1] - width
                        # A stock cache holds every row padded to the longest: count this row's share.
                        share = 1 / len(batch) if cfg is not None else tokens / (len(batch) * out_ids.shape[1])
                        rec = {
                            "method": method,
                            "length": n,
                            "index": i,
                            "depth": s.depth,
                            "prompt_tokens": s.length,
                            "answers": s.answers,
                            "prediction": prediction,
                            "score": string_match_all(prediction, s.answers),
                            "cache_bytes": round(cache_bytes * share),
                            "seconds": seconds,
                            "tokens_per_second": tokens / seconds,
                        }
                        log.write(json.dumps(rec) + "\n")
                        log.flush()
                        records.append(rec)
                        bar.update(1)
            finally:
                if cfg is not None:
                    remove_lola(model)


def _batches(items: list[tuple[int, int]], size: int) -> list[list[tuple[int, int]]]:
    """Consecutive groups of at most ``size`` samples, never mixing lengths."""
    out: list[list[tuple[int, int]]] = []
    for item in items:
        if out and len(out[-1]) < size and out[-1][0][0] == item[0]:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _left_pad(rows: list[torch.Tensor], pad_id: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``[B, T]`` left-padded ids, the ``[B, T]`` attention mask and ``T``."""
    width = max(r.shape[0] for r in rows)
    ids = torch.full((len(rows), width), 0 if pad_id is None else pad_id, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[0] :] = r
        mask[i, width - r.shape[0] :] = 1
    return ids, mask, width


def summarize(records: Iterable[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """``{method: {length: {"accuracy": %, "low": %, "high": %, "cache_bytes": mean, "samples": n}}}``
    (``low``–``high``: the 95% Wilson interval of the accuracy)."""
    table: dict[str, dict[int, list[dict]]] = {}
    for r in records:
        table.setdefault(r["method"], {}).setdefault(r["length"], []).append(r)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for m, by in table.items():
        out[m] = {}
        for n, rs in sorted(by.items()):
            hits = sum(r["score"] for r in rs)
            low, high = wilson_interval(hits, len(rs))
            out[m][n] = {
                "accuracy": 100.0 * hits / len(rs),
                "low": low,
                "high": high,
                "cache_bytes": sum(r["cache_bytes"] for r in rs) / len(rs),
                "samples": len(rs),
            }
    return out


def summarize_by_depth(records: Iterable[dict], buckets: int = 5) -> dict[str, dict[str, float]]:
    """``{method: {"0.0-0.2": accuracy %, …}}`` over all lengths, by needle depth."""
    table: dict[str, dict[int, list[float]]] = {}
    for r in records:
        b = min(int(r["depth"] * buckets), buckets - 1)
        table.setdefault(r["method"], {}).setdefault(b, []).append(r["score"])
    return {m: {f"{b / buckets:.1f}-{(b + 1) / buckets:.1f}": 100.0 * sum(v) / len(v) for b, v in sorted(by.items())} for m, by in table.items()}


def format_depth_summary(by_depth: dict[str, dict[str, float]]) -> str:
    """Accuracy per method × depth bucket as a plain-text table."""
    cols = sorted({c for by in by_depth.values() for c in by})
    head = f"{'method':<16}" + "".join(f"{c:>10}" for c in cols)
    lines = [head, "-" * len(head)]
    for m, by in by_depth.items():
        lines.append(f"{m:<16}" + "".join(f"{by[c]:>9.1f}%" if c in by else f"{'':>10}" for c in cols))
    return "\n".join(lines)


def plot_results(records: list[dict], out_dir: str | Path) -> list[Path]:
    """Write ``accuracy.png`` (accuracy vs length) and ``cache_bytes.png`` (cache MiB vs length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lola.outputs import write_files

    summary = summarize(records)
    paths = []
    for name, key, ylabel, scale in (("accuracy.png", "accuracy", "accuracy (%)", 1.0), ("cache_bytes.png", "cache_bytes", "cache (MiB)", 2.0**-20)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for method, by in summary.items():
            lengths = sorted(by)
            ys = [by[n][key] * scale for n in lengths]
            if key == "accuracy":  # 95% Wilson intervals
                err = [[y - by[n]["low"] for y, n in zip(ys, lengths)], [by[n]["high"] - y for y, n in zip(ys, lengths)]]
                ax.errorbar(lengths, ys, yerr=err, marker="o", capsize=3, label=method)
            else:
                ax.plot(lengths, ys, marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        (path,) = write_files(out_dir, {name: lambda p, fig=fig: fig.savefig(p, dpi=120, format="png")}, writer="lola niah")
        plt.close(fig)
        paths.append(path)
    return paths


def _table(summary: dict[str, dict[int, dict[str, float]]], cell: Any, width: int) -> str:
    lengths = sorted({n for by in summary.values() for n in by})
    head = f"{'method':<16}" + "".join(f"{n:>{width}}" for n in lengths)
    lines = [head, "-" * len(head)]
    for m, by in summary.items():
        lines.append(f"{m:<16}" + "".join(cell(by[n]) if n in by else " " * width for n in lengths))
    return "\n".join(lines)


def format_summary(summary: dict[str, dict[int, dict[str, float]]]) -> str:
    """Accuracy (and cache MiB) per method × length as a plain-text table."""
    return _table(summary, lambda c: f"{c['accuracy']:>7.1f}% {c['cache_bytes'] / 2**20:>6.1f}MiB", 16)


def format_intervals(summary: dict[str, dict[int, dict[str, float]]]) -> str:
    """Accuracy with its 95% Wilson interval and the sample count, per method × length."""
    return _table(summary, lambda c: f"{c['accuracy']:>6.1f}% [{c['low']:>3.0f}-{c['high']:>3.0f}] n={c['samples']:<3}", 22)


def _write_results(path: Path, run: NiahRun, records: list[dict], configs: dict, inputs: dict[str, str]) -> None:
    import transformers

    import lola

    payload = {
        "format": RESULTS_FORMAT,
        "run": run.model_dump(),
        "inputs": inputs,
        "versions": {"lola": lola.__version__, "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
        "methods": {m: (None if c is None else c.model_dump(mode="json")) for m, c in configs.items()},
        "summary": {m: {str(n): v for n, v in by.items()} for m, by in summarize(records).items()},
        "summary_by_depth": summarize_by_depth(records),
    }
    from lola.outputs import write_files

    write_files(path.parent, {path.name: json.dumps(payload, indent=2)}, ours=_our_results, writer="lola niah")


def _our_results(path: Path) -> bool:
    """Whether the file at ``path`` is a ``results.json`` of ``lola niah`` (one put in its place
    while a run generates is not replaced)."""
    from lola.outputs import read_json

    try:
        return _is_results(read_json(path, "a lola niah results file"))
    except (ValueError, OSError):
        return False
