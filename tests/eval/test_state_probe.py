import json
import math

import pytest
import torch

import lola
from lola.cli import main
from lola.eval.niah import make_sample
from lola.eval.runner import NiahRun
from lola.eval.state_probe import RECORDS_FILE, needle_positions, probe_prompt, run_probe, summarize_probe
from lola.integrations.transformers import apply_lola, remove_lola
from lola.io.provenance import versions
from lola.models import tiny_random
from tests.oracles import hybrid_exact_mask


@pytest.fixture(scope="module")
def tiny():
    return tiny_random()


def probed(tiny, cfg, seed, new_tokens, then=None):
    """``probe_prompt`` on a fresh prompt with ``cfg`` applied, and ``then(model, sample)`` while it still is."""
    model, tok = tiny
    sample = make_sample(tok, "niah_single_1", 600, 0.5, seed=seed, max_new_tokens=new_tokens)
    apply_lola(model, cfg)
    try:
        rec = probe_prompt(model, tok, sample.input_ids, sample.answers[0], new_tokens=new_tokens)
        return rec, sample, (then(model, sample) if then else None)
    finally:
        remove_lola(model)


def test_needle_positions_cover_exactly_the_value(tiny):
    _, tok = tiny
    sample = make_sample(tok, "niah_single_1", 600, 0.3, seed=4, max_new_tokens=4)
    positions = needle_positions(tok, sample.input_ids[0], sample.answers[0])
    assert tok.decode(sample.input_ids[0, positions].tolist()) == sample.answers[0]
    assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert needle_positions(tok, sample.input_ids[0], "not in the prompt") == []


@pytest.mark.parametrize("window", [8, 500])
def test_the_hybrid_holds_the_needle_where_its_exact_tokens_reach(tiny, window):
    # The hybrid's exact tokens for the last query are known in closed form (an oracle that
    # never runs the engine): the probe must report the needle held exactly where they cover it.
    model, tok = tiny
    sample = make_sample(tok, "niah_single_1", 600, 0.5, seed=1, max_new_tokens=3)
    cfg = lola.LoLAConfig(window=window, sparse_size=0, sinks=2, chunk=8, mixing="lola_authors")
    apply_lola(model, cfg)
    try:
        rec = probe_prompt(model, tok, sample.input_ids, sample.answers[0], new_tokens=3)
    finally:
        remove_lola(model)
    t = sample.length
    exact = hybrid_exact_mask(t, window, 2, 8)[t - 1]
    expected = all(bool(exact[p]) for p in needle_positions(tok, sample.input_ids[0], sample.answers[0]))
    assert expected == (window == 500)  # the two cases differ, so the check can fail either way
    assert set(rec["layers"]) == {"0", "1"}
    for layer in rec["layers"].values():
        assert layer["held"] == [expected, expected]  # two K/V heads
        for share, ex, lin in zip(layer["share"], layer["log_exact"], layer["log_linear"]):
            assert 0 <= share <= 1
            # The share is the linear mass over both masses, computed along another path.
            assert share == pytest.approx(1 / (1 + math.exp(ex - lin)), rel=1e-4, abs=1e-6)


def test_softmax_only_reports_no_linear_mass(tiny):
    rec, _, _ = probed(tiny, lola.LoLAConfig(window=16, sparse_size=16, sinks=2, chunk=8, mixing="softmax_only"), seed=2, new_tokens=2)
    for layer in rec["layers"].values():
        assert layer["share"] == [0.0] * 4 and layer["log_linear"] == [None] * 4
        assert all(v is not None and math.isfinite(v) for v in layer["log_exact"])


RUN = NiahRun(model="tiny-random-llama", lengths=[600, 700], samples=2, methods=["hybrid", "lola"], window=8, sparse_size=8, sinks=2, chunk=8, max_new_tokens=2)


def test_run_probe_records_every_prompt_summarises_and_resumes(tiny, tmp_path):
    model, tok = tiny
    records = run_probe(RUN, model, tok, tmp_path, progress=False)
    keys = sorted((r["method"], r["length"], r["index"]) for r in records)
    assert keys == sorted((m, n, i) for m in ("hybrid", "lola-sre") for n in (600, 700) for i in range(2))
    saved = json.loads((tmp_path / "probe.json").read_text())
    summary = saved["summary"]
    assert saved["versions"] == versions()
    assert summary == summarize_probe(records) and set(summary) == {"hybrid", "lola-sre"}
    layer = summary["lola-sre"]["600"]["layers"]["1"]
    rows = [r["layers"]["1"] for r in records if r["method"] == "lola-sre" and r["length"] == 600]
    assert layer["share"] == pytest.approx(sum(sum(r["share"]) for r in rows) / 8)
    assert (tmp_path / "probe.png").stat().st_size > 0
    # A kill mid-line loses that prompt only; the rerun adds it back and nothing else.
    lines = (tmp_path / RECORDS_FILE).read_text().splitlines()
    (tmp_path / RECORDS_FILE).write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    again = run_probe(RUN, model, tok, tmp_path, progress=False)
    assert sorted((r["method"], r["length"], r["index"]) for r in again) == keys
    other = RUN.model_copy(update={"seed": 3})
    with pytest.raises(ValueError, match="other options"):
        run_probe(other, model, tok, tmp_path, progress=False)


def test_the_command_prints_the_per_layer_table(tmp_path, capsys):
    argv = ["probe", "--model", "tiny-random-llama", "--methods", "lola", "--lengths", "600", "--samples", "1", "--window", "8"]
    assert main([*argv, "--sparse-size", "8", "--chunk", "8", "--max-new-tokens", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "lola-sre: accuracy" in out and "held%" in out
    assert main(["probe", "--model", "tiny-random-llama", "--methods", "full", "--lengths", "600", "--out", str(tmp_path / "x")]) == 2
    assert "no linear state" in capsys.readouterr().err


def test_probe_keeps_the_engine_outputs(tiny):
    # Observing forces the unfused decode path: the answer must be the one lola niah generates.
    def generate(model, sample):
        with torch.no_grad():
            return model.generate(sample.input_ids, max_new_tokens=4, do_sample=False, cache=lola.integrations.transformers.LoLACache(model))

    rec, sample, out = probed(tiny, lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=8, mixing="lola_authors"), seed=5, new_tokens=4, then=generate)
    assert rec["prediction"] == tiny[1].decode(out[0, sample.length :], skip_special_tokens=True)


def test_a_probe_on_maps_saved_before_the_prefill_chunk_is_not_resumed_under_the_default():
    """A run on maps saved before prefill_chunk existed stepped every chunk in its prefill: its
    probe records are not continued under today's default (every 256), the option named."""
    from lola.eval.state_probe import _run_differences

    run = NiahRun(model="smollm2-135m-instruct", feature_maps="smollm2-135m-instruct", methods=["lola"], lengths=[2048], samples=2)
    assert run.prefill_chunk == 256
    saved = json.loads(run.model_dump_json())
    assert _run_differences(saved, run) is None
    del saved["prefill_chunk"]  # as an older lola wrote it
    assert "--prefill-chunk: saved 64, now 256" in _run_differences(saved, run)
    assert _run_differences(saved, run.model_copy(update={"prefill_chunk": 64})) is None
