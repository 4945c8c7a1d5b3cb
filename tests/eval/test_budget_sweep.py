import json

import pytest

from lola.cli import main
from lola.eval.budget_sweep import PAPER_FOOTPRINT, BudgetSweep, point_run, run_sweep
from lola.eval.runner import method_configs
from lola.io.provenance import versions
from lola.models import tiny_random

SWEEP = BudgetSweep(model="tiny-random-llama", feature_maps="none", lengths=[600], budgets=["1/8", "1/4"], haystacks=["noise", "prose"], samples=1)


def test_a_point_gives_every_method_the_same_exact_tokens():
    run = point_run(SWEEP, "noise", 600, "1/8")
    assert (run.sinks, run.window, run.sparse_size) == (4, 14, 57) and run.budget == 75  # 600 / 8
    cfgs = method_configs(run)
    assert list(cfgs) == ["window", "hybrid", "lola-sre", "lola-exact"]
    assert {c.exact_budget for c in cfgs.values()} == {75}
    assert cfgs["lola-exact"].mixing == "softmax_only" and cfgs["lola-exact"].policy == cfgs["lola-sre"].policy
    assert cfgs["lola-exact"].sparse_size == cfgs["lola-sre"].sparse_size
    # On trained maps LoLA's rule is left for the maps to decide (the paper's); its exact tokens alone are softmax_only.
    trained = method_configs(point_run(BudgetSweep(), "noise", 2048, "1/8"))
    assert "mixing" not in trained["lola-learned"].model_fields_set and trained["lola-exact"].mixing == "softmax_only"
    assert trained["lola-exact"].policy == trained["lola-learned"].policy == "distinct"  # repeats folded on trained maps
    assert trained["lola-exact"].policy_kwargs == trained["lola-learned"].policy_kwargs
    assert trained["lola-exact"].policy_kwargs["policy"] == "learned"
    paper = point_run(SWEEP, "noise", 8192, "paper")
    assert {k: getattr(paper, k) for k in PAPER_FOOTPRINT} == PAPER_FOOTPRINT


@pytest.mark.parametrize("budgets", [["0"], ["3/2"], ["a lot"], ["1/8", "1/8"]])
def test_bad_budgets_are_refused(budgets):
    with pytest.raises(ValueError, match="budget"):
        BudgetSweep(budgets=budgets)


def test_the_sweep_runs_every_point_resumes_and_plots(tmp_path):
    model, tok = tiny_random()
    rows = run_sweep(SWEEP, model, tok, tmp_path, progress=False)
    points = {(r["haystack"], r["budget"]) for r in rows}
    assert points == {(h, b) for h in ("noise", "prose") for b in ("1/8", "1/4")}
    assert len(rows) == 4 * 4 and {r["method"] for r in rows} == {"window", "hybrid", "lola-sre", "lola-exact"}
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["rows"] == rows and saved["versions"] == versions()
    assert (tmp_path / "sweep-noise.png").stat().st_size > 0 and (tmp_path / "sweep-prose.png").stat().st_size > 0
    samples = tmp_path / "prose-600-1-4" / "samples.jsonl"
    before = samples.read_text()
    assert len(before.splitlines()) == 4  # one sample of each method
    assert run_sweep(SWEEP, model, tok, tmp_path, progress=False) == rows  # resumed: nothing re-run
    assert samples.read_text() == before


def test_a_point_equal_to_an_earlier_one_is_not_generated_again(tmp_path, monkeypatch):
    import lola.eval.niah_execution as execution

    generated = []
    generate_all = execution._generate_all

    def counting(run, model, tokenizer, configs, todo, *args, **kwargs):
        generated.append(len(todo))
        return generate_all(run, model, tokenizer, configs, todo, *args, **kwargs)

    monkeypatch.setattr(execution, "_generate_all", counting)
    model, tok = tiny_random()
    sweep = SWEEP.model_copy(update={"budgets": ["1/8", "2/16", "1/4"], "haystacks": ["noise"]})  # 2/16 is 1/8's run
    rows = run_sweep(sweep, model, tok, tmp_path, progress=False)
    assert generated == [4, 0, 4]  # four methods, one sample each; the repeat generates nothing
    first, again = (tmp_path / f"noise-600-{b}" / "samples.jsonl" for b in ("1-8", "2-16"))
    assert again.read_text() == first.read_text() and len(first.read_text().splitlines()) == 4
    cells = {b: {r["method"]: r["accuracy"] for r in rows if r["budget"] == b} for b in ("1/8", "2/16")}
    assert cells["1/8"] == cells["2/16"] and len(cells["1/8"]) == 4


def test_the_command_prints_the_table(tmp_path, capsys):
    argv = ["sweep", "--model", "tiny-random-llama", "--feature-maps", "none", "--lengths", "600", "--budgets", "1/4", "--haystacks", "noise"]
    assert main([*argv, "--samples", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "noise haystack" in out and "lola-exact" in out and "1/4" in out
    assert main(["sweep", "--budgets", "2", "--out", str(tmp_path / "x")]) == 2
    assert "budget" in capsys.readouterr().err
