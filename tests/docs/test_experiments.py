"""The research scripts under experiments/ that results.md quotes still run (on a tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lola.cli import main

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.fixture(scope="module")
def tiny_maps(tmp_path_factory):
    out = tmp_path_factory.mktemp("maps") / "maps"
    assert main(["linearize", "--quick", "--out", str(out)]) == 0  # tiny-random-llama, both stages
    return out


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXPERIMENTS / script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_refit_window_factors_writes_a_folder_lola_reads(tiny_maps, tmp_path):
    from lola.pretrained.folder import read_feature_maps

    out = tmp_path / "refit"
    small = ["--model", "tiny-random-llama", "--chunk-tokens", "128", "--train-chunks", "2", "--eval-chunks", "1", "--epochs", "1"]
    run("refit_window_factors.py", "--feature-maps", str(tiny_maps), "--out", str(out), "--window", "8", "--sparse-size", "8", "--sinks", "1", *small)
    before, after = read_feature_maps(tiny_maps), read_feature_maps(out)
    assert set(after.tensors) == set(before.tensors) and after.lora is not None
    keys = [k for k in before.tensors if k.endswith("window_factors")]
    assert any(not torch.equal(before.tensors[k], after.tensors[k]) for k in keys)  # the factors moved
    assert all(torch.equal(before.tensors[k], after.tensors[k]) for k in before.tensors if k not in keys)  # nothing else did
    report = json.loads((out / "refit_report.json").read_text())
    assert set(report["mse_heldout_mean"]) == {"before", "after"} and len(report["train_loss"]) == 2
    with pytest.raises(AssertionError, match="exists"):
        run("refit_window_factors.py", "--feature-maps", str(tiny_maps), "--out", str(out), *small)  # never overwrites


def test_linear_share_plot_draws_the_perplexity_results(tiny_maps, tmp_path):
    results = tmp_path / "ppl.json"
    args = ["perplexity", "--model", "tiny-random-llama", "--feature-maps", str(tiny_maps), "--length", "64", "--windows", "1", "--generate", "0"]
    assert main([*args, "--window", "8", "--sparse-size", "4", "--text", "pydoc", "--out", str(results)]) == 0
    figure = tmp_path / "share.png"
    assert "wrote" in run("linear_share_plot.py", str(results), "--out", str(figure))
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    foreign = tmp_path / "foreign.json"
    foreign.write_text("{}")
    with pytest.raises(AssertionError, match="not written by lola perplexity"):
        run("linear_share_plot.py", str(foreign), "--out", str(figure))


def test_feature_map_shift_prints_shift_invariant_logits(tiny_maps):
    out = run(
        "feature_map_shift.py", "--model", "tiny-random-llama", "--feature-maps", str(tiny_maps), "--offsets", "0", "300", "--tokens", "128", "--gap", "8"
    )
    lines = [line for line in out.splitlines() if line.startswith("offset")]
    assert len(lines) == 2
    # RoPE makes the softmax logits a function of the distance only: the same mean at both offsets.
    logits = [float(line.split("mean logit ")[1].split()[0]) for line in lines]
    assert abs(logits[0] - logits[1]) < 1e-3 and "per head ×first" in lines[1]


def test_share_quantiles_prints_ordered_quantiles(tiny_maps):
    out = json.loads(
        run("share_quantiles.py", "--model", "tiny-random-llama", "--feature-maps", str(tiny_maps), "--policy", "sre", "--length", "128", "--chunks", "1")
    )
    q = [out["quantiles"][k] for k in ("0.5", "0.9", "0.99", "0.999")]
    assert q == sorted(q) and 0 <= q[0] and q[-1] <= 1 and set(out["per_layer_q99"]) == {"0", "1"}


def test_adapted_full_attention_answers_lola_niahs_prompts_and_resumes(tiny_maps, tmp_path):
    out = tmp_path / "adapted.jsonl"
    args = ["--model", "tiny-random-llama", "--feature-maps", str(tiny_maps), "--lengths", "400", "--samples", "2", "--seed", "3", "--out", str(out)]
    first = run("adapted_full_attention.py", *args)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["length"], r["index"]) for r in records] == [(400, 0), (400, 1)] and "length 400:" in first
    assert run("adapted_full_attention.py", *args).count("#") == 0  # resumed: nothing generated again
    assert len(out.read_text().splitlines()) == 2
    with pytest.raises(AssertionError, match="another run's samples"):
        run("adapted_full_attention.py", *args[:-4], "--seed", "4", "--out", str(out))


def test_needle_timeline_counts_heads_segment_by_segment_and_resumes(tiny_maps, tmp_path):
    out = tmp_path / "timeline.jsonl"
    args = ["--model", "tiny-random-llama", "--feature-maps", str(tiny_maps), "--lengths", "400", "--samples", "2", "--seed", "3"]
    args += ["--window", "16", "--sparse-size", "16", "--segment", "128", "--policies", "sre", "--out", str(out)]
    printed = run("needle_timeline.py", *args)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["method"], r["index"]) for r in records] == [("lola-sre", 0), ("lola-sre", 1)] and "heads holding it" in printed
    for r in records:
        segments = -(-r["length"] // 128)
        assert len(r["held_after_segment"]) in (segments - 1, segments)  # the prompt is a little under its length
        assert all(0 <= h <= r["heads"] for h in r["held_after_segment"])
        if r["needle_at"] >= 128:
            assert r["held_after_segment"][0] == 0  # nothing holds a needle not yet read
        assert sum(r["sparse_by_eighths"]) > 0
    assert run("needle_timeline.py", *args).count("heads holding it") == 0  # resumed: nothing run again


def test_long_context_figure_draws_refused_and_bounded_cells(tmp_path):
    from lola.eval.runner import NiahRun, run_niah
    from tests.eval.test_runner import TinyTokenizer
    from tests.integrations.transformers.conftest import tiny

    run_ = NiahRun(
        feature_maps=None, lengths=[96, 200], samples=1, methods=["full", "lola"], policies=["sre"], window=8, sparse_size=8, sinks=2, chunk=8,
        max_new_tokens=3, budgets="uniform", positions="bounded",
    )  # fmt: skip
    run_niah(run_, tiny("llama", max_position_embeddings=128), TinyTokenizer(), tmp_path / "run", progress=False)
    figure = tmp_path / "long.png"
    assert "wrote" in run("long_context_figure.py", str(tmp_path / "run" / "results.json"), "--context", "128", "--out", str(figure))
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
