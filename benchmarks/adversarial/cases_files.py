"""Class 4: files.

Links and foreign files at output paths, outputs that are files, folders or FIFOs, writes
killed half-way (a monkeypatched ``os.replace`` or ``os.fsync``), and damaged inputs. Every
file that was there before must survive, byte for byte, unless lola wrote it; a group of files
cut by a kill must leave either the earlier group or the new one usable.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Iterator

import torch
from common import EXPORT, NIAH, PPL, budgets_file, hay, niah, patched, rehash_maps, saved_cache, tiny, write_maps
from harness import Case, Ctx, SimulatedKill, accept, cli, ensure, export, intact, lost, refuse

import lola


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

    write_maps(ctx.path("m"), seed=0, reports={"report.json": {"run": 0}})
    with killed_at_replace(2):
        try:
            write_maps(ctx.path("m"), seed=1, reports={"report.json": {"run": 1}})
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
    write_maps(ctx.path("m"))
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
    write_maps(ctx.path("m"), lora=_lora_tensors(model), lora_spec=LoraSpec(rank=2, alpha=4.0))
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


CASES = [
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
            cli([*NIAH[:-1], "lola", "--window", "8", "--sparse-size", "8", "--budgets", str(ctx.path("b.json")), "--out", str(ctx.path("r"))]),
        )[1],
        refuse("b.json"),
    ),
    Case(
        "files-niah-budgets-binary",
        "files",
        "lola niah --budgets b.json holding binary bytes",
        lambda ctx: cli([*NIAH[:-1], "lola", "--budgets", str(ctx.write("b.json", b"\xff\xfe\x00\x01garbage")), "--out", str(ctx.path("r"))]),
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
    Case(
        "files-cache-json-is-folder",
        "files",
        "LoLACache.save into a folder whose cache.json is a folder",
        _cache_json_folder,
        refuse("cache.json"),
    ),
    Case(
        "files-maps-truncated-lora",
        "files",
        "a stage-2 feature-map folder whose lora.safetensors is cut in half (sums recomputed)",
        _truncated_lora,
        refuse("lora.safetensors"),
    ),
    Case(
        "files-export-out-link-to-file",
        "files",
        "export-niah --out is a link to a plain file",
        _export_out_link_to_file,
        refuse("link"),
    ),
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
