"""The records of a needle-in-a-haystack run on disk: one JSON line per sample, ``results.json``, and the checks a resume makes."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, ValidationInfo, field_validator, model_validator

from lola.config import LoLAConfig, validation_summary
from lola.eval.niah_report import summarize, summarize_by_depth
from lola.eval.niah_spec import NiahRun, method_configs, run_inputs
from lola.io.provenance import versions
from lola.io.records import complete_lines, read_checked_records, read_record_file
from lola.methods import method_name

RESULTS_FORMAT = "lola-niah-results"
"""The ``format`` marker of ``results.json``: a results folder without it is not lola's."""
RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILES = ("accuracy.png", "cache_bytes.png")


Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
Count = Annotated[StrictInt, Field(ge=0)]
Rate = Annotated[StrictFloat, Field(ge=0)]


def check_of_run(context: dict, method: str, length: int, index: int) -> None:
    """Refuse a record (``niah``'s or ``probe``'s) of a method, length or index the run in
    ``context`` (``run``, ``methods``: what a record is validated with) does not have."""
    run, methods = context.get("run"), context.get("methods")
    if methods is not None and method not in methods:
        raise ValueError(f"method {method!r} is not one of this run's ({', '.join(methods)})")
    if run is not None and length not in run.lengths:
        raise ValueError(f"length {length} is not one of this run's lengths {run.lengths}")
    if run is not None and index >= run.samples:
        raise ValueError(f"index {index} is beyond this run's {run.samples} samples per length")


class SampleRecord(BaseModel):
    """One line of ``samples.jsonl``: the one check of every record a resume reads back.

    Types are strict (a score of ``"1"`` or ``true`` is not cast) and numbers finite and in
    range; with the run in the validation context (``{"run": NiahRun, "methods": names}``) the
    method must be one of the run's, the length one of its lengths and the index below its
    samples, so that a record of another run is never summarised as this one's. The score is
    recomputed from the prediction and the answers (an edited score is refused). With this run's
    prompts in the context too (``"prompts"``: :func:`~lola.eval.niah_execution.niah_prompts`) the
    record is bound to the prompt the run builds for its (length, index): its answers, prompt
    length and depth must be that prompt's, which refuses a record of another seed, haystack or
    needle. Every field a run writes is required (a record stripped of its prediction and
    answers cannot show its score).
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    method: StrictStr
    length: StrictInt
    index: Count
    depth: Fraction
    score: Fraction
    cache_bytes: Count
    # Required: they bind the record to its prompt and prove its score.
    prompt_tokens: Count
    answers: list[StrictStr]
    prediction: StrictStr
    # Optional, checked when present: `lola niah` averages tokens_per_second.
    seconds: Rate | None = None
    tokens_per_second: Rate | None = None

    @field_validator("method", mode="before")
    @classmethod
    def _todays_name(cls, method: object) -> object:
        # records written before a method was renamed resume under its name today
        return method_name(method, warn=False) if isinstance(method, str) else method

    @model_validator(mode="after")
    def _of_this_run(self, info: ValidationInfo) -> "SampleRecord":
        context = info.context or {}
        run = context.get("run")
        check_of_run(context, self.method, self.length, self.index)
        if run is not None and not math.isclose(self.depth, sample_depth(self.index, run.samples), rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(
                f"depth {self.depth} is not the depth of sample {self.index} of this run ({sample_depth(self.index, run.samples)} with {run.samples} samples)"
            )
        check_score(self.score, self.prediction, self.answers)
        check_prompt(context.get("prompts"), self.length, self.index, self.answers, self.prompt_tokens, self.depth)
        return self


def check_score(score: float, prediction: str, answers: list[str]) -> None:
    """Refuse (``ValueError``) a recorded ``score`` other than what ``prediction`` scores against
    ``answers`` with the run's scoring (:func:`lola.eval.niah.string_match_all`): an edited record."""
    from lola.eval.niah import string_match_all

    if not answers:
        raise ValueError("answers is empty")
    expected = string_match_all(prediction, answers)
    if not math.isclose(score, expected, rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(f"score {score} is not what its prediction scores against its answers ({expected})")


def check_prompt(prompts: dict | None, length: int, index: int, answers: list[str], prompt_tokens: int | None, depth: float) -> None:
    """Refuse (``ValueError``) a record whose answers, prompt length (when recorded) or depth are
    not those of the prompt this run builds for ``(length, index)`` (``prompts``:
    :func:`~lola.eval.niah_execution.niah_prompts`; nothing is checked without them): a record of
    another seed, haystack or needle."""
    if prompts is None:
        return
    sample = prompts.get((length, index))
    if sample is None:
        raise ValueError(f"sample {index} at length {length} is not one of this run's prompts")
    where = f"this run's sample {index} at length {length}"
    if list(answers) != list(sample.answers):
        raise ValueError(f"answers {answers} are not those of {where} ({sample.answers}): a record of another seed, needle or task")
    if prompt_tokens is not None and prompt_tokens != sample.length:
        raise ValueError(f"prompt_tokens {prompt_tokens} is not the length of {where}'s prompt ({sample.length} tokens): a record of another prompt")
    if not math.isclose(depth, sample.depth, rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(f"depth {depth} is not the depth of {where} ({sample.depth})")


def sample_depth(index: int, samples: int) -> float:
    """The needle depth of sample ``index`` of a run of ``samples`` per length: ``(index + 0.5) / samples``
    (:func:`niah_prompts`; a record at another depth is of another run)."""
    return (index + 0.5) / samples


def _load_done(path: Path, run: NiahRun | None = None, prompts: dict | None = None) -> dict[tuple[str, int, int], dict]:
    """The finished samples in ``samples.jsonl``, each line checked by :class:`SampleRecord`
    (against ``run`` and its ``prompts`` when given); a cut-short last line is dropped, a
    foreign, out-of-range, edited or repeated line is an error naming the file and the line
    (:func:`lola.io.records.read_checked_records`)."""
    context = {"run": run, "methods": list(method_configs(run)) if run is not None else None, "prompts": prompts}
    return read_checked_records(path, SampleRecord, context, writer="lola niah", what="lola niah sample", hint="use another --out")


def _is_results(data: Any) -> bool:
    """Whether parsed JSON is a ``results.json`` of ``lola niah`` (its format marker, or the
    ``run`` + ``versions.lola`` of files written before the marker existed)."""
    if not isinstance(data, dict):
        return False
    if data.get("format") == RESULTS_FORMAT:
        return True
    return isinstance(data.get("run"), dict) and isinstance(data.get("versions"), dict) and "lola" in data["versions"]


def as_it_ran(saved: Any) -> Any:
    """A saved run's options (``results.json``'s or ``probe.json``'s ``run``) with the defaults of
    the version that wrote them made explicit where today's differ: a run on maps saved before
    ``prefill_chunk`` existed stepped every chunk in its prefill (today's default on maps is
    :data:`~lola.eval.niah_spec.PREFILL_CHUNK`), so a resume under the default is refused
    naming ``--prefill-chunk`` instead of mixing the two."""
    if isinstance(saved, dict) and "prefill_chunk" not in saved and saved.get("feature_maps") is not None:
        return {**saved, "prefill_chunk": saved.get("chunk", NiahRun.model_fields["chunk"].default)}
    return saved


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


def check_out_folder(out_dir: str | Path, run: NiahRun | None = None, model: Any = None, prompts: dict | None = None) -> dict[tuple[str, int, int], dict]:
    """Check a results folder before any model work; returns the samples it already holds.

    Refused, with a message naming the file: a folder that cannot be written; a
    ``results.json`` that is truncated, garbled or not lola's (no ``format`` marker); result
    files (``samples.jsonl``, the plots) without lola's ``results.json``; a saved run other
    than ``run`` (naming each option that differs, saved and requested); a ``samples.jsonl``
    line that :class:`SampleRecord` refuses for ``run`` (cut short, foreign, out of range, of
    another method, length or index) or that repeats a sample; with ``model`` (once loaded), a
    saved run on other weights under the same ``--model`` name (:func:`run_inputs`); a
    ``results.json`` that records no fingerprint of an input this run reads while samples exist
    (it cannot show they were made on the same content); with ``prompts`` (this run's,
    :func:`~lola.eval.niah_execution.niah_prompts`), a record of another prompt
    (:func:`check_prompt`).
    """
    from lola.io.checksums import changed_inputs
    from lola.io.outputs import check_output_folder, check_target, read_json

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
            inputs = run_inputs(run, model)
            # Inputs are recorded by content: a saved path that names what this run reads (the
            # folder moved, another working folder, a relative path) is this run's path.
            saved_inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
            if isinstance(saved, dict):
                saved = {
                    **saved,
                    **{
                        f: getattr(run, f)
                        for f in PATH_OPTIONS
                        if saved.get(f) is not None and getattr(run, f) is not None and f in inputs and saved_inputs.get(f) == inputs[f]
                    },
                }
            saved = as_it_ran(saved)
            try:
                with warnings.catch_warnings():  # a method renamed since the run started: no warning for the file
                    warnings.simplefilter("ignore", FutureWarning)
                    saved_run = NiahRun(**saved)
            except (ValidationError, TypeError) as err:
                detail = validation_summary(err) if isinstance(err, ValidationError) else str(err)
                raise ValueError(f"{results} holds a run this version of lola refuses ({detail}); use another --out") from None
            saved_run = _same_content_paths(saved_run, run, data.get("inputs"), inputs)
            if saved_run != run:
                raise ValueError(f"{out} holds a different run ({_run_changes(saved_run, run)}); resume with the same options or use another --out")
            unproven = [k for k in inputs if k not in saved_inputs]
            if unproven and _has_records(out / SAMPLES_FILE):
                named = ", ".join(k if k == "model" or "." in k else "--" + k.replace("_", "-") for k in unproven)
                raise ValueError(
                    f"{results} records no fingerprint of {named} (its inputs were removed or never saved), so the samples in {SAMPLES_FILE} "
                    f"cannot be shown to be of what this run reads; remove {SAMPLES_FILE} to redo them, or use another --out"
                )
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
    return _load_done(out / SAMPLES_FILE, run, prompts)


def check_saved_configs(out_dir: str | Path, configs: dict[str, Any]) -> None:
    """Refuse to resume a run whose methods would now run other configs than the saved records'
    (``results.json``'s ``methods``): the same options may resolve to other configs when lola's
    defaults change between the start and the resume (a default schedule, a shipped default), and
    the new samples would be of another method under the same name.

    Args:
        configs: ``{method: LoLAConfig or None}`` as this run would run them (resolved).

    Raises:
        ValueError: naming the method and each field that differs, saved and now.
    """
    from lola.io.outputs import read_json

    out = Path(out_dir)
    results = out / RESULTS_FILE
    if not results.is_file() or not _has_records(out / SAMPLES_FILE):
        return
    saved = read_json(results, "a lola niah results file").get("methods")
    if not isinstance(saved, dict):
        return  # a results file of a version that recorded no configs: the run itself was compared
    for method, config in configs.items():
        if method not in saved:
            continue
        now = None if config is None else config.model_dump(mode="json")
        before = _with_new_fields(saved[method], now)
        if before == now:
            continue
        if isinstance(before, dict) and isinstance(now, dict):
            fields = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
            detail = "; ".join(f"{k}: saved {before.get(k)!r}, now {now.get(k)!r}" for k in fields)
        else:
            detail = f"saved {before!r}, now {now!r}"
        raise ValueError(
            f"{out} holds samples of {method} run with another config than the same options give now ({detail}): "
            "lola's defaults changed since the run started; use another --out (or the version it started with)"
        )


def _with_new_fields(before: Any, now: dict | None) -> Any:
    """A saved config with the fields added to :class:`~lola.LoLAConfig` since it was saved
    set to their defaults (what that version ran): a new field left at its default is the
    same config."""
    if not isinstance(before, dict) or not isinstance(now, dict):
        return before
    added = {k: LoLAConfig.model_fields[k].get_default(call_default_factory=True) for k in now.keys() - before.keys() if k in LoLAConfig.model_fields}
    return {**before, **{k: v for k, v in added.items() if v == now[k]}}


def _has_records(path: Path) -> bool:
    """Whether the record file ``path`` holds at least one complete line (a plain file only)."""
    data = read_record_file(path, "lola niah")
    return bool(data) and any(line.strip() for line in complete_lines(data.decode("utf-8", "replace")))


def _write_results(path: Path, run: NiahRun, records: list[dict], configs: dict, inputs: dict[str, str]) -> None:
    payload = {
        "format": RESULTS_FORMAT,
        "run": run.model_dump(),
        "inputs": inputs,
        "versions": versions(),
        "methods": {m: (None if c is None else c.model_dump(mode="json")) for m, c in configs.items()},
        "summary": {m: {str(n): v for n, v in by.items()} for m, by in summarize(records).items()},
        "summary_by_depth": summarize_by_depth(records),
    }
    from lola.io.outputs import write_files

    write_files(path.parent, {path.name: json.dumps(payload, indent=2)}, ours=_our_results, writer="lola niah")


def _our_results(path: Path) -> bool:
    """Whether the file at ``path`` is a ``results.json`` of ``lola niah`` (one put in its place
    while a run generates is not replaced)."""
    from lola.io.outputs import read_json

    try:
        return _is_results(read_json(path, "a lola niah results file"))
    except (ValueError, OSError):
        return False
