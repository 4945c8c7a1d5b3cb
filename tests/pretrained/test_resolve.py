"""The one place that decides the mixing rule: the paper's for LoLA on trained maps, the trained
one for the hybrid, the caller's when set, softmax_only without trained maps."""

import json

import pytest

import lola
from lola.pretrained.resolve import PAPER_MIXING, default_mixing, has_sparse_cache, resolve_config, resolve_mixing, resolve_positions


@pytest.mark.parametrize(
    "fields,sparse",
    [
        ({}, True),  # LoLAConfig(): sparse cache 64
        ({"sparse_size": 0}, False),
        ({"sparse_size": 0, "sparse_size_per_head": [0, 0, 3]}, True),
        ({"sparse_size": 8, "sparse_size_per_head": [0, 0]}, False),  # per-head sizes replace sparse_size
        ({"sparse_size": 0, "layer_overrides": {1: {"sparse_size": 4}}}, True),
        ({"sparse_size": 0, "layer_overrides": {1: {"sparse_size_per_head": [0, 2]}}}, True),
        ({"sparse_size": 4, "layer_overrides": {0: {"sparse_size": 0}, 1: {"sparse_size_per_head": [0, 0]}}}, True),  # layers 2.. keep 4
        ({"sparse_size_per_head": [0, 0], "layer_overrides": {0: {"sparse_size": 2}}}, False),  # the base per-head sizes still apply
        ({"sparse_size_per_head": [0, 0], "layer_overrides": {0: {"sparse_size_per_head": None, "sparse_size": 2}}}, True),
    ],
)
def test_a_sparse_cache_anywhere_makes_it_lola(fields, sparse):
    assert has_sparse_cache(lola.LoLAConfig(**fields)) is sparse


def test_the_default_rule_per_method():
    lola_cfg, hybrid = lola.LoLAConfig(sparse_size=16), lola.LoLAConfig(sparse_size=0)
    assert default_mixing(lola_cfg, "lolcats") == PAPER_MIXING == "lola_authors"
    assert default_mixing(hybrid, "lolcats") == "lolcats" and default_mixing(hybrid, "lola_authors") == "lola_authors"
    assert default_mixing(lola_cfg, None) == default_mixing(hybrid, None) == "softmax_only"  # untrained maps
    assert resolve_mixing(lola_cfg, "lolcats").mixing == "lola_authors"
    assert resolve_mixing(hybrid, "lolcats").mixing == "lolcats"
    for rule in ("lolcats", "softmax_only", "lola_authors"):  # set by the caller: kept
        assert resolve_mixing(lola.LoLAConfig(sparse_size=16, mixing=rule), "lolcats").mixing == rule


def test_resolve_config_takes_fields_or_nothing():
    assert resolve_config(None) == lola.LoLAConfig()
    assert resolve_config({"window": 8, "sparse_size": 4}, "lolcats").mixing == "lola_authors"
    assert resolve_config({"window": 8, "sparse_size": 0}, "lolcats").mixing == "lolcats"
    with pytest.raises(TypeError, match="config must be"):
        resolve_config([("window", 8)])


def test_resolve_config_reads_the_entry_a_saved_model_holds():
    from lola.pretrained.model_entry import config_entry

    cfg = lola.LoLAConfig(window=12, sparse_size=3, sinks=1, mixing="lolcats", layer_overrides={1: {"sparse_size": 5}})
    entry = config_entry(cfg, lora_merged=True)
    assert resolve_config(entry) == cfg  # what vLLM finds in an exported config.json
    assert resolve_config(json.loads(json.dumps(entry))) == cfg  # as read back from the file
    with pytest.raises(ValueError, match="lola did not write"):
        resolve_config({"format": "someone-else/2", "config": {}})
    with pytest.raises(ValueError, match="lola did not write"):
        resolve_config({"format": entry["format"], "config": "window=12"})


# -- budgets: one rule for lola niah and the lm-eval model ----------------------------------------
SHIPPED = "smollm2-135m-instruct"


def test_auto_budgets_are_the_models_shipped_ones_where_the_config_takes_them():
    from lola import budgets
    from lola.pretrained.resolve import resolve_budgets

    base = lola.LoLAConfig(sparse_size=192)
    shipped = resolve_budgets(base, "auto", SHIPPED)
    assert shipped == budgets.load(SHIPPED).apply(base)
    assert shipped.layer_overrides[17]["sparse_size_per_head"] != [192, 192, 192]  # calibrated, not uniform
    assert resolve_budgets(base, "auto", "another-model") is base  # no shipped budgets: uniform
    for config in (  # configs that cannot take budgets keep their own sizes under "auto"
        lola.LoLAConfig(gqa_storage="query_head"),
        lola.LoLAConfig(sparse_size_per_head=[1, 2, 3]),
        lola.LoLAConfig(layer_overrides={3: {"sparse_size": 8}}),
    ):
        assert resolve_budgets(config, "auto", SHIPPED) is config
    assert resolve_budgets(base, "uniform", SHIPPED) is base and resolve_budgets(base, None, SHIPPED) is base
    with pytest.raises(ValueError, match="per K/V head"):  # named budgets are never dropped silently
        resolve_budgets(lola.LoLAConfig(gqa_storage="query_head"), SHIPPED, SHIPPED)


def test_niah_and_the_lm_eval_model_resolve_budgets_alike():
    from lola.eval.runner import NiahRun, method_configs
    from lola.integrations.lm_eval.model import lola_config_from_args

    for gqa_storage in ("kv_head", "query_head"):
        run = NiahRun(model=SHIPPED, methods=["lola"], policies=["sre"], gqa_storage=gqa_storage, feature_maps="none")  # the stock model's budgets
        niah = method_configs(run)["lola-sre"]
        fields = niah.model_dump(exclude_unset=True)
        fields.pop("layer_overrides", None)
        lm_eval, _ = lola_config_from_args(fields, model_name=SHIPPED, budgets="auto")
        assert lm_eval == niah, gqa_storage
    # the run's own unset fields stay unset through the budgets (trained maps fill the rule)
    run = NiahRun(model=SHIPPED, methods=["lola"], feature_maps=SHIPPED)
    assert "mixing" not in method_configs(run)["lola-learned"].model_fields_set


def test_niah_perplexity_and_the_lm_eval_model_resolve_one_config_alike():
    # one resolution (lola.pretrained.resolve.resolve_config): the same fields and budgets give the same
    # config whichever command asks
    from lola.eval.perplexity import PerplexityRun, perplexity_configs
    from lola.eval.runner import NiahRun, method_configs
    from lola.integrations.lm_eval.model import lola_config_from_args

    for budgets in ("auto", "uniform"):
        niah = method_configs(NiahRun(model=SHIPPED, methods=["lola"], policies=["sre"], budgets=budgets, feature_maps="none"))["lola-sre"]
        ppl = perplexity_configs(PerplexityRun(model=SHIPPED, methods=["lola"], window=niah.window, sparse_size=niah.sparse_size, budgets=budgets))["lola"]
        assert ppl.layer_overrides == niah.layer_overrides, budgets
        fields = niah.model_dump(exclude_unset=True)
        fields.pop("layer_overrides", None)
        assert lola_config_from_args(fields, model_name=SHIPPED, budgets=budgets)[0] == resolve_config(fields, model=SHIPPED, budgets=budgets) == niah
    calibrated = perplexity_configs(PerplexityRun(model=SHIPPED, methods=["hybrid", "lola"], budgets=SHIPPED))
    assert calibrated["hybrid"].layer_overrides == {} and calibrated["lola"].layer_overrides  # the sparse cache's budgets alone


def test_resolve_config_applies_budgets_before_the_maps_decide_the_rule():
    from types import SimpleNamespace

    seen = []

    def merge_into(config):  # what FeatureMaps.merge_into does with the rule: the config as it will run
        seen.append(config)
        return resolve_mixing(config, "lolcats")

    maps = SimpleNamespace(merge_into=merge_into)
    cfg = resolve_config({"sparse_size": 192}, model=SHIPPED, feature_maps=maps, budgets="auto")
    assert seen[0].layer_overrides and cfg.mixing == PAPER_MIXING
    hybrid = resolve_config({"sparse_size": 0}, feature_maps=maps)
    assert hybrid.mixing == "lolcats"
    # without maps an unset rule stays unset: maps applied later still decide it
    assert "mixing" not in resolve_config({"sparse_size": 4}, model=SHIPPED, budgets="auto").model_fields_set
    assert resolve_config({"sparse_size": 4}, "lolcats").mixing == PAPER_MIXING


def test_resolve_config_takes_read_feature_maps_only():
    with pytest.raises(TypeError, match="feature_maps must be read feature maps"):
        resolve_config(None, feature_maps="smollm2-135m-instruct")


def test_the_shipped_linearized_maps_carry_budgets_of_their_own():
    # calibrated on the adapted model (LoRA merged): its needles sit in other heads than the stock
    # model's, so `lola niah`'s default run takes these, and the stock model keeps its own
    from lola import budgets
    from lola.eval.runner import NiahRun, default_lola_config, method_configs
    from lola.pretrained.resolve import maps_budgets

    own = maps_budgets(SHIPPED)
    assert own is not None and own.sparse_size_per_head != budgets.load(SHIPPED).sparse_size_per_head
    assert own.source["feature_maps"] == SHIPPED and own.source["length"] == 8192
    configs = method_configs(NiahRun())  # the README's run: the shipped maps
    stock = method_configs(NiahRun(feature_maps="none"))["lola-learned"]
    for name in ("lola-sre", "lola-learned"):
        sizes = [configs[name].for_layer(i).sparse_size_per_head for i in range(own.num_layers)]
        assert sizes == own.sizes_for(configs[name].sparse_size), name
    assert [stock.for_layer(i).sparse_size_per_head for i in range(own.num_layers)] == budgets.load(SHIPPED).sizes_for(stock.sparse_size)
    assert "layer_overrides" not in method_configs(NiahRun())["hybrid"].model_fields_set  # no sparse cache, no budgets
    assert default_lola_config(SHIPPED, feature_maps=SHIPPED).layer_overrides == configs["lola-sre"].layer_overrides


def test_unset_limits_come_from_the_maps_then_the_model():
    cfg = lola.LoLAConfig(positions="bounded", chunk=64)
    assert resolve_positions(lola.LoLAConfig(), 8192, 2048) == lola.LoLAConfig()  # absolute: unchanged
    filled = resolve_positions(cfg, 8192, 2048)
    assert (filled.exact_distance, filled.state_positions) == (2048, 2048)  # the maps' (and adapters') trained length
    filled = resolve_positions(cfg, 8192, None)
    assert (filled.exact_distance, filled.state_positions) == (8192 - 64, 8192)
    own = resolve_positions(cfg.model_copy(update={"exact_distance": 100}), 8192, 2048)
    assert (own.exact_distance, own.state_positions) == (100, 2048)
    with pytest.raises(ValueError, match="needs exact_distance"):
        resolve_positions(cfg, None, None)
    with pytest.raises(ValueError, match="needs state_positions"):
        resolve_positions(cfg.model_copy(update={"exact_distance": 100}), None, None)
    capped = resolve_positions(cfg, 2048, 4096)  # maps trained longer than the model's context
    assert capped.exact_distance == 2048 - 64 and capped.state_positions == 4096
