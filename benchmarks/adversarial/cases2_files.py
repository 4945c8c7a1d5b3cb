"""Batch 2, class 4: files.

Hard links (a ``cp -al`` snapshot resumed, outputs hard-linked to a backup), files replaced
between the check and the write (a foreign file or a link appearing while the command runs),
FIFOs where lola reads a file it trusts (a checkpoint's checksum, the old name of exported
prompts), a forged journal, empty files, a huge sparse file, and names with newlines, spaces
and non-ASCII letters. Every file that was there before must survive unless lola wrote it.
"""

from __future__ import annotations

import json
import os

from common import EXPORT, LINEARIZE, NIAH, PPL, PROSE, budgets_file, hay, niah, saved_cache
from common2 import fifo, hardlink_tree, interrupt_after, loads, scripted, status
from harness import Case, Ctx, accept, cli, either, ensure, export, intact, refuse


def _ok(result, what: str = "the first run") -> None:
    if result.status != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


def _no_temp_files(folder) -> None:
    from lola.io.outputs import TEMP_PREFIX

    left = [p.name for p in folder.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    ensure(not left, f"temporary files left behind: {left}")


def _snapshot_resumed(ctx: Ctx):
    """lola niah interrupted after 1 of 2 samples in r; ``cp -al r snap`` (a hard-linked
    snapshot); the run resumed in snap. The snapshot's source r must not change."""
    with loads(scripted(on_generate=interrupt_after(1))):
        niah(ctx, "r", "--samples", "2")
    hardlink_tree(ctx.path("r"), ctx.path("snap"))
    ctx.protect(ctx.path("r"))
    return niah(ctx, "snap", "--samples", "2")


def _results_replaced_mid_run(ctx: Ctx):
    """While lola niah generates, someone's file takes results.json's place in --out."""

    def swap(n: int) -> None:
        if n == 1:
            path = ctx.path("r") / "results.json"
            path.unlink()
            path.write_text('{"mine": "not lola\'s"}\n')
            ctx.protect(path)

    with loads(scripted(on_generate=swap)):
        return niah(ctx, "r")


def _ppl_out_appears_mid_run(ctx: Ctx):
    """p.json does not exist when lola perplexity checks --out; someone's file appears there
    while it runs."""
    text = str(hay(ctx))

    def appear(n: int) -> None:
        if n == 1:
            ctx.write("p.json", '{"mine": 1}\n')
            ctx.protect(ctx.path("p.json"))

    with loads(scripted(on_forward=appear)):
        return cli([*PPL, "--text", text, "--out", str(ctx.path("p.json"))])


def _calibrate_out_becomes_link(ctx: Ctx):
    """b.json is lola's budgets when lola calibrate checks --out; while it runs, b.json becomes a
    link to someone's precious.json."""
    ctx.write("precious.json", '{"mine": 1}\n')
    ctx.protect(ctx.path("precious.json"))

    def swap(n: int) -> None:
        if n == 1:
            ctx.path("b.json").unlink()
            ctx.path("b.json").symlink_to(ctx.path("precious.json"))

    _ok(cli(["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1", "--out", str(ctx.path("b.json"))]))
    with loads(scripted(on_forward=swap)):
        return cli(["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1", "--out", str(ctx.path("b.json"))])


def _checkpoint_sum_fifo(ctx: Ctx):
    out = ctx.path("lin")
    _ok(cli([*LINEARIZE, "--out", str(out)]))
    (out / "checkpoint.pt.sha256").unlink()
    fifo(out / "checkpoint.pt.sha256")
    return cli([*LINEARIZE, "--steps", "4", "--out", str(out)])


def _export_old_name_fifo(ctx: Ctx):
    fifo(ctx.path("tasks") / "lola_niah_single_1.jsonl")
    return export(["--out", str(ctx.path("tasks")), *EXPORT])


def _exported(result, ctx):
    ensure(result.status == 0, f"exit {result.status}")
    ensure((ctx.path("tasks") / "lola_niah_single_1.yaml").is_file(), "no task YAML was written")


def _forged_journal(ctx: Ctx):
    """A finished run's folder holding someone's notes.txt and a journal (lola's format) that
    renames a temporary file onto notes.txt; the run is resumed."""
    from lola.io.outputs import PENDING_FILE, TEMP_PREFIX

    _ok(niah(ctx, "r"))
    ctx.write("r/notes.txt", "mine")
    ctx.write(f"r/{TEMP_PREFIX}x", "overwritten")
    ctx.write(f"r/{PENDING_FILE}", json.dumps({"renames": [[f"{TEMP_PREFIX}x", "notes.txt"]], "remove": []}))
    ctx.protect(ctx.path("r/notes.txt"))
    return niah(ctx, "r")


def _empty_checkpoint(ctx: Ctx):
    """A checkpoint.pt of 0 bytes with its (correct) sha256 beside it, run again."""
    import hashlib

    out = ctx.path("lin")
    _ok(cli([*LINEARIZE, "--out", str(out)]))
    (out / "checkpoint.pt").write_bytes(b"")
    (out / "checkpoint.pt.sha256").write_text(hashlib.sha256(b"").hexdigest() + "\n")
    ctx.protect(out / "checkpoint.pt")
    return cli([*LINEARIZE, "--steps", "4", "--out", str(out)])


def _huge_sparse_haystack(ctx: Ctx):
    """A haystack of 200 KB of prose, then 8 GiB of holes (a sparse file: no disk used)."""
    path = ctx.write("hay.txt", PROSE * 40)
    with open(path, "r+b") as f:
        f.truncate(8 * 2**30)
    return niah(ctx, "r", "--haystack-file", str(path))


def _hardlinked_output(make_first, make_second, name: str):
    """Run ``make_first`` (writes ``name``), hard-link ``name`` to backup.json, run ``make_second``
    over ``name``: backup.json must keep the first result."""

    def run(ctx: Ctx):
        _ok(make_first(ctx))
        os.link(ctx.path(name), ctx.path("backup.json"))
        ctx.protect(ctx.path("backup.json"))
        return make_second(ctx)

    return run


def _budgets_save_hardlinked(ctx: Ctx):
    from lola import budgets

    path = budgets_file(ctx.path("b.json"))
    b = budgets.load(path)
    b.save(path)
    os.link(path, ctx.path("keep.json"))
    ctx.protect(ctx.path("keep.json"))
    b.model_copy(update={"power": 1.0}).save(path)
    return budgets.load(path).power


def _cache_save_into_snapshot(ctx: Ctx):
    """A saved cache, hard-linked into snap/ (``cp -al``); a longer cache saved into snap/: the original must stay."""
    import torch
    from common import ids

    model, cache = saved_cache(ctx.path("c"))
    hardlink_tree(ctx.path("c"), ctx.path("snap"))
    ctx.protect(ctx.path("c"))
    with torch.no_grad():
        model(ids(4, 256, seed=3), cache=cache)
    cache.save(ctx.path("snap"))
    return sorted(p.name for p in ctx.path("snap").iterdir())


def _linearize_into_snapshot(ctx: Ctx):
    out = ctx.path("lin")
    _ok(cli([*LINEARIZE, "--out", str(out)]))
    hardlink_tree(out, ctx.path("snap"))
    ctx.protect(out)
    return cli([*LINEARIZE, "--steps", "4", "--out", str(ctx.path("snap"))])


def _odd_name(name: str):
    def run(ctx: Ctx):
        return cli([*NIAH, "--haystack-file", str(hay(ctx, name)), "--out", str(ctx.path(name + ".out"))])

    return run


def _written(name: str):
    def check(result, ctx):
        ensure(result.status == 0, f"exit {result.status}")
        ensure((ctx.path(name + ".out") / "results.json").is_file(), "no results.json in the folder named")

    return check


CASES = [
    Case(
        "f2-niah-resumed-in-hardlinked-snapshot",
        "files",
        "lola niah interrupted after 1 of 2 samples in r, `cp -al r snap`, resumed in snap: r must not change",
        _snapshot_resumed,
        intact(lambda r, ctx: ensure(r.status == 0, f"the resume failed: {r!r}")),
    ),
    Case(
        "f2-niah-results-replaced-mid-run",
        "files",
        "someone's file takes results.json's place while lola niah generates: it must not be written over",
        _results_replaced_mid_run,
        intact(),
    ),
    Case(
        "f2-perplexity-out-appears-mid-run",
        "files",
        "someone's p.json appears while lola perplexity --out p.json runs (absent when checked)",
        _ppl_out_appears_mid_run,
        refuse("p.json"),
    ),
    Case(
        "f2-calibrate-out-becomes-link-mid-run",
        "files",
        "lola calibrate --out b.json (its own file when checked) becomes a link to precious.json while it runs",
        _calibrate_out_becomes_link,
        refuse("b.json"),
    ),
    Case(
        "f2-linearize-checkpoint-sum-is-fifo",
        "files",
        "lola linearize --out whose checkpoint.pt.sha256 is a FIFO (nobody writes to it), run again",
        _checkpoint_sum_fifo,
        refuse("checkpoint.pt.sha256"),
        timeout=40,
    ),
    Case(
        "f2-export-old-prompts-name-is-fifo",
        "files",
        "export-niah --out tasks where tasks/lola_niah_single_1.jsonl (the old fixed name) is a FIFO",
        _export_old_name_fifo,
        either("lola_niah_single_1.jsonl", check=_exported),
        timeout=30,
    ),
    Case(
        "f2-niah-forged-journal-onto-foreign-file",
        "files",
        "a results folder holding someone's notes.txt and a .lola-pending.json that renames a temporary file onto it; resumed",
        _forged_journal,
        intact(),
    ),
    Case(
        "f2-linearize-empty-checkpoint-with-sum",
        "files",
        "lola linearize --out whose checkpoint.pt is empty (0 bytes) with a matching sha256, run again",
        _empty_checkpoint,
        refuse("checkpoint.pt"),
    ),
    Case(
        "f2-niah-haystack-huge-sparse",
        "files",
        "lola niah --haystack-file: 200 KB of prose then 8 GiB of holes (sparse, NUL bytes when read)",
        _huge_sparse_haystack,
        refuse("hay.txt"),
        timeout=60,
    ),
    Case(
        "f2-perplexity-out-hardlinked-to-backup",
        "files",
        "lola perplexity --out p.json whose p.json is hard-linked to backup.json; run again with --lengths 96",
        _hardlinked_output(
            lambda ctx: cli([*PPL, "--text", str(hay(ctx)), "--out", str(ctx.path("p.json"))]),
            lambda ctx: cli([*PPL, "--text", str(hay(ctx)), "--lengths", "96", "--out", str(ctx.path("p.json"))]),
            "p.json",
        ),
        intact(lambda r, ctx: ensure(r.status == 0, f"exit {r.status}")),
    ),
    Case(
        "f2-budgets-save-over-hardlink",
        "files",
        "HeadBudgets.save over b.json, hard-linked to keep.json: keep.json keeps the earlier budgets",
        _budgets_save_hardlinked,
        intact(lambda r, ctx: ensure(r == 1.0, f"b.json holds power {r}")),
    ),
    Case(
        "f2-cache-save-into-hardlinked-snapshot",
        "files",
        "LoLACache.save into snap/, a `cp -al` snapshot of a saved cache: the original folder stays",
        _cache_save_into_snapshot,
        intact(),
    ),
    Case(
        "f2-linearize-into-hardlinked-snapshot",
        "files",
        "lola linearize run on (2 -> 4 steps) in snap/, a `cp -al` snapshot of lin/: lin/ stays",
        _linearize_into_snapshot,
        intact(lambda r, ctx: ensure(r.status == 0, f"exit {r.status}: {r!r}")),
        timeout=180,
    ),
    Case(
        "f2-niah-config-empty-file",
        "files",
        "lola niah --config opts.yaml that is empty (0 bytes: no options)",
        lambda ctx: niah(ctx, "r", "--config", str(ctx.write("opts.yaml", ""))),
        either("--config|opts.yaml", check=status(0)),
    ),
    Case(
        "f2-niah-budgets-empty-file",
        "files",
        "lola niah --methods lola --budgets b.json that is empty (0 bytes)",
        lambda ctx: cli([*NIAH[:-1], "lola", "--budgets", str(ctx.write("b.json", "")), "--out", str(ctx.path("r"))]),
        refuse("b.json"),
    ),
    Case(
        "f2-names-with-newline",
        "files",
        "lola niah with --haystack-file and --out names holding a newline",
        _odd_name("hay\nstack.txt"),
        accept(_written("hay\nstack.txt")),
    ),
    Case(
        "f2-names-with-spaces-and-accents",
        "files",
        "lola niah with --haystack-file and --out names holding spaces and accented letters",
        _odd_name("mé ta dönnée.txt"),
        accept(_written("mé ta dönnée.txt")),
    ),
]
