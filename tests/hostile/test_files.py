"""Hostile inputs, class ``files``: no writer of lola writes through a link, over a file it did
not write, or leaves a half-written group when it is stopped.

The mechanism is :func:`lola.io.outputs.write_files` (tests/io/test_outputs.py); here each writer
is checked through its public entry point: the feature-map folder (API and ``lola linearize``),
checkpoints, ``lola niah`` results (output folders that are files, unwritable, or hold another
tool's or a damaged run's files; a hard-linked copy resumed), ``lola perplexity --out``, budgets
(API and ``lola calibrate``), and the lm-eval export. ``LoLACache.save`` is covered in
tests/integrations/transformers/test_cache.py and test_state.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from lola.cli import main
from lola.eval.runner import RESULTS_FORMAT, NiahRun
from lola.io.outputs import TEMP_PREFIX
from tests.hostile.common import (
    FULL_NIAH,
    RUN,
    refused,
    snapshot,
    write_random_maps,
)

transformers = pytest.importorskip("transformers")


# -- feature-map folders and checkpoints -----------------------------------------------------------


@pytest.mark.parametrize("name", ["feature_maps.safetensors", "report.json", "finetune_report.json", "lora.safetensors"])
def test_maps_are_not_written_over_another_tools_files(tmp_path, name):
    out = tmp_path / "maps"
    out.mkdir()
    (out / name).write_bytes(b"someone else's")
    with pytest.raises(ValueError, match="not written by lola linearize"):
        write_random_maps(out, reports={"report.json": {"ok": 1}})
    assert snapshot(out) == {name: b"someone else's"}


def test_maps_are_not_written_through_links(tmp_path):
    out = tmp_path / "maps"
    write_random_maps(out)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    (out / "feature_maps.safetensors").unlink()
    (out / "feature_maps.safetensors").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        write_random_maps(out, seed=1)
    assert victim.read_bytes() == b"precious"


def test_a_folder_mixed_from_two_runs_is_refused(tmp_path):
    from lola.pretrained.folder import read_feature_maps

    a, b = tmp_path / "a", tmp_path / "b"
    write_random_maps(a, seed=0, reports={"report.json": {"run": "a"}})
    write_random_maps(b, seed=1, reports={"report.json": {"run": "b"}})
    read_feature_maps(a)
    own = (a / "feature_maps.safetensors").read_bytes()
    shutil.copyfile(b / "feature_maps.safetensors", a / "feature_maps.safetensors")  # a crash between two renames, or a copy by hand
    with pytest.raises(ValueError, match="feature_maps.safetensors is not the file lola_config.json records"):
        read_feature_maps(a)
    (a / "feature_maps.safetensors").write_bytes(own)
    shutil.copyfile(b / "report.json", a / "report.json")
    with pytest.raises(ValueError, match="report.json is not the file lola_config.json records"):
        read_feature_maps(a)


@pytest.mark.parametrize("files", [{"../x": "0" * 64}, {"feature_maps.safetensors": 3}, ["feature_maps.safetensors"]])
def test_a_description_recording_odd_files_is_refused(tmp_path, files):
    from lola.pretrained.folder import read_feature_maps

    write_random_maps(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "lola_config.json").read_text())
    meta["files"] = files
    (tmp_path / "m" / "lola_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="files"):
        read_feature_maps(tmp_path / "m")


def test_rewriting_stage_1_removes_the_adapters_and_their_report(tmp_path):
    from lola.pretrained.folder import read_feature_maps
    from lola.pretrained.lora import LoraSpec

    out = tmp_path / "m"
    write_random_maps(out)
    maps = read_feature_maps(out)
    tensors, cfg, geometry = maps.tensors, maps.config, maps.geometry
    from lola.pretrained.folder import write_feature_maps

    lora = {"model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 64), "model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 2)}
    write_feature_maps(out, tensors, cfg, geometry, reports={"report.json": {"stage": 1}})
    write_feature_maps(out, tensors, cfg, geometry, lora=lora, lora_spec=LoraSpec(rank=2, alpha=4.0), reports={"finetune_report.json": {"stage": 2}})
    assert read_feature_maps(out).lora is not None and (out / "report.json").exists()  # stage 1's report is kept, and recorded
    write_feature_maps(out, tensors, cfg, geometry, reports={"report.json": {"stage": 1, "again": True}})
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["feature_maps.safetensors", "lola_config.json", "report.json"]
    assert read_feature_maps(out).lora is None


@pytest.mark.parametrize("name", ["report.json", "feature_maps.safetensors", "lora.safetensors"])
def test_linearize_refuses_a_folder_with_foreign_files_before_loading(name, tmp_path, capsys, no_model):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_bytes(b"{}")
    before = snapshot(out)
    refused(capsys, ["linearize", "--quick", "--stage", "1", "--out", str(out)], f"{name} was not written by lola linearize")
    assert snapshot(out) == before


def test_checkpoints_are_not_written_through_links(tmp_path):
    from lola.linearize.checkpoint import write_checkpoint

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "checkpoint.pt").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        write_checkpoint(tmp_path / "checkpoint.pt", {"step": 1})
    assert victim.read_bytes() == b"precious"
    (tmp_path / "checkpoint.pt").unlink()
    write_checkpoint(tmp_path / "checkpoint.pt", {"step": 1})
    write_checkpoint(tmp_path / "checkpoint.pt", {"step": 2})  # replaced, atomically, with its sum
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX) or p.suffix == ".tmp"]


def test_linearize_refuses_foreign_description_and_damaged_checkpoint(tmp_path, capsys, no_model):
    out = tmp_path / "run"
    out.mkdir()
    (out / "lola_config.json").write_text('{"model": "someone else\'s"}')
    before = snapshot(out)
    refused(capsys, ["linearize", "--quick", "--stage", "1", "--out", str(out)], "lola_config.json was not written by lola linearize")
    assert snapshot(out) == before
    (out / "lola_config.json").unlink()
    (out / "checkpoint.pt").write_bytes(b"PK\x03\x04 cut short")
    before = snapshot(out)
    refused(capsys, ["linearize", "--quick", "--stage", "1", "--out", str(out)], "checkpoint.pt is not a readable checkpoint")
    assert snapshot(out) == before


# -- lola niah's output folder ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["results.json", "samples.jsonl", "accuracy.png", "cache_bytes.png"])
@pytest.mark.parametrize("kind", ["link", "folder"])
def test_niah_refuses_links_and_folders_in_a_result_files_place(name, kind, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    if kind == "link":
        (out / name).symlink_to(victim)
        refused(capsys, [*FULL_NIAH, "--out", str(out)], f"{name} is a symbolic link")
    else:
        (out / name).mkdir()
        refused(capsys, [*FULL_NIAH, "--out", str(out)], f"{name} exists and is not a plain file")
    assert victim.read_text() == "precious"


def test_out_that_is_a_file_or_under_one_is_refused(tmp_path, capsys, no_model):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    refused(capsys, [*FULL_NIAH, "--out", str(afile)], f"--out {afile} is a file, not a folder")
    refused(capsys, [*FULL_NIAH, "--out", str(afile / "sub")], f"lies under {afile}, which is a file")
    refused(capsys, ["linearize", "--quick", "--out", str(afile)], "is a file, not a folder")
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", str(tmp_path)], "is a folder; give a file name")
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(tmp_path)], "is a folder; give a file name")
    assert afile.read_text() == "mine"


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="no /sys")
def test_out_in_an_unwritable_place_is_refused(capsys, no_model):
    try:
        os.rmdir(tempfile.mkdtemp(dir="/sys"))
        pytest.skip("/sys is writable here")
    except OSError:
        pass
    refused(capsys, [*FULL_NIAH, "--out", "/sys/lola-results"], "--out /sys/lola-results: cannot write in /sys")
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", "/sys/lola/ppl.json"], "cannot write in /sys")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder_is_refused(tmp_path, capsys, no_model):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        refused(capsys, [*FULL_NIAH, "--out", str(locked / "run")], "cannot write in")
    finally:
        locked.chmod(0o700)


def _lola_results() -> dict:
    """The start of the results.json that ``lola niah FULL_NIAH`` writes (its run and format marker)."""
    from lola.eval.runner import NiahRun

    run = NiahRun(model="tiny-random-llama", lengths=[400], samples=2, methods=["full"], max_new_tokens=1)
    return {"format": RESULTS_FORMAT, "run": run.model_dump(), "summary": {}}


SAMPLE = {
    "method": "full",
    "length": 400,
    "index": 0,
    "depth": 0.25,
    "prompt_tokens": 390,
    "answers": ["1234567"],
    "prediction": "1234567",
    "score": 1.0,
    "cache_bytes": 10,
    "tokens_per_second": 1.0,
}
RESULTS = json.dumps(_lola_results()).encode()


def _results_with(**run_changes) -> bytes:
    """A lola results.json whose run differs from FULL_NIAH's by ``run_changes``."""
    data = _lola_results()
    return json.dumps({**data, "run": {**data["run"], **run_changes}}).encode()


FOREIGN_FOLDERS = [
    ("another tool's results.json", {"results.json": b'{"accuracy": 0.5}\n'}, ["results.json was not written by lola niah", "lola-niah-results"]),
    ("a list as results.json", {"results.json": b"[1, 2]"}, ["was not written by lola niah"]),
    ("truncated results.json", {"results.json": RESULTS[:40]}, ["results.json is not a lola niah results file: invalid JSON"]),
    ("binary results.json", {"results.json": b"\x89PNG\r\n"}, ["results.json is not a lola niah results file: not UTF-8"]),
    ("a plot without results", {"accuracy.png": b"\x89PNG..."}, ["holds accuracy.png but no lola results.json"]),
    ("samples without results", {"samples.jsonl": b"{}\n"}, ["holds samples.jsonl but no lola results.json"]),
    (
        "garbled samples.jsonl",  # a cut last line is redone (tests/hostile/test_resume.py); a garbled one before it is refused
        {"results.json": RESULTS, "samples.jsonl": (json.dumps(SAMPLE) + "\n" + json.dumps(SAMPLE)[:30] + "\n" + json.dumps(SAMPLE) + "\n").encode()},
        ["samples.jsonl: line 2 is not a JSON record", "delete that line"],
    ),
    ("foreign samples.jsonl line", {"results.json": RESULTS, "samples.jsonl": b'{"id": 3}\n'}, ["samples.jsonl: line 1 is not a lola niah sample"]),
    ("a different run", {"results.json": _results_with(samples=3)}, ["holds a different run"]),
    ("a run this version refuses", {"results.json": _results_with(window=True)}, ["holds a run this version of lola refuses", "window"]),
]


@pytest.mark.parametrize("name, files, fragments", FOREIGN_FOLDERS, ids=[c[0] for c in FOREIGN_FOLDERS])
def test_niah_out_with_foreign_or_damaged_files_is_refused_and_left_intact(name, files, fragments, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    out.mkdir()
    for file, data in files.items():
        (out / file).write_bytes(data)
    before = snapshot(out)
    refused(capsys, [*FULL_NIAH, "--out", str(out)], *fragments)
    assert snapshot(out) == before


def test_a_run_resumed_in_a_hard_linked_copy_leaves_the_original_alone(tmp_path):
    import os

    from lola.eval.runner import run_niah
    from lola.models import tiny_random

    model, tok = tiny_random()
    run = NiahRun(model="tiny-random-llama", lengths=[400], samples=2, methods=["full"], max_new_tokens=2)
    run_niah(run, model, tok, tmp_path / "a", progress=False)
    samples = tmp_path / "a" / "samples.jsonl"
    samples.write_text(samples.read_text().splitlines()[0] + "\n")  # as if interrupted after one sample
    (tmp_path / "b").mkdir()
    for name in ("samples.jsonl", "results.json"):
        os.link(tmp_path / "a" / name, tmp_path / "b" / name)  # `cp -al a b`
    before = snapshot(tmp_path / "a")
    assert len(run_niah(run, model, tok, tmp_path / "b", progress=False)) == 2
    assert snapshot(tmp_path / "a") == before
    assert len((tmp_path / "b" / "samples.jsonl").read_text().splitlines()) == 2


def test_results_json_replaced_by_a_foreign_file_is_not_written_over(tmp_path):
    from lola.eval.niah_records import _write_results

    (tmp_path / "results.json").write_text('{"notes": "mine"}')
    with pytest.raises(ValueError, match="results.json exists and was not written by lola niah"):
        _write_results(tmp_path / "results.json", RUN, [], {}, {})
    assert (tmp_path / "results.json").read_text() == '{"notes": "mine"}'


# -- lola perplexity, lola calibrate and budgets ---------------------------------------------------


def test_perplexity_out_leaves_a_foreign_temporary_file_alone(tmp_path, capsys):
    out = tmp_path / "ppl.json"
    foreign_tmp = tmp_path / "ppl.json.tmp"  # the fixed temporary name earlier versions used
    foreign_tmp.write_text("someone's draft")
    argv = ["perplexity", "--model", "tiny-random-llama", "--lengths", "64", "--windows", "1", "--generate", "0", "--methods", "full"]
    assert main([*argv, "--out", str(out)]) == 0
    assert foreign_tmp.read_text() == "someone's draft"
    assert json.loads(out.read_text())["format"] == "lola-perplexity-results"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_perplexity_and_calibrate_leave_foreign_files_alone(tmp_path, capsys, no_model):
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}\n')
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", str(foreign)], "was not written by lola perplexity")
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(foreign)], "was not written by lola calibrate")
    assert foreign.read_text() == '{"mine": true}\n'


def test_perplexity_and_calibrate_refuse_links(tmp_path, capsys, no_model):
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    (tmp_path / "link.json").symlink_to(victim)
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", str(tmp_path / "link.json")], "symbolic link")
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(tmp_path / "link.json")], "symbolic link")
    assert victim.read_text() == "{}"


def test_budgets_save_refuses_foreign_files_and_links(tmp_path):
    from lola import budgets

    b = budgets.load("smollm2-135m-instruct")
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="notes.json exists and was not written by lola calibrate"):
        b.save(foreign)
    assert foreign.read_text() == '{"mine": 1}'
    (tmp_path / "link.json").symlink_to(foreign)
    with pytest.raises(ValueError, match="symbolic link"):
        b.save(tmp_path / "link.json")
    b.save(tmp_path / "b.json")
    b.save(tmp_path / "b.json")  # its own file: replaced
    assert budgets.load(tmp_path / "b.json") == b


# -- the lm-eval export ----------------------------------------------------------------------------


def _export(out, name="t"):
    from lola.integrations.lm_eval.niah import export_niah
    from lola.models import tiny_random

    _, tok = tiny_random()
    return export_niah(out, tok, lengths=[512], samples=1, name=name)


def test_export_niah_refuses_a_foreign_task_file_and_writes_nothing(tmp_path):
    out = tmp_path / "tasks"
    out.mkdir()
    (out / "t.yaml").write_text("task: someone_elses\n")
    with pytest.raises(ValueError, match=r"t.yaml exists and was not written by export-niah"):
        _export(out)
    assert snapshot(out) == {"t.yaml": b"task: someone_elses\n"}


@pytest.mark.parametrize("name", ["t_utils.py", "t.jsonl"])
def test_export_niah_leaves_foreign_files_at_the_old_names_alone(tmp_path, name):
    """Prompts and scoring are named by their content now: someone's file at the old fixed
    names is neither replaced nor removed."""
    out = tmp_path / "tasks"
    out.mkdir()
    (out / name).write_text("import os  # someone's module\n")
    _export(out)
    assert (out / name).read_text() == "import os  # someone's module\n"


def test_export_niah_replaces_its_own_files_and_refuses_links(tmp_path):
    from lola.integrations.lm_eval.niah import exported_files

    out = tmp_path / "tasks"
    first = _export(out)
    before = snapshot(out)
    assert _export(out) == first and snapshot(out) == before  # the same export again: replaced in place
    victim = tmp_path / "victim.py"
    victim.write_text("precious")
    utils = exported_files(first)[1]
    utils.unlink()
    utils.symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        _export(out)
    assert victim.read_text() == "precious"


def test_a_new_export_removes_the_files_of_the_previous_one(tmp_path):
    from lola.integrations.lm_eval.niah import export_niah, exported_files
    from lola.models import tiny_random

    out = tmp_path / "tasks"
    first = exported_files(_export(out))
    second = exported_files(export_niah(out, tiny_random()[1], lengths=[600], samples=1, name="t"))
    assert first != second and all(p.is_file() for p in second) and not any(p.exists() for p in first)


def test_export_niah_refuses_an_out_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="afile is a file, not a folder"):
        _export(tmp_path / "afile")


def test_the_export_never_reads_a_fifo_in_its_old_files_place(tmp_path):
    from lola.integrations.lm_eval.niah import _exported_by_us

    os.mkfifo(tmp_path / "lola_niah_single_1_utils.py")
    assert _exported_by_us(tmp_path / "lola_niah_single_1_utils.py") is False  # returns, never blocks


# -- permissions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_written_files_get_the_users_permissions(tmp_path, umask):
    # mkstemp creates 0600 and a rename keeps it: a results folder a server or a colleague cannot read.
    from lola.budgets import HeadBudgets
    from lola.io.outputs import write_files

    previous = os.umask(umask)
    try:
        write_files(tmp_path / "group", {"a.json": "{}", "b.bin": b"\0", "c.txt": lambda p: p.write_text("x")})
        write_files(tmp_path / "one", {"a.json": "{}"})
        HeadBudgets(sparse_size_per_head=[[2, 2]], uniform_sparse_size=2, scores=[[1.0, 1.0]], power=1.0).save(tmp_path / "budgets.json")
        files = [*(tmp_path / "group").iterdir(), tmp_path / "one" / "a.json", tmp_path / "budgets.json"]
    finally:
        os.umask(previous)
    assert {oct(f.stat().st_mode & 0o777) for f in files} == {oct(0o666 & ~umask)}


def test_sweep_leaves_a_sweep_json_it_did_not_write_alone(tmp_path, capsys, no_model):
    out = tmp_path / "s"
    out.mkdir()
    (out / "sweep.json").write_text('{"mine": true}\n')
    before = snapshot(out)
    refused(capsys, ["sweep", "--model", "tiny-random-llama", "--out", str(out)], "sweep.json exists and was not written by lola sweep")
    assert snapshot(out) == before


# -- owned folders: the run's description, the folder under a run, figures, sweeps ------------------


@pytest.mark.parametrize("kind", ["link", "fifo", "folder"])
def test_the_run_description_is_never_written_through_a_link_or_into_a_fifo(tmp_path, kind):
    from lola.io.outputs import RUN_FILE, run_lock

    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    folder = tmp_path / "r"
    folder.mkdir()
    holder = folder / RUN_FILE
    if kind == "link":
        holder.symlink_to(precious)
    elif kind == "fifo":
        os.mkfifo(holder)
    else:
        holder.mkdir()
    with pytest.raises(ValueError, match=r"\.lola-run\.json is .*remove it"):
        with run_lock(folder, "lola niah"):
            pass
    assert precious.read_text() == "mine"


@pytest.mark.parametrize("how", ["rename", "delete"])
def test_a_run_s_folder_moved_or_deleted_under_it_is_not_written_again_by_its_name(tmp_path, how):
    from lola.io.outputs import RUN_FILE, check_held, run_lock, write_files

    folder = tmp_path / "r"
    with run_lock(folder, "lola niah"):
        write_files(folder, {"results.json": "{}"})
        if how == "rename":
            folder.rename(tmp_path / "moved")
        else:
            shutil.rmtree(folder)
        with pytest.raises(RuntimeError, match=r"r was deleted or moved while the run was writing into it"):
            check_held(folder)
        with pytest.raises(RuntimeError, match="deleted or moved"):
            write_files(folder, {"results.json": "{}"})
    assert not folder.exists()  # not re-created
    if how == "rename":  # the description went with the folder, and was removed there
        assert not (tmp_path / "moved" / RUN_FILE).exists()
        assert (tmp_path / "moved" / "results.json").is_file()


def test_figures_lola_did_not_write_are_refused_before_the_run(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lola.io.figures import check_figures, is_lola_png, save_png

    fig = plt.figure()
    save_png(fig, tmp_path / "ours.png", dpi=20)
    fig.savefig(tmp_path / "plain.png", dpi=20, format="png")  # Matplotlib's own mark: lola before it marked them
    plt.close(fig)
    (tmp_path / "theirs.png").write_bytes(b"\x89PNG someone's figure")
    assert is_lola_png(tmp_path / "ours.png") and not is_lola_png(tmp_path / "theirs.png")
    assert not is_lola_png(tmp_path / "plain.png") and is_lola_png(tmp_path / "plain.png", folder_is_lola_s=True)
    check_figures(tmp_path, ["ours.png", "absent.png"], "results.json", "lola niah")
    for name in ("theirs.png", "plain.png"):  # (no results.json: the plain figure is nobody's known)
        with pytest.raises(ValueError, match=rf"{name} exists and was not written by lola niah"):
            check_figures(tmp_path, [name], "results.json", "lola niah")
    (tmp_path / "results.json").write_text("{}")
    check_figures(tmp_path, ["plain.png"], "results.json", "lola niah")


def test_a_sweep_may_grow_but_not_lose_its_points_or_change_its_options(tmp_path):
    from lola.eval.budget_sweep import BudgetSweep, _check_same_sweep

    saved = BudgetSweep(lengths=[400], budgets=["1/8"], haystacks=["noise"], samples=2)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"format": "lola-sweep", "sweep": json.loads(saved.model_dump_json())}))
    _check_same_sweep(path, saved)
    _check_same_sweep(path, saved.model_copy(update={"lengths": [400, 800], "haystacks": ["noise", "prose"]}))
    with pytest.raises(ValueError, match=r"--lengths \[400\] there, \[500\] here"):
        _check_same_sweep(path, saved.model_copy(update={"lengths": [500]}))
    with pytest.raises(ValueError, match=r"--samples 2 there, 3 here"):
        _check_same_sweep(path, saved.model_copy(update={"samples": 3}))


def test_linearize_refuses_a_folder_of_someone_else_s_files(tmp_path):
    from lola.cli import _check_linearize_out

    (tmp_path / "config.json").write_text("{}")  # an export, a model folder
    with pytest.raises(ValueError, match=r"--out .* holds files lola linearize did not write \(config.json\)"):
        _check_linearize_out(tmp_path, object(), None)
    (tmp_path / "config.json").unlink()
    (tmp_path / "checkpoint.pt").write_bytes(b"")  # its own, from a cut run: not refused by this check
    _check_linearize_out(tmp_path, None, None)


def test_one_output_is_written_by_one_run_at_a_time(tmp_path):
    # calibrate, perplexity --out, fit-scorer and export hold their output for the whole run
    import subprocess
    import sys

    from lola.io.outputs import output_lock

    out = tmp_path / "b.json"
    holder = tmp_path / ".lola-run-b.json.json"
    code = f"from lola.io.outputs import output_lock\nimport time\nwith output_lock({str(out)!r}, 'lola calibrate'):\n    print('held', flush=True)\n    time.sleep(60)"
    import lola

    env = {**os.environ, "PYTHONPATH": str(Path(lola.__file__).parents[1])}  # the lola under test
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert other.stdout.readline().strip() == "held", other.stderr.read() if other.poll() is not None else ""
        with pytest.raises(ValueError, match=rf"lola perplexity: .*b.json is being written by lola calibrate \(pid {other.pid}"):
            with output_lock(out, "lola perplexity"):
                pass
    finally:
        other.kill()
        other.wait()
    with output_lock(out, "lola perplexity"):  # the holder died: its lock went with it
        assert holder.is_file()
    assert not holder.exists()
    holder.symlink_to(tmp_path / "precious.txt")
    with pytest.raises(ValueError, match=r"is not a plain file"):
        with output_lock(out, "lola calibrate"):
            pass
