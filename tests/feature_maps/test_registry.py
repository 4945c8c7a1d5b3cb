"""Feature maps are registered once (lola.feature_maps.registry): the config, the builder,
``lola linearize`` and the command line read that table."""

from __future__ import annotations

import typing

import pytest

from lola.cli import build_parser
from lola.config import LoLAConfig
from lola.feature_maps import DEFAULT_FEATURE_MAP, FEATURE_MAPS, TRAINABLE_FEATURE_MAPS, build_feature_map
from lola.feature_maps.registry import REGISTRY
from lola.linearize.transfer import LinearizeConfig


def test_config_and_linearize_accept_the_registered_names():
    assert FEATURE_MAPS == tuple(REGISTRY) == ("hedgehog", "hedgehog_identity", "elu", "taylor")
    assert typing.get_args(LoLAConfig.model_fields["feature_map"].annotation) == FEATURE_MAPS
    assert typing.get_args(LinearizeConfig.model_fields["feature_map"].annotation) == TRAINABLE_FEATURE_MAPS
    assert LoLAConfig().feature_map == LinearizeConfig().feature_map == DEFAULT_FEATURE_MAP
    for name in FEATURE_MAPS:
        assert LoLAConfig(feature_map=name).feature_map == name
    with pytest.raises(ValueError, match="feature_map"):
        LoLAConfig(feature_map="relu")


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_trainable_means_it_has_parameters(name):
    fm = build_feature_map(name, num_heads=2, head_dim=4, feature_dim=3)
    assert bool(list(fm.parameters())) == REGISTRY[name].trainable == (name in TRAINABLE_FEATURE_MAPS)


def test_the_command_line_offers_the_trainable_maps():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    help_text = next(a.help for a in sub["linearize"]._actions if a.dest == "feature_map")
    assert all(name in help_text for name in TRAINABLE_FEATURE_MAPS) and "elu" not in help_text and DEFAULT_FEATURE_MAP in help_text
