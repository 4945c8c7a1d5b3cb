"""The ``lola`` command.

Every user error (a bad option, a missing or damaged file, an output path that cannot be
written or holds files another tool wrote) is reported as one line, ``lola COMMAND: error:
MESSAGE``, with exit status 2 and before any model is loaded. ``--debug`` (or ``LOLA_DEBUG=1``)
shows the traceback instead. Ctrl-C prints one line saying what was kept and how to resume
(exit status 130).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from lola.errors import about, describe_validation, option_name, report
from lola.io.outputs import check_free, output_lock
from lola.io.provenance import DISTRIBUTION
from lola.limits import MAX_TOKENS
from lola.methods import NIAH_SCOPES, PERPLEXITY_SCOPES, check_options

__all__ = ["main"]

PERPLEXITY_FORMAT = "lola-perplexity-results"


def _check_int(option: str, value: Any, minimum: int, maximum: int = MAX_TOKENS) -> int:
    """``value`` if it is an int (not a bool) in ``[minimum, maximum]``, else a ``ValueError``
    naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{option} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{option} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{option} must be <= {maximum}, got {value}")
    return value


# Options that name a file, a folder, a model or a corpus: an empty value would be read as the
# current folder (``Path("")``) or skipped as "not given" (a default silently used instead).
PATH_OPTIONS = ("out", "config", "haystack_file", "feature_maps", "budgets", "text", "model")


def _refuse_empty_paths(args: argparse.Namespace) -> None:
    """Refuse an empty value of any of :data:`PATH_OPTIONS`, naming the option."""
    for dest in PATH_OPTIONS:
        value = getattr(args, dest, None)
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
            raise ValueError(f"{option_name(dest)} is empty: give a name or a path")


def _check_text_sources(sources: Any, option: str = "--text") -> None:
    """Read every text source that is a path now, before a model loads: a missing, empty or
    binary file, or a folder without text, is refused naming ``option`` (registered corpora are
    fetched later, by name)."""
    from lola.data.corpora import CORPORA
    from lola.data.text import load_documents

    if sources is None:
        return
    for source in [sources] if isinstance(sources, (str, Path)) else sources:
        if str(source) in CORPORA:
            continue
        if not Path(source).expanduser().exists():
            raise ValueError(f"{option} {str(source)!r} is neither a file, a folder, nor a registered corpus ({', '.join(sorted(CORPORA))})")
        with about(option):
            load_documents(str(source))


def _demo(args: argparse.Namespace) -> int:
    from lola.eval.demo import check_demo_args, format_table, run_demo

    check_demo_args(args.length, args.trials, args.budget, prefix="--", seed=args.seed)
    print(f"Needle recall, one attention head, {args.length} tokens, {args.trials} needle depths, exact budget {args.budget} tokens\n")
    print(format_table(run_demo(length=args.length, trials=args.trials, budget=args.budget, seed=args.seed)))
    return 0


NIAH_FIELDS = (
    "model",
    "task",
    "lengths",
    "samples",
    "methods",
    "policies",
    "window",
    "sparse_size",
    "sinks",
    "chunk",
    "prefill_chunk",
    "mixing",
    "linear_decay",
    "linear_share_cap",
    "linear_share_cap_from",
    "positions",
    "exact_distance",
    "state_positions",
    "state_key_positions",
    "fold_repeats",
    "fold_copies",
    "feature_maps",
    "max_new_tokens",
    "seed",
    "haystack_file",
    "needle",
    "question",
    "answer_prefix",
    "budgets",
)


LINEARIZE_STAGE1 = ("steps", "lr", "window", "feature_map", "feature_dim", "mixing", "train_chunks", "state_positions", "position_spread")
"""`lola linearize`'s options of stage 1 alone (:class:`~lola.linearize.LinearizeConfig` fields)."""
LINEARIZE_STAGE2 = {
    "steps": "stage2_steps",
    "lr": "lora_lr",
    "warmup_steps": "warmup_steps",
    "maps_lr": "maps_lr",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "kl_weight": "kl_weight",
    "ce_weight": "ce_weight",
}
"""Its options of stage 2 alone: :class:`~lola.linearize.FinetuneConfig` field → option."""
LINEARIZE_SHARED = {
    "chunk_tokens": "seq_len",
    "batch": "batch",
    "eval_chunks": "eval_chunks",
    "text": "text",
    "checkpoint_every": "checkpoint_every",
    "seed": "seed",
    "device": "device",
}
"""Its options that set both stages: option (the stage-1 field) → stage-2 field."""


def linearize_fields(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields of `lola linearize`'s two stage configs that ``args`` gives (stage 1's, stage 2's)."""
    from lola.cli.spec_options import given_fields

    stage2 = {**LINEARIZE_STAGE2, **{f2: d for d, f2 in LINEARIZE_SHARED.items()}}
    return given_fields(args, [*LINEARIZE_STAGE1, *LINEARIZE_SHARED]), given_fields(args, stage2, stage2)


def _given_name(args: argparse.Namespace, fields: tuple[str, ...]) -> Any:
    """How a refusal names a field of a run: its option where the command line gave it, else the
    key of the ``--config`` file that did."""
    from lola.cli.spec_options import given_fields

    flags = given_fields(args, fields)
    return lambda field: option_name(field) if field in flags or not getattr(args, "config", None) else f"{field} (in --config {args.config})"


def _niah(args: argparse.Namespace) -> int:
    from lola.cli.spec_options import given_fields
    from lola.eval.niah_report import scored
    from lola.eval.runner import (
        SAMPLES_FILE,
        NiahRun,
        check_out_folder,
        format_depth_summary,
        format_intervals,
        format_summary,
        run_niah,
        summarize,
        summarize_by_depth,
    )

    options = _read_config(args.config) if args.config else {}
    options.update(given_fields(args, NIAH_FIELDS))
    batch_size = _check_int("--batch-size", options.pop("batch_size", 1) if args.batch_size is None else args.batch_size, 1)
    run = NiahRun(**options)
    check_options(options, run, NIAH_SCOPES, _given_name(args, NIAH_FIELDS))
    out = args.out or f"results/niah-{run.task}"
    check_out_folder(out, run)  # unwritable, foreign, another run's or damaged: refused before loading
    check_free(out, "lola niah")  # another run in it: refused before loading
    if run.feature_maps is not None:
        from lola.pretrained.folder import read_feature_maps

        read_feature_maps(run.feature_maps)  # a damaged folder is named before the model loads
    from lola import models

    with about("--model"):
        model, tok = models.load(run.model)
    args.interrupted_hint = f"finished samples are kept in {Path(out) / SAMPLES_FILE}; run the same command again to resume"
    records = run_niah(run, model, tok, out, batch_size=batch_size)
    print(f"\n{run.task}, exact budget {run.budget} tokens (accuracy %, cache MiB)\n")
    print(format_summary(summarize(records)))
    print("\naccuracy with 95% Wilson intervals\n")
    print(format_intervals(summarize(records)))
    print("\nby needle depth (accuracy %)\n")
    print(format_depth_summary(summarize_by_depth(records)))
    speed = {}
    for r in scored(records):
        speed.setdefault(r["method"], []).append(r.get("tokens_per_second", 0.0))
    print("\ntokens/s: " + ", ".join(f"{m} {sum(v) / len(v):.0f}" for m, v in speed.items()))
    from lola.io.outputs import read_json

    written = Path(out) / "results.json"  # run_niah writes it with the configs after trained maps filled them in
    ran = read_json(written, "a lola niah results file").get("methods", {}) if written.is_file() else {}
    rules = {m: c["mixing"] for m, c in ran.items() if isinstance(c, dict) and "mixing" in c}
    if rules:
        print("mixing rules: " + ", ".join(f"{m} {rule}" for m, rule in rules.items()))
    print(f"\nresults: {out}/results.json, samples.jsonl, accuracy.png, cache_bytes.png")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from lola.cli.spec_options import given_fields
    from lola.eval.runner import NiahRun
    from lola.eval.state_probe import PLOT_FILE, PROBE_FILE, RECORDS_FILE, format_probe, run_probe, summarize_probe

    options = _read_config(args.config) if args.config else {}
    options.update(given_fields(args, NIAH_FIELDS))
    run = NiahRun(**options)
    check_options(options, run, NIAH_SCOPES, _given_name(args, NIAH_FIELDS))
    out = args.out or f"results/probe-{run.task}"
    from lola.io.outputs import check_output_folder

    check_output_folder(out)  # a file or an unwritable place: refused before loading
    check_free(out, "lola probe")  # another run in it, too
    if run.feature_maps is not None:
        from lola.pretrained.folder import read_feature_maps

        read_feature_maps(run.feature_maps)
    from lola import models

    with about("--model"):
        model, tok = models.load(run.model)
    args.interrupted_hint = f"finished prompts are kept in {Path(out) / RECORDS_FILE}; run the same command again to resume"
    records = run_probe(run, model, tok, out)
    print("\nat the answer position, per layer (mean over heads and prompts): the state's share of the output,")
    print("ln(linear mass) - ln(exact mass), and the storage heads holding every token of the needle's value\n")
    print(format_probe(summarize_probe(records)))
    print(f"\nresults: {out}/{PROBE_FILE}, {RECORDS_FILE}, {PLOT_FILE}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from lola.cli.spec_options import given_fields
    from lola.eval.budget_sweep import SWEEP_FILE, BudgetSweep, format_sweep, run_sweep

    sweep = BudgetSweep(**given_fields(args, list(BudgetSweep.model_fields)))
    batch_size = _check_int("--batch-size", 1 if args.batch_size is None else args.batch_size, 1)
    out = args.out or "results/sweep"
    from lola.io.outputs import check_output_folder

    check_output_folder(out)  # before loading, as every command's sizes and places
    check_free(out, "lola sweep")
    from lola.eval.budget_sweep import is_sweep_file
    from lola.io.outputs import check_target

    check_target(Path(out) / SWEEP_FILE, is_sweep_file, "lola sweep")  # another tool's sweep.json
    from lola import models

    with about("--model"):
        model, tok = models.load(sweep.model)
    args.interrupted_hint = "finished samples are kept in each point's folder; run the same command again to resume"
    rows = run_sweep(sweep, model, tok, out, batch_size=batch_size)
    print("\npass-key accuracy against exact tokens per K/V head (95% Wilson intervals)\n")
    print(format_sweep(rows))
    print(f"\nresults: {out}/{SWEEP_FILE}, sweep-*.png, and a lola niah folder per point")
    return 0


def _check_linearize_out(out: Path, cfg1: Any, cfg2: Any, stage1_maps: str | None = None, overwrite: bool = False) -> None:
    """Refuse a ``lola linearize --out`` folder that cannot be written, holds another tool's
    ``lola_config.json``, or holds a damaged or mismatched checkpoint of a stage that will run
    (for stage 2 alone, one of stage-1 maps other than ``stage1_maps``); and, unless
    ``overwrite``, a finished run that a stage would train again from the start (its maps, or
    its adapters, replaced; stage 1 trained again deletes the adapters made on the old maps)."""
    from lola.io.outputs import check_output_folder, read_json
    from lola.linearize.checkpoint import load_checkpoint, run_inputs
    from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE
    from lola.linearize.transfer import CHECKPOINT_FILE
    from lola.pretrained.folder import CONFIG_FILE, FORMAT, GROUP_FILES, folder_is_ours

    check_output_folder(out)
    description = out / CONFIG_FILE
    if description.exists():
        data = read_json(description, "a lola feature-map description")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{description} was not written by lola linearize (format {FORMAT!r}); move it away or use another --out")
    elif not folder_is_ours(out):
        found = next(out / n for n in GROUP_FILES if (out / n).exists() or (out / n).is_symlink())
        raise ValueError(f"{found} was not written by lola linearize (no {CONFIG_FILE} beside it); move it away or use another --out")
    elif out.is_dir():
        # A folder without lola linearize's description holds no finished run of it: anything
        # there but its own checkpoints is someone's (an export, a model): not written beside.
        own = {*GROUP_FILES, CHECKPOINT_FILE, FINETUNE_CHECKPOINT_FILE, f"{CHECKPOINT_FILE}.sha256", f"{FINETUNE_CHECKPOINT_FILE}.sha256"}
        foreign = sorted(p.name for p in out.iterdir() if p.name not in own and not p.name.startswith(".lola-"))
        if foreign:
            raise ValueError(
                f"--out {out} holds files lola linearize did not write ({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''}); "
                "give an empty or new folder"
            )
    stage2_ckpt = out / FINETUNE_CHECKPOINT_FILE
    try:
        if cfg2 is not None and stage2_ckpt.is_file():
            inputs = run_inputs(cfg2, stage1_maps=stage1_maps) if cfg1 is None and stage1_maps is not None else None
            load_checkpoint(stage2_ckpt, cfg2, "--stage2-steps", inputs)
        elif cfg1 is not None and (out / CHECKPOINT_FILE).is_file():
            load_checkpoint(out / CHECKPOINT_FILE, cfg1, "--steps")
    except ValueError:
        if not overwrite:  # with --overwrite a checkpoint of other options is set aside (_discard_checkpoints)
            raise
    if overwrite:
        return
    from lola.pretrained.folder import FEATURE_MAPS_FILE, FINETUNE_REPORT_FILE, REPORT_FILE
    from lola.pretrained.lora import LORA_FILE

    held = [n for n in (FEATURE_MAPS_FILE, REPORT_FILE, LORA_FILE, FINETUNE_REPORT_FILE) if (out / n).exists()]
    stage1_writes = cfg1 is not None and not (cfg2 is not None and stage2_ckpt.is_file())  # else "stage 1: done"
    # Continuing a stage from its checkpoint extends that run; training one from the start over
    # its finished output, or new maps under adapters made on the old ones, replaces lola's own.
    if stage1_writes and (out / LORA_FILE).exists():
        why = "stage 1 would write new feature maps and delete the stage-2 adapters made on the old ones"
    elif stage1_writes and (out / REPORT_FILE).exists() and not (out / CHECKPOINT_FILE).is_file():
        why = "stage 1 would train again from the start and replace its feature maps (run --stage 2 to go on from them)"
    elif cfg1 is None and cfg2 is not None and (out / FINETUNE_REPORT_FILE).exists() and not stage2_ckpt.is_file():
        why = "stage 2 would train again from the start and replace its adapters"
    else:
        return
    raise ValueError(f"{out} holds a finished run ({', '.join(held)}): {why}; pass --overwrite to do so, or write to another --out")


def _check_stage_options(args: argparse.Namespace) -> None:
    """Refuse an option of a stage that ``--stage`` does not run (it would do nothing).

    Raises:
        ValueError: naming the options and the stage they belong to.
    """
    from lola.cli.spec_options import given_fields

    stage1 = [option_name(f) for f in given_fields(args, LINEARIZE_STAGE1)]
    stage2 = [option_name(dest) for dest in LINEARIZE_STAGE2.values() if getattr(args, dest, None) is not None]
    stage2 += [option_name(dest) for dest in ("from_lora", "gradient_checkpointing") if getattr(args, dest, False)]
    stage2 += [option_name(dest) for dest in ("stage2_attention", "feature_maps") if getattr(args, dest, None) is not None]
    for stage, options, other in (("1", stage2, "2 (LoRA fine-tuning)"), ("2", stage1, "1 (attention transfer)")):
        if args.stage == stage and options:
            raise ValueError(
                f"{', '.join(options)} {'sets' if len(options) == 1 else 'set'} stage {other}, but --stage {stage} runs stage {stage} alone: "
                f"drop {'it' if len(options) == 1 else 'them'}, or run --stage all"
            )


def _linearize(args: argparse.Namespace) -> int:
    from lola.linearize import FinetuneConfig, LinearizeConfig, finetune, linearize

    _check_stage_options(args)
    if args.from_lora and args.feature_maps is None:
        raise ValueError(
            "--from-lora continues from the LoRA weights of --feature-maps (a stage-2 folder or shipped name), and none is given: give --feature-maps, or drop --from-lora"
        )
    opts1, opts2 = linearize_fields(args)
    stage2_dests = {**LINEARIZE_STAGE2, **{f2: d for d, f2 in LINEARIZE_SHARED.items()}}
    if args.from_lora:
        opts2["from_lora"] = True
    if args.gradient_checkpointing:
        opts2["gradient_checkpointing"] = True
    model_name = args.model
    if args.quick:  # a smoke run: tiny random model, a few short steps
        model_name = model_name or "tiny-random-llama"
        quick = {"text": ["pydoc"], "eval_chunks": 1}  # no corpus download for a smoke run
        opts1 = {**quick, "steps": 6, "chunk_tokens": 128, "train_chunks": 3, "window": 16, "checkpoint_every": 3, **opts1}
        opts2 = {**quick, "steps": 4, "seq_len": 128, "warmup_steps": 1, "checkpoint_every": 2, **opts2}
    model_name = model_name or "smollm2-135m-instruct"
    if args.stage2_attention == "lola":
        from lola.eval.runner import default_lola_config

        opts2["lola"] = default_lola_config(model_name)
    from pydantic import ValidationError

    cfg1 = LinearizeConfig(**opts1) if args.stage in ("1", "all") else None
    try:
        cfg2 = FinetuneConfig(**opts2) if args.stage in ("2", "all") else None
    except ValidationError as err:  # stage 2's fields by their options: its `lr` is --lora-lr
        raise ValueError(describe_validation(err, lambda f: option_name(stage2_dests.get(f, f)))) from None
    out = Path(args.out)
    _check_text_sources((cfg1 or cfg2).text)
    _check_linearize_out(out, cfg1, cfg2, stage1_maps=args.feature_maps or args.out, overwrite=args.overwrite)
    # One run per folder: a second is refused at once. The ranks of one distributed run share
    # it: the first holds the lock for all (the others write nothing of their own there).
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        check_free(out, "lola linearize")
    if cfg1 is None:  # stage 2 alone: the stage-1 maps it starts from must be readable
        from lola.pretrained.folder import CONFIG_FILE, read_feature_maps
        from lola.pretrained.shipped import SHIPPED

        maps = args.feature_maps or args.out
        if maps not in SHIPPED and not (Path(maps) / CONFIG_FILE).is_file():
            raise FileNotFoundError(
                f"stage 2 starts from stage-1 feature maps: {maps} has no {CONFIG_FILE} (run `lola linearize --stage 1 --out {maps}` first)"
            )
        read_feature_maps(maps)
    from lola import models
    from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE

    with about("--model"):
        model, tok = models.load(model_name)
    args.interrupted_hint = f"run the same command again to resume from the last checkpoint in {args.out}"

    from lola.io.outputs import run_lock

    with run_lock(out, "lola linearize") if main_rank else contextlib.nullcontext():
        _check_linearize_out(out, cfg1, cfg2, stage1_maps=args.feature_maps or args.out, overwrite=args.overwrite)  # again, under the lock
        if args.overwrite:
            _discard_checkpoints(out, cfg1, cfg2, stage1_maps=args.feature_maps or args.out)
        if cfg1 is not None and cfg2 is not None and (out / FINETUNE_CHECKPOINT_FILE).is_file():
            print(f"stage 1: done ({args.out} holds a stage-2 checkpoint)", file=sys.stderr)
        elif cfg1 is not None:
            linearize(model, tok, cfg1, args.out, model_name=model_name)
        if cfg2 is not None:
            finetune(model, tok, cfg2, args.out, maps=args.feature_maps, model_name=model_name)
    print(f"linearized: {args.out} (use with --feature-maps {args.out})")
    return 0


def _discard_checkpoints(out: Path, cfg1: Any, cfg2: Any, stage1_maps: str | None) -> None:
    """Under ``--overwrite``, remove the checkpoint of a stage that will run when it cannot be
    resumed (other options, other inputs, damaged): the stage then trains from the start, as
    asked. A checkpoint of the same run is kept and resumed."""
    from lola.linearize.checkpoint import checksum_path, load_checkpoint, run_inputs
    from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE
    from lola.linearize.transfer import CHECKPOINT_FILE

    stages = [(out / CHECKPOINT_FILE, cfg1, "--steps", None)]
    if cfg2 is not None:
        stages.append(
            (out / FINETUNE_CHECKPOINT_FILE, cfg2, "--stage2-steps", run_inputs(cfg2, stage1_maps=stage1_maps) if cfg1 is None and stage1_maps else None)
        )
    for path, cfg, option, inputs in stages:
        if cfg is None or not path.is_file():
            continue
        try:
            load_checkpoint(path, cfg, option, inputs)
        except ValueError as err:
            print(f"--overwrite: {path} cannot be resumed ({err}); training from the start", file=sys.stderr)
            path.unlink()
            checksum_path(path).unlink(missing_ok=True)


def _is_perplexity_results(path: Path) -> bool:
    """Whether ``path`` holds results that ``lola perplexity --out`` wrote (and may replace)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(data, dict):
        return False
    legacy = set(data) == {"run", "results"} and isinstance(data["run"], dict) and "lengths" in data["run"]
    return data.get("format") == PERPLEXITY_FORMAT or legacy


PERPLEXITY_FIELDS = (
    "model",
    "lengths",
    "methods",
    "feature_maps",
    "window",
    "sparse_size",
    "sinks",
    "chunk",
    "prefill_chunk",
    "policy",
    "mixing",
    "linear_decay",
    "linear_share_cap",
    "linear_share_cap_from",
    "positions",
    "exact_distance",
    "state_positions",
    "state_key_positions",
    "budgets",
    "windows",
    "text",
    "generate",
    "generate_windows",
)


def _perplexity(args: argparse.Namespace) -> int:
    from lola.cli.spec_options import given_fields
    from lola.eval.perplexity import PerplexityRun
    from lola.io.outputs import check_output_file

    given = given_fields(args, PERPLEXITY_FIELDS)
    run = PerplexityRun(**given)
    _check_text_sources(run.text)
    if run.feature_maps is not None:
        from lola.pretrained.folder import read_feature_maps

        read_feature_maps(run.feature_maps)
    check_options(given, run, PERPLEXITY_SCOPES)  # after the inputs: a damaged one is named first
    if args.out:
        check_output_file(args.out, ours=_is_perplexity_results, writer="lola perplexity")
    from lola import models

    with about("--model"):
        model, tok = models.load(run.model)
    args.interrupted_hint = "nothing was written (perplexity runs do not resume)"
    with output_lock(args.out, "lola perplexity") if args.out else contextlib.nullcontext():
        return _perplexity_run(args, run, model, tok)


def _perplexity_run(args: argparse.Namespace, run: Any, model: Any, tok: Any) -> int:
    from lola.eval.perplexity import format_perplexity, run_perplexity

    results = run_perplexity(run, model, tok)
    from lola.data.text import describe

    print(
        f"\nheld-out perplexity ({describe(run.text)}, held-out {run.heldout_fraction:.0%}; window {run.window}, sparse {run.sparse_size}, sinks {run.sinks}"
        f"{', feature maps ' + run.feature_maps if run.feature_maps else ', untrained feature maps'})\n"
    )
    print(format_perplexity(results))
    if args.out:
        from lola.io.outputs import write_files
        from lola.io.provenance import versions

        out = Path(args.out)
        body = json.dumps({"format": PERPLEXITY_FORMAT, "run": run.model_dump(), "versions": versions(), "results": results}, indent=2) + "\n"
        write_files(out.parent, {out.name: body}, ours=_is_perplexity_results, writer="lola perplexity")
        print(f"\nresults: {args.out}")
    return 0


def _load_adapted(model_name: str, feature_maps: str | None) -> tuple:
    """``(model, tokenizer)``: the stock model, with the LoRA adapters of ``feature_maps`` (a
    `lola linearize` folder or shipped name) merged when it has any: the projections the
    linearized model attends with. The maps are read (and checked) before the model loads."""
    from lola import models

    maps = None
    if feature_maps is not None:
        from lola.pretrained.folder import read_feature_maps

        with about("--feature-maps"):
            maps = read_feature_maps(feature_maps)
    with about("--model"):
        model, tok = models.load(model_name)
    if maps is not None and maps.lora is not None:
        from lola.pretrained.lora import merge_lora

        with about("--feature-maps"):
            merge_lora(model, maps.lora, maps.lora_spec)
    return model, tok


def _calibrate(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from lola.cli.spec_options import given_fields
    from lola.eval.calibrate import CalibrateSpec, calibrate
    from lola.io.outputs import check_output_file

    try:  # one left unset takes the spec's default
        spec = CalibrateSpec(**given_fields(args, CalibrateSpec.model_fields))
    except ValidationError as err:
        raise ValueError(describe_validation(err, option_name)) from None
    from lola.budgets import is_budgets_file

    out = check_output_file(args.out, ours=is_budgets_file, writer="lola calibrate")
    model, tok = _load_adapted(spec.model, spec.feature_maps)
    args.interrupted_hint = "nothing was written"
    with output_lock(out, "lola calibrate"):
        budgets = calibrate(model, tok, model_name=spec.model, **spec.model_dump(exclude={"model"}))
        budgets.save(out)
    print(budgets.summary())
    print(f"\nbudgets: {out} (use with `lola niah --budgets {out}` or lola.budgets.load)")
    return 0


def _fit_scorer(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from lola.cli.spec_options import given_fields
    from lola.scorers.fit import FitSpec, fit_scorer, format_report

    try:  # the options are FitSpec's fields by name; one left unset takes the spec's default
        spec = FitSpec(**given_fields(args, FitSpec.model_fields))
    except ValidationError as err:
        raise ValueError(describe_validation(err, option_name)) from None
    from lola import models
    from lola.io.outputs import check_output_file
    from lola.scorers import is_scorer_file

    out = check_output_file(args.out, ours=is_scorer_file, writer="lola fit-scorer")
    _check_text_sources(spec.text)  # before the model loads
    positions = models.max_positions(spec.model)
    if positions and spec.positions() > positions:
        raise ValueError(f"--length {spec.length} needs {spec.positions()} positions ({spec.target} target), but --model {spec.model} holds {positions}")
    from lola.scorers.fit import check_resume

    check_resume(out, spec)  # a damaged checkpoint, or one of other options or text
    model, tok = _load_adapted(spec.model, spec.feature_maps)
    args.interrupted_hint = f"the statistics so far are in {out}.partial: the same command resumes"
    command = "lola fit-scorer " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["fit-scorer"] else ""
    with output_lock(out, "lola fit-scorer"):  # one run extends one checkpoint
        scorer = fit_scorer(model, tok, spec, out, command=command)
    print(format_report(scorer.info["report"]))
    print(f"\nscorer: {out} (use with `lola niah --policies learned` variants: policy_kwargs {{scorer: {out}}})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from lola.config import LoLAConfig
    from lola.eval.runner import default_lola_config
    from lola.integrations.transformers.export import check_export_folder, export_pretrained

    out = check_export_folder(args.out, "--out")  # before the model is loaded
    if args.config is not None:
        with about("--config"):
            config = LoLAConfig(**_read_config(args.config))
    else:
        config = default_lola_config(args.model, trained_maps=args.feature_maps is not None, feature_maps=args.feature_maps)
        if args.vllm:  # the plug-in steps every chunk in prefill too (its pages hold one chunk's window)
            config = config.model_copy(update={"schedule_kwargs": {k: v for k, v in config.schedule_kwargs.items() if k != "prefill_chunk"}})
    if args.feature_maps is not None:
        from lola.pretrained.folder import read_feature_maps

        with about("--feature-maps"):
            read_feature_maps(args.feature_maps)
    from lola import models

    with about("--model"):
        model, tok = models.load(args.model)
    args.interrupted_hint = "the folder is written all at once at the end: nothing was written"
    with output_lock(out, "lola export"):
        paths = export_pretrained(model, tok, out, config, feature_maps=args.feature_maps, dtype=args.dtype, vllm=args.vllm)
    saved = json.loads((out / "config.json").read_text())["lola"]["config"]
    print(f"lola export: {out} ({len(paths)} files; mixing {saved['mixing']}, window {saved['window']}, sinks {saved['sinks']})")
    print(f"load it with lola.from_pretrained({str(out)!r})" + (f" or serve it with `vllm serve {out}` (lola-attention-vllm)" if args.vllm else ""))
    return 0


def _read_config(path: str) -> dict:
    """Options from a JSON or YAML file (keys are NiahRun fields): :func:`lola.io.outputs.read_mapping`."""
    from lola.io.outputs import read_mapping

    return read_mapping(path, "--config")


def _debug(args: argparse.Namespace) -> bool:
    """``--debug`` or ``LOLA_DEBUG`` set to anything but empty or ``0``: show tracebacks."""
    return bool(getattr(args, "debug", False)) or os.environ.get("LOLA_DEBUG", "") not in ("", "0")


class OneLineParser(argparse.ArgumentParser):
    """argparse with the one-line errors of every other refusal: ``PROG: error: MESSAGE (see
    PROG --help)``, exit status 2, instead of the usage block (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lola`` command."""
    parser = OneLineParser(prog="lola", description="LoLA: linear attention that remembers.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line (also LOLA_DEBUG=1)")
    demo = sub.add_parser("demo", parents=[common], help="model-free needle-recall demo of every method")
    demo.add_argument("--length", type=int, default=2048, help="tokens per trial (default 2048)")
    demo.add_argument("--trials", type=int, default=8, help="needle depths (default 8)")
    demo.add_argument("--budget", type=int, default=128, help="exact tokens for the compressed methods (default 128)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)

    niah = sub.add_parser("niah", parents=[common], help="needle-in-a-haystack recall of full attention, window, the hybrid and LoLA on a real model")
    from lola.cli.spec_options import add_shared_options, add_spec_options
    from lola.eval.runner import NiahRun

    add_spec_options(niah, NiahRun, NIAH_FIELDS)  # one option per field, its help and default from the spec
    niah.add_argument("--batch-size", dest="batch_size", type=int, help="samples of one length generated as one left-padded batch (default 1)")
    niah.add_argument("--config", help="a JSON or YAML file of options (also `variants`: named LoLA configs to compare); command-line options override it")
    niah.add_argument("--out", help="results folder (default results/niah-TASK); re-running resumes")
    niah.set_defaults(func=_niah)

    probe = sub.add_parser(
        "probe", parents=[common], help="per layer, where LoLA's outputs come from on lola niah's prompts: the state's share, the two masses, the needle held"
    )
    add_spec_options(probe, NiahRun, NIAH_FIELDS)
    probe.add_argument("--config", help="a JSON or YAML file of options (as lola niah's); command-line options override it")
    probe.add_argument("--out", help="results folder (default results/probe-TASK); re-running resumes")
    probe.set_defaults(func=_probe)

    sweep = sub.add_parser(
        "sweep", parents=[common], help="pass-key accuracy against the exact-token budget at every length: window, hybrid, LoLA and its exact tokens alone"
    )
    from lola.eval.budget_sweep import BudgetSweep

    add_spec_options(sweep, BudgetSweep, list(BudgetSweep.model_fields))
    sweep.add_argument("--batch-size", dest="batch_size", type=int, help="samples of one length generated as one left-padded batch (default 1)")
    sweep.add_argument("--out", help="results folder (default results/sweep); re-running resumes")
    sweep.set_defaults(func=_sweep)

    lin = sub.add_parser("linearize", parents=[common], help="linearize a model: attention transfer (stage 1), then LoRA fine-tuning against it (stage 2)")
    lin.add_argument("--model", help="registered name, .gguf file or Hugging Face folder (default smollm2-135m-instruct)")
    lin.add_argument("--out", required=True, help="output folder (re-running resumes from its checkpoints)")
    lin.add_argument(
        "--stage",
        choices=("1", "2", "all"),
        default="all",
        help="1: attention transfer; 2: LoRA fine-tuning from the stage-1 maps in --out (or --feature-maps); all (default): both",
    )
    lin.add_argument("--feature-maps", dest="feature_maps", help="stage 2 only: the stage-1 folder to start from (default: --out)")
    from lola.linearize import FinetuneConfig, LinearizeConfig

    # The stages' fields, one source of help and defaults: shared options set both stages.
    add_shared_options(
        lin,
        {
            "stage 1": (LinearizeConfig, {d: d for d in LINEARIZE_SHARED}),
            "stage 2": (FinetuneConfig, {d: f2 for d, f2 in LINEARIZE_SHARED.items()}),
        },
    )
    add_spec_options(lin.add_argument_group("stage 1 (attention transfer)"), LinearizeConfig, LINEARIZE_STAGE1)
    g2 = lin.add_argument_group("stage 2 (LoRA fine-tuning, KL to the stock model)")
    add_spec_options(g2, FinetuneConfig, LINEARIZE_STAGE2, dests=LINEARIZE_STAGE2)
    g2.add_argument(
        "--stage2-attention",
        dest="stage2_attention",
        choices=("hybrid", "lola"),
        default=None,
        help="hybrid (default, LoLCATs): train the sliding-window hybrid; lola: train through LoLA as `lola niah` runs it (sinks, window, sparse cache with the model's budgets, the paper's rule)",
    )
    g2.add_argument(
        "--gradient-checkpointing",
        dest="gradient_checkpointing",
        action="store_true",
        help="recompute each layer in the backward pass (far less memory, about a third more time; for --stage2-attention lola beyond 2K tokens)",
    )
    g2.add_argument(
        "--from-lora", dest="from_lora", action="store_true", help="continue from the LoRA weights of --feature-maps (a stage-2 folder or shipped name)"
    )
    lin.add_argument(
        "--overwrite",
        action="store_true",
        help="train again over a finished --out folder, replacing its maps (training stage 1 again deletes the stage-2 adapters made on the old maps)",
    )
    lin.add_argument("--quick", action="store_true", help="a few short steps of both stages on a tiny random model (smoke test)")
    lin.set_defaults(func=_linearize)

    cal = sub.add_parser("calibrate", parents=[common], help="find the retrieval heads of a model and write per-head sparse budgets")
    from lola.eval.calibrate import CalibrateSpec

    add_spec_options(cal, CalibrateSpec, CalibrateSpec.model_fields)
    cal.add_argument("--out", required=True, help="budgets JSON file to write (use with `lola niah --budgets FILE`)")
    cal.set_defaults(func=_calibrate)

    fit = sub.add_parser("fit-scorer", parents=[common], help="fit a learned token scorer (the `learned` policy) to a model's attention on text")
    from lola.scorers.fit import FitSpec

    add_spec_options(fit, FitSpec, FitSpec.model_fields)
    fit.add_argument("--out", required=True, help="scorer file to write (.safetensors); OUT.partial holds the progress, and the same command resumes from it")
    fit.set_defaults(func=_fit_scorer)

    exp = sub.add_parser("export", parents=[common], help="write a model with LoLA applied as a Hugging Face folder (lola.from_pretrained; vLLM with --vllm)")
    exp.add_argument("--model", default="smollm2-135m-instruct", help="registered name, .gguf file or Hugging Face folder (default smollm2-135m-instruct)")
    exp.add_argument("--feature-maps", dest="feature_maps", help="a `lola linearize` folder or shipped name (default: none, training-free LoLA)")
    exp.add_argument(
        "--config",
        help="a JSON or YAML file of LoLAConfig fields (default: the lola method as `lola niah` runs it, with the budgets calibrated for --feature-maps, else the model's)",
    )
    exp.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="dtype of the saved weights (default float32)")
    exp.add_argument("--vllm", action="store_true", help="name the lola-attention-vllm plug-in's architecture in config.json (`vllm serve FOLDER`)")
    exp.add_argument("--out", required=True, help="the folder to write (replaced only if lola export wrote it)")
    exp.set_defaults(func=_export)

    ppl = sub.add_parser("perplexity", parents=[common], help="held-out perplexity of full attention, the hybrid and LoLA")
    from lola.eval.perplexity import PerplexityRun

    add_spec_options(ppl, PerplexityRun, PERPLEXITY_FIELDS, aliases={"lengths": ["--length"]})
    ppl.add_argument("--out", help="also write the results to this JSON file")
    ppl.set_defaults(func=_perplexity)
    for command in sub.choices.values():  # each command's messages name its options, not the fields they set
        command.set_defaults(option_names=option_names(command))
    return parser


def option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{dest: option string}`` of ``parser``'s options (the long form a field's name gives, else
    the first long one): how a message that names a run spec's field names the option instead
    (:func:`lola.errors.name_options`)."""
    names = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help", "debug"):
            names[action.dest] = option_name(action.dest) if option_name(action.dest) in longs else longs[0]
    return names


# The optional packages, by the extra that installs them (pyproject.toml): a command that needs
# one that is missing says which extra to install instead of a traceback.
EXTRA_OF_MODULE = {
    **dict.fromkeys(("transformers", "safetensors", "gguf", "accelerate", "peft", "tqdm"), "hf"),
    **dict.fromkeys(("wonderwords", "matplotlib", "lm_eval"), "eval"),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lola`` command.

    Returns the exit status: 0, 2 for a user error (one line on stderr, ``lola COMMAND: error:
    …``), 130 when interrupted. With ``--debug`` or ``LOLA_DEBUG=1`` errors propagate with
    their traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _refuse_empty_paths(args)
        return args.func(args)
    except KeyboardInterrupt:
        if _debug(args):
            raise
        hint = getattr(args, "interrupted_hint", None)
        print(f"\nlola {args.command}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        extra = EXTRA_OF_MODULE.get((err.name or "").split(".")[0])
        if extra is None or _debug(args):
            raise
        print(f"lola {args.command}: error: needs {err.name}, from the {extra} extra: pip install '{DISTRIBUTION}[{extra}]'", file=sys.stderr)
        return 2
    except MemoryError as err:  # a state refused before allocation: name the options it comes from
        sizes = [f"--{o.replace('_', '-')}" for o in ("window", "sparse_size", "sinks", "batch_size") if getattr(args, o, None) is not None]
        hint = f" (set by {', '.join(sizes)})" if sizes else ""
        return report(f"lola {args.command}", MemoryError(f"{err}{hint}"), debug=_debug(args))
    except Exception as err:  # a user error: one line naming the input; anything else: a bug
        return report(f"lola {args.command}", err, debug=_debug(args), options=getattr(args, "option_names", None))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
