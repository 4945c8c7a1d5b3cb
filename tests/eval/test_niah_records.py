"""Resuming a `lola niah` run: the saved configs against the ones the same options give now."""

from __future__ import annotations

import json

import pytest

import lola
from lola.eval.niah_records import RESULTS_FILE, SAMPLES_FILE, check_saved_configs

BOUNDED = dict(window=8, sparse_size=4, sinks=1, chunk=4, positions="bounded", exact_distance=64, state_positions=64)


def saved_folder(tmp_path, method: str, config: dict) -> None:
    (tmp_path / RESULTS_FILE).write_text(json.dumps({"methods": {method: config}}), encoding="utf-8")
    (tmp_path / SAMPLES_FILE).write_text(json.dumps({"method": method}) + "\n", encoding="utf-8")


def test_a_field_added_since_at_its_default_is_the_same_config(tmp_path):
    cfg = lola.LoLAConfig(**BOUNDED)
    before = cfg.model_dump(mode="json")
    del before["state_key_positions"]  # a run saved before the field existed ran its default
    saved_folder(tmp_path, "lola-sre", before)
    check_saved_configs(tmp_path, {"lola-sre": cfg})


def test_a_field_added_since_away_from_its_default_is_another_config(tmp_path):
    before = lola.LoLAConfig(**BOUNDED).model_dump(mode="json")
    del before["state_key_positions"]
    saved_folder(tmp_path, "lola-sre", before)
    with pytest.raises(ValueError, match=r"state_key_positions: saved None, now 'spread'"):
        check_saved_configs(tmp_path, {"lola-sre": lola.LoLAConfig(**BOUNDED, state_key_positions="spread")})


def test_a_changed_field_is_named(tmp_path):
    saved_folder(tmp_path, "lola-sre", lola.LoLAConfig(**BOUNDED).model_dump(mode="json"))
    with pytest.raises(ValueError, match=r"lola-sre run with another config .*window: saved 8, now 16"):
        check_saved_configs(tmp_path, {"lola-sre": lola.LoLAConfig(**{**BOUNDED, "window": 16})})
