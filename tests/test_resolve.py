"""The one place that decides the mixing rule: the paper's for LoLA on trained maps, the trained
one for the hybrid, the caller's when set, softmax_only without trained maps."""

import json

import pytest

import lola
from lola.resolve import PAPER_MIXING, default_mixing, has_sparse_cache, resolve_config, resolve_mixing


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
    from lola.model_entry import config_entry

    cfg = lola.LoLAConfig(window=12, sparse_size=3, sinks=1, mixing="lolcats", layer_overrides={1: {"sparse_size": 5}})
    entry = config_entry(cfg, lora_merged=True)
    assert resolve_config(entry) == cfg  # what vLLM finds in an exported config.json
    assert resolve_config(json.loads(json.dumps(entry))) == cfg  # as read back from the file
    with pytest.raises(ValueError, match="lola did not write"):
        resolve_config({"format": "someone-else/2", "config": {}})
    with pytest.raises(ValueError, match="lola did not write"):
        resolve_config({"format": entry["format"], "config": "window=12"})
