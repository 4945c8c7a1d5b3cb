"""Where each LoLA layer's output comes from as the context grows: a diagnostic for long prompts.

For every prompt of a needle-in-a-haystack run (:class:`~lola.eval.niah_spec.NiahRun`: the same
prompts as ``lola niah``), at every length and for every method with a LoLA config, one greedy
answer is generated while each layer's prefill is observed (:func:`lola.layer.observe_calls`)
at the *answer position*, the prompt's last token, whose output predicts the answer's first
token. Per layer and head it records:

- ``share``: the linear state's share ``α`` of the output (:func:`lola.core.linear_share`);
- ``log_exact`` and ``log_linear``: the natural logs of the two masses the mixing rule adds in
  its denominator (``lola_authors``: ``w·Σ_E e^{s}`` and ``(1 − w)·φ(q)ᵀs``,
  :meth:`lola.layer.ObservedCall.log_masses`): whether the state's mass grows with the folded
  tokens while the exact part's does not;
- ``held`` (per storage head): whether every token of the needle's value is among the head's
  exact tokens when the answer starts, which tells a needle that eviction lost from one that
  the state swamped.

Records go to ``probe.jsonl`` one per (method, length, sample) as they finish (a rerun resumes,
each record read back checked by :class:`ProbeRecord` against the run and its prompts), the
per-layer means to ``probe.json`` (with the run and the fingerprints of its inputs), and
``probe.png`` plots them.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lola.eval.niah_spec import NiahRun, check_budgets, method_configs, run_inputs
from lola.io.provenance import versions
from lola.io.records import append_record, drop_cut_record, open_record_file, read_checked_records, read_record_file
from lola.methods import method_name

__all__ = ["PROBE_FILE", "RECORDS_FILE", "format_probe", "needle_positions", "probe_prompt", "run_probe", "summarize_probe"]

RECORDS_FILE = "probe.jsonl"
PROBE_FILE = "probe.json"
PLOT_FILE = "probe.png"
PROBE_FORMAT = "lola-state-probe"


def needle_positions(tokenizer: Any, ids: torch.Tensor, value: str) -> list[int]:
    """Token indices of ``ids [T]`` that overlap the first occurrence of ``value`` in their text.

    Each token is decoded alone and the pieces are laid end to end (exact for the ASCII text
    of the haystacks); ``[]`` when ``value`` does not occur.
    """
    pieces = [tokenizer.decode([int(t)]) for t in ids.tolist()]
    text = "".join(pieces)
    start = text.find(value)
    if start < 0:
        return []
    end, out, at = start + len(value), [], 0
    for i, piece in enumerate(pieces):
        if at < end and at + len(piece) > start:
            out.append(i)
        at += len(piece)
    return out


def _held(state: Any, positions: list[int]) -> list[bool]:
    """Per storage head of row 0: every position of ``positions`` is among its exact tokens."""
    held = torch.cat([m.block.pos for m in state.exact_memories if m.capacity], dim=-1)[0]  # [Hs, N]
    if not positions:
        return [False] * held.shape[0]
    want = torch.tensor(positions, device=held.device)
    return (held[:, :, None] == want).any(1).all(-1).tolist()


def probe_prompt(model: Any, tokenizer: Any, ids: torch.Tensor, value: str, new_tokens: int) -> dict[str, Any]:
    """Generate a greedy answer to ``ids [1, T]`` on a model with LoLA applied, observing the
    prefill of every LoLA layer at the last prompt token.

    Returns:
        ``{"prediction", "needle_tokens", "layers": {layer: {"share": [H], "log_exact": [H],
        "log_linear": [H], "held": [Hs]}}}`` (``-inf`` masses are written as ``None``).
    """
    from lola.integrations.transformers import LoLACache
    from lola.layer import observe_calls

    index = {id(module): i for i, module in model._lola.modules.items()}
    positions = needle_positions(tokenizer, ids[0], value)
    layers: dict[int, dict[str, list]] = {}

    def record(call: Any) -> None:
        i = index.get(id(call.layer))
        if i is None or i in layers or call.valid.shape[1] < 2:  # the prefill only
            return
        last = int(call.valid[0].nonzero().max())
        log_exact, log_linear = call.log_masses()

        def finite(x: torch.Tensor) -> list:
            return [v if math.isfinite(v) else None for v in x[0, :, last].tolist()]

        layers[i] = {
            "share": call.share()[0, :, last].tolist(),
            "log_exact": finite(log_exact),
            "log_linear": finite(log_linear),
            "held": _held(call.state, positions),
        }

    with torch.no_grad(), observe_calls(record):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False, cache=LoLACache(model))
    prediction = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    return {"prediction": prediction, "needle_tokens": len(positions), "layers": {str(i): layers[i] for i in sorted(layers)}}


class ProbeLayer(BaseModel):
    """What one layer of a probe record holds (:func:`probe_prompt`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    share: list[StrictFloat]
    log_exact: list[StrictFloat | None]
    log_linear: list[StrictFloat | None]
    held: list[StrictBool]


class ProbeRecord(BaseModel):
    """One line of ``probe.jsonl``: the check of every record a resume reads back.

    Strict types, every field a run writes required, the score in [0, 1] and recomputed from
    the prediction against the answers; with the run in the validation context (``{"run":
    NiahRun, "methods": probed names, "prompts": niah_prompts(...)}``) the method must be one the
    run probes, the length one of its lengths, the index below its samples, and the record bound
    to the prompt the run builds for its (length, index) (:func:`lola.eval.niah_records.check_prompt`:
    its answers, prompt length and depth), so that a record of another run, seed or haystack, or
    an edited one, is never summarised as this run's.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    method: StrictStr
    length: StrictInt
    index: Annotated[StrictInt, Field(ge=0)]
    depth: Annotated[StrictFloat, Field(ge=0, le=1)]
    score: Annotated[StrictFloat, Field(ge=0, le=1)]
    prompt_tokens: Annotated[StrictInt, Field(ge=0)]
    answers: list[StrictStr]
    prediction: StrictStr
    needle_tokens: Annotated[StrictInt, Field(ge=0)]
    layers: dict[StrictStr, ProbeLayer]

    @field_validator("method", mode="before")
    @classmethod
    def _todays_name(cls, method: object) -> object:
        return method_name(method, warn=False) if isinstance(method, str) else method

    @field_validator("layers")
    @classmethod
    def _layer_numbers(cls, layers: dict[str, ProbeLayer]) -> dict[str, ProbeLayer]:
        for key, layer in layers.items():
            if not key.isdigit():
                raise ValueError(f"layer {key!r} is not a layer number")
            if len(layer.share) != len(layer.log_exact) or len(layer.share) != len(layer.log_linear):
                raise ValueError(f"layer {key} gives share, log_exact and log_linear for different numbers of heads")
        return layers

    @model_validator(mode="after")
    def _of_this_run(self, info: ValidationInfo) -> "ProbeRecord":
        from lola.eval.niah_records import check_of_run, check_prompt, check_score

        context = info.context or {}
        check_of_run(context, self.method, self.length, self.index)
        check_score(self.score, self.prediction, self.answers)
        check_prompt(context.get("prompts"), self.length, self.index, self.answers, self.prompt_tokens, self.depth)
        return self


def _read_records(path: Path, run: NiahRun | None = None, methods: list[str] | None = None, prompts: dict | None = None) -> dict[tuple[str, int, int], dict]:
    """The finished records of ``path`` by ``(method, length, index)``, each checked by
    :class:`ProbeRecord` against ``run``, its probed ``methods`` and its ``prompts`` when given
    (:func:`lola.io.records.read_checked_records`: a cut-short last line is dropped, any other bad
    line is an error naming the file and the line)."""
    context = {"run": run, "methods": methods, "prompts": prompts}
    return read_checked_records(path, ProbeRecord, context, writer="lola probe", what="probe record", hint="choose another --out")


def _run_differences(saved: object, run: NiahRun) -> str | None:
    """``None`` when ``saved`` (a probe file's ``run``) is ``run`` (methods renamed since read by
    today's names); otherwise every option that differs with both values (as ``lola niah`` names
    them, :func:`lola.eval.niah_records._run_changes`)."""
    from lola.config import validation_summary
    from lola.eval.niah_records import _run_changes, as_it_ran

    if not isinstance(saved, dict):
        return "no run recorded"
    saved = as_it_ran(saved)
    if saved == json.loads(run.model_dump_json()):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            saved_run = NiahRun(**saved)
    except (ValidationError, TypeError) as err:
        detail = validation_summary(err) if isinstance(err, ValidationError) else str(err)
        return f"a run this version of lola refuses: {detail}"
    return None if saved_run == run else _run_changes(saved_run, run)


def _check_claim(out: Path, run: NiahRun, inputs: dict[str, str]) -> None:
    """Refuse a folder that holds another run's probe (naming each option that differs, or the
    input whose content changed), or records whose run or inputs no probe file names."""
    from lola.io.checksums import changed_inputs
    from lola.io.figures import check_figures
    from lola.io.outputs import read_json

    check_figures(out, [PLOT_FILE], PROBE_FILE, "lola probe")  # someone's probe.png: refused before any work

    path = out / PROBE_FILE
    records = out / RECORDS_FILE
    if path.is_file():
        saved = read_json(path, "a lola probe file")
        if not isinstance(saved, dict) or saved.get("format") != PROBE_FORMAT:
            raise ValueError(f"{path} is not a lola probe file; choose another --out")
        differences = _run_differences(saved.get("run"), run)
        if differences is not None:
            raise ValueError(f"{out} holds a probe of other options ({differences}); rerun with the same options to resume, or choose another --out")
        saved_inputs = saved.get("inputs")
        has_records = bool((read_record_file(records, "lola probe") or b"").strip())
        unproven = [k for k in inputs if not isinstance(saved_inputs, dict) or k not in saved_inputs]
        if unproven and has_records:
            named = ", ".join(k if k == "model" or "." in k else "--" + k.replace("_", "-") for k in unproven)
            raise ValueError(
                f"{path} records no fingerprint of {named}, so the records in {RECORDS_FILE} cannot be shown to be of what this run reads; "
                f"remove {RECORDS_FILE} to redo them, or choose another --out"
            )
        changed = changed_inputs(saved_inputs, inputs)
        if changed:
            name = changed[0] if changed[0] == "model" or "." in changed[0] else "--" + changed[0].replace("_", "-")
            raise ValueError(f"{out} holds a probe on other content: {name} changed since it started; restore it or choose another --out")
    elif os.path.lexists(records):
        # Records with no probe.json naming their run: another run's, or written by hand, would
        # be reported as this run's.
        raise ValueError(f"{records} has no {PROBE_FILE} beside it naming the run it belongs to: move it away or choose another --out")


def _write_probe(out: Path, run: NiahRun, inputs: dict[str, str], records: list[dict]) -> dict:
    """Write ``probe.json`` (the run, its inputs' fingerprints, versions, the summary of ``records``); returns the summary."""
    from lola.io.outputs import write_files

    summary = summarize_probe(records)
    body = json.dumps(
        {"format": PROBE_FORMAT, "run": json.loads(run.model_dump_json()), "inputs": inputs, "versions": versions(), "summary": summary}, indent=1
    )
    write_files(out, {PROBE_FILE: body + "\n"}, writer="lola probe")
    return summary


def run_probe(run: NiahRun, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool = True) -> list[dict]:
    """Probe every LoLA method of ``run`` (``full`` and ``window`` have no state and are skipped)
    on its prompts; resumes from ``out_dir/probe.jsonl``. Returns every record. One run per
    folder (:func:`lola.io.outputs.run_lock`)."""
    from lola.io.outputs import run_lock

    with run_lock(out_dir, "lola probe"):
        return _run_probe(run, model, tokenizer, out_dir, progress)


def _run_probe(run: NiahRun, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool) -> list[dict]:
    from tqdm.auto import tqdm

    from lola.eval.niah import string_match_all
    from lola.eval.niah_execution import niah_prompts
    from lola.integrations.transformers import apply_lola, remove_lola
    from lola.io.outputs import check_held

    maps = None
    if run.feature_maps is not None:
        from lola.pretrained.folder import check_geometry, read_feature_maps

        maps = read_feature_maps(run.feature_maps)
        check_geometry(maps, model)
    check_budgets(run, model)
    configs = {m: c for m, c in method_configs(run).items() if c is not None and m != "window"}
    if not configs:
        raise ValueError(f"methods {run.methods} hold no linear state to probe: add hybrid or lola")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = run_inputs(run, model)  # before LoLA changes the model
    _check_claim(out, run, inputs)
    records_path = out / RECORDS_FILE
    prompts = niah_prompts(run, tokenizer)
    done = _read_records(records_path, run, list(configs), prompts)  # every record checked against this run's prompts
    records = list(done.values())
    _write_probe(out, run, inputs, records)  # claims the folder
    todo = [(m, n, i) for m in configs for (n, i) in prompts if (m, n, i) not in done]
    bar = tqdm(total=len(configs) * len(prompts), initial=len(records), desc="probe", disable=not progress)
    drop_cut_record(records_path, "lola probe")  # a record a kill cut short: redone, not appended to
    with open_record_file(records_path, "lola probe") as log:  # a plain file only: never through a link, never a FIFO
        for method, cfg in configs.items():
            mine = [(n, i) for (m, n, i) in todo if m == method]
            if not mine:
                continue
            apply_lola(model, cfg, feature_maps=maps)
            try:
                for n, i in mine:
                    sample = prompts[(n, i)]
                    rec = probe_prompt(model, tokenizer, sample.input_ids, sample.answers[0], run.new_tokens)
                    rec = {
                        "method": method,
                        "length": n,
                        "index": i,
                        "depth": sample.depth,
                        "prompt_tokens": sample.length,
                        "answers": list(sample.answers),
                        "score": string_match_all(rec["prediction"], sample.answers),
                        **rec,
                    }
                    check_held(out)  # the folder is still the one the run holds
                    append_record(log, rec)
                    records.append(rec)
                    bar.update(1)
            finally:
                remove_lola(model)
    bar.close()
    summary = _write_probe(out, run, inputs, records)
    plot_probe(summary, out)
    return records


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize_probe(records: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{method: {length: {"accuracy", "samples", "layers": {layer: means}}}}``: per layer the
    mean over heads and samples of ``share``, ``log_exact``, ``log_linear`` and of ``held`` (the
    fraction of storage heads holding the whole needle), and ``share_max`` (the largest
    head's mean share). Lengths are string keys (JSON)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        groups.setdefault((r["method"], r["length"]), []).append(r)
    for (method, n), rs in sorted(groups.items()):
        layers: dict[str, dict[str, float | None]] = {}
        for layer in sorted({k for r in rs for k in r["layers"]}, key=int):
            rows = [r["layers"][layer] for r in rs if layer in r["layers"]]
            heads = len(rows[0]["share"])
            per_head_share = [_mean([row["share"][h] for row in rows]) for h in range(heads)]
            layers[layer] = {
                "share": _mean([v for row in rows for v in row["share"]]),
                "share_max": max(v for v in per_head_share if v is not None),
                "log_exact": _mean([v for row in rows for v in row["log_exact"]]),
                "log_linear": _mean([v for row in rows for v in row["log_linear"]]),
                "held": _mean([float(v) for row in rows for v in row["held"]]),
            }
        out.setdefault(method, {})[str(n)] = {"accuracy": 100 * _mean([r["score"] for r in rs]), "samples": len(rs), "layers": layers}
    return out


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def format_probe(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Per method, a table by layer: the state's share (%), ``ln`` of the linear minus the exact
    mass, and the storage heads holding the needle (%), one column group per length."""
    blocks = []
    for method, by in summary.items():
        lengths = sorted(by, key=int)
        head = f"{'layer':>5} |" + "|".join(f"{'share%':>7}{'lin-ex':>7}{'held%':>6} @{n:<6}" for n in lengths)
        lines = [f"{method}: accuracy " + ", ".join(f"{by[n]['accuracy']:.0f}% at {n} ({by[n]['samples']} samples)" for n in lengths), head, "-" * len(head)]
        layer_ids = sorted({k for n in lengths for k in by[n]["layers"]}, key=int)
        for layer in layer_ids:
            cells = []
            for n in lengths:
                s = by[n]["layers"].get(layer, {})
                ex, lin = s.get("log_exact"), s.get("log_linear")
                diff = None if ex is None or lin is None else lin - ex
                share = None if s.get("share") is None else 100 * s["share"]
                held = None if s.get("held") is None else 100 * s["held"]
                cells.append(_fmt(share, ".1f", 7) + _fmt(diff, ".2f", 7) + _fmt(held, ".0f", 6) + " " * 8)
            lines.append(f"{layer:>5} |" + "|".join(cells))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def plot_probe(summary: dict[str, dict[str, dict[str, Any]]], out_dir: str | Path) -> Path:
    """``probe.png``: per method, three panels against the layer (share, ``ln`` linear − exact
    mass, needle held), one line per length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lola.io.figures import figure_is_ours, save_png
    from lola.io.outputs import write_files

    methods = list(summary)
    fig, axes = plt.subplots(len(methods), 3, figsize=(13, 3.2 * len(methods)), squeeze=False)
    for row, method in zip(axes, methods):
        for n in sorted(summary[method], key=int):
            layers = summary[method][n]["layers"]
            xs = [int(k) for k in layers]
            share = [100 * (v["share"] or 0.0) for v in layers.values()]
            diff = [(v["log_linear"] - v["log_exact"]) if v["log_linear"] is not None and v["log_exact"] is not None else float("nan") for v in layers.values()]
            held = [100 * (v["held"] or 0.0) for v in layers.values()]
            label = f"{n} tokens ({summary[method][n]['accuracy']:.0f}%)"
            for ax, ys in zip(row, (share, diff, held)):
                ax.plot(xs, ys, marker=".", label=label)
        for ax, title in zip(row, ("state's share of the output (%)", "ln(linear mass) − ln(exact mass)", "heads holding the needle (%)")):
            ax.set_title(f"{method}: {title}", fontsize=9)
            ax.set_xlabel("layer")
            ax.grid(True, alpha=0.3)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    (path,) = write_files(out_dir, {PLOT_FILE: lambda p: save_png(fig, p, dpi=110)}, ours=figure_is_ours, writer="lola probe")
    plt.close(fig)
    return path
