"""Hostile inputs, class 3 (resumes), what a resume reads back; and the numbers, refusals and
messages of the same commands.

The mechanisms, each tested as a class (parametrized over the kinds of fault, with examples
other than those of ``benchmarks/adversarial``):

- A saved run other than the requested one is refused naming every option that differs, with
  its saved and requested values (``--sinks: saved 4, now 2``).
- Every line of ``samples.jsonl`` passes one validator, :class:`lola.eval.runner.SampleRecord`,
  checked against the run (its methods, lengths and samples; strict types; finite numbers in
  range), and no sample may appear twice: a record is never summarised unless this run could
  have written it.
- A stage-2 checkpoint fingerprints the stage-1 maps it started from
  (:func:`lola.linearize.checkpoint.stage1_digest`): stage 1 retrained into the folder since is
  refused, naming the stale checkpoint.
- Sizes are refused before the work they feed, naming the option: ``max_new_tokens`` that
  leaves no room for a prompt, ``variants`` without the lola method, demo sizes beyond their
  bounds, training sequences beyond the model's positions, a held-out text shorter than one
  window (and the progress bar opens only after the checks).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from lola.eval.runner import RESULTS_FORMAT, NiahRun, check_out_folder
from tests.hostile.common import refused, snapshot, write_random_maps

transformers = pytest.importorskip("transformers")

# What `lola niah NIAH_ARGS` runs: the run every saved folder below holds.
NIAH_ARGS = ["niah", "--model", "tiny-random-llama", "--lengths", "200", "300", "--samples", "2", "--methods", "full", "window", "--max-new-tokens", "2"]
RUN = NiahRun(model="tiny-random-llama", lengths=[200, 300], samples=2, methods=["full", "window"], max_new_tokens=2)


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
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not None}


# --- a resume with other options: every one named, saved and requested ----------------------------


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


# --- samples.jsonl: one validator for every record read back -------------------------------------


BAD_RECORDS = [
    ("a method the run does not have", _record(method="lolcats"), "method 'lolcats'"),
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
    ("a JSON array", "[1, 2]", "not a lola niah sample"),
]


@pytest.mark.parametrize("name, bad, fragment", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_a_record_this_run_could_not_have_written_is_refused_naming_file_line_and_field(name, bad, fragment, tmp_path):
    out = tmp_path / "r"
    _saved(out, records=[_record(index=0), bad])
    with pytest.raises(ValueError) as err:
        check_out_folder(out, RUN)
    message = str(err.value)
    assert "samples.jsonl: line 2 is not a lola niah sample" in message and fragment in message, message


@pytest.mark.parametrize(
    "copy",
    [_record(), _record(score=0.0), _record(depth=0.5, cache_bytes=1)],
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
    minimal = {k: _record(method="full", length=200, index=0)[k] for k in ("method", "length", "index", "depth", "score", "cache_bytes")}
    _saved(out, records=[_record(), minimal])  # older records lack the optional keys
    done = check_out_folder(out, RUN)
    assert set(done) == {("window", 300, 1), ("full", 200, 0)} and done[("window", 300, 1)]["score"] == 1.0


def test_lola_niah_refuses_a_bad_record_before_loading_and_keeps_the_folder(tmp_path, capsys, no_model):
    out = tmp_path / "r"
    _saved(out, records=[_record(), _record(index=0, score=2.5)])
    before = snapshot(out)
    refused(capsys, [*NIAH_ARGS, "--out", str(out)], "samples.jsonl: line 2", "score")
    assert snapshot(out) == before


# --- sizes refused before the work, naming the option ----------------------------------------------


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"lengths": [300, 100], "max_new_tokens": 100}, "max_new_tokens"),
        ({"lengths": [500], "max_new_tokens": 4096}, "max_new_tokens"),
        ({"task": "vt", "lengths": [64]}, "max_new_tokens unset"),  # the task's default answer length
    ],
    ids=["equal to the shortest", "beyond the only length", "the default of vt"],
)
def test_max_new_tokens_must_leave_room_for_a_prompt(options, fragment):
    with pytest.raises(ValueError, match=fragment):
        NiahRun(**options)


def test_lola_niah_names_max_new_tokens_before_loading(capsys, no_model):
    refused(capsys, ["niah", "--lengths", "256", "--max-new-tokens", "256"], "--max-new-tokens", "shortest of lengths [256]")


def test_a_prompt_that_does_not_fit_names_max_new_tokens_and_the_length():
    from lola.eval.niah import make_sample
    from lola.models import tiny_random

    _, tok = tiny_random()
    with pytest.raises(ValueError, match=r"length 120 is too short .* max_new_tokens 90"):
        make_sample(tok, "niah_single_1", 120, 0.5, seed=0, max_new_tokens=90)


@pytest.mark.parametrize("methods", [["window"], ["full", "lolcats"], ["lolcats", "window"]])
@pytest.mark.parametrize("variants", [{"a": {"policy": "recency"}}, {"big": {"sparse_size": 64}, "small": {"sparse_size": 8}}])
def test_variants_need_the_lola_method(methods, variants):
    # Variants are LoLA configs: without lola they would be dropped unread.
    with pytest.raises(ValueError, match="variants .* run with the lola method only"):
        NiahRun(methods=methods, variants=variants)
    assert NiahRun(methods=[*methods, "lola"], variants=variants).variants == variants


@pytest.mark.parametrize(
    "length, trials, fragment",
    [(2**14 + 1, 1, "--length must be <= 16384"), (2**24, 1, "--length"), (2**40, 8, "--length"), (2048, 10**7, "--trials must be <= 1000000")],
)
def test_demo_sizes_are_bounded(length, trials, fragment):
    from lola.demo import MAX_LENGTH, check_demo_args

    with pytest.raises(ValueError, match=fragment):
        check_demo_args(length, trials, 64, prefix="--")
    check_demo_args(MAX_LENGTH, 1, 64)  # the bound itself runs


def _short_model():
    """The tiny random Llama, claiming 64 positions."""
    from lola.models import tiny_random

    model, tok = tiny_random()
    model.config.max_position_embeddings = 64
    return model, tok


@pytest.mark.parametrize("tokens", [65, 96, 4096])
def test_stage1_chunks_beyond_the_positions_are_refused(tokens, tmp_path):
    from lola.linearize import LinearizeConfig, linearize

    model, tok = _short_model()
    cfg = LinearizeConfig(steps=1, chunk_tokens=tokens, train_chunks=1, eval_chunks=1, window=8, feature_dim=8, text=["pydoc"], device="cpu")
    with pytest.raises(ValueError, match=rf"chunk_tokens \(--chunk-tokens\) {tokens} is longer than the model's 64 positions"):
        linearize(model, tok, cfg, tmp_path / "lin", progress=False, log=lambda s: None)
    assert not (tmp_path / "lin").exists()  # refused before anything was written


@pytest.mark.parametrize("tokens", [65, 512])
def test_stage2_sequences_beyond_the_positions_are_refused(tokens, tmp_path):
    from lola.linearize import FinetuneConfig, finetune

    write_random_maps(tmp_path / "lin")
    before = snapshot(tmp_path / "lin")
    model, tok = _short_model()
    cfg = FinetuneConfig(steps=1, seq_len=tokens, eval_chunks=1, text=["pydoc"], device="cpu")
    with pytest.raises(ValueError, match=rf"seq_len \(--chunk-tokens\) {tokens} is longer than the model's 64 positions"):
        finetune(model, tok, cfg, tmp_path / "lin", progress=False, log=lambda s: None)
    assert snapshot(tmp_path / "lin") == before


def test_a_held_out_text_shorter_than_a_window_names_the_text_and_the_tokens(tmp_path):
    from lola.eval.perplexity import PerplexityRun, run_perplexity
    from lola.models import tiny_random

    small = tmp_path / "notes.txt"
    small.write_text("A short note. " * 60)
    model, tok = tiny_random()
    run = PerplexityRun(lengths=[96], methods=["full"], windows=1, generate=0, text=[str(small)])
    with pytest.raises(ValueError, match=rf"--text {small}: its held-out part .* fewer than one window of --lengths 96; give a text of about 960 tokens"):
        run_perplexity(run, model, tok, progress=False)


def _other_feature_dim(meta: dict) -> None:
    meta["lola_config"]["feature_dim"] = 16  # the tensors hold f = 8: refused when applied


def _other_model(meta: dict) -> None:
    meta["geometry"]["num_layers"] = 3  # the tensors cover 2 layers: refused when read


@pytest.mark.parametrize("edit", [_other_feature_dim, _other_model], ids=["a config the tensors do not fit", "maps of another model"])
def test_perplexity_checks_the_feature_maps_before_opening_its_bar(edit, tmp_path, monkeypatch):
    # An error raised under an open bar is printed on the bar's line.
    from lola.eval.perplexity import PerplexityRun, run_perplexity
    from lola.models import tiny_random

    write_random_maps(tmp_path / "maps")
    description = tmp_path / "maps" / "lola_config.json"
    meta = json.loads(description.read_text())
    edit(meta)
    description.write_text(json.dumps(meta))
    text = tmp_path / "text.txt"
    text.write_text("The river bends near the old mill. " * 200)
    bars = []
    monkeypatch.setattr("tqdm.auto.tqdm", lambda *a, **k: bars.append(k) or pytest.fail("the bar opened before the maps were checked"))
    run = PerplexityRun(lengths=[64], methods=["full", "lola"], windows=1, generate=0, text=[str(text)], feature_maps=str(tmp_path / "maps"))
    model, tok = tiny_random()
    with pytest.raises(ValueError):
        run_perplexity(run, model, tok, progress=False)
    assert not bars and not hasattr(model, "_lola")  # and the model is left as it came


# --- stage 2 resumes only from the stage-1 maps it started from ------------------------------------


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


LINEARIZE = ["linearize", "--quick", "--checkpoint-every", "1", "--train-chunks", "1"]


def test_lola_linearize_stage2_refuses_its_checkpoint_after_stage1_is_retrained(tmp_path, capsys):
    """The whole flow: stage 1, stage 2, stage 1 again with more steps (new maps), stage 2 with
    more steps must not continue from the old maps."""
    from lola.cli import main

    out = str(tmp_path / "lin")
    assert main([*LINEARIZE, "--stage", "1", "--steps", "1", "--out", out]) == 0
    assert main([*LINEARIZE, "--stage", "2", "--stage2-steps", "1", "--out", out]) == 0
    assert main([*LINEARIZE, "--stage", "2", "--stage2-steps", "2", "--out", out]) == 0  # its own output: resumed
    assert "resuming stage 2 from step 1" in capsys.readouterr().out
    # Two steps more (the first step of an extended run has the old schedule's last rate, 0).
    assert main([*LINEARIZE, "--stage", "1", "--steps", "3", "--out", out]) == 0
    capsys.readouterr()
    refused(capsys, [*LINEARIZE, "--stage", "2", "--stage2-steps", "3", "--out", out], "other stage-1 feature maps", "delete checkpoint-stage2.pt")
