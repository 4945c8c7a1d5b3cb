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
- A record must also agree with itself and the run: its score is what its prediction scores
  against its answers, its depth the one its index has, and no key is given twice.
- Resumes fingerprint content, not names or paths: the loaded model's weights
  (:func:`lola.linearize.checkpoint.weights_digest`, for ``lola niah`` and ``lola linearize``),
  and path options are compared by the content they name (``./hay.txt`` resumes ``hay.txt``).
- A hard-linked ``samples.jsonl`` is made the folder's own before it is appended to, and a
  ``results.json`` that is not lola's is never written over.
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
    index = changes.get("index")
    if "depth" not in changes and isinstance(index, int) and not isinstance(index, bool) and 0 <= index < RUN.samples:
        rec["depth"] = (index + 0.5) / RUN.samples  # the depth this sample has (niah_prompts)
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
    from lola.eval.demo import MAX_LENGTH, check_demo_args

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


# --- a record must agree with itself and with the run: its score with its prediction, its depth
# with its index, every key once ----------------------------------------------------------------


CONTRADICTIONS = [
    ("a miss scored as a hit", _record(score=1.0, prediction="I do not know"), "score 1.0 is not what its prediction scores"),
    ("a hit scored as a miss", _record(score=0.0, prediction="it is 1234567"), "score 0.0 is not what its prediction scores"),
    ("the depth of another sample", _record(depth=0.25), "depth 0.25 is not the depth of sample 1"),
    ("the depth of a 4-sample run", _record(depth=0.875), "depth 0.875"),
    ('"method" given twice', '{"method": "full", ' + json.dumps(_record())[1:], "key 'method' appears twice"),
]


@pytest.mark.parametrize("name, bad, fragment", CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_a_record_that_contradicts_itself_or_the_run_is_refused(name, bad, fragment, tmp_path):
    out = tmp_path / "r"
    _saved(out, records=[_record(index=0), bad])
    with pytest.raises(ValueError) as err:
        check_out_folder(out, RUN)
    message = str(err.value)
    assert "samples.jsonl: line 2" in message and fragment in message, message


# --- resumes fingerprint content: the model's weights, and paths by what they hold ---------------


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
    import os

    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, {})
    (tmp_path / "checkpoint.pt.sha256").unlink()
    os.mkfifo(tmp_path / "checkpoint.pt.sha256")
    with pytest.raises(ValueError, match=r"checkpoint.pt.sha256 is not a regular file"):
        load_checkpoint(path, LinearizeConfig(steps=6), "--steps")


# --- numbers: the training configs are strict like LoLAConfig, seeds bounded everywhere ----------


@pytest.mark.parametrize(
    "schema, field, value",
    [
        ("LinearizeConfig", "batch", True),
        ("LinearizeConfig", "chunk_tokens", 64.0),
        ("LinearizeConfig", "lr", True),
        ("LinearizeConfig", "seed", -(2**63) - 1),
        ("LinearizeConfig", "seed", 2**63),
        ("FinetuneConfig", "seq_len", 64.0),
        ("FinetuneConfig", "warmup_steps", False),
        ("FinetuneConfig", "kl_weight", True),
        ("FinetuneConfig", "seed", 2**80),
    ],
)
def test_training_config_numbers_are_strict(schema, field, value):
    from lola import linearize

    with pytest.raises(ValueError, match=field):
        getattr(linearize, schema)(**{field: value})


def test_training_config_floats_still_take_ints():
    from lola.linearize import FinetuneConfig, LinearizeConfig

    assert LinearizeConfig(lr=1).lr == 1.0 and FinetuneConfig(lora_alpha=8).lora_alpha == 8.0
    assert LinearizeConfig(seed=2**63 - 1).seed == 2**63 - 1


@pytest.mark.parametrize("seed", [-(2**63) - 5, 2**63, 2**100, True, 1.0])
def test_seeds_are_bounded_for_demo_and_niah(seed):
    from lola.eval.demo import check_demo_args

    with pytest.raises(ValueError, match="--seed"):
        check_demo_args(64, 1, 16, prefix="--", seed=seed)
    with pytest.raises(ValueError, match="seed"):
        RUN.model_validate({**RUN.model_dump(), "seed": seed})


def test_perplexity_refuses_generation_past_the_model_positions():
    from lola.eval.perplexity import PerplexityRun, run_perplexity
    from lola.models import tiny_random

    model, tok = tiny_random()
    limit = model.config.max_position_embeddings
    run = PerplexityRun(lengths=[128], methods=["full"], generate=limit - 100)
    with pytest.raises(ValueError, match=f"--generate {limit - 100} .* give --generate at most {limit - 128}"):
        run_perplexity(run, model, tok, progress=False)


# --- templates: plain {field} placeholders only; a haystack that cannot fit one line -------------


@pytest.mark.parametrize(
    "needle, question, prefix, name",
    [
        ("Code {key}={value!s}.", "Code of {key}?", None, "needle"),
        ("Code {key}={value:08}.", "Code of {key}?", None, "needle"),
        ("Code {key}={value}.", "Code of {key!a}?", None, "question"),
        ("Code {key}={value}.", "Code of {key}?", " {key:^{key}} is", "answer_prefix"),
    ],
)
def test_a_template_conversion_or_format_spec_is_refused(needle, question, prefix, name):
    from lola.eval.niah import check_templates

    with pytest.raises(ValueError, match=f"{name} template .* conversion or format spec"):
        check_templates(needle, question, prefix)


def test_a_haystack_whose_first_line_does_not_fit_is_refused_naming_it():
    from lola.eval.niah import make_sample
    from lola.models import tiny_random

    _, tok = tiny_random()
    with pytest.raises(ValueError, match="no room for one line of --haystack-file long.txt"):
        make_sample(
            tok, "niah_single_1", 600, 0.5, seed=1, max_new_tokens=2, haystack="A" + " very" * 2000 + " long line.", haystack_name="--haystack-file long.txt"
        )


def test_a_variant_budgets_of_the_wrong_type_names_the_variant():
    with pytest.raises(ValueError, match="variants.cal.budgets"):
        NiahRun(methods=["lola"], variants={"cal": {"budgets": 8}})


# --- files: a hard-linked samples.jsonl is never appended to in place; a results.json that is
# not lola's is never written over ------------------------------------------------------------


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
