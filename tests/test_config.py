import pytest
from pydantic import ValidationError

import lola


def test_defaults_and_budget():
    cfg = lola.LoLAConfig()
    assert cfg.exact_budget == cfg.sinks + cfg.window + cfg.sparse_size


def test_json_round_trip():
    cfg = lola.LoLAConfig(
        window=32, sparse_size=16, sinks=2, chunk=8, policy="random", policy_kwargs={"seed": 3}, mixing="lola_authors", scale=0.5, gqa_storage="query_head"
    )
    again = lola.LoLAConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg


@pytest.mark.parametrize(
    "field, value",
    [
        ("window", -1),
        ("sparse_size", -3),
        ("sinks", -1),
        ("chunk", 0),
        ("schedule", "sometimes"),
        ("policy", "nope"),
        ("mixing", "avg"),
        ("feature_map", "relu"),
        ("scale", 0.0),
        ("gqa_storage", "both"),
        ("feature_dim", 0),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValidationError) as err:
        lola.LoLAConfig(**{field: value})
    assert field in str(err.value)


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValidationError) as err:
        lola.LoLAConfig(policy="nope")
    for name in ("sre", "attention", "recency", "random", "key_norm"):
        assert name in str(err.value)


def test_unknown_field_is_rejected():
    with pytest.raises(ValidationError, match="windw"):
        lola.LoLAConfig(windw=3)


def test_layer_overrides_from_mapping_or_list():
    cfg = lola.LoLAConfig(window=8, layer_overrides={1: {"window": 32, "sparse_size": 4}}, full_attention_layers=[3, 0, 3])
    assert cfg.for_layer(1).window == 32 and cfg.for_layer(1).sparse_size == 4
    assert cfg.for_layer(0).window == 8 and cfg.for_layer(0).layer_overrides == {}
    assert cfg.full_attention_layers == [0, 3]
    as_list = lola.LoLAConfig(window=8, layer_overrides=[{}, {"window": 32, "sparse_size": 4}])
    assert as_list.for_layer(1) == cfg.for_layer(1)
    assert lola.LoLAConfig.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({0: {"window": -1}}, "window"),
        ({0: {"wndow": 3}}, "wndow"),
        ({0: {"full_attention_layers": [1]}}, "full_attention_layers"),
        ({-1: {"window": 3}}, "layer indices"),
    ],
)
def test_bad_layer_overrides(overrides, match):
    with pytest.raises(ValidationError, match=match):
        lola.LoLAConfig(layer_overrides=overrides)
