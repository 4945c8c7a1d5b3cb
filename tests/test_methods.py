"""One table maps a method name to its LoLA config (lola.methods); niah, perplexity, the demo and
the command line all read it."""

from __future__ import annotations

import pytest

from lola.cli import build_parser, main
from lola.eval import demo
from lola.eval.perplexity import PPL_METHODS, PerplexityRun, perplexity_configs
from lola.eval.runner import NiahRun, method_configs
from lola.methods import METHODS, method_config

SIZES = dict(window=8, sparse_size=16, sinks=2, chunk=8)


def test_the_table():
    assert METHODS == ("full", "window", "hybrid", "lola")
    assert method_config("full", **SIZES) is None
    window, hybrid, lola = (method_config(m, **SIZES) for m in ("window", "hybrid", "lola"))
    assert window.exact_budget == hybrid.exact_budget == lola.exact_budget == 2 + 8 + 16
    assert (window.sparse_size, window.mixing) == (0, "softmax_only")
    assert (hybrid.sparse_size, hybrid.mixing) == (0, "lola_authors")  # softmax_only would ignore the linear state
    assert (lola.window, lola.sparse_size, lola.mixing, lola.policy) == (8, 16, "softmax_only", "sre") and "policy" not in lola.model_fields_set
    assert method_config("hybrid", **SIZES, hybrid_window="window").window == 8
    assert method_config("lola", **SIZES, policy="recency", overrides={"gqa_storage": "query_head"}).policy == "recency"
    trained = [method_config(m, **SIZES, trained_maps=True) for m in ("hybrid", "lola")]
    assert all("mixing" not in c.model_fields_set for c in trained)  # left to the trained maps
    with pytest.raises(ValueError, match="unknown method 'nope'; available: full, window, hybrid, lola"):
        method_config("nope", **SIZES)


def test_the_hybrids_old_name_still_works_with_a_warning():
    # `lolcats` named both the method and a mixing rule; the method is `hybrid` now
    with pytest.warns(FutureWarning, match="'lolcats' is now called 'hybrid'"):
        assert method_config("lolcats", **SIZES) == method_config("hybrid", **SIZES)
    with pytest.warns(FutureWarning, match="'hybrid'"):
        assert NiahRun(methods=["full", "lolcats"]).methods == ["full", "hybrid"]
    with pytest.warns(FutureWarning, match="'hybrid'"):
        assert PerplexityRun(methods=["lolcats", "lola"]).methods == ["hybrid", "lola"]
    with pytest.raises(ValueError, match="more than once"), pytest.warns(FutureWarning):
        NiahRun(methods=["hybrid", "lolcats"])


def test_niah_uses_the_table():
    run = NiahRun(**SIZES, feature_maps=None, policies=["sre", "random"], budgets="uniform", gqa_storage="query_head", variants={"v": {"window": 4}})
    cfgs = method_configs(run)
    assert list(cfgs) == ["full", "window", "hybrid", "lola-sre", "lola-random", "lola-v"]
    common = dict(**SIZES, overrides={"gqa_storage": "query_head"})
    for m in ("full", "window", "hybrid"):
        assert cfgs[m] == method_config(m, **common)
    assert cfgs["lola-random"] == method_config("lola", policy="random", **common)
    assert cfgs["lola-v"] == method_config("lola", **SIZES, overrides={"gqa_storage": "query_head", "window": 4})
    assert NiahRun(feature_maps=None).methods == list(METHODS)
    with pytest.raises(ValueError, match="available: full, window, hybrid, lola"):
        NiahRun(methods=["nope"])


def test_perplexity_uses_the_table():
    assert set(PPL_METHODS) <= set(METHODS) and PPL_METHODS == ("full", "hybrid", "lola")
    run = PerplexityRun(**SIZES, policy="recency")
    assert list(perplexity_configs(run)) == list(PPL_METHODS)
    for m, cfg in perplexity_configs(run).items():
        assert cfg == method_config(m, **SIZES, policy="recency", mixing="lola_authors", hybrid_window="window")
    with pytest.raises(ValueError, match=r"unknown methods \['window'\]; available: full, hybrid, lola"):
        PerplexityRun(methods=["window"])


def test_demo_uses_the_table(monkeypatch):
    built, composed = [], []
    real_config, real_compose = demo.method_config, demo.compose

    def config(*args, **kwargs):
        built.append(real_config(*args, **kwargs))
        return built[-1]

    def compose(cfg, **kwargs):
        composed.append(cfg)
        return real_compose(cfg, **kwargs)

    monkeypatch.setattr(demo, "method_config", config)
    monkeypatch.setattr(demo, "compose", compose)
    results = demo.run_demo(length=64, trials=1, budget=16, head_dim=8)
    assert [r.method for r in results] == ["full", "window", "hybrid", *(f"lola-{p}" for p in demo.DEMO_POLICIES)]
    assert composed[1:] == built and composed[0].window == 64  # full: one head with every token exact
    assert {r.exact_tokens for r in results[1:]} == {16}


@pytest.mark.parametrize("budget", [16, 17])
def test_demo_methods_share_the_budget(budget):
    results = demo.run_demo(length=64, trials=1, budget=budget, head_dim=8)
    assert {r.exact_tokens for r in results if r.method != "full"} == {budget}


def test_the_command_line_names_the_tables_methods(capsys, tmp_path):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    help_of = {name: {a.dest: a.help for a in sub[name]._actions} for name in ("niah", "perplexity")}
    assert ", ".join(METHODS) in help_of["niah"]["methods"] and " ".join(PPL_METHODS) in help_of["perplexity"]["methods"]
    assert "(default: full hybrid lola)" in help_of["niah"]["methods"]
    assert main(["niah", "--methods", "nope", "--out", str(tmp_path / "n")]) == 2
    assert "available: full, window, hybrid, lola" in capsys.readouterr().err
    assert main(["perplexity", "--methods", "window"]) == 2  # checked by PerplexityRun, named
    assert "unknown methods ['window']; available: full, hybrid, lola" in capsys.readouterr().err
