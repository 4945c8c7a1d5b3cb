"""Class 3: resumes that mix inputs.

A results or training folder is interrupted or pre-seeded, then an option, an input file or a
record changes, and the same command runs again: it must be refused naming the option (and
leave the folder as it was), or redo the work correctly. ``lola niah --out``, ``lola linearize
--out`` and ``lola perplexity --out`` on the tiny random Llama.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterator

from common import LINEARIZE, PPL, PROSE, hay, niah, patched, results, samples
from harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, refuse


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
    _first_ok(cli([*LINEARIZE, "--out", out, "--steps", "4"]), "stage 1 again, two steps more")
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


CASES = [
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
    Case(
        "resume-niah-seed-changed",
        "resume",
        "a finished lola niah run resumed with --seed 1",
        _then([], ["--seed", "1"]),
        refuse("--seed"),
    ),
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
        "resume-niah-depth-nan",
        "resume",
        "a samples.jsonl record with depth NaN",
        _seeded(_rewrite_first(depth="__nan__")),
        refuse("samples.jsonl", "depth"),
    ),
    Case(
        "resume-niah-score-a-string",
        "resume",
        'a samples.jsonl record with score "1"',
        _seeded(_rewrite_first(score="1")),
        refuse("samples.jsonl", "score"),
    ),
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
        "stage 1 finished on a.txt; checkpoint deleted; a.txt rewritten; run again (must retrain)",
        _retrained_after_checkpoint_deleted,
        either("--text", check=_maps_retrained),
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
