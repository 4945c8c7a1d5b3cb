"""Adversarial cases of class ``resume``: resumes that mix inputs.

Batch 1. A results or training folder is interrupted or pre-seeded, then an option, an input file
or a record changes, and the same command runs again: it must be refused naming the option (and
leave the folder as it was), or redo the work correctly. ``lola niah --out``, ``lola linearize
--out`` and ``lola perplexity --out`` on the tiny random Llama.

Batch 2. The model (or its weights under the same name) changes between two runs of ``lola niah``
and ``lola linearize``; a resume names the same content by another path; records of
``samples.jsonl`` that are well typed but contradict the run (a key given twice, a score its own
prediction denies, a depth this sample never had); a variant's budgets file rewritten; ``lola
calibrate`` and ``lola perplexity`` interrupted over an earlier output, or run again with other
options.

Batch 3. The other resumable commands and records taken on trust: ``probe.jsonl`` records given
twice, edited, of another method, length or seed; ``lola sweep`` run again with other options (its
``sweep.json`` would be replaced) or on an edited ``prose.txt``; ``samples.jsonl`` records
stripped of the fields that expose an edit, or of another seed, a ``results.json`` of another run
or with its inputs removed; ``--overwrite`` and ``--from-lora`` of ``lola linearize``; and
folders renamed between a run and its resume (niah, probe, sweep, linearize, fit-scorer).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Iterator

from ..builders import (
    EXPORT,
    LINEARIZE,
    LOLA,
    NIAH,
    PPL,
    PROSE,
    budgets_file,
    described,
    edit_json,
    first_ok,
    fit,
    hay,
    interrupt_after,
    loads,
    niah,
    other_weights,
    patched,
    probe,
    results,
    samples,
    scripted,
    status,
    sweep,
)
from ..harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, export, in_batch, intact, refuse


@contextmanager
def interrupted_after(calls: int) -> Iterator[None]:
    """``lola.models.load`` gives the tiny model whose generate() is interrupted (Ctrl-C) after ``calls`` calls."""
    from lola.models import tiny_random

    count = [0]

    def load(name, **kwargs):
        model, tok = tiny_random()
        generate = model.generate

        def scripted(*args, **kw):
            count[0] += 1
            if count[0] > calls:
                raise KeyboardInterrupt
            return generate(*args, **kw)

        model.generate = scripted
        return model, tok

    with patched("lola.models", "load", load):
        yield


def _first_ok(result, what: str = "the first run") -> None:
    if result.status != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


def _then(first: list[str], second: list[str], interrupt: bool = False):
    """Run ``niah FIRST`` (interrupted after one sample if asked), protect the folder, run ``niah SECOND``."""

    def run(ctx: Ctx):
        if interrupt:
            with interrupted_after(1):
                done = niah(ctx, "r", *first)
            if done.status != 130:
                raise RuntimeError(f"the interrupted run did not stop: {done!r}")
        else:
            _first_ok(niah(ctx, "r", *first))
        ctx.protect(ctx.path("r"))
        return niah(ctx, "r", *second)

    return run


NEEDLE = ["--needle", "The code of {key} is {value}.", "--question", "What is the code of {key}?"]


def _seeded(edit):
    """A finished run whose samples.jsonl is then edited by ``edit(records) -> records``, run again."""

    def run(ctx: Ctx):
        _first_ok(niah(ctx, "r"))
        path = ctx.path("r") / "samples.jsonl"
        records = edit([json.loads(line) for line in path.read_text().splitlines()])
        path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in records))
        return niah(ctx, "r")

    return run


def _foreign_method(records):
    return records + [{**records[0], "method": "full", "score": 1.0}]


def _other_length(records):
    return records + [{**records[0], "length": 800, "score": 1.0}]


def _duplicate(records):
    return records + [{**records[0], "score": 1.0 - records[0]["score"]}]


def _summary_lacks(method: str, length: str | None = None):
    def check(result, ctx):
        summary = results(ctx)["summary"]
        if length is None:
            ensure(method not in summary, f"the summary reports method {method!r}, which this run never ran (from a pre-seeded record)")
        else:
            ensure(length not in summary.get(method, {}), f"the summary reports length {length}, which this run never ran (from a pre-seeded record)")

    return check


def _duplicate_kept_first(result, ctx):
    summary = results(ctx)["summary"]["window"]["400"]
    first = samples(ctx)[0]["score"]
    ensure(
        summary["accuracy"] == 100 * first,
        f"a duplicated record replaced the first: accuracy {summary['accuracy']} from the copy, {100 * first} from the sample run",
    )


def _accuracy_at_most_100(result, ctx):
    acc = results(ctx)["summary"]["window"]["400"]["accuracy"]
    ensure(acc <= 100, f"accuracy {acc}% reported from a record with score 7")


def _rewrite_first(**changes):
    def edit(records):
        first = {**records[0], **changes}
        return [json.dumps(first).replace('"__nan__"', "NaN"), *records[1:]]

    return edit


def _haystack_link_same_content(ctx: Ctx):
    hay(ctx)
    _first_ok(niah(ctx, "r", "--haystack-file", str(ctx.path("hay.txt"))))
    hay(ctx, "copy.txt")
    ctx.path("hay.txt").unlink()
    ctx.path("hay.txt").symlink_to(ctx.path("copy.txt"))
    return niah(ctx, "r", "--haystack-file", str(ctx.path("hay.txt")))


def _interrupted_then_batched(ctx: Ctx):
    with interrupted_after(1):
        niah(ctx, "r", "--samples", "2")
    return niah(ctx, "r", "--samples", "2", "--batch-size", "2")


def _two_distinct_samples(result, ctx):
    got = sorted((r["method"], r["length"], r["index"]) for r in samples(ctx))
    ensure(got == [("window", 400, 0), ("window", 400, 1)], f"samples.jsonl holds {got}")
    ensure(results(ctx)["summary"]["window"]["400"]["samples"] == 2, "the summary does not count both samples")


def _linearize_then(first: list[str], second: list[str]):
    def run(ctx: Ctx):
        out = str(ctx.path("lin"))
        _first_ok(cli([*LINEARIZE, "--out", out, *first]))
        ctx.protect(ctx.path("lin"))
        return cli([*LINEARIZE, "--out", out, *second])

    return run


def _retrained_after_checkpoint_deleted(ctx: Ctx):
    text = ctx.write("a.txt", PROSE)
    out = ctx.path("lin")
    _first_ok(cli([*LINEARIZE, "--text", str(text), "--out", str(out)]))
    ctx.first_maps = (out / "feature_maps.safetensors").read_bytes()
    for name in ("checkpoint.pt", "checkpoint.pt.sha256"):
        (out / name).unlink()
    text.write_text("Entirely other words about mountains and snow and quiet valleys. " * 80)
    return cli([*LINEARIZE, "--text", str(text), "--out", str(out)])


def _maps_retrained(result, ctx):
    ensure((ctx.path("lin") / "feature_maps.safetensors").read_bytes() != ctx.first_maps, "the maps were not retrained on the new text")


STAGE2 = ["linearize", "--quick", "--stage", "2", "--checkpoint-every", "1"]


def _stage2_over_retrained_stage1(ctx: Ctx):
    out = str(ctx.path("lin"))
    _first_ok(cli([*LINEARIZE, "--out", out]), "stage 1")
    _first_ok(cli([*STAGE2, "--stage2-steps", "2", "--out", out]), "stage 2")
    # (stage 1 over adapters made on its maps deletes them: asked for by --overwrite since round three)
    _first_ok(cli([*LINEARIZE, "--out", out, "--steps", "4", "--overwrite"]), "stage 1 again, two steps more")
    return cli([*STAGE2, "--stage2-steps", "3", "--out", out])


def _stage2_restarted(result, ctx):
    if "resuming stage 2" in result.out:
        raise CaseFailure("stage 2 resumed from its checkpoint, which started from the earlier stage-1 maps (the retrained maps were ignored)")


def _ppl_replaced(ctx: Ctx):
    text = str(hay(ctx))
    _first_ok(cli([*PPL, "--text", text, "--out", str(ctx.path("p.json"))]))
    return cli([*PPL, "--text", text, "--lengths", "96", "--out", str(ctx.path("p.json"))])


def _ppl_lengths_96(result, ctx):
    saved = json.loads(ctx.path("p.json").read_text())
    ensure(saved["run"]["lengths"] == [96], f"p.json holds lengths {saved['run']['lengths']}")


def _ok(result, what: str = "the first run") -> None:
    if result.status != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


def _no_temp_files(folder) -> None:
    from lola.io.outputs import TEMP_PREFIX

    left = [p.name for p in folder.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    ensure(not left, f"temporary files left behind: {left}")


def _niah_model_changed(ctx: Ctx):
    """Interrupted after 1 of 2 samples; resumed where ``--model`` (same name) now loads other weights."""
    with loads(scripted(on_generate=interrupt_after(1))):
        first = niah(ctx, "r", "--samples", "2")
    if first.status != 130:
        raise RuntimeError(f"the interrupted run did not stop: {first!r}")
    with loads(other_weights(1)):
        return niah(ctx, "r", "--samples", "2")


def _linearize_model_changed(ctx: Ctx):
    """Stage 1 trained 2 steps; run again to 4 steps where ``--model`` now loads other weights."""
    out = str(ctx.path("lin"))
    _ok(cli([*LINEARIZE, "--out", out]))
    with loads(other_weights(1)):
        return cli([*LINEARIZE, "--steps", "4", "--out", out])


def _described(what: str):
    def check(result, ctx):
        raise CaseFailure(what)

    return check


def _seeded_line(edit_line):
    """A finished one-sample run whose samples.jsonl line is rewritten by ``edit_line(text) -> text``; run again."""

    def run(ctx: Ctx):
        _ok(niah(ctx, "r"))
        path = ctx.path("r") / "samples.jsonl"
        path.write_text(edit_line(path.read_text().splitlines()[0]) + "\n")
        return niah(ctx, "r")

    return run


def _score_twice(line: str) -> str:
    rec = json.loads(line)
    return '{"score": ' + json.dumps(1.0 - rec["score"]) + ", " + line[1:]


def _summary_counts_first_score(result, ctx):
    acc = results(ctx)["summary"]["window"]["400"]["accuracy"]
    raise CaseFailure(f"accepted a record with 'score' given twice; the summary says {acc}% from the last of the two")


def _score_denied(line: str) -> str:
    rec = json.loads(line)
    rec.update(score=1.0, prediction="no digits here")
    return json.dumps(rec)


def _score_matches_prediction(result, ctx):
    from lola.eval.niah import string_match_all

    rec = samples(ctx)[0]
    acc = results(ctx)["summary"]["window"]["400"]["accuracy"]
    expected = 100 * string_match_all(rec["prediction"], rec["answers"])
    ensure(acc == expected, f"the summary reports {acc}% from a record whose prediction {rec['prediction']!r} holds none of {rec['answers']}")


def _interrupted_then_foreign_depth(ctx: Ctx):
    """2 samples (depths 0.25, 0.75) interrupted after one; the record of sample 0 replaced by
    a well-typed one at depth 0.5 (sample 0 of a one-sample run), score 1."""
    with loads(scripted(on_generate=interrupt_after(1))):
        niah(ctx, "r", "--samples", "2")
    path = ctx.path("r") / "samples.jsonl"
    rec = json.loads(path.read_text().splitlines()[0])
    rec.update(depth=0.5, score=1.0)
    path.write_text(json.dumps(rec) + "\n")
    return niah(ctx, "r", "--samples", "2")


def _depths_of_this_run(result, ctx):
    depths = sorted(r["depth"] for r in samples(ctx))
    ensure(depths == [0.25, 0.75], f"accepted; samples.jsonl now holds depths {depths}, this run's are [0.25, 0.75]")


def _haystack_other_spelling(ctx: Ctx):
    hay(ctx)
    _ok(niah(ctx, "r", "--haystack-file", "hay.txt"))
    return niah(ctx, "r", "--haystack-file", "./hay.txt")


def _one_sample_kept(result, ctx):
    ensure(len(samples(ctx)) == 1, f"samples.jsonl holds {len(samples(ctx))} samples")


def _linearize_text_copy(ctx: Ctx):
    """Stage 1 on a.txt (2 steps); run to 4 steps with --text b.txt, a copy with the same bytes."""
    ctx.write("a.txt", PROSE)
    ctx.write("b.txt", PROSE)
    out = str(ctx.path("lin"))
    _ok(cli([*LINEARIZE, "--text", "a.txt", "--out", out]))
    return cli([*LINEARIZE, "--steps", "4", "--text", "b.txt", "--out", out])


def _variant_budgets_rewritten(ctx: Ctx):
    config = ctx.write("opts.yaml", "variants:\n  cal:\n    budgets: b.json\n")
    budgets_file(ctx.path("b.json"), uniform=8, sizes=[[16, 0], [8, 8]])
    argv = [*LOLA, "--config", str(config), "--out", str(ctx.path("r"))]
    _ok(cli(argv))
    budgets_file(ctx.path("b.json"), uniform=8, sizes=[[0, 16], [8, 8]])
    ctx.protect(ctx.path("r"))
    return cli(argv)


CALIBRATE = ["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1"]


def _calibrate_interrupted(ctx: Ctx):
    out = str(ctx.path("b.json"))
    _ok(cli([*CALIBRATE, "--out", out]))
    ctx.protect(ctx.path("b.json"))
    with loads(scripted(on_forward=interrupt_after(0))):
        return cli([*CALIBRATE, "--sparse-size", "64", "--out", out])


def _calibrate_again(ctx: Ctx):
    out = str(ctx.path("b.json"))
    _ok(cli([*CALIBRATE, "--out", out]))
    return cli([*CALIBRATE, "--sparse-size", "32", "--out", out])


def _uniform_32(result, ctx):
    data = json.loads(ctx.path("b.json").read_text())
    ensure(result.status == 0 and data["uniform_sparse_size"] == 32, f"exit {result.status}, b.json holds uniform {data.get('uniform_sparse_size')}")


def _perplexity_interrupted(ctx: Ctx):
    text = str(hay(ctx))
    out = str(ctx.path("p.json"))
    _ok(cli([*PPL, "--text", text, "--out", out]))
    ctx.protect(ctx.path("p.json"))
    with loads(scripted(on_forward=interrupt_after(0))):
        return cli([*PPL, "--text", text, "--windows", "2", "--out", out])


def _perplexity_other_windows(ctx: Ctx):
    text = str(ctx.write("t.txt", PROSE * 3))
    out = str(ctx.path("p.json"))
    _ok(cli([*PPL, "--text", text, "--out", out]))
    return cli([*PPL, "--text", text, "--windows", "2", "--out", out])


def _two_windows(result, ctx):
    data = json.loads(ctx.path("p.json").read_text())
    ensure(result.status == 0, f"exit {result.status}")
    ensure(data["run"]["windows"] == 2 and data["results"]["full"]["64"]["windows"] == 2, f"p.json holds {data['run']['windows']} windows")


def _export_again_other_seed(ctx: Ctx):
    out = str(ctx.path("tasks"))
    _ok(export(["--out", out, *EXPORT]))
    return export(["--out", out, *EXPORT, "--seed", "1"])


def _export_consistent(result, ctx):
    from lola.integrations.lm_eval.niah import exported_files

    tasks = ctx.path("tasks")
    data, utils = exported_files(tasks / "lola_niah_single_1.yaml")
    ensure(data.is_file() and utils.is_file(), "the YAML names files that are not there")
    ensure('"seed": 1' in (tasks / "lola_niah_single_1.yaml").read_text(), "the YAML does not describe the second export")
    left = sorted(p.name for p in tasks.iterdir() if not p.name.startswith(".lola-"))  # (lola's record of its files aside)
    ensure(len(left) == 3, f"the folder holds {left}: files of the first export were left behind")


def _interrupted_then_fewer(ctx: Ctx):
    with loads(scripted(on_generate=interrupt_after(1))):
        niah(ctx, "r", "--samples", "2")
    ctx.protect(ctx.path("r"))
    return niah(ctx, "r", "--samples", "1")


def _out_other_spelling(ctx: Ctx):
    _ok(niah(ctx, "r"))
    return cli([*NIAH, "--out", os.path.join(str(ctx.dir), ".", "r") + os.sep])


def _samples_crlf(ctx: Ctx):
    _ok(niah(ctx, "r"))
    path = ctx.path("r") / "samples.jsonl"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    return niah(ctx, "r")


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
    Case(
        "resume-niah-interrupted-window-changed",
        "resume",
        "lola niah interrupted after 1 of 2 samples, resumed with --window 16",
        _then(["--samples", "2"], ["--samples", "2", "--window", "16"], interrupt=True),
        refuse("--window"),
    ),
    Case(
        "resume-niah-interrupted-max-new-tokens-changed",
        "resume",
        "lola niah interrupted after 1 of 2 samples, resumed with --max-new-tokens 2",
        _then(["--samples", "2"], ["--samples", "2", "--max-new-tokens", "2"], interrupt=True),
        refuse("--max-new-tokens"),
    ),
    Case("resume-niah-seed-changed", "resume", "a finished lola niah run resumed with --seed 1", _then([], ["--seed", "1"]), refuse("--seed")),
    Case(
        "resume-niah-needle-changed",
        "resume",
        "a finished run with a custom --needle resumed with another needle",
        _then(NEEDLE, ["--needle", "The pin of {key} is {value}.", "--question", "What is the code of {key}?"]),
        refuse("--needle"),
    ),
    Case(
        "resume-niah-lengths-added",
        "resume",
        "a finished run (--lengths 400) resumed with --lengths 400 500",
        _then([], ["--lengths", "400", "500"]),
        refuse("--lengths"),
    ),
    Case(
        "resume-niah-record-of-foreign-method",
        "resume",
        "samples.jsonl pre-seeded with a well-formed record of method 'full', which the run does not have",
        _seeded(_foreign_method),
        either("samples.jsonl", check=_summary_lacks("full")),
    ),
    Case(
        "resume-niah-record-of-other-length",
        "resume",
        "samples.jsonl pre-seeded with a well-formed record of length 800, which the run does not have",
        _seeded(_other_length),
        either("samples.jsonl", check=_summary_lacks("window", "800")),
    ),
    Case(
        "resume-niah-duplicate-record",
        "resume",
        "samples.jsonl holds the same (method, length, index) twice with different scores",
        _seeded(_duplicate),
        either("samples.jsonl", check=_duplicate_kept_first),
    ),
    Case(
        "resume-niah-score-out-of-range",
        "resume",
        "a samples.jsonl record with score 7",
        _seeded(_rewrite_first(score=7)),
        either("samples.jsonl", check=_accuracy_at_most_100),
    ),
    Case(
        "resume-niah-depth-nan", "resume", "a samples.jsonl record with depth NaN", _seeded(_rewrite_first(depth="__nan__")), refuse("samples.jsonl", "depth")
    ),
    Case("resume-niah-score-a-string", "resume", 'a samples.jsonl record with score "1"', _seeded(_rewrite_first(score="1")), refuse("samples.jsonl", "score")),
    Case(
        "resume-niah-haystack-now-a-link-same-content",
        "resume",
        "a finished run whose --haystack-file became a link to a copy with the same bytes",
        _haystack_link_same_content,
        accept(),
    ),
    Case(
        "resume-niah-batch-size-changed",
        "resume",
        "lola niah interrupted after 1 of 2 samples, resumed with --batch-size 2 (not part of the run)",
        _interrupted_then_batched,
        accept(_two_distinct_samples),
    ),
    Case(
        "resume-linearize-window-changed",
        "resume",
        "lola linearize --quick --stage 1 finished, run again with --window 8",
        _linearize_then([], ["--window", "8"]),
        refuse("--window|'window': (16, 8)"),
    ),
    Case(
        "resume-linearize-mixing-changed",
        "resume",
        "lola linearize --quick --stage 1 finished, run again with --mixing lola_authors",
        _linearize_then([], ["--mixing", "lola_authors"]),
        refuse("--mixing|'mixing': ('lolcats', 'lola_authors')"),
    ),
    Case(
        "resume-linearize-checkpoint-gone-text-changed",
        "resume",
        "stage 1 finished on a.txt; checkpoint deleted; a.txt rewritten; run again (must retrain, or say that training "
        "again over the finished run needs --overwrite: round three's owned folders)",
        _retrained_after_checkpoint_deleted,
        either("--text|--overwrite", check=_maps_retrained),
    ),
    Case(
        "resume-linearize-stage2-over-retrained-stage1",
        "resume",
        "stage 1, stage 2 (2 steps), stage 1 again to 4 steps (new maps), stage 2 to 3 steps",
        _stage2_over_retrained_stage1,
        either("stage", check=_stage2_restarted),
        timeout=240,
    ),
    Case(
        "resume-perplexity-out-other-run",
        "resume",
        "lola perplexity --out p.json, then again with --lengths 96 (its own file: replaced)",
        _ppl_replaced,
        accept(_ppl_lengths_96),
    ),
]

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
    Case(
        "r2-niah-model-weights-changed",
        "resume",
        "lola niah interrupted after 1 of 2 samples; resumed while --model (same name) loads other weights",
        _niah_model_changed,
        refuse("--model", check=_described("accepted: samples.jsonl now mixes samples of two models under one run")),
    ),
    Case(
        "r2-linearize-model-weights-changed",
        "resume",
        "lola linearize stage 1 (2 steps) done; run to 4 steps while --model loads other weights (same geometry)",
        _linearize_model_changed,
        refuse(
            "--model|model", check=_described("accepted: training went on from a checkpoint made on another model's teacher (same geometry, other weights)")
        ),
        timeout=180,
    ),
    Case(
        "r2-niah-record-score-given-twice",
        "resume",
        'a samples.jsonl record with "score" twice (the flipped score first, the real one last)',
        _seeded_line(_score_twice),
        refuse("samples.jsonl", check=_summary_counts_first_score),
    ),
    Case(
        "r2-niah-record-score-its-prediction-denies",
        "resume",
        "a samples.jsonl record with score 1.0 whose prediction holds none of its answers",
        _seeded_line(_score_denied),
        either("samples.jsonl", check=_score_matches_prediction),
    ),
    Case(
        "r2-niah-record-depth-of-another-run",
        "resume",
        "2 samples interrupted after one; that record rewritten to depth 0.5 (this run's sample 0 is at 0.25), score 1",
        _interrupted_then_foreign_depth,
        either("samples.jsonl|depth", check=_depths_of_this_run),
    ),
    Case(
        "r2-niah-haystack-path-spelled-otherwise",
        "resume",
        "a finished run with --haystack-file hay.txt resumed with --haystack-file ./hay.txt (the same file)",
        _haystack_other_spelling,
        accept(_one_sample_kept),
    ),
    Case(
        "r2-linearize-text-copy-other-path",
        "resume",
        "stage 1 on a.txt (2 steps), run to 4 steps with --text b.txt holding the same bytes",
        _linearize_text_copy,
        accept(status(0)),
        timeout=180,
    ),
    Case(
        "r2-niah-variant-budgets-rewritten",
        "resume",
        "a finished run whose variant's budgets file (variants.cal.budgets) is rewritten, run again",
        _variant_budgets_rewritten,
        refuse("variants.cal.budgets|b.json"),
    ),
    Case(
        "r2-niah-interrupted-resumed-with-fewer-samples",
        "resume",
        "lola niah interrupted after 1 of 2 samples, resumed with --samples 1",
        _interrupted_then_fewer,
        refuse("--samples"),
    ),
    Case(
        "r2-niah-out-spelled-otherwise",
        "resume",
        "a finished run resumed with --out given as an absolute path with ./ and a trailing slash",
        _out_other_spelling,
        accept(_one_sample_kept),
    ),
    Case(
        "r2-niah-samples-crlf",
        "resume",
        "a finished run whose samples.jsonl was rewritten with CRLF line ends, run again",
        _samples_crlf,
        either("samples.jsonl", check=_one_sample_kept),
    ),
    Case(
        "r2-calibrate-interrupted-over-budgets",
        "resume",
        "lola calibrate wrote b.json; a second calibrate (--sparse-size 64) interrupted at its first forward",
        _calibrate_interrupted,
        intact(lambda r, ctx: (ensure(r.status == 130, f"exit {r.status}"), _no_temp_files(ctx.dir))),
    ),
    Case(
        "r2-calibrate-again-other-sparse-size",
        "resume",
        "lola calibrate --out b.json, then again with --sparse-size 32 (its own file: replaced)",
        _calibrate_again,
        accept(_uniform_32),
    ),
    Case(
        "r2-perplexity-interrupted-over-results",
        "resume",
        "lola perplexity --out p.json done; a second run (--windows 2) interrupted at its first forward",
        _perplexity_interrupted,
        intact(lambda r, ctx: (ensure(r.status == 130, f"exit {r.status}"), _no_temp_files(ctx.dir))),
    ),
    Case(
        "r2-perplexity-other-windows-same-out",
        "resume",
        "lola perplexity --out p.json, then --windows 2 into the same file (replaced, not merged)",
        _perplexity_other_windows,
        accept(_two_windows),
    ),
    Case(
        "r2-export-again-other-seed",
        "resume",
        "export-niah into its earlier folder with --seed 1: the YAML names the new prompts, the old ones removed",
        _export_again_other_seed,
        accept(_export_consistent),
    ),
]


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------


def _probe_summary(ctx: Ctx, out: str = "p") -> dict:
    return json.loads((ctx.path(out) / "probe.json").read_text())["summary"]


def _probe_records(ctx: Ctx, out: str = "p") -> list[dict]:
    return [json.loads(line) for line in (ctx.path(out) / "probe.jsonl").read_text().splitlines() if line.strip()]


def _probe_edited(edit):
    """A finished probe whose probe.jsonl is then edited by ``edit(records) -> records``, run again."""

    def run(ctx: Ctx):
        first_ok(probe(ctx))
        ctx.first = _probe_summary(ctx)
        path = ctx.path("p") / "probe.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in edit(_probe_records(ctx))))
        return probe(ctx)

    return run


def _as_first_probe(result, ctx) -> None:
    now, first = _probe_summary(ctx), ctx.first
    cell, own = now.get("hybrid", {}).get("400", {}), first["hybrid"]["400"]
    if (cell.get("accuracy"), cell.get("samples")) != (own["accuracy"], own["samples"]):
        raise CaseFailure(
            f"probe.json says {cell.get('accuracy')}% over {cell.get('samples')} samples; the run's own record: {own['accuracy']}% over {own['samples']}"
        )
    ensure(now == first, "probe.json now summarises another run's records: its per-layer shares and masses differ from this run's")


def _probe_lacks(key: str, length: bool = False):
    def check(result, ctx):
        summary = _probe_summary(ctx)
        found = "800" in summary.get("hybrid", {}) if length else key in summary
        ensure(not found, f"probe.json reports {key}, which this run never probed (from an edited record)")

    return check


def _probe_of_another_seed(ctx: Ctx):
    """probe.jsonl replaced by the records of the same probe with --seed 1, run again with seed 0."""
    first_ok(probe(ctx))
    ctx.first = _probe_summary(ctx)
    first_ok(probe(ctx, "q", "--seed", "1"))
    (ctx.path("p") / "probe.jsonl").write_bytes((ctx.path("q") / "probe.jsonl").read_bytes())
    return probe(ctx)


def _probe_moved(ctx: Ctx):
    """lola probe of 2 prompts interrupted after one; the folder renamed; resumed under its new name."""
    with loads(scripted(on_generate=interrupt_after(1))):
        done = probe(ctx, "p", "--samples", "2")
    if done.status != 130:
        raise RuntimeError(f"the interrupted probe did not stop: {done!r}")
    ctx.first_line = (ctx.path("p") / "probe.jsonl").read_text().splitlines()[0]
    ctx.path("p").rename(ctx.path("moved"))
    return probe(ctx, "moved", "--samples", "2")


def _two_prompts_probed(result, ctx) -> None:
    records = _probe_records(ctx, "moved")
    ensure(sorted(r["index"] for r in records) == [0, 1], f"probe.jsonl holds prompts {[r['index'] for r in records]}")
    ensure((ctx.path("moved") / "probe.jsonl").read_text().splitlines()[0] == ctx.first_line, "the record made before the move was replaced")
    ensure(_probe_summary(ctx, "moved")["hybrid"]["400"]["samples"] == 2, "probe.json does not count both prompts")


def _sweep_then(second: list[str], first: list[str] = ()):
    """A finished sweep (``first`` options added), its folder protected, then run again with ``second``."""

    def run(ctx: Ctx):
        first_ok(sweep(ctx, "s", *first))
        ctx.protect(ctx.path("s"))
        return sweep(ctx, "s", *first, *second)

    return run


def _sweep_prose_edited(ctx: Ctx):
    """A finished sweep on the prose haystack at 2048 tokens (prose.txt, which lola writes),
    prose.txt then edited, run again."""
    prose_sweep = ["--haystacks", "prose", "--lengths", "2048"]
    first_ok(sweep(ctx, "s", *prose_sweep))
    prose = ctx.path("s") / "prose.txt"
    prose.write_text(prose.read_text() + " An extra sentence nobody wrote before.")
    return sweep(ctx, "s", *prose_sweep)


def _sweep_moved(ctx: Ctx):
    """lola sweep interrupted after two of its four methods; the folder renamed; resumed there."""
    with loads(scripted(on_generate=interrupt_after(2))):
        done = sweep(ctx)
    if done.status != 130:
        raise RuntimeError(f"the interrupted sweep did not stop: {done!r}")
    ctx.path("s").rename(ctx.path("moved"))
    return sweep(ctx, "moved")


def _four_methods_swept(result, ctx) -> None:
    rows = json.loads((ctx.path("moved") / "sweep.json").read_text())["rows"]
    methods = sorted(r["method"] for r in rows)
    ensure(len(methods) == 4 and len(set(methods)) == 4, f"sweep.json holds rows of {methods}")
    ensure(all(r["samples"] == 1 for r in rows), "a method counts other than one sample")


def _niah_line(edit_record):
    """A finished one-sample run whose samples.jsonl record is rewritten by ``edit_record(record, ctx)``; run again."""

    def run(ctx: Ctx):
        first_ok(niah(ctx, "r"))
        path = ctx.path("r") / "samples.jsonl"
        ctx.own = json.loads(path.read_text().splitlines()[0])
        path.write_text(json.dumps(edit_record(dict(ctx.own), ctx)) + "\n")
        return niah(ctx, "r")

    return run


def _required_only_flipped(rec: dict, ctx: Ctx) -> dict:
    keep = {k: rec[k] for k in ("method", "length", "index", "depth", "score", "cache_bytes")}
    keep["score"] = 1.0 - rec["score"]
    return keep


def _accuracy_of_own_sample(result, ctx) -> None:
    acc = results(ctx)["summary"]["window"]["400"]["accuracy"]
    ensure(
        acc == 100 * ctx.own["score"],
        f"the summary says {acc}% from a record stripped of its prediction and answers; the sample scored {100 * ctx.own['score']}%",
    )


def _record_of_seed_1(rec: dict, ctx: Ctx) -> dict:
    first_ok(niah(ctx, "q", "--seed", "1"))
    return json.loads((ctx.path("q") / "samples.jsonl").read_text().splitlines()[0])


def _answers_of_this_run(result, ctx) -> None:
    got = samples(ctx)[0]["answers"]
    ensure(got == ctx.own["answers"], f"samples.jsonl now holds a sample with answers {got}; this run's sample asks for {ctx.own['answers']}")


def _inputs_dropped_haystack_changed(ctx: Ctx):
    hay(ctx)
    first_ok(niah(ctx, "r", "--haystack-file", str(ctx.path("hay.txt"))))
    edit_json(ctx.path("r") / "results.json", lambda d: d.pop("inputs"))
    hay(ctx, text="Snow falls. Rivers freeze. Winds blow. Owls call. " * 80)
    ctx.protect(ctx.path("r") / "samples.jsonl")
    return niah(ctx, "r", "--haystack-file", str(ctx.path("hay.txt")))


def _results_of_seed_1(ctx: Ctx):
    """r (seed 0) finished; q (seed 1) finished; r's results.json replaced by q's; r resumed with --seed 1."""
    first_ok(niah(ctx, "r"))
    first_ok(niah(ctx, "q", "--seed", "1"))
    ctx.own = json.loads((ctx.path("q") / "samples.jsonl").read_text().splitlines()[0])  # what seed 1's sample asks
    (ctx.path("r") / "results.json").write_bytes((ctx.path("q") / "results.json").read_bytes())
    return niah(ctx, "r", "--seed", "1")


def _niah_renamed(ctx: Ctx):
    with loads(scripted(on_generate=interrupt_after(1))):
        done = niah(ctx, "r", "--samples", "2")
    if done.status != 130:
        raise RuntimeError(f"the interrupted run did not stop: {done!r}")
    ctx.first_line = (ctx.path("r") / "samples.jsonl").read_text().splitlines()[0]
    ctx.path("r").rename(ctx.path("r2"))
    return niah(ctx, "r2", "--samples", "2")


def _two_samples_in_r2(result, ctx) -> None:
    got = sorted((r["method"], r["index"]) for r in samples(ctx, "r2"))
    ensure(got == [("window", 0), ("window", 1)], f"samples.jsonl holds {got}")
    ensure((ctx.path("r2") / "samples.jsonl").read_text().splitlines()[0] == ctx.first_line, "the sample made before the rename was redone")


def _linearize_overwrite_window(ctx: Ctx):
    out = str(ctx.path("lin"))
    first_ok(cli([*LINEARIZE, "--out", out]))
    return cli([*LINEARIZE, "--window", "8", "--overwrite", "--out", out])


def _window_8_written(result, ctx) -> None:
    window = json.loads((ctx.path("lin") / "lola_config.json").read_text())["lola_config"]["window"]
    ensure(window == 8, f"lola_config.json holds window {window} after --window 8 --overwrite")


def _linearize_overwrite_after_stage2(ctx: Ctx):
    out = str(ctx.path("lin"))
    first_ok(cli([*LINEARIZE, "--out", out]), "stage 1")
    first_ok(cli([*STAGE2, "--stage2-steps", "2", "--out", out]), "stage 2")
    return cli([*LINEARIZE, "--overwrite", "--out", out])


def _adapters_gone(result, ctx) -> None:
    from lola.pretrained.folder import read_feature_maps

    left = sorted(p.name for p in ctx.path("lin").iterdir())
    ensure(not (ctx.path("lin") / "lora.safetensors").exists(), f"the stage-2 adapters made on the old maps are still there: {left}")
    ensure(read_feature_maps(ctx.path("lin")).lora is None, "the folder still reads as a stage-2 folder")


def _stage2_from_lora_without_adapters(ctx: Ctx):
    first_ok(cli([*LINEARIZE, "--out", str(ctx.path("lin"))]))
    ctx.protect(ctx.path("lin"))
    return cli([*STAGE2, "--stage2-steps", "2", "--from-lora", "--feature-maps", str(ctx.path("lin")), "--out", str(ctx.path("lin2"))])


def _linearize_renamed(ctx: Ctx):
    first_ok(cli([*LINEARIZE, "--out", str(ctx.path("lin"))]))
    ctx.path("lin").rename(ctx.path("lin2"))
    return cli([*LINEARIZE, "--steps", "4", "--out", str(ctx.path("lin2"))])


def _fit_moved(ctx: Ctx):
    """lola fit-scorer interrupted after its first chunk (f/s.safetensors.partial); f renamed to
    g; the same command run with --out g/s.safetensors."""
    with loads(scripted(on_forward=interrupt_after(1))):
        done = fit(ctx, "f/s.safetensors")
    if done.status != 130 or not ctx.path("f/s.safetensors.partial").is_file():
        raise RuntimeError(f"the interrupted fit did not stop after a checkpoint: {done!r}")
    ctx.path("f").rename(ctx.path("g"))
    return fit(ctx, "g/s.safetensors")


def _fit_resumed(result, ctx) -> None:
    ensure(result.status == 0, f"exit {result.status}")
    ensure("resuming after 1" in result.out, "the fit started anew instead of resuming from its checkpoint")
    ensure(ctx.path("g/s.safetensors").is_file() and not ctx.path("g/s.safetensors.partial").exists(), "no scorer, or the checkpoint left behind")


BATCH_3 = [
    Case(
        "r3-probe-record-twice-other-score",
        "resume",
        "a finished probe whose probe.jsonl gives its one record twice, the copy scoring 1",
        _probe_edited(lambda recs: [*recs, {**recs[0], "score": 1.0 - recs[0]["score"]}]),
        either("probe.jsonl", check=_as_first_probe),
    ),
    Case(
        "r3-probe-record-score-7",
        "resume",
        "a finished probe whose record's score is edited to 7",
        _probe_edited(lambda recs: [{**recs[0], "score": 7.0}]),
        either("probe.jsonl", check=_as_first_probe),
    ),
    Case(
        "r3-probe-record-of-foreign-method",
        "resume",
        "a finished probe (hybrid) whose probe.jsonl gains a well-formed record of method lola-sre",
        _probe_edited(lambda recs: [*recs, {**recs[0], "method": "lola-sre"}]),
        either("probe.jsonl", check=_probe_lacks("lola-sre")),
    ),
    Case(
        "r3-probe-record-of-other-length",
        "resume",
        "a finished probe (400 tokens) whose probe.jsonl gains a well-formed record of length 800",
        _probe_edited(lambda recs: [*recs, {**recs[0], "length": 800}]),
        either("probe.jsonl", check=_probe_lacks("length 800", length=True)),
    ),
    Case(
        "r3-probe-record-without-layers",
        "resume",
        "a finished probe whose record lost its 'layers' entry",
        _probe_edited(lambda recs: [{k: v for k, v in recs[0].items() if k != "layers"}]),
        refuse("probe.jsonl"),
    ),
    Case(
        "r3-probe-records-of-another-seed",
        "resume",
        "a finished probe (seed 0) whose probe.jsonl is replaced by the records of the same probe with --seed 1",
        _probe_of_another_seed,
        either("probe.jsonl", check=_as_first_probe),
    ),
    Case(
        "r3-probe-again-other-max-new-tokens",
        "resume",
        "a finished probe run again with --max-new-tokens 2",
        lambda ctx: (first_ok(probe(ctx)), ctx.protect(ctx.path("p")), probe(ctx, "p", "--max-new-tokens", "2"))[2],
        refuse("--max-new-tokens|max_new_tokens"),
    ),
    Case(
        "r3-probe-resumed-after-rename",
        "resume",
        "lola probe interrupted after 1 of 2 prompts; the folder renamed; resumed there",
        _probe_moved,
        accept(_two_prompts_probed),
    ),
    Case(
        "r3-sweep-again-other-lengths",
        "resume",
        "a finished lola sweep (--lengths 400) run again into its folder with --lengths 500: sweep.json would lose the 400 rows",
        _sweep_then(["--lengths", "500"]),
        refuse("--lengths|sweep.json"),
    ),
    Case(
        "r3-sweep-again-other-samples",
        "resume",
        "a finished lola sweep run again into its folder with --samples 2",
        _sweep_then(["--samples", "2"]),
        refuse("--samples"),
    ),
    Case(
        "r3-sweep-prose-edited",
        "resume",
        "a finished lola sweep on prose whose prose.txt (written by lola) is then edited; run again",
        _sweep_prose_edited,
        refuse("prose.txt"),
        timeout=180,
    ),
    Case(
        "r3-sweep-resumed-after-rename",
        "resume",
        "lola sweep interrupted after 2 of its 4 methods; the folder renamed; resumed there",
        _sweep_moved,
        accept(_four_methods_swept),
    ),
    Case(
        "r3-niah-record-stripped-and-flipped",
        "resume",
        "a samples.jsonl record cut to its required fields (no prediction, no answers) with the score flipped",
        _niah_line(_required_only_flipped),
        either("samples.jsonl", check=_accuracy_of_own_sample),
    ),
    Case(
        "r3-niah-record-of-another-seed",
        "resume",
        "samples.jsonl of a seed-0 run holding the record of the same sample from a --seed 1 run",
        _niah_line(_record_of_seed_1),
        either("samples.jsonl", check=_answers_of_this_run),
    ),
    Case(
        "r3-niah-record-prompt-beyond-length",
        "resume",
        "a samples.jsonl record of length 400 whose prompt_tokens is 5000",
        _niah_line(lambda rec, ctx: {**rec, "prompt_tokens": 5000}),
        refuse("samples.jsonl", check=described("a record whose prompt is longer than its length was summarised")),
    ),
    Case(
        "r3-niah-inputs-dropped-haystack-changed",
        "resume",
        "results.json's inputs removed by hand, then the --haystack-file rewritten with other text; run again",
        _inputs_dropped_haystack_changed,
        refuse("--haystack-file"),
    ),
    Case(
        "r3-niah-results-of-another-seed",
        "resume",
        "a seed-0 folder whose results.json is replaced by a --seed 1 run's, resumed with --seed 1",
        _results_of_seed_1,
        either("samples.jsonl|results.json", check=_answers_of_this_run),
    ),
    Case(
        "r3-niah-resumed-after-rename",
        "resume",
        "lola niah interrupted after 1 of 2 samples; the folder renamed; resumed under its new name",
        _niah_renamed,
        accept(_two_samples_in_r2),
    ),
    Case(
        "r3-niah-interrupted-then-positions-bounded",
        "resume",
        "lola niah interrupted after 1 of 2 samples, resumed with --positions bounded",
        _then(["--samples", "2"], ["--samples", "2", "--positions", "bounded"], interrupt=True),
        refuse("--positions"),
    ),
    Case(
        "r3-linearize-overwrite-other-window",
        "resume",
        "lola linearize stage 1 finished, then --window 8 --overwrite: trained again with window 8",
        _linearize_overwrite_window,
        accept(_window_8_written),
        timeout=180,
    ),
    Case(
        "r3-linearize-overwrite-after-stage-2",
        "resume",
        "stage 1, stage 2, then stage 1 again with --overwrite: new maps, the old adapters removed",
        _linearize_overwrite_after_stage2,
        accept(_adapters_gone),
        timeout=240,
    ),
    Case(
        "r3-linearize-from-lora-without-adapters",
        "resume",
        "stage 1 finished in lin, then --stage 2 --from-lora --feature-maps lin --out lin2 (lin holds no LoRA adapters)",
        _stage2_from_lora_without_adapters,
        refuse("--from-lora"),
        timeout=180,
    ),
    Case(
        "r3-linearize-resumed-after-rename",
        "resume",
        "lola linearize stage 1 (2 steps) done; the folder renamed; run to 4 steps there",
        _linearize_renamed,
        accept(status(0)),
        timeout=180,
    ),
    Case(
        "r3-fit-scorer-resumed-after-rename",
        "resume",
        "lola fit-scorer interrupted after its first chunk; the folder renamed; the same command with --out in the new folder",
        _fit_moved,
        accept(_fit_resumed),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
