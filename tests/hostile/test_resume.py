"""Hostile inputs, class ``resume``: a run resumed on other inputs or options, or over records it
could not have written, is refused naming the option, file or record; the same inputs resume.

The mechanisms, each tested as a class (with examples other than those of the adversarial pass):

- Resumes fingerprint content, not names or paths: :func:`lola.io.checksums.content_digest` and
  :func:`~lola.io.checksums.changed_inputs` (the haystack, feature maps and budget files of
  ``lola niah``, the text of ``lola linearize`` and ``lola fit-scorer``), and the loaded model's
  weights (:func:`lola.linearize.checkpoint.weights_digest`); ``./hay.txt`` resumes ``hay.txt``.
- A stage-2 checkpoint fingerprints the stage-1 maps it started from
  (:func:`lola.linearize.checkpoint.stage1_digest`).
- ``lola fit-scorer``'s checkpoint ``OUT.partial`` is checked against the options, the text and
  the weights, and for damage, before it is resumed.
- A saved run other than the requested one is refused naming every option that differs, with
  its saved and requested values (``--sinks: saved 4, now 2``).
- Every line of ``samples.jsonl`` passes one validator, :class:`lola.eval.runner.SampleRecord`,
  checked against the run and against itself (its score, its depth, no key twice), and no
  sample may appear twice.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from lola.cli import main
from lola.data.text import source_digest
from lola.eval.runner import RESULTS_FORMAT, NiahRun, check_out_folder
from lola.io.checksums import changed_inputs, content_digest
from tests.hostile.common import (
    FULL_NIAH,
    OTHER_TEXT,
    RUN,
    Case,
    cut,
    edit_safetensors,
    fit_checkpoint,
    fit_spec,
    interrupted_fit,
    params,
    refused,
    resume_fit,
    snapshot,
    text_file,
    write_random_maps,
)

transformers = pytest.importorskip("transformers")


# -- the fingerprints ------------------------------------------------------------------------------


def test_content_not_path(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("same")
    b.write_text("same")
    assert content_digest(a) == content_digest(b)
    b.write_text("other")
    assert content_digest(a) != content_digest(b)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    for d in ("d1", "d2"):
        (tmp_path / d / "x.txt").write_text("x")
    assert content_digest(tmp_path / "d1") == content_digest(tmp_path / "d2")
    (tmp_path / "d2" / "x.txt").rename(tmp_path / "d2" / "y.txt")  # the same bytes under another name
    assert content_digest(tmp_path / "d1") != content_digest(tmp_path / "d2")
    with pytest.raises(FileNotFoundError):
        content_digest(tmp_path / "missing")


def test_text_sources_are_fingerprinted_by_content(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("one")
    before = source_digest([str(f), "pydoc"])
    assert source_digest([str(f), "pydoc"]) == before
    f.write_text("two")
    assert source_digest([str(f), "pydoc"]) != before
    assert source_digest(None) == source_digest("default") != source_digest("pydoc")


def test_changed_inputs_compares_what_both_recorded():
    assert changed_inputs({"a": "1", "b": "2"}, {"a": "1", "b": "3"}) == ["b"]
    assert changed_inputs(None, {"a": "1"}) == []  # a run from before fingerprints
    assert changed_inputs({"a": "1"}, {"a": "1", "new": "x"}) == []


# -- lola niah -------------------------------------------------------------------------------------


NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--max-new-tokens", "1"]


def _niah(out, *extra):
    return main([*NIAH, "--out", str(out), *extra])


def test_niah_resume_on_a_changed_haystack_is_refused(tmp_path, capsys):
    hay = tmp_path / "hay.txt"
    hay.write_text("The grass is green. The sky is blue. " * 200)
    assert _niah(tmp_path / "r", "--methods", "full", "--haystack-file", str(hay)) == 0
    assert _niah(tmp_path / "r", "--methods", "full", "--haystack-file", str(hay)) == 0  # same content: resumes (nothing left)
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert saved["inputs"]["haystack_file"] == content_digest(hay)
    capsys.readouterr()
    hay.write_text("Completely different text about rivers. " * 200)
    before = (tmp_path / "r" / "results.json").read_bytes()
    assert _niah(tmp_path / "r", "--methods", "full", "--haystack-file", str(hay)) == 2
    err = capsys.readouterr().err
    assert "--haystack-file changed since it started" in err and err.count("\n") == 1
    assert (tmp_path / "r" / "results.json").read_bytes() == before


def test_niah_resume_on_retrained_feature_maps_is_refused(tmp_path, capsys):
    maps = tmp_path / "maps"
    write_random_maps(maps, seed=0)
    args = ["--methods", "hybrid", "--feature-maps", str(maps), "--window", "16", "--sparse-size", "8"]
    assert _niah(tmp_path / "r", *args) == 0
    capsys.readouterr()
    shutil.rmtree(maps)
    write_random_maps(maps, seed=1)  # retrained into the same folder
    assert _niah(tmp_path / "r", *args) == 2
    assert "--feature-maps changed since it started" in capsys.readouterr().err


def test_niah_resume_on_a_rewritten_budgets_file_is_refused(tmp_path, capsys):
    from lola import budgets
    from lola.models import tiny_random

    model, _ = tiny_random()
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    scores = torch.rand(layers, kv)
    path = tmp_path / "b.json"

    def made(s):
        return budgets.HeadBudgets(uniform_sparse_size=8, sparse_size_per_head=budgets.allocate(s, 8).tolist(), scores=s.tolist(), power=0.5)

    made(scores).save(path)
    args = ["--methods", "lola", "--window", "16", "--sparse-size", "8", "--budgets", str(path)]
    assert _niah(tmp_path / "r", *args) == 0
    capsys.readouterr()
    made(torch.tensor([[1.0] + [0.0] * (kv - 1)] * layers)).save(path)  # recalibrated into the same file
    assert _niah(tmp_path / "r", *args) == 2
    assert "--budgets changed since it started" in capsys.readouterr().err


def test_a_resume_on_other_weights_under_the_same_name_is_refused(tmp_path):
    from lola.eval.runner import run_inputs
    from lola.models import tiny_random

    first, _ = tiny_random(seed=3)
    out = tmp_path / "r"
    _saved(out, records=[_record()])
    data = json.loads((out / "results.json").read_text())
    data["inputs"] = run_inputs(RUN, first)
    (out / "results.json").write_text(json.dumps(data))
    assert set(check_out_folder(out, RUN, first)) == {("window", 300, 1)}
    assert set(check_out_folder(out, RUN)) == {("window", 300, 1)}  # before loading: not compared yet
    with pytest.raises(ValueError, match="--model tiny-random-llama now loads weights that differ"):
        check_out_folder(out, RUN, tiny_random(seed=4)[0])


def test_the_weights_fingerprint_ignores_device_and_dtype_but_not_values():
    from lola.linearize.checkpoint import weights_digest
    from lola.models import tiny_random

    model, _ = tiny_random(seed=5)
    model = model.to(torch.bfloat16)
    again = tiny_random(seed=5)[0].to(torch.bfloat16).to(torch.float32)  # the same bfloat16 values
    assert weights_digest(model) == weights_digest(again)
    with torch.no_grad():
        next(again.parameters()).view(-1)[0] += 1
    assert weights_digest(model) != weights_digest(again)


def test_every_value_fingerprint_sees_what_the_sample_skips():
    """One function, two strengths: resumes sample each tensor; a saved cache hashes every byte."""
    from lola.io.checksums import WEIGHT_SAMPLES, weights_digest
    from lola.models import tiny_random

    model, again = tiny_random(seed=5)[0], tiny_random(seed=5)[0]
    name, big = max(again.state_dict().items(), key=lambda item: item[1].numel())
    assert big.numel() > 2 * WEIGHT_SAMPLES, name
    with torch.no_grad():
        big.view(-1)[1] += 1  # between the first two sampled values
    assert weights_digest(model) == weights_digest(again)
    assert weights_digest(model, every_value=True) != weights_digest(again, every_value=True)
    assert weights_digest(model, every_value=True) != weights_digest(model.to(torch.bfloat16), every_value=True)  # the dtype counts


def test_a_haystack_named_by_another_path_resumes_and_other_content_does_not(tmp_path, monkeypatch):
    from lola.eval.runner import run_inputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.txt").write_text("Once upon a time. " * 50)
    (tmp_path / "copy.txt").write_text("Once upon a time. " * 50)
    (tmp_path / "other.txt").write_text("Something else entirely. " * 50)
    saved = RUN.model_copy(update={"haystack_file": "book.txt"})
    out = tmp_path / "r"
    _saved(out, saved)
    data = json.loads((out / "results.json").read_text())
    data["inputs"] = run_inputs(saved)
    (out / "results.json").write_text(json.dumps(data))
    for path in (str(tmp_path / "book.txt"), "./book.txt", "copy.txt"):
        check_out_folder(out, RUN.model_copy(update={"haystack_file": path}))
    with pytest.raises(ValueError, match="--haystack-file: saved 'book.txt', now 'other.txt'"):
        check_out_folder(out, RUN.model_copy(update={"haystack_file": "other.txt"}))


def test_ctrl_c_keeps_partial_results_and_resumes(tmp_path, capsys, scripted_model):
    script, calls = scripted_model
    out = tmp_path / "o"
    script.extend([None, KeyboardInterrupt()])  # the second sample is interrupted
    assert main([*FULL_NIAH, "--out", str(out)]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"lola niah: interrupted; finished samples are kept in {out / 'samples.jsonl'}; run the same command again to resume"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 1
    assert json.loads((out / "results.json").read_text())["summary"]["full"]["400"]["samples"] == 1

    # While a resume runs, and after it fails, results.json still summarises the saved sample
    # (it used to be rewritten with an empty summary first).
    def fail_after_looking():
        seen.append(json.loads((out / "results.json").read_text())["summary"])
        raise ValueError("generation failed")

    seen: list = []
    script.append(fail_after_looking)
    assert main([*FULL_NIAH, "--out", str(out)]) == 2
    assert "lola niah: error: generation failed" in capsys.readouterr().err
    assert seen[0]["full"]["400"]["samples"] == 1
    assert json.loads((out / "results.json").read_text())["summary"]["full"]["400"]["samples"] == 1

    assert main([*FULL_NIAH, "--out", str(out)]) == 0  # the same command resumes and finishes
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2 and len(calls) == 4


# -- lola linearize --------------------------------------------------------------------------------


def test_linearize_resume_on_a_changed_text_is_refused(tmp_path):
    from lola.linearize import LinearizeConfig, linearize
    from lola.models import tiny_random

    text = tmp_path / "train.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    cfg = LinearizeConfig(steps=2, chunk_tokens=64, train_chunks=1, eval_chunks=1, window=8, checkpoint_every=1, text=[str(text)])
    model, tok = tiny_random()
    linearize(model, tok, cfg, tmp_path / "out", progress=False, log=lambda s: None)
    more = cfg.model_copy(update={"steps": 3})
    text.write_text("Entirely other words for the second run, about ships. " * 400)
    with pytest.raises(ValueError, match=r"--text .* changed since"):
        linearize(model, tok, more, tmp_path / "out", progress=False, log=lambda s: None)
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)  # restored: resumes
    linearize(model, tok, more, tmp_path / "out", progress=False, log=lambda s: None)


def test_linearize_command_refuses_a_changed_text_before_loading(tmp_path, capsys, request):
    text = tmp_path / "train.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    out = tmp_path / "out"
    argv = ["linearize", "--quick", "--stage", "1", "--text", str(text), "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert (out / "checkpoint.pt").is_file()  # kept: a longer run resumes from it, on the same text only
    text.write_text("Entirely other words. " * 400)

    no_model = request.getfixturevalue("no_model")  # from here on, loading a model fails the test
    assert no_model is None
    assert main([*argv, "--steps", "8"]) == 2
    assert "--text" in capsys.readouterr().err


def _checkpoint(tmp_path, inputs: dict, **config):
    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import write_checkpoint

    cfg = LinearizeConfig(steps=4, **config)
    path = tmp_path / "checkpoint.pt"
    write_checkpoint(path, {"config": cfg.model_dump(), "step": 2, "inputs": inputs})
    return path


def test_a_training_resume_on_other_teacher_weights_is_refused(tmp_path):
    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, {"text": "t", "model": "weights-a"})
    assert load_checkpoint(path, LinearizeConfig(steps=6), "--steps", {"text": "t", "model": "weights-a"})["step"] == 2
    with pytest.raises(ValueError, match="other model weights: --model"):
        load_checkpoint(path, LinearizeConfig(steps=6), "--steps", {"text": "t", "model": "weights-b"})


def test_training_text_is_compared_by_content_not_by_path(tmp_path):
    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, {"text": "digest-1"}, text=["notes/a.txt"])
    load_checkpoint(path, LinearizeConfig(steps=6, text=["elsewhere/b.txt"]), "--steps", {"text": "digest-1"})
    with pytest.raises(ValueError, match="other options .*text"):
        load_checkpoint(path, LinearizeConfig(steps=6, text=["elsewhere/b.txt"]), "--steps", {"text": "digest-2"})


def test_a_checkpoint_sum_that_is_not_a_file_is_refused_without_reading_it(tmp_path):

    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, {})
    (tmp_path / "checkpoint.pt.sha256").unlink()
    os.mkfifo(tmp_path / "checkpoint.pt.sha256")
    with pytest.raises(ValueError, match=r"checkpoint.pt.sha256 is not a regular file"):
        load_checkpoint(path, LinearizeConfig(steps=6), "--steps")


# -- stage 2 resumes only from the stage-1 maps it started from ------------------------------------


STAGE2_TEXT = ["pydoc"]


def _stage2_checkpoint(out, maps) -> None:
    """A stage-2 checkpoint in ``out`` as finetune writes it, started from the maps in ``maps``."""
    from lola.linearize import FinetuneConfig
    from lola.linearize.checkpoint import run_inputs, write_checkpoint
    from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE

    cfg = FinetuneConfig(steps=4, text=STAGE2_TEXT)
    write_checkpoint(out / FINETUNE_CHECKPOINT_FILE, {"step": 2, "config": cfg.model_dump(), "inputs": run_inputs(cfg, stage1_maps=maps)})


def _stage2_output(folder, started_from: str | None) -> None:
    """Stage 2's own output over the stage-1 folder: new maps, LoRA weights and a report that
    records the fingerprint of the maps it started from."""
    from lola.pretrained.folder import FINETUNE_REPORT_FILE
    from lola.pretrained.lora import LoraSpec

    report = {"inputs": {"feature_maps": started_from}} if started_from is not None else {}
    write_random_maps(
        folder, seed=7, lora={"base_model.q_proj.lora_A.weight": torch.zeros(8, 64)}, lora_spec=LoraSpec(), reports={FINETUNE_REPORT_FILE: report}
    )


def _retrained(folder, maps_folder) -> None:
    write_random_maps(maps_folder, seed=1)  # stage 1 again: other maps, adapters and stage-2 report removed


def _retrained_after_stage2(folder, maps_folder) -> None:
    from lola.linearize.checkpoint import stage1_digest

    _stage2_output(maps_folder, stage1_digest(maps_folder))
    write_random_maps(maps_folder, seed=1)


def _other_folder(folder, maps_folder) -> None:
    write_random_maps(folder / "other", seed=3)
    return folder / "other"


CHANGED_BASE = [
    ("stage 1 retrained", _retrained),
    ("stage 1 retrained over stage 2's output", _retrained_after_stage2),
    ("another --feature-maps", _other_folder),
]


@pytest.mark.parametrize("change", [c for _, c in CHANGED_BASE], ids=[n for n, _ in CHANGED_BASE])
def test_a_stage2_checkpoint_of_other_stage1_maps_is_refused(change, tmp_path):
    from lola.linearize import FinetuneConfig
    from lola.linearize.checkpoint import load_checkpoint, run_inputs
    from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE

    out = tmp_path / "lin"
    write_random_maps(out)
    _stage2_checkpoint(out, out)
    maps = change(tmp_path, out) or out
    cfg = FinetuneConfig(steps=4, text=STAGE2_TEXT)
    with pytest.raises(ValueError, match="other stage-1 feature maps .* delete checkpoint-stage2.pt and checkpoint-stage2.pt.sha256"):
        load_checkpoint(out / FINETUNE_CHECKPOINT_FILE, cfg, "--stage2-steps", run_inputs(cfg, stage1_maps=maps))


@pytest.mark.parametrize(
    "after",
    [lambda out, digest: None, lambda out, digest: _stage2_output(out, digest), lambda out, digest: _stage2_output(out, None)],
    ids=["interrupted: the stage-1 maps", "finished: stage 2's own output", "finished before fingerprints"],
)
def test_a_stage2_checkpoint_resumes_over_its_own_base(after, tmp_path):
    from lola.linearize import FinetuneConfig
    from lola.linearize.checkpoint import load_checkpoint, run_inputs, stage1_digest
    from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE

    out = tmp_path / "lin"
    write_random_maps(out)
    _stage2_checkpoint(out, out)
    after(out, stage1_digest(out))
    cfg = FinetuneConfig(steps=4, text=STAGE2_TEXT)
    assert load_checkpoint(out / FINETUNE_CHECKPOINT_FILE, cfg, "--stage2-steps", run_inputs(cfg, stage1_maps=out))["step"] == 2


LINEARIZE = ["linearize", "--quick", "--checkpoint-every", "1"]
STAGE1 = ["--stage", "1", "--train-chunks", "1"]  # --train-chunks sets stage 1 alone: refused with --stage 2


def test_lola_linearize_stage2_refuses_its_checkpoint_after_stage1_is_retrained(tmp_path, capsys):
    """The whole flow: stage 1, stage 2, stage 1 again with more steps (new maps), stage 2 with
    more steps must not continue from the old maps."""
    from lola.cli import main

    out = str(tmp_path / "lin")
    assert main([*LINEARIZE, *STAGE1, "--steps", "1", "--out", out]) == 0
    assert main([*LINEARIZE, "--stage", "2", "--stage2-steps", "1", "--out", out]) == 0
    assert main([*LINEARIZE, "--stage", "2", "--stage2-steps", "2", "--out", out]) == 0  # its own output: resumed
    assert "resuming stage 2 from step 1" in capsys.readouterr().out
    # Two steps more (the first step of an extended run has the old schedule's last rate, 0).
    assert main([*LINEARIZE, *STAGE1, "--steps", "3", "--out", out, "--overwrite"]) == 0
    capsys.readouterr()
    refused(capsys, [*LINEARIZE, "--stage", "2", "--stage2-steps", "3", "--out", out], "other stage-1 feature maps", "delete checkpoint-stage2.pt")


# -- lola fit-scorer: its checkpoint OUT.partial against changed inputs and killed writes ----------


def _resume_on_changed_text(tmp_path):
    out, spec = interrupted_fit(tmp_path)
    (tmp_path / "text.txt").write_text(OTHER_TEXT)  # the same path, other words
    resume_fit(out, spec)


def _resume_on_a_grown_folder(tmp_path):
    text_file(tmp_path / "texts", "a.txt")
    out, spec = interrupted_fit(tmp_path, fit_spec(tmp_path / "texts"))
    text_file(tmp_path / "texts", "b.txt", OTHER_TEXT)  # a second document joins the folder
    resume_fit(out, spec)


def _resume_on_other_weights(tmp_path):
    from lola.models import tiny_random

    out, spec = interrupted_fit(tmp_path)
    resume_fit(out, spec, model=tiny_random(seed=1)[0])  # same --model name, other weights


def _resume_with(**changes):
    def run(tmp_path):
        out, spec = interrupted_fit(tmp_path)
        resume_fit(out, spec.model_copy(update=changes))

    return run


def _resume_with_another_text(tmp_path):
    out, spec = interrupted_fit(tmp_path)
    resume_fit(out, spec.model_copy(update={"text": [*spec.text, str(text_file(tmp_path, "more.txt", OTHER_TEXT))]}))


def _resume_after(damage):
    def run(tmp_path):
        out, spec = interrupted_fit(tmp_path)
        damage(fit_checkpoint(out))
        resume_fit(out, spec)

    return run


def _set_meta(key, value):
    return lambda path: edit_safetensors(path, meta=lambda m: m.update({key: value}))


def _set_tensor(key, make):
    return lambda path: edit_safetensors(path, tensors=lambda t: t.update({key: make(t)}))


def _drop_tensor(key):
    return lambda path: edit_safetensors(path, tensors=lambda t: t.pop(key))


def _nan_into(key):
    def edit(tensors):
        bad = tensors[key].clone()
        bad.view(-1)[0] = float("nan")
        tensors[key] = bad

    return lambda path: edit_safetensors(path, tensors=edit)


def _folder_in_place(path):
    path.unlink()
    path.mkdir()


def _link_in_place(path):
    kept = path.with_name("elsewhere.partial")
    path.rename(kept)
    path.symlink_to(kept)


PARTIAL = r"s\.safetensors\.partial"


FIT_RESUMES = [
    Case("text file rewritten under the same path", _resume_on_changed_text, ValueError, PARTIAL + r".*--text .*changed"),
    Case("text folder given one more document", _resume_on_a_grown_folder, ValueError, PARTIAL + r".*--text .*changed"),
    Case("model of the same name with other weights", _resume_on_other_weights, ValueError, PARTIAL + r".*--model"),
    Case("--documents raised", _resume_with(documents=3), ValueError, PARTIAL + r".*--documents: saved 2, now 3"),
    Case("--target switched", _resume_with(target="kvzip"), ValueError, PARTIAL + r".*--target: saved 'future', now 'kvzip'"),
    Case("--min-distance changed", _resume_with(min_distance=9), ValueError, PARTIAL + r".*--min-distance: saved 8, now 9"),
    Case("--length changed", _resume_with(length=128), ValueError, PARTIAL + r".*--length: saved 96, now 128"),
    Case("--ridge changed", _resume_with(ridge=0.5), ValueError, PARTIAL + r".*--ridge: saved 0.001, now 0.5"),
    Case("a text source added", _resume_with_another_text, ValueError, PARTIAL + r".*--text: saved"),
    Case("checkpoint cut in half", _resume_after(cut), ValueError, PARTIAL + r".*(truncated|damaged|not a readable)"),
    Case("checkpoint empty", _resume_after(lambda p: p.write_bytes(b"")), ValueError, PARTIAL + r".*(truncated|damaged|not a readable)"),
    Case("checkpoint with a garbled spec", _resume_after(_set_meta("spec", "{not json")), ValueError, PARTIAL + r".*(damaged|not a readable)"),
    Case("done beyond --documents", _resume_after(_set_meta("done", "7")), ValueError, PARTIAL + r".*done"),
    Case("done negative", _resume_after(_set_meta("done", "-1")), ValueError, PARTIAL + r".*done"),
    Case("done not a number", _resume_after(_set_meta("done", "two")), ValueError, PARTIAL + r".*(done|not a readable)"),
    Case(
        "statistics of another geometry",
        _resume_after(_set_tensor("xtx", lambda t: torch.zeros(1, 1, 3, 3, dtype=torch.float64))),
        ValueError,
        PARTIAL + r".*xtx",
    ),
    Case("statistics holding NaN", _resume_after(_nan_into("xty")), ValueError, PARTIAL + r".*xty"),
    Case("statistics missing a tensor", _resume_after(_drop_tensor("n")), ValueError, PARTIAL + r".*'n'"),
    Case("statistics with a foreign tensor", _resume_after(_set_tensor("bias", lambda t: torch.zeros(3))), ValueError, PARTIAL + r".*bias"),
    Case("statistics as integers", _resume_after(_set_tensor("xtx", lambda t: t["xtx"].long())), ValueError, PARTIAL + r".*xtx"),
    Case("counts negative", _resume_after(_set_tensor("n", lambda t: -t["n"])), ValueError, PARTIAL + r".*'n'"),
    Case("a folder in the checkpoint's place", _resume_after(_folder_in_place), ValueError, PARTIAL + r".*not a plain file"),
    Case("a link in the checkpoint's place", _resume_after(_link_in_place), ValueError, PARTIAL + r".*symbolic link"),
]


@pytest.mark.parametrize("case", params(FIT_RESUMES))
def test_a_fit_scorer_resume_on_changed_or_damaged_inputs_is_refused(case, tmp_path):
    with pytest.raises(case.error, match=case.match):
        case.run(tmp_path)
    assert not (tmp_path / "s.safetensors").exists()  # no scorer mixed from two fits


def test_a_resume_on_unchanged_inputs_still_finishes(tmp_path):
    """The refusals above are not refusals of every resume: the same inputs resume."""
    out, spec = interrupted_fit(tmp_path)
    scorer = resume_fit(out, spec)
    assert scorer.num_layers == 2 and not fit_checkpoint(out).exists()


# -- records of a saved run: the options it ran with, every line of samples.jsonl ------------------


# What `lola niah NIAH_ARGS` runs (RUN): the run every saved folder below holds.
NIAH_ARGS = ["niah", "--model", "tiny-random-llama", "--lengths", "200", "300", "--samples", "2", "--methods", "full", "window", "--max-new-tokens", "2"]


def _saved(out, run: NiahRun = RUN, records: list | None = None) -> None:
    """A results folder as ``lola niah`` leaves it: ``results.json`` of ``run`` and the lines of ``records``."""
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps({"format": RESULTS_FORMAT, "run": run.model_dump(), "inputs": {}, "summary": {}}))
    if records is not None:
        (out / "samples.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _record(**changes) -> dict:
    """A record ``lola niah`` writes for RUN, with ``changes`` (``None`` removes the key)."""
    rec = {
        "method": "window",
        "length": 300,
        "index": 1,
        "depth": 0.75,
        "prompt_tokens": 290,
        "answers": ["1234567"],
        "prediction": "1234567",
        "score": 1.0,
        "cache_bytes": 4096,
        "seconds": 0.5,
        "tokens_per_second": 580.0,
    }
    index = changes.get("index")
    if "depth" not in changes and isinstance(index, int) and not isinstance(index, bool) and 0 <= index < RUN.samples:
        rec["depth"] = (index + 0.5) / RUN.samples  # the depth this sample has (niah_prompts)
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not None}


def _refusal_of_second_record(bad, tmp_path) -> str:
    """The message refusing a saved folder of RUN whose samples.jsonl holds a valid record, then ``bad``."""
    out = tmp_path / "r"
    _saved(out, records=[_record(index=0), bad])
    with pytest.raises(ValueError) as err:
        check_out_folder(out, RUN)
    return str(err.value)


CHANGED = [
    ({"sinks": 2}, ["--sinks: saved 4, now 2"]),
    ({"sparse_size": 16}, ["--sparse-size: saved 192, now 16"]),
    ({"samples": 3}, ["--samples: saved 2, now 3"]),
    ({"chunk": 32}, ["--chunk: saved 64, now 32"]),
    ({"methods": ["full"]}, ["--methods: saved ['full', 'window'], now ['full']"]),
    ({"task": "niah_multikey_2"}, ["--task: saved 'niah_single_1', now 'niah_multikey_2'"]),
    ({"methods": ["full", "window", "lola"], "variants": {"a": {"policy": "recency"}}}, ["--methods: saved", "variants (--config): saved {}, now {'a'"]),
    ({"sinks": 0, "mixing": "lolcats"}, ["--sinks: saved 4, now 0", "--mixing: saved None, now 'lolcats'"]),  # every change, not the first
]


@pytest.mark.parametrize("changes, fragments", CHANGED, ids=["+".join(c) for c, _ in CHANGED])
def test_a_resume_with_other_options_names_each_with_both_values(changes, fragments, tmp_path):
    _saved(tmp_path / "r")
    with pytest.raises(ValueError, match="holds a different run") as err:
        check_out_folder(tmp_path / "r", RUN.model_copy(update=changes))
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
    assert "--model" not in str(err.value)  # only what differs


def test_lola_niah_names_the_changed_option_before_loading(tmp_path, capsys, no_model):
    out = tmp_path / "r"
    _saved(out, records=[_record()])
    before = snapshot(out)
    refused(capsys, [*NIAH_ARGS, "--sinks", "2", "--out", str(out)], "--sinks: saved 4, now 2", "use another --out")
    assert snapshot(out) == before


BAD_RECORDS = [
    ("a method the run does not have", _record(method="lola-random"), "method 'lola-random'"),
    ("a method that is not a string", _record(method=7), "method"),
    ("a length the run does not have", _record(length=250), "length 250"),
    ("a length as a string", _record(length="300"), "length"),
    ("an index at the sample count", _record(index=2), "index 2"),
    ("a negative index", _record(index=-1), "index"),
    ("a float index", _record(index=1.0), "index"),
    ("a negative score", _record(score=-0.5), "score"),
    ("a bool score", _record(score=True), "score"),
    ("an infinite score", _record(score=math.inf), "score"),
    ("a depth above 1", _record(depth=1.5), "depth"),
    ("a null depth", {**_record(), "depth": None}, "depth"),
    ("negative cache bytes", _record(cache_bytes=-1), "cache_bytes"),
    ("fractional cache bytes", _record(cache_bytes=1.5), "cache_bytes"),
    ("a speed as a word", _record(tokens_per_second="fast"), "tokens_per_second"),
    ("an unknown key", _record(note="edited"), "note"),
    ("no score", _record(score=None), "score"),
    ("no prediction", _record(prediction=None), "prediction"),
    ("no answers", _record(answers=None), "answers"),
    ("no prompt length", _record(prompt_tokens=None), "prompt_tokens"),
    ("a JSON array", "[1, 2]", "not a lola niah sample"),
]


@pytest.mark.parametrize("name, bad, fragment", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_a_record_this_run_could_not_have_written_is_refused_naming_file_line_and_field(name, bad, fragment, tmp_path):
    message = _refusal_of_second_record(bad, tmp_path)
    assert "samples.jsonl: line 2 is not a lola niah sample" in message and fragment in message, message


@pytest.mark.parametrize(
    "copy",
    [_record(), _record(score=0.0, prediction="no digits"), _record(cache_bytes=1, seconds=0.7)],
    ids=["an identical copy", "another score", "other details"],
)
def test_a_sample_recorded_twice_is_refused_naming_both_lines(copy, tmp_path):
    # Either copy could be the wrong one: neither is kept silently.
    out = tmp_path / "r"
    _saved(out, records=[_record(index=0), _record(), copy])
    with pytest.raises(ValueError, match=r"samples.jsonl: line 3 repeats sample 1 of window at length 300 \(first on line 2\)"):
        check_out_folder(out, RUN)


def test_valid_records_are_read_back(tmp_path):
    out = tmp_path / "r"
    fewest = _record(method="full", length=200, index=0, seconds=None, tokens_per_second=None)  # the timings are optional
    _saved(out, records=[_record(), fewest])
    done = check_out_folder(out, RUN)
    assert set(done) == {("window", 300, 1), ("full", 200, 0)} and done[("window", 300, 1)]["score"] == 1.0


def test_a_record_stripped_of_what_proves_its_score_is_refused(tmp_path):
    # Cut to method, length, index, depth, score and cache_bytes, a record's score (flipped, say)
    # could no longer be recomputed, nor its prompt compared: it is refused, not trusted.
    stripped = {k: _record(index=0)[k] for k in ("method", "length", "index", "depth", "score", "cache_bytes")}
    message = _refusal_of_second_record({**stripped, "score": 0.0}, tmp_path)
    for fragment in ("samples.jsonl: line 2", "prompt_tokens", "answers", "prediction", "Field required", "use another --out"):
        assert fragment in message, (fragment, message)


def test_lola_niah_refuses_a_bad_record_before_loading_and_keeps_the_folder(tmp_path, capsys, no_model):
    out = tmp_path / "r"
    _saved(out, records=[_record(), _record(index=0, score=2.5)])
    before = snapshot(out)
    refused(capsys, [*NIAH_ARGS, "--out", str(out)], "samples.jsonl: line 2", "score")
    assert snapshot(out) == before


CONTRADICTIONS = [
    ("a miss scored as a hit", _record(score=1.0, prediction="I do not know"), "score 1.0 is not what its prediction scores"),
    ("a hit scored as a miss", _record(score=0.0, prediction="it is 1234567"), "score 0.0 is not what its prediction scores"),
    ("the depth of another sample", _record(depth=0.25), "depth 0.25 is not the depth of sample 1"),
    ("the depth of a 4-sample run", _record(depth=0.875), "depth 0.875"),
    ('"method" given twice', '{"method": "full", ' + json.dumps(_record())[1:], "key 'method' appears twice"),
]


@pytest.mark.parametrize("name, bad, fragment", CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_a_record_that_contradicts_itself_or_the_run_is_refused(name, bad, fragment, tmp_path):
    message = _refusal_of_second_record(bad, tmp_path)
    assert "samples.jsonl: line 2" in message and fragment in message, message


# -- records cut short by a kill, and two runs on one folder ------------------------------------------


def _cut_last_record(path: Path) -> None:
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: last + (len(data) - last) // 2])  # half of the last record, no newline


def test_a_niah_run_resumed_after_its_last_record_was_cut_redoes_that_sample(tmp_path, capsys):
    from lola.cli import main

    out = tmp_path / "n"
    assert main([*FULL_NIAH, "--out", str(out)]) == 0
    samples = out / "samples.jsonl"
    whole = [json.loads(line) for line in samples.read_text().splitlines()]
    _cut_last_record(samples)
    for _ in range(2):  # and once more: the folder stays readable
        assert main([*FULL_NIAH, "--out", str(out)]) == 0
        again = [json.loads(line) for line in samples.read_text().splitlines()]
        assert len(again) == len(whole) and {(r["method"], r["length"], r["index"]) for r in again} == {(r["method"], r["length"], r["index"]) for r in whole}


def test_a_probe_resumed_after_its_last_record_was_cut_redoes_that_sample(tmp_path):
    from lola.cli import main

    argv = [
        "probe",
        "--model",
        "tiny-random-llama",
        "--lengths",
        "400",
        "--samples",
        "2",
        "--methods",
        "hybrid",
        "--max-new-tokens",
        "1",
        "--out",
        str(tmp_path / "p"),
    ]
    assert main(argv) == 0
    records = tmp_path / "p" / "probe.jsonl"
    n = len(records.read_text().splitlines())
    _cut_last_record(records)
    for _ in range(2):
        assert main(argv) == 0
        lines = records.read_text().splitlines()
        assert len(lines) == n and all(json.loads(line) for line in lines)


@pytest.mark.parametrize("command", ["niah", "probe", "linearize"])
def test_a_second_run_on_a_folder_in_use_is_refused_at_once_naming_the_holder(command, tmp_path, capsys):
    # Two runs appending to one folder would each redo the other's samples (16 records for 8).
    import subprocess
    import sys
    import time

    from lola.io.outputs import RUN_FILE

    out = tmp_path / "busy"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from lola.io.outputs import run_lock; import time\nwith run_lock({str(out)!r}, 'lola niah'):\n    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = {
            "niah": [*FULL_NIAH, "--out", str(out)],
            "probe": ["probe", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "hybrid", "--out", str(out)],
            "linearize": ["linearize", "--quick", "--out", str(out)],
        }[command]
        start = time.monotonic()
        err = refused(capsys, argv, f"{out} is in use by lola niah (pid {holder.pid}", "wait for it to finish, or write to another folder")
        assert time.monotonic() - start < 30 and err  # at once, not after the write lock's wait
        assert sorted(p.name for p in out.iterdir()) == [RUN_FILE]  # nothing of the second run written
    finally:
        holder.kill()
        holder.wait()


def test_probe_records_without_the_probe_file_naming_their_run_are_refused(tmp_path, capsys):
    out = tmp_path / "p"
    out.mkdir()
    (out / "probe.jsonl").write_text('{"method": "hybrid", "length": 400, "index": 0, "layers": {}}\n')
    argv = ["probe", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "hybrid", "--out", str(out)]
    refused(capsys, argv, "probe.jsonl has no probe.json beside it")
    assert sorted(p.name for p in out.iterdir()) == ["probe.jsonl"]


def test_linearize_over_a_finished_run_replaces_nothing_without_overwrite(tmp_path, capsys):
    # Both stages finished: stage 1 again (other --steps) wrote new maps and deleted the
    # adapters and their report without a word.
    from lola.cli import main

    out = tmp_path / "lin"
    assert main(["linearize", "--quick", "--out", str(out)]) == 0
    capsys.readouterr()
    before = snapshot(out)
    refused(
        capsys,
        ["linearize", "--quick", "--stage", "1", "--steps", "9", "--out", str(out)],
        "holds a finished run",
        "delete the stage-2 adapters",
        "--overwrite",
    )
    assert snapshot(out) == before
    (out / "checkpoint-stage2.pt").unlink()  # without its checkpoint, stage 2 would start over
    before = snapshot(out)
    refused(capsys, ["linearize", "--quick", "--stage", "2", "--out", str(out)], "stage 2 would train again from the start", "--overwrite")
    assert snapshot(out) == before
    assert main(["linearize", "--quick", "--stage", "1", "--steps", "9", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "lora.safetensors").exists()  # asked for: the adapters of the old maps go with them


def test_a_run_recorded_with_a_relative_haystack_resumes_after_the_folder_moves(tmp_path, monkeypatch, capsys):
    # Inputs are known by content: the saved relative path names nothing from another working
    # folder, but the same bytes under the new path are the same run; other bytes are refused.
    from pydoc_data.topics import topics

    first = tmp_path / "a"
    first.mkdir()
    (first / "hay.txt").write_text(" ".join(topics.values()))
    argv = ["niah", "--model", "tiny-random-llama", "--lengths", "600", "--samples", "1", "--methods", "full", "--max-new-tokens", "1"]
    monkeypatch.chdir(first)
    assert main([*argv, "--haystack-file", "hay.txt", "--out", "run"]) == 0
    shutil.move(first, tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    moved = tmp_path / "b"
    before = (moved / "run" / "samples.jsonl").read_text()
    assert main([*argv, "--haystack-file", str(moved / "hay.txt"), "--out", str(moved / "run")]) == 0
    assert (moved / "run" / "samples.jsonl").read_text() == before  # resumed: nothing redone
    (moved / "hay.txt").write_text(" ".join(reversed(list(topics.values()))))
    capsys.readouterr()
    assert main([*argv, "--haystack-file", str(moved / "hay.txt"), "--out", str(moved / "run")]) == 2
    assert "--haystack-file" in capsys.readouterr().err


# -- records bound to this run's prompts, record files that are plain files ------------------------------


ONE_NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "full", "--max-new-tokens", "1"]


def _samples(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_niah_records_of_another_seed_are_refused_against_this_runs_prompts(tmp_path, capsys):
    # Same options but --seed: the record's answers are another needle's. Whether its
    # samples.jsonl is copied into this run's folder, or this run's results.json is replaced by
    # the other run's and resumed with its seed, the records are checked against the prompts run.
    r, q = tmp_path / "r", tmp_path / "q"
    assert main([*ONE_NIAH, "--out", str(r)]) == 0
    assert main([*ONE_NIAH, "--seed", "1", "--out", str(q)]) == 0
    own, other = _samples(r)[0], _samples(q)[0]
    assert own["answers"] != other["answers"]
    capsys.readouterr()
    shutil.copy(r / "samples.jsonl", tmp_path / "own.jsonl")
    shutil.copy(q / "samples.jsonl", r / "samples.jsonl")
    refused(capsys, [*ONE_NIAH, "--out", str(r)], "samples.jsonl: line 1", "answers", "another seed", "use another --out")
    shutil.copy(tmp_path / "own.jsonl", r / "samples.jsonl")
    shutil.copy(q / "results.json", r / "results.json")  # results of seed 1 over samples of seed 0
    refused(capsys, [*ONE_NIAH, "--seed", "1", "--out", str(r)], "samples.jsonl: line 1", "answers")
    assert _samples(r) == [own]


def test_a_niah_record_of_another_prompt_length_is_refused(tmp_path, capsys):
    r = tmp_path / "r"
    assert main([*ONE_NIAH, "--out", str(r)]) == 0
    rec = _samples(r)[0]
    (r / "samples.jsonl").write_text(json.dumps({**rec, "prompt_tokens": 5000}) + "\n")
    capsys.readouterr()
    refused(
        capsys,
        [*ONE_NIAH, "--out", str(r)],
        "samples.jsonl: line 1",
        f"prompt_tokens 5000 is not the length of this run's sample 0 at length 400's prompt ({rec['prompt_tokens']}",
    )


def test_niah_results_without_their_inputs_cannot_resume_records(tmp_path, capsys):
    # results.json's inputs removed: a haystack rewritten since could not be told from the same one.
    hay = tmp_path / "hay.txt"
    hay.write_text("The grass is green. The sky is blue. " * 200)
    r = tmp_path / "r"
    argv = [*ONE_NIAH, "--haystack-file", str(hay), "--out", str(r)]
    assert main(argv) == 0
    results = json.loads((r / "results.json").read_text())
    del results["inputs"]
    (r / "results.json").write_text(json.dumps(results))
    capsys.readouterr()
    refused(capsys, argv, "records no fingerprint of --haystack-file", "remove samples.jsonl", "use another --out")
    (r / "samples.jsonl").unlink()  # nothing to prove: the run could start over...
    capsys.readouterr()
    refused(capsys, argv, "results.json was written by lola niah and has changed since")  # ...but the edit is someone's: kept
    shutil.rmtree(r)  # the user starts over: the run records its inputs again
    assert main(argv) == 0
    assert json.loads((r / "results.json").read_text())["inputs"]["haystack_file"] == content_digest(hay)


@contextmanager
def _within(seconds: int):
    """Fail (``TimeoutError``) instead of hanging when the body blocks longer than ``seconds``."""

    def hung(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


PROBE = ["probe", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "hybrid", "--max-new-tokens", "1"]


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Path:
    """A finished ``lola probe`` (PROBE) folder; tests copy it."""
    out = tmp_path_factory.mktemp("probed") / "p"
    assert main([*PROBE, "--out", str(out)]) == 0
    return out


def _probe_copy(probed: Path, tmp_path: Path) -> Path:
    out = tmp_path / "p"
    shutil.copytree(probed, out)
    return out


def _probe_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "probe.jsonl").read_text().splitlines()]


def _flipped(rec: dict) -> dict:
    return {**rec, "score": 1.0 - rec["score"]}


PROBE_EDITS = [
    ("a score of 7", lambda recs: [{**recs[0], "score": 7.0}], "line 1", "score"),
    ("a score its prediction does not earn", lambda recs: [_flipped(recs[0])], "line 1", "is not what its prediction scores"),
    ("the record twice, the copy scoring otherwise", lambda recs: [recs[0], _flipped(recs[0])], "line 2", "is not what its prediction scores"),
    ("the record twice", lambda recs: [recs[0], recs[0]], "line 2 repeats sample 0 of hybrid at length 400 (first on line 1)", "delete the line"),
    ("a method the run does not probe", lambda recs: [*recs, {**recs[0], "method": "lola-sre"}], "line 2", "method 'lola-sre' is not one of this run's"),
    ("a length the run does not have", lambda recs: [*recs, {**recs[0], "length": 800}], "line 2", "length 800"),
    ("an index beyond the samples", lambda recs: [*recs, {**recs[0], "index": 1}], "line 2", "index 1"),
    ("no layers", lambda recs: [{k: v for k, v in recs[0].items() if k != "layers"}], "line 1", "layers: Field required"),
    ("other answers", lambda recs: [{**recs[0], "answers": ["0000000"], "prediction": "0000000", "score": 1.0}], "line 1", "answers ['0000000'] are not those"),
    ("a share as a string", lambda recs: [{**recs[0], "layers": {"0": {**recs[0]["layers"]["0"], "share": ["0.5"]}}}], "line 1", "share"),
]


@pytest.mark.parametrize("name, edit, where, fragment", PROBE_EDITS, ids=[c[0] for c in PROBE_EDITS])
def test_a_probe_record_this_run_could_not_have_written_is_refused_naming_file_and_line(name, edit, where, fragment, probed, tmp_path, capsys):
    out = _probe_copy(probed, tmp_path)
    (out / "probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edit(_probe_records(out))))
    before = snapshot(out)
    refused(capsys, [*PROBE, "--out", str(out)], f"probe.jsonl: {where}", fragment, "another --out")
    assert snapshot(out) == before  # probe.json still summarises the run's own records


def test_probe_records_of_another_seed_are_refused(probed, tmp_path, capsys):
    out, other = _probe_copy(probed, tmp_path), tmp_path / "q"
    assert main([*PROBE, "--seed", "1", "--out", str(other)]) == 0
    shutil.copy(other / "probe.jsonl", out / "probe.jsonl")
    capsys.readouterr()
    refused(capsys, [*PROBE, "--out", str(out)], "probe.jsonl: line 1", "answers", "another seed")


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--max-new-tokens", "2"], ["--max-new-tokens: saved 1, now 2"]),
        (["--seed", "1", "--sinks", "2"], ["--seed: saved 0, now 1", "--sinks: saved 4, now 2"]),
    ],
    ids=["max-new-tokens", "seed and sinks"],
)
def test_a_probe_of_other_options_names_each_with_both_values(extra, fragments, probed, tmp_path, capsys):
    out = _probe_copy(probed, tmp_path)
    before = snapshot(out)
    refused(capsys, [*PROBE, *extra, "--out", str(out)], "holds a probe of other options", *fragments)
    assert snapshot(out) == before


def test_a_probe_file_without_its_inputs_cannot_resume_records(probed, tmp_path, capsys):
    out = _probe_copy(probed, tmp_path)
    saved = json.loads((out / "probe.json").read_text())
    assert set(saved["inputs"]) == {"model"}
    del saved["inputs"]
    (out / "probe.json").write_text(json.dumps(saved))
    refused(capsys, [*PROBE, "--out", str(out)], "records no fingerprint of model", "remove probe.jsonl")


def test_record_files_are_plain_files_never_followed_or_waited_on(tmp_path):
    from lola.io.records import drop_cut_record, open_record_file, read_record_file

    precious = tmp_path / "precious.jsonl"
    precious.write_text('{"mine": 1}\n{"cut')
    link = tmp_path / "link.jsonl"
    link.symlink_to(precious)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with _within(30):  # a FIFO opened the blocking way would hang the test, not fail it
        for use in (read_record_file, drop_cut_record, open_record_file):
            with pytest.raises(ValueError, match=f"{link} is a symbolic link"):
                use(link, "lola probe")
            with pytest.raises(ValueError, match=f"{fifo} is a FIFO, not a record file; lola probe keeps its records only in a plain file"):
                use(fifo, "lola probe")
            with pytest.raises(ValueError, match="is a folder"):
                use(tmp_path, "lola probe")
    assert precious.read_text() == '{"mine": 1}\n{"cut'
    assert read_record_file(tmp_path / "none.jsonl") is None
    assert drop_cut_record(precious) and precious.read_text() == '{"mine": 1}\n'
    twin = tmp_path / "twin.jsonl"
    os.link(precious, twin)  # a hard link: appending to one must not write into the other
    with open_record_file(twin) as log:
        log.write('{"new": 2}\n')
    assert precious.read_text() == '{"mine": 1}\n' and twin.read_text() == '{"mine": 1}\n{"new": 2}\n'


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_probe_whose_records_file_is_a_link_or_a_fifo_is_refused(kind, probed, tmp_path, capsys):
    out = _probe_copy(probed, tmp_path)
    precious = tmp_path / "precious.jsonl"
    precious.write_text('{"mine": 1}\n')
    (out / "probe.jsonl").unlink()
    if kind == "link":
        (out / "probe.jsonl").symlink_to(precious)
    else:
        os.mkfifo(out / "probe.jsonl")
    with _within(60):
        refused(capsys, [*PROBE, "--out", str(out)], str(out / "probe.jsonl"), "a symbolic link" if kind == "link" else "a FIFO", "another --out")
    assert precious.read_text() == '{"mine": 1}\n'


def test_niah_resume_whose_options_now_give_other_configs_is_refused(tmp_path, capsys, monkeypatch):
    """The same options resolve to other configs when lola's defaults change between the start
    and the resume: the saved samples are of another method under the same name."""
    import lola.eval.niah_execution as execution

    assert _niah(tmp_path / "r", "--methods", "window") == 0
    assert _niah(tmp_path / "r", "--methods", "window") == 0  # the same configs: resumes
    capsys.readouterr()
    before = (tmp_path / "r" / "results.json").read_bytes()
    plain = execution.method_configs

    def changed_defaults(run):
        return {m: c.model_copy(update={"schedule_kwargs": {"prefill_chunk": 2 * c.chunk}}) for m, c in plain(run).items()}

    monkeypatch.setattr(execution, "method_configs", changed_defaults)
    assert _niah(tmp_path / "r", "--methods", "window") == 2
    err = capsys.readouterr().err
    assert "holds samples of window run with another config" in err and "schedule_kwargs: saved {}, now {'prefill_chunk':" in err, err
    assert (tmp_path / "r" / "results.json").read_bytes() == before


def test_a_run_on_maps_saved_before_the_prefill_chunk_resumes_only_as_it_ran(tmp_path, capsys):
    """A run on trained maps saved before the default prefill chunk (no prefill_chunk in its
    results.json) stepped every chunk: resumed with the default it is refused, naming the
    option; given --prefill-chunk equal to the chunk it resumes."""
    maps = tmp_path / "maps"
    write_random_maps(maps, seed=0)
    args = ["--methods", "lola", "--policies", "sre", "--feature-maps", str(maps), "--window", "16", "--sparse-size", "8"]
    assert _niah(tmp_path / "r", *args, "--prefill-chunk", "64") == 0
    results = tmp_path / "r" / "results.json"
    saved = json.loads(results.read_text())
    assert saved["run"].pop("prefill_chunk") == 64 and saved["methods"]["lola-sre"]["schedule_kwargs"] == {}
    results.write_text(json.dumps(saved))  # as an older lola wrote it
    (tmp_path / "r" / ".lola-files.json").unlink()  # (an older lola kept no record of its files)
    capsys.readouterr()
    assert _niah(tmp_path / "r", *args) == 2
    assert "--prefill-chunk: saved 64, now 256" in capsys.readouterr().err
    assert _niah(tmp_path / "r", *args, "--prefill-chunk", "64") == 0
