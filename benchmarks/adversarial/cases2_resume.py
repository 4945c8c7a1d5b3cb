"""Batch 2, class 3: resumes that mix inputs.

The model (or its weights under the same name) changes between two runs of ``lola niah`` and
``lola linearize``; a resume names the same content by another path; records of
``samples.jsonl`` that are well typed but contradict the run (a key given twice, a score its
own prediction denies, a depth this sample never had); a variant's budgets file rewritten;
``lola calibrate`` and ``lola perplexity`` interrupted over an earlier output, or run again with
other options.
"""

from __future__ import annotations

import json
import os

from common import EXPORT, LINEARIZE, NIAH, PPL, PROSE, budgets_file, hay, niah, results, samples
from common2 import interrupt_after, loads, other_weights, scripted, status
from harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, export, intact, refuse


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
    argv = [*NIAH[:-1], "lola", "--window", "8", "--sparse-size", "8", "--config", str(config), "--out", str(ctx.path("r"))]
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
    left = sorted(p.name for p in tasks.iterdir())
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


CASES = [
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
