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


def test_a_folder_without_read_defaults_reads_as_before(folder):
    maps = read_feature_maps(folder)
    assert maps.read is None and maps.merge_into(lola.LoLAConfig(sparse_size=8)).linear_share_cap is None


@pytest.mark.parametrize(
    "read, match",
    [
        ({"linear_share_cap": 2.0}, "read: linear_share_cap"),
        ({"linear_share_cap_from": -1}, "read: linear_share_cap_from"),
        ({"cap": 0.1}, "read: unknown field 'cap'"),
    ],
)
def test_bad_read_defaults_are_refused_naming_the_file_and_field(folder, tmp_path, read, match):
    with pytest.raises(ValueError, match=rf"lola_config.json: {match}"):
        read_feature_maps(_with_read(folder, tmp_path, read))
