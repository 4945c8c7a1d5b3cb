"""A feature-map folder's ``read`` entry: how LoLA reads the maps unless the config says otherwise."""

from __future__ import annotations

import json
import shutil

import pytest

import lola
from lola.linearize import read_feature_maps
from lola.models import tiny_random


def _with_read(folder, tmp_path, read):
    copy = tmp_path / "maps"
    shutil.copytree(folder, copy)
    meta = json.loads((copy / "lola_config.json").read_text())
    meta["read"] = read
    (copy / "lola_config.json").write_text(json.dumps(meta))
    return copy


def test_the_read_defaults_fill_what_the_paper_rule_leaves_unset(folder, tmp_path):
    maps = read_feature_maps(_with_read(folder, tmp_path, {"linear_share_cap": 0.03, "linear_share_cap_from": 64, "note": "test"}))
    lola_cfg = maps.merge_into(lola.LoLAConfig(sparse_size=8))  # LoLA: the paper's rule
    assert lola_cfg.mixing == "lola_authors" and (lola_cfg.linear_share_cap, lola_cfg.linear_share_cap_from) == (0.03, 64)
    hybrid = maps.merge_into(lola.LoLAConfig(sparse_size=0, sinks=0, schedule="tokenwise"))  # the hybrid: read as trained
    assert hybrid.mixing == "lolcats" and hybrid.linear_share_cap is None
    exact = maps.merge_into(lola.LoLAConfig(sparse_size=8, mixing="softmax_only"))  # reads no state: nothing to cap
    assert exact.linear_share_cap is None
    mine = maps.merge_into(lola.LoLAConfig(sparse_size=8, linear_share_cap=0.5))  # the caller's cap, from the start
    assert (mine.linear_share_cap, mine.linear_share_cap_from) == (0.5, 0)
    off = maps.merge_into(lola.LoLAConfig(sparse_size=8, linear_share_cap=None))  # set to None on purpose: no cap
    assert off.linear_share_cap is None and off.linear_share_cap_from == 0
    # applied to a model, the layers run with it
    model, _ = tiny_random()
    lola.apply_lola(model, lola.LoLAConfig(sparse_size=8), feature_maps=maps.path)
    assert (model._lola.config.linear_share_cap, model._lola.config.linear_share_cap_from) == (0.03, 64)


def test_read_defaults_may_bound_the_positions(folder, tmp_path):
    maps = read_feature_maps(_with_read(folder, tmp_path, {"positions": "bounded", "linear_share_cap": 0.5, "linear_share_cap_from": 64}))
    assert maps.trained_length == 64
    assert maps.merge_into(lola.LoLAConfig(sparse_size=8)).positions == "bounded"
    assert maps.merge_into(lola.LoLAConfig(sparse_size=8, positions="absolute")).positions == "absolute"  # the caller's
    model, _ = tiny_random()
    lola.apply_lola(model, lola.LoLAConfig(sparse_size=8), feature_maps=maps.path)
    cfg = model._lola.config
    assert (cfg.positions, cfg.exact_distance, cfg.state_positions) == ("bounded", 64, 64)  # the maps' trained length


def test_read_defaults_may_start_the_cap_past_the_trained_length_and_spread_the_state_keys(folder, tmp_path):
    read = {"positions": "bounded", "state_key_positions": "spread", "trained_length": 64, "linear_share_cap": 0.2, "linear_share_cap_from": 256}
    maps = read_feature_maps(_with_read(folder, tmp_path, read))
    assert maps.trained_length == 64  # the limits' length, not where the cap starts
    cfg = maps.merge_into(lola.LoLAConfig(sparse_size=8, window=8, chunk=8))
    assert (cfg.positions, cfg.state_key_positions, cfg.linear_share_cap, cfg.linear_share_cap_from) == ("bounded", "spread", 0.2, 256)
    mine = maps.merge_into(lola.LoLAConfig(sparse_size=8, window=8, chunk=8, state_key_positions="clamped"))
    assert mine.state_key_positions == "clamped"  # the caller's
    absolute = maps.merge_into(lola.LoLAConfig(sparse_size=8, window=8, chunk=8, positions="absolute"))
    assert (absolute.positions, absolute.state_key_positions) == ("absolute", "clamped")  # no placement without bounded positions
    model, _ = tiny_random()
    lola.apply_lola(model, lola.LoLAConfig(sparse_size=8, window=8, chunk=8), feature_maps=maps.path)
    applied = model._lola.config
    assert (applied.exact_distance, applied.state_positions, applied.state_key_positions, applied.linear_share_cap_from) == (64, 64, "spread", 256)


def test_a_folder_without_read_defaults_reads_as_before(folder):
    maps = read_feature_maps(folder)
    assert maps.read is None and maps.merge_into(lola.LoLAConfig(sparse_size=8)).linear_share_cap is None


@pytest.mark.parametrize(
    "read, match",
    [
        ({"linear_share_cap": 2.0}, "read: linear_share_cap"),
        ({"linear_share_cap_from": -1}, "read: linear_share_cap_from"),
        ({"cap": 0.1}, "read: unknown field 'cap'"),
        ({"trained_length": 0}, "read: trained_length"),
        ({"state_key_positions": "far"}, "read: state_key_positions"),
    ],
)
def test_bad_read_defaults_are_refused_naming_the_file_and_field(folder, tmp_path, read, match):
    with pytest.raises(ValueError, match=rf"lola_config.json: {match}"):
        read_feature_maps(_with_read(folder, tmp_path, read))


# -- budgets calibrated for the maps: what budgets="auto" applies with them ------------------------


def _budgets_for(geometry, sizes_of_layer):
    from lola.budgets import HeadBudgets

    layers, heads = geometry["num_layers"], geometry["num_kv_heads"]
    sizes = [[sizes_of_layer(i, h) for h in range(heads)] for i in range(layers)]
    uniform = -(-sum(map(sum, sizes)) // (layers * heads))
    return HeadBudgets(sparse_size_per_head=sizes, uniform_sparse_size=uniform, scores=[[float(x) for x in row] for row in sizes], power=1.0)


def test_auto_budgets_are_those_calibrated_for_the_maps(folder, tmp_path):
    from lola.eval.perplexity import PerplexityRun, perplexity_configs
    from lola.eval.runner import NiahRun, method_configs
    from lola.integrations.lm_eval.model import lola_config_from_args
    from lola.pretrained.resolve import resolve_budgets, resolve_config

    geometry = read_feature_maps(folder).geometry
    # every head of the last layer gets the cache: no allocation of the stock model's looks like it
    budgets = _budgets_for(geometry, lambda i, h: 8 * (i == geometry["num_layers"] - 1))
    maps_path = _with_read(folder, tmp_path, {"budgets": budgets.model_dump(mode="json")})
    maps = read_feature_maps(maps_path)
    assert maps.read.budgets == budgets
    base = lola.LoLAConfig(sparse_size=budgets.uniform_sparse_size, window=8, sinks=0, chunk=8)
    expected = budgets.apply(base)
    # read maps, a folder, and (below) the commands that apply the maps later: the same budgets
    assert resolve_budgets(base, "auto", "tiny-random-llama", maps) == expected
    assert resolve_budgets(base, "auto", "tiny-random-llama", maps_path) == expected
    assert resolve_config(base, model="tiny-random-llama", budgets="auto", maps_to_apply=str(maps_path)) == expected
    # uniform, named budgets and configs with sizes of their own are the caller's choice
    assert resolve_budgets(base, "uniform", "tiny-random-llama", maps) is base
    own = lola.LoLAConfig(sparse_size_per_head=[1, 2])
    assert resolve_budgets(own, "auto", "tiny-random-llama", maps) is own
    assert resolve_budgets(base, "auto", "tiny-random-llama", folder) is base  # maps without budgets, no shipped ones for the model
    fields = dict(window=8, sparse_size=budgets.uniform_sparse_size, sinks=0, chunk=8)
    niah = method_configs(NiahRun(model="tiny-random-llama", methods=["lola"], policies=["sre"], feature_maps=str(maps_path), **fields))["lola-sre"]
    ppl = perplexity_configs(PerplexityRun(model="tiny-random-llama", methods=["lola"], feature_maps=str(maps_path), budgets="auto", **fields))["lola"]
    assert niah.layer_overrides == ppl.layer_overrides == expected.layer_overrides
    lm_eval, _ = lola_config_from_args(
        {k: v for k, v in niah.model_dump(exclude_unset=True).items() if k != "layer_overrides"}, model_name="tiny-random-llama", feature_maps=str(maps_path)
    )
    assert lm_eval.layer_overrides == expected.layer_overrides
    # and the layers hold those sizes
    model, _ = tiny_random()
    lola.apply_lola(model, niah, feature_maps=maps)
    last = model._lola.config.for_layer(geometry["num_layers"] - 1)
    assert (
        last.sparse_size_per_head == [8] * geometry["num_kv_heads"] and model._lola.config.for_layer(0).sparse_size_per_head == [0] * geometry["num_kv_heads"]
    )


def test_budgets_for_another_geometry_are_refused_naming_the_entry(folder, tmp_path):
    geometry = read_feature_maps(folder).geometry
    wrong = _budgets_for({**geometry, "num_layers": geometry["num_layers"] + 1}, lambda i, h: 4)
    with pytest.raises(ValueError, match=r"lola_config.json: read.budgets: budgets for \d+ layers"):
        read_feature_maps(_with_read(folder, tmp_path, {"budgets": wrong.model_dump(mode="json")}))
    from lola.pretrained.folder import read_defaults

    with pytest.raises(ValueError, match=r"read.budgets"):
        read_defaults(tmp_path / "maps")


def test_maps_trained_for_a_bounded_state_beat_the_read_defaults_and_bind_only_rules_that_read_the_state(folder, tmp_path):
    """A folder of ``lola linearize --state-positions 1``: its positions are trained fields."""
    copy = _with_read(folder, tmp_path, {"positions": "absolute", "state_key_positions": "spread", "trained_length": 64})
    meta = json.loads((copy / "lola_config.json").read_text())
    meta["lola_config"].update(positions="bounded", state_positions=1)
    (copy / "lola_config.json").write_text(json.dumps(meta))
    maps = read_feature_maps(copy)
    trained = ("bounded", 1, "clamped")
    for config in (lola.LoLAConfig(sparse_size=8), lola.LoLAConfig(sparse_size=0, sinks=0, schedule="tokenwise")):  # the paper's rule, the hybrid's
        cfg = maps.merge_into(config)
        assert (cfg.positions, cfg.state_positions, cfg.state_key_positions) == trained, cfg.mixing
    # a rule that never reads the state keeps the caller's positions (and the config's default)
    assert maps.merge_into(lola.LoLAConfig(sparse_size=8, mixing="softmax_only", positions="absolute")).positions == "absolute"
    assert maps.merge_into(lola.LoLAConfig(sparse_size=8, mixing="softmax_only")).positions == "absolute"
    with pytest.raises(ValueError, match="config.state_key_positions='spread' conflicts with the feature maps"):
        maps.merge_into(lola.LoLAConfig(sparse_size=8, window=8, chunk=8, positions="bounded", state_key_positions="spread"))
