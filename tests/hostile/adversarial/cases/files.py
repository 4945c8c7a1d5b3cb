"""Adversarial cases of class ``files``: links, foreign files, killed writes and damaged inputs.

Batch 1. Links and foreign files at output paths, outputs that are files, folders or FIFOs, writes
killed half-way (a monkeypatched ``os.replace`` or ``os.fsync``), and damaged inputs. Every file
that was there before must survive, byte for byte, unless lola wrote it; a group of files cut by a
kill must leave either the earlier group or the new one usable.

Batch 2. Hard links (a ``cp -al`` snapshot resumed, outputs hard-linked to a backup), files
replaced between the check and the write (a foreign file or a link appearing while the command
runs), FIFOs where lola reads a file it trusts (a checkpoint's checksum, the old name of exported
prompts), a forged journal, empty files, a huge sparse file, and names with newlines, spaces and
non-ASCII letters. Every file that was there before must survive unless lola wrote it.

Batch 3. Owned output folders and run locks: a folder held by another live run (its lock, or only
its ``.lola-run.json`` naming a live pid) given to every command that writes one, a stale lock of a
dead pid (taken over), ``.lola-run.json`` as a link, a FIFO or a folder; someone's files under the
names lola writes (``probe.png``, ``sweep-*.png``, ``prose.txt``, a ``.partial``), files of another
lola command in an output's place, records that became a link or a FIFO, the output folder deleted
or renamed while a run writes, outputs through links and on read-only file systems.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

import lola

from ...common import rehash_maps, write_random_maps
from ..builders import (
    CALIBRATE,
    EXPORT,
    LINEARIZE,
    LOLA,
    NIAH,
    NIAH_LOLA,
    PPL,
    PROSE,
    SWEEP,
    budgets_file,
    dead_pid,
    described,
    fifo,
    first_ok,
    fit,
    hardlink_tree,
    hay,
    held,
    ids,
    interrupt_after,
    loads,
    lock_file,
    niah,
    niah_config,
    patched,
    ppl,
    probe,
    saved_cache,
    scripted,
    short_lock_wait,
    status,
    sweep,
    tiny,
)
from ..harness import Case, Ctx, SimulatedKill, accept, cli, either, ensure, export, in_batch, intact, lost, refuse


def _no_temp_files(folder):
    from lola.io.outputs import TEMP_PREFIX

    left = [p.name for p in folder.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    ensure(not left, f"temporary files left behind: {left}")


@contextmanager
def killed_at_replace(call: int, exc: BaseException | None = None) -> Iterator[None]:
    """``os.replace`` dies (raises) at its ``call``-th call: a kill between two renames."""
    real = os.replace
    count = [0]

    def replace(src, dst, *args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise exc or SimulatedKill(f"killed before renaming to {os.path.basename(dst)}")
        return real(src, dst, *args, **kwargs)

    with patched(os, "replace", replace):
        yield


def _results_written(folder_name: str = "r"):
    def check(result, ctx):
        ensure((ctx.path(folder_name) / "results.json").is_file(), "no results.json was written")

    return check


def _out_is_link(ctx: Ctx):
    real = ctx.path("real")
    ctx.write("real/notes.txt", "mine")
    ctx.protect(real / "notes.txt")
    ctx.path("r").symlink_to(real)
    return niah(ctx, "r")


def _foreign_notes(ctx: Ctx):
    ctx.write("r/notes.txt", "mine")
    ctx.write("r/sub/data.bin", b"\x00\x01")
    ctx.write("r/.lola-tmp-results.json.abc", "someone's draft")
    ctx.protect(ctx.path("r"))
    return niah(ctx, "r")


def _killed_before_plots(ctx: Ctx):
    with patched("lola.eval.runner", "plot_results", _raise_kill):
        try:
            niah(ctx, "r")
        except SimulatedKill:
            pass
    return niah(ctx, "r")


def _raise_kill(*args, **kwargs):
    raise SimulatedKill("killed before the plots")


def _whole_after_kill(result, ctx):
    saved = json.loads((ctx.path("r") / "results.json").read_text())
    ensure(saved["summary"]["window"]["400"]["samples"] == 1, "the summary does not count the sample")
    ensure(len((ctx.path("r") / "samples.jsonl").read_text().splitlines()) == 1, "samples.jsonl does not hold exactly one sample")
    ensure(all((ctx.path("r") / n).is_file() for n in ("accuracy.png", "cache_bytes.png")), "the plots were not written on the resume")
    _no_temp_files(ctx.path("r"))


def _ppl_disk_full(ctx: Ctx):
    text = str(hay(ctx))
    out = str(ctx.path("p.json"))
    first = cli([*PPL, "--text", text, "--out", out])
    ensure(first.status == 0, f"the first run failed: {first!r}")
    ctx.protect(ctx.path("p.json"))

    def fsync(fd):
        raise OSError(28, "No space left on device")

    with patched(os, "fsync", fsync):
        return cli([*PPL, "--text", text, "--lengths", "96", "--out", out])


def _budgets_save_killed(ctx: Ctx):
    from lola import budgets

    path = budgets_file(ctx.path("b.json"))
    b = budgets.load(path)
    b.save(path)  # lola's own file now
    ctx.protect(path)
    with killed_at_replace(1):
        try:
            b.model_copy(update={"power": 1.0}).save(path)
        except SimulatedKill:
            pass
    return budgets.load(path)


def _foreign_legacy_tensors(ctx: Ctx):
    ctx.write("c/cache.safetensors", b"someone else's tensors")
    ctx.protect(ctx.path("c/cache.safetensors"))
    saved_cache(ctx.path("c"))
    return sorted(p.name for p in ctx.path("c").iterdir())


def _maps_killed_between_renames(ctx: Ctx):
    from lola.pretrained.folder import read_feature_maps

    write_random_maps(ctx.path("m"), seed=0, reports={"report.json": {"run": 0}})
    with killed_at_replace(2):
        try:
            write_random_maps(ctx.path("m"), seed=1, reports={"report.json": {"run": 1}})
        except SimulatedKill:
            pass
    try:
        read_feature_maps(ctx.path("m"))
    except ValueError as err:
        lost(f"a kill between two renames left the folder unreadable, the earlier maps gone ({err})")
    return "readable"


def _checkpoint_killed_between_renames(ctx: Ctx):
    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import load_checkpoint, write_checkpoint

    cfg = LinearizeConfig(steps=4)
    path = ctx.path("checkpoint.pt")
    write_checkpoint(path, {"config": cfg.model_dump(), "step": 1, "inputs": {}})
    with killed_at_replace(2):
        try:
            write_checkpoint(path, {"config": cfg.model_dump(), "step": 2, "inputs": {}})
        except SimulatedKill:
            pass
    try:
        return load_checkpoint(path, cfg, "--steps")["step"]
    except ValueError as err:
        lost(f"a kill between the checkpoint and its checksum left neither usable ({err})")


def _export_killed_between_renames(ctx: Ctx):
    from lola.data.text import ByteTokenizer
    from lola.integrations.lm_eval.niah import export_niah

    out = ctx.path("tasks")
    export_niah(out, ByteTokenizer(), lengths=[512], samples=1, name="t")
    with killed_at_replace(2):
        try:
            export_niah(out, ByteTokenizer(), lengths=[600], samples=1, name="t")
        except SimulatedKill:
            pass
    rows = {json.loads(line)["length"] for line in (out / "t.jsonl").read_text().splitlines()}
    utils = (out / "t_utils.py").read_text()
    yaml = (out / "t.yaml").read_text()
    scored = {n for n in (512, 600) if f"LENGTHS = [{n}]" in utils}
    metrics = {n for n in (512, 600) if f"string_match_all_{n}" in yaml}
    if not (rows == scored == metrics):
        lost(f"a kill between renames left a mixed task: prompts of lengths {sorted(rows)}, scoring for {sorted(scored)}, metrics for {sorted(metrics)}")
    return sorted(rows)


def _fifo(ctx: Ctx, name: str):
    path = ctx.path(name)
    os.mkfifo(path)
    return path


def _maps_safetensors_folder(ctx: Ctx):
    write_random_maps(ctx.path("m"))
    (ctx.path("m") / "feature_maps.safetensors").unlink()
    (ctx.path("m") / "feature_maps.safetensors").mkdir()
    return niah(ctx, "r", "--feature-maps", str(ctx.path("m")))


def _cache_json_folder(ctx: Ctx):
    ctx.path("c/cache.json").mkdir(parents=True)
    return saved_cache(ctx.path("c"))


def _lora_tensors(model):
    out = {}
    for i, layer in enumerate(model.model.layers):
        w = layer.self_attn.q_proj.weight
        out[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"] = torch.full((2, w.shape[1]), 0.01)
        out[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight"] = torch.full((w.shape[0], 2), 0.01)
    return out


def _truncated_lora(ctx: Ctx):
    from lola.integrations.transformers import apply_lola
    from lola.pretrained.lora import LoraSpec

    model, _ = tiny()
    write_random_maps(ctx.path("m"), lora=_lora_tensors(model), lora_spec=LoraSpec(rank=2, alpha=4.0))
    data = (ctx.path("m") / "lora.safetensors").read_bytes()
    (ctx.path("m") / "lora.safetensors").write_bytes(data[: len(data) // 2])
    rehash_maps(ctx.path("m"))
    apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps=ctx.path("m"))
    return "applied"


def _export_out_link_to_file(ctx: Ctx):
    ctx.write("afile", "mine")
    ctx.protect(ctx.path("afile"))
    ctx.path("link").symlink_to(ctx.path("afile"))
    return export(["--out", str(ctx.path("link")), *EXPORT])


def _niah_with(option: str, make):
    def run(ctx: Ctx):
        return niah(ctx, "r", option, str(make(ctx)))

    return run


def _ok(result, what: str = "the first run") -> None:
    if result.status != 0:
        raise RuntimeError(f"{what} failed: {result!r}")


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


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
    Case(
        "files-niah-out-is-link-to-folder",
        "files",
        "lola niah --out is a link to a folder holding notes.txt",
        _out_is_link,
        accept(lambda r, ctx: ensure((ctx.path("real") / "results.json").is_file(), "nothing was written in the folder the link names")),
    ),
    Case(
        "files-niah-foreign-files-beside-results",
        "files",
        "lola niah --out holds notes.txt, sub/data.bin and a stray .lola-tmp- file: all must be kept",
        _foreign_notes,
        accept(_results_written()),
    ),
    Case(
        "files-niah-killed-before-plots",
        "files",
        "lola niah killed after its sample and results.json, before the plots; run again",
        _killed_before_plots,
        accept(_whole_after_kill),
    ),
    Case(
        "files-perplexity-out-disk-full",
        "files",
        "lola perplexity --out over its earlier p.json with a full disk (os.fsync fails)",
        _ppl_disk_full,
        intact(lambda r, ctx: _no_temp_files(ctx.dir)),
    ),
    Case(
        "files-budgets-save-killed",
        "files",
        "HeadBudgets.save over its own file, killed at the rename",
        _budgets_save_killed,
        intact(lambda r, ctx: _no_temp_files(ctx.dir)),
    ),
    Case(
        "files-cache-save-deletes-foreign-legacy-name",
        "files",
        "LoLACache.save into a folder holding someone's cache.safetensors (and no cache.json)",
        _foreign_legacy_tensors,
        intact(),
    ),
    Case(
        "files-maps-killed-between-renames",
        "files",
        "write_feature_maps over an earlier folder, killed after renaming feature_maps.safetensors",
        _maps_killed_between_renames,
        intact(),
    ),
    Case(
        "files-checkpoint-killed-between-renames",
        "files",
        "write_checkpoint over an earlier checkpoint, killed after renaming checkpoint.pt (before its .sha256)",
        _checkpoint_killed_between_renames,
        intact(),
    ),
    Case(
        "files-export-killed-between-renames",
        "files",
        "export_niah over an earlier export (other lengths), killed after renaming the prompts",
        _export_killed_between_renames,
        intact(),
    ),
    Case(
        "files-linearize-checkpoint-is-folder",
        "files",
        "lola linearize --out whose checkpoint.pt is a folder",
        lambda ctx: (
            ctx.path("lin/checkpoint.pt").mkdir(parents=True),
            cli(["linearize", "--quick", "--stage", "1", "--steps", "2", "--train-chunks", "1", "--checkpoint-every", "1", "--out", str(ctx.path("lin"))]),
        )[1],
        refuse("checkpoint.pt"),
    ),
    Case(
        "files-niah-haystack-is-folder",
        "files",
        "lola niah --haystack-file names a folder",
        _niah_with("--haystack-file", lambda ctx: (ctx.path("hay.d").mkdir(), ctx.path("hay.d"))[1]),
        refuse("hay.d"),
    ),
    Case(
        "files-niah-config-is-fifo",
        "files",
        "lola niah --config names a FIFO (nobody writes to it)",
        _niah_with("--config", lambda ctx: _fifo(ctx, "opts.yaml")),
        refuse("opts.yaml"),
        timeout=20,
    ),
    Case(
        "files-perplexity-out-is-fifo",
        "files",
        "lola perplexity --out names an existing FIFO",
        lambda ctx: cli([*PPL, "--text", str(hay(ctx)), "--out", str(_fifo(ctx, "p.json"))]),
        refuse("p.json"),
        timeout=20,
    ),
    Case(
        "files-niah-budgets-is-folder",
        "files",
        "lola niah --budgets b.json where b.json is a folder",
        lambda ctx: (
            ctx.path("b.json").mkdir(),
            cli([*LOLA, "--budgets", str(ctx.path("b.json")), "--out", str(ctx.path("r"))]),
        )[1],
        refuse("b.json"),
    ),
    Case(
        "files-niah-budgets-binary",
        "files",
        "lola niah --budgets b.json holding binary bytes",
        lambda ctx: cli([*NIAH_LOLA, "--budgets", str(ctx.write("b.json", b"\xff\xfe\x00\x01garbage")), "--out", str(ctx.path("r"))]),
        refuse("b.json"),
    ),
    Case(
        "files-maps-safetensors-is-folder",
        "files",
        "a feature-map folder whose feature_maps.safetensors is a folder, given to lola niah",
        _maps_safetensors_folder,
        refuse("feature_maps.safetensors"),
    ),
    Case(
        "files-maps-folder-is-a-file",
        "files",
        "lola niah --feature-maps names a plain file",
        _niah_with("--feature-maps", lambda ctx: ctx.write("maps", "not a folder")),
        refuse("maps"),
    ),
    Case("files-cache-json-is-folder", "files", "LoLACache.save into a folder whose cache.json is a folder", _cache_json_folder, refuse("cache.json")),
    Case(
        "files-maps-truncated-lora",
        "files",
        "a stage-2 feature-map folder whose lora.safetensors is cut in half (sums recomputed)",
        _truncated_lora,
        refuse("lora.safetensors"),
    ),
    Case("files-export-out-link-to-file", "files", "export-niah --out is a link to a plain file", _export_out_link_to_file, refuse("link")),
    Case(
        "files-export-out-unwritable",
        "files",
        "export-niah --out /sys/lola-export (read-only file system)",
        lambda ctx: export(["--out", "/sys/lola-export", *EXPORT]),
        refuse("/sys"),
    ),
    Case(
        "files-calibrate-out-under-a-file",
        "files",
        "lola calibrate --out afile/b.json where afile is a plain file",
        lambda ctx: (
            ctx.write("afile", "mine"),
            ctx.protect(ctx.path("afile")),
            cli(["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1", "--out", str(ctx.path("afile/b.json"))]),
        )[2],
        refuse("afile"),
    ),
]

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
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
        niah_config(""),
        either("--config|opts.yaml", check=status(0)),
    ),
    Case(
        "f2-niah-budgets-empty-file",
        "files",
        "lola niah --methods lola --budgets b.json that is empty (0 bytes)",
        lambda ctx: cli([*NIAH_LOLA, "--budgets", str(ctx.write("b.json", "")), "--out", str(ctx.path("r"))]),
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


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------


def _while_held(command: str, run_it, folder: str = "r", short_wait: bool = False):
    """``run_it(ctx)`` while another live run (``command``) holds ``folder``: its lock and its
    ``.lola-run.json``."""

    def run(ctx: Ctx):
        with held(ctx.path(folder), command):
            if short_wait:
                with short_lock_wait():
                    return run_it(ctx)
            return run_it(ctx)

    return run


def _lock_file_only(command: str, run_it, folder: str = "r", pid=os.getppid):
    """``run_it(ctx)`` where ``folder/.lola-run.json`` names ``pid()`` (alive unless a dead pid is
    given) running ``command``, and no process holds the folder's lock."""

    def run(ctx: Ctx):
        lock_file(ctx.path(folder), pid(), command)
        return run_it(ctx)

    return run


def _stale_lock_taken_over(result, ctx) -> None:
    from lola.io.outputs import RUN_FILE

    ensure(result.status == 0, f"exit {result.status}: {result!r}")
    ensure((ctx.path("r") / "results.json").is_file(), "no results.json was written")
    ensure(not (ctx.path("r") / RUN_FILE).exists(), "the stale .lola-run.json is still there after the run")


def _run_file_is(kind: str):
    """lola niah into a folder whose ``.lola-run.json`` is a ``kind``: a link to someone's
    precious.txt, a FIFO, or a folder."""

    def run(ctx: Ctx):
        from lola.io.outputs import RUN_FILE

        path = ctx.path("r") / RUN_FILE
        ctx.path("r").mkdir()
        if kind == "link":
            ctx.write("precious.txt", "mine\n")
            ctx.protect(ctx.path("precious.txt"))
            path.symlink_to(ctx.path("precious.txt"))
        elif kind == "fifo":
            fifo(path)
        else:
            path.mkdir()
        return niah(ctx, "r")

    return run


def _foreign_then(name: str, run_it):
    """``run_it(ctx)`` where the output folder already holds someone's ``name`` (protected)."""

    def run(ctx: Ctx):
        ctx.write(name, b"\x89PNG someone's own figure" if name.endswith(".png") else "My own notes, kept here. " * 200)
        ctx.protect(ctx.path(name))
        return run_it(ctx)

    return run


def _probe_records_link(ctx: Ctx):
    """lola probe of 2 prompts interrupted after one; probe.jsonl then a link to someone's
    precious.jsonl (holding the same record); resumed."""
    with loads(scripted(on_generate=interrupt_after(1))):
        probe(ctx, "p", "--samples", "2")
    records = ctx.path("p") / "probe.jsonl"
    ctx.write("precious.jsonl", records.read_bytes())
    ctx.protect(ctx.path("precious.jsonl"))
    records.unlink()
    records.symlink_to(ctx.path("precious.jsonl"))
    return probe(ctx, "p", "--samples", "2")


def _probe_records_fifo(ctx: Ctx):
    first_ok(probe(ctx))
    records = ctx.path("p") / "probe.jsonl"
    records.unlink()
    fifo(records)
    return probe(ctx)


def _gone_mid_run(how: str):
    """lola niah of 2 samples whose folder is deleted (or renamed to r.moved) while the first sample generates."""

    def run(ctx: Ctx):
        import shutil

        def hook(n: int) -> None:
            if n == 1:
                if how == "delete":
                    shutil.rmtree(ctx.path("r"))
                else:
                    ctx.path("r").rename(ctx.path("r.moved"))

        with loads(scripted(on_generate=hook)):
            return niah(ctx, "r", "--samples", "2")

    return run


def _folders_consistent(result, ctx) -> None:
    """Every folder the run left with a results.json summarises exactly the samples beside it, and
    no run lock is left behind."""
    from lola.io.outputs import RUN_FILE

    for name in ("r", "r.moved"):
        folder = ctx.path(name)
        if (folder / RUN_FILE).exists():
            lost(f"{name}/{RUN_FILE} was left behind: the folder looks held by a run that has ended")
        if not (folder / "results.json").is_file():
            continue
        summary = json.loads((folder / "results.json").read_text()).get("summary", {})
        counted = sum(cell.get("samples", 0) for by in summary.values() for cell in by.values())
        path = folder / "samples.jsonl"
        held_lines = len(path.read_text().splitlines()) if path.is_file() else 0
        if counted != held_lines:
            lost(f"{name}/results.json counts {counted} samples but {name}/samples.jsonl holds {held_lines}: the records went to a folder that is gone")


def _export_cmd(ctx: Ctx, out: str) -> object:
    return cli(["export", "--model", "tiny-random-llama", "--out", str(ctx.path(out))])


def _export_through_link(ctx: Ctx):
    ctx.path("real").mkdir()
    ctx.path("link").symlink_to(ctx.path("real"))
    return _export_cmd(ctx, "link")


def _export_again_beside_notes(ctx: Ctx):
    first_ok(_export_cmd(ctx, "e"))
    ctx.write("e/notes.txt", "mine")
    ctx.protect(ctx.path("e/notes.txt"))
    return _export_cmd(ctx, "e")


def _other_tools_safetensors(ctx: Ctx):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, ctx.path("s.safetensors"), metadata={"format": "pt"})
    ctx.protect(ctx.path("s.safetensors"))
    return fit(ctx)


def _own_file_of_another_command(make, name: str, run_it):
    """``make(ctx)`` writes ``name`` (a file another lola command owns); protected; then ``run_it(ctx)``."""

    def run(ctx: Ctx):
        make(ctx)
        ctx.protect(ctx.path(name))
        return run_it(ctx)

    return run


def _perplexity_results(ctx: Ctx, name: str):
    first_ok(ppl(ctx, None, "--out", str(ctx.path(name))))


def _budgets_save_over(ctx: Ctx):
    from lola import budgets

    return budgets.load(budgets_file(ctx.path("b.json"))).save(ctx.path("p.json"))


BATCH_3 = [
    Case(
        "f3-niah-folder-held-by-a-live-run",
        "files",
        "lola niah --out r while another process holds r's run lock (flock) and .lola-run.json names it",
        _while_held("lola niah", lambda ctx: niah(ctx, "r")),
        refuse("in use"),
    ),
    Case(
        "f3-niah-run-file-of-a-live-pid",
        "files",
        "lola niah --out r where r/.lola-run.json names a live pid running lola niah (no flock held): the lock is the "
        "folder's flock, the file only describes its holder, so a file without the lock is stale and taken over "
        "(expectation changed after the first run, from refuse: a live pid may be another run's in another folder)",
        _lock_file_only("lola niah", lambda ctx: niah(ctx, "r")),
        accept(_stale_lock_taken_over),
    ),
    Case(
        "f3-niah-stale-run-file-of-a-dead-pid",
        "files",
        "lola niah --out r where r/.lola-run.json names a pid that has exited: the run takes the folder over",
        _lock_file_only("lola niah", lambda ctx: niah(ctx, "r"), pid=dead_pid),
        accept(_stale_lock_taken_over),
    ),
    Case(
        "f3-probe-folder-held-by-a-live-run",
        "files",
        "lola probe --out r while another process holds r (a lola niah run's lock and .lola-run.json)",
        _while_held("lola niah", lambda ctx: probe(ctx, "r")),
        refuse("in use"),
    ),
    Case(
        "f3-sweep-folder-held-by-a-live-run",
        "files",
        "lola sweep --out r while another process holds r (lock and .lola-run.json of lola sweep)",
        _while_held("lola sweep", lambda ctx: sweep(ctx, "r")),
        refuse("in use"),
    ),
    Case(
        "f3-linearize-run-file-of-a-live-pid",
        "files",
        "lola linearize --out lin where lin/.lola-run.json names a live pid running lola linearize (no flock held): "
        "stale, taken over (as f3-niah-run-file-of-a-live-pid)",
        _lock_file_only("lola linearize", lambda ctx: cli([*LINEARIZE, "--out", str(ctx.path("lin"))]), folder="lin"),
        accept(lambda r, ctx: ensure(r.status == 0 and not (ctx.path("lin") / ".lola-run.json").exists(), f"exit {r.status}, or the stale file left: {r!r}")),
    ),
    Case(
        "f3-calibrate-into-a-held-folder",
        "files",
        "lola calibrate --out r/b.json while a lola niah run holds r",
        _while_held("lola niah", lambda ctx: cli([*CALIBRATE, "--out", str(ctx.path("r/b.json"))]), short_wait=True),
        refuse("in use|busy"),
    ),
    Case(
        "f3-perplexity-out-into-a-held-folder",
        "files",
        "lola perplexity --out r/p.json while a lola niah run holds r",
        _while_held("lola niah", lambda ctx: ppl(ctx, None, "--out", str(ctx.path("r/p.json"))), short_wait=True),
        refuse("in use|busy"),
    ),
    Case(
        "f3-cache-save-into-a-held-folder",
        "files",
        "LoLACache.save(r) while a lola niah run holds r",
        _while_held("lola niah", lambda ctx: saved_cache(ctx.path("r")), short_wait=True),
        refuse("in use|busy"),
    ),
    Case(
        "f3-export-into-a-held-folder",
        "files",
        "lola export --out r while a lola niah run holds r",
        _while_held("lola niah", lambda ctx: _export_cmd(ctx, "r"), short_wait=True),
        refuse("--out|in use|busy"),
    ),
    Case(
        "f3-fit-scorer-into-a-held-folder",
        "files",
        "lola fit-scorer --out r/s.safetensors while a lola niah run holds r",
        _while_held("lola niah", lambda ctx: fit(ctx, "r/s.safetensors"), short_wait=True),
        refuse("in use|busy"),
    ),
    Case(
        "f3-niah-run-file-links-to-precious",
        "files",
        "lola niah --out r where r/.lola-run.json is a link to someone's precious.txt",
        _run_file_is("link"),
        intact(),
    ),
    Case(
        "f3-niah-run-file-is-fifo",
        "files",
        "lola niah --out r where r/.lola-run.json is a FIFO (nobody reads it)",
        _run_file_is("fifo"),
        refuse(".lola-run.json"),
        timeout=30,
    ),
    Case(
        "f3-niah-run-file-is-folder",
        "files",
        "lola niah --out r where r/.lola-run.json is a folder",
        _run_file_is("folder"),
        refuse(".lola-run.json"),
    ),
    Case(
        "f3-probe-foreign-probe-png",
        "files",
        "lola probe --out p where p holds someone's probe.png (and nothing else)",
        _foreign_then("p/probe.png", lambda ctx: probe(ctx)),
        intact(),
    ),
    Case(
        "f3-sweep-foreign-sweep-png",
        "files",
        "lola sweep --out s where s holds someone's sweep-noise.png (and nothing else)",
        _foreign_then("s/sweep-noise.png", lambda ctx: sweep(ctx)),
        intact(),
    ),
    Case(
        "f3-sweep-foreign-prose-txt",
        "files",
        "lola sweep --haystacks prose --out s where s holds someone's prose.txt (lola would write its own there)",
        _foreign_then("s/prose.txt", lambda ctx: sweep(ctx, "s", "--haystacks", "prose", "--lengths", "2048")),
        refuse("prose.txt", check=described("someone's prose.txt was read as the prose haystack")),
        timeout=180,
    ),
    Case(
        "f3-probe-records-link-to-precious",
        "files",
        "lola probe interrupted after 1 of 2 prompts; probe.jsonl then a link to someone's precious.jsonl; resumed",
        _probe_records_link,
        intact(),
    ),
    Case(
        "f3-probe-records-fifo",
        "files",
        "a finished lola probe whose probe.jsonl is replaced by a FIFO (nobody writes to it); run again",
        _probe_records_fifo,
        refuse("probe.jsonl"),
        timeout=30,
    ),
    Case(
        "f3-niah-folder-deleted-mid-run",
        "files",
        "lola niah of 2 samples whose --out folder is deleted while the first sample generates",
        _gone_mid_run("delete"),
        intact(_folders_consistent),
    ),
    Case(
        "f3-niah-folder-renamed-mid-run",
        "files",
        "lola niah of 2 samples whose --out folder is renamed while the first sample generates",
        _gone_mid_run("rename"),
        intact(_folders_consistent),
    ),
    Case(
        "f3-export-out-link-to-empty-folder",
        "files",
        "lola export --out link where link is a symbolic link to an empty folder",
        _export_through_link,
        accept(lambda r, ctx: ensure((ctx.path("real") / "config.json").is_file(), "nothing was written in the folder the link names")),
    ),
    Case(
        "f3-export-again-beside-foreign-notes",
        "files",
        "lola export into its own earlier export, which now also holds someone's notes.txt",
        _export_again_beside_notes,
        intact(status(0)),
    ),
    Case(
        "f3-fit-scorer-out-other-tools-safetensors",
        "files",
        "lola fit-scorer --out s.safetensors where s.safetensors is someone's safetensors file (not a scorer)",
        _other_tools_safetensors,
        refuse("s.safetensors"),
    ),
    Case(
        "f3-fit-scorer-foreign-partial",
        "files",
        "lola fit-scorer --out s.safetensors beside someone's s.safetensors.partial (a text file)",
        lambda ctx: (ctx.write("s.safetensors.partial", "my notes"), ctx.protect(ctx.path("s.safetensors.partial")), fit(ctx))[2],
        refuse("s.safetensors.partial"),
    ),
    Case(
        "f3-calibrate-out-is-perplexity-results",
        "files",
        "lola calibrate --out b.json where b.json holds lola perplexity's results (another command's file)",
        _own_file_of_another_command(lambda ctx: _perplexity_results(ctx, "b.json"), "b.json", lambda ctx: cli([*CALIBRATE, "--out", str(ctx.path("b.json"))])),
        refuse("b.json"),
    ),
    Case(
        "f3-perplexity-out-is-budgets",
        "files",
        "lola perplexity --out p.json where p.json holds budgets (lola calibrate's kind of file)",
        _own_file_of_another_command(lambda ctx: budgets_file(ctx.path("p.json")), "p.json", lambda ctx: ppl(ctx, None, "--out", str(ctx.path("p.json")))),
        refuse("p.json"),
    ),
    Case(
        "f3-budgets-save-over-perplexity-results",
        "files",
        "HeadBudgets.save(p.json) where p.json holds lola perplexity's results",
        _own_file_of_another_command(lambda ctx: _perplexity_results(ctx, "p.json"), "p.json", _budgets_save_over),
        refuse("p.json"),
    ),
    Case(
        "f3-export-out-is-linearize-folder",
        "files",
        "lola export --out lin where lin is a lola linearize folder",
        _own_file_of_another_command(lambda ctx: first_ok(cli([*LINEARIZE, "--out", str(ctx.path("lin"))])), "lin", lambda ctx: _export_cmd(ctx, "lin")),
        refuse("--out"),
    ),
    Case(
        "f3-linearize-out-is-export-folder",
        "files",
        "lola linearize --out e where e is a lola export folder",
        _own_file_of_another_command(lambda ctx: first_ok(_export_cmd(ctx, "e")), "e", lambda ctx: cli([*LINEARIZE, "--out", str(ctx.path("e"))])),
        refuse("e"),
    ),
    Case(
        "f3-cache-save-into-fifo",
        "files",
        "LoLACache.save(c) where c is a FIFO",
        lambda ctx: (fifo(ctx.path("c")), saved_cache(ctx.path("c")))[1],
        refuse("c"),
        timeout=30,
    ),
    Case(
        "f3-cache-save-read-only-file-system",
        "files",
        "LoLACache.save('/sys/lola-cache') (a read-only file system)",
        lambda ctx: saved_cache(Path("/sys/lola-cache")),
        refuse("/sys"),
    ),
    Case(
        "f3-sweep-out-read-only-file-system",
        "files",
        "lola sweep --out /sys/lola-sweep (a read-only file system)",
        lambda ctx: cli([*SWEEP, "--out", "/sys/lola-sweep"]),
        refuse("/sys"),
    ),
    Case(
        "f3-fit-scorer-out-read-only-file-system",
        "files",
        "lola fit-scorer --out /sys/s.safetensors (a read-only file system)",
        lambda ctx: fit(ctx, "/sys/s.safetensors"),
        refuse("/sys"),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
